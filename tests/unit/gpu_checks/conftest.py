"""The fixtures of the gpu_checks tests: torch blocked in this process, the fake host."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .fakes import FakeHost, dgx_topology, h100_listing

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
