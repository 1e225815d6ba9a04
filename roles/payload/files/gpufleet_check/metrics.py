"""The report as Prometheus metrics (``--metrics-file PATH``).

The result is Prometheus' text exposition format (``metrics_text``), for node
exporter's textfile collector (``/var/lib/prometheus/node-exporter/gpufleet.prom``
with the monitoring role). This module only renders it: cli writes the file
with common.write_atomically, mode METRICS_FILE_MODE (0644), so the file is
replaced atomically (a temporary file in the same directory whose name starts
with a dot and ends in .tmp, which the collector skips, then a rename) and the
collector never reads half a file; the directory must exist. A file that
cannot be written is named on stderr and changes neither the report nor the
exit code (the staleness alert on ``gpufleet_verify_timestamp_seconds``
catches it)::

    gpufleet_verify_passed                          1 pass, 0 fail
    gpufleet_verify_timestamp_seconds               Unix time the verification finished
    gpufleet_verify_duration_seconds                how long the checks took
    gpufleet_reboot_required                        1 when the loaded module is not the installed driver
    gpufleet_versions_info{host, driver_installed, driver_loaded, cuda, cudnn, nccl, torch, python}  1
    gpufleet_check_status{check, status}            1 for the check's verdict, 0 for the other verdicts
    gpufleet_gpus                                   GPUs nvidia-smi lists
    gpufleet_pci_gpus                               NVIDIA GPUs on the PCI bus
    gpufleet_gemm_flops_per_second{gpu, model, uuid}   measured dense bf16/fp16 GEMM (TFLOP/s x 1e12)
    gpufleet_gpu_ecc_uncorrected_errors{gpu, model, uuid}   volatile uncorrected ECC errors
    gpufleet_memory_bandwidth_bytes_per_second{gpu, model, uuid, copy}   measured copy bandwidth (GB/s x 1e9)
                                                    of each GPU: copy "device" (device memory, read + write),
                                                    "h2d", "d2h" (pinned host memory)
    gpufleet_allreduce_busbw_bytes_per_second{fabric}  all-reduce bus bandwidth (GB/s x 1e9)
    gpufleet_health_finding{check, signal, subject, verdict, action_class}   1 per finding of the health checks
    gpufleet_action_required{action_class}          findings that ask for it (replace, drain, reboot, configure)
    gpufleet_xid_events{kind, code, device, verdict}   Xid / SXid events in the xid check's window
    gpufleet_nvlink_error_count{gpu, link, counter}    NVLink error counters (nvidia-smi nvlink -e)
    gpufleet_dcgm_test_status{test, status, level}  1 for each DCGM diagnostic test's status

A finding's labels: ``check`` (gpu_errors, pcie, clocks, nvlink, xid,
interconnect, dcgm), ``signal`` (what was read: row_remap_pending,
row_remap_failure, pcie_width, clock_event, nvlink_inactive, nvlink_errors,
xid, ...; health's docstring), ``subject`` (the finding's "gpu": a GPU with its
bus ID, a PCI address for an Xid, an InfiniBand port, "node"), ``verdict``
(fail, warn) and ``action_class`` (empty for a finding to watch). The finding's
evidence is in the report, not in a label.

A version that is unknown is an empty label; a figure that was not measured
(no GPU, check skipped) is left out rather than written as 0.

The input is the report dict of ``checks.build_report`` (see its module
docstring); this module imports nothing of the package (the monitoring tests
load it as a file).
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Any

# Every metric the writer emits: name -> (type, help). The monitoring role's
# alert rules use these names (tests/unit/test_monitoring_role.py checks that
# every gpufleet_* name in the rules is here).
METRICS: dict[str, tuple[str, str]] = {
    "gpufleet_verify_passed": ("gauge", "1 when the node passed gpufleet verification, 0 when it failed."),
    "gpufleet_verify_timestamp_seconds": ("gauge", "Unix time the gpufleet verification finished."),
    "gpufleet_verify_duration_seconds": ("gauge", "Seconds the gpufleet verification took."),
    "gpufleet_reboot_required": (
        "gauge",
        "1 when the node needs a reboot (loaded driver module is not the installed driver).",
    ),
    "gpufleet_versions_info": (
        "gauge",
        "Driver (installed and loaded), CUDA, cuDNN, NCCL, torch and Python versions; empty: unknown.",
    ),
    "gpufleet_check_status": (
        "gauge",
        "1 for the verdict of each gpufleet check (status: pass, fail, warn, skipped), 0 for the other verdicts.",
    ),
    "gpufleet_gpus": ("gauge", "GPUs nvidia-smi lists."),
    "gpufleet_pci_gpus": ("gauge", "NVIDIA GPUs on the PCI bus."),
    "gpufleet_gemm_flops_per_second": ("gauge", "Measured dense bf16 (fp16 before Ampere) matmul FLOP/s of each GPU."),
    "gpufleet_gpu_ecc_uncorrected_errors": ("gauge", "Volatile uncorrected ECC errors of each GPU."),
    "gpufleet_memory_bandwidth_bytes_per_second": (
        "gauge",
        "Measured copy bandwidth of each GPU, bytes/s: copy "
        "device (device memory, read + write), h2d, d2h "
        "(pinned host memory).",
    ),
    "gpufleet_allreduce_busbw_bytes_per_second": (
        "gauge",
        "All-reduce bus bandwidth over every GPU of the node, bytes/s.",
    ),
    "gpufleet_health_finding": (
        "gauge",
        "1 for each finding of gpufleet's health checks (check, signal read, subject, "
        "verdict fail or warn, action class: replace, drain, reboot, configure, "
        "empty to watch).",
    ),
    "gpufleet_action_required": ("gauge", "Findings of gpufleet's health checks that ask for this kind of work."),
    "gpufleet_xid_events": (
        "gauge",
        "Xid / SXid events of the kernel log in the xid check's window (verdict: fail drains, warn to watch).",
    ),
    "gpufleet_nvlink_error_count": ("gauge", "NVLink error counters since the driver loaded (nvidia-smi nvlink -e)."),
    "gpufleet_dcgm_test_status": (
        "gauge",
        "1 for the status of each DCGM diagnostic test of the dcgm check (level: dcgmi diag -r).",
    ),
}
# The kinds of work a finding asks for (health.ACTION_CLASSES; this module imports nothing of the package).
ACTION_CLASSES = ("replace", "drain", "reboot", "configure")
CHECK_VERDICTS = ("pass", "fail", "warn", "skipped")
METRICS_FILE_MODE = 0o644


def escape_label_value(value: Any) -> str:
    """A label value in the text format: backslash, double quote and line feed escaped; None is empty."""
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_metric_value(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return str(int(value))


def finished_timestamp(report: dict[str, Any]) -> float:
    """Unix time the report's checks finished: its start plus its duration (now when the start is unreadable)."""
    try:
        started = datetime.strptime(report["started"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except (KeyError, TypeError, ValueError):
        return round(time.time(), 3)
    return round(started.timestamp() + float(report.get("duration_s") or 0.0), 3)


def metric_samples(report: dict[str, Any]) -> dict[str, list[tuple[dict[str, Any], float | int | bool]]]:
    """name -> [(labels, value)] for the report; a figure that was not measured has no sample."""
    samples: dict[str, list[tuple[dict[str, Any], float | int | bool]]] = {name: [] for name in METRICS}
    versions = report.get("versions") or {}
    samples["gpufleet_verify_passed"].append(({}, report.get("verdict") == "pass"))
    samples["gpufleet_verify_timestamp_seconds"].append(({}, finished_timestamp(report)))
    samples["gpufleet_verify_duration_seconds"].append(({}, float(report.get("duration_s") or 0.0)))
    samples["gpufleet_reboot_required"].append(({}, bool(report.get("reboot_required"))))
    samples["gpufleet_versions_info"].append(
        (
            {
                "host": report.get("host"),
                **{
                    key: versions.get(key)
                    for key in ("driver_installed", "driver_loaded", "cuda", "cudnn", "nccl", "torch", "python")
                },
            },
            1,
        )
    )
    for check in report.get("checks") or []:
        for status in CHECK_VERDICTS:
            samples["gpufleet_check_status"].append(
                ({"check": check["name"], "status": status}, check.get("verdict") == status)
            )
    gpus = report.get("gpus") or []
    samples["gpufleet_gpus"].append(({}, len(gpus)))
    samples["gpufleet_pci_gpus"].append(({}, int(report.get("gpu_count_pci") or 0)))
    for gpu in gpus:
        labels = {"gpu": gpu.get("index"), "model": gpu.get("name"), "uuid": gpu.get("uuid")}
        if gpu.get("gemm_tflops") is not None:
            samples["gpufleet_gemm_flops_per_second"].append((labels, float(gpu["gemm_tflops"]) * 1e12))
        if gpu.get("ecc_uncorrected") is not None:
            samples["gpufleet_gpu_ecc_uncorrected_errors"].append((labels, int(gpu["ecc_uncorrected"])))
    checks = {c.get("name"): c for c in report.get("checks") or [] if isinstance(c, dict)}
    memory_bandwidth_samples(gpus, checks.get("memory_bandwidth") or {}, samples)
    allreduce = checks.get("allreduce_busbw", {})
    if isinstance(allreduce.get("value"), (int, float)) and not isinstance(allreduce.get("value"), bool):
        samples["gpufleet_allreduce_busbw_bytes_per_second"].append(
            ({"fabric": allreduce.get("fabric")}, float(allreduce["value"]) * 1e9)
        )
    health_samples(report, checks, samples)
    return samples


MEMBW_COPIES = (("device", "memory_bandwidth_gbps"), ("h2d", "h2d_gbps"), ("d2h", "d2h_gbps"))


def memory_bandwidth_samples(
    gpus: list[dict[str, Any]],
    check: dict[str, Any],
    samples: dict[str, list[tuple[dict[str, Any], float | int | bool]]],
) -> None:
    """The memory_bandwidth check's per-GPU copies, labelled like the GEMM figure (the report's GPU of that
    index: nvidia-smi's name and UUID; the check's own where nvidia-smi did not list it)."""
    for measured in check.get("per_gpu") or []:
        gpu = next((g for g in gpus if g.get("index") == measured.get("index")), measured)
        labels = {"gpu": measured.get("index"), "model": gpu.get("name"), "uuid": gpu.get("uuid")}
        for copy, key in MEMBW_COPIES:
            value = measured.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                samples["gpufleet_memory_bandwidth_bytes_per_second"].append(({**labels, "copy": copy}, value * 1e9))


def health_samples(
    report: dict[str, Any],
    checks: dict[str, dict[str, Any]],
    samples: dict[str, list[tuple[dict[str, Any], float | int | bool]]],
) -> None:
    """The health checks' findings, the work they ask for, Xid events, NVLink counters and DCGM's tests."""
    for name, check in checks.items():
        for found in check.get("findings") or []:
            samples["gpufleet_health_finding"].append(
                (
                    {
                        "check": name,
                        "signal": found.get("signal"),
                        "subject": found.get("gpu"),
                        "verdict": found.get("verdict"),
                        "action_class": found.get("action_class"),
                    },
                    1,
                )
            )
    actions = report.get("actions") if isinstance(report.get("actions"), dict) else {}
    for action_class in ACTION_CLASSES:
        samples["gpufleet_action_required"].append(
            ({"action_class": action_class}, int(actions.get(action_class) or 0))
        )
    for found in (checks.get("xid") or {}).get("findings") or []:
        samples["gpufleet_xid_events"].append(
            (
                {
                    "kind": found.get("kind"),
                    "code": found.get("code"),
                    "device": found.get("gpu"),
                    "verdict": found.get("verdict"),
                },
                int(found.get("count") or 0),
            )
        )
    for counter in (checks.get("nvlink") or {}).get("error_counters") or []:
        samples["gpufleet_nvlink_error_count"].append(
            (
                {"gpu": counter.get("gpu"), "link": counter.get("link"), "counter": counter.get("counter")},
                int(counter.get("value") or 0),
            )
        )
    dcgm = checks.get("dcgm") or {}
    for test, status in (dcgm.get("tests") or {}).items():
        samples["gpufleet_dcgm_test_status"].append(
            ({"test": test, "status": status, "level": dcgm.get("threshold")}, 1)
        )


def metrics_text(report: dict[str, Any]) -> str:
    """The report in Prometheus' text exposition format (HELP and TYPE for each metric that has samples)."""
    lines: list[str] = []
    for name, samples in metric_samples(report).items():
        if not samples:
            continue
        kind, text = METRICS[name]
        lines += [f"# HELP {name} {escape_help(text)}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            rendered = ",".join(f'{key}="{escape_label_value(val)}"' for key, val in labels.items())
            lines.append(
                f"{name}{{{rendered}}} {format_metric_value(value)}"
                if rendered
                else f"{name} {format_metric_value(value)}"
            )
    return "\n".join(lines) + "\n"
