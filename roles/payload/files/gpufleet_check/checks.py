"""The GPU health checks, the JSON report they make up, and its human summary.

Each check measures one thing and judges it against a threshold. In order:

``driver_version``   the loaded nvidia kernel module against the installed
                     userspace driver (libnvidia-ml / libcuda): after a driver
                     upgrade without a reboot they differ ("Driver/library
                     version mismatch") and the check asks for a reboot.
``nvidia_smi``       the GPU inventory from nvidia-smi: count (``--expect-gpus``),
                     uncorrected ECC errors (``--max-ecc-errors``), persistence mode.
``torch_cuda``       torch imports, CUDA is available, torch sees every GPU.
``libraries``        the CUDA, cuDNN and NCCL versions torch was built with
                     (``--expect-cuda 12.1`` compares major.minor), read with
                     or without a GPU (a CUDA build imports anywhere). torch's
                     own cuDNN and NCCL (the builds its wheels bring) are
                     compared on major.minor.patch with ``--expect-torch-cudnn``
                     / ``--expect-torch-nccl`` (the matrix's bundled builds);
                     a CPU-only torch has none, and says so instead. The
                     system's libcudnn8 / libnccl2 (dpkg) are listed apart.
``gemm``             square bf16 matmul TFLOP/s on every GPU (fp16 before Ampere)
                     against ``--gemm-min-fraction`` (default 0.85) x the
                     model's achievable figure (GEMM_ACHIEVABLE_TFLOPS).
``memory_bandwidth`` per GPU, device memory (HBM/GDDR) bandwidth of a device-to-device
                     copy (read + write counted, BabelStream's Copy) and the
                     host->device / device->host copies from pinned memory,
                     against the model's profile (DCGM's memory_bandwidth floor,
                     Azure's check_gpu_bw H2D/D2H floor); an unknown model or a
                     profile without the figure is measured, not judged.
``allreduce_busbw``  NCCL all-reduce bus bandwidth over all GPUs of the node.
                     On NVLink/NVSwitch nodes whose GPUs' profile has a floor for
                     their count (8 x H100 460, H200 431, A100 228 GB/s: Azure's,
                     profiles), against that floor at its message size (16 GiB
                     for those; the run uses it unless ``--allreduce-mib`` or
                     ``--quick`` says less); otherwise (unknown model, another
                     GPU count, a smaller message, PCIe) against the flat
                     ``--busbw-min-nvlink`` / ``--busbw-min-pcie`` floor, and
                     the detail says why.
``p2p_topology``     ``nvidia-smi topo -m`` links and CUDA peer access per pair.
``gpu_errors``       remapped rows, retired pages, ECC (``nvidia-smi -q -x``)
``pcie``             each GPU's PCIe link width and generation
``clocks``           active clock event (throttle) reasons, temperature, MIG mode
``nvlink``           NVLink status and error counters, Fabric Manager's state
``xid``              Xid / SXid events of the kernel log in a recent window
``interconnect``     InfiniBand/RoCE ports (sysfs), nvidia_peermem
``dcgm``             ``dcgmi diag -r <level> -j`` under a time limit
                     (the last seven: health_checks, with their parsers in
                     health, xid, dcgm and their per-SKU figures in profiles)
``training``         (``--train`` only) the DDP payload train.py under torchrun
                     on every GPU of the machine (launcher.run_training).

A check's verdict is "pass", "fail", "warn" or "skipped". On a machine without
GPUs the GPU checks are "skipped" with the detail "no GPU" (never "pass");
``--require-gpus`` makes that a failure. An expectation is never skipped:
with ``--expect-gpus N`` fewer GPUs than N fail ``nvidia_smi`` whatever the
reason (none at all, nvidia-smi "No devices were found"), and
``--expect-cuda X.Y`` is judged on what torch was built for, which needs no
GPU: a CPU-only or other-CUDA build fails ``libraries`` on any machine.
Only what truly needs a GPU (running CUDA, GEMM, all-reduce, peer access)
says "no GPU". A check that raises is reported as a failure, with
the exception; it never stops the other checks.

The report passes only when at least one check passed and none failed: a
run in which every check was skipped (a machine without GPUs and without a
driver) fails with the reason "nothing was checked: no GPU", and exits 1 like
any failure, so that a cron job is never told that an unverified machine is
healthy.

torch is imported only when a check needs it (``Probe.torch``); a CPU-only
build on a machine without a GPU is not imported at all: its installed files
say which build it is.

JSON report (``--json``, or ``--output PATH``)
----------------------------------------------
::

    {"schema": "gpufleet-check/1", "host": str, "started": "2024-01-01T00:00:00Z",
     "duration_s": float, "verdict": "pass" | "fail",
     "reasons": ["<check name>: <detail>", ...],        # one per failed check, or the one
                                                        # "nothing was checked: ..." when none passed
     "reboot_required": bool,                           # the driver's: loaded module is not the installed one
     "actions": {"replace": int, "drain": int,          # findings of the health checks that ask for each
                 "reboot": int, "configure": int},      # kind of work (a pending row remap: reboot)
     "versions": {"driver_installed", "driver_loaded", "cuda", "torch", "cudnn",
                  "nccl", "python",                     # str or null each; cudnn and
                  "system_cudnn", "system_nccl",        # nccl are torch's own, system_*
                                                        # the dpkg versions of libcudnn8, libnccl2
                  "driver_requested", "driver_pinned",  # from --driver-fact (the nvidia_driver
                  "driver_source"},                     # role's local fact): the version asked
                                                        # for ("latest", an exact one, "default"),
                                                        # the release the run pinned, the source;
                                                        # null without a readable fact
     "notes": [str, ...],                               # what could not be read and is not a
                                                        # failure (a missing or broken driver fact)
     "gpus": [{"index": int, "name": str, "uuid": str, "pci_bus_id": str,
               "memory_total_mib": int | null, "persistence_mode": bool | null,
               "ecc_uncorrected": int | null, "gemm_tflops": float | null,
               "gemm_of_achievable": float | null}],
     "gpu_count_pci": int,
     "checks": [{"name", "verdict", "value", "unit", "threshold", "detail", ...}],
     "training": {...}}                                 # the payload's result, --train only

Checks may carry more keys: ``reboot_required`` (driver_version, nvidia_smi),
``per_gpu`` (gemm: per GPU the measured, datasheet and achievable TFLOP/s,
``of_achievable``, the measured share of the achievable figure, and the
floor; memory_bandwidth: per GPU ``memory_bandwidth_gbps``, ``h2d_gbps``,
``d2h_gbps``, their floors, sources and verdicts, ``profile``, ``correct``),
``h2d_gbps``/``d2h_gbps``/``host_copy_min_gbps``/``size_mib``/``profile``
(memory_bandwidth: the slowest GPU's host copies, the slowest host copy of
any GPU, the buffer size, the slowest GPU's profile), ``algbw_gbps``/``world_size``/``size_mib``/``fabric``
(allreduce_busbw), ``torch_libraries`` (libraries: per library torch's
own version, the expected one and the comparison's outcome, "match",
"differs", "no CUDA", "not compared"; and the system's packages),
``log_tail`` and ``failures`` (training), ``traceback`` (a
check that raised), ``findings`` (the health checks: ``[{"gpu", "verdict",
"action", "evidence", "signal", "action_class"}]``, each failure or warning
with its evidence, what was read and the kind of work it asks for: reboot,
drain, replace, configure, or null to watch; health's docstring. A pending
row remap's action class is "reboot"; the report's reboot_required stays the
driver's, the fleet report and the metrics take the findings' classes in)
and ``per_gpu``/``ports``/``tests``/``ignored``/``error_counters`` (nvlink:
``[{"gpu", "link", "counter", "value"}]``) with what they read. Each entry of "gpus" also carries
``gemm_of_achievable``. Non-finite numbers are written as null.

``--driver-fact PATH`` (gpu_verify passes /etc/ansible/facts.d/nvidia_driver.fact)
names the nvidia_driver role's local fact: run when executable (one JSON line
on stdout, at most facts.DRIVER_FACT_TIMEOUT_S seconds), else read as JSON
text. A missing, failing or unparsable fact leaves the three driver_* fields
null and adds a note ("driver fact PATH: not found ..."); it fails no check,
since a node need not have been provisioned by the nvidia_driver role. Without
the option (or with an empty PATH) the fact is not read and nothing is noted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import socket
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from . import health, health_checks, launcher, profiles
from .common import check_result, finite_or_none, first_lines, model_pattern, no_gpu, read_text
from .facts import (
    USERSPACE_LIBRARIES,
    SmiInventory,
    all_pairs_nvlink,
    count_pci_gpus,
    gpu_pairs,
    installed_driver_version,
    is_nvlink,
    loaded_module_version,
    parse_topology,
    query_nvidia_smi,
    read_driver_fact,
    run_nvidia_smi,
    system_library_versions,
)

SCHEMA = "gpufleet-check/1"

# Datasheet dense tensor-core TFLOP/s per GPU model: bf16 (fp16 on V100 and
# T4, which have no bf16), fp32 accumulation, NO sparsity: half the "with
# sparsity" figure of NVIDIA's datasheets (H100: 1,979 -> 989 for SXM, 1,513
# -> 756 PCIe, 1,671 -> 835 NVL, https://www.nvidia.com/en-us/data-center/h100/;
# H200: 1,979 -> 989, https://www.nvidia.com/en-us/data-center/h200/; A100:
# 312 dense / 624 sparse, https://www.nvidia.com/content/dam/en-zz/Solutions/
# Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf) and
# of the Ampere / Ada whitepapers for the others. Matched in this order
# against the GPU name, each word of the model as a whole word and in order
# ("A10" does not match "A100"; "A100 PCIe" matches "A100-PCIE-40GB" and
# "A100 80GB PCIe"), so the more specific names come first.
GEMM_REFERENCE_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM5 / HBM3
    ("H800 PCIe", 756.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("A100 PCIe", 312.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("A30", 165.0),
    ("A10", 125.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
    ("V100", 125.0),
    ("T4", 65.0),
)

# What a healthy GPU of the model really reaches: measured dense bf16 matmul
# TFLOP/s, the "Maximum Achievable Matmul FLOPS" (MAMF, best shape, mean of
# 100 iterations) of Stas Bekman's Machine Learning Engineering book, whose table is at
# https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md#maximum-achievable-matmul-flops-comparison-table
# H100 SXM 794.5 of 989 (80.3 %, torch 2.7.0+cu126, "H200 is the same"),
# GH200 828.6 (83.8 %), A100 SXM 271.2 of 312 (86.9 %), A100 PCIe 252.9
# (81.1 %). This project's own H200 at n=8192 (docs/gpu.md): 801, 81 % of 989.
# A GPU passes at --gemm-min-fraction (default 0.85) of its model's figure: a
# GPU that is throttled, power-capped or stuck at low clocks (60-75 % of the
# datasheet) fails, where half the datasheet figure let it pass.
GEMM_ACHIEVABLE_TFLOPS: dict[str, float] = {
    "GH200": 828.6,
    "H200": 794.5,
    "H100": 794.5,
    "A100 PCIe": 252.9,
    "A100": 271.2,
}
# A model with a datasheet figure but no published measurement: its achievable
# figure is estimated as this share of the datasheet, so that the default
# floor (0.85 x 0.6 = 0.51 of the datasheet) stays where it was before the
# achievable figures, half the datasheet. A model without a datasheet figure
# is not judged ("warn", no floor).
GEMM_FALLBACK_EFFICIENCY = 0.6
GEMM_MIN_FRACTION = 0.85

GEMM_SIZE, QUICK_GEMM_SIZE = 8192, 4096
GEMM_WARMUP, GEMM_ITERS = 3, 10
# memory_bandwidth: the buffer copied (device to device, and to and from pinned host memory), at most
# 1/MEMBW_MAX_SHARE of the GPU's memory (the device copy holds two buffers).
MEMBW_MIB, QUICK_MEMBW_MIB = 1024, 256
MEMBW_MAX_SHARE = 16
MEMBW_WARMUP, MEMBW_ITERS = 3, 10
UNKNOWN_MODEL_NOTE = "unknown model: no floor; set one in gpu_verify_profile_overrides"
ALLREDUCE_MIB, QUICK_ALLREDUCE_MIB = 256, 32
ALLREDUCE_WARMUP, ALLREDUCE_ITERS = 5, 20
ALLREDUCE_TIMEOUT_S = 300
TRAIN_CPU_NPROC = 2  # training processes of --train on a machine without GPUs


# --------------------------------------------------------------------------- pure figures and judgements


def bus_bandwidth_gbps(nbytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth in GB/s (1e9), as nccl-tests reports it: algbw x 2(n-1)/n."""
    algbw = nbytes / seconds / 1e9
    return algbw * 2 * (world_size - 1) / world_size


def device_copy_gbps(nbytes: int, iters: int, seconds: float) -> float:
    """Device memory bandwidth in GB/s (1e9) of iters device-to-device copies of nbytes: each reads and writes
    nbytes, so 2 x nbytes x iters / seconds, as BabelStream counts its Copy kernel (UoB-HPC/BabelStream
    src/main.cpp @ 01861850: "Copy" moves 2 * sizeof(T) * ARRAY_SIZE bytes; DCGM's memory_bandwidth test counts
    its Triad's two reads and one write the same way, 3 * sizeof(REAL) * NUM)."""
    return 2 * nbytes * iters / seconds / 1e9


def host_copy_gbps(nbytes: int, iters: int, seconds: float) -> float:
    """Host<->device copy bandwidth in GB/s (1e9): nbytes x iters / seconds, each byte crossing the bus once
    (nvbandwidth's host_to_device / device_to_host_memcpy_ce, which Azure's check_gpu_bw judges)."""
    return nbytes * iters / seconds / 1e9


def gemm_tflops(n: int, iters: int, seconds: float) -> float:
    return 2 * n**3 * iters / seconds / 1e12


def decode_cudnn_version(code: int | None) -> str | None:
    """torch.backends.cudnn.version(): 8902 -> '8.9.2' (cuDNN 8: major*1000 + minor*100 + patch),
    90100 -> '9.1.0' (cuDNN 9: major*10000 + minor*100 + patch)."""
    if not code:
        return None
    major_unit = 10000 if code >= 90000 else 1000
    return f"{code // major_unit}.{code % major_unit // 100}.{code % 100}"


def format_nccl_version(version: Any) -> str | None:
    """torch.cuda.nccl.version(): (2, 18, 1) -> '2.18.1' (old releases gave 2708 for 2.7.8)."""
    if version is None:
        return None
    if isinstance(version, int):
        major_unit = 10000 if version >= 20900 else 1000
        version = (version // major_unit, version % major_unit // 100, version % 100)
    return ".".join(str(part) for part in version)


def reference_tflops(gpu_name: str) -> tuple[str, float] | None:
    """(model, dense TFLOP/s) from GEMM_REFERENCE_TFLOPS for a GPU name, or None when unknown."""
    for model, tflops in GEMM_REFERENCE_TFLOPS:
        if re.search(model_pattern(model), gpu_name, re.IGNORECASE):
            return model, tflops
    return None


def achievable_tflops(gpu_name: str) -> dict[str, Any] | None:
    """{"model", "datasheet", "achievable", "source"} for a GPU name, or None for an unknown model.

    source is "measured" (GEMM_ACHIEVABLE_TFLOPS, published measurements) or
    "estimated" (GEMM_FALLBACK_EFFICIENCY x the datasheet figure)."""
    reference = reference_tflops(gpu_name)
    if reference is None:
        return None
    model, datasheet = reference
    if model in GEMM_ACHIEVABLE_TFLOPS:
        return {
            "model": model,
            "datasheet": datasheet,
            "achievable": GEMM_ACHIEVABLE_TFLOPS[model],
            "source": "measured",
        }
    return {
        "model": model,
        "datasheet": datasheet,
        "achievable": round(GEMM_FALLBACK_EFFICIENCY * datasheet, 1),
        "source": "estimated",
    }


def judge_gemm(gpu_name: str, tflops: float, min_fraction: float) -> dict[str, Any]:
    """One GPU's measured TFLOP/s against min_fraction x its model's achievable figure:
    {"verdict", "threshold", "datasheet_tflops", "achievable_tflops", "of_achievable", "detail"}."""
    figure = achievable_tflops(gpu_name)
    if figure is None:
        return {
            "verdict": "warn",
            "threshold": None,
            "datasheet_tflops": None,
            "achievable_tflops": None,
            "of_achievable": None,
            "detail": f"no reference figure for {gpu_name} (measured {tflops:.1f} TFLOP/s)",
        }
    achievable = figure["achievable"]
    threshold = min_fraction * achievable
    share = tflops / achievable
    origin = (
        "published measurement"
        if figure["source"] == "measured"
        else f"estimated: {GEMM_FALLBACK_EFFICIENCY:g} x the datasheet, no published measurement"
    )
    detail = (
        f"{gpu_name}: {tflops:.1f} TFLOP/s, {share:.0%} of the achievable {achievable:g} for "
        f"{figure['model']} ({origin}; datasheet {figure['datasheet']:g}); "
        f"floor {threshold:.1f} = {min_fraction:g} x {achievable:g}"
    )
    return {
        "verdict": "pass" if tflops >= threshold else "fail",
        "threshold": threshold,
        "datasheet_tflops": figure["datasheet"],
        "achievable_tflops": achievable,
        "of_achievable": share,
        "detail": detail,
    }


def judge_topology(links: list[list[str]], p2p: list[list[bool | None]] | None) -> tuple[str, str]:
    """Fail: an NVLink pair without peer access. Warn: a pair crossing the CPU interconnect (SYS)."""
    pairs = list(gpu_pairs(len(links)))
    kinds = Counter(links[i][j] for i, j in pairs)
    summary = f"{len(links)} GPUs, pairs: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    if p2p is not None:
        summary += f"; P2P on {sum(bool(p2p[i][j]) for i, j in pairs)}/{len(pairs)} pairs"
    broken = [
        f"GPU{i}-GPU{j} ({links[i][j]})"
        for i, j in pairs
        if is_nvlink(links[i][j]) and p2p is not None and p2p[i][j] is False
    ]
    crossing = [f"GPU{i}-GPU{j}" for i, j in pairs if links[i][j] in ("SYS", "SOC")]
    if broken:
        return "fail", f"NVLink without peer access: {', '.join(broken)}; {summary}"
    if crossing:
        return "warn", f"pairs crossing the CPU interconnect (SYS): {', '.join(crossing)}; {summary}"
    return "pass", summary


# --------------------------------------------------------------------------- what the checks share


@dataclass
class DriverState:
    loaded: str | None
    loaded_source: str | None
    installed: str | None
    installed_path: str | None


class Probe:
    """The options plus the host facts several checks share, each gathered once."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.torch_error = ""
        self.training_result: dict[str, Any] | None = None

    @cached_property
    def pci_gpu_count(self) -> int:
        return count_pci_gpus(self.args.sysfs_pci_dir)

    @cached_property
    def smi(self) -> SmiInventory:
        return query_nvidia_smi()

    @property
    def gpu_present(self) -> bool:
        return self.pci_gpu_count > 0 or bool(self.smi.gpus)

    @property
    def expected_gpu_count(self) -> int:
        """GPUs the machine should expose: nvidia-smi's count, else the PCI bus's."""
        return len(self.smi.gpus) if self.smi.ok else self.pci_gpu_count

    @cached_property
    def driver(self) -> DriverState:
        loaded, source = loaded_module_version(self.args.module_version_file, self.args.driver_proc_file)
        if loaded is None and self.smi.driver_version:
            loaded, source = self.smi.driver_version, "nvidia-smi"  # NVML reports the kernel driver
        installed, path = installed_driver_version(self.args.driver_lib_dir or ())
        return DriverState(loaded, source, installed, path)

    @cached_property
    def driver_fact(self) -> tuple[dict[str, Any] | None, str]:
        """(the nvidia_driver role's fact, "") or (None, why not: "" when --driver-fact was not given)."""
        path = getattr(self.args, "driver_fact", "") or ""
        return read_driver_fact(path) if path else (None, "")

    @cached_property
    def topology(self) -> tuple[list[list[str]] | None, str]:
        """(link matrix, "") or (None, why not)."""
        code, output = run_nvidia_smi("topo", "-m")
        if code is None:
            return None, output
        if code != 0:
            return None, f"nvidia-smi topo -m failed (rc {code}): {first_lines(output)}"
        try:
            return parse_topology(output), ""
        except ValueError as exc:
            return None, str(exc)

    @cached_property
    def smi_details(self) -> tuple[list[dict[str, Any]] | None, str, str]:
        """(GPU records of nvidia-smi -q -x or --smi-query-file, "", source) or (None, why not, source)."""
        return health_checks.smi_details(self.args)

    @cached_property
    def profile_table(self) -> dict[str, dict[str, Any]]:
        """The per-SKU table with --profile-overrides laid over it (checked by the CLI before any check)."""
        path, text = getattr(self.args, "profile_overrides", None), getattr(self.args, "profile_overrides_json", None)
        if text is not None:
            return profiles.parse_overrides(text)
        return profiles.load_overrides(str(path)) if path else profiles.PROFILES

    @cached_property
    def system_libraries(self) -> dict[str, str | None]:
        """The system's cuDNN and NCCL packages (dpkg), which torch's CUDA wheels do not use."""
        return system_library_versions()

    @cached_property
    def torch(self) -> Any:
        """The torch module, or None (the reason in torch_error)."""
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA indices = nvidia-smi indices
        try:
            import torch
        except Exception as exc:  # ImportError, or OSError from a broken CUDA library
            self.torch_error = f"{type(exc).__name__}: {exc}"
            return None
        return torch

    @property
    def cuda_device_count(self) -> int:
        torch = self.torch
        return torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else 0


def gpu_prerequisite(name: str, probe: Probe, min_gpus: int = 1) -> dict[str, Any] | None:
    """The skip result of a check that needs torch with CUDA and min_gpus GPUs, or None to go on."""
    if not probe.gpu_present:
        return no_gpu(name, probe)
    if probe.torch is None:
        return check_result(name, "skipped", "torch not importable (see torch_cuda)")
    count = probe.cuda_device_count
    if count == 0:
        return check_result(name, "skipped", "CUDA not available to torch (see torch_cuda)")
    if count < min_gpus:
        return check_result(name, "skipped", f"needs {min_gpus} or more GPUs, torch sees {count}")
    return None


# --------------------------------------------------------------------------- checks


def check_driver_version(probe: Probe) -> dict[str, Any]:
    """Loaded kernel module == installed userspace driver, else a reboot is due."""
    name = "driver_version"
    state, smi, pci = probe.driver, probe.smi, probe.pci_gpu_count

    def result(verdict: str, detail: str, reboot: bool = False) -> dict[str, Any]:
        return check_result(
            name,
            verdict,
            detail,
            value=state.loaded,
            threshold=state.installed,
            reboot_required=reboot,
            loaded_from=state.loaded_source,
            installed_library=state.installed_path,
        )

    if smi.needs_reboot:
        return result(
            "fail",
            f"{smi.error} (loaded module {state.loaded}, installed {state.installed}): reboot required",
            reboot=True,
        )
    if state.loaded and state.installed:
        if state.loaded == state.installed:
            return result("pass", f"loaded module {state.loaded} matches the installed userspace driver")
        return result(
            "fail",
            f"loaded module {state.loaded}, installed {state.installed}: driver/library mismatch, reboot required",
            reboot=True,
        )
    if state.installed:
        if pci == 0:
            return no_gpu(name, probe, f"userspace driver {state.installed} installed, module not loaded")
        return result(
            "fail",
            f"userspace driver {state.installed} installed, {pci} GPU(s) on the PCI bus: "
            "module not loaded, reboot required",
            reboot=True,
        )
    if state.loaded:
        return result(
            "fail",
            f"module {state.loaded} loaded but no userspace driver library ({' / '.join(USERSPACE_LIBRARIES)}) found",
        )
    if pci:
        return result("fail", f"{pci} GPU(s) on the PCI bus but no NVIDIA driver installed")
    return no_gpu(name, probe, "no NVIDIA driver installed")


def no_gpu_expected(name: str, probe: Probe, note: str) -> dict[str, Any]:
    """No GPU on the machine: a failure when --expect-gpus asks for some (an expectation is never
    skipped), else skipped "no GPU" (a failure with --require-gpus)."""
    expected = probe.args.expect_gpus
    if expected:
        return check_result(
            name,
            "fail",
            f"0 GPU(s), expected {expected} (--expect-gpus): {note}",
            value=0,
            unit="GPUs",
            threshold=expected,
            reboot_required=False,
        )
    return no_gpu(name, probe, note)


def check_nvidia_smi(probe: Probe) -> dict[str, Any]:
    """Inventory: GPU count, uncorrected ECC errors, persistence mode."""
    name, smi, args = "nvidia_smi", probe.smi, probe.args
    if not smi.ok:
        if probe.pci_gpu_count == 0 and not smi.needs_reboot:
            return no_gpu_expected(name, probe, smi.error)
        return check_result(
            name,
            "fail",
            f"{smi.error} ({probe.pci_gpu_count} GPU(s) on the PCI bus)",
            threshold=args.expect_gpus,
            reboot_required=smi.needs_reboot,
        )
    if not smi.gpus and probe.pci_gpu_count == 0:
        return no_gpu_expected(name, probe, "nvidia-smi lists no GPU")
    gpus, failures, warnings = smi.gpus, [], []
    if args.expect_gpus is not None and len(gpus) < args.expect_gpus:
        failures.append(f"{len(gpus)} GPU(s), expected {args.expect_gpus}")
    for gpu in gpus:
        if (gpu["ecc_uncorrected"] or 0) > args.max_ecc_errors:
            failures.append(
                f"GPU {gpu['index']} ({gpu['pci_bus_id']}): {gpu['ecc_uncorrected']} uncorrected "
                f"ECC error(s), max {args.max_ecc_errors}"
            )
    if probe.pci_gpu_count > len(gpus):
        warnings.append(f"nvidia-smi lists {len(gpus)} GPU(s), the PCI bus has {probe.pci_gpu_count}")
    no_persistence = [str(gpu["index"]) for gpu in gpus if gpu["persistence_mode"] is False]
    if no_persistence:
        warnings.append(f"persistence mode disabled on GPU {', '.join(no_persistence)}")
    models = ", ".join(f"{n} x {model}" for model, n in Counter(g["name"] for g in gpus).items())
    summary = f"{len(gpus)} GPU(s): {models or 'none'}; driver {smi.driver_version}"
    verdict = "fail" if failures else "warn" if warnings else "pass"
    return check_result(
        name,
        verdict,
        "; ".join(failures + warnings + [summary]),
        value=len(gpus),
        unit="GPUs",
        threshold=args.expect_gpus,
        reboot_required=False,
    )


def torch_build(torch: Any) -> str:
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    return f"torch {torch.__version__}, {cuda}"


def installed_torch() -> dict[str, str | None] | None:
    """torch's version and CUDA build read from its installed torch/version.py, without
    importing torch (seconds of CPU); None when no torch package with one is found."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):  # sys.modules["torch"] is None: blocked
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    text = read_text(Path(locations[0]) / "version.py") if locations else None
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text or "", re.M)
    if not version:
        return None
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text or "", re.M)
    return {"torch": version.group(1), "cuda": cuda.group(1) if cuda else None, "cudnn": None, "nccl": None}


def check_torch_cuda(probe: Probe) -> dict[str, Any]:
    """torch imports, CUDA is available and torch sees as many GPUs as nvidia-smi.

    Without a GPU on the machine there is nothing for torch to use: its
    installed files say which build it is, and it is not imported."""
    name = "torch_cuda"
    if not probe.gpu_present:
        installed = installed_torch()
        if installed is None:
            return check_result(name, "fail", "torch is not installed in this environment")
        return no_gpu(
            name,
            probe,
            f"torch {installed['torch']}, " + (f"CUDA {installed['cuda']}" if installed["cuda"] else "CPU-only build"),
        )
    torch = probe.torch
    if torch is None:
        return check_result(name, "fail", f"torch not importable: {probe.torch_error}")
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    expected = probe.expected_gpu_count
    build = torch_build(torch)
    if not probe.gpu_present and count == 0:
        return no_gpu(name, probe, build)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    note = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    if not available:
        return check_result(
            name,
            "fail",
            f"torch.cuda.is_available() is False with {expected} GPU(s) on the machine; {build}{note}",
            value=0,
            unit="GPUs",
            threshold=expected,
        )
    if count != expected:
        return check_result(
            name,
            "fail",
            f"torch sees {count} GPU(s), nvidia-smi {expected}; {build}{note}",
            value=count,
            unit="GPUs",
            threshold=expected,
        )
    return check_result(
        name, "pass", f"torch sees {count} GPU(s); {build}", value=count, unit="GPUs", threshold=expected
    )


def torch_versions(torch: Any) -> dict[str, str | None]:
    """Versions of torch and of the CUDA, cuDNN and NCCL it was built with (None where absent)."""
    try:
        nccl = format_nccl_version(torch.cuda.nccl.version())
    except (AttributeError, RuntimeError):  # CPU-only builds have no NCCL
        nccl = None
    cudnn_code = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": decode_cudnn_version(cudnn_code),
        "nccl": nccl,
    }


def describe_versions(versions: dict[str, str | None]) -> str:
    if versions["cuda"] is None:
        return f"torch {versions['torch']}, CPU-only build"
    return f"torch {versions['torch']}, CUDA {versions['cuda']}, cuDNN {versions['cudnn']}, NCCL {versions['nccl']}"


def release_parts(version: str | None) -> tuple[str, ...]:
    """major.minor.patch of a version: '8.9.2.26' -> ('8', '9', '2'), '2.21.5' -> ('2', '21', '5')."""
    return tuple(re.findall(r"\d+", version or "")[:3])


def compare_torch_libraries(
    versions: dict[str, str | None] | None, expected: dict[str, str | None], system: dict[str, str | None]
) -> dict[str, Any]:
    """torch's own cuDNN and NCCL against the expected bundled builds, on major.minor.patch.

    Per library {"torch", "expected", "outcome"}: "match", "differs", "no CUDA"
    (a CPU-only torch has neither library: nothing to compare, and no failure
    of its own) or "not compared" (nothing expected, or torch gave no
    version); plus "system": the dpkg versions of the system's packages,
    which torch's wheels do not load.
    """
    cpu_only = versions is not None and versions.get("cuda") is None
    compared: dict[str, Any] = {}
    for library in ("cudnn", "nccl"):
        own = (versions or {}).get(library)
        wanted = expected.get(library) or None
        if cpu_only:
            outcome = "no CUDA"
        elif not wanted or not own:
            outcome = "not compared"
        else:
            outcome = "match" if release_parts(own) == release_parts(wanted) else "differs"
        compared[library] = {"torch": own, "expected": wanted, "outcome": outcome}
    compared["system"] = dict(system)
    return compared


LIBRARY_NAMES = {"cudnn": "cuDNN", "nccl": "NCCL"}


def describe_torch_libraries(compared: dict[str, Any]) -> str:
    """ "torch's own cuDNN 9.1.0 (expected 9.1.0.70), NCCL 2.21.5 (expected 2.21.5); system cuDNN
    8.9.2.26-1+cuda12.1, NCCL not installed", or for a CPU-only torch: "torch's own cuDNN/NCCL: none, the torch
    build has no CUDA; system ..."."""
    if all(compared[library]["outcome"] == "no CUDA" for library in LIBRARY_NAMES):
        own = "torch's own cuDNN/NCCL: none, the torch build has no CUDA"
    else:
        parts = []
        for library, title in LIBRARY_NAMES.items():
            entry = compared[library]
            expected = f"expected {entry['expected']}" if entry["expected"] else "no expected build"
            parts.append(f"{title} {entry['torch'] or 'unavailable'} ({expected})")
        own = "torch's own " + ", ".join(parts)
    system = ", ".join(
        f"{title} {compared['system'].get(library) or 'not installed'}" for library, title in LIBRARY_NAMES.items()
    )
    return f"{own}; system {system}"


def torch_build_versions(probe: Probe) -> dict[str, str | None] | None:
    """What torch was built with: CUDA, and its own cuDNN and NCCL; None when torch is not installed.

    A CUDA build imports and answers on any machine, with or without a GPU
    (cudnnGetVersion and ncclGetVersion need no device): it is imported. A
    CPU-only build without a GPU is read from its installed files instead,
    as it has nothing more to say. Raises ImportError (or OSError, from a
    broken CUDA library) when a CUDA build does not import.
    """
    if not probe.gpu_present:
        installed = installed_torch()
        if installed is None or installed["cuda"] is None:
            return installed
    torch = probe.torch
    if torch is None:
        raise ImportError(probe.torch_error)
    return torch_versions(torch)


def check_libraries(probe: Probe) -> dict[str, Any]:
    """CUDA, cuDNN and NCCL behind torch, which need no GPU to be read: --expect-cuda compares the CUDA
    release torch was built for (major.minor), --expect-torch-cudnn / --expect-torch-nccl torch's own cuDNN /
    NCCL (major.minor.patch); the system's packages are listed apart. Whether the GPUs are there to use
    them is nvidia_smi's and torch_cuda's business (--expect-gpus, --require-gpus)."""
    name, expect = "libraries", probe.args.expect_cuda
    expected = {"cudnn": probe.args.expect_torch_cudnn, "nccl": probe.args.expect_torch_nccl}
    try:
        versions = torch_build_versions(probe)
    except Exception as exc:  # ImportError, or OSError from a broken CUDA library
        if probe.gpu_present:  # torch_cuda fails on it already
            return check_result(name, "skipped", "torch not importable (see torch_cuda)", threshold=expect)
        return check_result(name, "fail", f"torch not importable: {exc}", threshold=expect)
    if versions is None:  # torch_cuda fails on it
        if expect:
            return check_result(
                name,
                "fail",
                f"torch is not installed, expected a build for CUDA {expect} (--expect-cuda)",
                threshold=expect,
            )
        if not probe.gpu_present:
            return no_gpu(name, probe, "torch is not installed")
        return check_result(name, "skipped", "torch is not installed (see torch_cuda)")
    compared = compare_torch_libraries(versions, expected, probe.system_libraries)
    gpu_note = [] if probe.gpu_present else ["no GPU here to use them (see torch_cuda)"]
    if versions["cuda"] is None and not probe.gpu_present:
        # A CPU-only build on a machine without GPUs: nothing of CUDA to read,
        # unless CUDA was expected of it.
        build = f"torch {versions['torch']}, CPU-only build; " + describe_torch_libraries(compared)
        if expect:
            return check_result(
                name,
                "fail",
                f"torch is a CPU-only build, expected one for CUDA {expect} (--expect-cuda); {build}",
                value=versions,
                threshold=expect,
                torch_libraries=compared,
            )
        result = no_gpu(name, probe, build)
        result["value"] = versions
        result["torch_libraries"] = compared
        return result
    failures = []
    if versions["cuda"] is None:
        failures.append("CPU-only torch build")
    elif expect and versions["cuda"].split(".")[:2] != expect.split(".")[:2]:
        failures.append(f"torch built for CUDA {versions['cuda']}, expected {expect}")
    if versions["cudnn"] is None:
        failures.append("cuDNN not available")
    if versions["nccl"] is None:
        failures.append("NCCL not available")
    for library, title in LIBRARY_NAMES.items():
        entry = compared[library]
        if entry["outcome"] == "differs":
            failures.append(
                f"torch's own {title} is {entry['torch']}, the matrix's bundled build is {entry['expected']} "
                "(the wheel's nvidia package was replaced, or torch is not the release the matrix names)"
            )
    detail = "; ".join(failures + [describe_versions(versions), describe_torch_libraries(compared)] + gpu_note)
    return check_result(
        name, "fail" if failures else "pass", detail, value=versions, threshold=expect, torch_libraries=compared
    )


def measure_gemm(torch: Any, index: int, n: int) -> dict[str, Any]:
    """TFLOP/s of an n x n x n matmul on GPU `index`: bf16 (fp16 before Ampere), timed with CUDA events."""
    device = torch.device("cuda", index)
    props = torch.cuda.get_device_properties(device)
    dtype = torch.bfloat16 if props.major >= 8 else torch.float16
    a = b = c = None
    with torch.cuda.device(device):
        try:
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            c = torch.empty(n, n, device=device, dtype=dtype)
            for _warmup in range(GEMM_WARMUP):
                torch.matmul(a, b, out=c)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _iteration in range(GEMM_ITERS):
                torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
            finite = bool(torch.isfinite(c).all())
        finally:
            del a, b, c
            torch.cuda.empty_cache()
    return {
        "index": index,
        "name": props.name,
        "uuid": str(getattr(props, "uuid", "")) or None,
        "dtype": str(dtype).replace("torch.", ""),
        "tflops": gemm_tflops(n, GEMM_ITERS, seconds),
        "finite": finite,
    }


def slowest_gpu(per_gpu: list[dict[str, Any]], figure: str) -> tuple[dict[str, Any], str, str]:
    """(the GPU with the lowest figure, the worst verdict of all, the details to show: those of the GPUs
    that did not pass, else the slowest one's) of a measured check's per-GPU results."""
    slowest = min(per_gpu, key=lambda g: g[figure])
    shown = [g for g in per_gpu if g["verdict"] != "pass"] or [slowest]
    return slowest, health.verdict_of(per_gpu), "; ".join(g["detail"] for g in shown)


def check_gemm(probe: Probe) -> dict[str, Any]:
    """Matmul TFLOP/s of every GPU against a fraction of its model's achievable figure; value = the slowest."""
    name, args = "gemm", probe.args
    skip = gpu_prerequisite(name, probe)
    if skip:
        return skip
    n = args.gemm_size or (QUICK_GEMM_SIZE if args.quick else GEMM_SIZE)
    per_gpu = []
    for index in range(probe.cuda_device_count):
        measured = measure_gemm(probe.torch, index, n)
        judged = judge_gemm(measured["name"], measured["tflops"], args.gemm_min_fraction)
        if not measured["finite"]:
            judged.update(verdict="fail", detail=f"non-finite values in the matmul output; {judged['detail']}")
        per_gpu.append({**measured, **judged, "detail": f"GPU {index} {judged['detail']}"})
    slowest, verdict, details = slowest_gpu(per_gpu, "tflops")
    detail = f"n={n} {slowest['dtype']}; {details}"
    return check_result(
        name, verdict, detail, value=slowest["tflops"], unit="TFLOP/s", threshold=slowest["threshold"], per_gpu=per_gpu
    )


def membw_bytes(requested_mib: int, total_memory: int) -> int:
    """The buffer memory_bandwidth copies: requested_mib MiB, at most 1/MEMBW_MAX_SHARE of the GPU's memory
    (the device copy holds two buffers), in whole MiB and at least 1 MiB."""
    cap_mib = max(1, int(total_memory) // MEMBW_MAX_SHARE // 2**20)
    return min(requested_mib, cap_mib) * 2**20


def measure_memory_bandwidth(torch: Any, index: int, mib: int) -> dict[str, Any]:
    """GB/s of GPU `index`: a device-to-device copy (read + write counted), then device->host and host->device
    copies through pinned host memory, each MEMBW_WARMUP times untimed and MEMBW_ITERS times between CUDA
    events. ``correct``: the device copy equals its source, and so does the round trip through the host."""
    device = torch.device("cuda", index)
    props = torch.cuda.get_device_properties(device)
    nbytes = membw_bytes(mib, props.total_memory)
    src = dst = host = None

    def timed(copy: Callable[[], Any]) -> float:
        for _warmup in range(MEMBW_WARMUP):
            copy()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _iteration in range(MEMBW_ITERS):
            copy()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    src = dst = host = None
    with torch.cuda.device(device):
        try:
            src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            device_s = timed(lambda: dst.copy_(src))
            correct = bool(torch.equal(dst, src))
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            d2h_s = timed(lambda: host.copy_(src, non_blocking=True))
            dst.zero_()
            h2d_s = timed(lambda: dst.copy_(host, non_blocking=True))
            correct = correct and bool(torch.equal(dst, src))
        finally:
            src = dst = host = None  # the buffers freed before empty_cache, also when one was never allocated
            torch.cuda.empty_cache()
    return {
        "index": index,
        "name": props.name,
        "uuid": str(getattr(props, "uuid", "")) or None,
        "size_mib": nbytes // 2**20,
        "memory_bandwidth_gbps": device_copy_gbps(nbytes, MEMBW_ITERS, device_s),
        "h2d_gbps": host_copy_gbps(nbytes, MEMBW_ITERS, h2d_s),
        "d2h_gbps": host_copy_gbps(nbytes, MEMBW_ITERS, d2h_s),
        "correct": correct,
    }


def gpu_record(probe: Probe, measured: dict[str, Any]) -> dict[str, Any]:
    """The nvidia-smi -q -x record of a measured GPU (by UUID, else index; with its PCI device ID), else its
    name as torch reports it."""
    records = probe.smi_details[0] or []
    uuid = (measured.get("uuid") or "").lower()
    return (
        next((r for r in records if uuid and (r.get("uuid") or "").lower().endswith(uuid)), None)
        or next((r for r in records if r.get("index") == measured["index"]), None)
        or {"name": measured["name"], "pci_device_id": None}
    )


# memory_bandwidth's figures: (profile field, what it judges, [(measured key, how the detail names it)]).
MEMBW_FLOORS = (
    ("memory_bandwidth_gbps", "memory_bandwidth", [("memory_bandwidth_gbps", "device memory")]),
    ("h2d_gbps", "h2d", [("h2d_gbps", "H2D"), ("d2h_gbps", "D2H")]),
)


def judge_memory_bandwidth(
    measured: dict[str, Any], profile: str, figures: dict[str, tuple[Any, str]]
) -> dict[str, Any]:
    """One GPU's copies against its profile: device memory against ``memory_bandwidth_gbps``, H2D and D2H
    against ``h2d_gbps`` (Azure's check_gpu_bw judges both directions by it). A figure the profile lacks
    (any figure of an unknown model) is reported, not judged; a GPU of which nothing was judged warns.
    {"profile", "verdict", "detail", "memory_bandwidth_floor", "memory_bandwidth_source", "h2d_floor",
    "h2d_source", and per measured figure "<figure>_verdict": "pass", "fail" or "not judged"}."""
    unknown = profile == profiles.DEFAULT_PROFILE
    out: dict[str, Any] = {"profile": profile}
    parts, verdicts = [], []
    for field, prefix, keys in MEMBW_FLOORS:
        floor = figures.get(field)
        out[f"{prefix}_floor"], out[f"{prefix}_source"] = (float(floor[0]), floor[1]) if floor else (None, None)
        shown = " / ".join(f"{label} {measured[key]:.1f}" for key, label in keys) + " GB/s"
        if floor is None:
            out.update({f"{key[: -len('_gbps')]}_verdict": "not judged" for key, _label in keys})
            parts.append(
                shown
                if unknown
                else f"{shown} not judged (the {profile} profile has no {field} floor; set one in "
                "gpu_verify_profile_overrides)"
            )
            continue
        below = [label for key, label in keys if measured[key] < floor[0]]
        for key, label in keys:
            judged = "fail" if label in below else "pass"
            out[f"{key[: -len('_gbps')]}_verdict"] = judged
            verdicts.append(judged)
        relation = (
            "floor" if not below else "below the floor" if len(keys) == 1 else f"{' and '.join(below)} below the floor"
        )
        parts.append(f"{shown}, {relation} {floor[0]:g} of {profile} ({floor[1]})")
    if unknown:
        parts.append(f"not judged ({UNKNOWN_MODEL_NOTE})")
    verdict = "fail" if "fail" in verdicts else "pass" if verdicts else "warn"
    if not measured["correct"]:
        verdict, parts = "fail", ["the copied data differ from their source"] + parts
    return {**out, "verdict": verdict, "detail": f"GPU {measured['index']} {measured['name']}: " + "; ".join(parts)}


def check_memory_bandwidth(probe: Probe) -> dict[str, Any]:
    """Device memory bandwidth and host<->device copies of every GPU against its profile's floors (DCGM's,
    Azure's; profiles); value = the slowest GPU's device memory bandwidth."""
    name, args = "memory_bandwidth", probe.args
    skip = gpu_prerequisite(name, probe)
    if skip:
        return skip
    mib = QUICK_MEMBW_MIB if args.quick else MEMBW_MIB
    per_gpu = []
    for index in range(probe.cuda_device_count):
        measured = measure_memory_bandwidth(probe.torch, index, mib)
        record = gpu_record(probe, measured)
        profile, figures = profiles.find_profile(record.get("name"), record.get("pci_device_id"), probe.profile_table)
        per_gpu.append({**measured, **judge_memory_bandwidth(measured, profile, figures)})
    slowest, verdict, details = slowest_gpu(per_gpu, "memory_bandwidth_gbps")
    detail = f"{slowest['size_mib']} MiB copies; {details}"
    return check_result(
        name,
        verdict,
        detail,
        value=slowest["memory_bandwidth_gbps"],
        unit="GB/s",
        threshold=slowest["memory_bandwidth_floor"],
        per_gpu=per_gpu,
        h2d_gbps=slowest["h2d_gbps"],
        d2h_gbps=slowest["d2h_gbps"],
        host_copy_min_gbps=min(min(g["h2d_gbps"], g["d2h_gbps"]) for g in per_gpu),
        size_mib=slowest["size_mib"],
        profile=slowest["profile"],
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allreduce_worker(rank: int, world_size: int, port: int, nbytes: int, result_file: str) -> None:
    """One rank of the all-reduce benchmark (module level: torch.multiprocessing spawns it by name)."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=ALLREDUCE_TIMEOUT_S),
    )
    try:
        ranks_plus_one = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(ranks_plus_one)  # sum of 1..world_size on every rank
        expected = world_size * (world_size + 1) / 2
        correct = torch.tensor([int(bool((ranks_plus_one == expected).all()))], device=device)
        dist.all_reduce(correct, op=dist.ReduceOp.MIN)

        buffer = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
        for _warmup in range(ALLREDUCE_WARMUP):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        dist.barrier(device_ids=[rank])
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _iteration in range(ALLREDUCE_ITERS):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - began], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        if rank == 0:
            Path(result_file).write_text(
                json.dumps({"seconds": elapsed.item() / ALLREDUCE_ITERS, "correct": bool(correct.item())})
            )
    finally:
        dist.destroy_process_group()


def measure_allreduce(world_size: int, nbytes: int, timeout: float = ALLREDUCE_TIMEOUT_S) -> dict[str, Any]:
    """{"seconds": per all-reduce, "correct": bool}: one process per GPU, NCCL over a loopback rendezvous."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gpufleet-allreduce-") as tmp:
        result_file = os.path.join(tmp, "result.json")
        context = mp.spawn(
            allreduce_worker, args=(world_size, free_port(), nbytes, result_file), nprocs=world_size, join=False
        )
        deadline = time.monotonic() + timeout
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                    process.join()
                raise TimeoutError(f"all-reduce did not finish within {timeout:g} s")
        return json.loads(Path(result_file).read_text())


def sku_allreduce_floor(probe: Probe, world: int) -> tuple[dict[str, Any] | None, str]:
    """({"floor", "size_mib", "profile", "source"}, "") of the GPUs' per-SKU all-reduce floor for world GPUs
    (profiles: Azure's 8-GPU figures, each at its message size), or (None, why there is none). The model
    is read from nvidia-smi -q -x (PCI device ID, then name), else from nvidia-smi's names."""
    records = probe.smi_details[0] or [{"name": gpu.get("name"), "pci_device_id": None} for gpu in probe.smi.gpus]
    keys = sorted(
        {profiles.find_profile(gpu.get("name"), gpu.get("pci_device_id"), probe.profile_table)[0] for gpu in records}
    )
    if not keys or keys == [profiles.DEFAULT_PROFILE]:
        return None, "unknown model: no per-SKU floor"
    if len(keys) > 1:
        return None, f"mixed models ({', '.join(keys)}): no per-SKU floor"
    key = keys[0]
    profile = profiles.figures(probe.profile_table[key])
    floor, size = profiles.allreduce_floor(profile, world), profiles.allreduce_size_mib(profile, world)
    if floor is None or size is None:
        return None, f"the {key} profile has no all-reduce floor for {world} GPUs"
    return {"floor": floor[0], "size_mib": size[0], "profile": key, "source": floor[1]}, ""


def check_allreduce_busbw(probe: Probe) -> dict[str, Any]:
    """NCCL all-reduce bus bandwidth over every GPU of the machine, against the GPUs' per-SKU floor at its
    message size where the profile has one (NVLink/NVSwitch nodes), else the flat --busbw-min-* floor."""
    name, args = "allreduce_busbw", probe.args
    skip = gpu_prerequisite(name, probe, min_gpus=2)
    if skip:
        return skip
    world = probe.cuda_device_count
    links, topology_error = probe.topology
    nvlink = links is not None and len(links) == world and all_pairs_nvlink(links)
    fabric = "nvlink" if nvlink else "pcie"
    sku, no_sku = sku_allreduce_floor(probe, world) if nvlink else (None, "PCIe: no per-SKU floor")
    mib = args.allreduce_mib or (QUICK_ALLREDUCE_MIB if args.quick else (sku["size_mib"] if sku else ALLREDUCE_MIB))
    if sku and mib >= sku["size_mib"]:  # bus bandwidth grows with the message: the floor holds at its size and above
        threshold, basis = sku["floor"], f"the {sku['profile']} floor at {sku['size_mib']} MiB ({sku['source']})"
    else:
        threshold = args.busbw_min_nvlink if nvlink else args.busbw_min_pcie
        why = (
            f"the {sku['profile']} floor {sku['floor']:g} holds at {sku['size_mib']} MiB, this run is {mib} MiB"
            if sku
            else no_sku
        )
        basis = f"the flat {'NVLink/NVSwitch' if nvlink else 'PCIe'} floor ({why})"
    nbytes = mib * 2**20

    timing = measure_allreduce(world, nbytes)
    busbw = bus_bandwidth_gbps(nbytes, timing["seconds"], world)
    summary = f"{busbw:.1f} GB/s bus bandwidth, {world} GPUs, {mib} MiB float32, threshold {threshold:g}: {basis}"
    if topology_error:
        summary += f"; topology unknown: {topology_error}"
    if not timing["correct"]:
        verdict, detail = "fail", f"wrong all-reduce result; {summary}"
    else:
        verdict, detail = ("pass" if busbw >= threshold else "fail"), summary
    return check_result(
        name,
        verdict,
        detail,
        value=busbw,
        unit="GB/s",
        threshold=threshold,
        algbw_gbps=nbytes / timing["seconds"] / 1e9,
        world_size=world,
        size_mib=mib,
        fabric=fabric,
        floor_profile=sku["profile"] if sku and threshold == sku["floor"] else None,
    )


def peer_access(probe: Probe, count: int) -> tuple[list[list[bool | None]] | None, str]:
    """torch.cuda.can_device_access_peer for every pair (None on the diagonal), or (None, why not)."""
    if probe.torch is None:
        return None, "P2P not tested: torch not importable"
    if probe.cuda_device_count != count:
        return None, f"P2P not tested: torch sees {probe.cuda_device_count} GPU(s), topology {count}"
    can_access = probe.torch.cuda.can_device_access_peer
    return [[None if i == j else bool(can_access(i, j)) for j in range(count)] for i in range(count)], ""


def check_p2p_topology(probe: Probe) -> dict[str, Any]:
    """The link between every GPU pair (nvidia-smi topo -m) and CUDA peer access."""
    name = "p2p_topology"
    if not probe.gpu_present:
        return no_gpu(name, probe)
    if probe.expected_gpu_count < 2:
        return check_result(name, "skipped", f"needs 2 or more GPUs, the machine has {probe.expected_gpu_count}")
    links, error = probe.topology
    if links is None:
        return check_result(name, "fail", error)
    p2p, note = peer_access(probe, len(links))
    verdict, detail = judge_topology(links, p2p)
    if p2p is None and verdict == "pass":
        verdict = "warn"  # the links were read, peer access was not tested: not a pass
    return check_result(name, verdict, detail + (f"; {note}" if note else ""), value={"links": links, "p2p": p2p})


# --------------------------------------------------------------------------- training (the payload)


def check_training(probe: Probe) -> dict[str, Any]:
    """The DDP payload on every GPU of the machine (or --train-nproc CPU ranks); value = samples/s."""
    name, args = "training", probe.args
    if probe.torch is None:
        return check_result(name, "fail", f"torch not importable: {probe.torch_error}")
    nproc = args.train_nproc or probe.cuda_device_count or TRAIN_CPU_NPROC
    run = launcher.run_training(
        nproc, payload_args=launcher.default_payload_args(nproc), timeout=args.train_timeout, payload=args.payload
    )
    result = probe.training_result = run["result"]
    if result is None:
        return check_result(
            name,
            "fail",
            f"no result from the payload (torchrun rc {run['rc']}): {launcher.failure_summary(run)}",
            unit="samples/s",
            log_tail=run["log_tail"],
            failures=run["failures"],
        )
    verdict = result.get("verdict", "fail")
    reasons = list(result.get("reasons") or [])
    if run["rc"] != 0 and verdict == "pass":
        verdict, reasons = "fail", reasons + [f"torchrun rc {run['rc']}"]
    samples = result.get("samples_per_s")
    detail = (
        f"world size {result.get('world_size')} on {result.get('device')}, {result.get('steps')} steps, "
        f"amp {result.get('amp')}, {samples or 0:.0f} samples/s" + "".join(f"; {r}" for r in reasons)
    )
    extra = {"log_tail": run["log_tail"]} if verdict != "pass" else {}
    return check_result(name, verdict, detail, value=samples, unit="samples/s", **extra)


# --------------------------------------------------------------------------- report


CHECKS: dict[str, Callable[[Probe], dict[str, Any]]] = {
    "driver_version": check_driver_version,
    "nvidia_smi": check_nvidia_smi,
    "torch_cuda": check_torch_cuda,
    "libraries": check_libraries,
    "gemm": check_gemm,
    "memory_bandwidth": check_memory_bandwidth,
    "allreduce_busbw": check_allreduce_busbw,
    "p2p_topology": check_p2p_topology,
    **health_checks.HEALTH_CHECKS,  # gpu_errors, pcie, clocks, nvlink, xid, interconnect, dcgm
    "training": check_training,
}


def run_check(name: str, probe: Probe) -> dict[str, Any]:
    """One check; skipped "by request" with --skip, and a failure (not a crash) when it raises."""
    if name in probe.args.skip:
        return check_result(name, "skipped", "by request")
    try:
        return CHECKS[name](probe)
    except Exception as exc:
        return check_result(
            name, "fail", f"check raised {type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:]
        )


def report_versions(probe: Probe) -> dict[str, str | None]:
    try:
        versions: dict[str, str | None] = torch_build_versions(probe) or {}
    except Exception:  # a broken torch is the checks' business, not the report's
        versions = {}
    system = probe.system_libraries
    return {
        "driver_installed": probe.driver.installed,
        "driver_loaded": probe.driver.loaded,
        "cuda": versions.get("cuda"),
        "torch": versions.get("torch"),
        "cudnn": versions.get("cudnn"),
        "nccl": versions.get("nccl"),
        "python": platform.python_version(),
        "system_cudnn": system.get("cudnn"),
        "system_nccl": system.get("nccl"),
        **driver_fact_versions(probe.driver_fact[0]),
    }


def fact_text(value: Any) -> str | None:
    """A fact's field as a version string: None for an absent, empty or non-scalar one."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    return str(value).strip() or None


def driver_fact_versions(fact: dict[str, Any] | None) -> dict[str, str | None]:
    """The report's driver_requested/_pinned/_source from the fact: a requested_version of "" (the role's
    default branch release) is "default"."""
    if fact is None:
        return {"driver_requested": None, "driver_pinned": None, "driver_source": None}
    requested = fact.get("requested_version")
    if isinstance(requested, str) and not requested.strip():
        requested = "default"
    return {
        "driver_requested": fact_text(requested),
        "driver_pinned": fact_text(fact.get("pinned_version")),
        "driver_source": fact_text(fact.get("source")),
    }


def report_gpus(probe: Probe, checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """nvidia-smi's GPUs with the gemm figure of each (matched by UUID, else by index)."""
    gpus = [dict(gpu) for gpu in probe.smi.gpus]
    gemm = next((c for c in checks if c["name"] == "gemm"), {})
    for measured in gemm.get("per_gpu", []):
        uuid = (measured["uuid"] or "").lower()
        match = next((g for g in gpus if uuid and g["uuid"].lower().endswith(uuid)), None) or next(
            (g for g in gpus if g["index"] == measured["index"]), None
        )
        if match is None:
            match = {
                "index": measured["index"],
                "name": measured["name"],
                "uuid": measured["uuid"],
                "pci_bus_id": None,
                "memory_total_mib": None,
                "persistence_mode": None,
                "ecc_uncorrected": None,
            }
            gpus.append(match)
        match["gemm_tflops"] = measured["tflops"]
        match["gemm_of_achievable"] = measured.get("of_achievable")
    return gpus


def nothing_passed(checks: list[dict[str, Any]]) -> str:
    """The reason of a run in which no check passed and none failed: what was (not) checked."""
    counts = Counter(c["verdict"] for c in checks)
    why = (
        "no GPU"
        if any(c["verdict"] == "skipped" and c["detail"].startswith("no GPU") for c in checks)
        else "every check was skipped"
    )
    if counts["warn"]:
        return f"no check passed: {counts['warn']} warned, {counts['skipped']} skipped ({why})"
    return f"nothing was checked: {why} ({counts['skipped']} checks skipped)"


def finding_actions(checks: list[dict[str, Any]]) -> dict[str, int]:
    """{action class: findings of the checks that ask for it}, every class of health.ACTION_CLASSES."""
    counts = Counter(f.get("action_class") for c in checks for f in c.get("findings") or [])
    return {klass: counts[klass] for klass in health.ACTION_CLASSES}


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected checks and assemble the JSON report (see the module docstring)."""
    started, clock = datetime.now(timezone.utc), time.perf_counter()
    probe = Probe(args)
    names = [name for name in CHECKS if name != "training" or args.train]
    checks = [run_check(name, probe) for name in names]
    reasons = [f"{c['name']}: {c['detail']}" for c in checks if c["verdict"] == "fail"]
    if not reasons and not any(c["verdict"] == "pass" for c in checks):
        reasons = [nothing_passed(checks)]
    report = {
        "schema": SCHEMA,
        "host": socket.gethostname(),
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "duration_s": 0.0,
        "verdict": "fail" if reasons else "pass",
        "reasons": reasons,
        "reboot_required": any(c.get("reboot_required") for c in checks),
        "actions": finding_actions(checks),
        "versions": report_versions(probe),
        "gpus": report_gpus(probe, checks),
        "gpu_count_pci": probe.pci_gpu_count,
        "checks": checks,
        "notes": [note for note in (probe.driver_fact[1],) if note],
    }
    if args.train:
        report["training"] = probe.training_result
    report["duration_s"] = round(time.perf_counter() - clock, 3)
    return finite_or_none(report)


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The human summary: one line per check, then the verdict."""
    labels = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "skipped": "SKIP"}
    lines = [f"{labels.get(c['verdict'], c['verdict'].upper())} {c['name']}: {c['detail']}" for c in report["checks"]]
    counts = Counter(c["verdict"] for c in report["checks"])
    tally = ", ".join(f"{counts[v]} {v}" for v in ("pass", "warn", "skipped", "fail"))
    lines.append(f"verdict: {report['verdict'].upper()} on {report['host']} ({tally}, {report['duration_s']:.1f} s)")
    if report["verdict"] == "fail" and not counts["fail"]:
        lines.append(report["reasons"][0])  # "nothing was checked: no GPU": say what, not just FAIL
    if report["reboot_required"]:
        lines.append("reboot required")
    lines.extend(f"note: {note}" for note in report.get("notes") or [])
    return lines
