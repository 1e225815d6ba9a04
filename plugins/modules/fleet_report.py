# The documentation of the action plugin gpufleet.fleet.fleet_report (plugins/action/fleet_report.py),
# which runs on the controller only; there is no module to run on a host (as with ansible.builtin.debug).

DOCUMENTATION = r"""
---
module: fleet_report
short_description: Write the fleet report of a verification run on the controller
description:
  - Builds gpufleet's fleet report from every node's registered health-check run (the JSON document
    roles/payload/files/gpufleet_check.pyz printed there, or why there is none) and writes
    C(<out_dir>/<basename>.json), C(.md) and C(.xml) (JUnit) atomically.
  - The report's code is plugins/module_utils/fleet_report.py, shared with the filter
    gpufleet.fleet.check_entry and files/gpufleet_verify.py.
  - Runs on the controller only (an action plugin); the result is never changed.
options:
  out_dir:
    description: Controller directory of the three files (created when missing).
    type: path
    required: true
  runs:
    description: Host name to the registered result of the host's health-check command.
    type: dict
    required: true
  gone:
    description: Hosts that left the play before their checks ran; reported with that reason.
    type: list
    elements: str
    default: []
  inventory:
    description: The inventory the run used, shown in the report.
    type: str
    default: ""
  playbook:
    description: The playbook's name, shown in the report.
    type: str
    default: verify
  basename:
    description: File name of the three files, without extension or directory.
    type: str
    default: fleet-report
  history_keep:
    description: Runs the history beside the report keeps (C(history/fleet-history.jsonl) under O(out_dir)); 0 for no
      history, otherwise at least O(repeat_runs).
    type: int
    default: 20
  repeat_failures:
    description: A node that failed (or was unreachable) in at least this many of its last O(repeat_runs) runs is a
      repeat offender; at most O(repeat_runs).
    type: int
    default: 2
  repeat_runs:
    description: The runs of a node the repeat-offender rule counts (those that included it).
    type: int
    default: 3
  outlier_fraction:
    description: A node whose measured figure is more than this fraction below the median of the nodes with the same
      GPU model is an outlier (3 such nodes or more); above 0, below 1.
    type: float
    default: 0.1
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Write the fleet report (JSON, Markdown, JUnit XML)
  gpufleet.fleet.fleet_report:
    out_dir: /srv/reports/verify
    runs: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, '__gpu_verify_run'))) }}"
  run_once: true
"""

RETURN = r"""
verdict:
  description: The fleet's verdict, pass only when every node passed.
  type: str
  returned: always
summary:
  description: Counts of nodes, passed, failed, unreachable.
  type: dict
  returned: always
fleet_warnings:
  description: What is wrong with the fleet as a whole without failing a node (more than one pinned driver build).
  type: list
  elements: str
  returned: always
files:
  description: The three files written.
  type: list
  elements: str
  returned: always
terminal:
  description: The verdict, the failures grouped by cause, the work the findings ask for, the warnings and the table.
  type: str
  returned: always
metrics_not_written:
  description: Host to the lines in which its checks say the metrics file could not be written (hosts with some).
  type: dict
  returned: always
"""
