"""The command line (gpufleet_check.pyz run in a subprocess): its report, summary, output file and usage errors."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from gpufleet_check import checks, cli, common

from .fakes import (
    CHECK_KEYS,
    GPU_CHECKS,
    GPU_KEYS,
    HEALTH_CHECKS,
    NO_DEVICES,
    REPORT_KEYS,
    FakeHost,
    by_name,
    explain,
    fake_smi_that_records,
    probe,
    run_cli,
)

# --------------------------------------------------------------------------- command line


def test_cli_without_gpu_passes_what_it_checked(driver_only: FakeHost) -> None:
    """No GPU, the driver loaded and installed (the lab's nodes): driver_version passes, the GPU checks
    are skipped, and the report passes on what was checked."""
    proc = run_cli(driver_only, *driver_only.argv("--json", "--skip", "torch_cuda"))
    assert proc.returncode == 0, explain(proc)
    report = json.loads(proc.stdout)
    assert report.keys() == REPORT_KEYS
    assert (report["schema"], report["verdict"], report["reasons"]) == ("gpufleet-check/1", "pass", [])
    assert report["started"].endswith("Z") and report["duration_s"] >= 0
    assert (report["gpus"], report["gpu_count_pci"], report["reboot_required"]) == ([], 0, False)
    assert report["versions"]["torch"] is None and report["versions"]["python"].count(".") == 2
    assert report["notes"] == [], "without --driver-fact no fact is read and nothing is noted"
    assert [report["versions"][key] for key in ("driver_requested", "driver_pinned", "driver_source")] == [None] * 3
    checks = by_name(report)
    assert list(checks) == [
        "driver_version",
        "nvidia_smi",
        "torch_cuda",
        "libraries",
        "gemm",
        "memory_bandwidth",
        "allreduce_busbw",
        "p2p_topology",
        *HEALTH_CHECKS,
    ]
    assert all(CHECK_KEYS <= check.keys() for check in report["checks"])
    assert checks["driver_version"]["verdict"] == "pass"
    for name in GPU_CHECKS[1:]:
        assert checks[name]["verdict"] == "skipped" and checks[name]["detail"].startswith("no GPU"), checks[name]
    assert checks["torch_cuda"]["detail"] == "by request"


def test_cli_nothing_checked_is_not_a_pass(host: FakeHost) -> None:
    """Issue 16, item 1: no GPU, no driver: every check skipped. The verdict is not PASS, it says that
    nothing was checked and why, and the exit code is 1, so a cron job hears of it."""
    proc = run_cli(host, *host.argv("--json", "--skip", "torch_cuda"))
    assert proc.returncode == 1, explain(proc)
    report = json.loads(proc.stdout)
    assert report["verdict"] == "fail"
    assert report["reasons"] == ["nothing was checked: no GPU (15 checks skipped)"]
    assert {c["verdict"] for c in report["checks"]} == {"skipped"}


def test_cli_lost_gpus_with_expectations_fail(driver_only: FakeHost) -> None:
    """Issue 16, item 1, as reported: the driver answers, nvidia-smi says "No devices were found" (rc 6):
    --expect-gpus 8 and --expect-cuda 12.1 both fail, rc 1."""
    driver_only.nvidia_smi(NO_DEVICES, rc=6)
    proc = run_cli(driver_only, *driver_only.argv("--expect-gpus", "8", "--expect-cuda", "12.1"))
    assert proc.returncode == 1, explain(proc)
    lines = proc.stdout.splitlines()
    assert (
        "FAIL nvidia_smi: 0 GPU(s), expected 8 (--expect-gpus): nvidia-smi failed (rc 6): No devices were found"
        in lines
    )
    assert "FAIL libraries: torch is not installed, expected a build for CUDA 12.1 (--expect-cuda)" in lines, lines
    assert lines[-1].startswith("verdict: FAIL on ")


def test_cli_without_torch_fails(host: FakeHost) -> None:
    """No GPU: torch is not imported, its installed files are read; the test's stand-in has none."""
    proc = run_cli(host, *host.argv("--json"))
    assert proc.returncode == 1, explain(proc)
    report = json.loads(proc.stdout)
    assert report["verdict"] == "fail"
    assert report["reasons"] == ["torch_cuda: torch is not installed in this environment"]


def test_without_a_gpu_a_cpu_torch_is_read_not_imported(
    host: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU-only build without a GPU: its build comes from torch/version.py; an import would fail here.
    (A CUDA build is imported: see test_a_cuda_build_without_a_gpu_is_checked_not_skipped.)"""
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('imported')\n")
    (package / "version.py").write_text("__version__ = '2.3.1+cpu'\ndebug = False\ncuda: Optional[str] = None\n")
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.syspath_prepend(str(package.parent))
    p = probe(host)
    assert checks.check_torch_cuda(p)["detail"] == "no GPU (torch 2.3.1+cpu, CPU-only build)"
    libraries = checks.check_libraries(p)
    assert libraries["verdict"] == "skipped" and libraries["value"] == {
        "torch": "2.3.1+cpu",
        "cuda": None,
        "cudnn": None,
        "nccl": None,
    }
    assert checks.report_versions(p)["torch"] == "2.3.1+cpu"
    assert "torch" not in sys.modules


def test_cli_require_gpus_fails(host: FakeHost) -> None:
    proc = run_cli(host, *host.argv("--json", "--require-gpus", "--skip", "torch_cuda"))
    assert proc.returncode == 1, explain(proc)
    report = json.loads(proc.stdout)
    assert report["verdict"] == "fail"
    assert {reason.split(":")[0] for reason in report["reasons"]} == set(GPU_CHECKS)
    assert all("no GPU" in reason for reason in report["reasons"])


def test_cli_summary_and_output_file(host: FakeHost) -> None:
    output = host.root / "out" / "report.json"
    proc = run_cli(host, *host.argv("--skip", "torch_cuda", "--output", str(output)))
    assert proc.returncode == 1, explain(proc)
    lines = proc.stdout.splitlines()
    assert lines[0] == "SKIP driver_version: no GPU (no NVIDIA driver installed)"
    assert "SKIP gemm: no GPU" in lines and "SKIP torch_cuda: by request" in lines
    # Issue 16, item 1: 0 passed checks never read PASS; the summary says what was checked
    assert lines[-2].startswith("verdict: FAIL on ") and "0 pass, 0 warn, 15 skipped, 0 fail" in lines[-2]
    assert lines[-1] == "nothing was checked: no GPU (15 checks skipped)"
    assert json.loads(output.read_text())["verdict"] == "fail"
    assert sorted(p.name for p in output.parent.iterdir()) == ["report.json"]


@pytest.mark.parametrize("where", ["parent-is-a-file", "is-a-directory"])
def test_cli_unwritable_output_is_a_usage_error_before_any_check(driver_only: FakeHost, where: str) -> None:
    """Issue 16, item 2: an --output that cannot be written: one line, rc 2, and no check has run."""
    marker = fake_smi_that_records(driver_only)
    (driver_only.root / "a-file").write_text("")
    (driver_only.root / "a-dir").mkdir()
    output = driver_only.root / ("a-file/report.json" if where == "parent-is-a-file" else "a-dir")
    proc = run_cli(driver_only, *driver_only.argv("--output", str(output)))
    assert proc.returncode == 2, explain(proc)
    assert proc.stderr.startswith(f"gpufleet_check.pyz: --output {output}: cannot be written (")
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not marker.exists()


def test_report_is_replaced_atomically(
    driver_only: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 16, item 2: the report goes to a temporary file beside it, synced, then renamed; a write
    that fails after the checks keeps the old report, leaves no temporary file, still prints the summary
    and writes the metrics, and exits 2, not the 1 of a failed check."""
    output = driver_only.root / "out" / "report.json"
    output.parent.mkdir()
    output.write_text("old\n")
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(common.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(common.os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    assert cli.main(driver_only.argv("--skip", "torch_cuda", "--output", str(output))) == 0
    assert events == ["fsync", "replace"] and json.loads(output.read_text())["verdict"] == "pass"
    assert sorted(p.name for p in output.parent.iterdir()) == ["report.json"]

    metrics_file = driver_only.root / "out" / "gpufleet.prom"

    def full_disk(a: str, b: str) -> None:
        if Path(b) == output:
            raise OSError(28, "No space left on device")
        real_replace(a, b)

    output.write_text("old\n")
    monkeypatch.setattr(common.os, "replace", full_disk)
    capsys.readouterr()
    code = cli.main(
        driver_only.argv("--skip", "torch_cuda", "--output", str(output), "--metrics-file", str(metrics_file))
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert output.read_text() == "old\n" and sorted(p.name for p in output.parent.iterdir()) == [
        "gpufleet.prom",
        "report.json",
    ]
    assert f"--output {output}: not written" in err and "No space left on device" in err
    assert out.splitlines()[-1].startswith("verdict: PASS on ")


def test_cli_reports_gpus_and_reboot(healthy_h100: FakeHost) -> None:
    healthy_h100.userspace_driver("535.261.03")  # upgraded, not rebooted: the newest library counts
    proc = run_cli(healthy_h100, *healthy_h100.argv("--json", "--skip", "torch_cuda"))
    assert proc.returncode == 1, explain(proc)
    report = json.loads(proc.stdout)
    assert report["reboot_required"] is True and report["gpu_count_pci"] == 8
    assert report["versions"]["driver_loaded"] == "535.161.08"
    assert report["versions"]["driver_installed"] == "535.261.03"
    assert [gpu["index"] for gpu in report["gpus"]] == list(range(8))
    assert all(gpu.keys() == GPU_KEYS for gpu in report["gpus"])
    assert report["reasons"] == [
        "driver_version: loaded module 535.161.08, installed 535.261.03: driver/library mismatch, reboot required"
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--skip", "bogus"], "argument --skip: invalid choice: 'bogus'"),
        (["--expect-cuda", "twelve"], "expected MAJOR.MINOR"),
        # Issue 16, item 8: numbers that cannot be thresholds
        (["--gemm-min-fraction", "-3"], "argument --gemm-min-fraction: must be above 0 and at most 1, got -3"),
        (["--gemm-min-fraction", "nan"], "argument --gemm-min-fraction: must be above 0 and at most 1, got nan"),
        (["--gemm-min-fraction", "0"], "argument --gemm-min-fraction: must be above 0 and at most 1, got 0"),
        (["--gemm-min-fraction", "1.5"], "argument --gemm-min-fraction: must be above 0 and at most 1, got 1.5"),
        (["--busbw-min-nvlink", "-1"], "argument --busbw-min-nvlink: must be a finite number, 0 or more, got -1"),
        (["--busbw-min-pcie", "inf"], "argument --busbw-min-pcie: must be a finite number, 0 or more, got inf"),
        (["train", "--nnodes", "2", "--nproc-per-node", "1"], "--nnodes > 1 needs --rdzv-endpoint"),
        (["train"], "the following arguments are required: --nproc-per-node"),
    ],
)
def test_cli_usage_errors(host: FakeHost, args: list[str], message: str) -> None:
    proc = run_cli(host, *args)
    assert proc.returncode == 2, explain(proc)
    assert message in proc.stderr
