"""nvidia_smi: the inventory nvidia-smi lists, against the GPUs expected."""

from __future__ import annotations

import pytest
from gpufleet_check import checks

from .fakes import CONSUMER_LISTING, GPU_KEYS, MISMATCH, NO_DEVICES, FakeHost, h100_listing, probe

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
