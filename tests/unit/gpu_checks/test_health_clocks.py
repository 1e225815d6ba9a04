"""clocks: throttle reasons, temperature and MIG mode, on real outputs."""

from __future__ import annotations

from gpufleet_check import health

from .saved_outputs import smi

# --------------------------------------------------------------------------- clocks


def test_power_brake_on_every_gpu_fails() -> None:
    """gpud's 8 x H100 (535.161.08) with HW Power Brake Slowdown active on every GPU: real."""
    found = health.judge_clocks(smi("h100-8gpu-535.161.08-power-brake.txt"))
    assert len(found) == 8 and {f["verdict"] for f in found} == {"fail"}
    assert "HW power brake slowdown" in found[0]["evidence"] and "power" in found[0]["action"]


def test_one_braked_gpu_fails_and_its_lesser_reasons_are_not_repeated() -> None:
    """gpud's 8 x H100 (535.183.01): GPU 2 has HW Power Brake and SW Thermal Slowdown active (real)."""
    gpus = smi("h100-8gpu-535.183.01.txt")
    assert {k for k, v in gpus[2]["clock_reasons"].items() if v} == {
        "hw_power_brake_slowdown",
        "sw_thermal_slowdown",
        "sw_power_cap",
    }
    (found,) = health.judge_clocks(gpus)
    assert (found["gpu"], found["verdict"]) == ("GPU 2 (00000000:75:00.0)", "fail")
    gpus[2]["clock_reasons"]["hw_power_brake_slowdown"] = False  # without the brake, the lesser reasons warn
    (found,) = health.judge_clocks(gpus)
    assert (found["verdict"], found["evidence"].split(" (")[0]) == ("warn", "active SW thermal slowdown")


def test_hw_thermal_slowdown_fails() -> None:
    (found,) = health.judge_clocks(smi("a100-sxm4-80gb-mig-535.54.03-hw-thermal.xml"))
    assert found["verdict"] == "fail" and "HW thermal slowdown" in found["evidence"]
    assert health.judge_clocks(smi("a100-sxm4-80gb-mig-535.54.03.xml")) == []


def test_idle_and_power_cap_are_not_findings() -> None:
    for name in ("rtx4090-8gpu-535.154.05-idle.txt", "a10g-515.105.01.xml"):
        assert health.judge_clocks(smi(name)) == [], name


def test_temperature_at_the_slowdown_threshold_warns() -> None:
    (found,) = health.judge_clocks(smi("tesla-t4-515.105.01-hot.xml"))
    assert found["verdict"] == "warn" and found["evidence"] == "93 C, at or past its slowdown threshold 93 C"


def test_mig_mode_against_the_expectation() -> None:
    gpus = smi("a100-sxm4-80gb-mig-535.54.03.xml")
    assert health.judge_clocks(gpus, "enabled") == []
    (found,) = health.judge_clocks(gpus, "disabled")
    assert found["verdict"] == "fail" and found["evidence"] == "MIG mode Enabled, the site expects disabled"
    assert health.judge_clocks(smi("h100-8gpu-535.161.08-power-brake.txt"), "disabled")[0]["verdict"] == "fail"
