"""gpu_errors: row remapping, retired pages and ECC counters, on real outputs."""

from __future__ import annotations

from gpufleet_check import health

from .saved_outputs import smi

# --------------------------------------------------------------------------- gpu_errors


def test_healthy_gpus_have_no_error_findings() -> None:
    for name in (
        "a100-sxm4-80gb-mig-535.54.03.xml",
        "a10g-515.105.01.xml",
        "tesla-t4-515.105.01.xml",
        "h100-8gpu-535.161.08-power-brake.txt",
        "h100-8gpu-535.183.01.txt",
    ):
        assert health.judge_gpu_errors(smi(name)) == [], name


def test_row_remap_pending_asks_for_a_reboot() -> None:
    (found,) = health.judge_gpu_errors(smi("a10g-515.105.01-remap-pending.xml"))
    assert (found["verdict"], found["action"]) == ("warn", "reboot") and "row remap pending" in found["evidence"]
    (found,) = health.judge_gpu_errors(smi("h100-8gpu-535.183.01-gpu0-remap-pending.txt"))
    assert found["gpu"] == "GPU 0 (00000000:53:00.0)" and found["action"] == "reboot"


def test_row_remap_failure_replaces_the_gpu() -> None:
    (found,) = health.judge_gpu_errors(smi("a10g-515.105.01-remap-failure.xml"))
    assert (found["verdict"], found["action"]) == ("fail", "replace GPU")


def test_retired_page_pending_asks_for_a_reboot() -> None:
    (found,) = health.judge_gpu_errors(smi("tesla-t4-515.105.01-retired-pending.xml"))
    assert (found["verdict"], found["action"]) == ("warn", "reboot") and "retired page pending" in found["evidence"]


def test_uncorrected_volatile_ecc_above_the_threshold_fails() -> None:
    gpus = smi("a10g-515.105.01-volatile-dram-uncorrectable.xml")
    assert gpus[0]["ecc"]["volatile"]["uncorrected"] == 2
    (found,) = health.judge_gpu_errors(gpus, max_uncorrected=0)
    assert found["verdict"] == "fail" and found["evidence"].startswith("2 uncorrected volatile ECC error(s), max 0")
    assert health.judge_gpu_errors(gpus, max_uncorrected=2) == []


def test_corrected_ecc_above_the_threshold_warns() -> None:
    gpus = smi("a10g-515.105.01-volatile-sram-correctable.xml")
    assert gpus[0]["ecc"]["volatile"]["corrected"] == 12
    assert health.judge_gpu_errors(gpus) == []  # not judged unless a threshold is given
    (found,) = health.judge_gpu_errors(gpus, max_corrected=10)
    assert (found["verdict"], found["action"]) == ("warn", "watch")
    assert health.judge_gpu_errors(gpus, max_corrected=12) == []
