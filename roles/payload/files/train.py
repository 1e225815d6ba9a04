"""Smoke-training payload for gpufleet: a small, deterministic multi-GPU PyTorch run.

It trains a small MLP with SGD (momentum 0.9) on a seeded synthetic
regression task (or on a dataset from ``--data-dir``), checks that the run is
healthy and writes a JSON verdict. Defaults are small: 4 CPU ranks finish in
seconds. SGD rather than Adam, because Adam magnifies float rounding and runs
are meant to be compared across world sizes.

Launch
------
Single process (CPU or one GPU)::

    python train.py

One node, every GPU (DistributedDataParallel, one process per GPU)::

    torchrun --standalone --nproc-per-node=<gpus> train.py

Multi-node (run the same command on every node; R = 0 .. N-1)::

    torchrun --nnodes=N --nproc-per-node=G --node-rank=R \\
        --rdzv-backend=c10d --rdzv-endpoint=<first-node>:29500 train.py

DataParallel comparison (one process driving all GPUs of the node; on a
host without CUDA it runs a plain module and says so in the result)::

    python train.py --mode dp

Distributed setup
-----------------
RANK, WORLD_SIZE and LOCAL_RANK come from the environment as torchrun sets
them; without them the run is a single process without a process group.
The backend follows the device: ``nccl`` for CUDA, ``gloo`` for CPU. Each
process uses the GPU ``cuda:<LOCAL_RANK>``.

Batching
--------
``--batch-size`` is the GLOBAL batch of one optimizer step. It is split evenly
into ``world_size x grad_accum`` micro-batches (an error when not divisible).
Samples are sharded like ``DistributedSampler`` (shuffled per epoch with the
seed, rank r takes every world_size-th sample), so the samples of each global
batch are the same whatever the world size: with ``--amp off`` runs with
different world sizes and accumulation reach the same parameters up to float
rounding.

AMP (``--amp``)
---------------
``auto``: bf16 on CUDA GPUs that support it and on CPU; fp16 with a GradScaler
on CUDA GPUs without bf16; off where autocast is not available.
``bf16``: refused (exit 2) on a GPU without bf16. ``fp16``: CUDA only; it is
refused on CPU (exit 2) rather than silently downgraded, because what was
asked for cannot be tested there. ``off``: float32.

Data (``--data-dir DIR``)
-------------------------
``DIR/train.pt`` is a ``torch.save``-d dict ``{"x": Tensor[N, ...], "y": Tensor[N, ...]}``
(loaded with ``weights_only=True``). ``x`` is flattened to ``[N, features]``.
An integer ``y`` of shape ``[N]`` means classification (cross-entropy, classes
``0 .. y.max()``); a floating ``y`` means regression (mean squared error).

Result and exit codes
---------------------
Global rank 0 writes a JSON result (``--result PATH``, printed with ``--json``)
with the verdict ``pass``/``fail`` and its reasons: a non-finite loss, a loss
that did not fall (mean of the last quarter of steps against the first
quarter, ``--min-loss-drop``), ranks that disagree on the parameters after
training (max abs difference > 1e-6); runs under 4 steps skip the trend check.
It also holds the per-step global loss, samples/s, every rank's host and peak
GPU memory (the largest over the GPUs a rank drives; null on CPU), the AMP
mode, accumulation and batch sizes. Non-finite numbers are written as null.
Exit codes: 0 pass, 1 fail, 2 usage or setup error, 3 exception during the
run. Under torchrun, a failing worker makes torchrun itself exit 1.

``--save-params PATH``: global rank 0 saves the final model state_dict (CPU
tensors), to compare runs. ``--profile-dir DIR``: every rank writes a
torch.profiler trace (wait 1, warmup 1, active 3 steps) for TensorBoard.

Checkpoints (``--checkpoint PATH``) are written by global rank 0 only, every
``--checkpoint-every`` steps and at the end, atomically. ``--resume`` loads the
checkpoint on every rank and continues up to ``--steps`` in total (it starts
from step 0 if the file does not exist yet, so elastic restarts can use it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

LOG = logging.getLogger("train")

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3
PARAM_ATOL = 1e-6  # ranks whose parameters differ by more than this fail the run
SYNTHETIC_FEATURES, SYNTHETIC_TARGETS, SYNTHETIC_NOISE = 32, 8, 0.05
PROFILE_WAIT, PROFILE_WARMUP, PROFILE_ACTIVE = 1, 1, 3
SGD_MOMENTUM = 0.9
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class UsageError(Exception):
    """A bad option or an unusable setup: exit code 2."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job, as torchrun describes it."""

    rank: int
    local_rank: int
    world_size: int
    distributed: bool


@dataclass
class Data:
    """A dataset held in memory, with what the model and loss need to know."""

    x: torch.Tensor
    y: torch.Tensor
    task: str  # "regression" or "classification"
    out_features: int
    source: str

    def __len__(self) -> int:
        return self.x.shape[0]


@dataclass
class TrainStats:
    """What the training loop measured on this rank."""

    losses: list[float]  # global mean loss of each step run
    duration_s: float
    final_step: int
    checkpoint_writes: int


@dataclass
class Run:
    """Everything the training loop needs, resolved from the options."""

    args: argparse.Namespace
    env: DistEnv
    device: torch.device
    backend: str | None
    amp: str
    data: Data
    micro_batch: int
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- options


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("ddp", "dp"), default="ddp",
                   help="ddp: DistributedDataParallel (default); dp: nn.DataParallel, one process")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--amp", choices=("auto", "bf16", "fp16", "off"), default="auto")
    p.add_argument("--steps", type=positive_int, default=40, help="optimizer steps in total")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="GLOBAL batch per optimizer step (all ranks and micro-steps)")
    p.add_argument("--grad-accum", type=positive_int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--lr", type=float, default=0.2, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--hidden", type=positive_int, default=64, help="MLP width")
    p.add_argument("--num-samples", type=positive_int, default=4096, help="synthetic dataset size")
    p.add_argument("--data-dir", type=Path, help="directory with train.pt (see the module docstring)")
    p.add_argument("--log-every", type=positive_int, default=10)
    p.add_argument("--min-loss-drop", type=float, default=0.1,
                   help="fraction the loss must fall, last quarter of steps against the first")
    p.add_argument("--checkpoint", type=Path, help="checkpoint file (written by global rank 0)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: only at the end")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--save-params", type=Path, help="rank 0 saves the final model state_dict here")
    p.add_argument("--profile-dir", type=Path, help="torch.profiler TensorBoard traces, one per rank")
    p.add_argument("--empty-cache", action="store_true", help="torch.cuda.empty_cache() between phases")
    p.add_argument("--timeout", type=positive_int, default=600, help="collective timeout, seconds")
    p.add_argument("--result", type=Path, help="write the JSON result here (rank 0)")
    p.add_argument("--json", action="store_true", help="print the JSON result on stdout (rank 0)")
    return p.parse_args(argv)


def read_dist_env(environ: Mapping[str, str] = os.environ) -> DistEnv:
    """RANK, WORLD_SIZE, LOCAL_RANK as torchrun sets them; one process without them."""
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return DistEnv(rank=0, local_rank=0, world_size=1, distributed=False)
    try:
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK", "0"))
    except ValueError as exc:
        raise UsageError(f"bad RANK/WORLD_SIZE/LOCAL_RANK in the environment: {exc}") from exc
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world, distributed=True)


def setup_logging(rank: str) -> None:
    """Progress on global rank 0 only; warnings and errors from every rank (on stderr)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
    LOG.handlers[:] = [handler]
    LOG.setLevel(logging.INFO if rank == "0" else logging.WARNING)
    LOG.propagate = False


# --------------------------------------------------------------------------- setup


def resolve_device(choice: str, env: DistEnv, mode: str) -> torch.device:
    cuda = torch.cuda.is_available()
    if choice == "cuda" and not cuda:
        raise UsageError("--device cuda: CUDA is not available on this host")
    if choice == "cpu" or not cuda:
        return torch.device("cpu")
    if mode == "ddp" and env.local_rank >= torch.cuda.device_count():
        raise UsageError(f"LOCAL_RANK {env.local_rank} but only {torch.cuda.device_count()} GPU(s) visible")
    return torch.device("cuda", env.local_rank if mode == "ddp" else 0)


def resolve_amp(choice: str, device: torch.device) -> str:
    """Return "bf16", "fp16" or "off" for the device (see "AMP" in the module docstring)."""
    cuda = device.type == "cuda"
    bf16_ok = torch.cuda.is_bf16_supported() if cuda else torch.amp.is_autocast_available("cpu")
    if choice == "auto":
        if bf16_ok:
            return "bf16"
        return "fp16" if cuda else "off"
    if choice == "bf16" and not bf16_ok:
        raise UsageError(f"--amp bf16: not supported on {device}; use --amp auto or off")
    if choice == "fp16" and not cuda:
        raise UsageError("--amp fp16 needs CUDA (fp16 with a GradScaler); on CPU use --amp bf16 or off")
    return choice


def split_batch(global_batch: int, world_size: int, grad_accum: int) -> int:
    parts = world_size * grad_accum
    if global_batch % parts:
        raise UsageError(
            f"--batch-size {global_batch} is not divisible by world size {world_size} x "
            f"--grad-accum {grad_accum} = {parts}; choose a multiple of {parts}"
        )
    return global_batch // parts


def synthetic_data(num_samples: int, seed: int) -> Data:
    """A noisy linear target: sample i is the same whatever the world size."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, SYNTHETIC_FEATURES, generator=g)
    teacher = torch.randn(SYNTHETIC_FEATURES, SYNTHETIC_TARGETS, generator=g) / math.sqrt(SYNTHETIC_FEATURES)
    y = x @ teacher + SYNTHETIC_NOISE * torch.randn(num_samples, SYNTHETIC_TARGETS, generator=g)
    return Data(x, y, "regression", SYNTHETIC_TARGETS, f"synthetic(seed={seed}, n={num_samples})")


def load_data(data_dir: Path) -> Data:
    path = data_dir / "train.pt"
    if not path.is_file():
        raise UsageError(f"--data-dir: {path} does not exist")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a corrupt file or one holding more than tensors
        raise UsageError(f"{path}: cannot be loaded with weights_only=True: {exc}") from exc
    if not isinstance(blob, dict) or not all(isinstance(blob.get(k), torch.Tensor) for k in ("x", "y")):
        raise UsageError(f"{path}: expected a dict with tensors 'x' and 'y'")
    x, y = blob["x"], blob["y"]
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise UsageError(f"{path}: x and y need the same, non-zero number of samples")
    x = x.reshape(x.shape[0], -1).float()
    if y.is_floating_point():
        y = y.reshape(y.shape[0], -1).float()
        return Data(x, y, "regression", y.shape[1], str(path))
    if y.dim() != 1 or int(y.min()) < 0:
        raise UsageError(f"{path}: an integer y must be class indices of shape [N], >= 0")
    return Data(x, y.long(), "classification", int(y.max()) + 1, str(path))


def build_model(in_features: int, hidden: int, out_features: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, out_features),
    )


def wrap_model(model: nn.Module, run: Run) -> nn.Module:
    if run.args.mode == "dp":
        if run.device.type != "cuda":
            run.notes.append("dp fallback: DataParallel needs CUDA GPUs; the device is cpu, so a plain module ran")
            return model
        return nn.DataParallel(model)
    if not run.env.distributed:
        run.notes.append("single process (no RANK/WORLD_SIZE): no process group, a plain module ran")
        return model
    device_ids = [run.device.index] if run.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, (DistributedDataParallel, nn.DataParallel)) else model


def wrapper_name(model: nn.Module) -> str:
    return type(model).__name__ if model is not unwrap(model) else "none"


def loss_function(task: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return F.cross_entropy if task == "classification" else F.mse_loss


def init_distributed(run: Run) -> None:
    if not run.env.distributed:
        return
    if run.device.type == "cuda":
        torch.cuda.set_device(run.device)
    device_id = run.device if run.device.type == "cuda" else None  # binds NCCL to this rank's GPU
    dist.init_process_group(backend=run.backend, timeout=timedelta(seconds=run.args.timeout), device_id=device_id)


def prepare(args: argparse.Namespace, env: DistEnv) -> Run:
    """Resolve and check every option before any process group exists."""
    if args.mode == "dp" and env.world_size > 1:
        raise UsageError("--mode dp is one process driving the node's GPUs: start it with python, not torchrun")
    if args.resume and args.checkpoint is None:
        raise UsageError("--resume needs --checkpoint PATH")
    if args.checkpoint_every < 0:
        raise UsageError("--checkpoint-every must be >= 0")
    device = resolve_device(args.device, env, args.mode)
    amp = resolve_amp(args.amp, device)
    micro_batch = split_batch(args.batch_size, env.world_size, args.grad_accum)
    data = load_data(args.data_dir) if args.data_dir else synthetic_data(args.num_samples, args.seed)
    if len(data) < args.batch_size:
        raise UsageError(f"dataset has {len(data)} samples, fewer than one global batch ({args.batch_size})")
    backend = ("nccl" if device.type == "cuda" else "gloo") if env.distributed else None
    return Run(args, env, device, backend, amp, data, micro_batch)


# --------------------------------------------------------------------------- data


class ShardedBatches:
    """This rank's micro-batches for an optimizer step.

    DistributedSampler (shuffle, seed, drop_last) gives this rank every
    world_size-th sample of a per-epoch permutation that does not depend on
    the world size; consecutive runs of micro_batch of them are the
    micro-batches. Across ranks, the micro-steps of step s cover exactly
    samples [s*B, (s+1)*B) of the permutation, for any world size.
    """

    def __init__(self, run: Run) -> None:
        self.sampler = DistributedSampler(
            range(len(run.data)), num_replicas=run.env.world_size, rank=run.env.rank,
            shuffle=True, seed=run.args.seed, drop_last=True,
        )
        self.micro_batch = run.micro_batch
        self.grad_accum = run.args.grad_accum
        self.steps_per_epoch = len(run.data) // run.args.batch_size
        self.epoch = -1
        self.shard = torch.empty(0, dtype=torch.long)

    def for_step(self, step: int) -> list[torch.Tensor]:
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch != self.epoch:
            self.sampler.set_epoch(epoch)
            self.shard = torch.tensor(list(self.sampler), dtype=torch.long)
            self.epoch = epoch
        per_step = self.micro_batch * self.grad_accum
        return list(self.shard[index * per_step:(index + 1) * per_step].split(self.micro_batch))


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


# --------------------------------------------------------------------------- collectives


def all_reduce_mean(value: torch.Tensor, env: DistEnv) -> float:
    if env.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= env.world_size
    return value.item()


def gather_objects(obj: Any, env: DistEnv, device: torch.device) -> list[Any]:
    """Every rank's JSON-serialisable obj, in rank order.

    Like dist.all_gather_object, which needs NumPy (not a torch dependency),
    and without pickle: JSON bytes in a padded uint8 tensor.
    """
    if not env.distributed:
        return [obj]
    payload = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8, device=device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(env.world_size)]
    dist.all_gather(sizes, torch.tensor([payload.numel()], device=device))
    longest = max(int(size) for size in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:payload.numel()] = payload
    every = [torch.empty_like(padded) for _ in range(env.world_size)]
    dist.all_gather(every, padded)
    return [json.loads(bytes(t[:int(n)].tolist())) for t, n in zip(every, sizes)]


def flat_parameters(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in module.parameters()])


def parameter_spread(module: nn.Module, env: DistEnv) -> float:
    """Max abs difference of any rank's parameters from rank 0's (inf on NaN mismatches)."""
    if not env.distributed:
        return 0.0
    mine = flat_parameters(module)
    every = [torch.empty_like(mine) for _ in range(env.world_size)]
    dist.all_gather(every, mine)
    worst = 0.0
    for other in every[1:]:
        same = (other == every[0]) | (other.isnan() & every[0].isnan())
        diff = torch.where(same, torch.zeros_like(other), (other - every[0]).abs()).max().item()
        worst = max(worst, diff if math.isfinite(diff) else math.inf)
    return worst


# --------------------------------------------------------------------------- checkpoints


def atomic_torch_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_checkpoint(run: Run, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler, step: int) -> None:
    rng = {"torch": torch.get_rng_state()}
    if run.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(run.device)
    atomic_torch_save({
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "step": step,
        "rng": rng,
        "config": {"batch_size": run.args.batch_size, "seed": run.args.seed, "hidden": run.args.hidden,
                   "world_size": run.env.world_size, "saved_by_rank": run.env.rank},
    }, run.args.checkpoint)
    LOG.info("checkpoint at step %d -> %s", step, run.args.checkpoint)


def save_checkpoint_rank0(run: Run, model: nn.Module, optimizer: torch.optim.Optimizer,
                          scaler: torch.amp.GradScaler, step: int) -> int:
    """Global rank 0 writes; returns how many files this rank wrote (0 or 1)."""
    if run.env.rank != 0:
        return 0
    save_checkpoint(run, model, optimizer, scaler, step)
    return 1


def load_checkpoint(run: Run, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler) -> int:
    """Restore the state on this rank; returns the step to continue from."""
    path: Path = run.args.checkpoint
    if not path.is_file():
        run.notes.append(f"--resume: no checkpoint at {path} yet, started from step 0")
        LOG.warning("--resume: no checkpoint at %s yet, starting from step 0", path)
        return 0
    state = torch.load(path, map_location=run.device, weights_only=True)
    unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if state["scaler"] and scaler.is_enabled():
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"]["torch"].cpu())
    if run.device.type == "cuda" and "cuda" in state["rng"]:
        torch.cuda.set_rng_state(state["rng"]["cuda"].cpu(), run.device)
    for key in ("batch_size", "seed"):
        if state["config"].get(key) != getattr(run.args, key):
            run.notes.append(f"resumed with a different {key} than the checkpoint's")
    LOG.info("resumed from %s at step %d", path, state["step"])
    return int(state["step"])


# --------------------------------------------------------------------------- training


def make_profiler(run: Run) -> torch.profiler.profile | None:
    if run.args.profile_dir is None:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    worker = f"{socket.gethostname()}_rank{run.env.rank}"
    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=PROFILE_ACTIVE, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(run.args.profile_dir), worker_name=worker),
    )


def micro_step_contexts(model: nn.Module, count: int) -> Iterator[contextlib.AbstractContextManager[Any]]:
    """DDP gradient sync only on the last micro-step of an optimizer step."""
    for i in range(count):
        last = i == count - 1
        yield model.no_sync() if isinstance(model, DistributedDataParallel) and not last else contextlib.nullcontext()


def train_step(run: Run, model: nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, micro_batches: list[torch.Tensor]) -> torch.Tensor:
    """One optimizer step over this rank's micro-batches; returns this rank's mean loss."""
    accum = len(micro_batches)
    loss_fn = loss_function(run.data.task)
    amp_dtype = AMP_DTYPES.get(run.amp)
    rank_loss = torch.zeros((), device=run.device)
    for idx, sync in zip(micro_batches, micro_step_contexts(model, accum)):
        x, y = to_device(run.data.x[idx], run.device), to_device(run.data.y[idx], run.device)
        with sync:
            with torch.amp.autocast(device_type=run.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = loss_fn(model(x).float(), y) / accum
            scaler.scale(loss).backward()
        rank_loss += loss.detach()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return rank_loss


def checkpoint_due(run: Run, step_done: int) -> bool:
    every = run.args.checkpoint_every
    return run.args.checkpoint is not None and every > 0 and step_done % every == 0


def train(run: Run, model: nn.Module, optimizer: torch.optim.Optimizer,
          scaler: torch.amp.GradScaler, start_step: int) -> TrainStats:
    batches = ShardedBatches(run)
    losses: list[float] = []
    saves, saved_at = 0, start_step
    profiler = make_profiler(run)
    started = last_log = time.perf_counter()
    last_log_step = start_step
    with profiler if profiler is not None else contextlib.nullcontext():
        for step in range(start_step, run.args.steps):
            rank_loss = train_step(run, model, optimizer, scaler, batches.for_step(step))
            loss = all_reduce_mean(rank_loss, run.env)
            losses.append(loss)
            if profiler is not None:
                profiler.step()
            done = step + 1
            if done % run.args.log_every == 0 or done == run.args.steps or not math.isfinite(loss):
                now = time.perf_counter()
                rate = run.args.batch_size * (done - last_log_step) / (now - last_log)
                LOG.info("step %d/%d | loss %.6f | %.0f samples/s", done, run.args.steps, loss, rate)
                last_log, last_log_step = now, done
            if not math.isfinite(loss):
                LOG.warning("non-finite loss at step %d: stopping", done)
                break
            if checkpoint_due(run, done):
                saves += save_checkpoint_rank0(run, model, optimizer, scaler, done)
                saved_at = done
    duration = time.perf_counter() - started
    final_step = start_step + len(losses)
    healthy = all(math.isfinite(v) for v in losses)  # never overwrite a checkpoint with a diverged model
    if run.args.checkpoint is not None and saved_at != final_step and healthy:
        saves += save_checkpoint_rank0(run, model, optimizer, scaler, final_step)
    return TrainStats(losses, duration, final_step, saves)


# --------------------------------------------------------------------------- verdict and result


def judge(losses: list[float], start_step: int, spread: float,
          min_drop: float) -> tuple[list[str], list[str], float | None]:
    """Return (reasons to fail, notes, loss drop); losses[i] is the loss of step start_step + i + 1."""
    reasons: list[str] = []
    notes: list[str] = []
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    if bad:
        reasons.append(f"non-finite loss (NaN/inf) at step {start_step + bad[0] + 1}: {losses[bad[0]]}")
    drop = None
    if len(losses) < 4:
        notes.append(f"loss trend not checked: {len(losses)} step(s) run, need 4")
    elif not bad:
        quarter = len(losses) // 4
        first, last = sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter
        drop = 1.0 - last / first if first > 0 else 0.0
        if not math.isfinite(drop) or drop < min_drop:
            reasons.append(f"loss not falling: first-quarter mean {first:.6g}, last-quarter mean {last:.6g}, "
                           f"drop {drop:.3f} < --min-loss-drop {min_drop}")
    if not spread <= PARAM_ATOL:
        reasons.append(f"ranks disagree on parameters: max abs diff {spread:.3g} > {PARAM_ATOL}")
    return reasons, notes, drop


def finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    return value


def rank_gpus(run: Run) -> list[torch.device]:
    """The GPUs this process drives: its own under DDP, every visible one under DataParallel."""
    if run.device.type != "cuda":
        return []
    if run.args.mode == "dp":
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [run.device]


def reset_peak_memory(run: Run) -> None:
    for gpu in rank_gpus(run):
        torch.cuda.reset_peak_memory_stats(gpu)


def peak_memory(run: Run) -> int | None:
    """Peak bytes allocated on this rank's GPUs (the largest of them); None without a GPU."""
    gpus = rank_gpus(run)
    return max(torch.cuda.max_memory_allocated(gpu) for gpu in gpus) if gpus else None


def build_result(run: Run, model: nn.Module, stats: TrainStats, start_step: int,
                 spread: float, ranks: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    reasons, notes, drop = judge(stats.losses, start_step, spread, run.args.min_loss_drop)
    steps_run = len(stats.losses)
    return finite_or_none({
        "verdict": "fail" if reasons else "pass",
        "reasons": reasons,
        "notes": run.notes + notes,
        "mode": run.args.mode,
        "wrapper": wrapper_name(model),
        "world_size": run.env.world_size,
        "backend": run.backend,
        "device": run.device.type,
        "hosts": [r["host"] for r in ranks],
        "amp": run.amp,
        "grad_accum": run.args.grad_accum,
        "global_batch": run.args.batch_size,
        "micro_batch": run.micro_batch,
        "steps": steps_run,
        "start_step": start_step,
        "final_step": stats.final_step,
        "losses": stats.losses,
        "loss_drop": drop,
        "samples_per_s": run.args.batch_size * steps_run / stats.duration_s if steps_run else 0.0,
        "duration_s": stats.duration_s,
        "wall_s": wall,
        "peak_memory_bytes": [r["peak_memory_bytes"] for r in ranks],
        "param_max_abs_diff": spread,
        "checkpoint_writes": [r["checkpoint_writes"] for r in ranks],
        "data": run.data.source,
        "task": run.data.task,
        "lr": run.args.lr,
        "seed": run.args.seed,
        "hidden": run.args.hidden,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
    })


def publish(result: dict[str, Any], args: argparse.Namespace) -> None:
    text = json.dumps(result, indent=2, allow_nan=False)
    if args.result is not None:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.result.with_name(f"{args.result.name}.tmp{os.getpid()}")
        tmp.write_text(text + "\n")
        os.replace(tmp, args.result)
    if args.json:
        print(text, flush=True)


def maybe_empty_cache(run: Run) -> None:
    if run.args.empty_cache and run.device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- main


def execute(run: Run) -> int:
    began = time.perf_counter()
    torch.manual_seed(run.args.seed)  # identical initial weights on every rank
    model = build_model(run.data.x.shape[1], run.args.hidden, run.data.out_features).to(run.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=run.args.lr, momentum=SGD_MOMENTUM)
    scaler = torch.amp.GradScaler(run.device.type, enabled=run.amp == "fp16")
    start_step = load_checkpoint(run, model, optimizer, scaler) if run.args.resume else 0
    model = wrap_model(model, run)
    LOG.info("world %d | backend %s | device %s | %s | amp %s | global batch %d = %d rank(s) x %d micro-step(s) x %d",
             run.env.world_size, run.backend, run.device, wrapper_name(model), run.amp, run.args.batch_size,
             run.env.world_size, run.args.grad_accum, run.micro_batch)
    maybe_empty_cache(run)
    reset_peak_memory(run)

    stats = train(run, model, optimizer, scaler, start_step)

    maybe_empty_cache(run)
    if run.args.save_params is not None and run.env.rank == 0:
        atomic_torch_save({k: v.cpu() for k, v in unwrap(model).state_dict().items()}, run.args.save_params)
    spread = parameter_spread(unwrap(model), run.env)
    mine = {"host": socket.gethostname(), "peak_memory_bytes": peak_memory(run),
            "checkpoint_writes": stats.checkpoint_writes}
    ranks = gather_objects(mine, run.env, run.device)
    result = build_result(run, model, stats, start_step, spread, ranks, time.perf_counter() - began)
    if run.env.rank == 0:
        publish(result, run.args)
        LOG.info("verdict %s%s", result["verdict"], "".join(f"\n  - {r}" for r in result["reasons"]))
    return EXIT_PASS if result["verdict"] == "pass" else EXIT_FAIL


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # exits 2 on a bad option
    setup_logging(os.environ.get("RANK", "0"))
    try:
        run = prepare(args, read_dist_env())
    except UsageError as exc:
        LOG.error("%s", exc)
        return EXIT_USAGE
    try:
        init_distributed(run)
        code = execute(run)
        if dist.is_initialized():
            dist.barrier()  # no rank tears gloo/NCCL down while another is still in a collective
        return code
    except UsageError as exc:
        LOG.error("%s", exc)
        return EXIT_USAGE
    except Exception:
        LOG.exception("training failed on rank %d", run.env.rank)
        return EXIT_ERROR
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def leave(code: int) -> None:
    """Exit with ``code``. A rank that torchrun started leaves without Python's finalization, once its
    process group is torn down and its output flushed: a gloo/NCCL background thread still winding down
    while the interpreter finalizes can abort (SIGABRT) a rank whose work is done, and torchrun would
    then fail the whole run."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    leave(main())
