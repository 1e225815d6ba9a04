"""The health checks through the command line (gpufleet_check.pyz) on a machine without GPUs, on saved outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gpufleet_check import health_checks

from .fakes import HEALTH_CHECKS
from .saved_outputs import DATA, IB_TREE, run_cli

# --------------------------------------------------------------------------- the checks, through the CLI


def test_cli_without_a_gpu_says_so(tmp_path: Path) -> None:
    proc, checks = run_cli(tmp_path)
    for name in HEALTH_CHECKS:
        assert (checks[name]["verdict"], checks[name]["detail"]) == ("skipped", "no GPU"), (name, proc.stderr)


def test_cli_judges_saved_outputs_without_a_gpu(tmp_path: Path) -> None:
    """A support bundle's outputs: judged as the live ones would be."""
    proc, checks = run_cli(
        tmp_path,
        "--smi-query-file",
        str(DATA / "smi-text" / "h100-8gpu-535.183.01-gpu0-remap-pending.txt"),
        "--nvlink-status-file",
        str(DATA / "nvlink" / "a100-8gpu-status-gpu2-link5-inactive.txt"),
        "--kernel-log-file",
        str(DATA / "xid" / "dmesg-iso-h100-xid48-63-94.log"),
        "--xid-window-hours",
        "0",
        "--dcgm-json-file",
        str(DATA / "dcgm" / "dcgm3-r3-virtualclient-pcie-fail.json"),
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
    report = json.loads(proc.stdout)
    gpu_errors = checks["gpu_errors"]
    assert gpu_errors["verdict"] == "warn"
    assert (gpu_errors["findings"][0]["gpu"], gpu_errors["findings"][0]["action"]) == (
        "GPU 0 (00000000:53:00.0)",
        "reboot",
    )
    assert report["reboot_required"] is False  # the driver's alone; the pending remap's reboot is in "actions"
    assert report["actions"]["reboot"] == 1
    assert checks["pcie"]["verdict"] == "pass" and "profile H100 80GB HBM3" in checks["pcie"]["detail"]
    assert (
        checks["clocks"]["verdict"] == "fail"
        and "GPU 2 (00000000:75:00.0): active HW power brake" in checks["clocks"]["detail"]
    )
    assert checks["nvlink"]["verdict"] == "fail" and "NVLink 5 inactive (11 of 12 up)" in checks["nvlink"]["detail"]
    assert checks["xid"]["verdict"] == "fail" and "Xid 48 ROBUST_CHANNEL_GPU_ECC_DBE x1" in checks["xid"]["detail"]
    assert "ignored per the catalog: Xid 63 x1" in checks["xid"]["detail"]
    assert checks["dcgm"]["verdict"] == "fail" and checks["dcgm"]["tests"]["PCIe"] == "Fail"
    assert checks["interconnect"]["detail"] == "no GPU"
    reasons = {r.split(":")[0] for r in report["reasons"]}
    assert {"clocks", "nvlink", "xid", "dcgm"} <= reasons and "gpu_errors" not in reasons


def test_cli_h200_capture_passes_and_one_gpu_expects_no_nvlink(tmp_path: Path) -> None:
    """The lent H200's own outputs (one SXM GPU passed through, no NVLink listed): healthy, and NVLink not
    expected on a node of one GPU (before 2026-12-04 this failed the node: "lists no NVLink, the H200 has 18")."""
    proc, checks = run_cli(
        tmp_path,
        "--smi-query-file",
        str(DATA / "smi-xml" / "h200-580.159.04-passthrough.xml"),
        "--nvlink-status-file",
        str(DATA / "nvlink" / "h200-passthrough-status.txt"),
    )
    for name in ("gpu_errors", "pcie", "clocks"):
        assert checks[name]["verdict"] == "pass", (name, checks[name]["detail"], proc.stderr)
    assert checks["pcie"]["detail"] == "1 GPU(s): Gen5 x16 of Gen5 x16; 1 x NVIDIA H200 (profile H200)"
    assert (checks["nvlink"]["verdict"], checks["nvlink"]["detail"]) == (
        "skipped",
        "one GPU (1 x NVIDIA H200 (profile H200)): NVLink joins GPUs, none listed and none expected",
    )


def test_cli_eight_sxm_gpus_without_nvlink_fail(tmp_path: Path) -> None:
    """The same empty nvlink --status beside eight H100 SXM GPUs: each GPU's 18 links are missing."""
    proc, checks = run_cli(
        tmp_path,
        "--smi-query-file",
        str(DATA / "smi-text" / "h100-8gpu-535.183.01.txt"),
        "--nvlink-status-file",
        str(DATA / "nvlink" / "h200-passthrough-status.txt"),
    )
    check = checks["nvlink"]
    assert check["verdict"] == "fail", proc.stderr
    assert len(check["findings"]) == 8
    assert {f["evidence"] for f in check["findings"]} == {
        "nvidia-smi nvlink --status lists no NVLink, the H100 80GB HBM3 has 18"
    }


def test_cli_interconnect_expectation_is_judged_without_a_gpu(tmp_path: Path) -> None:
    proc, checks = run_cli(tmp_path, "--expect-ib-ports", "8", "--ib-min-rate", "400", "--expect-peermem")
    assert "8 expected" not in proc.stderr
    check = checks["interconnect"]
    assert check["verdict"] == "fail"
    assert [f["evidence"].split(",")[0] for f in check["findings"]] == [
        "0 InfiniBand/RoCE port(s) ACTIVE at >= 400 Gb/s",
        f"nvidia_peermem not loaded (no {tmp_path / 'modules' / 'nvidia_peermem'}): no GPUDirect RDMA",
    ]
    shutil.rmtree(tmp_path / "ib")
    shutil.copytree(IB_TREE, tmp_path / "ib")
    (tmp_path / "modules" / "nvidia_peermem").mkdir()
    proc, checks = run_cli(
        tmp_path, "--expect-ib-ports", "8", "--ib-min-rate", "400", "--ib-link-layer", "InfiniBand", "--expect-peermem"
    )
    check = checks["interconnect"]
    assert check["verdict"] == "pass", check
    assert check["detail"] == (
        "8 of 9 port(s) ACTIVE at >= 400 Gb/s (InfiniBand 400 Gb/sec (4X NDR)); nvidia_peermem loaded"
    )


def test_cli_profile_overrides_are_checked_before_any_check(tmp_path: Path) -> None:
    site = tmp_path / "site.json"
    site.write_text(json.dumps({"H200": {"allreduce_8gpu_busbw_gbpss": 440}}))
    proc, checks = run_cli(tmp_path, "--profile-overrides", str(site))
    assert proc.returncode == 2 and checks == {}
    assert "--profile-overrides" in proc.stderr and "unknown field(s) allreduce_8gpu_busbw_gbpss" in proc.stderr


@pytest.mark.parametrize("value", ["48,x", "4.8"])
def test_cli_xid_codes_are_numbers(tmp_path: Path, value: str) -> None:
    proc, _checks = run_cli(tmp_path, "--xid-drain", value)
    assert proc.returncode == 2 and "expected Xid codes" in proc.stderr


def test_health_checks_are_registered() -> None:
    assert tuple(health_checks.HEALTH_CHECKS) == HEALTH_CHECKS
