"""gpufleet.fleet.venv_facts (plugins/modules/venv_facts.py) and its HTTP helper (module_utils/http_answer.py), run
for real on this machine as Ansible runs a module (its arguments in a JSON file): a real virtual environment (this
project's own .venv) read by the pytorch role's pytorch_installed.py, and wheel listings served on 127.0.0.1.

The role's checks of what the module returns are tested in test_pytorch_role.py (the registered result given to
preflight.yml's checks)."""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

import conftest
import pytest
from conftest import REPO_ROOT

from ansible_collections.gpufleet.fleet.plugins.module_utils import venv_facts

SCRIPT = (REPO_ROOT / "roles" / "pytorch" / "files" / "pytorch_installed.py").read_text()
PAGE = '<a href="torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl">torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl</a>'


@pytest.fixture(scope="module")
def listings():
    """A wheel source on 127.0.0.1: /whl/torch/ answers the page, anything else 404."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the handler's name)
            body = PAGE.encode() if self.path == "/whl/torch/" else b"not here"
            self.send_response(200 if self.path == "/whl/torch/" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def run_module(tmp_path: Path, name: str, **arguments: Any) -> dict[str, Any]:
    return conftest.run_module(tmp_path, name, {"no_proxy": "127.0.0.1"}, **arguments)


def run_venv_facts(tmp_path: Path, venv: str, requirements: list[str], **arguments: Any) -> dict[str, Any]:
    """The module on ``venv`` with the role's installed script, this interpreter creating the environment."""
    return run_module(
        tmp_path,
        "venv_facts",
        venv=venv,
        installed_script=SCRIPT,
        requirements=requirements,
        python=sys.executable,
        **arguments,
    )


def test_a_complete_environment_needs_nothing_and_reads_nothing_more(tmp_path, listings):
    pip = metadata.version("pip")
    result = run_module(
        tmp_path,
        "venv_facts",
        venv=sys.prefix,
        installed_script=SCRIPT,
        requirements=[f"pip=={pip}"],
        python=sys.executable,
        pages=[f"{listings}/whl/torch/"],
    )
    assert result["venv_exists"] is True and result["installed"]["rc"] == 0, result
    assert json.loads(result["installed"]["stdout_lines"][-1]) == {
        "pip": pip,
        "installed": {"pip": pip},
        "unsatisfied": [],
    }
    assert (result["venv_state"], result["unsatisfied"], result["installed_versions"]) == ("ok", [], {"pip": pip})
    assert result["needed"] is False
    assert result["python"]["skipped"] and result["df"]["skipped"] and result["source"]["skipped"]
    assert result["changed"] is False


def test_a_missing_environment_reads_the_interpreter_the_free_space_and_the_listings(tmp_path, listings):
    venv = tmp_path / "absent" / "venv"
    result = run_module(
        tmp_path,
        "venv_facts",
        venv=str(venv),
        installed_script=SCRIPT,
        requirements=["torch==2.3.1"],
        python=sys.executable,
        pages=[f"{listings}/whl/torch/", f"{listings}/whl/nothing/"],
    )
    assert result["venv_exists"] is False and result["installed"]["skipped"] and result["needed"] is True
    assert (result["venv_state"], result["unsatisfied"], result["installed_versions"]) == (
        "missing",
        ["torch==2.3.1"],
        {},
    )
    assert result["python"]["rc"] == 0
    assert result["python"]["stdout_lines"] == [f"{sys.version_info[0]}.{sys.version_info[1]}", os.uname().machine]
    # df -Pk of the nearest existing directory: tmp_path's file system.
    fields = result["df"]["stdout_lines"][-1].split()
    assert result["df"]["stdout_lines"][0].startswith("Filesystem") and fields[3].isdigit()
    found, missing = result["source"]["results"]
    assert (found["item"], found["status"], found["content"]) == (f"{listings}/whl/torch/", 200, PAGE)
    assert missing["status"] == 404
    assert missing["msg"] == "Status code was 404 and not [200]: HTTP Error 404: Not Found", missing


def _refuse(**changes: Any) -> dict[str, Any]:
    """The pytorch role's checks (preflight.yml's refuse), for torch 2.3.1 on the listings above."""
    return {
        "host": "here",
        "min_free_disk_gb": 0,
        "source": "the test source",
        "source_setting": "pytorch_wheelhouse_url",
        "pins": ["torch==2.3.1"],
        "packages": ["torch"],
        "architecture": "x86_64",
        "python_name": sys.executable,
        **changes,
    }


def test_the_checks_fail_the_module_with_every_reason(tmp_path, listings):
    """The role's checks on this machine's answers: a file system too full and a listing that does not answer stop
    the host in one message; the module fails with it, returning only it."""
    venv = str(tmp_path / "absent" / "venv")
    arguments = {
        "venv": venv,
        "installed_script": SCRIPT,
        "requirements": ["torch==2.3.1"],
        "python": sys.executable,
        "pages": [f"{listings}/whl/torch/", f"{listings}/whl/nothing/"],
    }
    failed = run_module(tmp_path, "venv_facts", **arguments, refuse=_refuse(min_free_disk_gb=10**9))
    assert failed["failed"] is True and failed["msg"] == failed["message"] and "source" not in failed, failed
    disk, source = failed["msg"].split(" | ")
    assert disk.startswith("pytorch on here: ") and f"(the file system of {venv}) has " in disk, disk
    assert "needs 1000000000 GB: " in disk and "Installing torch==2.3.1 needs pytorch_min_free_disk_gb=" in disk
    assert source == (
        f"pytorch on here: the wheel source is not usable from this host: {listings}/whl/nothing/ answered HTTP 404 "
        "Status code was 404 and not [200]: HTTP Error 404: Not Found (pytorch_wheelhouse_url). Check the URL and "
        "that this host can reach it (or its proxy)."
    )
    # The same answers judged in Python (module_utils/venv_facts.py refusal, what the module ran).
    result = run_module(tmp_path, "venv_facts", **arguments)
    assert result.get("failed") is not True and "message" not in result
    judged_disk, judged_source = venv_facts.refusal(result, venv, _refuse(min_free_disk_gb=10**9)).split(" | ")
    # The free space may move between the two runs (other tests write files): the disk's message up to it.
    assert judged_source == source and judged_disk.split(" has ")[0] == disk.split(" has ")[0]
    # Every listing answering and the disk roomy: the pin's wheel decides (the page has cp311 on x86_64 only).
    answered = {**result, "source": {"results": result["source"]["results"][:1]}}
    python_311 = {"rc": 0, "stdout_lines": ["3.11", "x86_64"]}
    assert venv_facts.refusal({**answered, "python": python_311}, venv, _refuse()) == ""
    python_312 = {"rc": 0, "stdout_lines": ["3.12", "x86_64"]}
    assert venv_facts.refusal({**answered, "python": python_312}, venv, _refuse()) == (
        "pytorch on here: the test source has no wheel of torch==2.3.1 for CPython 3.12 on x86_64; torch==2.3.1 is "
        "offered for cp311. Use another pytorch_release, or an interpreter the wheels exist for (pytorch_python, "
        "pytorch_python_packages)."
    )
    no_python = {"rc": 127, "stdout_lines": []}
    assert venv_facts.refusal({**answered, "python": no_python}, venv, _refuse()) == ""  # cp3x: cp311 counts
    assert venv_facts.refusal({**answered, "python": no_python}, venv, _refuse(pins=["torch==9.9"])).endswith(
        f"for CPython 3 on x86_64; torch==9.9 is offered for no Python at all. {sys.executable} does not run yet."
    )


def test_a_source_that_does_not_answer_is_status_minus_one(tmp_path):
    result = run_venv_facts(
        tmp_path,
        str(tmp_path / "venv"),
        ["torch==2.3.1"],
        pages=["http://127.0.0.1:9/whl/torch/"],  # the discard port: nothing listens
        timeout=5,
    )
    [answer] = result["source"]["results"]
    assert answer["status"] == -1 and answer["msg"].startswith("Status code was -1 and not [200]: "), answer


def test_a_usable_environment_missing_a_pin_is_ok_with_that_pin_unsatisfied(tmp_path):
    pip = metadata.version("pip")
    result = run_venv_facts(tmp_path, sys.prefix, [f"pip=={pip}", "gpufleet-absent==1.0"])
    assert (result["venv_state"], result["unsatisfied"], result["needed"]) == ("ok", ["gpufleet-absent==1.0"], True)
    assert result["installed_versions"] == {"pip": pip, "gpufleet-absent": None}
    assert result["df"]["stdout_lines"][0].startswith("Filesystem"), result


def test_an_environment_whose_interpreter_does_not_run_is_broken(tmp_path):
    """Its interpreter is there but fails (the system Python it was made from is gone): every pin unsatisfied."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 'python3.11: not found' >&2\nexit 127\n")
    python.chmod(0o755)
    result = run_venv_facts(tmp_path, str(tmp_path / "venv"), ["torch==2.3.1"])
    assert result["venv_exists"] is True and result["installed"]["rc"] == 127, result
    assert (result["venv_state"], result["unsatisfied"], result["needed"]) == ("broken", ["torch==2.3.1"], True)


# The decision itself (module_utils/venv_facts.py), on what pytorch_installed.py prints.
PINS = ["torch==2.3.1", "numpy==1.26.4"]


@pytest.mark.parametrize(
    "exists, installed, expected",
    [
        (False, {"skipped": True}, ("missing", PINS, {}, True)),
        # The interpreter failed, or printed no JSON last: broken, nothing known to be installed.
        (True, {"rc": 127, "stdout_lines": []}, ("broken", PINS, {}, True)),
        (True, {"rc": 0, "stdout_lines": ["Traceback ..."]}, ("broken", PINS, {}, True)),
        (True, {"rc": 0, "stdout_lines": ["[1, 2]"]}, ("broken", PINS, {}, True)),
        # No pip in the environment: broken, even with every pin satisfied.
        (
            True,
            {"rc": 0, "stdout_lines": ['{"pip": null, "installed": {"torch": "2.3.1"}, "unsatisfied": []}']},
            ("broken", [], {"torch": "2.3.1"}, True),
        ),
        (
            True,
            {"rc": 0, "stdout_lines": ["noise", '{"pip": "24.0", "installed": {"torch": "2.3.1"}, "unsatisfied": []}']},
            ("ok", [], {"torch": "2.3.1"}, False),
        ),
        (
            True,
            {
                "rc": 0,
                "stdout_lines": ['{"pip": "24.0", "installed": {"torch": null}, "unsatisfied": ["torch==2.3.1"]}'],
            },
            ("ok", ["torch==2.3.1"], {"torch": None}, True),
        ),
    ],
)
def test_the_decision_on_what_the_environment_holds(exists, installed, expected):
    decided = venv_facts.decide(exists, venv_facts.installed_answer(installed), PINS)
    assert (decided["venv_state"], decided["unsatisfied"], decided["installed_versions"], decided["needed"]) == expected
