"""gpufleet_check.nccl: what NCCL's own INFO log says it used between nodes, and the smoke training's network verdict.

The logs are real NCCL output copied verbatim from published GitHub issues, or captured on the lent H200 by
tests/gpu/device-check.sh with its stack (tests/unit/data/nccl/, each file
naming its source in its header; the one failure case made by editing a real log says which field it edits).
The verdict (nccl.judge) is what roles/smoke_training applies through the filter gpufleet.fleet.smoke_network.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from conftest import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "nccl"
PAYLOAD_DIR = REPO_ROOT / "roles" / "payload" / "files"
if str(PAYLOAD_DIR) not in sys.path:
    sys.path.insert(0, str(PAYLOAD_DIR))

from gpufleet_check import nccl  # noqa: E402  (after the sys.path entry)

smoke_filter = load_script(REPO_ROOT / "plugins" / "filter" / "smoke_network.py", "gpufleet_smoke_network")


def log(name: str) -> str:
    """A data file's log lines, without its header (the comment lines that cite the source)."""
    lines = (DATA / name).read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("# "))


def reading(*names: str) -> dict[str, Any]:
    return nccl.summarize(nccl.parse_log(log(name)) for name in names)


# --------------------------------------------------------------------------- the data


def test_every_log_cites_its_published_source():
    files = sorted(DATA.glob("*.log"))
    assert len(files) >= 10
    for path in files:
        header = [line for line in path.read_text().splitlines() if line.startswith("# ")]
        assert header and header[0].startswith(
            ("# Source: https://github.com/", "# Source: captured on the lent GPU machine of tests/gpu/device-check.sh")
        ), path.name
        if "device-check.sh" in header[0]:
            assert "driver" in " ".join(header) and "torch" in " ".join(header), path.name  # its stack
        text = " ".join(header)
        assert "Verbatim" in text or "verbatim" in text, path.name
        assert ("EDITED" in text) == ("edited" in path.name), path.name  # an edited log says so, and which field


# --------------------------------------------------------------------------- one node's reading

CASES = {
    # file: (transport, gdr, crossed, networks, version)
    "socket-nccl-tests-284.log": ("Socket", "off", True, ["Socket"], "2.25.1"),
    # NCCL 2.28's plugin lines ("Initialized NET plugin Socket", "Assigned NET plugin Socket to comm"), one rank
    "socket-h200-device-check-2.28.9.log": ("Socket", "off", False, ["Socket"], "2.28.9"),
    "roce-gdr-disabled-nccl-1537.log": ("RoCE", "off", False, ["IB"], None),
    "gdr-disabled-nccl-1939.log": ("IB/RoCE", "off", False, ["IB"], None),
    "gdr-disabled-nccl-1676.log": ("IB/RoCE", "off", False, ["IB"], None),
    "ib-gdrdma-nccl-707.log": ("IB/RoCE", "on", True, ["IB"], None),
    "ib-gdrdma-nccl-707-edited-one-without-gdr.log": ("IB/RoCE", "partial", True, ["IB"], None),
    "ib-gdrdma-aks-rdma-infiniband-36.log": ("IB/RoCE", "on", True, ["IB"], None),
    "roce-nccl-tests-185.log": ("RoCE", None, False, ["IB"], "2.19.3"),
    "ibext-sharp-nccl-988.log": ("IB", None, False, ["IBext"], "2.12.9"),
    "ibext-v8-gdrdma-nccl-1453.log": ("IB/RoCE", "on", True, ["IBext_v8"], None),
    "ib-socket-bootstrap-nv-peer-memory-56.log": ("IB", None, False, ["IB"], "2.4.7"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_published_log_is_read_as_its_source_describes(name: str):
    found = reading(name)
    assert (found["transport"], found["gdr"], found["crossed"], found["networks"], found["version"]) == CASES[name]
    assert found["evidence"] and all(line in log(name).splitlines() for line in found["evidence"])


def test_every_data_file_is_a_case():
    assert sorted(p.name for p in DATA.glob("*.log")) == sorted(CASES)


def test_socket_fallback_names_its_interface_and_connections():
    found = reading("socket-nccl-tests-284.log")
    assert found["sockets"] == ["eno2"] and found["hcas"] == []
    assert found["connections"] == {"total": 8, "gdr": 0}
    assert "data goes through host memory" in found["gdr_basis"]
    assert any("via NET/Socket/0" in line for line in found["evidence"])


def test_roce_hcas_and_their_disabled_gpudirect_rdma():
    found = reading("roce-gdr-disabled-nccl-1537.log")
    assert found["hcas"] == [
        {"name": "mlx5_0", "port": 1, "link": "RoCE"},
        {"name": "mlx5_1", "port": 1, "link": "RoCE"},
    ]
    assert (
        found["gdr_basis"].startswith("HCA lines (no NET connection logged)") and "mlx5_0, mlx5_1" in found["gdr_basis"]
    )


def test_sharp_plugin_hcas_are_infiniband():
    found = reading("ibext-sharp-nccl-988.log")
    assert [h["name"] for h in found["hcas"]] == [f"mlx5_{i}" for i in range(8)]
    assert {h["link"] for h in found["hcas"]} == {"IB"}


def test_a_bootstrap_socket_line_beside_infiniband_is_not_a_socket_transport():
    """NCCL 2.4 printed "NET/Socket : Using [0]ib0" for its bootstrap next to "NET/IB : Using [0]mlx5_0:1/IB"."""
    found = reading("ib-socket-bootstrap-nv-peer-memory-56.log")
    assert found["transport"] == "IB" and found["sockets"] == ["ib0"]


def test_the_link_layer_of_the_hca_lines_names_the_connections_transport():
    """The HCA lines of one log and the NET connections of another (one node's ranks): RoCE with GPUDirect RDMA."""
    found = reading("roce-nccl-tests-185.log", "ibext-v8-gdrdma-nccl-1453.log")
    assert (found["transport"], found["gdr"], found["crossed"]) == ("RoCE", "on", True)
    assert found["networks"] == ["IBext_v8"] and found["logs"] == 2


def test_one_connection_without_gdrdma_makes_it_partial_and_is_shown():
    found = reading("ib-gdrdma-nccl-707-edited-one-without-gdr.log")
    assert found["gdr_basis"] == "11 of 12 NET connection(s) via /GDRDMA"
    assert any(line.endswith("[send] via NET/IB/2") for line in found["evidence"])


def test_warnings_are_kept_apart_and_bounded():
    text = "\n".join(
        f"node:1:2 [0] transport/net_ib.cc:818 NCCL WARN NET/IB : Got completion with error {i}" for i in range(9)
    )
    found = nccl.parse_log(text)
    assert (
        len(found["warnings"]) == nccl.MAX_WARNINGS and found["warnings"][0] == "NET/IB : Got completion with error 0"
    )
    assert found["evidence"] == [] and found["networks"] == []


def test_read_logs_reads_every_rank_file_and_none_without_nccl(tmp_path: Path):
    assert nccl.read_logs(tmp_path) is None  # gloo: no rank wrote a NCCL log
    (tmp_path / "nccl-node1-101.log").write_text(log("roce-nccl-tests-185.log"))
    (tmp_path / "nccl-node1-102.log").write_text(log("ibext-v8-gdrdma-nccl-1453.log"))
    shutil.copy(DATA / "socket-nccl-tests-284.log", tmp_path / "torchrun.log")  # not a NCCL_DEBUG_FILE name
    found = nccl.read_logs(tmp_path)
    assert (found["logs"], found["transport"], found["gdr"]) == (2, "RoCE", "on")


def test_debug_env_writes_one_file_per_rank_in_the_directory(tmp_path: Path):
    env = nccl.debug_env(tmp_path)
    assert env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_DEBUG_FILE": str(tmp_path / "nccl-%h-%p.log"),
    }
    assert Path(env["NCCL_DEBUG_FILE"].replace("%h", "node1").replace("%p", "42")).match(nccl.LOG_GLOB)


# --------------------------------------------------------------------------- the verdict

FLOORS = {"rdma": 6.0, "socket": 0.0, "gloo": 0.0}


def network(backend: str, busbw: float | None, nodes: int = 2, world_busbw: float = 100.0) -> dict[str, Any]:
    """The payload's network figures (train_measure.py's time_all_reduce) of a run on `nodes` nodes, 8 ranks each."""
    return {
        "backend": backend,
        "measured": "gloo over TCP" if backend == "gloo" else "NCCL",
        "size_bytes": 64 * 2**20,
        "warmup": 5,
        "iters": 20,
        "world": {"ranks": 8 * nodes, "seconds": 0.01, "algbw_gbps": 1.0, "busbw_gbps": world_busbw},
        "inter_node": {"ranks": nodes, "seconds": 0.01 if busbw else None, "algbw_gbps": busbw, "busbw_gbps": busbw},
    }


def nodes(*names: str | None) -> list[dict[str, Any]]:
    return [{"host": f"gpu{i}", "nccl": reading(name) if name else None} for i, name in enumerate(names, 1)]


def test_gloo_says_what_it_measured_and_reads_no_transport():
    verdict = nccl.judge(network("gloo", 0.4), nodes(None, None), FLOORS)
    assert verdict["verdict"] == "pass" and verdict["problems"] == []
    assert (verdict["measured"], verdict["transport"], verdict["busbw_gbps"]) == ("gloo over TCP", None, 0.4)
    assert "transport not read: the run used gloo, not NCCL" in " ".join(verdict["notes"])
    assert "no floor for gloo over TCP (smoke_training_min_busbw_gloo_gbps is 0)" in " ".join(verdict["notes"])
    assert verdict["floor_gbps"] == 0.0 and verdict["nodes_crossed"] == 2


def test_a_gloo_floor_is_judged_against_the_gloo_figure():
    low = nccl.judge(network("gloo", 0.4), nodes(None, None), {**FLOORS, "gloo": 1.0})
    assert low["verdict"] == "fail" and low["problems"] == [
        "cross-node all-reduce bus bandwidth 0.4 GB/s (one rank per node, 2 nodes, 64 MiB, gloo over TCP) is below "
        "the floor 1 GB/s (smoke_training_min_busbw_gloo_gbps)"
    ]
    assert nccl.judge(network("gloo", 1.5), nodes(None, None), {**FLOORS, "gloo": 1.0})["verdict"] == "pass"


def test_nccl_over_infiniband_with_gpudirect_rdma_passes_its_floor_and_expectations():
    verdict = nccl.judge(
        network("nccl", 23.5),
        nodes("ibext-sharp-nccl-988.log", "ibext-sharp-nccl-988.log"),
        FLOORS,
        expect_transport="ib",
    )
    assert verdict["verdict"] == "pass", verdict["problems"]
    assert (verdict["transport"], verdict["floor_gbps"], verdict["measured"]) == ("IB", 6.0, "NCCL over IB")


def test_nccl_below_the_rdma_floor_fails_naming_the_setting():
    verdict = nccl.judge(network("nccl", 2.1), nodes("roce-nccl-tests-185.log", "roce-nccl-tests-185.log"), FLOORS)
    assert verdict["problems"] == [
        "cross-node all-reduce bus bandwidth 2.1 GB/s (one rank per node, 2 nodes, 64 MiB, NCCL over RoCE) is below "
        "the floor 6 GB/s (smoke_training_min_busbw_rdma_gbps)"
    ]


def test_a_socket_fallback_fails_an_infiniband_fleet_naming_the_node_and_the_line():
    verdict = nccl.judge(
        network("nccl", 4.9),
        nodes("socket-nccl-tests-284.log", "socket-nccl-tests-284.log"),
        FLOORS,
        expect_transport="ib",
    )
    assert verdict["verdict"] == "fail" and verdict["measured"] == "NCCL over Socket (GPUDirect RDMA off)"
    assert verdict["problems"][0].startswith(
        "gpu1: NCCL used Socket between nodes, expected IB (smoke_training_expect_transport) ["
    )
    assert "NET/Socket : Using [0]eno2:10.42.0.2<0>" in verdict["problems"][0]
    assert len(verdict["problems"]) == 2  # both nodes; the socket floor is 0: not judged
    assert "no floor for NCCL over Socket" in " ".join(verdict["notes"])


def test_gpudirect_rdma_disabled_fails_a_fleet_that_expects_it():
    """NVIDIA/nccl#1537: RoCE, nvidia_peermem loaded, yet "GPU Direct RDMA Disabled for HCA 0 'mlx5_0'"."""
    verdict = nccl.judge(
        network("nccl", 20.0),
        nodes("roce-gdr-disabled-nccl-1537.log", "roce-gdr-disabled-nccl-1537.log"),
        FLOORS,
        expect_transport="roce",
        expect_gdr=True,
    )  # YAML's true, as Ansible may pass it
    assert [p.split(" (")[0] for p in verdict["problems"]] == ["gpu1: GPUDirect RDMA off", "gpu2: GPUDirect RDMA off"]
    assert "expected on (smoke_training_expect_gdr)" in verdict["problems"][0]


def test_gpudirect_rdma_on_some_connections_only_is_not_on():
    verdict = nccl.judge(
        network("nccl", 20.0),
        nodes("ib-gdrdma-nccl-707.log", "ib-gdrdma-nccl-707-edited-one-without-gdr.log"),
        FLOORS,
        expect_gdr="true",
    )
    assert verdict["problems"] == [
        "gpu2: GPUDirect RDMA partial (11 of 12 NET connection(s) via /GDRDMA), expected on (smoke_training_expect_gdr)"
    ]
    assert "GPUDirect RDMA differs between nodes: gpu1 on, gpu2 partial" in verdict["notes"]


def test_nodes_on_different_transports_are_named():
    verdict = nccl.judge(network("nccl", 20.0), nodes("ib-gdrdma-nccl-707.log", "socket-nccl-tests-284.log"), FLOORS)
    assert verdict["problems"] == ["the nodes used different transports: gpu1 IB/RoCE, gpu2 Socket"]
    assert verdict["transport"] is None and verdict["floor_gbps"] is None


def test_nccl_without_any_log_reading_fails():
    verdict = nccl.judge(network("nccl", 20.0), nodes(None, None), FLOORS)
    assert verdict["problems"] == ["NCCL's log named no transport on any node (NCCL_DEBUG_FILE unreadable?)"]


def test_an_expectation_fails_a_run_that_did_not_use_nccl():
    verdict = nccl.judge(network("gloo", 0.4), nodes(None, None), FLOORS, expect_transport="ib", expect_gdr="false")
    assert verdict["problems"] == [
        "expected NCCL over IB between nodes (smoke_training_expect_transport), but the run used gloo (no GPU?)",
        "expected GPUDirect RDMA off (smoke_training_expect_gdr), but the run used gloo, not NCCL",
    ]


def test_one_node_judges_nothing_between_nodes():
    verdict = nccl.judge(
        network("nccl", None, nodes=1), nodes("socket-nccl-tests-284.log"), FLOORS, expect_transport="ib"
    )
    assert verdict["verdict"] == "pass" and "one node: no all-reduce crossed nodes" in " ".join(verdict["notes"])


def test_nothing_measured_is_said():
    verdict = nccl.judge(None, nodes(None), FLOORS)
    assert verdict["verdict"] == "pass" and verdict["measured"] == "nothing measured"
    assert verdict["busbw_gbps"] is None and verdict["notes"][0].startswith("bus bandwidth not measured")


@pytest.mark.parametrize("keywords", [{"expect_transport": "infiniband"}, {"expect_gdr": "maybe"}])
def test_an_unknown_expectation_is_refused(keywords: dict[str, str]):
    with pytest.raises(ValueError, match="is not known"):
        nccl.judge(None, [], FLOORS, **keywords)


def test_the_filter_is_the_judge_and_names_bad_input():
    assert smoke_filter.smoke_network(network("gloo", 0.4), nodes(None, None), FLOORS) == nccl.judge(
        network("gloo", 0.4), nodes(None, None), FLOORS
    )
    with pytest.raises(AnsibleFilterError, match="smoke_network: expect_transport 'fast'"):
        smoke_filter.smoke_network(None, [], FLOORS, "fast")
    with pytest.raises(AnsibleFilterError, match="must be a mapping"):
        smoke_filter.smoke_network("64 MiB", [], FLOORS)
