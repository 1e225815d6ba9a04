"""gemm: the slowest GPU, the reference figures and the floor."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_check import checks, cli

from .fakes import FakeHost, by_name, fake_torch
from .payload_path import PAYLOAD_DIR

# --------------------------------------------------------------------------- GEMM


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
