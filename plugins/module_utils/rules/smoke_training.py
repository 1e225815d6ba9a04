"""The smoke_training role's rules: the process counts, the steps and batches, the ports and time limits, the
bandwidth measurement and its floors, and the transport GPUDirect RDMA needs.

Run by roles/smoke_training/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes.
"""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import Judgement, matches, text, to_float, to_int

READS = ("smoke_training_*",)

_FLOORS = (
    "smoke_training_min_busbw_rdma_gbps",
    "smoke_training_min_busbw_socket_gbps",
    "smoke_training_min_busbw_gloo_gbps",
)


def judge(j: Judgement) -> None:
    """Refuse counts and sizes out of range, too few steps, floors without a measurement, GPUDirect over sockets."""
    floors = [to_float(j[name]) for name in _FLOORS]
    mib = to_int(j["smoke_training_busbw_mib"])
    j.check(
        to_int(j["smoke_training_nproc_per_node"]) >= 0,
        f"smoke_training_nproc_per_node '{j['smoke_training_nproc_per_node']}' is not a process count (0: one per GPU)",
    )
    j.check(
        to_int(j["smoke_training_cpu_nproc_per_node"]) > 0,
        f"smoke_training_cpu_nproc_per_node '{j['smoke_training_cpu_nproc_per_node']}' is not a process count"
        " (1 or more)",
    )
    j.check(
        to_int(j["smoke_training_steps"]) >= 4,
        f"smoke_training_steps '{j['smoke_training_steps']}' is too few: the loss trend needs 4 steps or more",
    )
    j.check(
        to_int(j["smoke_training_micro_batch"]) > 0,
        f"smoke_training_micro_batch '{j['smoke_training_micro_batch']}' is not a batch size"
        " (1 or more samples per rank)",
    )
    j.check(
        to_int(j["smoke_training_grad_accum"]) > 0,
        f"smoke_training_grad_accum '{j['smoke_training_grad_accum']}' is not a number of micro-steps (1 or more)",
    )
    j.check(
        to_float(j["smoke_training_min_loss_drop"]) < 1,
        f"smoke_training_min_loss_drop '{j['smoke_training_min_loss_drop']}' is not a fraction below 1",
    )
    j.check(
        1024 <= to_int(j["smoke_training_rendezvous_port"]) <= 65535,
        f"smoke_training_rendezvous_port '{j['smoke_training_rendezvous_port']}' is not a TCP port (1024-65535)",
    )
    j.check(
        to_int(j["smoke_training_timeout"]) >= 30,
        f"smoke_training_timeout '{j['smoke_training_timeout']}' is not a number of seconds (30 or more)",
    )
    j.check(
        matches("^/.+", j["smoke_training_payload_dir"]),
        f"smoke_training_payload_dir '{j['smoke_training_payload_dir']}' is not an absolute directory",
    )
    j.check(
        text(j["smoke_training_report_dir"]).strip(),
        "smoke_training_report_dir is empty: name the controller directory for the result",
    )
    j.check(
        0 <= mib <= 16384,
        f"smoke_training_busbw_mib '{j['smoke_training_busbw_mib']}' is not a size in MiB from 0 (not measured)"
        " to 16384",
    )
    j.check(
        to_int(j["smoke_training_busbw_iters"]) > 0,
        f"smoke_training_busbw_iters '{j['smoke_training_busbw_iters']}' is not a number of all-reduces (1 or more)",
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
