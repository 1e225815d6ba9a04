"""The smoke_training role's rules: the process counts, the steps and batches, the ports and time limits, the
bandwidth measurement and its floors, and the transport GPUDirect RDMA needs.

Run by roles/smoke_training/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import Judgement, matches, text, to_float, to_int

READS = ("smoke_training_*",)

_FLOORS = (
    "smoke_training_min_busbw_rdma_gbps",
    "smoke_training_min_busbw_socket_gbps",
    "smoke_training_min_busbw_gloo_gbps",
)


def _whole(least: int, most: int | None = None) -> Callable[[Any], bool]:
    """Whether a value is a whole number (Jinja's ``| int``) from least to most (no limit: None)."""
    return lambda value: least <= to_int(value) and (most is None or to_int(value) <= most)


# The settings judged one by one, in the order of their messages: (name, whether its value is good, what the
# message says the value is when it is not).
_RULES: tuple[tuple[str, Callable[[Any], Any], str], ...] = (
    ("smoke_training_nproc_per_node", _whole(0), "is not a process count (0: one per GPU)"),
    ("smoke_training_cpu_nproc_per_node", _whole(1), "is not a process count (1 or more)"),
    ("smoke_training_steps", _whole(4), "is too few: the loss trend needs 4 steps or more"),
    ("smoke_training_micro_batch", _whole(1), "is not a batch size (1 or more samples per rank)"),
    ("smoke_training_grad_accum", _whole(1), "is not a number of micro-steps (1 or more)"),
    ("smoke_training_min_loss_drop", lambda value: to_float(value) < 1, "is not a fraction below 1"),
    ("smoke_training_rendezvous_port", _whole(1024, 65535), "is not a TCP port (1024-65535)"),
    ("smoke_training_timeout", _whole(30), "is not a number of seconds (30 or more)"),
    ("smoke_training_payload_dir", lambda value: matches("^/.+", value), "is not an absolute directory"),
    ("smoke_training_busbw_mib", _whole(0, 16384), "is not a size in MiB from 0 (not measured) to 16384"),
    ("smoke_training_busbw_iters", _whole(1), "is not a number of all-reduces (1 or more)"),
)


def judge(j: Judgement) -> None:
    """Refuse counts and sizes out of range, too few steps, floors without a measurement, GPUDirect over sockets."""
    floors = [to_float(j[name]) for name in _FLOORS]
    mib = to_int(j["smoke_training_busbw_mib"])
    for name, good, what in _RULES:
        j.check(good(j[name]), f"{name} '{j[name]}' {what}")
    j.check(
        text(j["smoke_training_report_dir"]).strip(),
        "smoke_training_report_dir is empty: name the controller directory for the result",
    )
    j.check(
        all(floor >= 0 for floor in floors),
        "smoke_training_min_busbw_rdma_gbps, _socket_gbps and _gloo_gbps must be GB/s of 0 or more (0: not"
        f" judged), got {', '.join(map(str, floors))}",
    )
    j.check(
        mib != 0 or not any(floor > 0 for floor in floors),
        "smoke_training_busbw_mib is 0 (nothing measured) but a smoke_training_min_busbw_*_gbps floor is set:"
        " give a size, or set the floors to 0",
    )
    j.check(
        not (
            text(j["smoke_training_expect_gdr"]).lower() == "true" and j["smoke_training_expect_transport"] == "socket"
        ),
        "smoke_training_expect_gdr true with smoke_training_expect_transport socket: GPUDirect RDMA needs ib or roce",
    )
