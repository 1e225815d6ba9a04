"""plugins/module_utils/fleet_report.py: the fleet report from the nodes' check results (JSON, Markdown, JUnit),
imported through the collection as the action plugin gpufleet.fleet.fleet_report, the filter check_entry and
files/gpufleet_verify.py import it; its command line, files/gpufleet_report.py, run as a script."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpufleet.fleet.plugins.module_utils import fleet_report

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "files" / "gpufleet_report.py"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
MISMATCH = "driver_version: loaded module 535.261.03, installed 535.309.01: driver/library mismatch, reboot required"


def check(
    name: str,
    verdict: str = "pass",
    value: Any = None,
    unit: str | None = None,
    threshold: Any = None,
    detail: str = "ok",
) -> dict[str, Any]:
    return {"name": name, "verdict": verdict, "value": value, "unit": unit, "threshold": threshold, "detail": detail}


def passing_result(host: str = "node-1", gpus: int = 8, model: str = H100) -> dict[str, Any]:
    """A gpufleet-check/1 document of a healthy 8-GPU node."""
    return {
        "schema": "gpufleet-check/1",
        "host": host,
        "started": "2026-11-29T22:39:50Z",
        "duration_s": 3.2,
        "verdict": "pass",
        "reasons": [],
        "reboot_required": False,
        "versions": {
            "driver_installed": "535.261.03",
            "driver_loaded": "535.261.03",
            "cuda": "12.1",
            "torch": "2.5.1+cu121",
            "cudnn": "8.9.2",
            "nccl": "2.18.1",
            "python": "3.11.2",
            "system_cudnn": "8.9.2.26-1+cuda12.1",
            "system_nccl": None,
        },
        "gpus": [
            {
                "index": index,
                "name": model,
                "uuid": f"GPU-{index}",
                "pci_bus_id": f"00000000:{index:02x}:00.0",
                "memory_total_mib": 81559,
                "persistence_mode": True,
                "ecc_uncorrected": 0,
                "gemm_tflops": 701.3 - index,
            }
            for index in range(gpus)
        ],
        "gpu_count_pci": gpus,
        "checks": [
            check("driver_version", value="535.261.03"),
            check("nvidia_smi", value=gpus),
            check("torch_cuda", value="12.1"),
            check("libraries", value={"cudnn": "8.9.2", "nccl": "2.18.1"}),
            check("gemm", value=694.3, unit="TFLOP/s", threshold=494.5, detail="slowest GPU 7"),
            check("allreduce_busbw", value=362.75, unit="GB/s", threshold=100, detail="NVSwitch"),
            check("p2p_topology", value="NV18"),
        ],
    }


def failing_result(host: str = "node-2") -> dict[str, Any]:
    """A node upgraded without a reboot: the loaded module is not the installed driver."""
    result = passing_result(host)
    result.update(verdict="fail", reasons=[MISMATCH], reboot_required=True)
    result["versions"]["driver_installed"] = "535.309.01"
    result["checks"][0] = check(
        "driver_version", "fail", "535.261.03", None, "535.309.01", "loaded module 535.261.03, installed 535.309.01"
    )
    return result


def no_gpu_result(host: str) -> dict[str, Any]:
    """A node without GPUs that does not require them: every GPU check skipped."""
    result = passing_result(host, gpus=0)
    result["versions"].update(driver_installed=None, driver_loaded=None, cuda=None, torch=None, cudnn=None, nccl=None)
    result["checks"] = [
        check(name, "skipped", detail="no GPU") for name in ("nvidia_smi", "gemm", "allreduce_busbw", "p2p_topology")
    ]
    return result


def document(**hosts: Any) -> dict[str, Any]:
    """The collector's document; a host given a check result gets error None, given a string an unreachable entry."""
    return {
        "generated": "2026-11-29T22:40:00Z",
        "inventory": "tests/lab/inventory",
        "playbook": "verify",
        "hosts": {
            host: {"result": None, "error": entry} if isinstance(entry, str) else {"result": entry, "error": None}
            for host, entry in hosts.items()
        },
    }


def fleet_doc() -> dict[str, Any]:
    return document(
        **{
            "node-1": passing_result("node-1"),
            "node-2": failing_result("node-2"),
            "node-3": "unreachable: ssh: connect to host 10.0.0.3 port 22: Connection refused",
        }
    )


def node_of(report: dict[str, Any], host: str) -> dict[str, Any]:
    return next(node for node in report["nodes"] if node["host"] == host)


# --- build_report --------------------------------------------------------------------------------


def test_passing_node_is_summarised_from_its_result():
    result = passing_result()
    node = node_of(fleet_report.build_report(document(**{"node-1": result})), "node-1")
    assert node == {
        "host": "node-1",
        "verdict": "pass",
        "reasons": [],
        "reboot_required": False,
        "driver": "535.261.03",
        "driver_loaded": "535.261.03",
        "driver_requested": None,
        "driver_pinned": None,
        "cuda": "12.1",
        "torch": "2.5.1+cu121",
        "cudnn": "8.9.2",
        "nccl": "2.18.1",
        "system_cudnn": "8.9.2.26-1+cuda12.1",
        "system_nccl": None,
        "gpus": 8,
        "gpu_model": H100,
        "tflops_min": 694.3,
        "busbw_gbps": 362.75,
        "checks": {
            "driver_version": "pass",
            "nvidia_smi": "pass",
            "torch_cuda": "pass",
            "libraries": "pass",
            "gemm": "pass",
            "allreduce_busbw": "pass",
            "p2p_topology": "pass",
        },
        "findings": [],
        "actions": [],
        "figures": {
            "gemm_tflops": {"value": 694.3, "unit": "TFLOP/s", "label": "GEMM of the slowest GPU", "basis": ""},
            "allreduce_busbw_gbps": {"value": 362.75, "unit": "GB/s", "label": "all-reduce bus bandwidth", "basis": ""},
        },
        "recent_runs": None,
        "result": result,
    }


def test_report_header_summary_and_fleet_verdict():
    report = fleet_report.build_report(fleet_doc())
    assert {key: report[key] for key in ("schema", "generated", "inventory", "playbook", "verdict", "summary")} == {
        "schema": "gpufleet-fleet-report/1",
        "generated": "2026-11-29T22:40:00Z",
        "inventory": "tests/lab/inventory",
        "playbook": "verify",
        "verdict": "fail",
        "summary": {"nodes": 3, "passed": 1, "failed": 1, "unreachable": 1},
    }
    assert [node["verdict"] for node in report["nodes"]] == ["pass", "fail", "unreachable"]


def test_fleet_passes_only_when_every_node_passes():
    assert fleet_report.build_report(document(a=passing_result("a"), b=passing_result("b")))["verdict"] == "pass"
    assert fleet_report.build_report(document(a=passing_result("a"), b="unreachable: timed out"))["verdict"] == "fail"
    empty = fleet_report.build_report(document())
    assert (empty["verdict"], empty["nodes"]) == ("fail", [])
    assert empty["summary"] == {"nodes": 0, "passed": 0, "failed": 0, "unreachable": 0}


def test_nodes_are_sorted_by_name_with_numbers_in_order():
    names = ("node-10", "node-2", "gpu-b", "node-1")
    report = fleet_report.build_report(document(**{name: passing_result(name) for name in names}))
    assert [node["host"] for node in report["nodes"]] == ["gpu-b", "node-1", "node-2", "node-10"]


def test_failed_node_keeps_its_reasons_and_versions():
    node = node_of(fleet_report.build_report(fleet_doc()), "node-2")
    assert (node["verdict"], node["reasons"], node["reboot_required"]) == ("fail", [MISMATCH], True)
    assert (node["driver"], node["driver_loaded"]) == ("535.309.01", "535.261.03")
    assert node["checks"]["driver_version"] == "fail"


def test_failed_node_without_reasons_is_explained_by_its_failed_checks():
    result = failing_result()
    result["reasons"] = []
    node = node_of(fleet_report.build_report(document(n=result)), "n")
    assert node["reasons"] == ["driver_version: loaded module 535.261.03, installed 535.309.01"]


def test_unreachable_node_has_the_collectors_error_as_reason():
    report = fleet_report.build_report(fleet_doc())
    node = node_of(report, "node-3")
    assert node["verdict"] == "unreachable"
    assert node["reasons"] == ["unreachable: ssh: connect to host 10.0.0.3 port 22: Connection refused"]
    assert all(
        node[key] is None
        for key in (
            "reboot_required",
            "driver",
            "cuda",
            "torch",
            "gpus",
            "gpu_model",
            "tflops_min",
            "busbw_gbps",
            "result",
        )
    )
    assert node["checks"] == {}


def test_unreachable_node_without_an_error_still_has_a_reason():
    doc = document()
    doc["hosts"]["n"] = {"result": None}
    assert node_of(fleet_report.build_report(doc), "n")["reasons"] == ["no result, and the collector gave no error"]


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        ("Traceback (most recent call last):", 'not a JSON object: "Traceback (most recent call last):"'),
        ([1, 2], "not a JSON object: [1, 2]"),
        (
            {**passing_result(), "schema": "gpufleet-check/2"},
            'schema is "gpufleet-check/2", expected "gpufleet-check/1"',
        ),
        (
            {key: value for key, value in passing_result().items() if key != "schema"},
            'schema is null, expected "gpufleet-check/1"',
        ),
        ({key: value for key, value in passing_result().items() if key != "verdict"}, "no verdict"),
        ({**passing_result(), "verdict": "ok"}, 'verdict "ok" is not "pass" or "fail"'),
        ({**passing_result(), "checks": "all good"}, 'checks is not a list: "all good"'),
        (
            {**passing_result(), "checks": [check("gemm"), {"name": "nccl", "verdict": "error"}]},
            "checks[1] is not a check",
        ),
    ],
)
def test_invalid_result_fails_the_node_and_says_why(result, problem):
    doc = document()
    doc["hosts"]["n"] = {"result": result, "error": None}
    node = node_of(fleet_report.build_report(doc), "n")
    assert node["verdict"] == "fail"
    assert len(node["reasons"]) == 1
    assert node["reasons"][0].startswith("invalid gpufleet-check/1 result: ")
    assert problem in node["reasons"][0]
    assert node["result"] == result


def test_every_problem_of_an_invalid_result_is_named():
    node = node_of(fleet_report.build_report(document(n={"schema": "x"})), "n")
    assert node["reasons"] == [
        'invalid gpufleet-check/1 result: schema is "x", expected "gpufleet-check/1"; no verdict'
    ]


def test_malformed_fields_of_a_result_read_as_missing():
    result = passing_result()
    result.update(
        versions="535",
        gpus="eight",
        reboot_required="no",
        checks=[check("gemm", value="fast"), check("allreduce_busbw", value=True)],
    )
    node = node_of(fleet_report.build_report(document(n=result)), "n")
    assert node["verdict"] == "pass"
    assert all(
        node[key] is None
        for key in ("reboot_required", "driver", "cuda", "gpus", "gpu_model", "tflops_min", "busbw_gbps")
    )


def test_collector_entry_that_is_not_an_object_fails_the_node():
    doc = document()
    doc["hosts"]["n"] = "garbage"
    node = node_of(fleet_report.build_report(doc), "n")
    assert (node["verdict"], node["reasons"]) == ("fail", ['the collector\'s entry is not an object: "garbage"'])


@pytest.mark.parametrize("doc", [[], "hosts", {}, {"hosts": ["node-1"]}, {"hosts": None}])
def test_document_without_a_hosts_object_is_an_input_error(doc):
    with pytest.raises(fleet_report.InputError):
        fleet_report.build_report(doc)


def test_gpu_model_mixed_or_missing():
    mixed = passing_result(gpus=8)
    mixed["gpus"][7]["name"] = A100
    unnamed = passing_result(gpus=2)
    for gpu in unnamed["gpus"]:
        del gpu["name"]
    report = fleet_report.build_report(document(mixed=mixed, unnamed=unnamed, none=passing_result(gpus=0)))
    assert node_of(report, "mixed")["gpu_model"] == f"mixed: 1× {A100}, 7× {H100}"
    assert (node_of(report, "unnamed")["gpus"], node_of(report, "unnamed")["gpu_model"]) == (2, None)
    assert (node_of(report, "none")["gpus"], node_of(report, "none")["gpu_model"]) == (0, None)


def test_build_report_leaves_its_input_alone():
    doc = fleet_doc()
    before = copy.deepcopy(doc)
    fleet_report.build_report(doc)
    assert doc == before


# --- Markdown ------------------------------------------------------------------------------------


def table_rows(markdown: str) -> list[list[str]]:
    """The table's rows as cells, split on the pipes that are not escaped."""
    return [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        for line in markdown.splitlines()
        if line.startswith("|")
    ]


def test_markdown_title_and_verdict_line():
    markdown = fleet_report.render_markdown(fleet_report.build_report(fleet_doc()))
    lines = markdown.splitlines()
    assert lines[0] == "# GPU fleet verification, 2026-11-29T22:40:00Z"
    assert "**FAIL**: 3 nodes: 1 passed, 1 failed, 1 unreachable" in lines
    assert "1 node: 1 passed, 0 failed, 0 unreachable" in fleet_report.render_markdown(
        fleet_report.build_report(document(a=passing_result("a")))
    )


def test_markdown_table_has_one_row_per_node():
    rows = table_rows(fleet_report.render_markdown(fleet_report.build_report(fleet_doc())))
    assert rows[0] == list(fleet_report.TABLE_HEADER)
    assert set("".join(rows[1])) == {"-"}
    assert rows[2:] == [
        [
            "node-1",
            "PASS",
            "535.261.03",
            "12.1",
            "2.5.1+cu121",
            "8.9.2 / 2.18.1",
            "8.9.2.26-1+cuda12.1 / —",
            "8",
            "694.3",
            "362.8",
            "—",
        ],
        [
            "node-2",
            "FAIL",
            "535.309.01 (loaded 535.261.03)",
            "12.1",
            "2.5.1+cu121",
            "8.9.2 / 2.18.1",
            "8.9.2.26-1+cuda12.1 / —",
            "8",
            "694.3",
            "362.8",
            MISMATCH,
        ],
        [
            "node-3",
            "UNREACHABLE",
            "—",
            "—",
            "—",
            "—",
            "—",
            "—",
            "—",
            "—",
            "unreachable: ssh: connect to host 10.0.0.3 port 22: Connection refused",
        ],
    ]


def test_markdown_lists_torch_own_and_system_libraries_apart():
    """A CPU-only torch has no cuDNN/NCCL of its own (said so); a node without the system packages says that."""
    cpu = passing_result("cpu")
    cpu["versions"].update(cuda=None, torch="2.3.1+cpu", cudnn=None, nccl=None, system_cudnn=None, system_nccl=None)
    gpu = passing_result("gpu")
    gpu["versions"].update(
        cudnn="9.1.0", nccl="2.21.5", system_cudnn="8.9.2.26-1+cuda12.1", system_nccl="2.18.1-1+cuda12.1"
    )
    report = fleet_report.build_report(document(cpu=cpu, gpu=gpu))
    rows = table_rows(fleet_report.render_markdown(report))
    assert [row[5:7] for row in rows[2:]] == [
        ["none (no CUDA)", "not installed"],
        ["9.1.0 / 2.21.5", "8.9.2.26-1+cuda12.1 / 2.18.1-1+cuda12.1"],
    ]
    assert {node["host"]: (node["nccl"], node["system_nccl"]) for node in report["nodes"]} == {
        "cpu": (None, None),
        "gpu": ("2.21.5", "2.18.1-1+cuda12.1"),
    }


def test_markdown_cells_escape_pipes_and_join_reasons():
    result = failing_result("n")
    result["reasons"] = ["nvidia_smi: `nvidia-smi | grep` failed", "line one\nline two"]
    rows = table_rows(fleet_report.render_markdown(fleet_report.build_report(document(n=result))))
    assert len(rows[2]) == 11
    assert rows[2][-1] == r"nvidia_smi: `nvidia-smi \| grep` failed; line one line two"


def test_markdown_notes_the_checks_skipped():
    report = fleet_report.build_report(document(a=passing_result("a"), b=no_gpu_result("b"), c=no_gpu_result("c")))
    markdown = fleet_report.render_markdown(report)
    assert markdown.endswith(
        '**Checks skipped**\n\n- "no GPU" on 2 nodes (b, c): nvidia_smi, gemm, allreduce_busbw, p2p_topology\n'
    )
    assert table_rows(markdown)[3][7:10] == ["0", "—", "—"]
    assert "Checks skipped" not in fleet_report.render_markdown(fleet_report.build_report(fleet_doc()))


def test_markdown_of_a_report_without_date_or_nodes():
    report = fleet_report.build_report({"hosts": {}})
    markdown = fleet_report.render_markdown(report)
    assert markdown.startswith(
        "# GPU fleet verification, undated\n\n**FAIL**: 0 nodes: 0 passed, 0 failed, 0 unreachable\n"
    )
    assert len(table_rows(markdown)) == 2


# --- JUnit XML -----------------------------------------------------------------------------------


def junit(report: dict[str, Any]) -> ET.Element:
    text = fleet_report.render_junit(report)
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    return ET.fromstring(text.encode("utf-8"))


def cases(suite: ET.Element) -> dict[tuple[str, str], ET.Element]:
    return {(case.get("classname"), case.get("name")): case for case in suite.iter("testcase")}


def test_junit_counts_and_outcomes():
    doc = document(
        **{
            "node-1": passing_result("node-1"),
            "node-2": failing_result("node-2"),
            "node-3": "unreachable: timed out",
            "node-4": no_gpu_result("node-4"),
        }
    )
    suite = junit(fleet_report.build_report(doc))
    assert suite.tag == "testsuite"
    assert {key: suite.get(key) for key in ("name", "tests", "failures", "errors", "skipped", "timestamp")} == {
        "name": "gpufleet-verify",
        "tests": "19",
        "failures": "1",
        "errors": "1",
        "skipped": "4",
        "timestamp": "2026-11-29T22:40:00Z",
    }
    by_name = cases(suite)
    assert len(by_name) == 19
    assert list(by_name[("node-1", "gemm")]) == []
    failure = by_name[("node-2", "driver_version")].find("failure")
    assert failure.get("message") == "loaded module 535.261.03, installed 535.309.01"
    assert failure.text == 'value: "535.261.03", threshold: "535.309.01"'
    assert by_name[("node-3", "reachable")].find("error").get("message") == "unreachable: timed out"
    assert by_name[("node-4", "gemm")].find("skipped").get("message") == "no GPU"


def test_junit_warn_passes_with_its_detail_as_output():
    result = passing_result("n")
    result["checks"][5] = check("allreduce_busbw", "warn", 120.5, "GB/s", 100, "close to the floor")
    case = cases(junit(fleet_report.build_report(document(n=result))))[("n", "allreduce_busbw")]
    assert case.find("failure") is None and case.find("skipped") is None
    assert case.find("system-out").text == "warn: close to the floor\nvalue: 120.5 GB/s, threshold: 100"


def test_junit_failed_node_without_a_failed_check_gets_a_failed_verdict_case():
    reboot = passing_result("reboot")
    reboot.update(verdict="fail", reasons=["reboot required"])
    suite = junit(fleet_report.build_report(document(garbage={"schema": "x"}, reboot=reboot)))
    by_name = cases(suite)
    assert by_name[("garbage", "verdict")].find("failure").get("message").startswith("invalid gpufleet-check/1 result")
    assert by_name[("reboot", "verdict")].find("failure").get("message") == "reboot required"
    assert (suite.get("tests"), suite.get("failures")) == ("9", "2")  # reboot's 7 checks and 2 verdicts


def test_junit_escapes_markup_and_drops_control_characters():
    result = failing_result("n")
    result["checks"][0]["detail"] = 'driver <535> & "quotes" \x1b[31mred\x1b[0m'
    case = cases(junit(fleet_report.build_report(document(n=result))))[("n", "driver_version")]
    message = case.find("failure").get("message")
    assert message == 'driver <535> & "quotes" \ufffd[31mred\ufffd[0m'


# --- files and command line ---------------------------------------------------------------------


def test_write_reports_replaces_the_three_files(tmp_path):
    out_dir = tmp_path / "reports" / "verify"
    report = fleet_report.build_report(fleet_doc())
    paths = fleet_report.write_reports(report, out_dir)
    assert [path.name for path in paths] == ["fleet-report.json", "fleet-report.md", "fleet-report.xml"]
    paths = fleet_report.write_reports(fleet_report.build_report(document(a=passing_result("a"))), out_dir, "hourly")
    assert sorted(path.name for path in out_dir.iterdir()) == [
        "fleet-report.json",
        "fleet-report.md",
        "fleet-report.xml",
        "hourly.json",
        "hourly.md",
        "hourly.xml",
    ]
    assert json.loads((out_dir / "fleet-report.json").read_text()) == report
    hourly = json.loads((out_dir / "hourly.json").read_text())
    assert (out_dir / "hourly.md").read_text() == fleet_report.render_markdown(hourly)
    assert all(path.stat().st_mode & 0o644 == 0o644 for path in paths)


def run_cli(stdin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_writes_three_files_and_prints_the_table(tmp_path):
    completed = run_cli(json.dumps(fleet_doc()), "--out-dir", str(tmp_path / "out"), "--history-keep", "0")
    assert completed.returncode == 0, completed.stderr
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "fleet-report.json",
        "fleet-report.md",
        "fleet-report.xml",
    ]
    report = json.loads((tmp_path / "out" / "fleet-report.json").read_text())
    assert report == fleet_report.build_report(fleet_doc())
    assert completed.stdout == fleet_report.render_terminal(report) + "\n"
    assert ET.parse(tmp_path / "out" / "fleet-report.xml").getroot().get("tests") == "15"


def test_cli_basename(tmp_path):
    completed = run_cli(
        json.dumps(fleet_doc()), "--out-dir", str(tmp_path), "--basename", "verify-2026-11-29", "--history-keep", "0"
    )
    assert completed.returncode == 0, completed.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "verify-2026-11-29.json",
        "verify-2026-11-29.md",
        "verify-2026-11-29.xml",
    ]
    assert run_cli("{}", "--out-dir", str(tmp_path), "--basename", "../elsewhere").returncode == 2


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ('{"hosts": {', "unreadable input, nothing written"),
        ("", "unreadable input, nothing written"),
        ('["node-1"]', 'a "hosts" object'),
    ],
)
def test_cli_unreadable_input_writes_nothing(tmp_path, stdin, message):
    out_dir = tmp_path / "out"
    completed = run_cli(stdin, "--out-dir", str(out_dir))
    assert completed.returncode == 2
    assert message in completed.stderr
    assert completed.stdout == ""
    assert not out_dir.exists()


def test_cli_does_not_replace_a_report_on_unreadable_input(tmp_path):
    assert run_cli(json.dumps(fleet_doc()), "--out-dir", str(tmp_path)).returncode == 0
    before = {path.relative_to(tmp_path): path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    assert len(before) == 5  # the three files, the history and its lock
    assert run_cli("not json", "--out-dir", str(tmp_path)).returncode == 2
    assert run_cli(json.dumps(fleet_doc()), "--out-dir", str(tmp_path), "--repeat-failures", "4").returncode == 2
    assert {path.relative_to(tmp_path): path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_node_reached_without_result_is_failed_not_unreachable():
    """The collector says the node answered (the checks ran but printed no result): FAIL, with its error."""
    node = fleet_report.build_node(
        "node-1", {"result": None, "error": "the checks gave no result (rc 137): Killed", "unreachable": False}
    )
    assert node["verdict"] == "fail" and node["reasons"] == ["the checks gave no result (rc 137): Killed"]
    assert (
        fleet_report.build_node("node-2", {"result": None, "error": "unreachable: x", "unreachable": True})["verdict"]
        == "unreachable"
    )


# --- failures grouped by cause (issue 17) ------------------------------------------------------------


def _reboot_due(host: str) -> dict[str, Any]:
    result = failing_result(host)
    result["reboot_required"] = True
    return result


def test_failures_are_grouped_by_cause_largest_group_first_every_host_named():
    hosts: dict[str, Any] = {f"gpu-node-{i}": passing_result(f"gpu-node-{i}") for i in range(1, 101)}
    hosts.update(
        {
            "gpu-node-17": _reboot_due("gpu-node-17"),
            "gpu-node-63": _reboot_due("gpu-node-63"),
            "gpu-node-5": "unreachable: ssh: connect to host 10.0.0.5 port 22: Connection refused",
        }
    )
    report = fleet_report.build_report(document(**hosts))
    assert fleet_report.failure_lines(report) == [
        "2 nodes: reboot required (gpu-node-17, gpu-node-63)",
        "1 node: unreachable (gpu-node-5)",
    ]
    terminal = fleet_report.render_terminal(report).splitlines()
    assert terminal[0] == "FAIL: 100 nodes: 97 passed, 2 failed, 1 unreachable"
    assert terminal[1:3] == [
        "  2 nodes: reboot required (gpu-node-17, gpu-node-63)",
        "  1 node: unreachable (gpu-node-5)",
    ]
    assert len([line for line in terminal if line.startswith("| gpu-node-")]) == 100
    markdown = fleet_report.render_markdown(report)
    verdict = markdown.index("**FAIL**")
    assert verdict < markdown.index("- 2 nodes: reboot required (gpu-node-17, gpu-node-63)") < markdown.index("| Node")


def test_a_failed_node_without_reboot_is_grouped_by_its_failed_checks():
    report = fleet_report.build_report(fleet_doc())
    assert fleet_report.failure_cause(node_of(report, "node-2")) == "reboot required"  # it explains the rest
    slow = passing_result("node-4")
    slow["verdict"] = "fail"
    slow["checks"] = [
        check("gemm", "fail", 201.3, None, 494.5, "GPU 0 at 201.3 TFLOP/s, below 494.5"),
        check("allreduce_busbw", "fail", 10.0, None, 100.0, "below"),
        check("nvidia_smi", "pass"),
    ]
    node = node_of(fleet_report.build_report(document(**{"node-4": slow})), "node-4")
    assert fleet_report.failure_cause(node) == "failed allreduce_busbw, gemm"
    assert fleet_report.failure_cause(node_of(report, "node-3")) == "unreachable"


def test_a_passing_fleet_has_no_failure_lines():
    report = fleet_report.build_report(document(**{"node-1": passing_result("node-1")}))
    assert fleet_report.failure_lines(report) == []
    assert fleet_report.render_terminal(report).splitlines()[:2] == [
        "PASS: 1 node: 1 passed, 0 failed, 0 unreachable",
        "",
    ]
    markdown = fleet_report.render_markdown(report)
    # One node: the outlier rule has too few peers to judge it, and says so; nothing else is listed.
    assert "\n- " not in markdown.split("**Outliers", maxsplit=1)[0]
    assert "not judged, fewer than 3 nodes of this model (1: node-1)" in markdown


# --- the driver asked for and pinned (issue 14) ------------------------------------------------------


def pinned_result(host: str, pinned: str | None, requested: str | None = "latest") -> dict[str, Any]:
    """A passing node whose nvidia_driver fact says what was asked and what was pinned (gpufleet_check
    --driver-fact)."""
    result = passing_result(host)
    result["versions"].update(
        driver_requested=requested,
        driver_pinned=pinned,
        driver_source="cuda-repo",
        driver_installed=pinned or "535.261.03",
    )
    return result


def test_node_entry_carries_the_requested_and_pinned_driver():
    report = fleet_report.build_report(document(**{"gpufleet-node-1": pinned_result("gpufleet-node-1", "535.261.03")}))
    node = node_of(report, "gpufleet-node-1")
    assert (node["driver_requested"], node["driver_pinned"]) == ("latest", "535.261.03")
    written = json.loads(json.dumps(report))
    assert node_of(written, "gpufleet-node-1")["driver_requested"] == "latest"
    assert node_of(written, "gpufleet-node-1")["driver_pinned"] == "535.261.03"
    assert report["warnings"] == [] and report["verdict"] == "pass"


def test_driver_cell_shows_what_was_asked_unless_the_default():
    failing = failing_result("node-4")  # installed 535.309.01, loaded 535.261.03
    failing["versions"].update(driver_requested="535.309.01", driver_pinned="535.309.01")
    report = fleet_report.build_report(
        document(
            **{
                "node-1": pinned_result("node-1", "535.261.03"),
                "node-2": pinned_result("node-2", "535.261.03", "default"),
                "node-3": passing_result("node-3"),
                "node-4": failing,
            }
        )
    )
    cells = {row[0]: row[2] for row in table_rows(fleet_report.render_markdown(report))[2:]}
    assert cells == {
        "node-1": "535.261.03 (asked: latest)",
        "node-2": "535.261.03",
        "node-3": "535.261.03",
        "node-4": "535.309.01 (loaded 535.261.03) (asked: 535.309.01)",
    }


def test_mixed_pinned_builds_are_a_fleet_warning_not_a_node_failure():
    report = fleet_report.build_report(
        document(
            **{
                "gpufleet-node-2": pinned_result("gpufleet-node-2", "535.309.01"),
                "gpufleet-node-1": pinned_result("gpufleet-node-1", "535.261.03"),
                "gpufleet-node-3": passing_result("gpufleet-node-3"),
            }
        )
    )  # no fact: not a build of its own
    line = "2 driver builds pinned across the fleet: 535.261.03 (gpufleet-node-1), 535.309.01 (gpufleet-node-2)"
    assert report["warnings"] == [line]
    assert report["verdict"] == "pass" and report["summary"]["failed"] == 0
    assert fleet_report.failure_lines(report) == []
    terminal = fleet_report.render_terminal(report).splitlines()
    assert terminal[:3] == ["PASS: 3 nodes: 3 passed, 0 failed, 0 unreachable", f"  warning: {line}", ""]
    markdown = fleet_report.render_markdown(report)
    assert markdown.index("**PASS**") < markdown.index(f"- warning: {line}") < markdown.index("| Node")


def test_mixed_builds_on_a_large_fleet_name_a_few_hosts_per_build():
    hosts = {f"n{i}": pinned_result(f"n{i}", "535.261.03") for i in range(1, 21)}
    hosts["n21"] = pinned_result("n21", "535.309.01")
    [warning] = fleet_report.build_report(document(**hosts))["warnings"]
    assert warning == (
        "2 driver builds pinned across the fleet: 535.261.03 (20 nodes: n1, n2, n3, n4, n5, n6, n7, n8 "
        "and 12 more), 535.309.01 (n21)"
    )


def test_one_pinned_build_and_failures_lead_in_order():
    report = fleet_report.build_report(
        document(**{"node-1": pinned_result("node-1", "535.261.03"), "node-2": failing_result("node-2")})
    )
    assert report["warnings"] == []
    assert fleet_report.lead_lines(report) == ["1 node: reboot required (node-2)"]


# --- the health checks' evidence and the work it asks for (issue 28) -----------------------------


def health_result(tmp_path: Path, host: str, *args: str) -> dict[str, Any]:
    """gpufleet_check.pyz's real document for saved outputs (tests/unit/data/gpu, each with its source) judged
    on a machine without GPUs (gpu_checks/saved_outputs.run_cli), as a node of the fleet would print it."""
    from gpu_checks.saved_outputs import run_cli

    work = tmp_path / host
    work.mkdir()
    proc, _checks = run_cli(work, "--xid-window-hours", "0", *args)
    result = json.loads(proc.stdout)
    result["host"] = host
    return result


def xid_and_remap_doc(tmp_path: Path) -> dict[str, Any]:
    """node-1: the H100 Xid 48 (double-bit ECC) kernel log; node-2: a pending row remap on GPU 0 only (its
    checks warn: it passes); node-3: a driver/library mismatch."""
    from gpu_checks.saved_outputs import DATA

    xid48 = health_result(
        tmp_path,
        "node-1",
        "--kernel-log-file",
        str(DATA / "xid" / "dmesg-iso-h100-xid48-63-94.log"),
        "--skip",
        "torch_cuda",
        "--skip",
        "clocks",
        "--skip",
        "nvlink",
    )
    remap = health_result(
        tmp_path,
        "node-2",
        "--smi-query-file",
        str(DATA / "smi-text" / "h100-8gpu-535.183.01-gpu0-remap-pending.txt"),
        "--skip",
        "torch_cuda",
        "--skip",
        "clocks",
        "--skip",
        "nvlink",
    )
    remap["checks"].append(check("driver_version", "pass", "535.183.01"))  # a node that passes on what it checked
    remap.update(verdict="pass", reasons=[])
    return document(**{"node-1": xid48, "node-2": remap, "node-3": failing_result("node-3")})


def test_findings_and_their_action_classes_are_in_the_node_entry(tmp_path):
    report = fleet_report.build_report(xid_and_remap_doc(tmp_path))
    xid_node, remap_node = node_of(report, "node-1"), node_of(report, "node-2")
    [xid48] = [f for f in xid_node["findings"] if f["check"] == "xid" and f["verdict"] == "fail"]
    assert (xid48["gpu"], xid48["signal"], xid48["action"], xid48["action_class"]) == (
        "PCI:0000:19:00",
        "xid",
        "drain: WORKFLOW_XID_48",
        "drain",
    )
    assert xid48["evidence"].startswith("Xid 48 ROBUST_CHANNEL_GPU_ECC_DBE x1, last 2024-11-15T12:02:03")
    assert xid_node["actions"] == ["drain"] and xid_node["verdict"] == "fail"
    assert remap_node["verdict"] == "pass" and remap_node["actions"] == ["reboot"]
    assert node_of(report, "node-3")["actions"] == [] and node_of(report, "node-3")["findings"] == []
    assert json.loads(json.dumps(report)) == report


def test_lead_names_the_nodes_per_action_class(tmp_path):
    report = fleet_report.build_report(xid_and_remap_doc(tmp_path))
    assert fleet_report.lead_lines(report) == [
        "1 node: failed xid (node-1)",
        "1 node: reboot required (node-3)",
        "1 node to drain and investigate: node-1",
        "1 node to reboot: node-2",
    ]
    assert fleet_report.render_terminal(report).splitlines()[3:5] == [
        "  1 node to drain and investigate: node-1",
        "  1 node to reboot: node-2",
    ]


def test_markdown_shows_each_failed_checks_evidence_by_failure_reason(tmp_path):
    markdown = fleet_report.render_markdown(fleet_report.build_report(xid_and_remap_doc(tmp_path)))
    section = markdown[markdown.index("**Evidence, by failure reason**") :]
    assert markdown.index("| Node") < markdown.index("**Evidence, by failure reason**")
    lines = section.splitlines()
    assert lines[2] == "- 1 node: failed xid (node-1)"
    assert lines[3].startswith("  - node-1: xid, PCI:0000:19:00: Xid 48 ROBUST_CHANNEL_GPU_ECC_DBE x1, last ")
    assert lines[3].endswith("(catalog: WORKFLOW_XID_48) [drain: WORKFLOW_XID_48] → drain and investigate")
    assert "Xid 94" not in section  # watched, not a failure: in the table's reason, not the evidence
    assert lines[4] == "- 1 node: reboot required (node-3)"
    assert lines[5] == "  - node-3: driver_version: loaded module 535.261.03, installed 535.309.01"
    assert lines[6] == "- 1 node passed with findings that ask for work (node-2)"
    assert lines[7] == (
        "  - node-2: gpu_errors, GPU 0 (00000000:53:00.0): row remap pending: takes effect at the next "
        "GPU reset (0 uncorrectable, 0 correctable rows) [reboot] → reboot"
    )


def test_markdown_evidence_of_unreachable_and_many_findings():
    result = failing_result("busy")
    result["checks"].append(
        {
            **check("xid", "fail"),
            "findings": [
                {
                    "gpu": f"PCI:0000:{i:02x}:00",
                    "verdict": "fail",
                    "action": "drain: RESET_GPU",
                    "evidence": f"Xid 119 x{i}",
                    "signal": "xid",
                    "action_class": "reboot",
                }
                for i in range(1, 13)
            ],
        }
    )
    report = fleet_report.build_report(document(busy=result, gone="no answer: ssh: connect to host gone port 22"))
    section = fleet_report.render_markdown(report).split("**Evidence, by failure reason**")[1]
    assert "  - gone: no answer: ssh: connect to host gone port 22" in section
    assert section.count("  - busy: xid, PCI:") == fleet_report.EVIDENCE_MAX_FINDINGS
    assert "  - busy: xid: and 2 more findings (fleet-report.json)" in section
    assert "PCI:0000:01:00: Xid 119 x1 [drain: RESET_GPU] → reboot" in section


def test_a_result_without_findings_or_with_odd_ones_reads_as_none():
    result = passing_result("n")
    result["checks"].append(
        {
            **check("xid", "warn"),
            "findings": [
                "not a finding",
                {"gpu": 3, "verdict": "warn", "action": "x", "evidence": "y", "action_class": "explode"},
            ],
        }
    )
    node = node_of(fleet_report.build_report(document(n=result)), "n")
    assert node["findings"] == [
        {
            "check": "xid",
            "gpu": "3",
            "verdict": "warn",
            "signal": None,
            "action": "x",
            "evidence": "y",
            "action_class": None,
        }
    ]
    assert node["actions"] == []


# --- from the registered runs to the document (the action plugin's input) -------------------------


def registered(result: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """What `register` keeps of gpu_verify's "Run the health checks" (ansible.builtin.command)."""
    run = {
        "rc": 0 if result is None or result["verdict"] == "pass" else 1,
        "changed": False,
        "stdout": json.dumps(result, indent=2) if result is not None else "",
        "stderr": "",
        "stderr_lines": [],
    }
    return {**run, **fields}


def test_collect_document_from_the_runs_and_the_nodes_gone():
    runs = {
        "node-2": registered(
            failing_result("node-2"),
            stderr_lines=["gpufleet_check: metrics not written to /x/gpufleet.prom: no directory /x"],
        ),
        "node-1": registered(passing_result("node-1")),
        "node-3": {"unreachable": True, "msg": "Task failed: Failed to connect to the host via ssh: timed out"},
    }
    doc = fleet_report.collect_document(runs, ["node-4", "node-1"], "inventory/prod", "verify", "2026-12-03T10:00:00Z")
    assert doc["generated"] == "2026-12-03T10:00:00Z" and doc["inventory"] == "inventory/prod"
    assert doc["hosts"]["node-1"]["result"]["verdict"] == "pass"  # a node that ran is not "gone"
    assert doc["hosts"]["node-3"] == {
        "result": None,
        "error": "no answer: Failed to connect to the host via ssh: timed out",
        "unreachable": True,
        "metrics_not_written": [],
    }
    assert doc["hosts"]["node-4"] == {"result": None, "error": fleet_report.GONE_ERROR}
    report = fleet_report.build_report(doc)
    assert [(n["host"], n["verdict"]) for n in report["nodes"]] == [
        ("node-1", "pass"),
        ("node-2", "fail"),
        ("node-3", "unreachable"),
        ("node-4", "unreachable"),
    ]
    assert fleet_report.metrics_not_written(runs) == {
        "node-2": ["gpufleet_check: metrics not written to /x/gpufleet.prom: no directory /x"]
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", fleet_report.collect_document({})["generated"])
    with pytest.raises(fleet_report.InputError):
        fleet_report.collect_document(["node-1"])


def test_the_role_writes_the_report_through_the_action(tmp_path):
    """roles/gpu_verify/tasks/report.yml as the role runs it, in a real ansible-playbook on this machine: each
    node's registered run set as the role's check.yml leaves it, then the action writes the three files."""
    runs = {
        "node-1": registered(passing_result("node-1")),
        "node-2": registered(failing_result("node-2")),
        "node-3": {"unreachable": True, "msg": "Task failed: Failed to connect to the host via ssh"},
    }
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml_hosts(["node-1", "node-2", "node-3"]))
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    playbook = tmp_path / "report.yml"
    playbook.write_text(f"""---
- name: The fleet report of registered runs
  hosts: all
  gather_facts: false
  tasks:
    - name: Leave the run the checks would have left
      ansible.builtin.set_fact:
        __gpu_verify_run: "{{{{ (lookup('ansible.builtin.file', '{tmp_path}/runs.json') | from_json)[inventory_hostname]
          }}}}"
    - name: Write the report as gpu_verify does
      ansible.builtin.include_role:
        name: gpufleet.fleet.gpu_verify
        tasks_from: report
      vars:
        gpu_verify_report_dir: "{tmp_path}/reports"
""")
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_CACHE_PLUGIN": "memory",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "reports" / "fleet-report.json").read_text())
    assert [(n["host"], n["verdict"]) for n in report["nodes"]] == [
        ("node-1", "pass"),
        ("node-2", "fail"),
        ("node-3", "unreachable"),
    ]
    assert report["nodes"][2]["reasons"] == ["no answer: Failed to connect to the host via ssh"]
    assert (tmp_path / "reports" / "fleet-report.md").read_text() == fleet_report.render_markdown(report)
    assert ET.parse(tmp_path / "reports" / "fleet-report.xml").getroot().get("name") == "gpufleet-verify"
    assert "FAIL: 3 nodes: 1 passed, 1 failed, 1 unreachable" in proc.stdout
    assert "changed=0" in proc.stdout and "changed=1" not in proc.stdout


def yaml_hosts(hosts: list[str]) -> str:
    return "all:\n  hosts:\n" + "".join(f"    {host}:\n      ansible_connection: local\n" for host in hosts)
