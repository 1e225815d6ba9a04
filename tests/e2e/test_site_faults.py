"""Faults on the lab, each ending with a clear message and nothing lost.

Install faults, in this order on one never-provisioned node (gpufleet-e2e-fault),
each run of playbooks/provision.yml starting where the last one left it:

1. the mirror stops while the driver's packages download: the download is
   retried, then the play names the mirror; dpkg is untouched;
2. dpkg is killed while it unpacks: the run fails; the next run finishes the
   interrupted dpkg run (dpkg --configure -a, apt-get install -f) and goes on;
3. that run's node is killed (podman kill) while dpkg unpacks the CUDA
   toolkit: the node is named unreachable; after it boots again, a re-run
   completes the node (the interrupted dpkg run finished again).

Then, on the lab's converged nodes, a rank killed mid-smoke: the play fails
within a bounded time, names the rank and node, and leaves no process behind;
a node whose software file system is too small stops in preflight,
before any change; and a wheel swapped on the mirror is refused by the
lab's hash-checked install path.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import LAB_INVENTORY, address_of, forget_ssh_master, lab_vars, make_fresh_node, podman, run_playbook

MIRROR = "gpufleet-mirror"
DRIVER_DOWNLOAD_TASK = "Install the kernel headers and build tools"
DRIVER_PACKAGES_TASK = "Install the NVIDIA driver packages"
CUDA_INSTALL_TASK = "Install the CUDA toolkit"
RECOVERY_TASK = "Finish the interrupted dpkg run (dpkg --configure -a)"
SMOKE_TASK = "Run the smoke training on every node at once (torchrun)"
# What one install-fault test leaves for the next (they run in file order).
STATE: dict = {}


def dpkg_state(node) -> tuple[str, str]:
    """(pending journal entries, dpkg --audit): both empty when no dpkg run was interrupted."""
    return (
        node.exec("ls /var/lib/dpkg/updates | grep -E '^[0-9]+$' || true").strip(),
        node.exec("dpkg --audit || true").strip(),
    )


def package_status(node, package: str) -> str:
    return node.exec(f"dpkg-query -W -f='${{db:Status-Abbrev}}' {package} 2>/dev/null || true").strip()


class OnTaskStart:
    """An ansible-runner event handler that calls ``action`` (in a thread) once,
    when the named task starts on ``host``."""

    def __init__(self, task: str, host: str, action):
        self.task, self.host, self.action = task, host, action
        self.thread: threading.Thread | None = None

    def __call__(self, event: dict) -> bool:
        data = event.get("event_data", {})
        if (
            self.thread is None
            and event.get("event") == "runner_on_start"
            and data.get("task") == self.task
            and data.get("host") == self.host
        ):
            self.thread = threading.Thread(target=self.action, daemon=True)
            self.thread.start()
        return True

    def join(self) -> None:
        assert self.thread is not None, f"task {self.task!r} never started on {self.host}"
        self.thread.join(timeout=300)


def when_dpkg_unpacks(node_name: str, then, limit_s: float = 240.0) -> dict:
    """Polls the node for a `dpkg --unpack`, then calls ``then(pid)``; what happened, for the test."""
    seen: dict = {}
    deadline = time.monotonic() + limit_s
    probe = (
        "for p in $(pgrep -x dpkg); do tr '\\0' ' ' < /proc/$p/cmdline | grep -q -- --unpack && echo $p && break; done"
    )
    while time.monotonic() < deadline:
        pid = podman("exec", node_name, "sh", "-c", probe, check=False).stdout.strip()
        if pid:
            seen["pid"] = pid
            then(pid)
            return seen
        time.sleep(0.1)
    return seen


@pytest.fixture(scope="module")
def fault_node(tmp_path_factory, lab_hosts):
    node = make_fresh_node(tmp_path_factory, "gpufleet-e2e-fault")
    yield node
    podman("exec", MIRROR, "systemctl", "start", "nginx", check=False)
    podman("rm", "-f", node.name, check=False)


@pytest.mark.slow
def test_mirror_stopping_mid_install_is_retried_then_named(tmp_path, fault_node):
    stop_mirror = OnTaskStart(
        DRIVER_DOWNLOAD_TASK, fault_node.name, lambda: podman("exec", MIRROR, "systemctl", "stop", "nginx")
    )
    start = time.monotonic()
    try:
        run = run_playbook(tmp_path, "playbooks/provision.yml", fault_node.inventory, on_event=stop_mirror)
    finally:
        podman("exec", MIRROR, "systemctl", "start", "nginx")
    seconds = time.monotonic() - start
    assert stop_mirror.thread is not None, f"the run ended before the download: {run.failures()}"
    stop_mirror.join()
    assert run.status == "failed"
    messages = " ".join(run.failures().get(fault_node.name, []))
    assert f"{fault_node.name}: the package source http://gpufleet-mirror did not answer" in messages, messages
    attempts = re.search(rf'\("{re.escape(DRIVER_DOWNLOAD_TASK)}", (\d+) attempts\)', messages)
    assert attempts and int(attempts.group(1)) >= 3, messages
    assert "run gpufleet again once it answers" in messages
    # Downloads come before dpkg: nothing is half-installed, no driver package is there.
    assert dpkg_state(fault_node) == ("", "")
    assert package_status(fault_node, "nvidia-kernel-dkms") == ""
    assert seconds < 600


@pytest.mark.slow
def test_interrupted_dpkg_is_finished_by_the_next_run(tmp_path, fault_node):
    def kill_dpkg():
        STATE["dpkg"] = when_dpkg_unpacks(
            fault_node.name, lambda pid: podman("exec", fault_node.name, "kill", "-9", pid)
        )

    killer = OnTaskStart(DRIVER_DOWNLOAD_TASK, fault_node.name, kill_dpkg)
    run = run_playbook(tmp_path, "playbooks/provision.yml", fault_node.inventory, on_event=killer)
    assert killer.thread is not None, f"the run ended before the download: {run.failures()}"
    killer.join()
    assert STATE["dpkg"].get("pid"), "dpkg never unpacked"
    assert run.status == "failed"
    assert "dpkg" in " ".join(run.failures().get(fault_node.name, []))
    journal, audit = dpkg_state(fault_node)
    assert journal or audit, "the killed dpkg left no trace"
    assert "dpkg was interrupted" in fault_node.exec("apt-get install -y procps 2>&1 || true")

    # The next run finishes dpkg's run first, then installs the driver; the
    # node is killed later in that run (the next test).
    def kill_node_when_cuda_unpacks():
        STATE["node_kill"] = when_dpkg_unpacks(
            fault_node.name, lambda pid: podman("kill", "--signal", "KILL", fault_node.name)
        )

    kill_node = OnTaskStart(CUDA_INSTALL_TASK, fault_node.name, kill_node_when_cuda_unpacks)
    STATE["rerun"] = rerun = run_playbook(tmp_path, "playbooks/provision.yml", fault_node.inventory, on_event=kill_node)
    assert kill_node.thread is not None, f"the run ended before the toolkit's install: {rerun.failures()}"
    kill_node.join()
    assert RECOVERY_TASK in rerun.changed_tasks().get(fault_node.name, []), rerun.failures()
    assert DRIVER_PACKAGES_TASK in rerun.changed_tasks().get(fault_node.name, [])


@pytest.mark.slow
def test_node_killed_mid_converge_is_completed_by_a_rerun(tmp_path, fault_node):
    rerun = STATE.get("rerun")
    assert rerun is not None, "the previous test did not get that far"
    assert STATE.get("node_kill", {}).get("pid"), "the node was not killed while dpkg unpacked the toolkit"
    assert rerun.status == "failed"
    assert fault_node.name in rerun.hosts("dark"), rerun.stats
    assert podman("inspect", "--format", "{{.State.Running}}", fault_node.name).stdout.strip() == "false"

    podman("start", fault_node.name)
    forget_ssh_master(address_of(fault_node.name))
    podman("exec", fault_node.name, "systemctl", "is-system-running", "--wait", check=False)
    # The driver installed before the crash is still there, held.
    assert package_status(fault_node, "nvidia-kernel-dkms") == "hi"
    final = run_playbook(tmp_path, "playbooks/provision.yml", fault_node.inventory)
    assert final.status == "successful", final.failures()
    assert RECOVERY_TASK in final.changed_tasks().get(fault_node.name, [])
    assert dpkg_state(fault_node) == ("", "")
    for package in ("nvidia-kernel-dkms", "cuda-toolkit-12-1", "libcudnn8", "libnccl2"):
        assert package_status(fault_node, package) == "hi", package  # installed and held
    torch = fault_node.exec("/opt/gpufleet/venv/bin/python -c 'import torch; print(torch.__version__)'").strip()
    assert torch == "2.3.1+cu121"


@pytest.mark.slow
def test_rank_killed_mid_smoke_fails_in_bounded_time_naming_it(tmp_path, lab_hosts):
    victim = lab_hosts[1]
    worker = (
        "for p in $(pgrep -f '[p]ayload/train.py'); do tr '\\0' ' ' < /proc/$p/cmdline | grep -q torchrun"
        " || { grep -qz '^LOCAL_RANK=1$' /proc/$p/environ && echo $p; }; done"
    )

    def kill_a_rank():
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            pid = podman("exec", victim, "sh", "-c", worker, check=False).stdout.strip()
            if pid:
                time.sleep(3)  # past the rendezvous: training steps are running
                podman("exec", victim, "kill", "-9", pid.split()[0])
                return
            time.sleep(0.2)

    killer = OnTaskStart(SMOKE_TASK, lab_hosts[0], kill_a_rank)
    start = time.monotonic()
    run = run_playbook(
        tmp_path,
        "playbooks/smoke.yml",
        LAB_INVENTORY,
        on_event=killer,
        extravars={
            "smoke_training_timeout": 120,
            "smoke_training_steps": 400,
            "smoke_training_report_dir": str(tmp_path / "smoke"),
        },
    )
    seconds = time.monotonic() - start
    killer.join()
    assert run.status == "failed"
    assert seconds < 120 + 90
    messages = " ".join(sum(run.failures().values(), []))
    assert re.search(rf"rank \d+ on {victim}(\.\S+)? was killed by signal 9 \(SIGKILL\)", messages), messages
    for host in lab_hosts:
        left = podman("exec", host, "sh", "-c", "pgrep -af '[t]rain.py|[t]orchrun' || true").stdout.strip()
        assert left == "", f"{host}: {left}"


def test_too_small_a_file_system_stops_in_preflight(tmp_path, tmp_path_factory, lab_hosts):
    """/opt is a 64 MB file system on this node, and the operator points preflight at it
    (preflight_disk_path): preflight measures it and stops before anything changes."""
    node = make_fresh_node(
        tmp_path_factory,
        "gpufleet-e2e-small-disk",
        extra_args=("--mount", "type=tmpfs,destination=/opt,tmpfs-size=64m"),
    )
    try:
        before = node.state()
        run = run_playbook(tmp_path, "site.yml", node.inventory, extravars={"preflight_disk_path": "/opt"})
        assert run.status == "failed"
        messages = " ".join(run.failures().get(node.name, []))
        assert f"gpufleet preflight failed on {node.name}" in messages
        assert "GB free under /opt, 20 GB needed (preflight_min_free_disk_gb)" in messages, messages
        assert run.changed_tasks() == {}
        assert node.state() == before
    finally:
        podman("rm", "-f", node.name, check=False)


def test_a_wheel_swapped_on_the_mirror_is_refused(lab_hosts):
    """The lab installs PyPI's cu121 torch hash-checked (pytorch_hashes_file): the lock pins torch and every
    nvidia-*-cu12 wheel it needs; against the lock with one wheel's hash changed, as when that wheel on the
    mirror was swapped, pip refuses before installing. The wheel tried is the lock's nvidia-nvtx-cu12 (a
    real wheel of the set, small enough to fetch twice)."""
    lock = Path(lab_vars()["lab_wheelhouse_lock"]).read_text()
    assert re.search(r"^torch==2\.3\.1 --hash=sha256:[0-9a-f]{64}$", lock, re.M), lock
    for pin in (
        "nvidia-cuda-runtime-cu12==12.1.105",
        "nvidia-cudnn-cu12==8.9.2.26",
        "nvidia-nccl-cu12==2.20.5",
        "triton==2.3.1",
    ):
        assert re.search(rf"^{re.escape(pin)} --hash=sha256:[0-9a-f]{{64}}$", lock, re.M), pin
    line = next(entry for entry in lock.splitlines() if entry.startswith("nvidia-nvtx-cu12=="))
    swapped = re.sub(r"(--hash=sha256:)([0-9a-f])", lambda m: m[1] + ("0" if m[2] != "0" else "1"), line, count=1)
    pip = [
        "/opt/gpufleet/venv/bin/python",
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--no-deps",
        "--no-cache-dir",
        "--require-hashes",
        "--no-index",
        "--find-links",
        "http://gpufleet-mirror/wheels/",
        "--trusted-host",
        "gpufleet-mirror",
        "-r",
        "/dev/stdin",
    ]
    for text, refused in ((line, False), (swapped, True)):
        done = subprocess.run(
            ["podman", "exec", "-i", lab_hosts[0], *pip], input=text + "\n", capture_output=True, text=True, check=False
        )
        assert (done.returncode != 0) == refused, done.stdout[-2000:] + done.stderr[-2000:]
        if refused:
            assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in done.stderr
