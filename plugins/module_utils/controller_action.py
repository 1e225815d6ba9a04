"""What the collection's action plugins (plugins/action) have in common: apt_source_trial and wheel_plan run
something on the host, copying nothing of their own first (``HostAction``); fleet_report and settings work on the
controller alone (``ControllerAction``); each begins with ``begin`` (ActionBase.run and the argument spec); settings and
wheel_plan read a lookup plugin's value (``lookup_value``).

Plain classes, mixed in before ActionBase (``class ActionModule(ControllerAction, ActionBase)``), so that this
module imports nothing from the controller's plugin API.
"""

from __future__ import annotations

from typing import Any


class HostAction:
    """An action that copies no file of its own to the host before it runs (a module it runs copies its own), runs in
    check mode too (it changes nothing on a host) and never asynchronously."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def begin(
        self, tmp: Any, task_vars: dict[str, Any] | None, argument_spec: dict[str, Any], **rules: Any
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """ActionBase.run's result, the task's variables and the task's arguments validated against
        ``argument_spec`` and ``rules`` (mutually_exclusive, required_one_of, ...: a wrong argument fails the task
        before anything runs)."""
        result = super().run(tmp, task_vars)  # ActionBase's: it follows this class in the MRO
        _validation, args = self.validate_argument_spec(argument_spec=argument_spec, **rules)
        return result, task_vars or {}, args


class ControllerAction(HostAction):
    """An action that needs no connection to the host at all."""

    _requires_connection = False


def lookup_value(action: Any, name: str, task_vars: dict[str, Any]) -> Any:
    """The first value of the lookup plugin ``name`` run without terms, from the action plugin ``action``."""
    lookup = action._shared_loader_obj.lookup_loader.get(name, loader=action._loader, templar=action._templar)
    return lookup.run([], variables=task_vars)[0]
