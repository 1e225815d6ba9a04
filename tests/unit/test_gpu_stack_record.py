"""tests/gpu/stack_record.py: a GPU-tier run says which stack it measured, against the matrix (issue 15)."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO_ROOT, load_script

record = load_script(REPO_ROOT / "tests" / "gpu" / "stack_record.py")
MATRIX_FILE = REPO_ROOT / "files" / "compatibility.yml"
MATRIX = yaml.safe_load(MATRIX_FILE.read_text())

# PyPI's torch 2.3.1 is the cu121 build with cuDNN 8.9.2.26 and NCCL 2.20.5 (https://pypi.org/project/torch/2.3.1/);
# torch itself says 2.3.1+cu121 (the wheel's torch/version.py).
LAB_STACK = {
    "torch": "2.3.1+cu121",
    "cuda": "12.1",
    "cudnn": "8.9.2",
    "nccl": "2.20.5",
    "gpus": ["NVIDIA H200"],
    "driver": "580.95.05",
    "python": "3.11.7",
}


def test_the_matrix_stack_is_named_as_such() -> None:
    compared = record.compare(LAB_STACK, MATRIX)
    assert compared == {
        "variant": "cu121",
        "matrix": {"cuda": "12.1", "cudnn": "8.9.2.26", "nccl": "2.20.5"},
        "differences": [],
        "matrix_stack": True,
    }
    assert record.summary(LAB_STACK, compared).endswith(": the matrix's cu121 stack")


@pytest.mark.parametrize(
    ("measured", "difference"),
    [
        # PyPI's torch 2.5.1 is a CUDA 12.4 build (https://pypi.org/project/torch/2.5.1/).
        (
            {"torch": "2.5.1+cu124", "cuda": "12.4", "cudnn": "9.1.0", "nccl": "2.21.5"},
            "the matrix records no cu124 build of torch 2.5.1",
        ),
        # A torch built locally for CUDA 11.8 without a local version is not PyPI's 2.3.1 (cu121).
        (
            {"torch": "2.3.1", "cuda": "11.8", "cudnn": "8.7.0", "nccl": "2.15.5"},
            "torch 2.3.1 without a local version is PyPI's cu121 build, this one reports cu118",
        ),
        (
            {"torch": "2.8.0+cu128", "cuda": "12.8", "cudnn": "9.10.2", "nccl": "2.27.3"},
            "torch 2.8.0 is not a release files/compatibility.yml knows",
        ),
        (
            {"torch": "2.3.1+cu121", "cuda": "12.1", "cudnn": "8.9.2", "nccl": "2.18.1"},
            "nccl 2.18.1, the matrix's is 2.20.5",
        ),
    ],
    ids=["pypi-2.5.1", "local-build", "unknown-release", "nccl-swapped"],
)
def test_another_stack_is_said_plainly(measured: dict, difference: str) -> None:
    measured = {**LAB_STACK, **measured}
    compared = record.compare(measured, MATRIX)
    assert compared["matrix_stack"] is False and difference in compared["differences"], compared
    line = record.summary(measured, compared)
    assert "NOT the stack gpufleet installs" in line and line.endswith("figures are of this stack")


def test_the_matrix_reads_without_pyyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device machine's Python may lack PyYAML: the flow-style rows are read with the same result."""
    import builtins

    real_import = builtins.__import__

    def no_yaml(name: str, *args, **kwargs):
        if name == "yaml":
            raise ImportError("No module named 'yaml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_yaml)
    fallback = record.load_matrix(MATRIX_FILE)
    assert set(fallback["pytorch_releases"]) == set(MATRIX["pytorch_releases"])
    for release, row in MATRIX["pytorch_releases"].items():
        assert fallback["pytorch_releases"][release].get("bundled") == row.get("bundled"), release
        assert fallback["pytorch_releases"][release].get("pypi") == row.get("pypi"), release


def test_device_check_writes_the_record() -> None:
    script = (REPO_ROOT / "tests" / "gpu" / "device-check.sh").read_text()
    assert '"$here/tests/gpu/stack_record.py" "$here/files/compatibility.yml" "$out/stack.json"' in script


def test_measure_reads_torch_as_the_health_checks_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure() decodes torch's cuDNN/NCCL answers with gpufleet_check's readers (8902 -> 8.9.2), on a
    machine without nvidia-smi too."""
    from types import SimpleNamespace

    fake = SimpleNamespace(
        __version__="2.3.1+cu121",
        version=SimpleNamespace(cuda="12.1"),
        backends=SimpleNamespace(cudnn=SimpleNamespace(is_available=lambda: True, version=lambda: 8902)),
        cuda=SimpleNamespace(nccl=SimpleNamespace(version=lambda: (2, 20, 5))),
    )
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    monkeypatch.setenv("PATH", "/nonexistent")
    measured = record.measure()
    assert {k: measured[k] for k in ("torch", "cuda", "cudnn", "nccl")} == {
        "torch": "2.3.1+cu121",
        "cuda": "12.1",
        "cudnn": "8.9.2",
        "nccl": "2.20.5",
    }
    assert measured["gpus"] == [] and measured["driver"] is None
