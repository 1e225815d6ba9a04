"""Action gpufleet.fleet.wheel_plan: play 1's wheel plan in one task a host (documentation:
plugins/modules/wheel_plan.py).

The controller's pip (the lookup gpufleet.fleet.pip_zipapp) is copied into the task's temporary directory on
the host, the pytorch role's plan script runs there with ansible.builtin.command, the directory goes, and the
output is judged on the controller (plugins/module_utils/wheel_plan.py). Before, six tasks a host did this: find
the pip, make a directory, copy, run, remove, judge.
"""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.fleet.plugins.module_utils.controller_action import lookup_value
from ansible_collections.gpufleet.fleet.plugins.module_utils.wheel_plan import refusal, wheel_plan

ARGUMENT_SPEC = {
    "python": {"type": "str", "required": True},
    "python_runs": {"type": "bool", "default": True},
    "python_name": {"type": "str", "default": "the interpreter"},
    "script": {"type": "str", "required": True},
    "requirements": {"type": "list", "elements": "str", "required": True},
    "pip_args": {"type": "list", "elements": "str", "default": []},
    "timeout": {"type": "int", "default": 60},
    "context": {"type": "dict", "default": {}},
}


def not_run(why: str) -> dict[str, Any]:
    """The plan of a host where it could not run: no problem, one warning that says why."""
    return {
        "problems": [],
        "files": [],
        "hosts": [],
        "summary": "",
        "warnings": [
            f"the wheel set was not resolved: {why}; play 1 checked the listings of the pinned wheels only, not the "
            "wheels they need nor the hosts those come from"
        ],
    }


class ActionModule(ActionBase):
    """Resolve and judge the wheel plan of one host (see the module docstring)."""

    # The temporary directory is made only where the plan runs (not where the controller's pip cannot serve).
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            pip = lookup_value(self, "gpufleet.fleet.pip_zipapp", task_vars)
            why = pip["problem"] or ("" if args["python_runs"] else f"{args['python_name']} does not run yet")
            if why:
                plan = not_run(why)
            else:
                context = {**args["context"], "requirements": args["requirements"]}
                plan = wheel_plan(self._run_script(pip, args, task_vars), context)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        message = refusal(plan, str(task_vars.get("inventory_hostname", "")))
        if message:
            # The host stops here, before anything changes.
            return {**result, "changed": False, "plan": plan, "failed": True, "msg": message}
        return {**result, "changed": False, "plan": plan}

    def _run_script(self, pip: dict[str, Any], args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        """The plan script's result as ansible.builtin.command gives it, or {rc: None, msg} where the copy failed (a
        full /tmp): the judgement then says the plan did not run."""
        try:
            tmp = self._connection._shell.tmpdir or self._make_tmp_path()
            remote = self._connection._shell.join_path(tmp, "pip.pyz")
            self._transfer_file(pip["path"], remote)
            self._fixup_perms2((tmp, remote))
        except AnsibleError as error:
            return {"rc": None, "msg": f"the controller's pip could not be copied to the host: {error}"}
        options = {
            "pip": remote,
            "pip_version": pip["version"],
            "min_python": pip["min_python"],
            "timeout": args["timeout"],
            "pip_args": args["pip_args"],
        }
        command = {
            "argv": [args["python"], "-I", "-c", args["script"], json.dumps(options)],
            "stdin": "\n".join(args["requirements"]),
        }
        return self._execute_module(module_name="ansible.legacy.command", module_args=command, task_vars=task_vars)
