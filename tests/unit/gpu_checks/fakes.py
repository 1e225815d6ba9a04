"""What the gpu_checks tests share: the fake host, the nvidia-smi outputs it prints, the CLI run in a
subprocess and the stand-ins for torch and for the measurements."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gpufleet_check import checks, cli

from .payload_path import PYZ

# The passive health checks and DCGM's diagnostic (health_checks; test_health_*.py)
HEALTH_CHECKS = ("gpu_errors", "pcie", "clocks", "nvlink", "xid", "interconnect", "dcgm")
GPU_CHECKS = (
    "driver_version",
    "nvidia_smi",
    "libraries",
    "gemm",
    "memory_bandwidth",
    "allreduce_busbw",
    "p2p_topology",
    *HEALTH_CHECKS,
)
REPORT_KEYS = {
    "schema",
    "host",
    "started",
    "duration_s",
    "verdict",
    "reasons",
    "reboot_required",
    "actions",
    "versions",
    "gpus",
    "gpu_count_pci",
    "checks",
    "notes",
}
CHECK_KEYS = {"name", "verdict", "value", "unit", "threshold", "detail"}
GPU_KEYS = {
    "index",
    "name",
    "uuid",
    "pci_bus_id",
    "memory_total_mib",
    "persistence_mode",
    "ecc_uncorrected",
    "gemm_tflops",
    "gemm_of_achievable",
}

# --------------------------------------------------------------------------- nvidia-smi outputs


def h100_listing(ecc: dict[int, str] | None = None, persistence: dict[int, str] | None = None) -> str:
    """`nvidia-smi --query-gpu=... --format=csv,noheader,nounits` of a healthy 8 x H100 SXM node."""
    ecc, persistence = ecc or {}, persistence or {}
    return "".join(
        f"{i}, NVIDIA H100 80GB HBM3, GPU-4b0c8a3e-21f7-3c55-9e1d-0000000000{i:02d}, "
        f"00000000:{0x18 + 0x11 * i:02X}:00.0, 81559, 535.161.08, {persistence.get(i, 'Enabled')}, "
        f"{ecc.get(i, '0')}\n"
        for i in range(8)
    )


CONSUMER_LISTING = (
    "0, NVIDIA GeForce RTX 4090, GPU-9d1e0000-0000-0000-0000-000000000000, 00000000:01:00.0, "
    "24564, 535.161.08, [N/A], [N/A]\n"
    "1, NVIDIA GeForce RTX 4090, GPU-9d1e0000-0000-0000-0000-000000000001, 00000000:02:00.0, "
    "[Not Supported], 535.161.08, Disabled, [Not Supported]\n"
)

MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.261\n"


def dgx_topology() -> str:
    """`nvidia-smi topo -m` of an 8-GPU NVSwitch machine with 4 NICs: ANSI header, tabs, legend."""
    gpus, nics = [f"GPU{i}" for i in range(8)], [f"NIC{i}" for i in range(4)]
    header = "\t\x1b[4m" + "\t".join(gpus + nics + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"
    rows = []
    for i in range(8):
        links = [" X " if i == j else "NV18" for j in range(8)]
        pcie = ["PXB" if n == i // 2 else "SYS" for n in range(4)]
        rows.append(
            "\t".join(
                [
                    f"GPU{i}",
                    *links,
                    *pcie,
                    "0-55,112-167" if i < 4 else "56-111,168-223",
                    "0" if i < 4 else "1",
                    "",
                    "N/A",
                ]
            )
        )
    for n in range(4):
        gpu_links = ["PXB" if n == i // 2 else "SYS" for i in range(8)]
        nic_links = [" X " if n == m else "SYS" for m in range(4)]
        rows.append("\t".join([f"NIC{n}", *gpu_links, *nic_links]))
    legend = [
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
        "",
        "NIC Legend:",
        "",
    ]
    legend += [f"  NIC{n}: mlx5_{n}" for n in range(4)]
    return "\n".join([header, *rows, *legend]) + "\n"


def nvlink_topology(gpus: int) -> str:
    """`nvidia-smi topo -m` of gpus GPUs joined pairwise by NVLink (dgx_topology's layout, without NICs)."""
    names = [f"GPU{i}" for i in range(gpus)]
    rows = ["\t" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    rows += [
        "\t".join([f"GPU{i}", *(" X " if i == j else "NV18" for j in range(gpus)), "0-55", "0", "", "N/A"])
        for i in range(gpus)
    ]
    return "\n".join(rows) + "\n\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"


PCIE_TOPOLOGY = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tSYS\t0-15\t0\t\tN/A\n"
    "GPU1\tSYS\t X \t16-31\t1\t\tN/A\n"
    "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
)

PCIE_LISTING = "".join(
    f"{i}, NVIDIA L40S, GPU-7e000000-0000-0000-0000-00000000000{i}, "
    f"00000000:{0x41 + 0x40 * i:02X}:00.0, 46068, 535.161.08, Enabled, 0\n"
    for i in range(2)
)


NO_DEVICES = "No devices were found\n"  # nvidia-smi's output, rc 6, when the driver answers but sees no GPU


# --------------------------------------------------------------------------- the fake host


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class FakeHost:
    """A fake machine under tmp_path; argv() gives the check's options that point at it."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.bin, self.sysfs, self.libs = root / "bin", root / "sysfs", root / "libs"
        for directory in (self.bin, self.sysfs, self.libs):
            directory.mkdir()
        self.module_file, self.proc_file = root / "module-version", root / "proc-version"
        monkeypatch.setenv("PATH", str(self.bin))  # the fake nvidia-smi, and no other one

    def nvidia_smi(self, query: str, topology: str = "", rc: int = 0) -> None:
        """nvidia-smi printing `topology` for `topo -m`, else `query`; exit code rc either way."""
        script = self.bin / "nvidia-smi"
        script.write_text(
            f"#!/bin/sh\n"
            f"if [ \"$1\" = topo ]; then printf '%s' {shell_quote(topology)}; exit {rc}; fi\n"
            f"printf '%s' {shell_quote(query)}\nexit {rc}\n"
        )
        script.chmod(0o755)

    def pci_device(self, address: str, vendor: str = "0x10de", pci_class: str = "0x030200") -> None:
        device = self.sysfs / address
        device.mkdir()
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(pci_class + "\n")

    def pci_gpus(self, count: int) -> None:
        for i in range(count):
            self.pci_device(f"0000:{0x18 + i:02x}:00.0")

    def loaded_module(self, version: str) -> None:
        self.module_file.write_text(version + "\n")

    def userspace_driver(self, version: str) -> Path:
        library = self.libs / f"libnvidia-ml.so.{version}"
        library.write_text("")
        return library

    def driver_fact(self, output: str, executable: bool = True) -> Path:
        """The nvidia_driver role's local fact: a shell script printing output, or (not executable) output itself."""
        fact = self.root / "nvidia_driver.fact"
        fact.write_text(f"#!/bin/sh\nprintf '%s\\n' {shell_quote(output)}\n" if executable else output + "\n")
        fact.chmod(0o755 if executable else 0o644)
        return fact

    def argv(self, *extra: str) -> list[str]:
        return [
            "--sysfs-pci-dir",
            str(self.sysfs),
            "--module-version-file",
            str(self.module_file),
            "--driver-proc-file",
            str(self.proc_file),
            "--driver-lib-dir",
            str(self.libs),
            *extra,
        ]


# --------------------------------------------------------------------------- helpers


def probe(host: FakeHost, *extra: str) -> Any:
    return checks.Probe(cli.parse_args(host.argv(*extra)))


def run_cli(host: FakeHost, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI (gpufleet_check.pyz) in a subprocess, with the fake host and a torch that cannot be imported."""
    blocker = host.root / "no-torch" / "torch"
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / "__init__.py").write_text('raise ImportError("torch is blocked by the test")\n')
    env = {**os.environ, "PATH": str(host.bin), "PYTHONPATH": str(blocker.parent), "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, str(PYZ), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in report["checks"]}


def fake_torch(gpus: int, peer_access: Any = lambda i, j: True) -> SimpleNamespace:
    """Just enough of torch for the checks' logic; the measurements themselves are monkeypatched."""
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: gpus, can_device_access_peer=peer_access)
    return SimpleNamespace(cuda=cuda)


def with_torch(p: Any, torch: SimpleNamespace) -> Any:
    p.__dict__["torch"] = torch  # what the cached property would hold
    return p


def membw_measure(
    name: str = "NVIDIA H100 80GB HBM3",
    device: dict[int, float] | None = None,
    h2d: dict[int, float] | None = None,
    d2h: dict[int, float] | None = None,
    uuids: list[str] | None = None,
    correct: bool = True,
    sizes: list[int] | None = None,
) -> Any:
    """measure_memory_bandwidth's stand-in: GPU i copies at 2900 + i GB/s on the device, 55 H2D, 53 D2H, unless
    device/h2d/d2h say otherwise for it; torch's UUID form (no "GPU-")."""
    device, h2d, d2h = device or {}, h2d or {}, d2h or {}

    def measure(torch: Any, index: int, mib: int) -> dict[str, Any]:
        if sizes is not None:
            sizes.append(mib)
        return {
            "index": index,
            "name": name,
            "uuid": (uuids or [f"4b0c8a3e-21f7-3c55-9e1d-0000000000{index:02d}"] * 8)[index],
            "size_mib": mib,
            "memory_bandwidth_gbps": device.get(index, 2900.0 + index),
            "h2d_gbps": h2d.get(index, 55.0),
            "d2h_gbps": d2h.get(index, 53.0),
            "correct": correct,
        }

    return measure


def fake_smi_that_records(host: FakeHost) -> Path:
    """nvidia-smi that leaves a file behind when it runs: whether any check started."""
    marker = host.root / "nvidia-smi-ran"
    script = host.bin / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n: > {marker}\nexit 9\n")
    script.chmod(0o755)
    return marker
