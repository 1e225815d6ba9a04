"""The fixtures of the gpu_checks tests: torch blocked in this process, the fake host; for the health checks,
local time in UTC and a one-GPU host that prints a real nvidia-smi -q -x."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from .fakes import FakeHost, dgx_topology, h100_listing
from .saved_outputs import CAT, DATA, fake_tool

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError


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


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Local time is UTC: dmesg -T and syslog lines carry local time without an offset."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def gpu_host(tmp_path: Path) -> Path:
    """A machine with one GPU on the PCI bus whose nvidia-smi -q -x prints a real A100 (MIG) XML, and
    nothing else: nvlink prints nothing."""
    (tmp_path / "bin").mkdir()
    device = tmp_path / "sysfs" / "0000:01:00.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x10de\n")
    (device / "class").write_text("0x030200\n")
    xml = DATA / "smi-xml" / "a100-sxm4-80gb-mig-535.54.03.xml"
    fake_tool(tmp_path / "bin", "nvidia-smi", f'if [ "$1" = "-q" ]; then "{CAT}" "{xml}"; fi\nexit 0\n')
    return tmp_path
