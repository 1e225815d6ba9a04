"""dcgm: DCGM's diagnostic documents (dcgmi diag -j) and dcgmi run under its time limit."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from gpufleet_check import dcgm

from .saved_outputs import CAT, DATA, SLEEP, data, fake_tool, run_cli, smi

# --------------------------------------------------------------------------- dcgm


def test_dcgm3_documents() -> None:
    parsed = dcgm.parse_dcgm_json(data("dcgm", "dcgm3-r2-virtualclient.json"))
    assert parsed["schema"] == "dcgm3" and len(parsed["tests"]) == 11
    pcie = next(t for t in parsed["tests"] if t["name"] == "PCIe")
    assert pcie["category"] == "Integration" and pcie["results"][0]["gpu"] == "0"
    assert "Host to GPU bandwidth" in pcie["results"][0]["info"][0]
    assert next(t for t in parsed["tests"] if t["name"] == "Denylist")["results"][0]["gpu"] == "all"
    judged = dcgm.judge_dcgm(parsed)
    assert (judged["verdict"], judged["findings"]) == ("pass", [])
    r3 = dcgm.judge_dcgm(dcgm.parse_dcgm_json(data("dcgm", "dcgm3-r3-virtualclient.json")))
    assert r3["verdict"] == "pass" and r3["tests"]["EUD Test"] == "Skip" and r3["counts"] == {"Pass": 15, "Skip": 1}


def test_dcgm3_failed_test_fails() -> None:
    judged = dcgm.judge_dcgm(dcgm.parse_dcgm_json(data("dcgm", "dcgm3-r3-virtualclient-pcie-fail.json")))
    (found,) = judged["findings"]
    assert (judged["verdict"], found["gpu"], found["test"]) == ("fail", "GPU 0", "PCIe")
    assert found["evidence"].startswith("PCIe: Fail: GPU 0 GPU 0 GPU to Host bandwidth")


def dcgm4_test(name: str) -> dict[str, Any]:
    """The issue's excerpt is one test object cut from its document with the comma after it."""
    return json.loads(data("dcgm", name).rstrip().rstrip(","))


def test_dcgm4_test_object() -> None:
    test = dcgm.parse_test(dcgm4_test("dcgm4-issue215-diagnostic-test.json.fragment"), "Hardware")
    assert (test["name"], test["summary"]) == ("diagnostic", "Pass")
    assert [r["gpu"] for r in test["results"]] == [str(i) for i in range(8)]
    assert test["results"][0]["info"][2] == "GPU 0 calculated at approximately 859.08 gigaflops during this test"


def test_dcgm4_document_shape() -> None:
    """The DCGM 4 envelope as NVIDIA/DCGM testing/python3/dcgm_diag_schema.json defines it, around the
    issue's real test object (no complete DCGM 4 document was found published)."""
    for name, verdict in (
        ("dcgm4-issue215-diagnostic-test.json.fragment", "pass"),
        ("dcgm4-issue215-diagnostic-test-gpu3-fail.json.fragment", "fail"),
    ):
        doc = {
            "DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [dcgm4_test(name)]}]},
            "metadata": {"version": "4.0.0"},
        }
        parsed = dcgm.parse_dcgm_json(json.dumps(doc))
        judged = dcgm.judge_dcgm(parsed)
        assert (parsed["schema"], parsed["version"], judged["verdict"]) == ("dcgm4", "4.0.0", verdict)
    assert judged["findings"][0]["gpu"] == "GPU 3"


@pytest.mark.parametrize(
    "text, message",
    [
        ("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.", "no JSON document"),
        ('{"DCGM GPU Diagnostic": ', "does not parse"),
        ('{"tests": []}', "neither 'DCGM Diagnostic'"),
    ],
)
def test_dcgm_unreadable_documents_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dcgm.parse_dcgm_json(text)


def test_dcgm_refuses_mig_and_reads_its_connection_errors() -> None:
    refusal = dcgm.mig_refusal(smi("a100-sxm4-80gb-mig-535.54.03.xml"))
    assert refusal.startswith("refused: MIG mode is enabled on GPU 0 (00000000:01:00.0)")
    assert dcgm.mig_refusal(smi("h100-8gpu-535.161.08-power-brake.txt")) == ""
    assert dcgm.connection_problem("Error: Unable to connect to host engine. Host engine connection invalid")
    assert dcgm.status_word("PASS") == "Pass" and dcgm.status_word("Not Run") == "Not Run"


# --------------------------------------------------------------------------- dcgmi under its time limit


def test_dcgm_not_installed_and_mig_refusal(gpu_host: Path) -> None:
    _proc, checks = run_cli(gpu_host)
    assert checks["dcgm"]["detail"] == "not installed (dcgmi not on PATH)"
    fake_tool(gpu_host / "bin", "dcgmi", "echo should not run >&2; exit 3\n")
    _proc, checks = run_cli(gpu_host)
    assert checks["dcgm"]["verdict"] == "skipped"
    assert checks["dcgm"]["detail"].startswith("refused: MIG mode is enabled on GPU 0 (00000000:01:00.0)")
    assert checks["clocks"]["verdict"] == "pass" and checks["gpu_errors"]["verdict"] == "pass"
    _proc, checks = run_cli(gpu_host, "--dcgm-level", "0")
    assert checks["dcgm"]["detail"] == "not requested (--dcgm-level 0)"


def test_dcgm_runs_under_a_time_limit(gpu_host: Path) -> None:
    # nvidia-smi -q -x answered with a real -q text output (H100, MIG disabled): read all the same
    fake_tool(
        gpu_host / "bin",
        "nvidia-smi",
        f'if [ "$1" = "-q" ]; then "{CAT}" "{DATA}/smi-text/h100-8gpu-535.183.01.txt"; fi\n',
    )
    fake_tool(gpu_host / "bin", "dcgmi", f'"{SLEEP}" 30\n')
    began = time.monotonic()
    _proc, checks = run_cli(gpu_host, "--dcgm-timeout", "1")
    assert time.monotonic() - began < 25
    assert checks["dcgm"]["verdict"] == "fail" and "did not finish within 1 s" in checks["dcgm"]["detail"]
    report = DATA / "dcgm" / "dcgm3-r2-virtualclient.json"
    fake_tool(
        gpu_host / "bin",
        "dcgmi",
        f'[ "$*" = "diag -r 2 -j" ] || exit 9\necho "Successfully ran diagnostic for group."\n"{CAT}" "{report}"\n',
    )
    _proc, checks = run_cli(gpu_host, "--dcgm-level", "2")
    assert checks["dcgm"]["verdict"] == "pass", checks["dcgm"]
    assert checks["dcgm"]["detail"].startswith("11 test(s) (11 Pass) from dcgmi diag -r 2 -j (rc 0, ")
    fake_tool(
        gpu_host / "bin",
        "dcgmi",
        'echo "Error: unable to establish a connection to the specified host: localhost"; exit 1\n',
    )
    _proc, checks = run_cli(gpu_host)
    assert checks["dcgm"]["verdict"] == "warn" and "nv-hostengine" in checks["dcgm"]["detail"]
