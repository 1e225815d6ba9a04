"""Unit tests for the GPU health checks (roles/payload/files/gpufleet_check/, shipped as
gpufleet_check.pyz), without torch and without a GPU.

The modules are imported from the package (roles/payload/files on sys.path); the
command line runs gpufleet_check.pyz, the file the nodes receive, in a subprocess
(tests/unit/test_gpufleet_check_pyz.py checks that it is built from these sources).

The host is faked: an ``nvidia-smi`` shell script first (and alone) on PATH,
sysfs PCI device directories with vendor/class files, a module version file,
a /proc/driver/nvidia/version file and a directory of driver libraries, all in
tmp_path and handed over with the check's own test options. torch is blocked
in this process (``sys.modules["torch"] = None``) and, for the CLI runs in a
subprocess, by a ``torch`` package on PYTHONPATH that raises ImportError, so
the tests behave the same whether or not the venv has torch.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jinja2
import pytest
import yaml

PAYLOAD_DIR = Path(__file__).resolve().parents[2] / "roles" / "payload" / "files"
PYZ = PAYLOAD_DIR / "gpufleet_check.pyz"
if str(PAYLOAD_DIR) not in sys.path:
    sys.path.insert(0, str(PAYLOAD_DIR))

from gpufleet_check import checks, cli, common, facts, launcher, metrics  # noqa: E402  (after the sys.path entry)

# The passive health checks and DCGM's diagnostic (health_checks; tests/unit/test_gpu_health.py)
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


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError


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


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    return FakeHost(tmp_path, monkeypatch)


@pytest.fixture
def driver_only(host: FakeHost) -> FakeHost:
    """A machine with the NVIDIA driver loaded and installed but no GPU (the lab's nodes): driver_version passes."""
    host.loaded_module("535.261.03")
    host.userspace_driver("535.261.03")
    return host


@pytest.fixture
def healthy_h100(host: FakeHost) -> FakeHost:
    host.nvidia_smi(h100_listing(), dgx_topology())
    host.pci_gpus(8)
    host.loaded_module("535.161.08")
    host.userspace_driver("535.161.08")
    return host


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


# --------------------------------------------------------------------------- PCI bus and driver versions


def test_pci_gpus_counted_from_sysfs(host: FakeHost) -> None:
    host.pci_device("0000:18:00.0", pci_class="0x030200")  # 3D controller (data-centre GPU)
    host.pci_device("0000:01:00.0", pci_class="0x030000")  # VGA controller (workstation GPU)
    host.pci_device("0000:05:00.0", pci_class="0x068000")  # NVSwitch: a bridge, not a GPU
    host.pci_device("0000:00:02.0", vendor="0x8086", pci_class="0x030000")  # Intel graphics
    assert facts.count_pci_gpus(host.sysfs) == 2
    assert facts.count_pci_gpus(host.root / "missing") == 0


@pytest.mark.parametrize(
    "line, version",
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Feb 20 01:02:03 UTC 2024", "535.161.08"),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.261.03  Release Build  (dvs-builder@U16)",
            "535.261.03",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.54.15  Release Build", "550.54.15"),
        ("garbage", None),
    ],
)
def test_proc_driver_version_parsing(line: str, version: str | None) -> None:
    assert facts.parse_proc_driver_version(line + "\nGCC version:  gcc version 12.2.0\n") == version


def test_userspace_version_through_debian_alternatives(host: FakeHost) -> None:
    """libnvidia-ml.so.1 -> /etc/alternatives/... -> nvidia/current/libnvidia-ml.so.<version>."""
    current = host.root / "x86_64-linux-gnu" / "nvidia" / "current"
    current.mkdir(parents=True)
    (current / "libnvidia-ml.so.535.261.03").write_text("")
    (current / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.535.261.03")
    alternative = host.root / "etc-alternatives-nvidia--libnvidia-ml.so.1-x86_64-linux-gnu"
    alternative.symlink_to(current / "libnvidia-ml.so.1")
    lib_dir = host.root / "x86_64-linux-gnu"
    (lib_dir / "libnvidia-ml.so.1").symlink_to(alternative)
    version, path = facts.installed_driver_version([str(lib_dir)])
    assert version == "535.261.03"
    assert path == str((current / "libnvidia-ml.so.535.261.03").resolve())


def test_userspace_version_falls_back_to_libcuda(host: FakeHost) -> None:
    (host.libs / "libcuda.so.535.161.08").write_text("")
    (host.libs / "libcuda.so.1").symlink_to("libcuda.so.535.161.08")
    assert facts.installed_driver_version([str(host.libs)])[0] == "535.161.08"
    assert facts.installed_driver_version([str(host.root / "empty")]) == (None, None)


def test_ldconfig_output_parsing() -> None:
    text = (
        "1234 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibnvidia-ml.so.1 (libc6) => /lib/i386-linux-gnu/libnvidia-ml.so.1\n"
        "\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"
        "\tlibnvidia-ml.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so\n"
        "\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1\n"
    )
    assert facts.parse_ldconfig(text, "libnvidia-ml.so.1") == [
        "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/lib/i386-linux-gnu/libnvidia-ml.so.1",
    ]
    assert facts.parse_ldconfig(text, "libfoo.so.1") == []
    debian_path = "/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.261.03"
    assert facts.library_version(debian_path) == "535.261.03"
    assert facts.library_version("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") is None


def test_driver_versions_equal_pass(healthy_h100: FakeHost) -> None:
    result = checks.check_driver_version(probe(healthy_h100))
    assert CHECK_KEYS <= result.keys()
    assert (result["verdict"], result["value"], result["threshold"]) == ("pass", "535.161.08", "535.161.08")
    assert result["reboot_required"] is False


def test_upgrade_without_reboot_fails(host: FakeHost) -> None:
    host.pci_gpus(8)
    host.loaded_module("535.161.08")
    host.userspace_driver("535.261.03")
    result = checks.check_driver_version(probe(host))
    assert result["verdict"] == "fail" and result["reboot_required"] is True
    assert result["detail"] == (
        "loaded module 535.161.08, installed 535.261.03: driver/library mismatch, reboot required"
    )


def test_loaded_version_from_proc_when_sysfs_lacks_it(host: FakeHost) -> None:
    host.pci_gpus(1)
    host.proc_file.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Feb 20 2024\n")
    host.userspace_driver("535.161.08")
    result = checks.check_driver_version(probe(host))
    assert (result["verdict"], result["loaded_from"]) == ("pass", str(host.proc_file))


def test_loaded_version_from_nvidia_smi_as_last_resort(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing())
    host.userspace_driver("535.261.03")
    result = checks.check_driver_version(probe(host))
    assert (result["verdict"], result["value"], result["loaded_from"]) == ("fail", "535.161.08", "nvidia-smi")


def test_module_not_loaded_with_gpus_fails(host: FakeHost) -> None:
    host.pci_gpus(2)
    host.userspace_driver("535.261.03")
    result = checks.check_driver_version(probe(host))
    assert result["verdict"] == "fail" and result["reboot_required"] is True
    assert "module not loaded" in result["detail"]


def test_no_gpu_no_driver_is_skipped(host: FakeHost) -> None:
    result = checks.check_driver_version(probe(host))
    assert result["verdict"] == "skipped" and result["detail"].startswith("no GPU")
    result = checks.check_driver_version(probe(host, "--require-gpus"))
    assert result["verdict"] == "fail" and result["detail"].startswith("no GPU")


def test_gpus_without_any_driver_fail(host: FakeHost) -> None:
    host.pci_gpus(4)
    result = checks.check_driver_version(probe(host))
    assert result["verdict"] == "fail" and "4 GPU(s) on the PCI bus but no NVIDIA driver" in result["detail"]


# --------------------------------------------------------------------------- nvidia-smi inventory


def test_healthy_inventory_passes(healthy_h100: FakeHost) -> None:
    p = probe(healthy_h100, "--expect-gpus", "8")
    result = checks.check_nvidia_smi(p)
    assert (result["verdict"], result["value"], result["unit"], result["threshold"]) == ("pass", 8, "GPUs", 8)
    assert "8 x NVIDIA H100 80GB HBM3" in result["detail"]
    gpu = p.smi.gpus[3]
    assert gpu.keys() == GPU_KEYS
    assert gpu == {
        "index": 3,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-4b0c8a3e-21f7-3c55-9e1d-000000000003",
        "pci_bus_id": "00000000:4B:00.0",
        "memory_total_mib": 81559,
        "persistence_mode": True,
        "ecc_uncorrected": 0,
        "gemm_tflops": None,
        "gemm_of_achievable": None,
    }
    assert p.smi.driver_version == "535.161.08"


def test_uncorrected_ecc_errors_fail(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing(ecc={3: "2"}))
    result = checks.check_nvidia_smi(probe(host))
    assert result["verdict"] == "fail"
    assert "GPU 3 (00000000:4B:00.0): 2 uncorrected ECC error(s), max 0" in result["detail"]
    assert checks.check_nvidia_smi(probe(host, "--max-ecc-errors", "2"))["verdict"] == "pass"


def test_persistence_disabled_warns(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing(persistence={0: "Disabled", 5: "Disabled"}))
    result = checks.check_nvidia_smi(probe(host))
    assert result["verdict"] == "warn" and "persistence mode disabled on GPU 0, 5" in result["detail"]


def test_unsupported_fields_are_null(host: FakeHost) -> None:
    host.nvidia_smi(CONSUMER_LISTING)
    p = probe(host)
    result = checks.check_nvidia_smi(p)
    first, second = p.smi.gpus
    assert (first["persistence_mode"], first["ecc_uncorrected"], first["memory_total_mib"]) == (None, None, 24564)
    assert (second["persistence_mode"], second["ecc_uncorrected"], second["memory_total_mib"]) == (False, None, None)
    assert result["verdict"] == "warn" and "persistence mode disabled on GPU 1" in result["detail"]


def test_fewer_gpus_than_expected_fail(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing())
    result = checks.check_nvidia_smi(probe(host, "--expect-gpus", "16"))
    assert result["verdict"] == "fail" and "8 GPU(s), expected 16" in result["detail"]


NO_DEVICES = "No devices were found\n"  # nvidia-smi's output, rc 6, when the driver answers but sees no GPU


@pytest.mark.parametrize("smi", ["no-devices", "absent", "empty-listing"])
def test_expected_gpus_are_never_skipped(driver_only: FakeHost, smi: str) -> None:
    """Issue 16, item 1: a node that lost its GPUs fails --expect-gpus, whatever nvidia-smi says."""
    if smi == "no-devices":
        driver_only.nvidia_smi(NO_DEVICES, rc=6)
    elif smi == "empty-listing":
        driver_only.nvidia_smi("")
    result = checks.check_nvidia_smi(probe(driver_only, "--expect-gpus", "8"))
    assert result["verdict"] == "fail", result
    assert result["detail"].startswith("0 GPU(s), expected 8 (--expect-gpus): ")
    assert (result["value"], result["threshold"]) == (0, 8)
    without = checks.check_nvidia_smi(probe(driver_only))  # no expectation: "no GPU" stays a skip
    assert without["verdict"] == "skipped" and without["detail"].startswith("no GPU"), without


def install_fake_torch(
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    cuda: str | None,
    cudnn_code: int | None = None,
    nccl: tuple[int, int, int] | None = None,
    importable: bool = True,
) -> None:
    """A torch package on sys.path as a wheel installs it (torch/version.py), whose import answers what
    torch.version.cuda, torch.backends.cudnn.version() and torch.cuda.nccl.version() answer without a GPU."""
    package = root / "site" / "torch"
    package.mkdir(parents=True)
    (package / "version.py").write_text(
        f"from typing import Optional\n\n__version__ = {version!r}\ncuda: Optional[str] = {cuda!r}\n"
    )
    body = (
        "raise ImportError('libtorch_cuda.so: cannot open shared object file')\n"
        if not importable
        else "from types import SimpleNamespace as _NS\nfrom . import version\n__version__ = version.__version__\n"
        f"backends = _NS(cudnn=_NS(is_available=lambda: {cudnn_code is not None}, version=lambda: {cudnn_code!r}))\n"
        f"_NCCL = {nccl!r}\n"
        "def _nccl():\n"
        "    if _NCCL is None:\n        raise RuntimeError('NCCL is not available')\n    return _NCCL\n"
        "cuda = _NS(is_available=lambda: False, device_count=lambda: 0, nccl=_NS(version=_nccl))\n"
    )
    (package / "__init__.py").write_text(body)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "torch.version", raising=False)
    monkeypatch.syspath_prepend(str(package.parent))


# PyPI's default Linux wheel of torch 2.3.1 is the CUDA 12.1 build, with cuDNN 8.9.2.26 and NCCL 2.20.5
# (its Requires-Dist, https://pypi.org/project/torch/2.3.1/): torch reports 8902 and (2, 20, 5), and calls
# itself 2.3.1+cu121 (the wheel's torch/version.py).
LAB_EXPECTATIONS = ("--expect-cuda", "12.1", "--expect-torch-cudnn", "8.9.2.26", "--expect-torch-nccl", "2.20.5")


def test_a_cuda_build_without_a_gpu_is_checked_not_skipped(
    driver_only: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: the lab's torch (PyPI's cu121 build of 2.3.1) on a node without a GPU: what torch was built
    with is read by importing it, which needs no GPU, and judged; only running CUDA says "no GPU"."""
    install_fake_torch(tmp_path, monkeypatch, "2.3.1+cu121", "12.1", 8902, (2, 20, 5))
    p = probe(driver_only, *LAB_EXPECTATIONS)
    result = checks.check_libraries(p)
    assert result["verdict"] == "pass", result
    assert result["detail"] == (
        "torch 2.3.1+cu121, CUDA 12.1, cuDNN 8.9.2, NCCL 2.20.5; torch's own cuDNN 8.9.2 "
        "(expected 8.9.2.26), NCCL 2.20.5 (expected 2.20.5); system cuDNN not installed, "
        "NCCL not installed; no GPU here to use them (see torch_cuda)"
    )
    versions = checks.report_versions(p)
    assert (versions["torch"], versions["cuda"], versions["cudnn"], versions["nccl"]) == (
        "2.3.1+cu121",
        "12.1",
        "8.9.2",
        "2.20.5",
    )
    assert checks.check_torch_cuda(p)["detail"] == "no GPU (torch 2.3.1+cu121, CUDA 12.1)"


@pytest.mark.parametrize(
    ("version", "cuda", "cudnn", "nccl", "reason"),
    [
        # PyPI's torch 2.5.1 is a CUDA 12.4 build (nvidia-cuda-runtime-cu12==12.4.127, https://pypi.org/project/torch/2.5.1/)
        ("2.5.1+cu124", "12.4", 90100, (2, 21, 5), "torch built for CUDA 12.4, expected 12.1"),
        ("2.3.1+cu121", "12.1", 8902, (2, 18, 1), "torch's own NCCL is 2.18.1, the matrix's bundled build is 2.20.5 ("),
        ("2.3.1+cpu", None, None, None, "torch is a CPU-only build, expected one for CUDA 12.1 (--expect-cuda); "),
    ],
    ids=["cu124-build", "nccl-swapped", "cpu-build"],
)
def test_a_wrong_build_fails_without_a_gpu(
    driver_only: FakeHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    cuda: str | None,
    cudnn: int | None,
    nccl: tuple[int, int, int] | None,
    reason: str,
) -> None:
    """Issue 16, item 1 and issue 15: --expect-cuda is never skipped; without a GPU it is judged on the build."""
    install_fake_torch(tmp_path, monkeypatch, version, cuda, cudnn, nccl)
    result = checks.check_libraries(probe(driver_only, *LAB_EXPECTATIONS))
    assert result["verdict"] == "fail", result
    assert result["detail"].startswith(reason), result["detail"]


def test_a_cuda_build_that_does_not_import_fails_without_a_gpu(
    driver_only: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch_cuda says "no GPU" from torch's files; the libraries check imports it, so a broken CUDA build fails
    there."""
    install_fake_torch(tmp_path, monkeypatch, "2.3.1+cu121", "12.1", importable=False)
    p = probe(driver_only)
    result = checks.check_libraries(p)
    assert result["verdict"] == "fail", result
    assert result["detail"] == "torch not importable: ImportError: libtorch_cuda.so: cannot open shared object file"
    assert checks.check_torch_cuda(p)["verdict"] == "skipped"


def test_gpu_missing_from_nvidia_smi_warns(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing())
    host.pci_gpus(9)
    result = checks.check_nvidia_smi(probe(host))
    assert result["verdict"] == "warn" and "nvidia-smi lists 8 GPU(s), the PCI bus has 9" in result["detail"]


def test_driver_library_mismatch(host: FakeHost) -> None:
    host.nvidia_smi(MISMATCH, MISMATCH, rc=18)
    host.pci_gpus(8)
    host.loaded_module("535.161.08")
    host.userspace_driver("535.261.03")
    p = probe(host)
    smi = checks.check_nvidia_smi(p)
    assert smi["verdict"] == "fail" and smi["reboot_required"] is True
    assert "nvidia-smi failed (rc 18): Failed to initialize NVML: Driver/library version mismatch" in smi["detail"]
    driver = checks.check_driver_version(p)
    assert driver["verdict"] == "fail" and driver["reboot_required"] is True


def test_no_gpu_and_no_nvidia_smi_is_skipped(host: FakeHost) -> None:
    result = checks.check_nvidia_smi(probe(host))
    assert result["verdict"] == "skipped" and result["detail"].startswith("no GPU")
    assert checks.check_nvidia_smi(probe(host, "--require-gpus"))["verdict"] == "fail"


def test_gpus_without_nvidia_smi_fail(host: FakeHost) -> None:
    host.pci_gpus(2)
    result = checks.check_nvidia_smi(probe(host))
    assert result["verdict"] == "fail" and "nvidia-smi not found on PATH" in result["detail"]


# --------------------------------------------------------------------------- topology and all-reduce


def test_nvswitch_topology(host: FakeHost) -> None:
    links = facts.parse_topology(dgx_topology())
    assert len(links) == 8 and all(len(row) == 8 for row in links)
    assert [links[i][i] for i in range(8)] == ["X"] * 8
    assert links[0][7] == links[6][1] == "NV18"
    assert facts.all_pairs_nvlink(links)

    host.nvidia_smi(h100_listing(), dgx_topology())
    result = checks.check_p2p_topology(with_torch(probe(host), fake_torch(8)))
    assert result["verdict"] == "pass" and result["value"]["links"] == links
    assert "28 NV18" in result["detail"] and "P2P on 28/28 pairs" in result["detail"]


@pytest.mark.parametrize("torch", [None, fake_torch(4)], ids=["torch-absent", "torch-sees-fewer"])
def test_p2p_not_tested_is_not_a_pass(host: FakeHost, torch: Any) -> None:
    """Issue 16, item 3: links read but peer access not tested is a warning, never a pass."""
    host.nvidia_smi(h100_listing(), dgx_topology())
    p = probe(host) if torch is None else with_torch(probe(host), torch)
    result = checks.check_p2p_topology(p)
    assert result["verdict"] == "warn", result
    assert result["value"]["p2p"] is None and "P2P not tested: " in result["detail"]


def test_pcie_topology_with_sys_warns(host: FakeHost) -> None:
    links = facts.parse_topology(PCIE_TOPOLOGY)
    assert links == [["X", "SYS"], ["SYS", "X"]]
    assert not facts.all_pairs_nvlink(links)
    host.nvidia_smi(PCIE_LISTING, PCIE_TOPOLOGY)
    result = checks.check_p2p_topology(probe(host))
    assert result["verdict"] == "warn" and "GPU0-GPU1" in result["detail"]


def test_topology_verdicts_with_peer_access() -> None:
    nvlink = [["X", "NV12", "NV12"], ["NV12", "X", "NV12"], ["NV12", "NV12", "X"]]
    all_p2p = [[None, True, True], [True, None, True], [True, True, None]]
    assert checks.judge_topology(nvlink, all_p2p)[0] == "pass"
    broken = [[None, False, True], [False, None, True], [True, True, None]]
    verdict, detail = checks.judge_topology(nvlink, broken)
    assert verdict == "fail" and "GPU0-GPU1 (NV12)" in detail
    pcie = [["X", "PIX"], ["PIX", "X"]]
    assert (
        checks.judge_topology(pcie, [[None, False], [False, None]])[0] == "pass"
    )  # PCIe without P2P: slower, not broken


def test_single_gpu_topology_is_skipped(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing().splitlines()[0] + "\n")
    result = checks.check_p2p_topology(probe(host))
    assert result["verdict"] == "skipped" and "needs 2 or more GPUs" in result["detail"]


def test_bus_bandwidth_formula() -> None:
    assert checks.bus_bandwidth_gbps(10**9, 0.01, 8) == pytest.approx(175.0)  # algbw 100 GB/s x 2*7/8
    assert checks.bus_bandwidth_gbps(10**9, 0.01, 2) == pytest.approx(100.0)
    assert checks.bus_bandwidth_gbps(256 * 2**20, 0.002, 4) == pytest.approx(256 * 2**20 / 0.002 / 1e9 * 1.5)


@pytest.mark.parametrize(
    "listing, topology, fabric, threshold, verdict",
    [
        (PCIE_LISTING, PCIE_TOPOLOGY, "pcie", 5.0, "pass"),
    ],
    ids=["pcie"],
)
def test_allreduce_threshold_follows_topology(
    host: FakeHost,
    monkeypatch: pytest.MonkeyPatch,
    listing: str,
    topology: str,
    fabric: str,
    threshold: float,
    verdict: str,
) -> None:
    host.nvidia_smi(listing, topology)
    gpus = len(listing.splitlines())
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": nbytes / 50e9, "correct": True})
    result = checks.check_allreduce_busbw(with_torch(probe(host), fake_torch(gpus)))
    assert (result["fabric"], result["threshold"], result["verdict"]) == (fabric, threshold, verdict)
    assert result["value"] == pytest.approx(50.0 * 2 * (gpus - 1) / gpus)
    assert (result["algbw_gbps"], result["world_size"], result["size_mib"]) == (pytest.approx(50.0), gpus, 256)
    assert "the flat PCIe floor (PCIe: no per-SKU floor)" in result["detail"]


# Azure/azurehpc-health-checks @ 0e0a1ac2 conf/nd96isr_h100_v5.conf: check_nccl_allreduce 460.0 1 16G (nccl-tests
# -b 16G -e 16G: 16 GiB, NVIDIA/nccl-tests src/common.cu parsesize @ a0b82b22).
def test_allreduce_of_8_h100s_is_judged_against_azures_floor_at_its_size(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.nvidia_smi(h100_listing(), dgx_topology())
    sizes: list[int] = []

    def measure(world: int, nbytes: int) -> dict[str, Any]:
        sizes.append(nbytes)
        return {"seconds": nbytes / 50e9, "correct": True}  # busbw 87.5 GB/s: a fifth of 460

    monkeypatch.setattr(checks, "measure_allreduce", measure)
    result = checks.check_allreduce_busbw(with_torch(probe(host), fake_torch(8)))
    assert (result["fabric"], result["threshold"], result["verdict"]) == ("nvlink", 460.0, "fail")
    assert result["size_mib"] == 16384 and sizes == [16 * 2**30]
    assert result["floor_profile"] == "H100 80GB HBM3"
    assert "threshold 460: the H100 80GB HBM3 floor at 16384 MiB (Azure/azurehpc-health-checks" in result["detail"]
    assert "conf/nd96isr_h100_v5.conf: check_nccl_allreduce 460.0 1 16G" in result["detail"]
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": nbytes / 300e9, "correct": True})
    assert checks.check_allreduce_busbw(with_torch(probe(host), fake_torch(8)))["verdict"] == "pass"  # 525 GB/s


@pytest.mark.parametrize(
    "extra, listing, gpus, why",
    [
        (("--quick",), None, 8, "the H100 80GB HBM3 floor 460 holds at 16384 MiB, this run is 32 MiB"),
        (("--allreduce-mib", "1024"), None, 8, "the H100 80GB HBM3 floor 460 holds at 16384 MiB, this run is 1024 MiB"),
        ((), "NVIDIA Graphics Device", 8, "unknown model: no per-SKU floor"),
        ((), None, 4, "the H100 80GB HBM3 profile has no all-reduce floor for 4 GPUs"),
    ],
    ids=["quick", "smaller-message", "unknown-model", "four-gpus"],
)
def test_allreduce_falls_back_to_the_flat_floor_and_says_why(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...], listing: str | None, gpus: int, why: str
) -> None:
    lines = h100_listing().splitlines()[:gpus]
    if listing:
        lines = [line.replace("NVIDIA H100 80GB HBM3", listing) for line in lines]
    topology = dgx_topology() if gpus == 8 else None
    host.nvidia_smi("\n".join(lines) + "\n", topology or nvlink_topology(gpus))
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": nbytes / 50e9, "correct": True})
    result = checks.check_allreduce_busbw(with_torch(probe(host, *extra), fake_torch(gpus)))
    assert (result["fabric"], result["threshold"], result["floor_profile"]) == ("nvlink", 100.0, None)
    assert f"threshold 100: the flat NVLink/NVSwitch floor ({why})" in result["detail"]


def test_allreduce_wrong_sum_fails(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    host.nvidia_smi(PCIE_LISTING, PCIE_TOPOLOGY)
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": 1.0, "correct": False})
    result = checks.check_allreduce_busbw(with_torch(probe(host, "--quick"), fake_torch(2)))
    assert result["verdict"] == "fail" and result["detail"].startswith("wrong all-reduce result")
    assert result["size_mib"] == 32


def test_allreduce_needs_two_gpus(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing().splitlines()[0] + "\n")
    result = checks.check_allreduce_busbw(with_torch(probe(host), fake_torch(1)))
    assert result["verdict"] == "skipped" and result["detail"].startswith("needs 2 or more GPUs")


def test_p2p_with_peer_access(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing(), dgx_topology())
    result = checks.check_p2p_topology(with_torch(probe(host), fake_torch(8)))
    assert result["verdict"] == "pass" and "P2P on 28/28 pairs" in result["detail"]
    assert result["value"]["p2p"][0] == [None] + [True] * 7
    no_peer = fake_torch(8, peer_access=lambda i, j: {i, j} != {2, 6})
    result = checks.check_p2p_topology(with_torch(probe(host), no_peer))
    assert result["verdict"] == "fail" and "NVLink without peer access: GPU2-GPU6 (NV18)" in result["detail"]


def test_gemm_slowest_gpu_and_report(healthy_h100: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    def measure(torch: Any, index: int, n: int) -> dict[str, Any]:
        return {
            "index": index,
            "name": "NVIDIA H100 80GB HBM3",
            "dtype": "bfloat16",
            "finite": True,
            "uuid": f"4b0c8a3e-21f7-3c55-9e1d-0000000000{index:02d}",  # torch's form, without "GPU-"
            "tflops": 300.0 if index == 5 else 700.0 + index,
        }

    monkeypatch.setattr(checks, "measure_gemm", measure)
    monkeypatch.setattr(checks.Probe, "torch", property(lambda self: fake_torch(8)))
    monkeypatch.setattr(checks, "torch_versions", lambda torch: {})
    report = checks.build_report(
        cli.parse_args(
            healthy_h100.argv(
                "--skip", "torch_cuda", "--skip", "libraries", "--skip", "allreduce_busbw", "--skip", "memory_bandwidth"
            )
        )
    )
    gemm = by_name(report)["gemm"]
    assert (gemm["verdict"], gemm["value"], gemm["threshold"]) == ("fail", 300.0, pytest.approx(0.85 * 794.5))
    assert gemm["detail"].startswith(
        "n=8192 bfloat16; GPU 5 NVIDIA H100 80GB HBM3: 300.0 TFLOP/s, 38% of the achievable 794.5 for H100"
    )
    assert [g["verdict"] for g in gemm["per_gpu"]] == ["pass"] * 5 + ["fail"] + ["pass"] * 2
    assert [g["gemm_tflops"] for g in report["gpus"]] == [700.0, 701.0, 702.0, 703.0, 704.0, 300.0, 706.0, 707.0]
    # how far each GPU is from its achievable figure, in the report
    assert [g["gemm_of_achievable"] for g in report["gpus"]] == pytest.approx(
        [t / 794.5 for t in (700.0, 701.0, 702.0, 703.0, 704.0, 300.0, 706.0, 707.0)]
    )
    assert all(g["achievable_tflops"] == 794.5 and g["datasheet_tflops"] == 989.0 for g in gemm["per_gpu"])
    assert report["reasons"] == [f"gemm: {gemm['detail']}"]


# --------------------------------------------------------------------------- memory bandwidth

# Real `nvidia-smi -q` of 8 x H100 80GB HBM3 (leptonai/gpud, its .source): PCI device ID 0x233010DE, the
# H100 80GB HBM3 profile's (floors: DCGM's 1905 GB/s device memory, Azure's 48 GB/s H2D/D2H).
H100_SMI_TEXT = Path(__file__).parent / "data" / "gpu" / "smi-text" / "h100-8gpu-535.183.01.txt"
H100_SMI_UUIDS = [
    "566e6f65-c38e-b12f-4824-6944218668b9",
    "9930d717-21dd-7692-054e-3d0a2bae76b5",
    "973565ff-45cf-12ea-4e91-33386720f7bb",
    "6b932a61-abfd-5ea1-b26a-7dea7f2fa601",
    "726d356b-f548-bbfd-c81e-b9c68f2f1587",
    "06db64f6-6181-5a90-cf95-5ce52a58c4e5",
    "a5271aa6-4cdb-28c7-0ef5-5da271d0caae",
    "7e78e6c8-c71c-66c7-9ded-f8836cecab32",
]


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


def membw_check(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, *extra: str, listing: str | None = None, **measured: Any
) -> dict[str, Any]:
    host.nvidia_smi(listing or h100_listing(), dgx_topology())
    monkeypatch.setattr(checks, "measure_memory_bandwidth", membw_measure(**measured))
    return checks.check_memory_bandwidth(with_torch(probe(host, *extra), fake_torch(8)))


def test_memory_bandwidth_of_a_slow_gpu_fails_against_dcgms_floor(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU 5 of 8 x H100 (found by its PCI device ID in a real nvidia-smi -q) copies at 1500 GB/s: below DCGM's
    1905 for device 2330."""
    sizes: list[int] = []
    result = membw_check(
        host, monkeypatch, "--smi-query-file", str(H100_SMI_TEXT), device={5: 1500.0}, uuids=H100_SMI_UUIDS, sizes=sizes
    )
    assert (result["verdict"], result["value"], result["threshold"], result["unit"]) == ("fail", 1500.0, 1905.0, "GB/s")
    assert (result["h2d_gbps"], result["d2h_gbps"], result["size_mib"], result["profile"]) == (
        55.0,
        53.0,
        1024,
        "H100 80GB HBM3",
    )
    assert sizes == [1024] * 8
    assert result["detail"] == (
        "1024 MiB copies; GPU 5 NVIDIA H100 80GB HBM3: device memory 1500.0 GB/s, below the floor 1905 of "
        "H100 80GB HBM3 (NVIDIA/DCGM nvvs/diag-skus.yaml.in @ 72fa3fea: 2330 minimum_bandwidth 1905000 MB/s); "
        "H2D 55.0 / D2H 53.0 GB/s, floor 48 of H100 80GB HBM3 (Azure/azurehpc-health-checks @ 0e0a1ac2 "
        "conf/nd96isr_h100_v5.conf: check_gpu_bw 48 335)"
    )
    assert [g["verdict"] for g in result["per_gpu"]] == ["pass"] * 5 + ["fail"] + ["pass"] * 2
    gpu5 = result["per_gpu"][5]
    assert (gpu5["memory_bandwidth_verdict"], gpu5["h2d_verdict"], gpu5["d2h_verdict"]) == ("fail", "pass", "pass")
    assert (gpu5["memory_bandwidth_floor"], gpu5["h2d_floor"]) == (1905.0, 48.0)
    assert gpu5["memory_bandwidth_source"].startswith("NVIDIA/DCGM nvvs/diag-skus.yaml.in")
    # healthy: every GPU above both floors, the slowest one shown
    healthy = membw_check(host, monkeypatch, "--smi-query-file", str(H100_SMI_TEXT), uuids=H100_SMI_UUIDS)
    assert (healthy["verdict"], healthy["value"], healthy["threshold"]) == ("pass", 2900.0, 1905.0)
    assert healthy["detail"].startswith(
        "1024 MiB copies; GPU 0 NVIDIA H100 80GB HBM3: device memory 2900.0 GB/s, floor 1905"
    )


def test_memory_bandwidth_host_copies_below_azures_floor_fail(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    result = membw_check(host, monkeypatch, "--quick", h2d={2: 30.0}, d2h={6: 47.9})
    assert (result["verdict"], result["size_mib"]) == ("fail", 256)
    assert [g["verdict"] for g in result["per_gpu"]] == ["pass", "pass", "fail", "pass", "pass", "pass", "fail", "pass"]
    assert "GPU 2 NVIDIA H100 80GB HBM3: device memory 2902.0 GB/s, floor 1905 of H100 80GB HBM3" in result["detail"]
    assert (
        "H2D 30.0 / D2H 53.0 GB/s, H2D below the floor 48 of H100 80GB HBM3 (Azure/azurehpc-health-checks @ "
        "0e0a1ac2 conf/nd96isr_h100_v5.conf: check_gpu_bw 48 335)"
    ) in result["detail"]
    assert "GPU 6 NVIDIA H100 80GB HBM3: device memory 2906.0 GB/s" in result["detail"]
    assert "H2D 55.0 / D2H 47.9 GB/s, D2H below the floor 48" in result["detail"]
    assert (result["value"], result["h2d_gbps"]) == (2900.0, 55.0)  # the slowest device copy is GPU 0's
    assert result["host_copy_min_gbps"] == 30.0  # the slowest host copy of any GPU: GPU 2's H2D


def test_memory_bandwidth_of_an_unknown_model_is_measured_not_judged(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "NVIDIA Graphics Device"
    result = membw_check(
        host, monkeypatch, listing=h100_listing().replace("NVIDIA H100 80GB HBM3", name), name=name, device={3: 100.0}
    )
    assert (result["verdict"], result["value"], result["threshold"], result["profile"]) == (
        "warn",
        100.0,
        None,
        "unknown model",
    )
    assert all(
        g["verdict"] == "warn" and g["memory_bandwidth_verdict"] == g["h2d_verdict"] == "not judged"
        for g in result["per_gpu"]
    )
    assert result["detail"].startswith(
        f"1024 MiB copies; GPU 0 {name}: device memory 2900.0 GB/s; H2D 55.0 / D2H 53.0 "
        "GB/s; not judged (unknown model: no floor; set one in "
        "gpu_verify_profile_overrides)"
    )
    assert f"GPU 3 {name}: device memory 100.0 GB/s" in result["detail"]


def test_memory_bandwidth_of_a_profile_without_the_figure_is_not_judged_and_says_so(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H200 NVL: DCGM has its device memory floor, Azure has no H2D figure for it."""
    name = "NVIDIA H200 NVL"
    result = membw_check(host, monkeypatch, listing=h100_listing().replace("NVIDIA H100 80GB HBM3", name), name=name)
    assert (result["verdict"], result["threshold"], result["profile"]) == ("pass", 2212.5, "H200 NVL")
    assert result["detail"].endswith(
        "H2D 55.0 / D2H 53.0 GB/s not judged (the H200 NVL profile has no h2d_gbps "
        "floor; set one in gpu_verify_profile_overrides)"
    )
    assert {g["h2d_verdict"] for g in result["per_gpu"]} == {"not judged"}


def test_memory_bandwidth_floor_follows_the_sites_override(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    override = json.dumps({"H100 80GB HBM3": {"memory_bandwidth_gbps": 1400, "h2d_gbps": 20}})
    result = membw_check(host, monkeypatch, "--profile-overrides-json", override, device={5: 1500.0}, h2d={1: 25.0})
    assert (result["verdict"], result["value"], result["threshold"]) == ("pass", 1500.0, 1400.0)
    assert result["detail"] == (
        "1024 MiB copies; GPU 5 NVIDIA H100 80GB HBM3: device memory 1500.0 GB/s, floor 1400 "
        "of H100 80GB HBM3 (site override); H2D 55.0 / D2H 53.0 GB/s, floor 20 of H100 80GB "
        "HBM3 (site override)"
    )
    # a model the table does not know, named by the site: judged against the site's figure
    name = "NVIDIA Graphics Device"
    site = json.dumps({"lab part": {"names": [name], "memory_bandwidth_gbps": 3000}})
    result = membw_check(
        host,
        monkeypatch,
        "--profile-overrides-json",
        site,
        listing=h100_listing().replace("NVIDIA H100 80GB HBM3", name),
        name=name,
    )
    assert (result["verdict"], result["threshold"], result["profile"]) == ("fail", 3000.0, "lab part")
    assert "H2D 55.0 / D2H 53.0 GB/s not judged (the lab part profile has no h2d_gbps floor" in result["detail"]


def test_memory_bandwidth_copy_that_returns_other_data_fails(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    result = membw_check(host, monkeypatch, correct=False)
    assert result["verdict"] == "fail"
    assert result["detail"].startswith(
        "1024 MiB copies; GPU 0 NVIDIA H100 80GB HBM3: the copied data differ from "
        "their source; device memory 2900.0 GB/s, floor 1905"
    )


def test_memory_bandwidth_is_skipped_without_a_gpu(driver_only: FakeHost) -> None:
    assert checks.check_memory_bandwidth(probe(driver_only)) == {
        "name": "memory_bandwidth",
        "verdict": "skipped",
        "value": None,
        "unit": None,
        "threshold": None,
        "detail": "no GPU",
    }
    assert checks.check_memory_bandwidth(probe(driver_only, "--require-gpus"))["verdict"] == "fail"


def test_memory_bandwidth_arithmetic() -> None:
    """Device copy: read + write, 2 x bytes x iterations / seconds (BabelStream's Copy); host copies: bytes x
    iterations / seconds; GB = 1e9 bytes."""
    assert checks.device_copy_gbps(2**30, 10, 0.01) == pytest.approx(2 * 2**30 * 10 / 0.01 / 1e9)  # 2147.5 GB/s
    assert checks.device_copy_gbps(10**9, 1, 1.0) == 2.0
    assert checks.host_copy_gbps(10**9, 10, 0.2) == pytest.approx(50.0)
    # the buffer: 1 GiB, at most a sixteenth of the GPU's memory, in whole MiB
    assert checks.membw_bytes(1024, 80 * 2**30) == 2**30
    assert checks.membw_bytes(1024, 4 * 2**30) == 256 * 2**20
    assert checks.membw_bytes(256, 15 * 2**30 + 7) == 256 * 2**20
    assert checks.membw_bytes(1024, 2**20) == 2**20


# --------------------------------------------------------------------------- library versions and GEMM


@pytest.mark.parametrize(
    "code, version", [(8902, "8.9.2"), (8700, "8.7.0"), (90100, "9.1.0"), (90501, "9.5.1"), (None, None)]
)
def test_cudnn_version_decoding(code: int | None, version: str | None) -> None:
    assert checks.decode_cudnn_version(code) == version


def test_nccl_version_formatting() -> None:
    assert checks.format_nccl_version((2, 18, 1)) == "2.18.1"
    assert checks.format_nccl_version(2708) == "2.7.8"
    assert checks.format_nccl_version(21803) == "2.18.3"
    assert checks.format_nccl_version(None) is None


@pytest.mark.parametrize(
    "name, model, tflops",
    [
        ("NVIDIA H200", "H200", 989.0),
        ("NVIDIA GH200 480GB", "GH200", 989.0),
        ("NVIDIA H100 80GB HBM3", "H100", 989.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe", 312.0),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe", 312.0),
        ("NVIDIA A10", "A10", 125.0),
        ("NVIDIA L40S", "L40S", 362.0),
        ("NVIDIA L4", "L4", 121.0),
        ("Tesla V100-SXM2-32GB", "V100", 125.0),
        ("Tesla T4", "T4", 65.0),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.0),
    ],
)
def test_gemm_reference_lookup(name: str, model: str, tflops: float) -> None:
    assert checks.reference_tflops(name) == (model, tflops)


# Issue 16, item 23: the floor is a fraction of what the model really reaches. The achievable
# figures are the published measurements the table in checks.py cites: the "Maximum Achievable
# Matmul FLOPS" table of Stas Bekman's Machine Learning Engineering book
# (https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md#maximum-achievable-matmul-flops-comparison-table)
# against NVIDIA's datasheet peaks (H100/H200 SXM 989, A100 312 dense bf16).
@pytest.mark.parametrize(
    "name, achievable, datasheet, source",
    [
        ("NVIDIA H200", 794.5, 989.0, "measured"),  # "H200 is the same" as H100 SXM: 794.5 (80.3 %)
        ("NVIDIA H100 80GB HBM3", 794.5, 989.0, "measured"),
        ("NVIDIA GH200 480GB", 828.6, 989.0, "measured"),  # 83.8 %
        ("NVIDIA A100-SXM4-80GB", 271.2, 312.0, "measured"),  # 86.9 %
        ("NVIDIA A100-PCIE-40GB", 252.9, 312.0, "measured"),  # 81.1 %
        ("NVIDIA L40S", 217.2, 362.0, "estimated"),  # no published measurement: 0.6 x the datasheet
        ("NVIDIA H100 PCIe", 453.6, 756.0, "estimated"),
    ],
)
def test_gemm_achievable_figures(name: str, achievable: float, datasheet: float, source: str) -> None:
    figure = checks.achievable_tflops(name)
    assert (figure["achievable"], figure["datasheet"], figure["source"]) == (
        pytest.approx(achievable),
        datasheet,
        source,
    )
    if source == "measured":
        assert 0.75 <= achievable / datasheet <= 0.9  # what published bf16 GEMM measurements reach


def test_gemm_floor_fails_a_degraded_gpu() -> None:
    """A throttled H200 at 650 TFLOP/s (66 % of its datasheet) passed the old floor (0.5 x 989 = 494.5);
    against 0.85 x the achievable 794.5 = 675.3 it fails, and the report says how far it is."""
    degraded = checks.judge_gemm("NVIDIA H200", 650.0, checks.GEMM_MIN_FRACTION)
    assert degraded["verdict"] == "fail" and degraded["threshold"] == pytest.approx(675.325)
    assert degraded["of_achievable"] == pytest.approx(650.0 / 794.5)
    assert degraded["detail"] == (
        "NVIDIA H200: 650.0 TFLOP/s, 82% of the achievable 794.5 for H200 (published "
        "measurement; datasheet 989); floor 675.3 = 0.85 x 794.5"
    )
    healthy = checks.judge_gemm("NVIDIA H200", 801.0, checks.GEMM_MIN_FRACTION)  # measured on our H200 (docs/gpu.md)
    assert healthy["verdict"] == "pass" and healthy["of_achievable"] == pytest.approx(801.0 / 794.5)
    assert checks.judge_gemm("NVIDIA A100-SXM4-80GB", 220.0, 0.85)["verdict"] == "fail"  # floor 230.5
    assert checks.judge_gemm("NVIDIA A100-SXM4-80GB", 240.0, 0.85)["verdict"] == "pass"


def test_gemm_verdicts() -> None:
    assert checks.reference_tflops("NVIDIA RTX A1000") is None  # "A10" matches whole words only
    judged = checks.judge_gemm("NVIDIA H200", 700.0, 0.5)
    assert (judged["verdict"], judged["threshold"]) == ("pass", pytest.approx(397.25))
    judged = checks.judge_gemm("NVIDIA H100 PCIe", 300.0, 0.85)  # estimated: 0.85 x 0.6 x 756 = 385.6
    assert (judged["verdict"], judged["threshold"]) == ("fail", pytest.approx(385.56))
    assert "estimated: 0.6 x the datasheet, no published measurement" in judged["detail"]
    judged = checks.judge_gemm("NVIDIA Blackwell Prototype", 1500.0, 0.85)
    assert (judged["verdict"], judged["threshold"], judged["of_achievable"]) == ("warn", None, None)
    assert judged["detail"] == "no reference figure for NVIDIA Blackwell Prototype (measured 1500.0 TFLOP/s)"
    assert checks.gemm_tflops(8192, 10, 0.02) == pytest.approx(2 * 8192**3 * 10 / 0.02 / 1e12)


def test_gemm_fraction_default_is_the_roles() -> None:
    """The check's default floor and gpu_verify's setting are the same number (0.85 of the achievable figure)."""
    import yaml

    defaults = yaml.safe_load((PAYLOAD_DIR.parents[1] / "gpu_verify" / "defaults" / "main.yml").read_text())
    assert checks.GEMM_MIN_FRACTION == defaults["gpu_verify_gemm_min_fraction"] == 0.85
    assert cli.parse_args([]).gemm_min_fraction == 0.85


# --------------------------------------------------------------------------- torch absent


def test_torch_absent_fails_torch_cuda(healthy_h100: FakeHost) -> None:
    p = probe(healthy_h100)
    result = checks.check_torch_cuda(p)
    assert result["verdict"] == "fail" and result["detail"].startswith("torch not importable: ")
    for check in (
        checks.check_libraries,
        checks.check_gemm,
        checks.check_memory_bandwidth,
        checks.check_allreduce_busbw,
    ):
        result = check(p)
        assert result["verdict"] == "skipped" and result["detail"] == "torch not importable (see torch_cuda)"
    assert checks.check_training(p)["verdict"] == "fail"


def test_torch_absent_without_gpu(host: FakeHost) -> None:
    p = probe(host)
    assert checks.check_torch_cuda(p)["verdict"] == "fail"  # the venv must have torch, GPU or not
    assert checks.check_libraries(p)["detail"] == "no GPU (torch is not installed)"


# --------------------------------------------------------------------------- report


def test_check_that_raises_is_a_failure(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_probe: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setitem(checks.CHECKS, "gemm", broken)
    report = checks.build_report(cli.parse_args(host.argv("--skip", "torch_cuda")))
    gemm = by_name(report)["gemm"]
    assert gemm["verdict"] == "fail" and gemm["detail"] == "check raised RuntimeError: boom"
    assert "RuntimeError: boom" in gemm["traceback"]
    assert report["verdict"] == "fail" and report["reasons"] == ["gemm: check raised RuntimeError: boom"]
    assert by_name(report)["p2p_topology"]["verdict"] == "skipped"  # the checks after it still ran


def test_non_finite_numbers_become_null() -> None:
    value = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf"), "e": 2}}
    assert common.finite_or_none(value) == {"a": None, "b": [1.0, None], "c": {"d": None, "e": 2}}


def test_payload_batch_and_log_tail() -> None:
    assert launcher.default_payload_args(2)[-2:] == ["--batch-size", "64"]
    assert launcher.default_payload_args(3)[-2:] == ["--batch-size", "66"]  # 3 ranks x 2 micro-steps divide it
    assert launcher.default_payload_args(64)[-2:] == ["--batch-size", "128"]
    lines = ["starting", "{", '  "verdict": "pass",', '  "losses": [', "    1.0", "  ]", "}", "done"]
    assert launcher.drop_printed_result(lines) == ["starting", "done"]


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


def fake_smi_that_records(host: FakeHost) -> Path:
    """nvidia-smi that leaves a file behind when it runs: whether any check started."""
    marker = host.root / "nvidia-smi-ran"
    script = host.bin / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n: > {marker}\nexit 9\n")
    script.chmod(0o755)
    return marker


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


DRIVER_FACT = {
    "branch": "535",
    "source": "cuda-repo",
    "requested_version": "latest",
    "pinned_version": "535.261.03",
    "installed_version": "535.261.03",
    "loaded_version": "535.261.03",
    "gpus": 0,
    "reboot_required": False,
    "reboot_reasons": [],
}


def driver_fact_fields(report: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(report["versions"][key] for key in ("driver_requested", "driver_pinned", "driver_source"))


def test_cli_reads_the_driver_fact(driver_only: FakeHost) -> None:
    """An executable fact (the nvidia_driver role's script) is run: what was asked and what was pinned."""
    fact = driver_only.driver_fact(json.dumps(DRIVER_FACT))
    proc = run_cli(driver_only, *driver_only.argv("--json", "--skip", "torch_cuda", "--driver-fact", str(fact)))
    assert proc.returncode == 0, explain(proc)
    report = json.loads(proc.stdout)
    assert driver_fact_fields(report) == ("latest", "535.261.03", "cuda-repo")
    assert report["notes"] == [] and report["verdict"] == "pass"


@pytest.mark.parametrize("requested, shown", [("", "default"), ("535.261.03", "535.261.03"), (None, None)])
def test_driver_fact_requested_version(driver_only: FakeHost, requested: str | None, shown: str | None) -> None:
    """The role's default ("" asked) reads "default"; an exact version as asked; a fact without the field: null."""
    fact = {**DRIVER_FACT, "requested_version": requested}
    if requested is None:
        del fact["requested_version"]
    p = probe(driver_only, "--driver-fact", str(driver_only.driver_fact(json.dumps(fact))))
    assert checks.report_versions(p)["driver_requested"] == shown
    assert checks.report_versions(p)["driver_pinned"] == "535.261.03"


def test_driver_fact_not_executable_is_read_as_json(driver_only: FakeHost) -> None:
    fact = driver_only.driver_fact(json.dumps({**DRIVER_FACT, "source": "debian"}), executable=False)
    p = probe(driver_only, "--driver-fact", str(fact))
    assert driver_fact_fields(checks.build_report(p.args)) == ("latest", "535.261.03", "debian")
    assert p.driver_fact == (DRIVER_FACT | {"source": "debian"}, "")


def test_missing_driver_fact_is_a_note_not_a_failure(driver_only: FakeHost) -> None:
    missing = driver_only.root / "facts.d" / "nvidia_driver.fact"
    proc = run_cli(driver_only, *driver_only.argv("--json", "--skip", "torch_cuda", "--driver-fact", str(missing)))
    assert proc.returncode == 0, explain(proc)
    report = json.loads(proc.stdout)
    assert report["verdict"] == "pass" and driver_fact_fields(report) == (None, None, None)
    assert report["notes"] == [f"driver fact {missing}: not found (the nvidia_driver role did not run here)"]
    summary = run_cli(driver_only, *driver_only.argv("--skip", "torch_cuda", "--driver-fact", str(missing)))
    assert summary.stdout.splitlines()[-1] == f"note: {report['notes'][0]}"


@pytest.mark.parametrize(
    "output, executable, note",
    [
        ('{"requested_version": "latest",', True, 'not a JSON object: {"requested_version": "latest",'),
        ("not json", False, "not a JSON object: not json"),
        ("[1, 2]", True, "not a JSON object: [1, 2]"),
        ("", True, "not a JSON object: empty output"),
    ],
)
def test_broken_driver_fact_is_a_note(driver_only: FakeHost, output: str, executable: bool, note: str) -> None:
    fact = driver_only.driver_fact(output, executable=executable)
    report = checks.build_report(cli.parse_args(driver_only.argv("--skip", "torch_cuda", "--driver-fact", str(fact))))
    assert report["verdict"] == "pass" and driver_fact_fields(report) == (None, None, None)
    assert report["notes"] == [f"driver fact {fact}: {note}"]


def test_failing_or_slow_driver_fact_is_a_note(driver_only: FakeHost) -> None:
    fact = driver_only.root / "nvidia_driver.fact"
    fact.write_text("#!/bin/sh\necho 'dpkg-query: broken' >&2\nexit 3\n")
    fact.chmod(0o755)
    assert facts.read_driver_fact(str(fact)) == (None, f"driver fact {fact}: exited 3: dpkg-query: broken")
    fact.write_text("#!/bin/sh\nwhile :; do :; done\n")  # no sleep on the fake host's PATH
    assert facts.read_driver_fact(str(fact), timeout=0.2) == (None, f"driver fact {fact}: no answer within 0.2 s")


def test_driver_fact_output_with_extra_lines() -> None:
    assert facts.parse_driver_fact("warning: something\n" + json.dumps(DRIVER_FACT)) == DRIVER_FACT


def role_command_line(**settings: Any) -> list[str]:
    """The options roles/gpu_verify/tasks/check.yml passes the checks, rendered with the role's defaults
    overridden by settings (plain Jinja2 with the filters the command uses)."""
    role = PAYLOAD_DIR.parents[1] / "gpu_verify"
    task = next(
        t for t in yaml.safe_load((role / "tasks" / "check.yml").read_text()) if t["name"] == "Run the health checks"
    )
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(
        {"quote": shlex.quote, "float": float, "int": int, "string": str, "bool": bool, "gpufleet.fleet.as_list": list}
    )
    values = {
        "__gpu_verify_check_script": "/tmp/gpufleet_check.pyz",
        "__gpu_verify_cuda": "12.1",
        "__gpu_verify_torch_cudnn": "",
        "__gpu_verify_torch_nccl": "",
        "__gpu_verify_dcgm": {"level": 1, "timeout": 300},
        "__gpu_verify_profile_overrides": "",
        "gpu_verify_module_version_file": "/sys/module/nvidia/version",
        "gpu_verify_metrics_file": "",
        "__gpu_verify_launcher": "launch",
        "gpu_verify_python": "/opt/gpufleet/venv/bin/python",
        "__gpu_verify_fallback_python": "/usr/bin/python3",
        **{
            k: v
            for k, v in yaml.safe_load((role / "defaults" / "main.yml").read_text()).items()
            if not (isinstance(v, str) and "{{" in v)
        },
        **settings,
    }
    words = shlex.split(env.from_string(task["ansible.builtin.command"]["cmd"]).render(**values))
    # sh -c <launcher> <its $0> <the venv's python> <the fallback>, then the checks' own options
    assert words[:6] == ["sh", "-c", "launch", "gpufleet-check", "/opt/gpufleet/venv/bin/python", "/usr/bin/python3"]
    return words[6:]


@pytest.mark.parametrize(
    "settings, fact",
    [
        ({}, "/etc/ansible/facts.d/nvidia_driver.fact"),
        ({"gpu_verify_driver_fact_file": "/srv/facts.d/nvidia driver.fact"}, "/srv/facts.d/nvidia driver.fact"),
        ({"gpu_verify_driver_fact_file": ""}, ""),
    ],
)
def test_gpu_verify_passes_the_driver_fact(settings: dict[str, Any], fact: str) -> None:
    """The role's command line is one the checks accept; gpu_verify_driver_fact_file becomes --driver-fact
    (left out when empty): no task of its own on hundreds of nodes."""
    argv = role_command_line(**settings)
    assert ("--driver-fact" in argv) == bool(fact)
    args = cli.parse_args(argv)
    assert (args.driver_fact, args.module_version_file, args.expect_cuda) == (
        fact,
        "/sys/module/nvidia/version",
        "12.1",
    )


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
    # test_gpu_health.py's saved outputs show them).
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


# --------------------------------------------------------------------------- torchrun's failure summary

TORCHRUN_FAILURE = """\
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer \
[10.89.77.12]:51234
E1130 05:50:02.114000 812 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 0 \
(pid: 811)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/opt/gpufleet/payload/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_05:50:02
  host      : gpufleet-node-2
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 812)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_05:50:01
  host      : gpufleet-node-2
  rank      : 2 (local_rank: 0)
  exitcode  : -9 (pid: 811)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 811
============================================================
"""


def test_worker_failures_are_read_from_torchruns_summary():
    failures = launcher.worker_failures(TORCHRUN_FAILURE)
    assert failures == [  # the root cause first
        {"host": "gpufleet-node-2", "rank": 2, "exitcode": -9, "cause": "Signal 9 (SIGKILL) received by PID 811"},
        {
            "host": "gpufleet-node-2",
            "rank": 3,
            "exitcode": 1,
            "cause": "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        },
    ]
    assert [launcher.describe_failure(f) for f in failures] == [
        "rank 2 on gpufleet-node-2 was killed by signal 9 (SIGKILL)",
        "rank 3 on gpufleet-node-2 exited with code 1",
    ]


def test_no_summary_no_failures():
    assert launcher.worker_failures("step 10 loss 0.5\nall good\n") == []
    assert (
        launcher.describe_failure({"host": "", "rank": 0, "exitcode": -99, "cause": ""})
        == "rank 0 on an unknown host was killed by signal 99 (signal 99)"
    )


# Issue 16, item 10: a payload that fails under torchrun (here rank 1 raised). train.py logs
# "rank<N> ERROR <message>" and records the exception in torchrun's error file, which torchrun
# prints as the root cause's traceback; torchrun's own ChildFailedError traceback comes before it.
PAYLOAD_FAILURE = """\
2026-12-01 05:59:44,100 rank0 INFO world 2 | backend gloo | device cpu
2026-12-01 05:59:45,900 rank1 ERROR training failed: RuntimeError: boom on purpose
Traceback (most recent call last):
  File "/opt/gpufleet/payload/train.py", line 400, in main
    raise RuntimeError("boom on purpose")
RuntimeError: boom on purpose
E1201 05:59:45.911000 26576 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) local_rank: 1\
 (pid: 26625) of binary: /opt/gpufleet/venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/opt/gpufleet/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\x20
============================================================
/opt/gpufleet/payload/train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_05:59:45
  host      : gpufleet-node-1
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 26625)
  error_file: /tmp/torchelastic_u01w9_1z/aac10ba4_qssnrgfn/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    File "/opt/gpufleet/payload/train.py", line 400, in main
      raise RuntimeError("boom on purpose")
  RuntimeError: boom on purpose
\x20\x20
============================================================
"""


def test_failure_cause_is_the_ranks_own_error(tmp_path: Path) -> None:
    failures = launcher.worker_failures(PAYLOAD_FAILURE)
    assert failures == [
        {"host": "gpufleet-node-1", "rank": 1, "exitcode": 3, "cause": "training failed: RuntimeError: boom on purpose"}
    ]
    assert (
        launcher.describe_failure(failures[0])
        == "rank 1 on gpufleet-node-1 exited with code 3: training failed: RuntimeError: boom on purpose"
    )
    # without the payload's own line, the traceback it recorded in torchrun's error file
    recorded_only = "\n".join(line for line in PAYLOAD_FAILURE.splitlines() if " rank1 ERROR " not in line)
    assert launcher.worker_failures(recorded_only)[0]["cause"] == "RuntimeError: boom on purpose"

    log = tmp_path / "torchrun.log"
    log.write_text(PAYLOAD_FAILURE)
    tail = launcher.log_tail(log, "").splitlines()
    assert tail[0] == "2026-12-01 05:59:45,900 rank1 ERROR training failed: RuntimeError: boom on purpose"
    assert tail.count(tail[0]) == 1
    assert not any("ChildFailedError" in line or "<frozen runpy>" in line for line in tail)  # the launcher's stack
    assert "Root Cause (first observed failure):" in tail and "  RuntimeError: boom on purpose" in tail


def test_training_check_says_why_the_payload_failed(
    driver_only: FakeHost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "torchrun.log"
    log.write_text(PAYLOAD_FAILURE)
    run = {
        "rc": 1,
        "result": None,
        "log_tail": launcher.log_tail(log, ""),
        "failures": launcher.worker_failures(PAYLOAD_FAILURE),
    }
    monkeypatch.setattr(launcher, "run_training", lambda *args, **kwargs: run)
    result = checks.check_training(with_torch(probe(driver_only, "--train"), fake_torch(0)))
    assert result["verdict"] == "fail"
    assert result["detail"] == (
        "no result from the payload (torchrun rc 1): rank 1 on gpufleet-node-1 exited with "
        "code 3: training failed: RuntimeError: boom on purpose"
    )
    assert result["failures"] == run["failures"]


# --------------------------------------------------------------------------- torch's own cuDNN / NCCL, the system's


# dpkg-query -W -f '${Package}\t${db:Status-Abbrev}\t${Version}\n': the status letters are dpkg-query(1)'s
# (desired action, package status, error flag; https://manpages.ubuntu.com/manpages/jammy/man1/dpkg-query.1.html);
# lines as Debian 12's dpkg-query prints them (the abbreviation ends with the error flag, a space when none).
DPKG_LINES = (
    "libcudnn8\tii \t8.9.2.26-1+cuda12.1\n"
    "libnccl2:amd64\thi \t2.18.1-1+cuda12.1\n"
    "libcudnn8-dev\trc \t8.9.2.26-1+cuda12.1\n"
    "libfoo\tun \t\n"
)


def test_dpkg_query_lines_give_the_installed_versions_only() -> None:
    assert facts.parse_dpkg_query(DPKG_LINES) == {"libcudnn8": "8.9.2.26-1+cuda12.1", "libnccl2": "2.18.1-1+cuda12.1"}
    assert facts.parse_dpkg_query("dpkg-query: no packages found matching libnccl2\n") == {}


def test_system_libraries_come_from_dpkg_query(host: FakeHost) -> None:
    """dpkg-query exits 1 when a name is unknown, after printing the others: those still count."""
    script = host.bin / "dpkg-query"
    script.write_text(
        "#!/bin/sh\nprintf 'libcudnn8\\tii \\t8.9.2.26-1+cuda12.1\\n'\n"
        "echo 'dpkg-query: no packages found matching libnccl2' >&2\nexit 1\n"
    )
    script.chmod(0o755)
    assert facts.system_library_versions() == {"cudnn": "8.9.2.26-1+cuda12.1", "nccl": None}
    script.unlink()  # no dpkg at all (not a Debian system)
    assert facts.system_library_versions() == {"cudnn": None, "nccl": None}


def cuda_torch(cudnn_code: int | None, nccl: tuple[int, int, int] | None, cuda: str | None = "12.1") -> SimpleNamespace:
    """torch as the libraries check reads it: torch.backends.cudnn.version() (90100 for 9.1.0, 8902 for
    8.9.2) and torch.cuda.nccl.version() ((2, 21, 5)); a CPU build has neither."""
    torch = fake_torch(8)
    torch.__version__ = "2.5.1+cu121" if cuda else "2.13.0+cpu"
    torch.version = SimpleNamespace(cuda=cuda)
    torch.backends = SimpleNamespace(
        cudnn=SimpleNamespace(is_available=lambda: cudnn_code is not None, version=lambda: cudnn_code)
    )

    def nccl_version() -> tuple[int, int, int]:
        if nccl is None:
            raise RuntimeError("NCCL is not available")
        return nccl

    torch.cuda.nccl = SimpleNamespace(version=nccl_version)
    return torch


def test_torch_own_libraries_match_the_bundled_builds(healthy_h100: FakeHost) -> None:
    p = with_torch(
        probe(
            healthy_h100, "--expect-cuda", "12.1", "--expect-torch-cudnn", "9.1.0.70", "--expect-torch-nccl", "2.21.5"
        ),
        cuda_torch(90100, (2, 21, 5)),
    )
    result = checks.check_libraries(p)
    assert result["verdict"] == "pass", result
    assert result["torch_libraries"] == {
        "cudnn": {"torch": "9.1.0", "expected": "9.1.0.70", "outcome": "match"},
        "nccl": {"torch": "2.21.5", "expected": "2.21.5", "outcome": "match"},
        "system": {"cudnn": None, "nccl": None},
    }
    assert result["detail"] == (
        "torch 2.5.1+cu121, CUDA 12.1, cuDNN 9.1.0, NCCL 2.21.5; torch's own cuDNN 9.1.0 "
        "(expected 9.1.0.70), NCCL 2.21.5 (expected 2.21.5); system cuDNN not installed, "
        "NCCL not installed"
    )


def test_torch_own_libraries_that_differ_fail_and_the_system_ones_are_listed_apart(healthy_h100: FakeHost) -> None:
    """torch 2.3.1+cu121 brings cuDNN 8.9.2.26 and NCCL 2.20.5; the system's packages are another build and
    are not compared."""
    script = healthy_h100.bin / "dpkg-query"
    script.write_text(
        "#!/bin/sh\nprintf 'libcudnn8\\tii \\t8.9.2.26-1+cuda12.1\\nlibnccl2\\tii \\t2.18.1-1+cuda12.1\\n'\n"
    )
    script.chmod(0o755)
    p = with_torch(
        probe(healthy_h100, "--expect-torch-cudnn", "8.9.2.26", "--expect-torch-nccl", "2.20.5"),
        cuda_torch(8902, (2, 18, 1)),
    )
    result = checks.check_libraries(p)
    assert result["verdict"] == "fail"
    assert result["torch_libraries"]["cudnn"]["outcome"] == "match"
    assert result["torch_libraries"]["nccl"] == {"torch": "2.18.1", "expected": "2.20.5", "outcome": "differs"}
    assert result["torch_libraries"]["system"] == {"cudnn": "8.9.2.26-1+cuda12.1", "nccl": "2.18.1-1+cuda12.1"}
    assert result["detail"].startswith("torch's own NCCL is 2.18.1, the matrix's bundled build is 2.20.5 (")
    assert result["detail"].endswith("; system cuDNN 8.9.2.26-1+cuda12.1, NCCL 2.18.1-1+cuda12.1")
    assert checks.report_versions(p)["system_nccl"] == "2.18.1-1+cuda12.1"
    assert checks.report_versions(p)["nccl"] == "2.18.1"


def test_no_expected_build_is_not_compared(healthy_h100: FakeHost) -> None:
    """A variant whose bundled builds the matrix does not record (the role passes nothing): reported, not judged."""
    result = checks.check_libraries(with_torch(probe(healthy_h100), cuda_torch(8700, (2, 21, 5))))
    assert result["verdict"] == "pass"
    assert result["torch_libraries"]["cudnn"] == {"torch": "8.7.0", "expected": None, "outcome": "not compared"}
    assert "torch's own cuDNN 8.7.0 (no expected build), NCCL 2.21.5 (no expected build)" in result["detail"]


def test_a_cpu_torch_says_it_has_no_cuda_instead_of_comparing(healthy_h100: FakeHost) -> None:
    """With GPUs the CPU-only build fails as before; the comparison itself only says there is no CUDA."""
    result = checks.check_libraries(
        with_torch(
            probe(healthy_h100, "--expect-torch-cudnn", "9.1.0.70", "--expect-torch-nccl", "2.21.5"),
            cuda_torch(None, None, cuda=None),
        )
    )
    assert result["torch_libraries"]["cudnn"]["outcome"] == result["torch_libraries"]["nccl"]["outcome"] == "no CUDA"
    assert result["detail"] == (
        "CPU-only torch build; cuDNN not available; NCCL not available; torch 2.13.0+cpu, "
        "CPU-only build; torch's own cuDNN/NCCL: none, the torch build has no CUDA; "
        "system cuDNN not installed, NCCL not installed"
    )


def test_a_cpu_torch_without_a_gpu_is_not_failed_by_the_comparison(
    driver_only: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU, a CPU-only torch (its version.py as the wheel installs it), no --expect-cuda: expected builds
    given or not, the check is skipped "no GPU" and says plainly that the build has no CUDA."""
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('imported')\n")
    (package / "version.py").write_text(
        "from typing import Optional\n\n__version__ = '2.13.0+cpu'\ndebug = False\n"
        "cuda: Optional[str] = None\nhip: Optional[str] = None\n"
    )
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(package.parent))
    for extra in ((), ("--expect-torch-cudnn", "9.1.0.70", "--expect-torch-nccl", "2.21.5")):
        result = checks.check_libraries(probe(driver_only, *extra))
        assert result["verdict"] == "skipped", result
        assert result["detail"] == (
            "no GPU (torch 2.13.0+cpu, CPU-only build; torch's own cuDNN/NCCL: none, the torch "
            "build has no CUDA; system cuDNN not installed, NCCL not installed)"
        )
        assert result["torch_libraries"]["nccl"]["outcome"] == "no CUDA"


@pytest.mark.parametrize("value", ["9.1", "2.21.5-1", "cu121", ""])
def test_expected_library_versions_are_major_minor_patch(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(["--expect-torch-nccl", value])
    assert exit_info.value.code == 2
    assert "expected MAJOR.MINOR.PATCH" in capsys.readouterr().err
