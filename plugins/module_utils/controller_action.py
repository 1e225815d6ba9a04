"""What the collection's action plugins (plugins/action) have in common: fleet_report and settings work on the
controller alone (``ControllerAction``); settings and wheel_plan read a lookup plugin's value (``lookup_value``).

A plain class, mixed in before ActionBase (``class ActionModule(ControllerAction, ActionBase)``), so that this
module imports nothing from the controller's plugin API.
"""

from __future__ import annotations

from typing import Any


class ControllerAction:
    """An action that needs no connection to the host and copies no file to it, runs in check mode too (it changes
    nothing on a host) and never asynchronously."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False


def lookup_value(action: Any, name: str, task_vars: dict[str, Any]) -> Any:
    """The first value of the lookup plugin ``name`` run without terms, from the action plugin ``action``."""
    lookup = action._shared_loader_obj.lookup_loader.get(name, loader=action._loader, templar=action._templar)
    return lookup.run([], variables=task_vars)[0]
