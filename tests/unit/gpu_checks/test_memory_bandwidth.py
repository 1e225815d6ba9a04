"""memory_bandwidth: the judgement with its measurement replaced, and its arithmetic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpufleet_check import checks

from .fakes import FakeHost, dgx_topology, fake_torch, h100_listing, membw_measure, probe, with_torch

# --------------------------------------------------------------------------- memory bandwidth

# Real `nvidia-smi -q` of 8 x H100 80GB HBM3 (leptonai/gpud, its .source): PCI device ID 0x233010DE, the
# H100 80GB HBM3 profile's (floors: DCGM's 1905 GB/s device memory, Azure's 48 GB/s H2D/D2H).
H100_SMI_TEXT = Path(__file__).parents[1] / "data" / "gpu" / "smi-text" / "h100-8gpu-535.183.01.txt"
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
