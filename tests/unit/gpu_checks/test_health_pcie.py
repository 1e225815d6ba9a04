"""pcie: the link width and generation against the SKU's, on real outputs."""

from __future__ import annotations

from gpufleet_check import health

from .saved_outputs import smi

# --------------------------------------------------------------------------- pcie


def test_pcie_width_below_the_sku_floor_fails() -> None:
    (found,) = health.judge_pcie(smi("h100-8gpu-535.183.01-gpu3-x8.txt"))
    assert found["gpu"].startswith("GPU 3 ") and found["verdict"] == "fail"
    assert found["evidence"] == "PCIe x8, below the H100 80GB HBM3 floor x16 (max x16)"


def test_pcie_width_of_an_unknown_model_is_judged_against_its_maximum() -> None:
    width, gen = health.judge_pcie(smi("rtx-4000-sff-ada-595.84-x8.xml"))  # idle at Gen 1: a warning as well
    assert width["verdict"] == "fail" and width["evidence"] == "PCIe x8 of max x16 (unknown model: no per-SKU floor)"
    assert gen["verdict"] == "warn" and gen["evidence"].startswith("PCIe Gen 1 of max Gen 4")


def test_pcie_width_meeting_a_dcgm_x8_floor_only_warns() -> None:
    """A T4 at x8 of x16 (a real AWS output): DCGM's diag-skus floor for 1eb8 is x8."""
    (found,) = health.judge_pcie(smi("tesla-t4-515.105.01.xml"))
    assert found["verdict"] == "warn" and "the T4 floor x8 is met" in found["evidence"]


def test_idle_gpus_at_a_lower_generation_only_warn() -> None:
    """8 x RTX 4090 idle at Gen 1 of 4 (real): a warning each, a failure only with --pcie-gen-policy fail."""
    gpus = smi("rtx4090-8gpu-535.154.05-idle.txt")
    found = health.judge_pcie(gpus)
    assert len(found) == 8 and {f["verdict"] for f in found} == {"warn"}
    assert "the GPU is idle" in found[0]["evidence"]
    assert {f["verdict"] for f in health.judge_pcie(gpus, gen_policy="fail")} == {"fail"}


def test_healthy_h100_links_pass() -> None:
    assert health.judge_pcie(smi("h100-8gpu-535.161.08-power-brake.txt")) == []
