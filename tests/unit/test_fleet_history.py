"""plugins/module_utils/fleet_report.py, issue 29: the history kept beside the report (its bounds, order, atomic
rewrite, a corrupt or foreign file set aside), the repeat-offender rule (k of the last n runs), the outlier rule
(a figure against its GPU model's fleet median) and their sections in the JSON, Markdown, terminal and JUnit
reports.

The node results are test_fleet_report.py's (passing_result, failing_result: the documents its tests use) and
gpufleet_check's own judgement of saved real outputs (tests/unit/data/gpu, each with its source), edited where
a test says in the one figure or verdict it is about."""

from __future__ import annotations

import copy
import json
import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from test_fleet_report import MISMATCH, check, document, failing_result, passing_result, xid_and_remap_doc

from ansible_collections.gpufleet.fleet.plugins.module_utils import fleet_report

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def with_gemm(result: dict[str, Any], tflops: float) -> dict[str, Any]:
    """The result with its gemm check's measured value (the slowest GPU's TFLOP/s) edited: the one field."""
    result = copy.deepcopy(result)
    for entry in result["checks"]:
        if entry["name"] == "gemm":
            entry["value"] = tflops
    return result


def row(host: str, model: str | None, **figures: float) -> dict[str, Any]:
    return {
        "host": host,
        "model": model,
        "figures": {
            name: {"value": value, "unit": "TFLOP/s", "label": name, "basis": ""} for name, value in figures.items()
        },
    }


def flagged(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(entry["host"], entry["figure"]) for entry in result["outliers"]]


# --- the outlier rule, directly ---------------------------------------------------------------------

OUTLIER_CASES = [
    # (rows, outliers, not judged (figure, model, nodes, why))
    pytest.param(
        [row("a", H100, g=100), row("b", H100, g=99), row("c", H100, g=80)],
        [("c", "g")],
        [],
        id="one slow node of three",
    ),
    pytest.param([row("a", H100, g=100), row("b", H100, g=100), row("c", H100, g=100)], [], [], id="ties: no outlier"),
    pytest.param(
        [row("a", H100, g=100), row("b", H100, g=100), row("c", H100, g=90.0)],
        [],
        [],
        id="at the floor (median x 0.9) is not below it",
    ),
    pytest.param(
        [row("a", H100, g=100), row("b", H100, g=100), row("c", H100, g=89.99)],
        [("c", "g")],
        [],
        id="just below the floor",
    ),
    pytest.param(
        [row("a", H100, g=100), row("b", H100, g=100), row("c", H100, g=60), row("d", H100, g=60)],
        [("c", "g"), ("d", "g")],
        [],
        id="even count: the median between the middle two (80)",
    ),
    pytest.param(
        [
            row("a", H100, g=100),
            row("b", H100, g=100),
            row("c", H100, g=70),
            row("x", A100, g=70),
            row("y", A100, g=40),
        ],
        [("c", "g")],
        [("g", A100, 2, "fewer than 3 nodes of this model")],
        id="mixed models: each against its own",
    ),
    pytest.param(
        [row("a", H100, g=100), row("b", H100, g=100), row("c", H100)],
        [],
        [("g", H100, 2, "fewer than 3 nodes of this model")],
        id="a missing figure is not a peer",
    ),
    pytest.param(
        [row("a", H100, g=100), row("b", H100, g=50)],
        [],
        [("g", H100, 2, "fewer than 3 nodes of this model")],
        id="too few peers: not judged",
    ),
    pytest.param(
        [
            row("a", H100, g=100),
            row("b", H100, g=100),
            row("c", H100, g=100),
            row("m", f"mixed: 1× {A100}, 7× {H100}", g=10),
            row("u", None, g=10),
        ],
        [],
        [
            ("g", None, 1, "the GPU model is not named"),
            ("g", f"mixed: 1× {A100}, 7× {H100}", 1, "the node mixes GPU models"),
        ],
        id="mixed or unnamed model: not judged",
    ),
    pytest.param(
        [row("a", H100, g=100, b=10), row("b", H100, g=100, b=10), row("c", H100, g=100, b=5)],
        [("c", "b")],
        [],
        id="each figure on its own",
    ),
]


@pytest.mark.parametrize(("rows", "expected", "unjudged"), OUTLIER_CASES)
def test_outlier_rule(rows, expected, unjudged):
    result = fleet_report.outliers(rows, 0.1)
    assert flagged(result) == expected
    assert [(e["figure"], e["model"], e["nodes"], e["why"]) for e in result["not_judged"]] == unjudged


def test_an_outlier_names_the_figure_the_median_the_model_and_the_peers():
    [entry] = fleet_report.outliers([row("a", H100, g=100), row("b", H100, g=98), row("c", H100, g=85)], 0.1)[
        "outliers"
    ]
    assert entry == {
        "host": "c",
        "figure": "g",
        "label": "g",
        "value": 85,
        "unit": "TFLOP/s",
        "median": 98,
        "model": H100,
        "basis": "",
        "nodes": 3,
        "below": 0.1327,
        "action_class": "drain",
        "action": "drain and investigate",
    }
    assert fleet_report.outlier_line(entry) == (
        f"c: g 85.0 TFLOP/s, 13.3% below the median 98.0 of 3 {H100} nodes → drain and investigate"
    )


def test_the_fraction_is_a_setting_and_a_wrong_one_is_named():
    rows = [row("a", H100, g=100), row("b", H100, g=100), row("c", H100, g=85)]
    assert flagged(fleet_report.outliers(rows, 0.2)) == []
    assert flagged(fleet_report.outliers(rows, 0.1)) == [("c", "g")]
    for wrong in (0, 1, -0.1, 1.5, "0.1", True):
        with pytest.raises(fleet_report.InputError, match="gpu_verify_outlier_fraction"):
            fleet_report.outliers(rows, wrong)


def test_the_all_reduce_is_compared_only_at_the_same_gpu_count_and_size():
    """The basis of a figure: two nodes' bus bandwidths at other world sizes or message sizes are not peers."""

    def busbw(host: str, value: float, world: int, mib: int) -> dict[str, Any]:
        result = passing_result(host)
        result["checks"][5].update(value=value, world_size=world, size_mib=mib)
        return result

    doc = document(
        a=busbw("a", 360, 8, 256),
        b=busbw("b", 362, 8, 256),
        c=busbw("c", 300, 8, 256),
        d=busbw("d", 150, 4, 256),
        e=busbw("e", 100, 8, 64),
    )
    report = fleet_report.build_report(doc)
    assert [(e["host"], e["figure"], e["basis"]) for e in report["outliers"]] == [
        ("c", "allreduce_busbw_gbps", "8 GPUs, 256 MiB")
    ]
    not_judged = {(e["figure"], e["basis"]) for e in report["outlier_rule"]["not_judged"]}
    assert {("allreduce_busbw_gbps", "4 GPUs, 256 MiB"), ("allreduce_busbw_gbps", "8 GPUs, 64 MiB")} <= not_judged


def with_memory_bandwidth(result: dict[str, Any], device: float, host: float, mib: int = 1024) -> dict[str, Any]:
    """The result with the memory_bandwidth check gpufleet_check writes on an 8 x H100 node that passed: the
    slowest GPU's device copy (its value) and the slowest host copy of any GPU, at mib MiB."""
    result = copy.deepcopy(result)
    result["checks"].insert(
        5,
        {
            **check(
                "memory_bandwidth", value=device, unit="GB/s", threshold=1905.0, detail="1024 MiB copies; GPU 0 ..."
            ),
            "h2d_gbps": 55.0,
            "d2h_gbps": 53.0,
            "host_copy_min_gbps": host,
            "size_mib": mib,
            "profile": "H100 80GB HBM3",
        },
    )
    return result


def test_memory_bandwidth_and_host_copies_are_compared_across_the_fleet():
    """node-3's device memory (2500 GB/s, above DCGM's 1905) is 15% below its peers'; node-4's slowest host copy
    (48.5 GB/s, above Azure's 48) 10% below; node-5's quick run (256 MiB) is not their peer."""
    hosts = {
        "node-1": with_memory_bandwidth(passing_result("node-1"), 2950.0, 54.0),
        "node-2": with_memory_bandwidth(passing_result("node-2"), 2940.0, 54.5),
        "node-3": with_memory_bandwidth(passing_result("node-3"), 2500.0, 54.2),
        "node-4": with_memory_bandwidth(passing_result("node-4"), 2945.0, 48.5),
        "node-5": with_memory_bandwidth(passing_result("node-5"), 1000.0, 10.0, mib=256),
    }
    report = fleet_report.build_report(document(**hosts))
    assert [(e["host"], e["figure"], e["value"], e["median"], e["basis"]) for e in report["outliers"]] == [
        ("node-3", "memory_bandwidth_gbps", 2500.0, 2942.5, "1024 MiB"),
        ("node-4", "host_copy_gbps", 48.5, 54.1, "1024 MiB"),
    ]
    assert fleet_report.outlier_line(report["outliers"][0]) == (
        f"node-3: device memory bandwidth of the slowest GPU 2500.0 GB/s, 15.0% below the median 2942.5 of 4 {H100} "
        "nodes (1024 MiB) → drain and investigate"
    )
    assert fleet_report.outlier_line(report["outliers"][1]).startswith(
        "node-4: slowest host<->device copy 48.5 GB/s, 10.3% below the median 54.1"
    )
    not_judged = {(e["figure"], e["basis"], e["why"]) for e in report["outlier_rule"]["not_judged"]}
    assert {
        ("memory_bandwidth_gbps", "256 MiB", "fewer than 3 nodes of this model"),
        ("host_copy_gbps", "256 MiB", "fewer than 3 nodes of this model"),
    } <= not_judged
    assert fleet_report.node_figures(hosts["node-1"])["host_copy_gbps"] == {
        "value": 54.0,
        "unit": "GB/s",
        "label": "slowest host<->device copy",
        "basis": "1024 MiB",
    }
    failed = with_memory_bandwidth(passing_result("node-6"), 1500.0, 54.0)
    failed["checks"][5]["verdict"] = "fail"  # below its floor: a failure already, not a figure
    assert not fleet_report.node_figures(failed).keys() & {"memory_bandwidth_gbps", "host_copy_gbps"}


# --- outliers in the report -------------------------------------------------------------------------


def slow_fleet() -> dict[str, Any]:
    """Four healthy H100 nodes; node-3's slowest GPU edited to 600 TFLOP/s: above its floor (494.5), 13.6% below
    the others' 694.3."""
    hosts = {f"node-{i}": passing_result(f"node-{i}") for i in (1, 2, 4)}
    hosts["node-3"] = with_gemm(passing_result("node-3"), 600.0)
    return document(**hosts)


def test_a_slow_node_that_passes_its_floors_is_an_outlier_in_every_report(tmp_path):
    report, paths = fleet_report.write_run_report(slow_fleet(), tmp_path, history_keep=0)
    assert report["verdict"] == "pass" and report["summary"]["passed"] == 4  # a warning, not a failure
    [entry] = report["outliers"]
    assert (entry["host"], entry["figure"], entry["value"], entry["median"], entry["model"], entry["nodes"]) == (
        "node-3",
        "gemm_tflops",
        600.0,
        694.3,
        H100,
        4,
    )
    assert entry["action_class"] == "drain"
    assert report["outlier_rule"] == {"fraction": 0.1, "min_nodes": 3, "not_judged": []}
    written = json.loads((tmp_path / "fleet-report.json").read_text())
    assert written["outliers"] == report["outliers"]
    line = (
        f"node-3: GEMM of the slowest GPU 600.0 TFLOP/s, 13.6% below the median 694.3 of 4 {H100} nodes → drain and "
        "investigate"
    )
    markdown = (tmp_path / "fleet-report.md").read_text()
    assert "- 1 node below its model's median: node-3" in markdown
    assert f"**Outliers (more than 10% below the median of their GPU model)**\n\n- {line}\n" in markdown
    terminal = fleet_report.render_terminal(report)
    assert "  1 node below its model's median: node-3" in terminal and f"\n  {line}\n" in terminal
    suite = ET.parse(tmp_path / "fleet-report.xml").getroot()
    assert (suite.get("failures"), suite.get("tests")) == ("0", "28")


def test_a_failed_figure_is_neither_judged_nor_a_peer():
    hosts = {f"node-{i}": passing_result(f"node-{i}") for i in (1, 2)}
    hosts["node-3"] = with_gemm(passing_result("node-3"), 600.0)
    failed = with_gemm(passing_result("node-4"), 300.0)
    failed["checks"][4]["verdict"], failed["verdict"] = "fail", "fail"
    report = fleet_report.build_report(document(**hosts, **{"node-4": failed}))
    assert "gemm_tflops" not in fleet_report.node_figures(failed)
    assert [(e["host"], e["median"], e["nodes"]) for e in report["outliers"]] == [("node-3", 694.3, 3)]


def test_figures_from_outside_the_checks_are_judged_the_same_way():
    """The smoke training's per-node throughput, when it is given: extra_figures per host."""
    extra = {
        f"node-{i}": {
            "smoke_samples_per_s": {"value": value, "unit": "samples/s", "label": "smoke training", "basis": "world 12"}
        }
        for i, value in ((1, 5100.0), (2, 5000.0), (3, 5050.0), (4, 3900.0))
    }
    report = fleet_report.build_report(slow_fleet(), extra_figures=extra)
    assert [(e["host"], e["figure"]) for e in report["outliers"]] == [
        ("node-3", "gemm_tflops"),
        ("node-4", "smoke_samples_per_s"),
    ]
    assert fleet_report.node_figures(passing_result()).keys() == {"gemm_tflops", "allreduce_busbw_gbps"}


def test_a_small_fleet_says_it_was_not_judged():
    report = fleet_report.build_report(
        document(**{"node-1": passing_result("node-1"), "node-2": with_gemm(passing_result("node-2"), 500.0)})
    )
    assert report["outliers"] == []
    markdown = fleet_report.render_markdown(report)
    assert (
        f"- GEMM of the slowest GPU on {H100}: not judged, fewer than 3 nodes of this model (2: node-1, node-2)"
        in markdown
    )
    assert "Outliers" not in fleet_report.render_terminal(report)


# --- the history ------------------------------------------------------------------------------------


def history_lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "history" / "fleet-history.jsonl").read_text().splitlines()]


def stamp(i: int) -> str:
    return f"2026-12-0{1 + i // 24}T{i % 24:02d}:00:00Z"


def test_history_keeps_the_last_n_runs_in_order(tmp_path):
    for i in range(5):
        doc = document(**{"node-1": passing_result("node-1")})
        doc["generated"] = stamp(i)
        fleet_report.write_run_report(doc, tmp_path, history_keep=3)
    runs = history_lines(tmp_path)
    assert [run["generated"] for run in runs] == [stamp(2), stamp(3), stamp(4)]
    assert runs[-1] == {
        "schema": "gpufleet-fleet-history/1",
        "generated": stamp(4),
        "playbook": "verify",
        "inventory": "tests/lab/inventory",
        "nodes": {
            "node-1": {
                "verdict": "pass",
                "reasons": [],
                "failed": [],
                "model": H100,
                "figures": {"gemm_tflops": 694.3, "allreduce_busbw_gbps": 362.75},
            }
        },
    }
    mode = (tmp_path / "history" / "fleet-history.jsonl").stat().st_mode
    assert stat.S_IMODE(mode) == 0o644
    assert sorted(p.name for p in (tmp_path / "history").iterdir()) == [
        ".lock",
        "fleet-history.jsonl",
    ]  # no temporary left


def test_a_failed_run_is_kept_with_its_checks_reasons_and_action_classes(tmp_path):
    (tmp_path / "docs").mkdir()
    report, _paths = fleet_report.write_run_report(xid_and_remap_doc(tmp_path / "docs"), tmp_path / "out")
    nodes = history_lines(tmp_path / "out")[0]["nodes"]
    [xid] = nodes["node-1"]["failed"]
    assert (xid["check"], xid["action_class"]) == ("xid", "drain")
    assert xid["reason"].startswith("Xid 48 ROBUST_CHANNEL_GPU_ECC_DBE x1")
    assert nodes["node-3"]["failed"] == [
        {
            "check": "driver_version",
            "action_class": "reboot",
            "reason": "loaded module 535.261.03, installed 535.309.01",
        }
    ]
    assert nodes["node-3"]["reasons"] == [MISMATCH]
    assert nodes["node-2"]["verdict"] == "pass" and nodes["node-2"]["failed"] == []


def test_history_is_rewritten_atomically(tmp_path, monkeypatch):
    """A rewrite that fails midway leaves the old history whole; the report is written all the same and says so."""
    doc = document(**{"node-1": passing_result("node-1")})
    fleet_report.write_run_report(doc, tmp_path)
    before = (tmp_path / "history" / "fleet-history.jsonl").read_bytes()
    real_replace = os.replace

    def failing_replace(source, target):
        if str(target).endswith("fleet-history.jsonl"):
            raise OSError(28, "No space left on device")
        return real_replace(source, target)

    monkeypatch.setattr(fleet_report.os, "replace", failing_replace)
    report, paths = fleet_report.write_run_report(doc, tmp_path)
    assert (tmp_path / "history" / "fleet-history.jsonl").read_bytes() == before
    assert [p.name for p in (tmp_path / "history").iterdir() if p.name.endswith(".tmp")] == []
    assert report["warnings"] == [
        f"the history in {tmp_path / 'history'} was not kept this run: [Errno 28] No space left on device"
    ]
    assert report["history"]["runs_kept"] == 0 and report["repeat_offenders"] == []
    assert json.loads(paths[0].read_text())["warnings"] == report["warnings"]


@pytest.mark.parametrize(
    ("content", "problem", "kept"),
    [
        pytest.param(b"", None, 0, id="empty"),
        pytest.param(
            b'{"schema": "gpufleet-fleet-report/1", "nodes": []}\n',
            "line 1 is not a gpufleet-fleet-history/1 run",
            0,
            id="foreign JSON",
        ),
        pytest.param(b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text", 0, id="binary"),
        pytest.param(None, "line 2 is not JSON", 1, id="a torn line among good ones"),
    ],
)
def test_a_corrupt_or_foreign_history_is_set_aside_and_said(tmp_path, content, problem, kept):
    history = tmp_path / "history"
    history.mkdir()
    path = history / "fleet-history.jsonl"
    if content is None:  # a good run, then half a line (a disk that filled up under another writer)
        fleet_report.write_run_report(document(**{"node-1": failing_result("node-1")}), tmp_path)
        good = path.read_text()
        content = (good + good[:40]).encode()
    path.write_bytes(content)
    when = fleet_report.datetime(2026, 12, 3, 12, 0, tzinfo=fleet_report.timezone.utc)
    report = fleet_report.build_report(document(**{"node-1": failing_result("node-1")}))
    outcome = fleet_report.record_history(report, history, 20, now=when)
    if problem is None:
        assert outcome["warnings"] == [] and len(outcome["runs"]) == 1
        return
    aside = history / "fleet-history.jsonl.set-aside-20261203T120000Z"
    assert aside.read_bytes() == content  # kept as it was, never lost
    assert outcome["warnings"] == [
        f"the history {path} is not a gpufleet-fleet-history/1 file ({problem}): set aside as "
        f"{aside.name}, its {kept} readable run(s) kept"
    ]
    assert len(history_lines(tmp_path)) == kept + 1
    fleet_report.apply_history(report, outcome)
    assert outcome["warnings"][0] in report["warnings"]
    assert f"- warning: {outcome['warnings'][0]}" in fleet_report.render_markdown(report)


def test_a_history_that_cannot_be_written_leaves_the_report(tmp_path):
    (tmp_path / "history").write_text("a file where the directory should be")
    report, paths = fleet_report.write_run_report(document(**{"node-1": passing_result("node-1")}), tmp_path)
    assert len(paths) == 3 and report["verdict"] == "pass"
    assert report["warnings"][0].startswith(f"the history in {tmp_path / 'history'} was not kept this run: ")


def test_no_history_when_keep_is_0(tmp_path):
    report, _paths = fleet_report.write_run_report(
        document(**{"node-1": passing_result("node-1")}), tmp_path, history_keep=0
    )
    assert not (tmp_path / "history").exists()
    assert report["history"] is None and report["repeat_offenders"] == []
    assert fleet_report.history_metrics(report) == {}


@pytest.mark.parametrize(
    ("keep", "failures", "runs", "message"),
    [
        (20, 4, 3, "gpu_verify_repeat_failures 4 is more than gpu_verify_repeat_runs 3"),
        (2, 2, 3, "gpu_verify_history_keep 2 keeps fewer runs than gpu_verify_repeat_runs 3 looks at: keep at least 3"),
        (20, 0, 3, "gpu_verify_repeat_failures 0 is not a whole number of runs (1 or more)"),
        (-1, 2, 3, "gpu_verify_history_keep -1 is not a whole number of runs (0 or more)"),
        (20, 2, 2.5, "gpu_verify_repeat_runs 2.5 is not a whole number of runs"),
    ],
)
def test_wrong_history_settings_are_named_before_anything_is_written(tmp_path, keep, failures, runs, message):
    with pytest.raises(fleet_report.InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fleet_report.write_run_report(
            document(**{"node-1": passing_result("node-1")}), tmp_path, "fleet-report", keep, failures, runs
        )
    assert list(tmp_path.iterdir()) == []


# --- the k-of-n rule ----------------------------------------------------------------------------------


def runs_of(*verdicts: str, host: str = "node-2") -> list[dict[str, Any]]:
    """History runs from the report of each verdict: "F" the driver/library mismatch, "P" a pass, "U" unreachable,
    "-" a run without the node (a --limit run of another one)."""
    out = []
    for i, verdict in enumerate(verdicts):
        if verdict == "-":
            hosts = {"node-1": passing_result("node-1")}
        else:
            entry = {"F": failing_result(host), "P": passing_result(host), "U": "no answer: ssh: timed out"}[verdict]
            hosts = {"node-1": passing_result("node-1"), host: entry}
        doc = document(**hosts)
        doc["generated"] = stamp(i)
        out.append(fleet_report.history_record(fleet_report.build_report(doc)))
    return out


@pytest.mark.parametrize(
    ("verdicts", "offender", "failed_runs"),
    [
        pytest.param("FPF", True, 2, id="2 of the last 3"),
        pytest.param("FFF", True, 3, id="3 of 3"),
        pytest.param("FPPF", False, 1, id="the oldest failure out of the window"),
        pytest.param("FF", True, 2, id="2 of only 2 runs so far"),
        pytest.param("F", False, 1, id="a one-off"),
        pytest.param("PFP", False, 1, id="one failure between passes"),
        pytest.param("UPU", True, 2, id="unreachable counts as not passing"),
        pytest.param("F-P-F", True, 2, id="runs without the node do not count"),
    ],
)
def test_repeat_offender_rule(verdicts, offender, failed_runs):
    runs = runs_of(*verdicts)
    found = {e["host"]: e for e in fleet_report.repeat_offenders(runs, 2, 3)}
    assert ("node-2" in found) == offender
    assert "node-1" not in found
    if offender:
        entry = found["node-2"]
        assert (entry["failed_runs"], entry["runs"], entry["window"], entry["threshold"]) == (
            failed_runs,
            min(3, len(verdicts.replace("-", ""))),
            3,
            2,
        )
        assert len(entry["failures"]) == failed_runs


def test_a_repeat_offender_carries_each_failing_runs_reasons_and_the_work():
    [entry] = fleet_report.repeat_offenders(runs_of("F", "P", "F"))
    assert [run["generated"] for run in entry["failures"]] == [stamp(0), stamp(2)]
    assert entry["failures"][0]["reasons"] == [MISMATCH]
    assert entry["failures"][0]["failed"] == [
        {
            "check": "driver_version",
            "action_class": "reboot",
            "reason": "loaded module 535.261.03, installed 535.309.01",
        }
    ]
    assert (entry["action_class"], entry["action"]) == ("drain", "investigate (drain and investigate)")


def test_a_repeat_offender_whose_gpu_asks_to_be_replaced_is_to_be_replaced():
    """gpufleet_check's own judgement of a real nvidia-smi -q -x with a row remapping failure (A10G, its source in
    tests/unit/data/gpu/smi-xml/a10g-515.105.01-remap-failure.xml.source) as the node's failed gpu_errors check."""
    from gpu_checks.saved_outputs import health, smi

    found = health.judge_gpu_errors(smi("a10g-515.105.01-remap-failure.xml"))
    result = passing_result("node-2")
    result.update(verdict="fail", reasons=["gpu_errors: row remapping failure"])
    result["checks"].append({**check("gpu_errors", "fail", len(found), "findings"), "findings": found})
    runs = []
    for i, entry in enumerate((result, passing_result("node-2"), result)):
        doc = document(**{"node-2": entry})
        doc["generated"] = stamp(i)
        runs.append(fleet_report.history_record(fleet_report.build_report(doc)))
    assert runs[0]["nodes"]["node-2"]["failed"][0]["action_class"] == "replace"
    [offender] = fleet_report.repeat_offenders(runs)
    assert (offender["action_class"], offender["action"]) == ("replace", "replace the GPU")


def test_repeat_offenders_in_the_reports_and_the_metrics(tmp_path):
    """Three runs into one report directory: node-2 fails, passes, fails; the third run's report names it."""
    reports = []
    for i, entry in enumerate((failing_result("node-2"), passing_result("node-2"), failing_result("node-2"))):
        doc = document(**{"node-1": passing_result("node-1"), "node-2": entry})
        doc["generated"] = stamp(i)
        reports.append(fleet_report.write_run_report(doc, tmp_path)[0])
    assert [r["repeat_offenders"] for r in reports[:2]] == [[], []]
    report = reports[2]
    [entry] = report["repeat_offenders"]
    assert (entry["host"], entry["failed_runs"], entry["runs"]) == ("node-2", 2, 3)
    assert report["history"] == {
        "file": str(tmp_path / "history" / "fleet-history.jsonl"),
        "keep": 20,
        "runs_kept": 3,
        "rule": {"failures": 2, "runs": 3},
        "warnings": [],
    }
    nodes = {node["host"]: node for node in report["nodes"]}
    assert nodes["node-2"]["recent_runs"] == {"failed": 2, "runs": 3, "window": 3}
    assert nodes["node-1"]["recent_runs"] == {"failed": 0, "runs": 3, "window": 3}
    assert json.loads((tmp_path / "fleet-report.json").read_text())["repeat_offenders"] == report["repeat_offenders"]

    reason = "driver_version: loaded module 535.261.03, installed 535.309.01 (reboot)"
    markdown = (tmp_path / "fleet-report.md").read_text()
    assert "- 1 repeat offender: node-2" in markdown
    assert (
        "**Repeat offenders (failed in 2 or more of their last 3 runs, history: 3 runs)**\n\n"
        "- node-2: failed 2 of its last 3 runs → investigate (drain and investigate)\n"
        f"  - {stamp(0)} FAIL: {reason}\n"
        f"  - {stamp(2)} FAIL: {reason}\n"
    ) in markdown
    terminal = fleet_report.render_terminal(report).splitlines()
    assert "  1 repeat offender: node-2" in terminal
    start = terminal.index("Repeat offenders (failed in 2 or more of their last 3 runs, history: 3 runs):")
    assert terminal[start + 1 : start + 4] == [
        "  node-2: failed 2 of its last 3 runs → investigate (drain and investigate)",
        f"    {stamp(0)} FAIL: {reason}",
        f"    {stamp(2)} FAIL: {reason}",
    ]
    suite = ET.parse(tmp_path / "fleet-report.xml").getroot()  # JUnit: the checks as before, still valid
    assert suite.get("name") == "gpufleet-verify" and suite.get("failures") == "1"

    metrics = fleet_report.history_metrics(report)
    assert set(metrics) == {"node-1", "node-2"}
    assert 'gpufleet_repeat_failures{window="3"} 2\n' in metrics["node-2"]
    assert 'gpufleet_repeat_offender{window="3",threshold="2"} 1\n' in metrics["node-2"]
    assert 'gpufleet_repeat_offender{window="3",threshold="2"} 0\n' in metrics["node-1"]
    for name, (kind, _help) in fleet_report.HISTORY_METRICS.items():
        assert f"# TYPE {name} {kind}\n" in metrics["node-1"]
