"""Smoke-training payload for gpufleet: a small, deterministic multi-GPU PyTorch run.

It trains a small MLP with SGD on a seeded synthetic task (or a --data-dir dataset), checks that the run is
healthy and writes a JSON verdict. Reference (launch, batching, AMP, checkpoints, result, exit codes): docs/payload.md.
Beside it, train_plan.py checks every input in plan() (a frozen Plan) and train_measure.py measures and judges. Here,
top down: the Trainer holds the model, the optimizer and the loop; execute() trains and publishes; main() runs a rank.

    python train.py                                          # one process (CPU or one GPU)
    torchrun --standalone --nproc-per-node=<gpus> train.py   # DistributedDataParallel, one process per GPU
    python train.py --mode dp                                # nn.DataParallel over the node's GPUs
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import math
import os
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, Callable, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from train_measure import gather, judge, node_pace, synchronize, time_all_reduce
from train_plan import Parser, UsageError, cpu_autocast_available, first_line, parse_args, plan

# What callers and tests/payload import from train, some of it defined beside it (train_plan.py, train_measure.py).
__all__ = ["Parser", "Trainer", "UsageError", "atomic_write", "cpu_autocast_available", "judge", "main", "parse_args"]

LOG = logging.getLogger("train")
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3
PROFILE_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3, "repeat": 1}  # skip 1 step, warm up 1, record 3
SGD_MOMENTUM = 0.9  # SGD, not Adam: Adam magnifies float rounding, and runs are compared across world sizes
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPUTE_REPEATS = 5  # timed forward+backward passes


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write a temporary file beside path, fsync it, rename it over path: readers and crashes see the old
    file or the new one. On an error (a full disk) the temporary file goes and path stays as it was."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class Trainer:
    """One rank's training after plan(): the model (DDP, DataParallel or plain), SGD, the GradScaler, the loop."""

    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> None:
        self.args = args
        self.plan = plan(args, os.environ if environ is None else environ)
        self.notes: list[str] = []  # for the result
        self.saves = 0  # checkpoints this rank wrote
        self.sampler = DistributedSampler(
            range(len(self.plan.data.x)),
            num_replicas=self.plan.world_size,
            rank=self.plan.rank,
            shuffle=True,
            seed=args.seed,
            drop_last=True,
        )
        self.epoch, self.order = -1, torch.empty(0, dtype=torch.long)  # the sampler's permutation of that epoch

    def setup(self) -> None:
        """The model on its device (DDP, DataParallel or plain), SGD and the GradScaler (fp16 only), a resumed state."""
        args, data, device, width = self.args, self.plan.data, self.plan.device, self.args.hidden
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        self.module = nn.Sequential(
            nn.Linear(data.x.shape[1], width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, data.outputs),
        ).to(device)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=args.lr, momentum=SGD_MOMENTUM)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.plan.amp == "fp16")
        self.start_step = self.restore() if args.resume else 0
        if args.mode == "dp":
            self.model = nn.DataParallel(self.module)  # CUDA only (plan): each batch split over the GPUs
        elif self.plan.distributed:
            self.model = DistributedDataParallel(self.module, device_ids=[device.index] if self.plan.gpus else None)
        else:
            self.model = self.module
            self.notes.append("single process (no RANK/WORLD_SIZE): no process group, a plain module ran")
        # The dataset moves to the device once: no micro-batch is copied or pinned (pin_memory) on its way there.
        self.x, self.y = data.x.to(device), data.y.to(device)

    def restore(self) -> int:
        """Load the checked checkpoint on this rank (saved on any world size); returns the step to continue from."""
        state, path = self.plan.checkpoint, self.args.checkpoint
        if state is None:
            self.notes.append(f"--resume: no checkpoint at {path} yet, started from step 0")
            return 0
        try:
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if state["scaler"] and self.scaler.is_enabled():
                self.scaler.load_state_dict(state["scaler"])
            torch.set_rng_state(state["rng"]["torch"])
            if self.plan.gpus and "cuda" in state["rng"]:
                torch.cuda.set_rng_state(state["rng"]["cuda"], self.plan.device)
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # another model's shapes, a damaged state
            raise UsageError(f"--checkpoint {path}: does not fit this run ({first_line(exc)})") from None
        self.notes += [
            f"resumed with a different {key} than the checkpoint's"
            for key in ("batch_size", "seed")
            if state["config"].get(key) != getattr(self.args, key)
        ]
        return state["step"]

    def save_checkpoint(self, step: int) -> None:
        if self.plan.rank != 0:  # global rank 0 writes the checkpoint
            return
        rng = {"torch": torch.get_rng_state()}
        if self.plan.gpus:
            rng["cuda"] = torch.cuda.get_rng_state(self.plan.device)
        config = {
            "batch_size": self.args.batch_size,
            "seed": self.args.seed,
            "hidden": self.args.hidden,
            "world_size": self.plan.world_size,
            "saved_by_rank": self.plan.rank,
        }
        state = {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": step,
            "rng": rng,
            "config": config,
        }
        atomic_write(self.args.checkpoint, lambda handle: torch.save(state, handle))
        self.saves += 1
        LOG.info("checkpoint at step %d -> %s", step, self.args.checkpoint)

    def micro_batch_indices(self, step: int) -> list[torch.Tensor]:
        """This rank's micro-batches of a step: DistributedSampler gives this rank every world_size-th sample of a
        per-epoch permutation, so step s covers samples [s*B, (s+1)*B) of it on any world size and accumulation."""
        epoch, index = divmod(step, len(self.plan.data.x) // self.args.batch_size)
        if epoch != self.epoch:
            self.sampler.set_epoch(epoch)
            self.order, self.epoch = torch.tensor(list(self.sampler), device=self.plan.device), epoch
        per_step = self.plan.micro_batch * self.args.grad_accum
        return list(self.order[index * per_step : (index + 1) * per_step].split(self.plan.micro_batch))

    def forward_backward(self, step: int, sync: bool = True) -> torch.Tensor:
        """The forward and backward passes of a step over this rank's micro-batches (gradient accumulation); returns
        this rank's mean loss. DDP all-reduces the gradients on the last micro-step only, and never without sync."""
        loss_fn = F.cross_entropy if self.plan.data.task == "classification" else F.mse_loss
        amp_dtype, micro_batches = AMP_DTYPES.get(self.plan.amp), self.micro_batch_indices(step)
        rank_loss = torch.zeros((), device=self.plan.device)
        for i, idx in enumerate(micro_batches):
            ddp_skip_sync = isinstance(self.model, DistributedDataParallel) and (i < len(micro_batches) - 1 or not sync)
            with self.model.no_sync() if ddp_skip_sync else contextlib.nullcontext():
                with torch.amp.autocast(self.plan.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss = loss_fn(self.model(self.x[idx]).float(), self.y[idx]) / len(micro_batches)
                self.scaler.scale(loss).backward()
            rank_loss += loss.detach()
        return rank_loss

    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step (forward_backward, then SGD); returns this rank's mean loss."""
        rank_loss = self.forward_backward(step)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return rank_loss

    def write_trace(self, prof: torch.profiler.profile) -> None:
        """The profiler's trace, named as torch's tensorboard_trace_handler names it, written with atomic_write."""
        name = f"{socket.gethostname()}_rank{self.plan.rank}.{time.time_ns()}.pt.trace.json"
        with tempfile.NamedTemporaryFile(suffix=".json") as exported:  # export_chrome_trace writes to a path
            prof.export_chrome_trace(exported.name)
            atomic_write(self.args.profile_dir / name, lambda handle: handle.write(Path(exported.name).read_bytes()))

    def train(self) -> tuple[list[float], float]:
        """Steps start_step .. --steps; returns (the global mean loss of each step, seconds)."""
        args, losses, saved_at = self.args, [], self.start_step
        profiler = contextlib.nullcontext()
        if args.profile_dir is not None:  # a trace per rank for TensorBoard
            activity = torch.profiler.ProfilerActivity
            profiler = torch.profiler.profile(
                activities=[activity.CPU, activity.CUDA] if self.plan.gpus else [activity.CPU],
                schedule=torch.profiler.schedule(**PROFILE_SCHEDULE),
                on_trace_ready=self.write_trace,
            )
        started = time.perf_counter()
        logged = (started, self.start_step)  # when, and at which step, the last progress line was written
        with profiler:
            for step in range(self.start_step, args.steps):
                loss = self.train_step(step)
                if self.plan.distributed:
                    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
                losses.append(loss.item() / self.plan.world_size)
                if args.profile_dir is not None:
                    profiler.step()
                done, finite = step + 1, math.isfinite(losses[-1])
                if done % args.log_every == 0 or done == args.steps or not finite:
                    rate = args.batch_size * (done - logged[1]) / (time.perf_counter() - logged[0])
                    LOG.info("step %d/%d | loss %.6f | %.0f samples/s", done, args.steps, losses[-1], rate)
                    logged = (time.perf_counter(), done)
                if not finite:
                    LOG.warning("non-finite loss at step %d: stopping", done)
                    break
                if args.checkpoint is not None and args.checkpoint_every and done % args.checkpoint_every == 0:
                    self.save_checkpoint(done)
                    saved_at = done
        duration, final = time.perf_counter() - started, self.start_step + len(losses)
        if args.checkpoint is not None and saved_at != final and all(map(math.isfinite, losses)):
            self.save_checkpoint(final)  # never a diverged model over a good checkpoint
        return losses, duration


# After training: measure the ranks and the network (train_measure.py), judge the run, publish the result.
def time_compute(t: Trainer) -> float:
    """Seconds of one step's forward and backward passes on this rank (the median of COMPUTE_REPEATS), without the
    gradient all-reduce (no_sync) or the optimizer: the node's own pace, to compare nodes with. The model stays."""
    times = []
    for step in range(COMPUTE_REPEATS):
        synchronize(t.plan.gpus)
        began = time.perf_counter()
        t.forward_backward(step, sync=False)
        synchronize(t.plan.gpus)
        times.append(time.perf_counter() - began)
    t.optimizer.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2]


def execute(t: Trainer) -> int:
    """Train, then judge the run on global rank 0 and publish its result."""
    began, args, p = time.perf_counter(), t.args, t.plan
    t.setup()
    LOG.info(
        "world %d | %s | %s | %s | amp %s | global batch %d = %d rank(s) x %d micro-step(s) x %d",
        p.world_size,
        p.backend,
        p.device,
        type(t.model).__name__,
        p.amp,
        args.batch_size,
        p.world_size,
        args.grad_accum,
        p.micro_batch,
    )
    if args.empty_cache and p.gpus:
        torch.cuda.empty_cache()  # hand cached, unused blocks back to the driver between phases
    for gpu in p.gpus:
        torch.cuda.reset_peak_memory_stats(gpu)
    losses, duration = t.train()
    if args.empty_cache and p.gpus:
        torch.cuda.empty_cache()
    if args.save_params is not None and p.rank == 0:
        params = {k: v.cpu() for k, v in t.module.state_dict().items()}
        atomic_write(args.save_params, lambda handle: torch.save(params, handle))
    peak = max(map(torch.cuda.max_memory_allocated, p.gpus)) if p.gpus else None  # of the GPUs this rank drives
    ranks, spread = gather(
        p,
        t.module,
        {
            "host": socket.gethostname(),
            "node": p.node,
            "local_rank": p.local_rank,
            "checkpoint_writes": t.saves,
            "peak_memory_bytes": peak,
            "compute_s": time_compute(t),
        },
    )
    network = time_all_reduce(p, ranks, args.busbw_mib, args.busbw_iters) if p.distributed and args.busbw_mib else None
    verdict = judge(losses, t.start_step, spread, args.min_loss_drop)
    if network is None:
        why = "--busbw-mib 0" if p.distributed else "no process group"
        verdict.notes.append(f"bus bandwidth not measured: {why}")
    result = {
        "verdict": "fail" if verdict.reasons else "pass",
        "reasons": verdict.reasons,
        "notes": t.notes + verdict.notes,
        "mode": args.mode,
        "wrapper": "none" if t.model is t.module else type(t.model).__name__,
        "world_size": p.world_size,
        "backend": p.backend,
        "device": p.device.type,
        "hosts": [r["host"] for r in ranks],
        "amp": p.amp,
        "grad_accum": args.grad_accum,
        "global_batch": args.batch_size,
        "micro_batch": p.micro_batch,
        "steps": len(losses),
        "start_step": t.start_step,
        "final_step": t.start_step + len(losses),
        "losses": losses,
        "loss_drop": verdict.loss_drop,
        "samples_per_s": args.batch_size * len(losses) / duration if losses else 0.0,
        "duration_s": duration,
        "wall_s": time.perf_counter() - began,
        "peak_memory_bytes": [r["peak_memory_bytes"] for r in ranks],
        "param_max_abs_diff": spread,
        "checkpoint_writes": [r["checkpoint_writes"] for r in ranks],
        "compute_s_per_step": [r["compute_s"] for r in ranks],
        "nodes": node_pace(ranks, p.micro_batch * args.grad_accum),
        "network": network,
        "data": p.data.source,
        "task": p.data.task,
        "lr": args.lr,
        "seed": args.seed,
        "hidden": args.hidden,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
    }
    if p.rank == 0:  # NaN and infinities are written as null: JSON has none
        text = json.dumps(json.loads(json.dumps(result), parse_constant=lambda _: None), indent=2, allow_nan=False)
        if args.result is not None:
            atomic_write(args.result, lambda handle: handle.write(text.encode() + b"\n"))
        if args.json:
            print(text, flush=True)
        LOG.info("verdict %s%s", result["verdict"], "".join(f"\n  - {r}" for r in verdict.reasons))
    return EXIT_PASS if not verdict.reasons else EXIT_FAIL


# The trainer outlives main() until the process ends: freeing its DDP model after the process group hung a
# rank in C++ now and then (lab, torch 2.3.1 + gloo: 1 run in 12, the stack at main's return; docs/testing.md).
ALIVE = argparse.Namespace()


def main(argv: list[str] | None = None) -> int:
    rank = os.environ.get("RANK", "0")
    handler = logging.StreamHandler(sys.stderr)  # progress from global rank 0; warnings and errors from every rank
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
    LOG.handlers[:], LOG.propagate = [handler], False
    LOG.setLevel(logging.INFO if rank == "0" else logging.WARNING)
    try:
        args = parse_args(argv, description=__doc__.split("\n\n", maxsplit=1)[0])  # --help: the docstring's summary
        trainer = ALIVE.trainer = Trainer(args)  # not freed at main's return (ALIVE)
        p = trainer.plan
        if p.distributed:
            if p.gpus:
                torch.cuda.set_device(p.device)
            dist.init_process_group(
                backend=p.backend,
                timeout=timedelta(seconds=trainer.args.timeout),
                device_id=p.device if p.gpus else None,
            )  # binds NCCL to this rank's GPU
        code = execute(trainer)
        if dist.is_initialized():  # a rank still here 60 s on dumps its stacks (should a hang return: docs/testing.md)
            faulthandler.dump_traceback_later(60)
            dist.barrier()  # no rank tears gloo/NCCL down while another is still in a collective
        return code
    except Exception as exc:  # gpufleet_check's launcher reports the ERROR line as this rank's cause
        usage = isinstance(exc, UsageError)  # bad input: one line, exit 2; a failure during the run: exit 3
        LOG.error("%s" if usage else "training failed: %s", exc if usage else first_line(exc), exc_info=not usage)
        ErrorHandler().record_exception(exc)  # under torchrun, its failure summary shows this rank's error
        return EXIT_USAGE if usage else EXIT_ERROR
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    exit_code = main()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        # Under torchrun, leave without Python's finalization: a gloo/NCCL thread still winding down then can
        # abort (SIGABRT) a rank whose work is done, and torchrun would fail the whole run.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    sys.exit(exit_code)
