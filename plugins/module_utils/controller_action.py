"""What the collection's action plugins (plugins/action: fleet_report, settings) have in common: they work on the
controller alone.

A plain class, mixed in before ActionBase (``class ActionModule(ControllerAction, ActionBase)``), so that this
module imports nothing from the controller's plugin API.
"""

from __future__ import annotations


class ControllerAction:
    """An action that needs no connection to the host and copies no file to it, runs in check mode too (it changes
    nothing on a host) and never asynchronously."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False
