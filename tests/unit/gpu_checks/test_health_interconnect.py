"""interconnect: InfiniBand / RoCE ports from a real sysfs tree, and nvidia-peermem."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpufleet_check import health

from .saved_outputs import IB_TREE, verdicts

# --------------------------------------------------------------------------- InfiniBand / RoCE


def test_ib_ports_from_sysfs() -> None:
    ports = health.parse_ib_ports(IB_TREE)
    assert len(ports) == 9
    ib = [p for p in ports if p["link_layer"] == "InfiniBand"]
    assert len(ib) == 8 and {(p["state"], p["phys_state"], p["rate_gbps"]) for p in ib} == {("ACTIVE", "LinkUp", 400.0)}
    (roce,) = [p for p in ports if p["link_layer"] == "Ethernet"]
    assert (roce["device"], roce["rate"]) == ("mlx5_bond_0", "200 Gb/sec (2X NDR)")
    assert health.parse_ib_ports(IB_TREE / "missing") == []


def test_ib_expectations() -> None:
    ports = health.parse_ib_ports(IB_TREE)
    found, counted = health.judge_ib_ports(ports, expect_ports=8, min_rate_gbps=400, link_layer="InfiniBand")
    assert (found, len(counted)) == ([], 8)
    found, _counted = health.judge_ib_ports(ports, expect_ports=9, min_rate_gbps=400)
    assert [f["verdict"] for f in found] == ["warn", "fail"]  # the 200 Gb/s RoCE port: slow, and one short
    assert found[1]["evidence"] == "8 InfiniBand/RoCE port(s) ACTIVE at >= 400 Gb/s, expected 9"


def test_a_down_ib_port_fails_the_expectation(tmp_path: Path) -> None:
    """The real tree, copied, with ONE file edited: mlx5_4 port 1 state '4: ACTIVE' -> '1: DOWN'."""
    tree = tmp_path / "infiniband"
    shutil.copytree(IB_TREE, tree)
    state = tree / "mlx5_4" / "ports" / "1" / "state"
    assert state.read_text() == "4: ACTIVE"
    state.write_text("1: DOWN")
    ports = health.parse_ib_ports(tree)
    found, counted = health.judge_ib_ports(ports, expect_ports=8, min_rate_gbps=400, link_layer="InfiniBand")
    assert len(counted) == 7
    assert [(f["gpu"], f["verdict"]) for f in found] == [("mlx5_4 port 1", "warn"), ("node", "fail")]
    found, _counted = health.judge_ib_ports(ports)  # no expectation: a warning only
    assert verdicts(found) == [("mlx5_4 port 1", "warn")]


def test_peermem(tmp_path: Path) -> None:
    assert health.peermem_loaded(tmp_path) is False
    (tmp_path / "nvidia_peermem").mkdir()
    assert health.peermem_loaded(tmp_path) is True
