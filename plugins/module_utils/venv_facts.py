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
import re


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


def _python_read(result):
    """(the interpreter's ``major.minor``, its machine) from the module's ``python`` run; ('', '') when it did not
    run or failed."""
    python = result.get("python") or {}
    lines = python.get("stdout_lines") or []
    if python.get("rc") != 0 or not lines:
        return "", ""
    return lines[0], lines[1] if len(lines) > 1 else ""


def _disk_problem(result, venv, refuse):
    """The environment's file system lacks ``min_free_disk_gb`` (df -Pk's last line: its 1024-blocks, GiB here)."""
    lines = (result.get("df") or {}).get("stdout_lines") or []
    fields = lines[-1].split() if lines else []
    if len(fields) < 6:
        return ""
    needed = int(refuse["min_free_disk_gb"])
    if int(fields[3]) >= needed * 1048576:
        return ""
    free = round(int(fields[3]) / 1048576.0, 1)
    # From the free space as the message shows it, so that the two add up to what is needed.
    short = round(needed - free, 1)
    return (
        "pytorch on {0}: {1} (the file system of {2}) has {3} GB free, needs {4} GB: {5} GB short. Installing {6} "
        "needs pytorch_min_free_disk_gb={4} GB there: free space on it, or lower pytorch_min_free_disk_gb"
    ).format(refuse["host"], fields[-1], venv, free, needed, short, ", ".join(result["unsatisfied"]))


def _source_problem(result, refuse):
    """A listing of the wheel source that did not answer 200."""
    failed = [
        answer
        for answer in (result.get("source") or {}).get("results") or []
        if not answer.get("skipped") and answer.get("status") != 200
    ]
    if not failed:
        return ""
    said = "; ".join(
        " ".join(
            part
            for part in (
                str(answer.get("item", "")),
                "answered HTTP",
                str(answer.get("status", "none")),
                answer.get("msg"),
            )
            if part
        )
        for answer in failed
    )
    return (
        "pytorch on {0}: the wheel source is not usable from this host: {1} ({2}). Check the URL and that this host "
        "can reach it (or its proxy)."
    ).format(refuse["host"], said, refuse["source_setting"])


def _wheel_problem(result, refuse):
    """A pinned wheel the source's listings do not offer for the interpreter's CPython and machine, with the CPythons
    each such pin is offered for."""
    python, machine = _python_read(result)
    arch = machine or refuse["architecture"] or "x86_64"
    pytag = "cp" + python.replace(".", "") if python else "cp3[0-9]+"
    pages = "\n".join(str(answer.get("content") or "") for answer in (result.get("source") or {}).get("results") or [])
    pages = pages.replace("%2B", "+").replace("%2b", "+")
    wheel = (
        r"(?:^|[/\"'>])("
        + "|".join(refuse["packages"])
        + r")-([^-/\"'<>\s]+)-(?:"
        + pytag
        + r")-(?:"
        + pytag
        + r"|abi3)-[^/\"'<>\s]*"
        + re.escape(arch)
        + r"\.whl"
    )
    offered = set("==".join(found) for found in re.findall(wheel, pages))
    missing = [pin for pin in refuse["pins"] if pin not in offered]
    if not missing:
        return ""
    elsewhere = "".join(
        "; {0} is offered for {1}".format(
            pin,
            ", ".join(_unique(re.findall(re.escape(pin.replace("==", "-")) + "-(cp[0-9]+)-", pages)))
            or "no Python at all",
        )
        for pin in missing
    )
    fix = (
        "Use another pytorch_release, or an interpreter the wheels exist for (pytorch_python, pytorch_python_packages)."
        if python
        else "{0} does not run yet.".format(refuse["python_name"])
    )
    return "pytorch on {0}: {1} has no wheel of {2} for CPython {3} on {4}{5}. {6}".format(
        refuse["host"], refuse["source"], ", ".join(missing), python or "3", arch, elsewhere, fix
    )


def _unique(items):
    return list(dict.fromkeys(items))


def refusal(result, venv, refuse):
    """Why the host stops before the install (the pytorch role's checks, on the module's ``result``), '' when it does
    not: only where something is to be installed, the environment's file system too full, and a wheel source listing
    that does not answer or, when every listing answered, a pinned wheel it lacks for this host's CPython and machine.

    ``refuse``: ``host``, ``min_free_disk_gb``, ``source`` (the URL named), ``source_setting`` (the setting behind
    it), ``pins`` and ``packages`` (the matrix's pins and their packages), ``architecture`` (the host's, when its
    interpreter does not say) and ``python_name`` (the interpreter's setting, named when it does not run).
    """
    if not result.get("unsatisfied"):
        return ""
    problems = [_disk_problem(result, venv, refuse)]
    problems.append(_source_problem(result, refuse) or _wheel_problem(result, refuse))
    return " | ".join(problem for problem in problems if problem)
