"""p2p_topology and allreduce_busbw: the topology nvidia-smi shows, peer access, the all-reduce's bus
bandwidth against its floor."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_check import checks, facts

from .fakes import (
    PCIE_LISTING,
    PCIE_TOPOLOGY,
    FakeHost,
    dgx_topology,
    fake_torch,
    h100_listing,
    nvlink_topology,
    probe,
    with_torch,
)

# --------------------------------------------------------------------------- topology and all-reduce


def test_nvswitch_topology(host: FakeHost) -> None:
    links = facts.parse_topology(dgx_topology())
    assert len(links) == 8 and all(len(row) == 8 for row in links)
    assert [links[i][i] for i in range(8)] == ["X"] * 8
    assert links[0][7] == links[6][1] == "NV18"
    assert facts.all_pairs_nvlink(links)

    host.nvidia_smi(h100_listing(), dgx_topology())
    result = checks.check_p2p_topology(with_torch(probe(host), fake_torch(8)))
    assert result["verdict"] == "pass" and result["value"]["links"] == links
    assert "28 NV18" in result["detail"] and "P2P on 28/28 pairs" in result["detail"]


@pytest.mark.parametrize("torch", [None, fake_torch(4)], ids=["torch-absent", "torch-sees-fewer"])
def test_p2p_not_tested_is_not_a_pass(host: FakeHost, torch: Any) -> None:
    """Issue 16, item 3: links read but peer access not tested is a warning, never a pass."""
    host.nvidia_smi(h100_listing(), dgx_topology())
    p = probe(host) if torch is None else with_torch(probe(host), torch)
    result = checks.check_p2p_topology(p)
    assert result["verdict"] == "warn", result
    assert result["value"]["p2p"] is None and "P2P not tested: " in result["detail"]


def test_pcie_topology_with_sys_warns(host: FakeHost) -> None:
    links = facts.parse_topology(PCIE_TOPOLOGY)
    assert links == [["X", "SYS"], ["SYS", "X"]]
    assert not facts.all_pairs_nvlink(links)
    host.nvidia_smi(PCIE_LISTING, PCIE_TOPOLOGY)
    result = checks.check_p2p_topology(probe(host))
    assert result["verdict"] == "warn" and "GPU0-GPU1" in result["detail"]


def test_topology_verdicts_with_peer_access() -> None:
    nvlink = [["X", "NV12", "NV12"], ["NV12", "X", "NV12"], ["NV12", "NV12", "X"]]
    all_p2p = [[None, True, True], [True, None, True], [True, True, None]]
    assert checks.judge_topology(nvlink, all_p2p)[0] == "pass"
    broken = [[None, False, True], [False, None, True], [True, True, None]]
    verdict, detail = checks.judge_topology(nvlink, broken)
    assert verdict == "fail" and "GPU0-GPU1 (NV12)" in detail
    pcie = [["X", "PIX"], ["PIX", "X"]]
    assert (
        checks.judge_topology(pcie, [[None, False], [False, None]])[0] == "pass"
    )  # PCIe without P2P: slower, not broken


def test_single_gpu_topology_is_skipped(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing().splitlines()[0] + "\n")
    result = checks.check_p2p_topology(probe(host))
    assert result["verdict"] == "skipped" and "needs 2 or more GPUs" in result["detail"]


def test_bus_bandwidth_formula() -> None:
    assert checks.bus_bandwidth_gbps(10**9, 0.01, 8) == pytest.approx(175.0)  # algbw 100 GB/s x 2*7/8
    assert checks.bus_bandwidth_gbps(10**9, 0.01, 2) == pytest.approx(100.0)
    assert checks.bus_bandwidth_gbps(256 * 2**20, 0.002, 4) == pytest.approx(256 * 2**20 / 0.002 / 1e9 * 1.5)


@pytest.mark.parametrize(
    "listing, topology, fabric, threshold, verdict",
    [
        (PCIE_LISTING, PCIE_TOPOLOGY, "pcie", 5.0, "pass"),
    ],
    ids=["pcie"],
)
def test_allreduce_threshold_follows_topology(
    host: FakeHost,
    monkeypatch: pytest.MonkeyPatch,
    listing: str,
    topology: str,
    fabric: str,
    threshold: float,
    verdict: str,
) -> None:
    host.nvidia_smi(listing, topology)
    gpus = len(listing.splitlines())
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": nbytes / 50e9, "correct": True})
    result = checks.check_allreduce_busbw(with_torch(probe(host), fake_torch(gpus)))
    assert (result["fabric"], result["threshold"], result["verdict"]) == (fabric, threshold, verdict)
    assert result["value"] == pytest.approx(50.0 * 2 * (gpus - 1) / gpus)
    assert (result["algbw_gbps"], result["world_size"], result["size_mib"]) == (pytest.approx(50.0), gpus, 256)
    assert "the flat PCIe floor (PCIe: no per-SKU floor)" in result["detail"]


# Azure/azurehpc-health-checks @ 0e0a1ac2 conf/nd96isr_h100_v5.conf: check_nccl_allreduce 460.0 1 16G (nccl-tests
# -b 16G -e 16G: 16 GiB, NVIDIA/nccl-tests src/common.cu parsesize @ a0b82b22).
def test_allreduce_of_8_h100s_is_judged_against_azures_floor_at_its_size(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.nvidia_smi(h100_listing(), dgx_topology())
    sizes: list[int] = []

    def measure(world: int, nbytes: int) -> dict[str, Any]:
        sizes.append(nbytes)
        return {"seconds": nbytes / 50e9, "correct": True}  # busbw 87.5 GB/s: a fifth of 460

    monkeypatch.setattr(checks, "measure_allreduce", measure)
    result = checks.check_allreduce_busbw(with_torch(probe(host), fake_torch(8)))
    assert (result["fabric"], result["threshold"], result["verdict"]) == ("nvlink", 460.0, "fail")
    assert result["size_mib"] == 16384 and sizes == [16 * 2**30]
    assert result["floor_profile"] == "H100 80GB HBM3"
    assert "threshold 460: the H100 80GB HBM3 floor at 16384 MiB (Azure/azurehpc-health-checks" in result["detail"]
    assert "conf/nd96isr_h100_v5.conf: check_nccl_allreduce 460.0 1 16G" in result["detail"]
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": nbytes / 300e9, "correct": True})
    assert checks.check_allreduce_busbw(with_torch(probe(host), fake_torch(8)))["verdict"] == "pass"  # 525 GB/s


@pytest.mark.parametrize(
    "extra, listing, gpus, why",
    [
        (("--quick",), None, 8, "the H100 80GB HBM3 floor 460 holds at 16384 MiB, this run is 32 MiB"),
        (("--allreduce-mib", "1024"), None, 8, "the H100 80GB HBM3 floor 460 holds at 16384 MiB, this run is 1024 MiB"),
        ((), "NVIDIA Graphics Device", 8, "unknown model: no per-SKU floor"),
        ((), None, 4, "the H100 80GB HBM3 profile has no all-reduce floor for 4 GPUs"),
    ],
    ids=["quick", "smaller-message", "unknown-model", "four-gpus"],
)
def test_allreduce_falls_back_to_the_flat_floor_and_says_why(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...], listing: str | None, gpus: int, why: str
) -> None:
    lines = h100_listing().splitlines()[:gpus]
    if listing:
        lines = [line.replace("NVIDIA H100 80GB HBM3", listing) for line in lines]
    topology = dgx_topology() if gpus == 8 else None
    host.nvidia_smi("\n".join(lines) + "\n", topology or nvlink_topology(gpus))
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": nbytes / 50e9, "correct": True})
    result = checks.check_allreduce_busbw(with_torch(probe(host, *extra), fake_torch(gpus)))
    assert (result["fabric"], result["threshold"], result["floor_profile"]) == ("nvlink", 100.0, None)
    assert f"threshold 100: the flat NVLink/NVSwitch floor ({why})" in result["detail"]


def test_allreduce_wrong_sum_fails(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    host.nvidia_smi(PCIE_LISTING, PCIE_TOPOLOGY)
    monkeypatch.setattr(checks, "measure_allreduce", lambda world, nbytes: {"seconds": 1.0, "correct": False})
    result = checks.check_allreduce_busbw(with_torch(probe(host, "--quick"), fake_torch(2)))
    assert result["verdict"] == "fail" and result["detail"].startswith("wrong all-reduce result")
    assert result["size_mib"] == 32


def test_allreduce_needs_two_gpus(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing().splitlines()[0] + "\n")
    result = checks.check_allreduce_busbw(with_torch(probe(host), fake_torch(1)))
    assert result["verdict"] == "skipped" and result["detail"].startswith("needs 2 or more GPUs")


def test_p2p_with_peer_access(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing(), dgx_topology())
    result = checks.check_p2p_topology(with_torch(probe(host), fake_torch(8)))
    assert result["verdict"] == "pass" and "P2P on 28/28 pairs" in result["detail"]
    assert result["value"]["p2p"][0] == [None] + [True] * 7
    no_peer = fake_torch(8, peer_access=lambda i, j: {i, j} != {2, 6})
    result = checks.check_p2p_topology(with_torch(probe(host), no_peer))
    assert result["verdict"] == "fail" and "NVLink without peer access: GPU2-GPU6 (NV18)" in result["detail"]
