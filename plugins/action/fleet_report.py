"""Action gpufleet.fleet.fleet_report: the fleet report of a verification run, written on the controller.

roles/gpu_verify/tasks/report.yml runs it once (run_once) with every node's
registered health-check run; the report's code is plugins/module_utils/fleet_report.py
(its docstring describes the document and the files). Writing the report is the
run's output, not a change on any host: the result is never "changed", and the
files are written in check mode too (the task says check_mode: false).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.fleet.plugins.module_utils.fleet_report import (
    DEFAULT_BASENAME, InputError, build_report, collect_document, file_basename, metrics_not_written,
    render_terminal, write_reports)

ARGUMENT_SPEC = {
    "out_dir": {"type": "path", "required": True},
    "runs": {"type": "dict", "required": True},
    "gone": {"type": "list", "elements": "str", "default": []},
    "inventory": {"type": "str", "default": ""},
    "playbook": {"type": "str", "default": "verify"},
    "basename": {"type": "str", "default": DEFAULT_BASENAME},
}


class ActionModule(ActionBase):
    """Collect, judge, render and write the fleet report (see the module docstring)."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            basename = file_basename(args["basename"])
        except Exception as error:  # argparse's type error: the same rule as the command line's
            raise AnsibleActionFail(f"fleet_report: basename {error}") from error
        try:
            document = collect_document(args["runs"], args["gone"], args["inventory"], args["playbook"])
            report = build_report(document)
        except InputError as error:
            raise AnsibleActionFail(f"fleet_report: {error}") from error
        out_dir = Path(args["out_dir"])
        try:
            paths = write_reports(report, out_dir, basename)
        except OSError as error:
            raise AnsibleActionFail(f"fleet_report: cannot write the report in {out_dir}: {error}") from error
        result.update(changed=False, verdict=report["verdict"], summary=report["summary"],
                      fleet_warnings=report["warnings"], files=[str(path) for path in paths],
                      terminal=render_terminal(report), metrics_not_written=metrics_not_written(args["runs"]))
        return result
