"""The run plan of train.py (the smoke-training payload; its reference: docs/payload.md).

parse_args reads the options; plan() checks every option, input and output before any process group or training
step and settles them in a frozen Plan (this rank's place in the world, its device, AMP, the batch split, the data,
the checkpoint to resume from), or raises a UsageError: exit code 2 and one line.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

SYNTHETIC_FEATURES, SYNTHETIC_TARGETS, SYNTHETIC_NOISE = 32, 8, 0.05
CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "step", "rng", "config")


class UsageError(Exception):
    """A bad option, input or output path: exit code 2 and one line, before any training step."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line through the log, like every other usage error
        raise UsageError(message)


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """train.py's options (docs/payload.md names each); description: the first paragraph of --help."""

    def number(kind: type, what: str, ok: Callable[[Any], bool]) -> Callable[[str], Any]:
        def parse(text: str) -> Any:  # an argparse type: a finite number of `kind` for which ok(value) holds
            if not (math.isfinite(value := kind(text)) and ok(value)):
                raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
            return value

        parse.__name__ = kind.__name__  # argparse: "invalid int value: 'x'"
        return parse

    p = Parser(description=description)
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
