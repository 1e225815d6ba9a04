"""The Prometheus metrics (--metrics-file): their exposition format, their values, their file."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from gpufleet_check import checks, cli, common, metrics

from .fakes import (
    REPORT_KEYS,
    FakeHost,
    by_name,
    dgx_topology,
    explain,
    fake_smi_that_records,
    fake_torch,
    h100_listing,
    membw_measure,
    run_cli,
)

# --------------------------------------------------------------------------- Prometheus metrics (--metrics-file)

METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\["\\n])*)"')
SAMPLE_LINE = re.compile(rf"^({METRIC_NAME})(?:\{{(.*)\}})? (\S+)$")


# Metrics with samples only where a health check found something, read counters or ran DCGM.
HEALTH_ONLY_METRICS = {
    "gpufleet_health_finding",
    "gpufleet_xid_events",
    "gpufleet_nvlink_error_count",
    "gpufleet_dcgm_test_status",
}


def unescape_label_value(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], text)


def parse_exposition(text: str) -> dict[str, dict[str, Any]]:
    """Prometheus' text format, strictly: name -> {"help", "type", "samples": [(labels, value)]}.

    One HELP and one TYPE line per family, both before its samples, families
    not interleaved, label values with only the three escapes the format has.
    """
    assert text.endswith("\n") and "\n\n" not in text, "lines end with a newline, no empty lines"
    families: dict[str, dict[str, Any]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# "):
            keyword, name, rest = (line[2:].split(" ", 2) + [""])[:3]
            assert keyword in ("HELP", "TYPE") and re.fullmatch(METRIC_NAME, name), line
            family = families.setdefault(name, {"help": None, "type": None, "samples": []})
            assert family[keyword.lower()] is None and not family["samples"], f"{keyword} of {name} twice or late"
            if keyword == "TYPE":
                assert rest in ("counter", "gauge", "histogram", "summary", "untyped"), line
            family[keyword.lower()] = rest
            current = name
            continue
        match = SAMPLE_LINE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, label_text, value = match.groups()
        assert name == current, f"{name} outside its family block"
        labels: dict[str, str] = {}
        if label_text:
            pairs = LABEL_PAIR.findall(label_text)
            assert ",".join(f'{k}="{v}"' for k, v in pairs) == label_text, f"bad labels: {label_text!r}"
            labels = {k: unescape_label_value(v) for k, v in pairs}
            assert len(labels) == len(pairs), "a label twice"
        families[name]["samples"].append((labels, float(value)))
    for name, family in families.items():
        assert family["help"] and family["type"] and family["samples"], name
    return families


def values(families: dict[str, dict[str, Any]], name: str) -> list[tuple[dict[str, str], float]]:
    return families[name]["samples"]


def gemm_report(healthy: FakeHost, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The report of an 8 x H100 node whose GPU 5 is slow, with ECC errors on GPU 3 and a measured all-reduce."""
    healthy.nvidia_smi(h100_listing(ecc={3: "2"}), dgx_topology())

    def measure(torch: Any, index: int, n: int) -> dict[str, Any]:
        return {
            "index": index,
            "name": "NVIDIA H100 80GB HBM3",
            "dtype": "bfloat16",
            "finite": True,
            "uuid": f"4b0c8a3e-21f7-3c55-9e1d-0000000000{index:02d}",
            "tflops": 300.0 if index == 5 else 700.0 + index,
        }

    monkeypatch.setattr(checks, "measure_gemm", measure)
    monkeypatch.setattr(checks, "measure_memory_bandwidth", membw_measure())  # above every floor of the H100
    # 525 GB/s bus bandwidth: above the 8 x H100 floor (460)
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": nbytes / 300e9, "correct": True})
    monkeypatch.setattr(checks.Probe, "torch", property(lambda self: fake_torch(8)))
    monkeypatch.setattr(
        checks,
        "torch_versions",
        lambda torch: {"torch": "2.5.1+cu121", "cuda": "12.1", "cudnn": "8.9.2", "nccl": "2.18.1"},
    )
    return checks.build_report(
        cli.parse_args(healthy.argv("--skip", "torch_cuda", "--skip", "libraries", "--skip", "p2p_topology"))
    )


def test_metrics_of_a_gpu_node_parse_back(healthy_h100: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    report = gemm_report(healthy_h100, monkeypatch)
    families = parse_exposition(metrics.metrics_text(report))
    # The health checks' findings, Xid events, NVLink counters and DCGM tests (none on this fake node:
    # the saved outputs of test_health_actions.py show them).
    assert set(families) == set(metrics.METRICS) - HEALTH_ONLY_METRICS, "every other metric has samples on a GPU node"
    assert values(families, "gpufleet_action_required") == [
        ({"action_class": c}, 0.0) for c in ("replace", "drain", "reboot", "configure")
    ]
    assert all(families[name]["type"] == metrics.METRICS[name][0] == "gauge" for name in families)
    assert all(name.startswith("gpufleet_") for name in families)
    assert values(families, "gpufleet_verify_passed") == [({}, 0.0)]  # GEMM of GPU 5 and ECC of GPU 3 fail
    assert values(families, "gpufleet_reboot_required") == [({}, 0.0)]
    assert values(families, "gpufleet_gpus") == [({}, 8.0)] and values(families, "gpufleet_pci_gpus") == [({}, 8.0)]
    [(info, one)] = values(families, "gpufleet_versions_info")
    assert one == 1.0 and info == {
        "host": report["host"],
        "driver_installed": "535.161.08",
        "driver_loaded": "535.161.08",
        "cuda": "12.1",
        "cudnn": "8.9.2",
        "nccl": "2.18.1",
        "torch": "2.5.1+cu121",
        "python": report["versions"]["python"],
    }
    gemm = values(families, "gpufleet_gemm_flops_per_second")
    assert [labels["gpu"] for labels, _value in gemm] == [str(i) for i in range(8)]
    assert all(labels["model"] == "NVIDIA H100 80GB HBM3" for labels, _value in gemm)
    assert gemm[3][0]["uuid"] == "GPU-4b0c8a3e-21f7-3c55-9e1d-000000000003"
    assert [v for _labels, v in gemm] == pytest.approx([(300.0 if i == 5 else 700.0 + i) * 1e12 for i in range(8)])
    ecc = {labels["gpu"]: v for labels, v in values(families, "gpufleet_gpu_ecc_uncorrected_errors")}
    assert ecc == {str(i): (2.0 if i == 3 else 0.0) for i in range(8)}
    copies = values(families, "gpufleet_memory_bandwidth_bytes_per_second")
    assert [(labels["gpu"], labels["copy"]) for labels, _value in copies[:3]] == [
        ("0", "device"),
        ("0", "h2d"),
        ("0", "d2h"),
    ]
    assert copies[3][0] == {
        "gpu": "1",
        "model": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-4b0c8a3e-21f7-3c55-9e1d-000000000001",
        "copy": "device",
    }  # nvidia-smi's UUID, as the GEMM figure's
    assert [v for _labels, v in copies] == pytest.approx([x * 1e9 for i in range(8) for x in (2900.0 + i, 55.0, 53.0)])
    [(fabric, busbw)] = values(families, "gpufleet_allreduce_busbw_bytes_per_second")
    assert fabric == {"fabric": "nvlink"} and busbw == pytest.approx(300e9 * 2 * 7 / 8)
    status = values(families, "gpufleet_check_status")
    for check in report["checks"]:
        mine = {labels["status"]: v for labels, v in status if labels["check"] == check["name"]}
        assert mine == {s: float(s == check["verdict"]) for s in ("pass", "fail", "warn", "skipped")}, check["name"]
    assert {labels["check"] for labels, v in status if labels["status"] == "fail" and v == 1} == {"gemm", "nvidia_smi"}
    [(_labels, finished)] = values(families, "gpufleet_verify_timestamp_seconds")
    started = datetime.strptime(report["started"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    assert finished == pytest.approx(started + report["duration_s"])
    assert values(families, "gpufleet_verify_duration_seconds") == [({}, pytest.approx(report["duration_s"]))]


def test_metrics_leave_out_what_was_not_measured(host: FakeHost) -> None:
    report = checks.build_report(cli.parse_args(host.argv("--skip", "torch_cuda")))
    families = parse_exposition(metrics.metrics_text(report))
    assert set(metrics.METRICS) - set(families) == {
        "gpufleet_gemm_flops_per_second",
        "gpufleet_gpu_ecc_uncorrected_errors",
        "gpufleet_memory_bandwidth_bytes_per_second",
        "gpufleet_allreduce_busbw_bytes_per_second",
        *HEALTH_ONLY_METRICS,
    }
    assert values(families, "gpufleet_verify_passed") == [({}, 0.0)]  # nothing was checked
    assert values(families, "gpufleet_gpus") == [({}, 0.0)]
    [(info, _value)] = values(families, "gpufleet_versions_info")
    assert info["driver_installed"] == info["driver_loaded"] == info["torch"] == ""  # unknown: empty, never "None"


@pytest.mark.parametrize(
    "raw, escaped",
    [
        ("plain", "plain"),
        ('say "hi"', 'say \\"hi\\"'),
        ("C:\\nvidia\\", "C:\\\\nvidia\\\\"),
        ("two\nlines", "two\\nlines"),
        ('\\n is not "\n"', '\\\\n is not \\"\\n\\"'),
        (None, ""),
    ],
)
def test_label_values_are_escaped(raw: str | None, escaped: str) -> None:
    assert metrics.escape_label_value(raw) == escaped
    assert unescape_label_value(escaped) == ("" if raw is None else raw)


def test_escaped_labels_parse_back(healthy_h100: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    report = gemm_report(healthy_h100, monkeypatch)
    report["host"] = 'rack "7"\\slot\n3'
    report["gpus"][0]["name"] = 'NVIDIA "H100"\\SXM'
    families = parse_exposition(metrics.metrics_text(report))
    assert values(families, "gpufleet_versions_info")[0][0]["host"] == 'rack "7"\\slot\n3'
    assert values(families, "gpufleet_gemm_flops_per_second")[0][0]["model"] == 'NVIDIA "H100"\\SXM'
    assert "\\n" in metrics.escape_help("a\nb") and "\n" not in metrics.escape_help("a\nb")


def test_metric_values_are_numbers_prometheus_reads() -> None:
    assert [
        metrics.format_metric_value(v) for v in (True, False, 3, 0.5, 1e15, float("nan"), float("inf"), -float("inf"))
    ] == ["1", "0", "3", "0.5", "1000000000000000.0", "NaN", "+Inf", "-Inf"]


def test_metrics_file_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cli writes metrics.metrics_text with common.write_atomically: mode 0644, a whole new file renamed over the
    old."""
    target = tmp_path / "gpufleet.prom"
    report = {"verdict": "pass", "started": "2024-01-01T00:00:00Z", "duration_s": 1.0, "checks": [], "gpus": []}
    old_umask = os.umask(0o077)  # the mode must not depend on the caller's umask
    try:
        cli.write_metrics(report, target)
    finally:
        os.umask(old_umask)
    assert target.stat().st_mode & 0o777 == metrics.METRICS_FILE_MODE == 0o644
    assert parse_exposition(target.read_text())["gpufleet_verify_timestamp_seconds"]["samples"] == [({}, 1704067201.0)]

    # A reader holding the old file keeps reading the whole old file: the new one is a new inode, renamed over it.
    replaced: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        # node exporter's textfile collector reads *.prom only: the temporary file is hidden and not one of them.
        assert (
            Path(src).parent == target.parent
            and Path(src).name.startswith(".")
            and not Path(src).name.endswith(".prom")
        ), src
        assert Path(src).read_text() == metrics.metrics_text({**report, "verdict": "fail"}), (
            "complete before the rename"
        )
        replaced.append((src, str(dst)))
        real_replace(src, dst)

    with target.open() as reader:
        inode = os.fstat(reader.fileno()).st_ino
        monkeypatch.setattr(common.os, "replace", spy)
        cli.write_metrics({**report, "verdict": "fail"}, target)
        assert "gpufleet_verify_passed 1" in reader.read()
    assert len(replaced) == 1 and replaced[0][1] == str(target)
    assert target.stat().st_ino != inode and "gpufleet_verify_passed 0" in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpufleet.prom"], "no temporary file left"


def test_failed_metrics_write_keeps_the_old_file(
    driver_only: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = driver_only.root / "textfile" / "gpufleet.prom"
    target.parent.mkdir()
    target.write_text("# the previous run's metrics\n")
    real_replace = os.replace

    def full_disk(src: str, dst: str) -> None:
        if Path(dst) == target:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(common.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        cli.write_metrics({"verdict": "pass", "checks": [], "gpus": []}, target)
    assert target.read_text() == "# the previous run's metrics\n"
    assert [p.name for p in target.parent.iterdir()] == ["gpufleet.prom"]
    with pytest.raises(OSError):
        cli.write_metrics({"verdict": "pass"}, target.parent / "missing" / "gpufleet.prom")

    # Through the command: the file is named on stderr, and neither the verdict nor the exit code changes.
    capsys.readouterr()
    assert cli.main(driver_only.argv("--skip", "torch_cuda", "--metrics-file", str(target))) == 0
    err = capsys.readouterr().err
    assert err == f"gpufleet_check: metrics not written to {target}: [Errno 28] No space left on device\n"
    assert target.read_text() == "# the previous run's metrics\n"
    assert [p.name for p in target.parent.iterdir()] == ["gpufleet.prom"]


def test_cli_writes_metrics_beside_the_json(driver_only: FakeHost) -> None:
    host = driver_only
    metrics = host.root / "textfile" / "gpufleet.prom"
    metrics.parent.mkdir()
    proc = run_cli(host, *host.argv("--json", "--skip", "torch_cuda", "--metrics-file", str(metrics)))
    assert proc.returncode == 0, explain(proc)
    report = json.loads(proc.stdout)
    assert report.keys() == REPORT_KEYS, "the JSON report is unchanged"
    families = parse_exposition(metrics.read_text())
    assert values(families, "gpufleet_verify_passed") == [({}, 1.0)]
    assert values(families, "gpufleet_versions_info")[0][0]["host"] == report["host"]
    assert {labels["check"] for labels, v in values(families, "gpufleet_check_status") if v == 1} == set(
        by_name(report)
    )
    assert metrics.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in metrics.parent.iterdir()) == ["gpufleet.prom"]


def test_cli_reboot_required_metrics(healthy_h100: FakeHost) -> None:
    healthy_h100.userspace_driver("535.261.03")  # upgraded, not rebooted
    metrics = healthy_h100.root / "gpufleet.prom"
    proc = run_cli(healthy_h100, *healthy_h100.argv("--skip", "torch_cuda", "--metrics-file", str(metrics)))
    assert proc.returncode == 1, explain(proc)
    families = parse_exposition(metrics.read_text())
    assert values(families, "gpufleet_reboot_required") == [({}, 1.0)]
    assert values(families, "gpufleet_verify_passed") == [({}, 0.0)]
    info = values(families, "gpufleet_versions_info")[0][0]
    assert (info["driver_installed"], info["driver_loaded"]) == ("535.261.03", "535.161.08")
    assert ({"check": "driver_version", "status": "fail"}, 1.0) in values(families, "gpufleet_check_status")


def test_cli_metrics_in_a_missing_directory_warn_only(driver_only: FakeHost) -> None:
    host = driver_only
    marker = fake_smi_that_records(host)
    missing = host.root / "no-such-dir" / "gpufleet.prom"
    proc = run_cli(host, *host.argv("--json", "--skip", "torch_cuda", "--metrics-file", str(missing)))
    assert proc.returncode == 0, explain(proc)  # the verdict decides the exit code, not the metrics
    assert json.loads(proc.stdout)["verdict"] == "pass" and marker.exists()  # the checks ran
    assert proc.stderr == f"gpufleet_check: metrics not written to {missing}: no directory {missing.parent}\n"
    assert not missing.parent.exists()
