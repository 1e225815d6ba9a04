"""The signal and action class of every finding, and the metrics and actions saved outputs become."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from gpufleet_check import dcgm, health, xid

from .saved_outputs import DATA, IB_TREE, data, run_cli

# --------------------------------------------------------------------------- signal and action class of every finding


def every_finding_of_the_data() -> list[dict[str, Any]]:
    """The findings of every judgement over every real output (and its one-field edits) under DATA."""
    found: list[dict[str, Any]] = []
    for path in sorted((DATA / "smi-xml").glob("*.xml")) + sorted((DATA / "smi-text").glob("*.txt")):
        gpus = health.parse_smi_query(path.read_text())
        found += health.judge_gpu_errors(gpus, 0, 0) + health.judge_pcie(gpus, gen_policy="fail")
        found += health.judge_pcie(gpus) + health.judge_clocks(gpus, "disabled") + health.judge_fabric(gpus)
    for path in sorted((DATA / "nvlink").glob("*status*.txt")):
        found += health.judge_nvlink(health.parse_nvlink_status(path.read_text()))
    for path in sorted((DATA / "nvlink").glob("*errors*.txt")):
        found += health.judge_nvlink([], health.parse_nvlink_errors(path.read_text()))
    for path in sorted((DATA / "xid").glob("*.log")):
        now = datetime(2030, 1, 1, tzinfo=timezone.utc)
        found += xid.judge_events(xid.parse_kernel_log(path.read_text(), now), now, 0)["findings"]
    for path in sorted((DATA / "dcgm").glob("*.json")):
        found += dcgm.judge_dcgm(dcgm.parse_dcgm_json(path.read_text()))["findings"]
    found += health.judge_ib_ports(health.parse_ib_ports(IB_TREE), 9, 400)[0]
    return found


def test_every_finding_names_its_signal_and_action_class() -> None:
    found = every_finding_of_the_data()
    assert len(found) > 40
    for f in found:
        assert isinstance(f["signal"], str) and f["signal"], f
        assert f["action_class"] in health.ACTION_CLASSES + (None,), f
        assert f["action_class"] is None or f["verdict"] in ("fail", "warn"), f
    signals = {f["signal"] for f in found}
    assert {
        "row_remap_pending",
        "row_remap_failure",
        "retired_pages_pending",
        "ecc_uncorrected",
        "pcie_width",
        "clock_event",
        "mig_mode",
        "fabric_manager",
        "nvlink_inactive",
        "nvlink_errors",
        "xid",
        "sxid",
        "dcgm_test",
        "ib_ports",
    } <= signals
    classes = {(f["signal"], f["action_class"]) for f in found}
    assert {
        ("row_remap_pending", "reboot"),
        ("row_remap_failure", "replace"),
        ("pcie_width", "drain"),
        ("mig_mode", "configure"),
        ("nvlink_inactive", "drain"),
        ("nvlink_errors", None),
    } <= classes
    with pytest.raises(ValueError, match="action class 'fix' is not one of"):
        health.finding("node", "fail", "fix it", "evidence", signal="x", action_class="fix")


def test_xid_action_classes_follow_the_catalogs_bucket(utc: None) -> None:
    """RESET_GPU / RESTART_BM / RESET_FABRIC: reboot; WORKFLOW_XID_48: drain and investigate; a watched Xid
    has none; Xid 154's by its own words (NVIDIA, Error Recovery and Response Flags: Reset, Reboot, Drain P2P)."""
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    classed = {}
    for name in (
        "dmesg-iso-h100-xid48-63-94.log",
        "dmesg-ctime-xid119.log",
        "kmsg-xid79-sxid20034-gpud-readme.log",
        "syslog-xid120-154-rtx-pro-6000.log",
    ):
        for f in xid.judge_events(xid.parse_kernel_log(data("xid", name), now), now, 0)["findings"]:
            classed[(f["kind"], f["code"])] = (f["signal"], f["action_class"])
    assert classed == {
        ("xid", 48): ("xid", "drain"),
        ("xid", 94): ("xid", None),
        ("xid", 119): ("xid", "reboot"),
        ("xid", 79): ("xid", "reboot"),
        ("sxid", 20034): ("sxid", "reboot"),
        ("xid", 120): ("xid", "reboot"),
        ("xid", 154): ("xid", "reboot"),
    }
    assert xid.action_class({"severity": "drain", "bucket": "Drain P2P"}) == "drain"
    assert xid.action_class({"severity": "drain", "bucket": "UPDATE_SWFW"}) == "configure"
    assert xid.action_class({"severity": "drain", "bucket": ""}) == "drain"  # a site's code without a bucket
    assert set(xid.BUCKET_ACTION_CLASS) == xid.DRAIN_BUCKETS
    assert set(xid.BUCKET_ACTION_CLASS.values()) <= set(health.ACTION_CLASSES)


def test_saved_outputs_become_metrics_and_actions(tmp_path: Path) -> None:
    """The support bundle of test_cli_judges_saved_outputs_without_a_gpu, with the NVLink error counters: each
    finding a gpufleet_health_finding sample, the work they ask for counted, the Xid events and DCGM's tests."""
    prom = tmp_path / "gpufleet.prom"
    proc, checks = run_cli(
        tmp_path,
        "--smi-query-file",
        str(DATA / "smi-text" / "h100-8gpu-535.183.01-gpu0-remap-pending.txt"),
        "--nvlink-status-file",
        str(DATA / "nvlink" / "h100-status-bottlerocket-gpu0-1.txt"),
        "--nvlink-errors-file",
        str(DATA / "nvlink" / "h100-errors-abridged-link1-replay.txt"),
        "--kernel-log-file",
        str(DATA / "xid" / "dmesg-iso-h100-xid48-63-94.log"),
        "--xid-window-hours",
        "0",
        "--dcgm-json-file",
        str(DATA / "dcgm" / "dcgm3-r3-virtualclient-pcie-fail.json"),
        "--metrics-file",
        str(prom),
    )
    report = json.loads(proc.stdout)
    found = [(name, f) for name, check in checks.items() for f in check.get("findings") or []]
    counts = {c: sum(f["action_class"] == c for _check, f in found) for c in health.ACTION_CLASSES}
    assert report["actions"] == counts and counts["reboot"] >= 1 and counts["drain"] >= 2
    assert checks["nvlink"]["error_counters"] and all(
        set(c) == {"gpu", "link", "counter", "value"} for c in checks["nvlink"]["error_counters"]
    )
    text = prom.read_text()
    samples = [line for line in text.splitlines() if line.startswith("gpufleet_health_finding{")]
    assert len(samples) == len(found)
    assert (
        'gpufleet_health_finding{check="gpu_errors",signal="row_remap_pending",subject="GPU 0 (00000000:53:00.0)",'
        'verdict="warn",action_class="reboot"} 1'
    ) in samples
    assert any(
        line.startswith(
            'gpufleet_health_finding{check="xid",signal="xid",subject="PCI:0000:19:00",verdict="fail",'
            'action_class="drain"}'
        )
        for line in samples
    )
    assert 'gpufleet_xid_events{kind="xid",code="48",device="PCI:0000:19:00",verdict="fail"} 1' in text
    assert 'gpufleet_xid_events{kind="xid",code="94",device="PCI:0000:19:00",verdict="warn"} 9' in text
    assert f'gpufleet_action_required{{action_class="reboot"}} {counts["reboot"]}' in text
    assert 'gpufleet_dcgm_test_status{test="PCIe",status="Fail",level="1"} 1' in text
    replay = [c for c in checks["nvlink"]["error_counters"] if c["value"]]
    assert (
        replay
        and (
            f'gpufleet_nvlink_error_count{{gpu="{replay[0]["gpu"]}",link="{replay[0]["link"]}",'
            f'counter="{replay[0]["counter"]}"}} {replay[0]["value"]}'
        )
        in text
    )
