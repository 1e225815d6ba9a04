"""GPU health checks for gpufleet nodes: a library of small checks and a CLI.

Each check measures one thing and judges it against a threshold. In order:

``driver_version``   the loaded nvidia kernel module against the installed
                     userspace driver (libnvidia-ml / libcuda): after a driver
                     upgrade without a reboot they differ ("Driver/library
                     version mismatch") and the check asks for a reboot.
``nvidia_smi``       the GPU inventory from nvidia-smi: count (``--expect-gpus``),
                     uncorrected ECC errors (``--max-ecc-errors``), persistence mode.
``torch_cuda``       torch imports, CUDA is available, torch sees every GPU.
``libraries``        the CUDA, cuDNN and NCCL versions torch was built with
                     (``--expect-cuda 12.1`` compares major.minor).
``gemm``             square bf16 matmul TFLOP/s on every GPU (fp16 before Ampere)
                     against ``--gemm-min-fraction`` x the datasheet figure.
``allreduce_busbw``  NCCL all-reduce bus bandwidth over all GPUs of the node,
                     against a floor for NVLink/NVSwitch or for PCIe machines.
``p2p_topology``     ``nvidia-smi topo -m`` links and CUDA peer access per pair.
``training``         (``--train`` only) the DDP payload train.py under torchrun
                     on every GPU of the machine.

A check's verdict is "pass", "fail", "warn" or "skipped". On a machine without
GPUs the GPU checks are "skipped" with the detail "no GPU" (never "pass");
``--require-gpus`` makes that a failure. A check that raises is reported as a
failure, with the exception; it never stops the other checks.

Commands
--------
::

    python3 gpufleet_check.py                  # every check, human summary
    python3 gpufleet_check.py --json           # the JSON report on stdout
    python3 gpufleet_check.py --train          # also train on every GPU of the machine
    python3 gpufleet_check.py --quick --skip allreduce_busbw --output /tmp/check.json
    python3 gpufleet_check.py --metrics-file /var/lib/prometheus/node-exporter/gpufleet.prom
    python3 gpufleet_check.py --help

Multi-node training (the same command on every node; prints one JSON object
{"rc", "node", "result", "log_tail", "failures", "failed_ranks"}, where
"result" is the payload's result on the node that got global rank 0 and null
elsewhere, and "failures" the workers torchrun's error summary lists (host,
rank, exit code: negative when killed by that signal), described one per line
in "failed_ranks")::

    python3 gpufleet_check.py train --nnodes 2 --nproc-per-node 8 \\
        --rdzv-endpoint node1:29500 --rdzv-id smoke1 [--timeout 600] [-- payload args...]

It runs ``torchrun --rdzv-backend=c10d --max-restarts=0`` on train.py (beside
this file, else /opt/gpufleet/payload/train.py, or ``--payload PATH``). Without
payload args the payload gets ``--steps 40 --amp auto --grad-accum 2`` and a
global batch that the world size divides. When ``--timeout`` (default 600 s)
expires, torchrun and its workers are killed and rc is 124.

JSON report (``--json``, or ``--output PATH``)
----------------------------------------------
::

    {"schema": "gpufleet-check/1", "host": str, "started": "2024-01-01T00:00:00Z",
     "duration_s": float, "verdict": "pass" | "fail",
     "reasons": ["<check name>: <detail>", ...],        # one per failed check
     "reboot_required": bool,
     "versions": {"driver_installed", "driver_loaded", "cuda", "torch", "cudnn",
                  "nccl", "python"},                    # str or null each
     "gpus": [{"index": int, "name": str, "uuid": str, "pci_bus_id": str,
               "memory_total_mib": int | null, "persistence_mode": bool | null,
               "ecc_uncorrected": int | null, "gemm_tflops": float | null}],
     "gpu_count_pci": int,
     "checks": [{"name", "verdict", "value", "unit", "threshold", "detail", ...}],
     "training": {...}}                                 # the payload's result, --train only

Checks may carry more keys: ``reboot_required`` (driver_version, nvidia_smi),
``per_gpu`` (gemm), ``algbw_gbps``/``world_size``/``size_mib``/``fabric``
(allreduce_busbw), ``log_tail`` (training), ``traceback`` (a check that
raised). Non-finite numbers are written as null.

Prometheus metrics (``--metrics-file PATH``)
--------------------------------------------
The result is also written in Prometheus' text exposition format, for node
exporter's textfile collector (``/var/lib/prometheus/node-exporter/gpufleet.prom``
with the monitoring role). The file is replaced atomically (a temporary file
in the same directory, then a rename; mode 0644), so the collector never reads
half a file; the directory must exist. A file that cannot be written is named
on stderr and changes neither the report nor the exit code (the staleness
alert on ``gpufleet_verify_timestamp_seconds`` catches it)::

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
    gpufleet_allreduce_busbw_bytes_per_second{fabric}  all-reduce bus bandwidth (GB/s x 1e9)

A version that is unknown is an empty label; a figure that was not measured
(no GPU, check skipped) is left out rather than written as 0.

Exit codes: 0 pass, 1 fail, 2 usage error. The ``train`` subcommand exits
with torchrun's code (0 when the payload passed, 124 on timeout).

Only the standard library is needed to start; torch is imported when a check
needs it, so the script runs, and reports torch as missing, under a python
without torch. Options for tests: ``--sysfs-pci-dir``, ``--module-version-file``,
``--driver-proc-file``, ``--driver-lib-dir`` and the nvidia-smi found on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import glob
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

SCHEMA = "gpufleet-check/1"
EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_TIMEOUT = 124  # the `train` subcommand, like coreutils' timeout

# Dense tensor-core TFLOP/s per GPU model: bf16 (fp16 on V100 and T4, which
# have no bf16), fp32 accumulation, NO sparsity. Sources: the NVIDIA datasheet
# of each data-centre product (the dense figure, half the "with sparsity" one)
# and the Ampere / Ada GeForce whitepapers (FP16 tensor with FP32 accumulate).
# Matched in this order against the GPU name as whole words ("A10" does not
# match "A100"), so the more specific names come first.
GEMM_REFERENCE_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM5 / HBM3
    ("H800 PCIe", 756.0),
    ("H800", 989.0),
    ("H20", 148.0),
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

NVIDIA_PCI_VENDOR = "0x10de"
GPU_PCI_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller (NVSwitches are bridges)
USERSPACE_LIBRARIES = ("libnvidia-ml.so.1", "libcuda.so.1")
SMI_QUERY_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "driver_version",
                    "persistence_mode", "ecc.errors.uncorrected.volatile.total")
SMI_TIMEOUT_S = 60
REBOOT_ERRORS = ("driver/library version mismatch",)

GEMM_SIZE, QUICK_GEMM_SIZE = 8192, 4096
GEMM_WARMUP, GEMM_ITERS = 3, 10
ALLREDUCE_MIB, QUICK_ALLREDUCE_MIB = 256, 32
ALLREDUCE_WARMUP, ALLREDUCE_ITERS = 5, 20
ALLREDUCE_TIMEOUT_S = 300

PAYLOAD_NAME = "train.py"
INSTALLED_PAYLOAD_DIR = Path("/opt/gpufleet/payload")
TRAIN_PAYLOAD_ARGS = ("--steps", "40", "--amp", "auto", "--grad-accum", "2")
TRAIN_GRAD_ACCUM = 2  # as in TRAIN_PAYLOAD_ARGS
PAYLOAD_GLOBAL_BATCH = 64  # train.py's default --batch-size
TRAIN_TIMEOUT_S = 600
TRAIN_CPU_NPROC = 2
LOG_TAIL_LINES = 40
STOP_GRACE_S = 5.0
DIST_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


# --------------------------------------------------------------------------- small helpers


def check_result(name: str, verdict: str, detail: str, value: Any = None, unit: str | None = None,
                 threshold: Any = None, **extra: Any) -> dict[str, Any]:
    """The dict every check returns; extra keys go after the common ones."""
    return {"name": name, "verdict": verdict, "value": value, "unit": unit,
            "threshold": threshold, "detail": detail, **extra}


def finite_or_none(value: Any) -> Any:
    """NaN and infinities become None, in nested lists and dicts too (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    return value


def read_text(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_lines(text: str, count: int = 3) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[:count] if line.strip())


# --------------------------------------------------------------------------- host facts (no torch)


def count_pci_gpus(sysfs_pci_dir: str | Path) -> int:
    """NVIDIA display/3D controllers on the PCI bus, whether or not a driver is loaded."""
    try:
        devices = sorted(os.listdir(sysfs_pci_dir))
    except OSError:
        return 0
    count = 0
    for device in devices:
        vendor = read_text(Path(sysfs_pci_dir, device, "vendor"))
        pci_class = read_text(Path(sysfs_pci_dir, device, "class")) or ""
        if vendor == NVIDIA_PCI_VENDOR and pci_class.startswith(GPU_PCI_CLASSES):
            count += 1
    return count


def parse_proc_driver_version(text: str) -> str | None:
    """The number in 'NVRM version: NVIDIA UNIX [Open] Kernel Module [for x86_64]  535.161.08  ...'."""
    first = text.splitlines()[0] if text else ""
    match = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", first + " ")
    return match.group(1) if match else None


def loaded_module_version(module_version_file: str, proc_version_file: str) -> tuple[str | None, str | None]:
    """(version, where it was read) of the nvidia kernel module in memory, or (None, None)."""
    version = read_text(module_version_file)
    if version:
        return version, module_version_file
    version = parse_proc_driver_version(read_text(proc_version_file) or "")
    if version:
        return version, proc_version_file
    return None, None


def library_version(path: str) -> str | None:
    """'.../libnvidia-ml.so.535.261.03' -> '535.261.03'; None for an unversioned name like '.so.1'."""
    match = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)*)$", path)
    return match.group(1) if match else None


def parse_ldconfig(text: str, soname: str) -> list[str]:
    """Paths `ldconfig -p` gives for soname, 64-bit entries first (32-bit copies come as plain 'libc6')."""
    entries = []
    for line in text.splitlines():
        match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if match and match.group(1) == soname:
            entries.append((match.group(2), match.group(3)))
    entries.sort(key=lambda entry: "64" not in entry[0])
    return [path for _, path in entries]


def ldconfig_paths(soname: str) -> list[str]:
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
    if ldconfig is None:
        return []
    try:
        proc = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_ldconfig(proc.stdout, soname)


def dir_paths(soname: str, lib_dirs: Sequence[str]) -> list[str]:
    """soname in each directory, else its versioned files there (newest first)."""
    stem = soname.rsplit(".", 1)[0]  # libnvidia-ml.so
    paths = []
    for lib_dir in lib_dirs:
        link = os.path.join(lib_dir, soname)
        if os.path.exists(link):
            paths.append(link)
            continue
        versioned = [p for p in glob.glob(os.path.join(lib_dir, stem + ".*")) if library_version(p)]
        paths += sorted(versioned, key=lambda p: version_key(library_version(p) or ""), reverse=True)
    return paths


def installed_driver_version(lib_dirs: Sequence[str] = ()) -> tuple[str | None, str | None]:
    """(version, resolved library path) of the userspace driver, from ldconfig or lib_dirs."""
    for soname in USERSPACE_LIBRARIES:
        paths = dir_paths(soname, lib_dirs) if lib_dirs else ldconfig_paths(soname)
        for path in paths:
            resolved = os.path.realpath(path)  # Debian: alternatives symlinks to nvidia/current/
            version = library_version(resolved)
            if version:
                return version, resolved
    return None, None


@dataclass
class SmiInventory:
    """What `nvidia-smi --query-gpu` said: the GPUs, or why there are none."""

    found: bool
    returncode: int | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    driver_version: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.found and not self.error

    @property
    def needs_reboot(self) -> bool:
        return any(text in self.error.lower() for text in REBOOT_ERRORS)


def run_nvidia_smi(*args: str) -> tuple[int | None, str]:
    """(exit code, stdout + stderr) of nvidia-smi from PATH; exit code None when it is absent."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None, "nvidia-smi not found on PATH"
    try:
        proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, f"nvidia-smi {' '.join(args)} timed out after {SMI_TIMEOUT_S} s"
    except OSError as exc:
        return -1, f"nvidia-smi could not run: {exc}"
    return proc.returncode, proc.stdout + proc.stderr


def smi_field(text: str) -> str | None:
    text = text.strip()
    return None if text in ("", "[N/A]", "N/A", "[Not Supported]", "Not Supported") else text


def smi_int(text: str) -> int | None:
    value = smi_field(text)
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def smi_bool(text: str) -> bool | None:
    return {"enabled": True, "disabled": False}.get((smi_field(text) or "").lower())


def parse_smi_query(text: str) -> tuple[list[dict[str, Any]], str | None]:
    """Rows of the --query-gpu CSV -> (GPU dicts as in the report, driver version)."""
    gpus, driver = [], None
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) != len(SMI_QUERY_FIELDS):
            raise ValueError(f"unexpected nvidia-smi line ({len(row)} fields): {','.join(row)}")
        index, name, uuid, bus_id, memory, driver_version, persistence, ecc = row
        driver = driver or smi_field(driver_version)
        gpus.append({
            "index": smi_int(index), "name": name.strip(), "uuid": uuid.strip(),
            "pci_bus_id": bus_id.strip(), "memory_total_mib": smi_int(memory),
            "persistence_mode": smi_bool(persistence), "ecc_uncorrected": smi_int(ecc),
            "gemm_tflops": None,
        })
    return gpus, driver


def query_nvidia_smi() -> SmiInventory:
    code, output = run_nvidia_smi(f"--query-gpu={','.join(SMI_QUERY_FIELDS)}",
                                  "--format=csv,noheader,nounits")
    if code is None:
        return SmiInventory(found=False, error=output)
    if code != 0:
        return SmiInventory(found=True, returncode=code,
                            error=f"nvidia-smi failed (rc {code}): {first_lines(output) or 'no output'}")
    try:
        gpus, driver = parse_smi_query(output)
    except ValueError as exc:
        return SmiInventory(found=True, returncode=code, error=str(exc))
    return SmiInventory(found=True, returncode=code, gpus=gpus, driver_version=driver)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def parse_topology(text: str) -> list[list[str]]:
    """`nvidia-smi topo -m` -> the GPU x GPU link matrix ("X", "NV18", "PIX", "SYS", ...).

    NIC rows and columns, the affinity columns and the legend are left out.
    """
    lines = [ANSI_ESCAPE.sub("", line) for line in text.splitlines()]
    header = next((line.split() for line in lines if re.search(r"\bGPU0\b", line)), None)
    if header is None:
        raise ValueError("no GPU0 column in nvidia-smi topo -m output")
    columns = 0
    while columns < len(header) and header[columns] == f"GPU{columns}":
        columns += 1
    rows = {}
    for line in lines:
        tokens = line.split()
        if tokens and re.fullmatch(r"GPU\d+", tokens[0]) and tokens != header:
            rows[int(tokens[0][3:])] = tokens[1:columns + 1]
    matrix = [rows.get(i, []) for i in range(columns)]
    if any(len(row) != columns for row in matrix):
        raise ValueError(f"nvidia-smi topo -m: expected {columns} GPU rows of {columns} links")
    return matrix


def is_nvlink(link: str) -> bool:
    return re.fullmatch(r"NV\d+", link) is not None


def gpu_pairs(count: int) -> Iterable[tuple[int, int]]:
    return ((i, j) for i in range(count) for j in range(i + 1, count))


def all_pairs_nvlink(links: list[list[str]]) -> bool:
    return len(links) >= 2 and all(is_nvlink(links[i][j]) for i, j in gpu_pairs(len(links)))


def judge_topology(links: list[list[str]], p2p: list[list[bool | None]] | None) -> tuple[str, str]:
    """Fail: an NVLink pair without peer access. Warn: a pair crossing the CPU interconnect (SYS)."""
    pairs = list(gpu_pairs(len(links)))
    kinds = Counter(links[i][j] for i, j in pairs)
    summary = f"{len(links)} GPUs, pairs: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    if p2p is not None:
        summary += f"; P2P on {sum(bool(p2p[i][j]) for i, j in pairs)}/{len(pairs)} pairs"
    broken = [f"GPU{i}-GPU{j} ({links[i][j]})" for i, j in pairs
              if is_nvlink(links[i][j]) and p2p is not None and p2p[i][j] is False]
    crossing = [f"GPU{i}-GPU{j}" for i, j in pairs if links[i][j] in ("SYS", "SOC")]
    if broken:
        return "fail", f"NVLink without peer access: {', '.join(broken)}; {summary}"
    if crossing:
        return "warn", f"pairs crossing the CPU interconnect (SYS): {', '.join(crossing)}; {summary}"
    return "pass", summary


# --------------------------------------------------------------------------- pure figures


def bus_bandwidth_gbps(nbytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth in GB/s (1e9), as nccl-tests reports it: algbw x 2(n-1)/n."""
    algbw = nbytes / seconds / 1e9
    return algbw * 2 * (world_size - 1) / world_size


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
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![A-Za-z0-9])", gpu_name, re.IGNORECASE):
            return model, tflops
    return None


def judge_gemm(gpu_name: str, tflops: float, min_fraction: float) -> tuple[str, float | None, str]:
    """(verdict, threshold, detail) for one GPU's measured TFLOP/s."""
    reference = reference_tflops(gpu_name)
    if reference is None:
        return "warn", None, f"no reference figure for {gpu_name} (measured {tflops:.1f} TFLOP/s)"
    model, expected = reference
    threshold = min_fraction * expected
    verdict = "pass" if tflops >= threshold else "fail"
    return verdict, threshold, (f"{gpu_name}: {tflops:.1f} TFLOP/s, threshold {threshold:.1f} "
                                f"({min_fraction} x {expected:g} for {model})")


# --------------------------------------------------------------------------- shared facts


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


def no_gpu(name: str, probe: Probe, note: str = "") -> dict[str, Any]:
    """Skipped "no GPU", or failed with --require-gpus."""
    detail = "no GPU" + (f" ({note})" if note else "")
    if probe.args.require_gpus:
        return check_result(name, "fail", f"{detail}; --require-gpus")
    return check_result(name, "skipped", detail)


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
        return check_result(name, verdict, detail, value=state.loaded, threshold=state.installed,
                            reboot_required=reboot, loaded_from=state.loaded_source,
                            installed_library=state.installed_path)

    if smi.needs_reboot:
        return result("fail", f"{smi.error} (loaded module {state.loaded}, installed {state.installed}): "
                              "reboot required", reboot=True)
    if state.loaded and state.installed:
        if state.loaded == state.installed:
            return result("pass", f"loaded module {state.loaded} matches the installed userspace driver")
        return result("fail", f"loaded module {state.loaded}, installed {state.installed}: "
                              "driver/library mismatch, reboot required", reboot=True)
    if state.installed:
        if pci == 0:
            return no_gpu(name, probe, f"userspace driver {state.installed} installed, module not loaded")
        return result("fail", f"userspace driver {state.installed} installed, {pci} GPU(s) on the PCI bus: "
                              "module not loaded, reboot required", reboot=True)
    if state.loaded:
        return result("fail", f"module {state.loaded} loaded but no userspace driver library "
                              f"({' / '.join(USERSPACE_LIBRARIES)}) found")
    if pci:
        return result("fail", f"{pci} GPU(s) on the PCI bus but no NVIDIA driver installed")
    return no_gpu(name, probe, "no NVIDIA driver installed")


def check_nvidia_smi(probe: Probe) -> dict[str, Any]:
    """Inventory: GPU count, uncorrected ECC errors, persistence mode."""
    name, smi, args = "nvidia_smi", probe.smi, probe.args
    if not smi.ok:
        if probe.pci_gpu_count == 0 and not smi.needs_reboot:
            return no_gpu(name, probe, smi.error)
        return check_result(name, "fail", f"{smi.error} ({probe.pci_gpu_count} GPU(s) on the PCI bus)",
                            threshold=args.expect_gpus, reboot_required=smi.needs_reboot)
    gpus, failures, warnings = smi.gpus, [], []
    if args.expect_gpus is not None and len(gpus) < args.expect_gpus:
        failures.append(f"{len(gpus)} GPU(s), expected {args.expect_gpus}")
    for gpu in gpus:
        if (gpu["ecc_uncorrected"] or 0) > args.max_ecc_errors:
            failures.append(f"GPU {gpu['index']} ({gpu['pci_bus_id']}): {gpu['ecc_uncorrected']} uncorrected "
                            f"ECC error(s), max {args.max_ecc_errors}")
    if probe.pci_gpu_count > len(gpus):
        warnings.append(f"nvidia-smi lists {len(gpus)} GPU(s), the PCI bus has {probe.pci_gpu_count}")
    no_persistence = [str(gpu["index"]) for gpu in gpus if gpu["persistence_mode"] is False]
    if no_persistence:
        warnings.append(f"persistence mode disabled on GPU {', '.join(no_persistence)}")
    models = ", ".join(f"{n} x {model}" for model, n in Counter(g["name"] for g in gpus).items())
    summary = f"{len(gpus)} GPU(s): {models or 'none'}; driver {smi.driver_version}"
    verdict = "fail" if failures else "warn" if warnings else "pass"
    return check_result(name, verdict, "; ".join(failures + warnings + [summary]), value=len(gpus),
                        unit="GPUs", threshold=args.expect_gpus, reboot_required=False)


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
        return no_gpu(name, probe, f"torch {installed['torch']}, "
                      + (f"CUDA {installed['cuda']}" if installed["cuda"] else "CPU-only build"))
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
        return check_result(name, "fail", f"torch.cuda.is_available() is False with {expected} GPU(s) "
                                          f"on the machine; {build}{note}",
                            value=0, unit="GPUs", threshold=expected)
    if count != expected:
        return check_result(name, "fail", f"torch sees {count} GPU(s), nvidia-smi {expected}; {build}{note}",
                            value=count, unit="GPUs", threshold=expected)
    return check_result(name, "pass", f"torch sees {count} GPU(s); {build}", value=count, unit="GPUs",
                        threshold=expected)


def torch_versions(torch: Any) -> dict[str, str | None]:
    """Versions of torch and of the CUDA, cuDNN and NCCL it was built with (None where absent)."""
    try:
        nccl = format_nccl_version(torch.cuda.nccl.version())
    except (AttributeError, RuntimeError):  # CPU-only builds have no NCCL
        nccl = None
    cudnn_code = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": decode_cudnn_version(cudnn_code), "nccl": nccl}


def describe_versions(versions: dict[str, str | None]) -> str:
    if versions["cuda"] is None:
        return f"torch {versions['torch']}, CPU-only build"
    return (f"torch {versions['torch']}, CUDA {versions['cuda']}, cuDNN {versions['cudnn']}, "
            f"NCCL {versions['nccl']}")


def check_libraries(probe: Probe) -> dict[str, Any]:
    """CUDA, cuDNN and NCCL behind torch; --expect-cuda compares major.minor."""
    name, expect = "libraries", probe.args.expect_cuda
    if not probe.gpu_present:  # versions from torch's files, without importing it
        versions = installed_torch()
        result = no_gpu(name, probe, (f"torch {versions['torch']}, " + (f"CUDA {versions['cuda']}" if versions["cuda"]
                                      else "CPU-only build")) if versions else "torch not importable")
        result["value"] = versions
        return result
    torch = probe.torch
    versions = torch_versions(torch) if torch is not None else None
    described = describe_versions(versions) if versions else ""
    if versions is None:
        return check_result(name, "skipped", "torch not importable (see torch_cuda)", threshold=expect)
    failures = []
    if versions["cuda"] is None:
        failures.append("CPU-only torch build")
    elif expect and versions["cuda"].split(".")[:2] != expect.split(".")[:2]:
        failures.append(f"torch built for CUDA {versions['cuda']}, expected {expect}")
    if versions["cudnn"] is None:
        failures.append("cuDNN not available")
    if versions["nccl"] is None:
        failures.append("NCCL not available")
    detail = "; ".join(failures + [described])
    return check_result(name, "fail" if failures else "pass", detail, value=versions, threshold=expect)


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
            for _ in range(GEMM_WARMUP):
                torch.matmul(a, b, out=c)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(GEMM_ITERS):
                torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
            finite = bool(torch.isfinite(c).all())
        finally:
            del a, b, c
            torch.cuda.empty_cache()
    return {"index": index, "name": props.name, "uuid": str(getattr(props, "uuid", "")) or None,
            "dtype": str(dtype).replace("torch.", ""), "tflops": gemm_tflops(n, GEMM_ITERS, seconds),
            "finite": finite}


def check_gemm(probe: Probe) -> dict[str, Any]:
    """Matmul TFLOP/s of every GPU against a fraction of its datasheet figure; value = the slowest."""
    name, args = "gemm", probe.args
    skip = gpu_prerequisite(name, probe)
    if skip:
        return skip
    n = args.gemm_size or (QUICK_GEMM_SIZE if args.quick else GEMM_SIZE)
    per_gpu = []
    for index in range(probe.cuda_device_count):
        measured = measure_gemm(probe.torch, index, n)
        verdict, threshold, detail = judge_gemm(measured["name"], measured["tflops"], args.gemm_min_fraction)
        if not measured["finite"]:
            verdict, detail = "fail", f"non-finite values in the matmul output; {detail}"
        per_gpu.append({**measured, "verdict": verdict, "threshold": threshold, "detail": f"GPU {index} {detail}"})
    slowest = min(per_gpu, key=lambda g: g["tflops"])
    verdicts = {g["verdict"] for g in per_gpu}
    verdict = "fail" if "fail" in verdicts else "warn" if "warn" in verdicts else "pass"
    shown = [g for g in per_gpu if g["verdict"] != "pass"] or [slowest]
    detail = f"n={n} {slowest['dtype']}; " + "; ".join(g["detail"] for g in shown)
    return check_result(name, verdict, detail, value=slowest["tflops"], unit="TFLOP/s",
                        threshold=slowest["threshold"], per_gpu=per_gpu)


def allreduce_worker(rank: int, world_size: int, port: int, nbytes: int, result_file: str) -> None:
    """One rank of the all-reduce benchmark (module level: torch.multiprocessing spawns it by name)."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=ALLREDUCE_TIMEOUT_S))
    try:
        ranks_plus_one = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(ranks_plus_one)  # sum of 1..world_size on every rank
        expected = world_size * (world_size + 1) / 2
        correct = torch.tensor([int(bool((ranks_plus_one == expected).all()))], device=device)
        dist.all_reduce(correct, op=dist.ReduceOp.MIN)

        buffer = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
        for _ in range(ALLREDUCE_WARMUP):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        dist.barrier(device_ids=[rank])
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(ALLREDUCE_ITERS):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - began], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        if rank == 0:
            Path(result_file).write_text(json.dumps(
                {"seconds": elapsed.item() / ALLREDUCE_ITERS, "correct": bool(correct.item())}))
    finally:
        dist.destroy_process_group()


def measure_allreduce(world_size: int, nbytes: int, timeout: float = ALLREDUCE_TIMEOUT_S) -> dict[str, Any]:
    """{"seconds": per all-reduce, "correct": bool}: one process per GPU, NCCL over a loopback rendezvous."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gpufleet-allreduce-") as tmp:
        result_file = os.path.join(tmp, "result.json")
        context = mp.spawn(allreduce_worker, args=(world_size, free_port(), nbytes, result_file),
                           nprocs=world_size, join=False)
        deadline = time.monotonic() + timeout
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                    process.join()
                raise TimeoutError(f"all-reduce did not finish within {timeout:g} s")
        return json.loads(Path(result_file).read_text())


def check_allreduce_busbw(probe: Probe) -> dict[str, Any]:
    """NCCL all-reduce bus bandwidth over every GPU of the machine."""
    name, args = "allreduce_busbw", probe.args
    skip = gpu_prerequisite(name, probe, min_gpus=2)
    if skip:
        return skip
    world = probe.cuda_device_count
    mib = args.allreduce_mib or (QUICK_ALLREDUCE_MIB if args.quick else ALLREDUCE_MIB)
    nbytes = mib * 2**20
    links, topology_error = probe.topology
    nvlink = links is not None and len(links) == world and all_pairs_nvlink(links)
    threshold = args.busbw_min_nvlink if nvlink else args.busbw_min_pcie
    fabric = "nvlink" if nvlink else "pcie"

    timing = measure_allreduce(world, nbytes)
    busbw = bus_bandwidth_gbps(nbytes, timing["seconds"], world)
    summary = (f"{busbw:.1f} GB/s bus bandwidth, {world} GPUs, {mib} MiB float32, "
               f"threshold {threshold:g} ({'NVLink/NVSwitch' if nvlink else 'PCIe'})")
    if topology_error:
        summary += f"; topology unknown: {topology_error}"
    if not timing["correct"]:
        verdict, detail = "fail", f"wrong all-reduce result; {summary}"
    else:
        verdict, detail = ("pass" if busbw >= threshold else "fail"), summary
    return check_result(name, verdict, detail, value=busbw, unit="GB/s", threshold=threshold,
                        algbw_gbps=nbytes / timing["seconds"] / 1e9, world_size=world, size_mib=mib,
                        fabric=fabric)


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
    return check_result(name, verdict, detail + (f"; {note}" if note else ""),
                        value={"links": links, "p2p": p2p})


# --------------------------------------------------------------------------- training (torchrun)


def find_payload() -> Path:
    """train.py beside this file, else the installed copy."""
    beside = Path(__file__).resolve().with_name(PAYLOAD_NAME)
    return beside if beside.is_file() else INSTALLED_PAYLOAD_DIR / PAYLOAD_NAME


def default_payload_args(world_size: int) -> list[str]:
    """TRAIN_PAYLOAD_ARGS with the payload's global batch, rounded up so every rank gets whole micro-batches."""
    parts = world_size * TRAIN_GRAD_ACCUM
    batch = parts * math.ceil(PAYLOAD_GLOBAL_BATCH / parts)
    return [*TRAIN_PAYLOAD_ARGS, "--batch-size", str(batch)]


def torchrun_command(nproc: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None,
                     rdzv_id: str | None, payload: Path, payload_args: Sequence[str],
                     result_file: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}"]
    if rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id or 'gpufleet'}", "--max-restarts=0"]
    return cmd + [str(payload), *payload_args, "--result", str(result_file), "--json"]


def process_stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) from /proc/<pid>/stat, or None when the process is gone."""
    stat = read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ..., starttime (field 22)
    return int(fields[1]), fields[0], fields[19]


def descendants(root: int) -> list[tuple[int, str]]:
    """(pid, start time) of root's descendants; torchrun puts each worker in a session of its own."""
    children: dict[int, list[int]] = defaultdict(list)
    started: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        stat = process_stat(int(entry)) if entry.isdigit() else None
        if stat is not None:
            children[stat[0]].append(int(entry))
            started[int(entry)] = stat[2]
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in started:
            found.append((pid, started[pid]))
        todo += children.get(pid, [])
    return found


def alive(process: tuple[int, str]) -> bool:
    """The same process (not a reused pid) still running, zombies counting as gone."""
    stat = process_stat(process[0])
    return stat is not None and stat[2] == process[1] and stat[1] not in ("Z", "X")


def signal_processes(group_leader: int, processes: Iterable[tuple[int, str]], sig: int) -> None:
    """Send sig to torchrun's process group and to each of its workers still alive."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group_leader, sig)
    for process in processes:
        if alive(process):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process[0], sig)


def stop_process_tree(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM torchrun's process group and every worker; SIGKILL what is left after `grace` seconds."""
    workers = descendants(proc.pid)
    signal_processes(proc.pid, workers, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or any(alive(w) for w in workers)):
        workers += [w for w in descendants(proc.pid) if w not in workers]
        time.sleep(0.1)
    signal_processes(proc.pid, workers, signal.SIGKILL)
    proc.wait()


def wait_or_stop(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """(exit code, note): torchrun's code, or 124 and a note when `timeout` expires."""
    try:
        return proc.wait(timeout=timeout), ""
    except subprocess.TimeoutExpired:
        stop_process_tree(proc)
        return EXIT_TIMEOUT, f"timed out after {timeout:g} s"
    except BaseException:  # KeyboardInterrupt, SystemExit from SIGTERM: leave no workers behind
        stop_process_tree(proc)
        raise


def drop_printed_result(lines: list[str]) -> list[str]:
    """Leave out the payload's --json copy of its result (a block from "{" to "}"); it is in "result"."""
    kept, inside = [], False
    for line in lines:
        inside = inside or line == "{"
        if not inside:
            kept.append(line)
        inside = inside and line != "}"
    return kept


def log_tail(log_file: Path, note: str) -> str:
    lines = drop_printed_result((read_text(log_file) or "").splitlines())[-LOG_TAIL_LINES:]
    return "\n".join(lines + ([note] if note else []))


FAILURE_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)$")


def worker_failures(log_text: str) -> list[dict[str, Any]]:
    """The failed workers torchrun lists in its error summary ("Failures:" and
    "Root Cause"): host, global rank, exit code (negative: killed by that
    signal) and cause, each rank once, in torchrun's order."""
    failures: dict[int, dict[str, Any]] = {}
    entry: dict[str, str] = {}

    def keep() -> None:
        rank = re.match(r"-?\d+", entry.get("rank", ""))
        code = re.match(r"-?\d+", entry.get("exitcode", ""))
        if rank and code and int(rank.group()) not in failures:
            failures[int(rank.group())] = {"host": entry.get("host", ""), "rank": int(rank.group()),
                                           "exitcode": int(code.group()), "cause": entry.get("traceback", "")}

    for line in log_text.splitlines():
        if re.match(r"^\s*\[\d+\]:\s*$", line):
            keep()
            entry = {}
        elif match := FAILURE_FIELD.match(line):
            entry[match.group(1)] = match.group(2).strip()
    keep()
    return list(failures.values())


def describe_failure(failure: dict[str, Any]) -> str:
    """One line for a failed worker: killed by a signal, or its exit code."""
    where = f"rank {failure['rank']} on {failure['host'] or 'an unknown host'}"
    code = failure["exitcode"]
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{where} was killed by signal {-code} ({name})"
    return f"{where} exited with code {code}"


def training_env(tmpdir: Path | None = None) -> dict[str, str]:
    """The launcher's environment: no inherited rank variables; with ``tmpdir``, torchrun's
    and the workers' temporary files (torchelastic_*, ...) go there and leave with it."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return env


def run_training(nproc: int, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
                 rdzv_id: str | None = None, payload_args: Sequence[str] = (),
                 timeout: float = TRAIN_TIMEOUT_S, payload: str | Path | None = None) -> dict[str, Any]:
    """Run the payload under torchrun: {"rc", "result" (on the node with global rank 0, else None), "log_tail"}.

    Without rdzv_endpoint it is a --standalone single-node run; with it, the c10d
    rendezvous of a multi-node run. torchrun starts in a session of its own so
    that a timeout can stop it with all its workers (rc 124).
    """
    payload = Path(payload) if payload else find_payload()
    if not payload.is_file():
        return {"rc": EXIT_USAGE, "result": None, "log_tail": f"payload not found: {payload}", "failures": []}
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-train-"))
    try:
        result_file, log_file = workdir / "result.json", workdir / "torchrun.log"
        cmd = torchrun_command(nproc, nnodes, node_rank, rdzv_endpoint, rdzv_id, payload, payload_args,
                               result_file)
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=training_env(workdir), start_new_session=True)
        rc, note = wait_or_stop(proc, timeout)
        result_text = read_text(result_file)
        return {"rc": rc, "result": json.loads(result_text) if result_text else None,
                "log_tail": log_tail(log_file, note), "failures": worker_failures(read_text(log_file) or "")}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def check_training(probe: Probe) -> dict[str, Any]:
    """The DDP payload on every GPU of the machine (or --train-nproc CPU ranks); value = samples/s."""
    name, args = "training", probe.args
    if probe.torch is None:
        return check_result(name, "fail", f"torch not importable: {probe.torch_error}")
    nproc = args.train_nproc or probe.cuda_device_count or TRAIN_CPU_NPROC
    run = run_training(nproc, payload_args=default_payload_args(nproc), timeout=args.train_timeout,
                       payload=args.payload)
    result = probe.training_result = run["result"]
    last_line = run["log_tail"].splitlines()[-1:] or ["no output"]
    if result is None:
        return check_result(name, "fail", f"no result from the payload (torchrun rc {run['rc']}): {last_line[0]}",
                            unit="samples/s", log_tail=run["log_tail"])
    verdict = result.get("verdict", "fail")
    reasons = list(result.get("reasons") or [])
    if run["rc"] != 0 and verdict == "pass":
        verdict, reasons = "fail", reasons + [f"torchrun rc {run['rc']}"]
    samples = result.get("samples_per_s")
    detail = (f"world size {result.get('world_size')} on {result.get('device')}, {result.get('steps')} steps, "
              f"amp {result.get('amp')}, {samples or 0:.0f} samples/s" + "".join(f"; {r}" for r in reasons))
    extra = {"log_tail": run["log_tail"]} if verdict != "pass" else {}
    return check_result(name, verdict, detail, value=samples, unit="samples/s", **extra)


# --------------------------------------------------------------------------- report


CHECKS: dict[str, Callable[[Probe], dict[str, Any]]] = {
    "driver_version": check_driver_version,
    "nvidia_smi": check_nvidia_smi,
    "torch_cuda": check_torch_cuda,
    "libraries": check_libraries,
    "gemm": check_gemm,
    "allreduce_busbw": check_allreduce_busbw,
    "p2p_topology": check_p2p_topology,
    "training": check_training,
}


def run_check(name: str, probe: Probe) -> dict[str, Any]:
    """One check; skipped "by request" with --skip, and a failure (not a crash) when it raises."""
    if name in probe.args.skip:
        return check_result(name, "skipped", "by request")
    try:
        return CHECKS[name](probe)
    except Exception as exc:
        return check_result(name, "fail", f"check raised {type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc()[-4000:])


def report_versions(probe: Probe) -> dict[str, str | None]:
    try:
        if not probe.gpu_present:  # no import without a GPU (see check_torch_cuda)
            versions: dict[str, str | None] = installed_torch() or {}
        else:
            versions = torch_versions(probe.torch) if probe.torch is not None else {}
    except Exception:  # a broken torch is the checks' business, not the report's
        versions = {}
    return {"driver_installed": probe.driver.installed, "driver_loaded": probe.driver.loaded,
            "cuda": versions.get("cuda"), "torch": versions.get("torch"), "cudnn": versions.get("cudnn"),
            "nccl": versions.get("nccl"), "python": platform.python_version()}


def report_gpus(probe: Probe, checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """nvidia-smi's GPUs with the gemm figure of each (matched by UUID, else by index)."""
    gpus = [dict(gpu) for gpu in probe.smi.gpus]
    gemm = next((c for c in checks if c["name"] == "gemm"), {})
    for measured in gemm.get("per_gpu", []):
        uuid = (measured["uuid"] or "").lower()
        match = next((g for g in gpus if uuid and g["uuid"].lower().endswith(uuid)), None) \
            or next((g for g in gpus if g["index"] == measured["index"]), None)
        if match is None:
            match = {"index": measured["index"], "name": measured["name"], "uuid": measured["uuid"],
                     "pci_bus_id": None, "memory_total_mib": None, "persistence_mode": None,
                     "ecc_uncorrected": None}
            gpus.append(match)
        match["gemm_tflops"] = measured["tflops"]
    return gpus


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected checks and assemble the JSON report (see the module docstring)."""
    started, clock = datetime.now(timezone.utc), time.perf_counter()
    probe = Probe(args)
    names = [name for name in CHECKS if name != "training" or args.train]
    checks = [run_check(name, probe) for name in names]
    failed = [c for c in checks if c["verdict"] == "fail"]
    report = {
        "schema": SCHEMA,
        "host": socket.gethostname(),
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "duration_s": 0.0,
        "verdict": "fail" if failed else "pass",
        "reasons": [f"{c['name']}: {c['detail']}" for c in failed],
        "reboot_required": any(c.get("reboot_required") for c in checks),
        "versions": report_versions(probe),
        "gpus": report_gpus(probe, checks),
        "gpu_count_pci": probe.pci_gpu_count,
        "checks": checks,
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
    if report["reboot_required"]:
        lines.append("reboot required")
    return lines


# --------------------------------------------------------------------------- Prometheus metrics


# Every metric the writer emits: name -> (type, help). The monitoring role's
# alert rules use these names (tests/unit/test_monitoring_role.py checks that
# every gpufleet_* name in the rules is here).
METRICS: dict[str, tuple[str, str]] = {
    "gpufleet_verify_passed": ("gauge", "1 when the node passed gpufleet verification, 0 when it failed."),
    "gpufleet_verify_timestamp_seconds": ("gauge", "Unix time the gpufleet verification finished."),
    "gpufleet_verify_duration_seconds": ("gauge", "Seconds the gpufleet verification took."),
    "gpufleet_reboot_required": ("gauge", "1 when the node needs a reboot (loaded driver module is not the installed driver)."),
    "gpufleet_versions_info": ("gauge", "Driver (installed and loaded), CUDA, cuDNN, NCCL, torch and Python versions; "
                                        "empty: unknown."),
    "gpufleet_check_status": ("gauge", "1 for the verdict of each gpufleet check (status: pass, fail, warn, skipped), "
                                       "0 for the other verdicts."),
    "gpufleet_gpus": ("gauge", "GPUs nvidia-smi lists."),
    "gpufleet_pci_gpus": ("gauge", "NVIDIA GPUs on the PCI bus."),
    "gpufleet_gemm_flops_per_second": ("gauge", "Measured dense bf16 (fp16 before Ampere) matmul FLOP/s of each GPU."),
    "gpufleet_gpu_ecc_uncorrected_errors": ("gauge", "Volatile uncorrected ECC errors of each GPU."),
    "gpufleet_allreduce_busbw_bytes_per_second": ("gauge", "All-reduce bus bandwidth over every GPU of the node, bytes/s."),
}
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
    samples["gpufleet_versions_info"].append(({"host": report.get("host"), **{
        key: versions.get(key) for key in ("driver_installed", "driver_loaded", "cuda", "cudnn", "nccl", "torch", "python")}},
        1))
    for check in report.get("checks") or []:
        for status in CHECK_VERDICTS:
            samples["gpufleet_check_status"].append(({"check": check["name"], "status": status},
                                                     check.get("verdict") == status))
    gpus = report.get("gpus") or []
    samples["gpufleet_gpus"].append(({}, len(gpus)))
    samples["gpufleet_pci_gpus"].append(({}, int(report.get("gpu_count_pci") or 0)))
    for gpu in gpus:
        labels = {"gpu": gpu.get("index"), "model": gpu.get("name"), "uuid": gpu.get("uuid")}
        if gpu.get("gemm_tflops") is not None:
            samples["gpufleet_gemm_flops_per_second"].append((labels, float(gpu["gemm_tflops"]) * 1e12))
        if gpu.get("ecc_uncorrected") is not None:
            samples["gpufleet_gpu_ecc_uncorrected_errors"].append((labels, int(gpu["ecc_uncorrected"])))
    allreduce = next((c for c in report.get("checks") or [] if c.get("name") == "allreduce_busbw"), {})
    if isinstance(allreduce.get("value"), (int, float)) and not isinstance(allreduce.get("value"), bool):
        samples["gpufleet_allreduce_busbw_bytes_per_second"].append(
            ({"fabric": allreduce.get("fabric")}, float(allreduce["value"]) * 1e9))
    return samples


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
            lines.append(f"{name}{{{rendered}}} {format_metric_value(value)}" if rendered
                         else f"{name} {format_metric_value(value)}")
    return "\n".join(lines) + "\n"


def write_metrics(report: dict[str, Any], path: str | Path) -> None:
    """Replace ``path`` atomically with the report's metrics: a temporary file beside it, then os.replace.

    The temporary name starts with a dot and does not end in .prom, so node
    exporter's textfile collector never reads it. Raises OSError (the
    temporary file removed) when the directory is missing or not writable.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(metrics_text(report))
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), METRICS_FILE_MODE)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


# --------------------------------------------------------------------------- command line


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def major_minor(text: str) -> str:
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR like 12.1, got {text!r}")
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Multi-node training: gpufleet_check.py train --help. Exit codes: 0 pass, 1 fail, 2 usage.")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the summary")
    p.add_argument("--output", type=Path, metavar="PATH", help="also write the JSON report to this file")
    p.add_argument("--metrics-file", type=Path, metavar="PATH",
                   help="also write the result as Prometheus metrics (text format, replaced atomically, mode 0644) "
                        "to this file, e.g. node exporter's textfile directory; the directory must exist")
    p.add_argument("--require-gpus", action="store_true", help="'no GPU' is a failure, not a skip")
    p.add_argument("--skip", action="append", default=[], choices=list(CHECKS), metavar="CHECK",
                   help=f"leave a check out (repeatable): {', '.join(CHECKS)}")
    p.add_argument("--quick", action="store_true",
                   help=f"smaller sizes: gemm n={QUICK_GEMM_SIZE}, all-reduce {QUICK_ALLREDUCE_MIB} MiB")
    p.add_argument("--expect-gpus", type=non_negative_int, metavar="N", help="fail with fewer GPUs than this")
    p.add_argument("--expect-cuda", type=major_minor, metavar="X.Y",
                   help="CUDA release torch must be built for, e.g. 12.1")
    p.add_argument("--max-ecc-errors", type=non_negative_int, default=0, metavar="N",
                   help="most uncorrected (volatile) ECC errors per GPU (default 0)")
    p.add_argument("--gemm-size", type=positive_int, metavar="N", help=f"matrix size n (default {GEMM_SIZE})")
    p.add_argument("--gemm-min-fraction", type=float, default=0.5, metavar="F",
                   help="least fraction of the datasheet TFLOP/s (default 0.5)")
    p.add_argument("--allreduce-mib", type=positive_int, metavar="MIB",
                   help=f"all-reduce size in MiB (default {ALLREDUCE_MIB})")
    p.add_argument("--busbw-min-nvlink", type=float, default=100.0, metavar="GBPS",
                   help="least bus bandwidth, GB/s, when all GPU pairs are NVLink/NVSwitch (default 100)")
    p.add_argument("--busbw-min-pcie", type=float, default=5.0, metavar="GBPS",
                   help="least bus bandwidth, GB/s, otherwise (default 5)")
    p.add_argument("--train", action="store_true", help="also run the training payload on every GPU")
    p.add_argument("--train-nproc", type=positive_int, metavar="N",
                   help=f"training processes (default: one per GPU, {TRAIN_CPU_NPROC} without GPUs)")
    p.add_argument("--train-timeout", type=positive_int, default=TRAIN_TIMEOUT_S, metavar="S",
                   help=f"seconds before training is stopped (default {TRAIN_TIMEOUT_S})")
    p.add_argument("--payload", type=Path, metavar="PATH", help="train.py to run (default: beside this file)")
    where = p.add_argument_group("where host facts are read (tests point these at fake files)")
    where.add_argument("--sysfs-pci-dir", default="/sys/bus/pci/devices", metavar="DIR",
                       help="PCI devices, each with vendor and class files (default %(default)s)")
    where.add_argument("--module-version-file", default="/sys/module/nvidia/version", metavar="PATH",
                       help="version of the loaded nvidia module (default %(default)s)")
    where.add_argument("--driver-proc-file", default="/proc/driver/nvidia/version", metavar="PATH",
                       help="its fallback, an 'NVRM version:' line (default %(default)s)")
    where.add_argument("--driver-lib-dir", action="append", metavar="DIR",
                       help="look for libnvidia-ml/libcuda here instead of asking ldconfig (repeatable)")
    return p.parse_args(argv)


def split_payload_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(own options, payload args): everything after the first "--" belongs to the payload."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def parse_train_args(argv: Sequence[str]) -> argparse.Namespace:
    own, payload_args = split_payload_args(argv)
    p = argparse.ArgumentParser(
        prog="gpufleet_check.py train",
        usage="%(prog)s [options] [-- payload args...]",
        description="Run the training payload under torchrun on this node and print one JSON object "
                    '{"rc", "node", "result", "log_tail"}. Run the same command on every node.',
        epilog=f"Without payload args: {' '.join(TRAIN_PAYLOAD_ARGS)} and a divisible --batch-size.")
    p.add_argument("--nnodes", type=positive_int, default=1, metavar="N", help="nodes in the job (default 1)")
    p.add_argument("--nproc-per-node", type=positive_int, required=True, metavar="P",
                   help="processes on this node, one per GPU")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="c10d rendezvous (required with --nnodes > 1; without it: --standalone)")
    p.add_argument("--rdzv-id", default="gpufleet", metavar="ID", help="job id, the same on every node")
    p.add_argument("--timeout", type=positive_int, default=TRAIN_TIMEOUT_S, metavar="S",
                   help=f"seconds before torchrun and its workers are killed, rc 124 (default {TRAIN_TIMEOUT_S})")
    p.add_argument("--payload", type=Path, metavar="PATH", help="train.py to run (default: beside this file)")
    args = p.parse_args(own)
    if args.nnodes > 1 and not args.rdzv_endpoint:
        p.error("--nnodes > 1 needs --rdzv-endpoint")
    args.payload_args = payload_args or default_payload_args(args.nnodes * args.nproc_per_node)
    return args


def raise_system_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def train_main(argv: Sequence[str]) -> int:
    """The `train` subcommand."""
    args = parse_train_args(argv)
    signal.signal(signal.SIGTERM, raise_system_exit)  # a killed subcommand still stops torchrun
    run = run_training(args.nproc_per_node, nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                       payload_args=args.payload_args, timeout=args.timeout, payload=args.payload)
    print(json.dumps(finite_or_none({"rc": run["rc"], "node": socket.gethostname(), "result": run["result"],
                                     "log_tail": run["log_tail"], "failures": run["failures"],
                                     "failed_ranks": [describe_failure(f) for f in run["failures"]]}),
                     indent=2, allow_nan=False), flush=True)
    return run["rc"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        return train_main(argv[1:])
    args = parse_args(argv)  # exits 2 on a bad option
    report = build_report(args)
    text = json.dumps(report, indent=2, allow_nan=False)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    if args.metrics_file is not None:
        try:
            write_metrics(report, args.metrics_file)
        except OSError as exc:
            print(f"gpufleet_check: metrics not written to {args.metrics_file}: {exc}", file=sys.stderr, flush=True)
    print(text if args.json else "\n".join(summary_lines(report)), flush=True)
    return EXIT_PASS if report["verdict"] == "pass" else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
