"""What train.py (the smoke-training payload; docs/payload.md) measures after training, and its verdict.

gather: every rank's figures and how far apart the ranks' parameters are; node_pace: each node's compute pace;
time_all_reduce: the bus bandwidth over every rank and between the nodes; judge: pass, or why the run fails.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from train_plan import Plan

PARAM_ATOL = 1e-6  # ranks whose parameters differ by more than this fail the run
BUSBW_WARMUP = 5  # nccl-tests' default warm-up iterations


class Verdict(NamedTuple):
    reasons: list[str]  # why the run fails; none: it passed
    notes: list[str]
    loss_drop: float | None


def judge(losses: list[float], start_step: int, spread: float, min_drop: float) -> Verdict:
    """losses[i] is the loss of step start_step + i + 1; spread: how far apart the ranks' parameters are."""
    reasons, notes, drop = [], [], None
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    if bad:
        reasons.append(f"non-finite loss (NaN/inf) at step {start_step + bad[0] + 1}: {losses[bad[0]]}")
    if len(losses) < 4:
        notes.append(f"loss trend not checked: {len(losses)} step(s) run, need 4")
    elif not bad:
        quarter = len(losses) // 4
        first, last = sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter
        drop = 1.0 - last / first if first > 0 else 0.0
        if not math.isfinite(drop) or drop < min_drop:
            reasons.append(
                f"loss not falling: first-quarter mean {first:.6g}, last-quarter mean {last:.6g}, "
                f"drop {drop:.3f} < --min-loss-drop {min_drop}"
            )
    if not spread <= PARAM_ATOL:
        reasons.append(f"ranks disagree on parameters: max abs diff {spread:.3g} > {PARAM_ATOL}")
    return Verdict(reasons, notes, drop)


def gather(plan: Plan, module: nn.Module, mine: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """Every rank's mine (JSON bytes: all_gather_object needs NumPy) and how far apart the ranks' parameters are."""
    if not plan.distributed:
        return [mine], 0.0
    data, padded = json.dumps(mine).encode(), torch.zeros(4096, dtype=torch.uint8, device=plan.device)
    padded[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    every = [torch.empty_like(padded) for _rank in range(plan.world_size)]
    dist.all_gather(every, padded)
    params = torch.cat([p.detach().float().reshape(-1) for p in module.parameters()])
    high = torch.nan_to_num(params, nan=3e38)  # NaN on every rank is agreement, NaN on some is not
    low = high.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return [json.loads(bytes(e.tolist()).rstrip(b"\0")) for e in every], (high - low).max().item()


def synchronize(gpus: tuple[torch.device, ...]) -> None:
    for gpu in gpus:  # every GPU this rank drives (DataParallel: all of the node's)
        torch.cuda.synchronize(gpu)


def node_pace(ranks: list[dict[str, Any]], samples_per_rank: int) -> list[dict[str, Any]]:
    """Per node (torchrun's node rank): its host, ranks, slowest rank's compute time per step, samples/s."""
    nodes: dict[int, list[dict[str, Any]]] = {}
    for r in ranks:
        nodes.setdefault(r["node"], []).append(r)
    slowest = {n: max(r["compute_s"] for r in rs) for n, rs in nodes.items()}
    return [
        {
            "node": n,
            "host": rs[0]["host"],
            "ranks": len(rs),
            "compute_s_per_step": slowest[n],
            "samples_per_s": len(rs) * samples_per_rank / slowest[n],
        }
        for n, rs in sorted(nodes.items())
    ]


def time_all_reduce(plan: Plan, ranks: list[dict[str, Any]], mib: int, iters: int) -> dict[str, Any]:
    """Bus bandwidth of an all-reduce of `mib` MiB over every rank ("world") and over one rank per node, each node's
    local rank 0 ("inter_node": the path between nodes alone). busbw = algbw x 2(n-1)/n, as nccl-tests defines it
    (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md); the slowest rank's time counts."""
    leaders = [rank for rank, r in enumerate(ranks) if r["local_rank"] == 0]
    groups = {"world": (None, list(range(len(ranks)))), "inter_node": (dist.new_group(leaders), leaders)}
    buffer, size = torch.zeros(mib * 2**20 // 4, device=plan.device), mib * 2**20 // 4 * 4
    result = {
        "backend": plan.backend,
        "measured": "gloo over TCP" if plan.backend == "gloo" else "NCCL",
        "size_bytes": size,
        "warmup": BUSBW_WARMUP,
        "iters": iters,
    }
    for name, (group, members) in groups.items():
        seconds = torch.zeros(1, dtype=torch.float64, device=plan.device)
        if plan.rank in members and len(members) > 1:
            for i in range(BUSBW_WARMUP + iters):
                if i == BUSBW_WARMUP:
                    synchronize(plan.gpus)
                    began = time.perf_counter()
                dist.all_reduce(buffer, group=group)
            synchronize(plan.gpus)
            seconds += (time.perf_counter() - began) / iters
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        n, algbw = len(members), size / seconds.item() / 1e9 if seconds.item() > 0 else None
        result[name] = {
            "ranks": n,
            "seconds": seconds.item() or None,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (n - 1) / n if algbw else None,
        }  # None: one rank, nothing crossed
    return result
