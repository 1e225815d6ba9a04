"""The fleet report remembers and compares (issue 29), on the provisioned lab.

A repeat offender, for real: three runs of playbooks/verify.yml into one report directory (one history), the
first node with the driver/library mismatch the monitoring tests forge (the lab's fixture of the loaded
module's version, /sys/module/nvidia/version on a real node) in the first and the third: the third report
names it a repeat offender (2 of its last 3 runs) with both runs' reasons, its gpufleet_repeat_offender is 1
in Prometheus and GpufleetLemonNode fires for it and for no other node; a run into a fresh history resolves it.

An outlier, half real: the lab has no GPU, so no node measures a GEMM figure. The nodes' check documents are
the real ones a verify.yml run on the lab leaves in the report; in each, the GPU list and the gemm check (a
"skipped, no GPU" there) are replaced with what gpufleet_check's own judge_gemm makes of one NVIDIA H200 at
801 TFLOP/s (this project's H200, measured: docs/gpu.md, "Measured on a GPU"), the last node's figure edited to
700 (above its floor, 0.85 x 794.5 = 675.3, and 12.6 % below the others' 801). The report's command
(files/gpufleet_report.py, with plugins/module_utils/fleet_report.py, the code the play's action runs) must name
that node an outlier while every node passes. Runs after test_site.py (the stack is installed); about 5 verify runs in
all."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

from conftest import LAB_INVENTORY, REPO, podman, run_playbook
from test_site_monitoring import (  # noqa: F401  (head: a fixture)  # pylint: disable=unused-import
    MODULE_FIXTURE,
    by_node,
    eventually,
    firing,
    head,
)

PAYLOAD_DIR = REPO / "roles" / "payload" / "files"
if str(PAYLOAD_DIR) not in sys.path:
    sys.path.insert(0, str(PAYLOAD_DIR))

from gpufleet_check import checks as gpu_checks  # noqa: E402  (after the sys.path entry)
from gpufleet_check.common import check_result  # noqa: E402

LEMON_ALERT = "GpufleetLemonNode"
H200 = "NVIDIA H200"
MEASURED_TFLOPS = 801.0  # docs/gpu.md: GEMM 8192³ bf16 on this project's H200
SLOW_TFLOPS = 700.0


def verify(tmp_path, reports):
    return run_playbook(
        tmp_path, "playbooks/verify.yml", LAB_INVENTORY, extravars={"gpu_verify_report_dir": str(reports)}
    )


def read_report(reports) -> dict:
    return json.loads((reports / "fleet-report.json").read_text())


def set_module_version(node: str, text: str | None) -> None:
    """The lab's fixture of the loaded module's version: ``text``, or removed (None: as the install left it)."""
    if text is None:
        podman("exec", node, "rm", "-f", MODULE_FIXTURE)
    else:
        podman("exec", node, "sh", "-c", f'printf %s "$1" > {MODULE_FIXTURE}', "sh", text)


def test_a_node_failing_2_of_its_last_3_runs_is_a_repeat_offender(tmp_path, head, lab_hosts):  # noqa: F811
    node = lab_hosts[0]
    reports = tmp_path / "verify"  # one directory for the three runs: one history
    saved = podman("exec", node, "cat", MODULE_FIXTURE, check=False)
    original = saved.stdout if saved.returncode == 0 else None
    try:
        for fault in (True, False, True):
            set_module_version(node, "535.1.0\n" if fault else original)
            run = verify(tmp_path, reports)
            if fault:
                assert run.status == "failed" and set(run.failures()) == {node}, run.failures()
            else:
                assert run.status == "successful", run.failures()

        report = read_report(reports)
        history = [json.loads(line) for line in (reports / "history" / "fleet-history.jsonl").read_text().splitlines()]
        assert [run["nodes"][node]["verdict"] for run in history] == ["fail", "pass", "fail"]
        [entry] = report["repeat_offenders"]
        assert (entry["host"], entry["failed_runs"], entry["runs"], entry["window"]) == (node, 2, 3, 3), entry
        assert [run["generated"] for run in entry["failures"]] == [history[0]["generated"], history[2]["generated"]]
        for failing in entry["failures"]:
            assert any(
                item["check"] == "driver_version" and "535.1.0" in item["reason"] for item in failing["failed"]
            ), failing
        nodes = {n["host"]: n for n in report["nodes"]}
        assert nodes[node]["recent_runs"] == {"failed": 2, "runs": 3, "window": 3}
        for other in set(lab_hosts) - {node}:
            assert nodes[other]["recent_runs"] == {"failed": 0, "runs": 3, "window": 3}, nodes[other]
        markdown = (reports / "fleet-report.md").read_text()
        assert f"- 1 repeat offender: {node}" in markdown and f"- {node}: failed 2 of its last 3 runs → " in markdown

        offenders = eventually(
            lambda: by_node(head, "gpufleet_repeat_offender"),
            lambda got: {n: s["value"] for n, s in got.items()} == {h: (1.0 if h == node else 0.0) for h in lab_hosts},
            f"gpufleet_repeat_offender 1 for {node} only",
        )
        assert offenders[node]["labels"]["window"] == "3" and offenders[node]["labels"]["threshold"] == "2"
        assert by_node(head, "gpufleet_repeat_failures")[node]["value"] == 2.0
        alerts = eventually(
            lambda: firing(head), lambda got: node in got.get(LEMON_ALERT, set()), f"{LEMON_ALERT} firing for {node}"
        )
        assert alerts[LEMON_ALERT] == {node}, alerts
    finally:
        set_module_version(node, original)
        restored = verify(tmp_path, tmp_path / "verify-fresh-history")
        assert restored.status == "successful", restored.failures()
        eventually(lambda: firing(head), lambda got: not got.get(LEMON_ALERT), f"{LEMON_ALERT} resolved")


def with_h200_gemm(result: dict, tflops: float) -> dict:
    """A lab node's real check document with one H200 and a gemm check judged by gpufleet_check (see the docstring)."""
    result = copy.deepcopy(result)
    judged = gpu_checks.judge_gemm(H200, tflops, 0.85)
    result["gpus"] = [{"index": 0, "name": H200, "gemm_tflops": tflops}]
    gemm = check_result(
        "gemm",
        judged["verdict"],
        f"n=8192 bfloat16; GPU 0 {judged['detail']}",
        value=tflops,
        unit="TFLOP/s",
        threshold=judged["threshold"],
        per_gpu=[{"index": 0, "name": H200, "dtype": "bfloat16", "tflops": tflops, "finite": True, **judged}],
    )
    result["checks"] = [gemm if check["name"] == "gemm" else check for check in result["checks"]]
    return result


def test_a_slow_node_that_passes_its_floors_is_an_outlier(tmp_path, lab_hosts):
    reports = tmp_path / "verify"
    run = verify(tmp_path, reports)
    assert run.status == "successful", run.failures()
    real = {n["host"]: n["result"] for n in read_report(reports)["nodes"]}
    assert all(next(c for c in r["checks"] if c["name"] == "gemm")["verdict"] == "skipped" for r in real.values())

    slow = lab_hosts[-1]
    hosts = {
        host: {"result": with_h200_gemm(result, SLOW_TFLOPS if host == slow else MEASURED_TFLOPS), "error": None}
        for host, result in real.items()
    }
    # The rule judges a model with 3 nodes or more and the lab has 2 GPU nodes: a third peer is the first node's real
    # document again, under a name of its own (test data, as the edited figure is).
    first = lab_hosts[0]
    peer = f"{first}-peer"
    hosts[peer] = {"result": {**copy.deepcopy(hosts[first]["result"]), "host": peer}, "error": None}
    peers = len(hosts)
    assert all(
        h["result"]["checks"][[c["name"] for c in h["result"]["checks"]].index("gemm")]["verdict"] == "pass"
        for h in hosts.values()
    ), "every figure passes its floor"
    doc = {
        "generated": read_report(reports)["generated"],
        "inventory": str(LAB_INVENTORY),
        "playbook": "verify",
        "hosts": hosts,
    }
    out = tmp_path / "outliers"
    proc = subprocess.run(
        [sys.executable, str(REPO / "files" / "gpufleet_report.py"), "--out-dir", str(out)],
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr

    report = read_report(out)
    assert report["verdict"] == "pass" and report["summary"]["passed"] == peers
    [entry] = report["outliers"]
    assert (entry["host"], entry["figure"], entry["value"], entry["median"], entry["model"], entry["nodes"]) == (
        slow,
        "gemm_tflops",
        SLOW_TFLOPS,
        MEASURED_TFLOPS,
        H200,
        peers,
    ), entry
    assert entry["action_class"] == "drain"
    line = (
        f"{slow}: GEMM of the slowest GPU 700.0 TFLOP/s, 12.6% below the median 801.0 of {peers} {H200} "
        "nodes → drain and investigate"
    )
    assert line in (out / "fleet-report.md").read_text()
    assert line in proc.stdout  # what gpufleet_verify.py prints: the report's terminal text


def test_history_metrics_that_cannot_be_written_are_named_and_fail_no_node(tmp_path, lab_hosts):
    """A textfile directory that does not exist: every node's checks and history metrics are said not written, the
    run passes, and no task's error is ignored (the copy's error is read from its result)."""
    target = "/nonexistent-gpufleet-textfile-dir/gpufleet.prom"
    run = run_playbook(
        tmp_path,
        "playbooks/verify.yml",
        LAB_INVENTORY,
        extravars={"gpu_verify_report_dir": str(tmp_path / "verify"), "gpu_verify_metrics_file": target},
    )
    assert run.status == "successful", run.failures()
    assert not run.hosts("ignored"), run.stats
    said = run.results("Report history metrics that could not be written")
    assert set(said) == set(lab_hosts), said
    for result in said.values():
        assert result["msg"].startswith("history metrics not written to /nonexistent-gpufleet-textfile-dir/"), result
        assert "the monitoring role creates monitoring_textfile_dir" in result["msg"]
