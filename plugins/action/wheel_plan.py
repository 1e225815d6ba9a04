"""Action gpufleet.fleet.wheel_plan: play 1's wheel plan in one task a host (documentation:
plugins/modules/wheel_plan.py).

The controller's pip (the lookup gpufleet.fleet.pip_zipapp) is copied into the task's temporary directory on
the host, the pytorch role's plan script runs there with ansible.builtin.command, the directory goes, and the
output is judged on the controller (plugins/module_utils/wheel_plan.py). Before, six tasks a host did this: find
the pip, make a directory, copy, run, remove, judge.

Once per distinct resolution: hosts alike in what pip's answer depends on (the interpreter, its version and
machine, the OS, the requirements, pip's arguments, the task's environment, the pip) share one resolution. The
first host of such a group to get here resolves (the others of the group wait for it, on a lock in the
controller's local temporary directory, which is this run's); every other host of the group runs the script
without pip, with that resolution, and only asks for the files (its own HEAD requests: each host must reach
them). A resolution that failed is not shared: each host of the group then resolves on its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.fleet.plugins.module_utils.controller_action import HostAction, lookup_value
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import write_atomically
from ansible_collections.gpufleet.fleet.plugins.module_utils.wheel_plan import refusal, script_output, wheel_plan

ARGUMENT_SPEC = {
    "python": {"type": "str", "required": True},
    "python_runs": {"type": "bool", "default": True},
    "python_name": {"type": "str", "default": "the interpreter"},
    "script": {"type": "str", "required": True},
    "requirements": {"type": "list", "elements": "str", "required": True},
    "pip_args": {"type": "list", "elements": "str", "default": []},
    "timeout": {"type": "int", "default": 60},
    "context": {"type": "dict", "default": {}},
    "python_version": {"type": "str", "default": ""},
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


class ActionModule(HostAction, ActionBase):
    """Resolve and judge the wheel plan of one host (see the module docstring). The temporary directory is made only
    where the plan runs (not where the controller's pip cannot serve): HostAction's TRANSFERS_FILES is false."""

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result, task_vars, args = self.begin(tmp, task_vars, ARGUMENT_SPEC)
        try:
            pip = lookup_value(self, "gpufleet.fleet.pip_zipapp", task_vars)
            why = pip["problem"] or ("" if args["python_runs"] else f"{args['python_name']} does not run yet")
            if why:
                plan = not_run(why)
            else:
                context = {**args["context"], "requirements": args["requirements"]}
                output, context["resolved_on"] = self._resolve_once(pip, args, task_vars)
                plan = wheel_plan(output, context)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        message = refusal(plan, str(task_vars.get("inventory_hostname", "")))
        if message:
            # The host stops here, before anything changes.
            return {**result, "changed": False, "plan": plan, "failed": True, "msg": message}
        return {**result, "changed": False, "plan": plan}

    def _resolve_once(self, pip: dict[str, Any], args: dict[str, Any], task_vars: dict[str, Any]) -> tuple[Any, str]:
        """The script's result on this host, and the host whose pip resolved it ('' where this one did): the group's
        resolution where another host of the group made one (see the module docstring), else this host's own."""
        host = str(task_vars.get("inventory_hostname", ""))
        path = os.path.join(C.DEFAULT_LOCAL_TMP, f"gpufleet-wheel-plan-{self._group_key(pip, args, task_vars)}.json")
        with open(path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                shared = None
                if os.path.exists(path):
                    with open(path) as handle:
                        shared = json.load(handle)
                if shared is None:
                    result = self._run_script(pip, args, task_vars)
                    resolution = shareable(result)
                    # The checks' atomic write, as the fleet report's: a crash leaves no half file for the next host.
                    write_atomically(Path(path), json.dumps({"host": host, "resolution": resolution}))
                    return result, ""
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        if shared["resolution"] is None:
            return self._run_script(pip, args, task_vars), ""
        return self._run_script(pip, args, task_vars, resolved=shared["resolution"]), shared["host"]

    def _group_key(self, pip: dict[str, Any], args: dict[str, Any], task_vars: dict[str, Any]) -> str:
        """What pip's resolution depends on, as one hash: this task, the interpreter (its path, version and machine),
        the OS (its distribution, version and architecture), the requirements, pip's arguments, the task's
        environment, the pip."""
        facts = task_vars.get("ansible_facts") or {}
        environment = self._templar.template(self._task.environment) if self._task.environment else []
        parts = [
            self._task._uuid,
            args["python"],
            args["python_version"],
            facts.get("distribution"),
            facts.get("distribution_version"),
            facts.get("architecture"),
            args["requirements"],
            args["pip_args"],
            environment,
            pip["version"],
        ]
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]

    def _run_script(
        self, pip: dict[str, Any], args: dict[str, Any], task_vars: dict[str, Any], resolved: Any = None
    ) -> dict[str, Any]:
        """The plan script's result as ansible.builtin.command gives it, or {rc: None, msg} where the copy failed (a
        full /tmp): the judgement then says the plan did not run. With ``resolved`` (another host's resolution) no
        pip is copied: the script only asks for the files."""
        options: dict[str, Any] = {"timeout": args["timeout"], "pip_args": args["pip_args"]}
        if resolved is None:
            try:
                tmp = self._connection._shell.tmpdir or self._make_tmp_path()
                remote = self._connection._shell.join_path(tmp, "pip.pyz")
                self._transfer_file(pip["path"], remote)
                self._fixup_perms2((tmp, remote))
            except AnsibleError as error:
                return {"rc": None, "msg": f"the controller's pip could not be copied to the host: {error}"}
            options.update(pip=remote, pip_version=pip["version"], min_python=pip["min_python"])
            stdin = "\n".join(args["requirements"])
        else:
            options.update(resolved=True)
            stdin = json.dumps(resolved)
        command = {"argv": [args["python"], "-I", "-c", args["script"], json.dumps(options)], "stdin": stdin}
        return self._execute_module(module_name="ansible.legacy.command", module_args=command, task_vars=task_vars)


def shareable(result: Any) -> dict[str, Any] | None:
    """What other hosts of the group take from this host's script result: pip's run, its report's version and the
    wheels to install; None where pip did not resolve the set (each host then tries its own)."""
    out = script_output(result)
    if out is None or out.get("skipped") or not out.get("install"):
        return None
    pip = out.get("pip") or {}
    if pip.get("rc") != 0 or pip.get("stopped_download"):
        return None
    return {"pip": pip, "report_version": out.get("report_version"), "install": out["install"]}
