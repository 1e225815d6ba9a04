"""End-to-end fixtures: playbooks run through ansible-runner against the lab
(`make lab` builds it), and results are read from ansible-runner's per-host
events, never from console text."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LAB_INVENTORY = REPO / "tests" / "lab" / "inventory"
NODE_IMAGE = "localhost/gpufleet-node:current"
LIGHT_IMAGE = "localhost/gpufleet-node-light"
LAB_NETWORK = "gpufleet-lab"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: the slow tier (make test-slow, docs/testing.md); make test deselects it")


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], check=check, capture_output=True, text=True)


@dataclass
class PlaybookRun:
    """What one ansible-playbook run did, per host, from runner events."""

    status: str
    rc: int
    stats: dict
    events: list = field(repr=False)

    def hosts(self, key: str) -> dict:
        return self.stats.get(key, {}) or {}

    def changed(self) -> dict:
        return self.hosts("changed")

    def failed_hosts(self) -> set:
        return set(self.hosts("failures")) | set(self.hosts("dark"))

    def failures(self) -> dict:
        """host -> the msg of each failed task result (not ignored)."""
        out: dict = {}
        for ev in self.events:
            if ev.get("event") in ("runner_on_failed", "runner_on_unreachable"):
                data = ev["event_data"]
                if data.get("ignore_errors"):
                    continue
                out.setdefault(data["host"], []).append(str(data.get("res", {}).get("msg", "")))
        return out

    def changed_tasks(self) -> dict:
        """host -> names of the tasks that reported a change."""
        out: dict = {}
        for ev in self.events:
            data = ev.get("event_data", {})
            if ev.get("event") == "runner_on_ok" and data.get("res", {}).get("changed"):
                out.setdefault(data["host"], []).append(data.get("task"))
        return out

    def results(self, task: str) -> dict:
        """host -> result of the named task (the last one, when it ran twice)."""
        out = {}
        for ev in self.events:
            data = ev.get("event_data", {})
            if ev.get("event") == "runner_on_ok" and data.get("task") == task:
                out[data["host"]] = data.get("res", {})
        return out


# ansible-runner starts the ansible-playbook it finds on PATH: the one of
# this interpreter's environment (the venv) comes first, also when a script
# is run as `.venv/bin/python tools/bench/provisioning.py` without the venv
# on PATH (it would otherwise fail as if the playbook had failed).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def run_playbook(
    tmp_path: Path,
    playbook: str,
    inventory: Path,
    extravars: dict | None = None,
    limit: str | None = None,
    cmdline: str | None = None,
    on_event=None,
    envvars: dict | None = None,
) -> PlaybookRun:
    """Runs a playbook through ansible-runner; ``on_event`` sees every event as it comes (what it returns
    does not matter: ansible-runner would drop an event, and the stats with it, when its handler returns
    a false value, so the wrapper always keeps it);
    ``envvars`` adds to the environment (ANSIBLE_LOG_PATH, ...)."""
    env = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(REPO / "tests" / "lab" / "files" / "containers.conf")),
        # Runs of different tests must not share cached facts.
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
        **(envvars or {}),
    }
    private = tmp_path / f"runner-{uuid.uuid4().hex[:8]}"
    private.mkdir(parents=True)
    runner = ansible_runner.run(
        private_data_dir=str(private),
        project_dir=str(REPO),
        playbook=str(REPO / playbook),
        inventory=str(inventory),
        extravars=extravars or {},
        limit=limit,
        cmdline=cmdline,
        envvars=env,
        quiet=True,
        event_handler=(lambda event: on_event(event) or True) if on_event else None,
    )
    return PlaybookRun(status=runner.status, rc=runner.rc, stats=runner.stats or {}, events=list(runner.events))


def lab_vars() -> dict:
    """What tests/lab/lab.yml wrote into the lab inventory (mirror URL, versions)."""
    return yaml.safe_load((LAB_INVENTORY / "group_vars" / "all" / "generated.yml").read_text())


def address_of(name: str) -> str:
    """The lab address of a lab host or of an extra node."""
    if name in EXTRA_NODE_NUMBERS:
        return f"{lab_vars()['lab_address_prefix']}{EXTRA_NODE_NUMBERS[name]}"
    groups = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())["all"]["children"]
    return next(
        g["hosts"][name]["ansible_host"]
        for g in groups.values()
        if name in (g.get("hosts") or {}) and (g["hosts"][name] or {}).get("ansible_host")
    )


def ssh_control_path(address: str) -> Path:
    """The control socket of Ansible's ssh connection master to a lab address as root (the ssh connection
    plugin's _create_control_path: sha1 of host-port-user, port unset, in control_path_dir ~/.ansible/cp)."""
    return Path.home() / ".ansible" / "cp" / hashlib.sha1(f"{address}-None-root".encode()).hexdigest()[:10]


def forget_ssh_master(address: str) -> None:
    """Ends Ansible's ControlPersist master for a lab address (ansible.cfg:
    ControlMaster=auto). A node that was removed or killed leaves its master
    holding a dead TCP connection, which would swallow the next run's
    sessions; a real reboot goes through the reboot module, which resets it."""
    socket = ssh_control_path(address)
    if socket.exists():
        subprocess.run(
            ["ssh", "-S", str(socket), "-O", "exit", "lab-node"], capture_output=True, timeout=30, check=False
        )  # the master may be gone already
        socket.unlink(missing_ok=True)


def restart_node(name: str) -> None:
    """Reboots a lab node: the container restarts and systemd boots again."""
    podman("restart", "--time", "20", name)
    forget_ssh_master(address_of(name))
    wait_for_boot(name)


@pytest.fixture(scope="session")
def lab_hosts() -> list:
    hosts_file = LAB_INVENTORY / "hosts.yml"
    if not hosts_file.exists():
        pytest.fail("the lab is not built: run `make lab` first")
    data = yaml.safe_load(hosts_file.read_text())
    return sorted(data["all"]["children"]["gpu_nodes"]["hosts"])


@dataclass
class FreshNode:
    """A never-provisioned lab node with its own inventory."""

    name: str
    inventory: Path

    def exec(self, cmd: str) -> str:
        return podman("exec", self.name, "sh", "-c", cmd).stdout

    def state(self) -> str:
        """A fingerprint of everything gpufleet could change on the node."""
        return self.exec(
            "md5sum /var/lib/dpkg/status; apt-mark showhold;"
            " ls -la /etc/apt/sources.list.d /etc/apt/preferences.d /etc/apt/keyrings /etc/modprobe.d 2>&1;"
            " ls /etc/ansible/facts.d 2>&1 || true"
        )


# A lone node has no cluster services (they need the head node). Host
# variables: group_vars/all of the lab inventory (which switches the services
# on) outranks an inventory file's group variables, not its host variables.
LONE_NODE_VARS = {"gpufleet_slurm": False, "gpufleet_monitoring": False}


# Light nodes (tests/lab/files/Containerfile.light): the scale test's and the
# scale benchmark's, gpufleet-scale-1 ... gpufleet-scale-110.
LIGHT_NODE_PREFIX = "gpufleet-scale"
LIGHT_NODE_FIRST_NUMBER = 130
LIGHT_NODE_MAX = 110
# Fixed lab addresses of the extra nodes (lab_address_prefix + number), so
# that a restarted node keeps its address as a server does: .100-.239
# (tests/lab/vars/lab.yml), the light nodes at .130-.239.
EXTRA_NODE_NUMBERS = {
    "gpufleet-e2e-fresh": 100,
    "gpufleet-e2e-noble": 101,
    "gpufleet-e2e-fault": 102,
    "gpufleet-e2e-small-disk": 103,
    "gpufleet-e2e-branch": 104,
    **{f"gpufleet-bench-{i}": 110 + i for i in range(1, 10)},
    **{f"{LIGHT_NODE_PREFIX}-{i}": LIGHT_NODE_FIRST_NUMBER - 1 + i for i in range(1, LIGHT_NODE_MAX + 1)},
}


def start_lab_nodes(
    names: list,
    label: str,
    extra_args: tuple = (),
    image: str = NODE_IMAGE,
    host_vars: dict | None = None,
    ccache: bool = True,
) -> dict:
    """Never-provisioned nodes from the lab's node image (or another image)
    on their fixed addresses, booted and answering SSH; returns name -> host
    variables (LONE_NODE_VARS, then host_vars)."""
    prefix = lab_vars()["lab_address_prefix"]
    volume = ("-v", lab_vars()["lab_ccache_volume"]) if ccache else ()
    hosts = {}
    for name in names:
        address = f"{prefix}{EXTRA_NODE_NUMBERS[name]}"
        podman("rm", "-f", name, check=False)
        forget_ssh_master(address)
        mac = "02:00:" + ":".join(f"{int(octet):02x}" for octet in address.split("."))  # fixed, as lab.yml's
        podman(
            "run",
            "-d",
            "--name",
            name,
            "--hostname",
            name,
            "--network",
            LAB_NETWORK,
            "--ip",
            address,
            "--mac-address",
            mac,
            "--systemd=always",
            "--label",
            f"gpufleet.lab={label}",
            *volume,
            *extra_args,
            image,
            "/sbin/init",
        )
        hosts[name] = {"ansible_host": address, **LONE_NODE_VARS, **(host_vars or {})}
    for name in names:
        wait_for_boot(name)
    return hosts


BOOT_TIMEOUT_S = 180


def wait_for_boot(name: str) -> None:
    """Waits until systemd in a lab container has booted (running, or degraded: some unit failed); one that
    is still starting after BOOT_TIMEOUT_S is an error that names it, instead of a wait without end. Right
    after `podman run` systemctl may not reach systemd yet (no answer at all): asked again until it does."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        left = max(1, int(deadline - time.monotonic()))
        state = podman(
            "exec", name, "timeout", str(left), "systemctl", "is-system-running", "--wait", check=False
        ).stdout.strip()
        if state not in ("initializing", "starting", ""):
            return
        time.sleep(0.5)
    if state in ("initializing", "starting", ""):
        journal = podman("exec", name, "journalctl", "-b", "--no-pager", "-n", "5", check=False).stdout.strip()
        raise RuntimeError(
            f"{name} did not finish booting in {BOOT_TIMEOUT_S} s ({state or 'no answer'}); "
            f"too many lab containers for fs.inotify.max_user_instances (make lab raises it)? "
            f"Its journal ends:\n{journal}"
        )


def remove_lab_nodes(names: list) -> None:
    """Removes extra nodes (stopped or not) and forgets their SSH masters."""
    if names:
        podman("rm", "-f", "--time", "0", *names, check=False)
    for name in names:
        if name in EXTRA_NODE_NUMBERS:
            forget_ssh_master(f"{lab_vars()['lab_address_prefix']}{EXTRA_NODE_NUMBERS[name]}")


# A light node has no torch: the two checks that import it are left out
# (reported as skipped "by request"); driver_version is what passes there.
LIGHT_NODE_VARS = {"gpu_verify_skip_checks": ["torch_cuda", "libraries"]}


def this_lab_serves() -> None:
    """Stops when the lab's running mirror serves another clone's .lab (its archive key and packages are that
    clone's: nodes built from this clone would not trust it), or none runs: `make lab` here first."""
    container = yaml.safe_load((REPO / "tests" / "lab" / "vars" / "lab.yml").read_text())["lab_mirror_container"]
    served = podman(
        "inspect",
        container,
        "--format",
        '{{range .Mounts}}{{if eq .Destination "/srv/mirror"}}{{.Source}}{{end}}{{end}}',
        check=False,
    )
    mine = (REPO / ".lab" / "mirror").resolve()
    if served.returncode != 0:
        raise RuntimeError(f"the lab's mirror ({container}) is not there: run `make lab` in {REPO}")
    if Path(served.stdout.strip()).resolve() != mine:
        raise RuntimeError(
            f"the lab's mirror ({container}) serves {served.stdout.strip() or 'nothing'}, another clone's"
            f" lab, not {mine}: run `make lab` in {REPO}"
        )


def light_image() -> str:
    """The light node image for the lab's current node image, built when it is missing
    (tests/lab/files/Containerfile.light, with the lab driver's libnvidia-ml1 package from the mirror)."""
    this_lab_serves()
    generated = lab_vars()
    node_image = generated["lab_node_image"]
    upgrade = str(generated.get("lab_upgrade_driver_version", ""))
    pool = REPO / ".lab" / "mirror" / "debian" / "pool"
    debs = [p for p in pool.rglob("libnvidia-ml1_*_amd64.deb") if not p.name.startswith(f"libnvidia-ml1_{upgrade}-")]
    if len(debs) != 1:
        raise RuntimeError(
            f"the lab mirror ({pool}) should hold one libnvidia-ml1 of the lab's driver besides the "
            f"upgrade's ({upgrade}): found {sorted(p.name for p in debs)}; run `make lab`"
        )
    containerfile = REPO / "tests" / "lab" / "files" / "Containerfile.light"
    digest = hashlib.sha1(f"{node_image}\n{debs[0].name}\n".encode() + containerfile.read_bytes()).hexdigest()[:12]
    image = f"{LIGHT_IMAGE}:{digest}"
    if podman("image", "exists", image, check=False).returncode != 0:
        with tempfile.TemporaryDirectory(prefix="gpufleet-light-") as context:
            shutil.copyfile(containerfile, Path(context) / "Containerfile")
            shutil.copyfile(debs[0], Path(context) / "libnvidia-ml1.deb")
            build = podman(
                "build",
                "--format",
                "docker",
                "--build-arg",
                f"NODE_IMAGE={node_image}",
                "--tag",
                image,
                context,
                check=False,
            )
            if build.returncode != 0:
                raise RuntimeError(f"building {image} failed: {(build.stdout + build.stderr).strip()[-2000:]}")
    return image


def start_light_nodes(count: int, label: str, host_vars: dict | None = None) -> dict:
    """gpufleet-scale-1 ... -<count>: light nodes, booted, answering SSH; name -> host variables."""
    if not 1 <= count <= LIGHT_NODE_MAX:
        raise ValueError(f"1 to {LIGHT_NODE_MAX} light nodes (their fixed addresses), not {count}")
    names = [f"{LIGHT_NODE_PREFIX}-{i}" for i in range(1, count + 1)]
    return start_lab_nodes(
        names, label, image=light_image(), ccache=False, host_vars={**LIGHT_NODE_VARS, **(host_vars or {})}
    )


def lone_inventory(directory: Path, hosts: dict) -> Path:
    """An inventory of extra nodes: the lab's group_vars and connection settings."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "group_vars").exists():
        (directory / "group_vars").symlink_to(LAB_INVENTORY / "group_vars")
    connection = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())["all"]["vars"]
    (directory / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts, "vars": connection}}}})
    )
    return directory


def make_fresh_node(tmp_path_factory, name: str, extra_args: tuple = ()) -> FreshNode:
    hosts = start_lab_nodes([name], "e2e", extra_args)
    return FreshNode(name=name, inventory=lone_inventory(tmp_path_factory.mktemp(f"inv-{name}"), hosts))


@pytest.fixture(scope="module")
def fresh_node(tmp_path_factory, lab_hosts):
    node = make_fresh_node(tmp_path_factory, "gpufleet-e2e-fresh")
    yield node
    podman("rm", "-f", node.name, check=False)
