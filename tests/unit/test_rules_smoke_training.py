"""plugins/module_utils/rules/smoke_training.py called directly: each rule with a value it takes and one it refuses
(the exact message; tests/unit/test_smoke_training_role.py runs the same rules through the role's validate.yml)."""

from __future__ import annotations

import pytest
import rules_case

BASE = rules_case.defaults("smoke_training", smoke_training_python="/opt/gpufleet/venv/bin/python")


def refusals(**overrides):
    return rules_case.refusals("smoke_training", BASE, **overrides)


def test_the_defaults_pass():
    assert refusals() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"smoke_training_nproc_per_node": "8"},
        {"smoke_training_steps": 4},
        {"smoke_training_min_loss_drop": -0.5},
        {"smoke_training_rendezvous_port": 65535},
        {"smoke_training_timeout": "30"},
        {"smoke_training_busbw_mib": 16384},
        {"smoke_training_busbw_mib": 0, "smoke_training_min_busbw_rdma_gbps": 0},
        {"smoke_training_expect_gdr": True, "smoke_training_expect_transport": "ib"},
        {"smoke_training_expect_gdr": "false", "smoke_training_expect_transport": "socket"},
    ],
)
def test_values_the_rules_take(overrides):
    assert refusals(**overrides) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"smoke_training_nproc_per_node": -1},
            "smoke_training_nproc_per_node '-1' is not a process count (0: one per GPU)",
        ),
        (
            {"smoke_training_cpu_nproc_per_node": 0},
            "smoke_training_cpu_nproc_per_node '0' is not a process count (1 or more)",
        ),
        ({"smoke_training_steps": 3}, "smoke_training_steps '3' is too few: the loss trend needs 4 steps or more"),
        (
            {"smoke_training_micro_batch": "none"},
            "smoke_training_micro_batch 'none' is not a batch size (1 or more samples per rank)",
        ),
        ({"smoke_training_grad_accum": 0}, "smoke_training_grad_accum '0' is not a number of micro-steps (1 or more)"),
        ({"smoke_training_min_loss_drop": 1}, "smoke_training_min_loss_drop '1' is not a fraction below 1"),
        (
            {"smoke_training_rendezvous_port": 1023},
            "smoke_training_rendezvous_port '1023' is not a TCP port (1024-65535)",
        ),
        ({"smoke_training_timeout": 29}, "smoke_training_timeout '29' is not a number of seconds (30 or more)"),
        ({"smoke_training_payload_dir": "/"}, "smoke_training_payload_dir '/' is not an absolute directory"),
        (
            {"smoke_training_report_dir": ""},
            "smoke_training_report_dir is empty: name the controller directory for the result",
        ),
        (
            {"smoke_training_busbw_mib": 16385},
            "smoke_training_busbw_mib '16385' is not a size in MiB from 0 (not measured) to 16384",
        ),
        (
            {"smoke_training_busbw_iters": 0},
            "smoke_training_busbw_iters '0' is not a number of all-reduces (1 or more)",
        ),
        (
            {"smoke_training_min_busbw_gloo_gbps": "-1"},
            "smoke_training_min_busbw_rdma_gbps, _socket_gbps and _gloo_gbps"
            " must be GB/s of 0 or more (0: not judged), got 6.0, 0.0, -1.0",
        ),
        (
            {"smoke_training_busbw_mib": 0},
            "smoke_training_busbw_mib is 0 (nothing measured)"
            " but a smoke_training_min_busbw_*_gbps floor is set: give a size, or set the floors to 0",
        ),
        (
            {"smoke_training_expect_gdr": "True", "smoke_training_expect_transport": "socket"},
            "smoke_training_expect_gdr true with smoke_training_expect_transport socket:"
            " GPUDirect RDMA needs ib or roce",
        ),
    ],
)
def test_each_rule_refuses_with_its_message(overrides, message):
    assert refusals(**overrides) == [message]
