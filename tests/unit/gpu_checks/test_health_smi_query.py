"""The parser of `nvidia-smi -q -x` and `nvidia-smi -q`, on real outputs."""

from __future__ import annotations

import pytest
from gpufleet_check import health, profiles

from .saved_outputs import smi

# --------------------------------------------------------------------------- nvidia-smi -q -x / -q: the parser


def test_xml_a100_mig_clocks_event_reasons() -> None:
    """DTD v12 (535.54.03): <clocks_event_reasons>, MIG enabled, remapped rows N/A under MIG, fabric N/A."""
    (gpu,) = smi("a100-sxm4-80gb-mig-535.54.03.xml")
    assert (gpu["name"], gpu["architecture"], gpu["bus_id"]) == ("NVIDIA A100-SXM4-80GB", "Ampere", "00000000:01:00.0")
    assert profiles.device_id(gpu["pci_device_id"]) == "20B2"
    assert gpu["mig"] == {"current": "Enabled", "pending": "Enabled"}
    assert gpu["ecc_mode"]["current"] == "Enabled"
    assert gpu["ecc"]["volatile"] == {"corrected": 0, "uncorrected": 0}
    assert gpu["remapped_rows"] is None and gpu["fabric"] == {"state": None, "status": None}
    assert gpu["pcie"] == {"gen_current": 4, "gen_max": 4, "width_current": 16, "width_max": 16}
    assert gpu["clock_reasons"]["gpu_idle"] is False and not any(gpu["clock_reasons"].values())
    assert (gpu["temperature"]["gpu"], gpu["temperature"]["slowdown"]) == (27.0, 89.0)
    assert gpu["persistence_mode"] is False


def test_xml_a10g_clocks_throttle_reasons_and_remapped_rows() -> None:
    """DTD v11 (515.105.01): <clocks_throttle_reasons>, remapped rows present; the XML's device ID is 000000DE."""
    (gpu,) = smi("a10g-515.105.01.xml")
    assert gpu["clock_reasons"]["gpu_idle"] is True
    assert set(gpu["clock_reasons"]) == set(health.CLOCK_REASONS)
    assert gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert gpu["pcie"] == {"gen_current": 1, "gen_max": 4, "width_current": 8, "width_max": 16}
    assert profiles.device_id(gpu["pci_device_id"]) == "0000"
    assert health.gpu_profile(gpu)[0] == "A10G"  # by name, the ID matching none


def test_xml_t4_retired_pages() -> None:
    (gpu,) = smi("tesla-t4-515.105.01.xml")
    assert gpu["architecture"] == "Turing" and gpu["remapped_rows"] is None
    assert gpu["retired_pages"] == {"single_bit": 0, "double_bit": 0, "pending": False}
    assert smi("tesla-t4-515.105.01-retired-pending.xml")[0]["retired_pages"]["pending"] is True


def test_xml_v13_sram_parity_and_secded() -> None:
    """DTD v13 (595.84) splits SRAM uncorrectable into _parity and _secded; ECC off: every count N/A."""
    (gpu,) = smi("rtx-4000-sff-ada-595.84.xml")
    assert gpu["ecc_mode"]["current"] == "Disabled"
    assert gpu["ecc"]["volatile"] == {"corrected": None, "uncorrected": None}
    assert gpu["remapped_rows"]["pending"] is False
    assert gpu["temperature"]["tlimit_margin"] == 49.0


def test_text_h100_eight_gpus() -> None:
    gpus = smi("h100-8gpu-535.161.08-power-brake.txt")
    assert len(gpus) == 8 and [g["index"] for g in gpus] == list(range(8))
    assert gpus[0]["bus_id"] == "00000000:19:00.0" and gpus[1]["bus_id"] == "00000000:3B:00.0"
    assert {profiles.device_id(g["pci_device_id"]) for g in gpus} == {"2330"}
    assert {health.gpu_profile(g)[0] for g in gpus} == {"H100 80GB HBM3"}
    gpu = gpus[0]
    assert gpu["fabric"] == {"state": "Completed", "status": "Success"}
    assert gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert gpu["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16}
    reasons = {k for k, v in gpu["clock_reasons"].items() if v}
    assert reasons == {"hw_slowdown", "hw_power_brake_slowdown"}  # indented under HW Slowdown in the text
    assert gpu["mig"] == {"current": "Disabled", "pending": "Disabled"} and gpu["persistence_mode"] is True


def test_h200_capture_xml_and_text_agree() -> None:
    """The lent H200 (tests/gpu/device-check.sh, 2026-12-04): both forms of nvidia-smi -q read alike."""
    (xml,) = smi("h200-580.159.04-passthrough.xml")
    (text,) = smi("h200-580.159.04-passthrough.txt")
    assert profiles.device_id(xml["pci_device_id"]) == profiles.device_id(text["pci_device_id"]) == "2335"
    assert {k: v for k, v in xml.items() if k != "pci_device_id"} == {
        k: v for k, v in text.items() if k != "pci_device_id"
    }
    assert health.gpu_profile(xml)[0] == "H200"
    assert xml["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16}
    assert xml["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert xml["temperature"]["tlimit_margin"] == 42.0 and xml["fabric"] == {"state": None, "status": None}
    assert health.judge_gpu_errors([xml]) == []


def test_text_volta_and_xml_agree_on_the_record_keys() -> None:
    (volta,) = smi("titan-v-560.35.03.txt")
    assert volta["architecture"] == "Volta" and volta["remapped_rows"] is None
    assert volta["temperature"]["slowdown"] == 97.0
    (xml,) = smi("tesla-t4-515.105.01.xml")
    assert set(volta) == set(xml) == set(health.GPU_KEYS)


@pytest.mark.parametrize("text", ["", "<html></html>", "Failed to initialize NVML: Driver/library version mismatch"])
def test_not_smi_output_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        health.parse_smi_query(text)
