# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a Python virtual environment holds, and what must be installed into it.

The module gpufleet.fleet.venv_facts runs this on the host (it is shipped
with the module, so it keeps to Python 3.8 and the standard library); the
pytorch role reads its decision (``venv_state``, ``unsatisfied``) and does
not decide again.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json


def installed_answer(installed):
    """The JSON object the installed script printed last (``{pip, installed, unsatisfied}``: the role's
    pytorch_installed.py), from its run (``{rc, stdout_lines}``, or skipped); ``{}`` when it failed or printed none."""
    lines = installed.get("stdout_lines") or []
    if installed.get("rc") != 0 or not lines:
        return {}
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def decide(venv_exists, answer, requirements):
    """What must be installed: ``{venv_state, unsatisfied, installed_versions, needed}``.

    ``venv_state``: ``missing`` (no environment), ``broken`` (its interpreter does not run, the system Python it was
    made from being gone, or it has no pip) or ``ok``; ``unsatisfied``: the requirements it does not satisfy (every
    one without an answer); ``installed_versions``: each requirement's installed version (None: not installed);
    ``needed``: whether anything must be installed.
    """
    if not venv_exists:
        state = "missing"
    elif answer.get("pip") is not None:
        state = "ok"
    else:
        state = "broken"
    unsatisfied = answer.get("unsatisfied")
    if not isinstance(unsatisfied, list):
        unsatisfied = list(requirements)
    return {
        "venv_state": state,
        "unsatisfied": unsatisfied,
        "installed_versions": answer.get("installed") or {},
        "needed": state != "ok" or bool(unsatisfied),
    }
