"""Action gpufleet.fleet.fleet_report: the fleet report of a verification run, written on the controller.

roles/gpu_verify/tasks/report.yml runs it once (run_once) with every node's
registered health-check run; the report's code is plugins/module_utils/fleet_report.py
(its docstring describes the document and the files). Writing the report is the
run's output, not a change on any host: the result is never "changed", and the
files are written in check mode too (the task says check_mode: false).

Each run is also appended to the history next to the report (<out_dir>/history/fleet-history.jsonl, the
last history_keep runs; 0: none), and the report names the repeat offenders (nodes that did not pass in
repeat_failures of their last repeat_runs runs) and the outliers (figures more than outlier_fraction below
their GPU model's fleet median). ``history_metrics``: per host, the Prometheus text the play writes beside
the node's gpufleet.prom.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.fleet.plugins.module_utils.controller_action import ControllerAction
from ansible_collections.gpufleet.fleet.plugins.module_utils.fleet_report import (
    DEFAULT_BASENAME,
    DEFAULT_HISTORY_KEEP,
    DEFAULT_OUTLIER_FRACTION,
    DEFAULT_REPEAT_FAILURES,
    DEFAULT_REPEAT_RUNS,
    HISTORY_METRICS_FILE,
    InputError,
    collect_document,
    file_basename,
    history_metrics,
    metrics_not_written,
    render_terminal,
    write_run_report,
)

ARGUMENT_SPEC = {
    "out_dir": {"type": "path", "required": True},
    "runs": {"type": "dict", "required": True},
    "gone": {"type": "list", "elements": "str", "default": []},
    "inventory": {"type": "str", "default": ""},
    "playbook": {"type": "str", "default": "verify"},
    "basename": {"type": "str", "default": DEFAULT_BASENAME},
    "history_keep": {"type": "int", "default": DEFAULT_HISTORY_KEEP},
    "repeat_failures": {"type": "int", "default": DEFAULT_REPEAT_FAILURES},
    "repeat_runs": {"type": "int", "default": DEFAULT_REPEAT_RUNS},
    "outlier_fraction": {"type": "float", "default": DEFAULT_OUTLIER_FRACTION},
}


class ActionModule(ControllerAction, ActionBase):
    """Collect, judge, render and write the fleet report (see the module docstring)."""

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result, _task_vars, args = self.begin(tmp, task_vars, ARGUMENT_SPEC)
        try:
            basename = file_basename(args["basename"])
        except Exception as error:  # argparse's type error: the same rule as the command line's
            raise AnsibleActionFail(f"fleet_report: basename {error}") from error
        out_dir = Path(args["out_dir"])
        try:
            document = collect_document(args["runs"], args["gone"], args["inventory"], args["playbook"])
            report, paths = write_run_report(
                document,
                out_dir,
                basename,
                args["history_keep"],
                args["repeat_failures"],
                args["repeat_runs"],
                args["outlier_fraction"],
            )
        except InputError as error:
            raise AnsibleActionFail(f"fleet_report: {error}") from error
        except OSError as error:
            raise AnsibleActionFail(f"fleet_report: cannot write the report in {out_dir}: {error}") from error
        result.update(
            changed=False,
            verdict=report["verdict"],
            summary=report["summary"],
            fleet_warnings=report["warnings"],
            files=[str(path) for path in paths],
            terminal=render_terminal(report),
            metrics_not_written=metrics_not_written(args["runs"]),
            repeat_offenders=[entry["host"] for entry in report["repeat_offenders"]],
            outliers=sorted({entry["host"] for entry in report["outliers"]}),
            history_metrics=history_metrics(report),
            history_metrics_file=HISTORY_METRICS_FILE,
        )
        return result
