"""roles/smoke_training without a host: what play 1 refuses of its network settings, and the run's network verdict.

The role runs for real (tests/unit/role_run.py). Its validate.yml runs on one fake host per case. The verdict:
a fake cluster of two nodes gets each node's output of ``gpufleet_check train`` as a host variable (as run.yml's
"Read what each node's torchrun reported" leaves it: rank 0's result on the first node, and each node's reading
of NCCL's log, here made by gpufleet_check.nccl from published NCCL logs, tests/unit/data/nccl/), then copies of
run.yml's "Judge the network between the nodes" and "Judge the run" run, and the "Show the smoke training" line
is templated.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import role_run
from conftest import FAKE_FACTS

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "nccl"
PAYLOAD_DIR = REPO_ROOT / "roles" / "payload" / "files"
if str(PAYLOAD_DIR) not in sys.path:
    sys.path.insert(0, str(PAYLOAD_DIR))

from gpufleet_check import nccl  # noqa: E402  (after the sys.path entry)

RUNS = role_run.Batch(FAKE_FACTS, [role_run.import_role("smoke_training")])


# --------------------------------------------------------------------------- what play 1 refuses, before any change

WRONG = [
    (
        {"smoke_training_busbw_mib": -1},
        "smoke_training_busbw_mib '-1' is not a size in MiB from 0 (not measured) to 16384",
    ),
    ({"smoke_training_busbw_mib": 65536}, "smoke_training_busbw_mib '65536' is not a size in MiB"),
    ({"smoke_training_busbw_iters": 0}, "smoke_training_busbw_iters '0' is not a number of all-reduces (1 or more)"),
    (
        {"smoke_training_min_busbw_rdma_gbps": -6},
        "smoke_training_min_busbw_rdma_gbps, _socket_gbps and _gloo_gbps must be "
        "GB/s of 0 or more (0: not judged), got -6.0, 0.0, 0.0",
    ),
    (
        {"smoke_training_busbw_mib": 0},
        "smoke_training_busbw_mib is 0 (nothing measured) but a "
        "smoke_training_min_busbw_*_gbps floor is set: give a size, or set the floors to 0",
    ),
    (
        {"smoke_training_expect_gdr": True, "smoke_training_expect_transport": "socket"},
        "smoke_training_expect_gdr true with smoke_training_expect_transport socket: GPUDirect RDMA needs ib or roce",
    ),
]
ACCEPTED = [
    {},
    {"smoke_training_busbw_mib": 0, "smoke_training_min_busbw_rdma_gbps": 0},
    {
        "smoke_training_expect_gdr": True,
        "smoke_training_expect_transport": "ib",
        "smoke_training_min_busbw_rdma_gbps": 40,
    },
    {
        "smoke_training_expect_gdr": "false",
        "smoke_training_expect_transport": "socket",
        "smoke_training_min_busbw_socket_gbps": 2,
    },
]
for _settings, _ in WRONG:
    RUNS.declare("ubuntu2204", **_settings)
for _settings in ACCEPTED:
    RUNS.declare("ubuntu2204", **_settings)


@pytest.mark.parametrize("settings, message", WRONG)
def test_wrong_network_settings_are_named(settings: dict[str, Any], message: str):
    cfg = RUNS.get("ubuntu2204", **settings)
    assert cfg.failure is not None and cfg.failure.startswith(f"smoke_training settings rejected on {cfg.host}: [1] ")
    assert message in " ".join(cfg.failure.split()), cfg.failure
    assert "[2]" not in cfg.failure, cfg.failure


@pytest.mark.parametrize("settings", ACCEPTED)
def test_good_network_settings_pass(settings: dict[str, Any]):
    assert RUNS.get("ubuntu2204", **settings).failure is None


# --------------------------------------------------------------------------- the verdict of a run


def reading(name: str) -> dict[str, Any]:
    text = "\n".join(line for line in (DATA / name).read_text().splitlines() if not line.startswith("# "))
    return nccl.summarize([nccl.parse_log(text)])


def result(backend: str, busbw: float) -> dict[str, Any]:
    """Rank 0's result (train.py) of a passing run on 2 nodes x 2 ranks."""
    figures = {"ranks": 2, "seconds": 0.02, "algbw_gbps": busbw, "busbw_gbps": busbw}
    return {
        "verdict": "pass",
        "reasons": [],
        "world_size": 4,
        "hosts": ["node-a", "node-a", "node-b", "node-b"],
        "amp": "bf16",
        "losses": [1.0, 0.4],
        "samples_per_s": 5000.0,
        "backend": backend,
        "nodes": [
            {"node": 0, "host": "node-a", "ranks": 2, "compute_s_per_step": 0.01, "samples_per_s": 6400.0},
            {"node": 1, "host": "node-b", "ranks": 2, "compute_s_per_step": 0.01, "samples_per_s": 6400.0},
        ],
        "network": {
            "backend": backend,
            "measured": "gloo over TCP" if backend == "gloo" else "NCCL",
            "size_bytes": 8 * 2**20,
            "warmup": 5,
            "iters": 10,
            "inter_node": figures,
            "world": {**figures, "ranks": 4, "busbw_gbps": busbw * 1.5},
        },
    }


def node(host: str, run: dict[str, Any] | None, log: str | None) -> dict[str, Any]:
    return {
        "rc": 0,
        "host": host,
        "node": host,
        "result": run,
        "log_tail": "",
        "failures": [],
        "failed_ranks": [],
        "nccl": reading(log) if log else None,
    }


def cluster(
    play: str, backend: str, busbw: float, logs: tuple[str | None, str | None], **settings: Any
) -> list[role_run.Host]:
    names = [f"{play}-a", f"{play}-b"]
    common = {"__smoke_training_world_size": "4", "__smoke_training_endpoint": f"{names[0]}:29500", **settings}
    return [
        role_run.Host(
            host,
            FAKE_FACTS["ubuntu2204"],
            {**common, "__smoke_training_node": node(host, result(backend, busbw) if i == 0 else None, logs[i])},
            play=play,
        )
        for i, host in enumerate(names)
    ]


_SHOW = role_run.role_task("smoke_training", "run.yml", "Show the smoke training")
JUDGE = [
    role_run.expose("smoke_training", "install"),
    role_run.role_task("smoke_training", "run.yml", "Judge the network between the nodes"),
    role_run.role_task("smoke_training", "run.yml", "Judge the run"),
]
CAPTURE = [
    role_run.capture(
        {
            "network": "{{ __smoke_training_network }}",
            "problems": "{{ __smoke_training_problems }}",
            "show": _SHOW["ansible.builtin.debug"]["msg"],
        },
        vars=_SHOW["vars"],
        name="Capture the verdict",
    )
]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, role_run.Outcome]:
    hosts = [
        *cluster("lab", "gloo", 0.31, (None, None)),
        *cluster("slowgloo", "gloo", 0.31, (None, None), smoke_training_min_busbw_gloo_gbps=1.0),
        *cluster(
            "ib",
            "nccl",
            23.8,
            ("ibext-sharp-nccl-988.log", "ibext-sharp-nccl-988.log"),
            smoke_training_expect_transport="ib",
        ),
        *cluster(
            "fallback",
            "nccl",
            4.9,
            ("ibext-sharp-nccl-988.log", "socket-nccl-tests-284.log"),
            smoke_training_expect_transport="ib",
            smoke_training_expect_gdr=True,
        ),
        *cluster(
            "nogdr",
            "nccl",
            20.0,
            ("roce-gdr-disabled-nccl-1537.log", "roce-gdr-disabled-nccl-1537.log"),
            smoke_training_expect_gdr=True,
        ),
    ]
    return role_run.run(hosts, JUDGE, CAPTURE)


def test_the_lab_says_it_measured_gloo_over_tcp(verdicts: dict[str, role_run.Outcome]):
    out = verdicts["lab-a"]
    network = out["network"]
    assert out["problems"] == [] and network["verdict"] == "pass"
    assert (network["measured"], network["backend"], network["transport"], network["busbw_gbps"]) == (
        "gloo over TCP",
        "gloo",
        None,
        0.31,
    )
    assert "transport not read: the run used gloo, not NCCL" in " ".join(network["notes"])
    assert (
        "cross-node all-reduce 0.31 GB/s busbw (2 node(s), one rank each; gloo over TCP, transport not read: "
        "not NCCL); verdict pass"
    ) in out["show"], out["show"]
    assert verdicts["lab-b"]["network"] == network  # run_once: the play's verdict


def test_a_gloo_floor_fails_the_run(verdicts: dict[str, role_run.Outcome]):
    out = verdicts["slowgloo-a"]
    assert out["problems"] == [
        "cross-node all-reduce bus bandwidth 0.31 GB/s (one rank per node, 2 nodes, 8 MiB, gloo "
        "over TCP) is below the floor 1 GB/s (smoke_training_min_busbw_gloo_gbps)"
    ]
    assert "; floor 1 GB/s); verdict FAIL" in out["show"]


def test_nccl_over_infiniband_passes(verdicts: dict[str, role_run.Outcome]):
    out = verdicts["ib-a"]
    assert out["problems"] == [] and out["network"]["transport"] == "IB"
    assert (
        "cross-node all-reduce 23.8 GB/s busbw (2 node(s), one rank each; NCCL over IB; floor 6 GB/s); verdict pass"
        in out["show"]
    ), out["show"]


def test_a_node_that_fell_back_to_sockets_fails_the_run(verdicts: dict[str, role_run.Outcome]):
    problems = verdicts["fallback-a"]["problems"]
    assert problems[0] == "the nodes used different transports: fallback-a IB, fallback-b Socket"
    assert any(p.startswith("fallback-b: NCCL used Socket between nodes, expected IB") for p in problems), problems
    assert any(p.startswith("fallback-b: GPUDirect RDMA off") for p in problems), problems


def test_gpudirect_rdma_disabled_fails_the_run(verdicts: dict[str, role_run.Outcome]):
    out = verdicts["nogdr-a"]
    assert [p.split(" (")[0] for p in out["problems"]] == ["nogdr-a: GPUDirect RDMA off", "nogdr-b: GPUDirect RDMA off"]
    assert out["network"]["measured"] == "NCCL over RoCE (GPUDirect RDMA off)"
