"""Tests for roles/payload/files/gpufleet_check.pyz (the zipapp of roles/payload/files/gpufleet_check/)
with (CPU) torch: the report of a machine without GPUs, and the training
payload run through torchrun by ``--train`` and by the ``train`` subcommand
(including its timeout).

Every run is a subprocess in a clean environment: no torchrun variables, no
visible CUDA device, no nvidia-smi on PATH and empty fake sysfs / driver
paths, so a machine with GPUs looks like one without them too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

# The file the nodes receive; train.py beside it is the payload it runs.
CHECK = Path(__file__).resolve().parents[2] / "roles" / "payload" / "files" / "gpufleet_check.pyz"
NO_GPU_CHECKS = (
    "driver_version",
    "nvidia_smi",
    "torch_cuda",
    "gemm",
    "memory_bandwidth",
    "allreduce_busbw",
    "p2p_topology",
    "gpu_errors",
    "pcie",
    "clocks",
    "nvlink",
    "xid",
    "interconnect",
    "dcgm",
)
DIST_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cpu_host(tmp_path: Path) -> dict[str, Any]:
    """Environment and options of a machine without GPUs."""
    for name in ("bin", "sysfs", "libs"):
        (tmp_path / name).mkdir()
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env.update(PATH=str(tmp_path / "bin"), CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    argv = [
        "--sysfs-pci-dir",
        str(tmp_path / "sysfs"),
        "--module-version-file",
        str(tmp_path / "none"),
        "--driver-proc-file",
        str(tmp_path / "none"),
        "--driver-lib-dir",
        str(tmp_path / "libs"),
    ]
    return {"env": env, "argv": argv}


def run(cpu_host: dict[str, Any], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), *args],
        env=cpu_host["env"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in report["checks"]}


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of live processes that contain marker."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue
        if marker in cmdline and state != "Z":
            found.append(cmdline)
    return found


def test_cpu_machine_skips_gpu_checks_and_says_nothing_was_checked(cpu_host: dict[str, Any]) -> None:
    """No GPU and no driver: every check is skipped, which is not a pass (issue 16, item 1)."""
    proc = run(cpu_host, "--json", *cpu_host["argv"])
    assert proc.returncode == 1, explain(proc)
    report = json.loads(proc.stdout)
    assert report["schema"] == "gpufleet-check/1" and report["host"] == socket.gethostname()
    assert (report["verdict"], report["reboot_required"]) == ("fail", False)
    assert report["reasons"] == ["nothing was checked: no GPU (15 checks skipped)"]
    assert (report["gpus"], report["gpu_count_pci"]) == ([], 0) and "training" not in report
    versions = report["versions"]
    assert versions["torch"] == torch.__version__ and versions["cuda"] == torch.version.cuda
    checks = by_name(report)
    for name in NO_GPU_CHECKS:
        assert checks[name]["verdict"] == "skipped" and checks[name]["detail"].startswith("no GPU"), checks[name]
    libraries = checks["libraries"]
    assert libraries["verdict"] == "skipped" and libraries["detail"].startswith("no GPU")
    assert libraries["value"]["torch"] == torch.__version__ and torch.__version__ in libraries["detail"]


def test_train_flag_runs_the_payload(cpu_host: dict[str, Any]) -> None:
    proc = run(cpu_host, "--json", "--train", "--train-nproc", "2", *cpu_host["argv"])
    assert proc.returncode == 0, explain(proc)
    report = json.loads(proc.stdout)
    training = by_name(report)["training"]
    assert training["verdict"] == "pass", training
    assert training["value"] > 0 and training["unit"] == "samples/s"
    assert training["detail"].startswith("world size 2 on cpu, 40 steps")
    result = report["training"]
    assert (result["verdict"], result["world_size"], result["grad_accum"]) == ("pass", 2, 2)
    assert result["hosts"] == [socket.gethostname()] * 2 and result["backend"] == "gloo"


def test_train_subcommand_single_node_rendezvous(cpu_host: dict[str, Any]) -> None:
    proc = run(
        cpu_host,
        "train",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        "unit",
    )
    assert proc.returncode == 0, explain(proc)
    out = json.loads(proc.stdout)  # one JSON object, nothing else on stdout
    assert out.keys() == {"rc", "node", "result", "log_tail", "failures", "failed_ranks", "nccl"}
    assert out["failures"] == [] and out["failed_ranks"] == [] and out["nccl"] is None  # gloo: no NCCL log
    assert (out["rc"], out["node"]) == (0, socket.gethostname())
    assert (out["result"]["verdict"], out["result"]["world_size"]) == ("pass", 2)
    assert "verdict pass" in out["log_tail"] and '"losses"' not in out["log_tail"]


def test_train_subcommand_two_nodes_time_the_all_reduce_between_them(cpu_host: dict[str, Any]) -> None:
    """Two nodes (two train subcommands, 2 CPU ranks each, one c10d rendezvous: torchrun's node ranks 0 and 1, on
    this one machine): rank 0's result carries the all-reduce bus bandwidth over the world and over one rank per
    node, labelled as gloo over TCP, and each node's compute time per step."""
    endpoint, cmd = f"127.0.0.1:{free_port()}", [sys.executable, str(CHECK), "train", "--nnodes", "2"]
    args = [
        "--nproc-per-node",
        "2",
        "--rdzv-id",
        "two-nodes",
        "--timeout",
        "240",
        "--",
        "--steps",
        "12",
        "--batch-size",
        "64",
        "--busbw-mib",
        "4",
        "--busbw-iters",
        "5",
    ]
    nodes = [
        subprocess.Popen(
            [*cmd, "--rdzv-endpoint", endpoint, *args],
            env=cpu_host["env"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _node in range(2)
    ]
    outs = [json.loads(node.communicate(timeout=300)[0]) for node in nodes]
    assert [out["rc"] for out in outs] == [0, 0], [out["log_tail"] for out in outs]
    assert [out["nccl"] for out in outs] == [None, None]  # gloo: NCCL wrote no log, nothing to read
    [result] = [out["result"] for out in outs if out["result"] is not None]  # the node with global rank 0
    assert (result["verdict"], result["world_size"], result["backend"]) == ("pass", 4, "gloo")
    network = result["network"]
    assert (network["backend"], network["measured"]) == ("gloo", "gloo over TCP")
    assert (network["size_bytes"], network["warmup"], network["iters"]) == (4 * 2**20, 5, 5)
    for name, ranks in (("world", 4), ("inter_node", 2)):
        figures = network[name]
        assert figures["ranks"] == ranks and figures["seconds"] > 0, figures
        assert figures["algbw_gbps"] == pytest.approx(4 * 2**20 / figures["seconds"] / 1e9)
        assert figures["busbw_gbps"] > 0
        assert figures["busbw_gbps"] == pytest.approx(figures["algbw_gbps"] * 2 * (ranks - 1) / ranks)
    assert [(n["node"], n["ranks"]) for n in result["nodes"]] == [(0, 2), (1, 2)]
    for node in result["nodes"]:
        assert node["host"] == socket.gethostname() and node["compute_s_per_step"] > 0 and node["samples_per_s"] > 0
    assert len(result["compute_s_per_step"]) == 4 and min(result["compute_s_per_step"]) > 0


def workers_of(marker: str) -> list[str]:
    """Command lines of the payload's worker processes (not torchrun, not the check itself)."""
    return [
        cmd
        for cmd in processes_mentioning(marker)
        if "train.py" in cmd and "torch.distributed.run" not in cmd and "gpufleet_check.pyz" not in cmd
    ]


def start_train(cpu_host: dict[str, Any], marker: str, timeout: int) -> subprocess.Popen[str]:
    """The train subcommand on 2 CPU ranks with a run far too long to finish; marker is in every command line."""
    cmd = [
        sys.executable,
        str(CHECK),
        "train",
        "--nproc-per-node",
        "2",
        "--timeout",
        str(timeout),
        "--",
        "--steps",
        "100000",
        "--save-params",
        marker,
    ]
    return subprocess.Popen(cmd, env=cpu_host["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_nothing_left(marker: str) -> None:
    deadline = time.monotonic() + 5
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(marker) == []


def test_train_subcommand_timeout_stops_everything(cpu_host: dict[str, Any], tmp_path: Path) -> None:
    """rc 124 after --timeout 3, and no process of the run left (on a slow machine the workers may
    not have started within 3 s; the SIGTERM test below waits for them)."""
    marker = str(tmp_path / "never-written-params.pt")
    began = time.monotonic()
    proc = start_train(cpu_host, marker, timeout=3)
    stdout, stderr = proc.communicate(timeout=60)
    elapsed = time.monotonic() - began
    assert proc.returncode == 124, f"rc={proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    assert elapsed < 15, f"took {elapsed:.1f} s"
    out = json.loads(stdout)
    assert (out["rc"], out["result"]) == (124, None)
    assert out["log_tail"].endswith("timed out after 3 s")
    assert_nothing_left(marker)


def test_train_subcommand_sigterm_stops_the_workers(cpu_host: dict[str, Any], tmp_path: Path) -> None:
    """SIGTERM to the subcommand once both workers run: it stops them (they sit in sessions of their own)."""
    marker = str(tmp_path / "never-written-params.pt")
    proc = start_train(cpu_host, marker, timeout=120)
    deadline = time.monotonic() + 60
    while len(workers_of(marker)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(workers_of(marker)) == 2, f"the 2 workers did not show up (rc {proc.poll()})"
    proc.terminate()
    proc.communicate(timeout=30)
    assert proc.returncode == 143  # 128 + SIGTERM
    assert_nothing_left(marker)


def test_train_subcommand_names_a_rank_killed_by_a_signal(cpu_host: dict[str, Any], tmp_path: Path) -> None:
    """One of the 2 workers is killed (SIGKILL) mid-run: the subcommand fails, and its envelope names
    that rank and the signal from torchrun's own failure summary; nothing of the run is left."""
    marker = str(tmp_path / "never-written-params.pt")
    proc = start_train(cpu_host, marker, timeout=120)
    deadline = time.monotonic() + 60
    while len(worker_pids(marker)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = worker_pids(marker)
    assert len(pids) == 2, f"the 2 workers did not show up (rc {proc.poll()})"
    time.sleep(2)
    victim = next(
        pid for pid in pids if "LOCAL_RANK=1" in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    )
    os.kill(victim, 9)
    stdout, _stderr = proc.communicate(timeout=60)
    out = json.loads(stdout)
    assert out["rc"] != 0 and out["result"] is None
    assert {"rank": 1, "exitcode": -9} in [{k: f[k] for k in ("rank", "exitcode")} for f in out["failures"]], out[
        "failures"
    ]
    assert any(
        line.startswith("rank 1 on ") and line.endswith("was killed by signal 9 (SIGKILL)")
        for line in out["failed_ranks"]
    )
    assert_nothing_left(marker)


def worker_pids(marker: str) -> list[int]:
    """pids of the payload's worker processes (as workers_of)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if (
                marker in cmd
                and "train.py" in cmd
                and "torch.distributed.run" not in cmd
                and "gpufleet_check.pyz" not in cmd
            ):
                pids.append(int(entry.name))
    return pids


def test_train_subcommand_says_why_the_payload_failed(cpu_host: dict[str, Any], tmp_path: Path) -> None:
    """Issue 16, item 10: the ranks' own error is the cause, first, not torchrun's "To enable traceback see"."""
    broken = tmp_path / "state.pt"
    broken.write_bytes(b"")
    proc = run(
        cpu_host, "train", "--nproc-per-node", "2", "--", "--steps", "8", "--checkpoint", str(broken), "--resume"
    )
    out = json.loads(proc.stdout)
    assert proc.returncode != 0 and out["rc"] != 0 and out["result"] is None, explain(proc)
    cause = f"--checkpoint {broken}: cannot be loaded ("
    root = out["failures"][0]  # the first rank to fail; torchrun then stops the other (SIGTERM) or it fails alike
    assert root["exitcode"] == 2 and root["cause"].startswith(cause), out["failures"]
    assert out["failed_ranks"][0].startswith(f"rank {root['rank']} on ")
    assert f"exited with code 2: {cause}" in out["failed_ranks"][0], out["failed_ranks"]
    first = out["log_tail"].splitlines()[0]
    assert " ERROR " in first and cause in first, out["log_tail"]
    assert "ChildFailedError" not in out["log_tail"]
