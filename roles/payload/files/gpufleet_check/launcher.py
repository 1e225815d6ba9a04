"""The training payload (train.py) under torchrun, and the ``train`` subcommand.

``run_training`` starts ``python -m torch.distributed.run`` in a session of
its own, with the rank variables of the caller's environment removed and its
temporary files in a directory that leaves with the run. When the timeout
expires, or the launcher itself is stopped (SIGTERM, Ctrl-C), torchrun's
process group and every worker (each in a session of its own) are sent
SIGTERM, then SIGKILL after a grace period (``stop_process_tree``): no rank
outlives the run. The result is the payload's own (``--result``), the tail
of the log and the failed workers torchrun's error summary lists.

Why a rank failed comes first: each failure's "cause" is the rank's own
error (train.py logs ``rank<N> ERROR <message>`` and records the exception
in torchrun's error file), not torchrun's "To enable traceback see: ...";
the log tail starts with the payload's error lines, and torchrun's own
ChildFailedError traceback (its launcher's call stack) is left out of it.

The payload is train.py beside gpufleet_check.pyz (beside the package
directory when it runs from source), else /opt/gpufleet/payload/train.py,
or ``--payload PATH``.

Multi-node training (the same command on every node; prints one JSON object
{"rc", "node", "result", "log_tail", "failures", "failed_ranks", "nccl"}, where
"result" is the payload's result on the node that got global rank 0 and null
elsewhere, "failures" the workers torchrun's error summary lists (host,
rank, exit code: negative when killed by that signal, cause; the root cause
first), described one per line in "failed_ranks", and "nccl" what NCCL's own
log says this node's ranks used between nodes (nccl.read_logs: transport,
GPUDirect RDMA, HCAs; null when no rank wrote one: gloo). Every rank runs with
NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET and a NCCL_DEBUG_FILE of its own in
the run's directory, so NCCL's lines stay out of the log; on a failure its
WARN lines are added to the log tail)::

    python3 gpufleet_check.pyz train --nnodes 2 --nproc-per-node 8 \\
        --rdzv-endpoint node1:29500 --rdzv-id smoke1 [--timeout 600] [-- payload args...]

It runs ``torchrun --rdzv-backend=c10d --max-restarts=0`` on train.py. Without
payload args the payload gets ``--steps 40 --amp auto --grad-accum 2`` and a
global batch that the world size divides. When ``--timeout`` (default 600 s)
expires, torchrun and its workers are killed and rc is 124. The subcommand
exits with torchrun's code (0 when the payload passed, 124 on timeout, 2 when
there is no payload).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import nccl
from .common import EXIT_TIMEOUT, EXIT_USAGE, finite_or_none, positive_int, program_name, read_text

PAYLOAD_NAME = "train.py"
INSTALLED_PAYLOAD_DIR = Path("/opt/gpufleet/payload")
TRAIN_PAYLOAD_ARGS = ("--steps", "40", "--amp", "auto", "--grad-accum", "2")
TRAIN_GRAD_ACCUM = 2  # as in TRAIN_PAYLOAD_ARGS
PAYLOAD_GLOBAL_BATCH = 64  # train.py's default --batch-size
TRAIN_TIMEOUT_S = 600
LOG_TAIL_LINES = 40
STOP_GRACE_S = 5.0
DIST_ENV_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)
PAYLOAD_HELP = f"train.py to run (default: beside gpufleet_check.pyz, else {INSTALLED_PAYLOAD_DIR / PAYLOAD_NAME})"


# --------------------------------------------------------------------------- the payload and torchrun's command


def payload_home() -> Path:
    """The directory this copy of gpufleet_check lives in: the one holding
    gpufleet_check.pyz when it runs from the zipapp (zipimport's loader names
    the archive), else the one holding the package directory (roles/payload/files
    in a checkout, with PYTHONPATH=roles/payload/files)."""
    archive = getattr(getattr(__spec__, "loader", None), "archive", None)
    if archive:
        return Path(archive).resolve().parent
    return Path(__file__).resolve().parent.parent


def find_payload() -> Path:
    """train.py beside gpufleet_check.pyz (or beside the package), else the installed copy."""
    beside = payload_home() / PAYLOAD_NAME
    return beside if beside.is_file() else INSTALLED_PAYLOAD_DIR / PAYLOAD_NAME


def default_payload_args(world_size: int) -> list[str]:
    """TRAIN_PAYLOAD_ARGS with the payload's global batch, rounded up so every rank gets whole micro-batches."""
    parts = world_size * TRAIN_GRAD_ACCUM
    batch = parts * math.ceil(PAYLOAD_GLOBAL_BATCH / parts)
    return [*TRAIN_PAYLOAD_ARGS, "--batch-size", str(batch)]


def torchrun_command(
    nproc: int,
    nnodes: int,
    node_rank: int,
    rdzv_endpoint: str | None,
    rdzv_id: str | None,
    payload: Path,
    payload_args: Sequence[str],
    result_file: Path,
) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}"]
    if rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += [
            f"--node-rank={node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={rdzv_id or 'gpufleet'}",
            "--max-restarts=0",
        ]
    return cmd + [str(payload), *payload_args, "--result", str(result_file), "--json"]


# --------------------------------------------------------------------------- process-tree cleanup


def process_stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) from /proc/<pid>/stat, or None when the process is gone."""
    stat = read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ..., starttime (field 22)
    return int(fields[1]), fields[0], fields[19]


def descendants(root: int) -> list[tuple[int, str]]:
    """(pid, start time) of root's descendants; torchrun puts each worker in a session of its own."""
    children: dict[int, list[int]] = defaultdict(list)
    started: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        stat = process_stat(int(entry)) if entry.isdigit() else None
        if stat is not None:
            children[stat[0]].append(int(entry))
            started[int(entry)] = stat[2]
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in started:
            found.append((pid, started[pid]))
        todo += children.get(pid, [])
    return found


def alive(process: tuple[int, str]) -> bool:
    """The same process (not a reused pid) still running, zombies counting as gone."""
    stat = process_stat(process[0])
    return stat is not None and stat[2] == process[1] and stat[1] not in ("Z", "X")


def signal_processes(group_leader: int, processes: Iterable[tuple[int, str]], sig: int) -> None:
    """Send sig to torchrun's process group and to each of its workers still alive."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group_leader, sig)
    for process in processes:
        if alive(process):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process[0], sig)


def stop_process_tree(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM torchrun's process group and every worker; SIGKILL what is left after `grace` seconds."""
    workers = descendants(proc.pid)
    signal_processes(proc.pid, workers, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or any(alive(w) for w in workers)):
        workers += [w for w in descendants(proc.pid) if w not in workers]
        time.sleep(0.1)
    signal_processes(proc.pid, workers, signal.SIGKILL)
    proc.wait()


def wait_or_stop(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """(exit code, note): torchrun's code, or 124 and a note when `timeout` expires."""
    try:
        return proc.wait(timeout=timeout), ""
    except subprocess.TimeoutExpired:
        stop_process_tree(proc)
        return EXIT_TIMEOUT, f"timed out after {timeout:g} s"
    except BaseException:  # KeyboardInterrupt, SystemExit from SIGTERM: leave no workers behind
        stop_process_tree(proc)
        raise


# --------------------------------------------------------------------------- what the run left


CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
# train.py's log lines: "<time> rank<N> <LEVEL> <message>" (torch may prefix "[rank<N>]:").
PAYLOAD_ERROR = re.compile(r"(?:^|\s)rank(\d+) (?:ERROR|CRITICAL) (.+)$")


def drop_printed_result(lines: list[str]) -> list[str]:
    """Leave out the payload's --json copy of its result (a block from "{" to "}"); it is in "result"."""
    kept, inside = [], False
    for line in lines:
        inside = inside or line == "{"
        if not inside:
            kept.append(line)
        inside = inside and line != "}"
    return kept


def drop_launcher_traceback(lines: list[str]) -> list[str]:
    """Leave out torchrun's own traceback ("Traceback ..." down to its ChildFailedError line): the
    launcher's call stack says nothing about the failed rank; its failure summary below it stays."""
    kept, index = [], 0
    while index < len(lines):
        if lines[index] == "Traceback (most recent call last):":
            end = index + 1
            while end < len(lines) and lines[end].startswith(" "):
                end += 1
            if end < len(lines) and lines[end].startswith(CHILD_FAILED):
                index = end + 1
                continue
        kept.append(lines[index])
        index += 1
    return kept


def payload_error_lines(lines: Iterable[str]) -> list[str]:
    """The payload's own ERROR lines, each once, in order."""
    found: list[str] = []
    for line in lines:
        if PAYLOAD_ERROR.search(line) and line not in found:
            found.append(line)
    return found


def payload_errors(log_text: str) -> dict[int, str]:
    """The first error message the payload logged on each global rank."""
    errors: dict[int, str] = {}
    for line in log_text.splitlines():
        match = PAYLOAD_ERROR.search(line)
        if match:
            errors.setdefault(int(match.group(1)), match.group(2).strip())
    return errors


def log_tail(log_file: Path, note: str) -> str:
    """The payload's own error lines first, then the last LOG_TAIL_LINES of the rest of the log."""
    lines = drop_launcher_traceback(drop_printed_result((read_text(log_file) or "").splitlines()))
    errors = payload_error_lines(lines)
    rest = [line for line in lines if line not in errors][-LOG_TAIL_LINES:]
    return "\n".join(errors + rest + ([note] if note else []))


FAILURE_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)$")
UNINFORMATIVE_CAUSES = ("To enable traceback", "<N/A>")


def worker_failures(log_text: str) -> list[dict[str, Any]]:
    """The failed workers torchrun lists in its error summary ("Root Cause" first, then the other
    "Failures"): host, global rank, exit code (negative: killed by that signal) and cause, each rank
    once. The cause is the rank's own error: the message the payload logged on that rank, else the
    last line of the traceback the payload recorded in torchrun's error file, else torchrun's text."""
    own = payload_errors(log_text)
    root: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    section = others
    entry: dict[str, Any] = {}

    def keep() -> None:
        rank = re.match(r"-?\d+", entry.get("rank", ""))
        code = re.match(r"-?\d+", entry.get("exitcode", ""))
        if rank and code:
            trace = [line for line in entry.get("traceback_lines", []) if line.strip()]
            cause = own.get(int(rank.group())) or (trace[-1].strip() if len(trace) > 1 else entry.get("traceback", ""))
            entry["failure"] = {
                "host": entry.get("host", ""),
                "rank": int(rank.group()),
                "exitcode": int(code.group()),
                "cause": cause,
            }
            entry["section"].append(entry["failure"])

    for line in log_text.splitlines():
        if line.startswith("Root Cause"):
            section = root
        if re.match(r"^\s*\[\d+\]:\s*$", line) or re.match(r"^[=-]{10,}$", line):
            keep()
            entry = {"section": section} if line.strip().startswith("[") else {}
        elif (match := FAILURE_FIELD.match(line)) and "section" in entry:
            entry[match.group(1)] = match.group(2).strip()
            if match.group(1) == "traceback":
                entry["traceback_lines"] = [match.group(2)]
        elif "traceback_lines" in entry and line.startswith("  "):
            entry["traceback_lines"].append(line)
    keep()
    failures: dict[int, dict[str, Any]] = {}
    for failure in root + others:
        failures.setdefault(failure["rank"], failure)
    return list(failures.values())


def describe_failure(failure: dict[str, Any]) -> str:
    """One line for a failed worker: killed by a signal, or its exit code and why."""
    where = f"rank {failure['rank']} on {failure['host'] or 'an unknown host'}"
    code = failure["exitcode"]
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{where} was killed by signal {-code} ({name})"
    cause = str(failure.get("cause") or "")
    informative = bool(cause) and not cause.startswith(UNINFORMATIVE_CAUSES)
    return f"{where} exited with code {code}" + (f": {cause}" if informative else "")


def failure_summary(run: dict[str, Any]) -> str:
    """Why a run left no result, in one line: its first failure (the root cause), else the log's first line."""
    if run.get("failures"):
        return describe_failure(run["failures"][0])
    lines = [line for line in str(run.get("log_tail") or "").splitlines() if line.strip()]
    return lines[0] if lines else "no output"


# --------------------------------------------------------------------------- the run


def training_env(tmpdir: Path | None = None) -> dict[str, str]:
    """The launcher's environment: no inherited rank variables; with ``tmpdir``, torchrun's
    and the workers' temporary files (torchelastic_*, ...) go there and leave with it, and so
    does every rank's NCCL log (nccl.debug_env, read by nccl.read_logs)."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
        env.update(nccl.debug_env(tmpdir))
    return env


def run_training(
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    payload_args: Sequence[str] = (),
    timeout: float = TRAIN_TIMEOUT_S,
    payload: str | Path | None = None,
) -> dict[str, Any]:
    """Run the payload under torchrun: {"rc", "result" (on the node with global rank 0, else None), "log_tail",
    "failures", "nccl" (nccl.read_logs of this node's ranks, None without NCCL)}.

    Without rdzv_endpoint it is a --standalone single-node run; with it, the c10d
    rendezvous of a multi-node run. torchrun starts in a session of its own so
    that a timeout can stop it with all its workers (rc 124).
    """
    payload = Path(payload) if payload else find_payload()
    if not payload.is_file():
        return {
            "rc": EXIT_USAGE,
            "result": None,
            "log_tail": f"payload not found: {payload}",
            "failures": [],
            "nccl": None,
        }
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-train-"))
    try:
        result_file, log_file = workdir / "result.json", workdir / "torchrun.log"
        cmd = torchrun_command(nproc, nnodes, node_rank, rdzv_endpoint, rdzv_id, payload, payload_args, result_file)
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=training_env(workdir),
                start_new_session=True,
            )
        rc, note = wait_or_stop(proc, timeout)
        result_text, reading = read_text(result_file), nccl.read_logs(workdir)
        warnings = reading["warnings"] if reading and rc != 0 else []  # NCCL's WARN lines went to its own files
        tail = "\n".join([log_tail(log_file, note), *(f"NCCL WARN {w}" for w in warnings)])
        return {
            "rc": rc,
            "result": json.loads(result_text) if result_text else None,
            "log_tail": tail,
            "failures": worker_failures(read_text(log_file) or ""),
            "nccl": reading,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- the train subcommand


def split_payload_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(own options, payload args): everything after the first "--" belongs to the payload."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def parse_train_args(argv: Sequence[str]) -> argparse.Namespace:
    own, payload_args = split_payload_args(argv)
    p = argparse.ArgumentParser(
        prog=f"{program_name()} train",
        usage="%(prog)s [options] [-- payload args...]",
        description="Run the training payload under torchrun on this node and print one JSON object "
        '{"rc", "node", "result", "log_tail", "failures", "failed_ranks", "nccl"}. '
        "Run the same command on every node.",
        epilog=f"Without payload args: {' '.join(TRAIN_PAYLOAD_ARGS)} and a divisible --batch-size.",
    )
    p.add_argument("--nnodes", type=positive_int, default=1, metavar="N", help="nodes in the job (default 1)")
    p.add_argument(
        "--nproc-per-node", type=positive_int, required=True, metavar="P", help="processes on this node, one per GPU"
    )
    p.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="c10d rendezvous (required with --nnodes > 1; without it: --standalone)",
    )
    p.add_argument("--rdzv-id", default="gpufleet", metavar="ID", help="job id, the same on every node")
    p.add_argument(
        "--timeout",
        type=positive_int,
        default=TRAIN_TIMEOUT_S,
        metavar="S",
        help=f"seconds before torchrun and its workers are killed, rc 124 (default {TRAIN_TIMEOUT_S})",
    )
    p.add_argument("--payload", type=Path, metavar="PATH", help=PAYLOAD_HELP)
    args = p.parse_args(own)
    if args.nnodes > 1 and not args.rdzv_endpoint:
        p.error("--nnodes > 1 needs --rdzv-endpoint")
    args.payload_args = payload_args or default_payload_args(args.nnodes * args.nproc_per_node)
    return args


def raise_system_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def train_main(argv: Sequence[str]) -> int:
    """The `train` subcommand."""
    args = parse_train_args(argv)
    signal.signal(signal.SIGTERM, raise_system_exit)  # a killed subcommand still stops torchrun
    run = run_training(
        args.nproc_per_node,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        payload_args=args.payload_args,
        timeout=args.timeout,
        payload=args.payload,
    )
    print(
        json.dumps(
            finite_or_none(
                {
                    "rc": run["rc"],
                    "node": socket.gethostname(),
                    "result": run["result"],
                    "log_tail": run["log_tail"],
                    "failures": run["failures"],
                    "failed_ranks": [describe_failure(f) for f in run["failures"]],
                    "nccl": run["nccl"],
                }
            ),
            indent=2,
            allow_nan=False,
        ),
        flush=True,
    )
    return run["rc"]
