"""Smoke-training payload for gpufleet: a small, deterministic multi-GPU PyTorch run.

It trains a small MLP with SGD on a seeded synthetic task (or a --data-dir dataset), checks that the run is
healthy and writes a JSON verdict. Reference (launch, batching, AMP, checkpoints, result, exit codes): docs/payload.md.
Top down: parse_args and plan() check every input (a frozen Plan), the Trainer holds the model, the optimizer and
the loop, execute() measures, judges and publishes, main() runs a rank.

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
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, Callable, Mapping, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

LOG = logging.getLogger("train")
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3
PARAM_ATOL = 1e-6  # ranks whose parameters differ by more than this fail the run
SYNTHETIC_FEATURES, SYNTHETIC_TARGETS, SYNTHETIC_NOISE = 32, 8, 0.05
PROFILE_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3, "repeat": 1}  # skip 1 step, warm up 1, record 3
SGD_MOMENTUM = 0.9  # SGD, not Adam: Adam magnifies float rounding, and runs are compared across world sizes
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "step", "rng", "config")
BUSBW_WARMUP, COMPUTE_REPEATS = 5, 5  # nccl-tests' default warm-up iterations; timed forward+backward passes


class UsageError(Exception):
    """A bad option, input or output path: exit code 2 and one line, before any training step."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line through the log, like every other usage error
        raise UsageError(message)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def number(kind: type, what: str, ok: Callable[[Any], bool]) -> Callable[[str], Any]:
        def parse(text: str) -> Any:  # an argparse type: a finite number of `kind` for which ok(value) holds
            if not (math.isfinite(value := kind(text)) and ok(value)):
                raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
            return value

        parse.__name__ = kind.__name__  # argparse: "invalid int value: 'x'"
        return parse

    p = Parser(description=__doc__.split("\n\n", maxsplit=1)[0])
    count, add = number(int, "1 or more", lambda v: v >= 1), p.add_argument
    add("--mode", choices=("ddp", "dp"), default="ddp", help="ddp: DistributedDataParallel; dp: nn.DataParallel (CUDA)")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto")
    add("--amp", choices=("auto", "bf16", "fp16", "off"), default="auto")
    add("--steps", type=count, default=40, help="optimizer steps in total")
    add("--batch-size", type=count, default=64, help="GLOBAL batch per optimizer step (all ranks and micro-steps)")
    add("--grad-accum", type=count, default=1, help="micro-steps per optimizer step")
    add("--lr", type=number(float, "a finite number above 0", lambda v: v > 0), default=0.2, help="SGD learning rate")
    add("--seed", type=int, default=1337)
    add("--hidden", type=count, default=64, help="MLP width")
    add("--num-samples", type=count, default=4096, help="synthetic dataset size")
    add("--data-dir", type=Path, help="directory with train.pt: {'x': Tensor[N, ...], 'y': Tensor[N, ...]}")
    add("--log-every", type=count, default=10)
    add(
        "--min-loss-drop",
        type=number(float, "a finite number below 1", lambda v: v < 1),
        default=0.1,
        help="fraction the loss must fall, last quarter of steps against the first",
    )
    add("--checkpoint", type=Path, help="checkpoint file (written by global rank 0)")
    add("--checkpoint-every", type=number(int, "0 or more", lambda v: v >= 0), default=0, help="0: only at the end")
    add("--resume", action="store_true", help="continue from --checkpoint")
    add("--save-params", type=Path, help="rank 0 saves the final model state_dict here")
    add("--profile-dir", type=Path, help="torch.profiler TensorBoard traces, one per rank")
    add("--empty-cache", action="store_true", help="torch.cuda.empty_cache() between phases")
    add("--timeout", type=count, default=600, help="collective timeout, seconds")
    add(
        "--busbw-mib",
        type=number(int, "0 or more", lambda v: v >= 0),
        default=64,
        help="all-reduce size of the bus-bandwidth measurement after training, MiB (0: not measured)",
    )
    add("--busbw-iters", type=count, default=20, help="timed all-reduces of that measurement")
    add("--result", type=Path, help="write the JSON result here (rank 0)")
    add("--json", action="store_true", help="print the JSON result on stdout (rank 0)")
    return p.parse_args(argv)


# The plan: every option, input and output checked before any process group or step; its result is frozen.
@dataclass(frozen=True)
class Data:
    """The dataset in memory: x [N, features]; y float [N, outputs] (regression, MSE) or class indices [N]."""

    x: torch.Tensor
    y: torch.Tensor
    task: str  # "regression" or "classification" (cross-entropy)
    outputs: int
    source: str  # for the result: the file, or the synthetic task's seed and size


@dataclass(frozen=True)
class Plan:
    """What plan() settled: this rank's place in the world, its device, AMP, batch split, data and checkpoint."""

    distributed: bool  # RANK and WORLD_SIZE set (torchrun); else one process without a process group
    rank: int
    world_size: int
    local_rank: int
    node: int  # torchrun's node rank (GROUP_RANK)
    device: torch.device
    gpus: tuple[torch.device, ...]  # the GPUs this process drives (DataParallel: all of the node's)
    backend: str | None  # nccl, gloo, or None without a process group
    amp: str  # bf16, fp16 or off
    micro_batch: int
    data: Data
    checkpoint: dict[str, Any] | None  # what --resume continues from; None: none (yet)


def plan(args: argparse.Namespace, environ: Mapping[str, str]) -> Plan:
    """Every option, input and output checked, before any process group or step: the Plan, or a UsageError."""
    distributed = "RANK" in environ and "WORLD_SIZE" in environ  # set by torchrun; else one process
    env = environ if distributed else {}
    rank, world_size = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    local_rank, node = int(env.get("LOCAL_RANK", 0)), int(env.get("GROUP_RANK", 0))
    if args.mode == "dp" and world_size > 1:
        raise UsageError("--mode dp is one process driving the node's GPUs: start it with python, not torchrun")
    if args.resume and args.checkpoint is None:
        raise UsageError("--resume needs --checkpoint PATH")
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        raise UsageError("--device cuda: CUDA is not available on this host")
    if args.mode == "dp" and (args.device == "cpu" or not cuda):  # a plain module on a CPU would prove nothing
        raise UsageError("--mode dp needs CUDA GPUs (nn.DataParallel splits each batch over them); use --mode ddp")
    on_gpu = cuda and args.device != "cpu"
    if on_gpu and args.mode == "ddp" and local_rank >= torch.cuda.device_count():
        raise UsageError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) visible")
    device = torch.device("cuda", local_rank if args.mode == "ddp" else 0) if on_gpu else torch.device("cpu")
    gpus = (device,) if on_gpu else ()
    if on_gpu and args.mode == "dp":  # DataParallel drives all of the node's GPUs
        gpus = tuple(torch.device("cuda", i) for i in range(torch.cuda.device_count()))
    # AMP: auto is bf16 where supported, else fp16 (GradScaler) on CUDA, else off; what cannot run is refused.
    bf16_ok = torch.cuda.is_bf16_supported() if on_gpu else cpu_autocast_available()
    if args.amp == "bf16" and not bf16_ok:
        raise UsageError(f"--amp bf16: not supported on {device}; use --amp auto or off")
    if args.amp == "fp16" and not on_gpu:
        raise UsageError("--amp fp16 needs CUDA (fp16 with a GradScaler); on CPU use --amp bf16 or off")
    amp = args.amp if args.amp != "auto" else "bf16" if bf16_ok else "fp16" if on_gpu else "off"
    parts = world_size * args.grad_accum
    if args.batch_size % parts:
        raise UsageError(
            f"--batch-size {args.batch_size} is not divisible by world size {world_size} x "
            f"--grad-accum {args.grad_accum} = {parts}; choose a multiple of {parts}"
        )
    data = load_data(args)
    if len(data.x) < args.batch_size:
        raise UsageError(f"dataset has {len(data.x)} samples, fewer than one global batch ({args.batch_size})")
    for option in ("checkpoint", "result", "save_params"):  # written by global rank 0
        if getattr(args, option) is not None and rank == 0:
            check_writable("--" + option.replace("_", "-"), getattr(args, option))
    if args.profile_dir is not None:  # every rank writes its trace there
        check_writable("--profile-dir", args.profile_dir, directory=True)
    return Plan(
        distributed=distributed,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        node=node,
        device=device,
        gpus=gpus,
        backend=("nccl" if on_gpu else "gloo") if distributed else None,
        amp=amp,
        micro_batch=args.batch_size // parts,
        data=data,
        checkpoint=read_checkpoint(args) if args.resume else None,
    )


def cpu_autocast_available() -> bool:
    """Whether autocast runs on the CPU. torch.amp.is_autocast_available came with torch 2.4; every older
    release the matrix names (2.1 to 2.3) has CPU autocast for bf16."""
    check = getattr(torch.amp, "is_autocast_available", None)
    return bool(check("cpu")) if check is not None else True


def load_data(args: argparse.Namespace) -> Data:
    """--data-dir's train.pt, else the synthetic task: a noisy linear target, sample i the same on any world size."""
    if args.data_dir is None:
        g = torch.Generator().manual_seed(args.seed)
        x = torch.randn(args.num_samples, SYNTHETIC_FEATURES, generator=g)
        teacher = torch.randn(SYNTHETIC_FEATURES, SYNTHETIC_TARGETS, generator=g) / math.sqrt(SYNTHETIC_FEATURES)
        y = x @ teacher + SYNTHETIC_NOISE * torch.randn(args.num_samples, SYNTHETIC_TARGETS, generator=g)
        return Data(x, y, "regression", SYNTHETIC_TARGETS, f"synthetic(seed={args.seed}, n={args.num_samples})")
    path = args.data_dir / "train.pt"
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # missing, corrupt, or holding more than tensors
        raise UsageError(f"--data-dir: {path} cannot be loaded with weights_only=True ({first_line(exc)})") from None
    x, y = (blob.get("x"), blob.get("y")) if isinstance(blob, dict) else (None, None)
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and len(x) == len(y) > 0):
        raise UsageError(f"{path}: expected a dict with tensors 'x' and 'y' of the same, non-zero length")
    x = x.reshape(len(x), -1).float()
    if y.is_floating_point():
        return Data(x, y.reshape(len(y), -1).float(), "regression", y[0].numel(), str(path))
    if y.dim() != 1 or int(y.min()) < 0:
        raise UsageError(f"{path}: an integer y must be class indices of shape [N], >= 0")
    return Data(x, y.long(), "classification", int(y.max()) + 1, str(path))


def check_writable(option: str, path: Path, directory: bool = False) -> None:
    """Create and remove a file where the run will write one (inside path, with directory)."""
    where = path if directory else path.parent
    try:
        if not directory and path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        if where.exists() and not where.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        where.mkdir(parents=True, exist_ok=True)
        os.close((probe := tempfile.mkstemp(prefix=".write-test.", dir=where))[0])
        os.unlink(probe[1])
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot be written ({exc.strerror or exc})") from None


def read_checkpoint(args: argparse.Namespace) -> dict[str, Any] | None:
    """The checkpoint --resume continues from, checked and never changed; None when there is none yet."""
    path, where = args.checkpoint, f"--checkpoint {args.checkpoint}"
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, empty, not a torch file
        raise UsageError(f"{where}: cannot be loaded ({first_line(exc)}); it is left as it is") from None
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(state, dict) or key not in state]
    if missing or not isinstance(state["config"], dict) or not isinstance(state["step"], int):
        raise UsageError(f"{where}: not a checkpoint of this payload (no {', '.join(missing) or 'valid step'})")
    hidden = state["config"].get("hidden")
    if hidden != args.hidden:
        raise UsageError(f"{where}: saved with --hidden {hidden}, this run has --hidden {args.hidden}")
    if state["step"] >= args.steps:
        raise UsageError(f"{where} is at step {state['step']}, at or past --steps {args.steps}: nothing left to train")
    return state


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


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


# After training: measure the ranks and the network, judge the run, publish the result.
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


def gather(t: Trainer, mine: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """Every rank's mine (JSON bytes: all_gather_object needs NumPy) and how far apart the ranks' parameters are."""
    if not t.plan.distributed:
        return [mine], 0.0
    data, padded = json.dumps(mine).encode(), torch.zeros(4096, dtype=torch.uint8, device=t.plan.device)
    padded[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    every = [torch.empty_like(padded) for _rank in range(t.plan.world_size)]
    dist.all_gather(every, padded)
    params = torch.cat([p.detach().float().reshape(-1) for p in t.module.parameters()])
    high = torch.nan_to_num(params, nan=3e38)  # NaN on every rank is agreement, NaN on some is not
    low = high.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return [json.loads(bytes(e.tolist()).rstrip(b"\0")) for e in every], (high - low).max().item()


def synchronize(t: Trainer) -> None:
    for gpu in t.plan.gpus:  # every GPU this rank drives (DataParallel: all of the node's)
        torch.cuda.synchronize(gpu)


def time_compute(t: Trainer) -> float:
    """Seconds of one step's forward and backward passes on this rank (the median of COMPUTE_REPEATS), without the
    gradient all-reduce (no_sync) or the optimizer: the node's own pace, to compare nodes with. The model stays."""
    times = []
    for step in range(COMPUTE_REPEATS):
        synchronize(t)
        began = time.perf_counter()
        t.forward_backward(step, sync=False)
        synchronize(t)
        times.append(time.perf_counter() - began)
    t.optimizer.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2]


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


def time_all_reduce(t: Trainer, ranks: list[dict[str, Any]], mib: int, iters: int) -> dict[str, Any]:
    """Bus bandwidth of an all-reduce of `mib` MiB over every rank ("world") and over one rank per node, each node's
    local rank 0 ("inter_node": the path between nodes alone). busbw = algbw x 2(n-1)/n, as nccl-tests defines it
    (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md); the slowest rank's time counts."""
    leaders = [rank for rank, r in enumerate(ranks) if r["local_rank"] == 0]
    groups = {"world": (None, list(range(len(ranks)))), "inter_node": (dist.new_group(leaders), leaders)}
    buffer, size = torch.zeros(mib * 2**20 // 4, device=t.plan.device), mib * 2**20 // 4 * 4
    result = {
        "backend": t.plan.backend,
        "measured": "gloo over TCP" if t.plan.backend == "gloo" else "NCCL",
        "size_bytes": size,
        "warmup": BUSBW_WARMUP,
        "iters": iters,
    }
    for name, (group, members) in groups.items():
        seconds = torch.zeros(1, dtype=torch.float64, device=t.plan.device)
        if t.plan.rank in members and len(members) > 1:
            for i in range(BUSBW_WARMUP + iters):
                if i == BUSBW_WARMUP:
                    synchronize(t)
                    began = time.perf_counter()
                dist.all_reduce(buffer, group=group)
            synchronize(t)
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
        t,
        {
            "host": socket.gethostname(),
            "node": p.node,
            "local_rank": p.local_rank,
            "checkpoint_writes": t.saves,
            "peak_memory_bytes": peak,
            "compute_s": time_compute(t),
        },
    )
    network = time_all_reduce(t, ranks, args.busbw_mib, args.busbw_iters) if p.distributed and args.busbw_mib else None
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
        trainer = ALIVE.trainer = Trainer(parse_args(argv))  # not freed at main's return (ALIVE)
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
