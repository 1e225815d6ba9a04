#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The documentation of the action plugin gpufleet.fleet.wheel_plan (plugins/action/wheel_plan.py), which copies
# the controller's pip to the host and runs the plan script there with ansible.builtin.command; there is no
# module of its own to run on a host.

DOCUMENTATION = r"""
---
module: wheel_plan
short_description: Resolve a pinned wheel set on a host with the controller's pip and judge whether it can be fetched
description:
  - Play 1's wheel plan in one task a host. The controller's pip (25.3 or newer, as one zip file from the lookup
    gpufleet.fleet.pip_zipapp) is copied into the task's temporary directory on the host, the plan script
    (O(script), the pytorch role's C(pytorch_wheel_plan.py)) runs there with O(python) (C(pip install --dry-run
    --report) with O(pip_args), reading only the listings and each wheel's metadata, then a HEAD request per file),
    and the directory is removed again.
  - The output is judged on the controller as the filter P(gpufleet.fleet.wheel_plan#filter) judges it (every
    problem names the host, the file, the requirement that needs it and the fix) and returned in RV(plan); a plan
    with problems fails the task with one message that numbers them (the host stops before anything changes).
  - Where the plan cannot run (the controller's pip is too old or missing, O(python_runs) is false, the copy
    fails), RV(plan) has no problems and one warning that says why; the task does not fail.
  - Once per distinct resolution. Hosts alike in what pip's answer depends on (O(python), O(python_version), the
    OS's distribution, version and architecture, O(requirements), O(pip_args), the task's C(environment), the pip)
    share one; the first of them to run the task resolves (the others wait for it) and every other host runs the
    script without pip, with that resolution, asking only for the files itself (each host must reach them; RV(plan)
    names the host that resolved). A resolution that failed is not shared (each host then resolves its own).
  - The task's C(environment) (the install's proxy, say) applies to the script.
  - Changes nothing on the host (its temporary directory aside), in check mode or not.
options:
  python:
    description: The interpreter that runs the plan script on the host (the environment's, else the one it is made
      from).
    type: str
    required: true
  python_runs:
    description: Whether O(python) runs on the host (the pytorch role read it with gpufleet.fleet.venv_facts); false
      skips the plan with a warning.
    type: bool
    default: true
  python_version:
    description: O(python)'s version and machine as the host reported them (gpufleet.fleet.venv_facts); hosts that
      differ in it resolve apart.
    type: str
    default: ""
  python_name:
    description: How the warning names the interpreter when O(python_runs) is false.
    type: str
    default: the interpreter
  script:
    description: The text of the plan script.
    type: str
    required: true
  requirements:
    description: The pinned requirements to resolve, one per line on the script's standard input.
    type: list
    elements: str
    required: true
  pip_args:
    description: pip's source options (index or find-links URLs, certificates, timeout, retries).
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds each HTTP request of the script may take.
    type: int
    default: 60
  context:
    description: What the judgement names (the source, its setting, a hashes file); see the filter's C(context).
    type: dict
    default: {}
notes:
  - Supports check mode (it reads only).
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Resolve the pinned wheel set and ask every host for its files (read-only)
  gpufleet.fleet.wheel_plan:
    python: /usr/bin/python3
    script: "{{ lookup('ansible.builtin.file', 'pytorch_wheel_plan.py') }}"
    requirements: [torch==2.3.1]
    pip_args: [--index-url, https://download.pytorch.org/whl/cu121]
    context:
      source: https://download.pytorch.org/whl/cu121
      source_setting: pytorch_index_url
  register: __pytorch_wheel_plan_judged
"""

RETURN = r"""
plan:
  description: The judged plan, as the filter gpufleet.fleet.wheel_plan returns it (C(problems), C(warnings),
    C(files), C(hosts), C(summary)), and C(resolved_on), the host whose pip resolved the set where another host of
    the same interpreter and platform did (empty where this host did).
  returned: always
  type: dict
"""
