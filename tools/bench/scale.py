#!/usr/bin/env python
"""gpufleet's scale benchmark: verify.yml and play 1 of provision.yml on 1 to 100 light lab nodes; figures, no asserts.

    make bench QUICK=1                       # this benchmark alone: the quick option of make bench (about 20 min)
    .venv/bin/python tools/bench/scale.py --sizes 1,10 --no-compare --no-failures
    .venv/bin/python tools/bench/scale.py --plays verify          # verify alone (minutes)

Needs the lab (`make lab`: its network, node image and mirror), not a
converged one. It starts the light nodes of tests/lab/files/Containerfile.light
(gpufleet-scale-1 ... -100: systemd, journald and sshd, the lab driver's
userspace library and nothing else) and runs, on the first N of them,

* playbooks/verify.yml (the GPU checks with the lab's settings, the two
  torch checks left out: a light node has no torch), and
* playbooks/check.yml, which is play 1 of provision.yml (plays 0 and 1: the
  settings, preflight, every download source tried on every node),

each as ``ansible-playbook`` from this clone with its ansible.cfg, with no SSH
connection left from an earlier run (as a scheduled run finds them). For each
run it measures the wall time; the controller's CPU seconds (ansible-playbook,
its workers, the ssh clients and the ssh connection masters); its peak memory
(the largest sum over those processes of their proportional set size, PSS,
which counts the pages the forked workers share once; RSS, which counts them
in every process, beside it); the nodes' CPU seconds (their cgroups) and
their share of the machine's busy CPU time; for verify, how long the fleet
report took to write (profile_tasks) and its size. Then the cost of each node
added beyond the first.

At the largest size it also runs both plays from the tree before the tuning
(a git worktree of ``BEFORE_COMMIT``; docs/scale.md says what changed) for a
before/after in the same run, and
verify with 3 nodes failing for two reasons (two with a forged driver/library
mismatch, one stopped), printing the report's lead.

With ``--rerun N`` (``--plays ''`` for it alone), the converged re-run of
site.yml on the lab's own nodes, N times from this tree and from the tree
before in turn: its controller CPU a node before and after (issue 30's goal:
half), its wall time and changed tasks. The lab must be converged by this
tree first (``make run``). Results also go to
reports/bench/scale-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from conftest import (  # noqa: E402 (tests/e2e is on sys.path from the line above)
    LAB_INVENTORY,
    LIGHT_NODE_MAX,
    lone_inventory,
    podman,
    remove_lab_nodes,
    ssh_control_path,
    start_light_nodes,
)

sys.path.insert(0, str(REPO / "tools" / "bench"))
import results as results_file  # noqa: E402 (tools/bench is on sys.path from the line above)

PLAYS = {"verify": "playbooks/verify.yml", "play 1": "playbooks/check.yml"}
# The converged re-run (--rerun): site.yml on the lab's own nodes, converged by `make run`.
RERUN = "rerun"
PLAYBOOKS = {**PLAYS, RERUN: "site.yml"}
# Targets of issue 17 (ratios from one run): verify on 100 nodes <= 10 x one node and on 10 <= 3 x; the
# controller's peak memory on 100 nodes <= 1.5 GB. Of issue 30: play 1 on 100 <= 10 x one node (issue 17's 15 x
# before), at most 12 tasks a host, at most 1.0 controller CPU s per added node.
TARGETS = {("verify", 100): 10.0, ("verify", 10): 3.0, ("play 1", 100): 10.0}
PEAK_TARGET_BYTES = 1.5e9
PLAY_1_TASKS_TARGET = 12
PLAY_1_CPU_PER_NODE_TARGET_S = 1.0
# The tree before the tuning (docs/scale.md says what changed and why): its plays, roles and ansible.cfg run
# from a git worktree of this commit for the before/after at the largest size (--before-commit).
BEFORE_COMMIT = "c8e74c8"
REPORT_TASK = "Write the fleet report (JSON, Markdown, JUnit XML)"
FORGED_MODULE = "535.230.02"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.5


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


# --------------------------------------------------------------------------- the controller's processes


def proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory_of(pid: int) -> tuple[int, int]:
    """(PSS, RSS) bytes of a process; (0, 0) when it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    values = dict(re.findall(r"^(Pss|Rss):\s+(\d+) kB", text, re.M))
    return int(values.get("Pss", 0)) * 1024, int(values.get("Rss", 0)) * 1024


# The control paths of Ansible's ssh connection masters to the benchmark's nodes (ansible.cfg's
# ControlMaster/ControlPersist; conftest.forget_ssh_master computes the same), set by run_benchmark.
CONTROL_PATHS: set[bytes] = set()


def control_path(address: str) -> bytes:
    return str(ssh_control_path(address)).encode()


def ssh_masters() -> list[int]:
    """The ssh connection masters to the benchmark's nodes (ControlPersist: daemons of their own, outside the
    run's process tree; a master's command line is "ssh: <control path> [mux]")."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ssh: ") and cmdline[5:].split(b" ")[0] in CONTROL_PATHS:
                pids.append(int(entry.name))
    return pids


def end_ssh_masters() -> None:
    """Ends the masters, so that a run starts without connections, as a scheduled run does."""
    for pid in ssh_masters():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while ssh_masters() and time.monotonic() < deadline:
        time.sleep(0.1)


def descendants(root: int) -> list[int]:
    """root and every process below it (/proc/<pid>/task/<tid>/children)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def process_class(pid: int, root: int, masters: set[int], comm: str) -> str:
    """What a controller process is, for the peak's breakdown: the ansible-playbook process itself, an ssh
    connection master, an ssh client (a task's connection through its master), a forked worker (Ansible's
    WorkerProcess: the same program as the root, so its comm is the root's), or another program by name."""
    if pid == root:
        return "ansible-playbook"
    if pid in masters:
        return "ssh masters"
    if comm == "ssh":
        return "ssh clients"
    if comm.startswith("ansible-playboo") or comm.startswith("python"):
        return "workers"
    return comm


def process_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Sampler(threading.Thread):
    """The peak, over time, of the summed PSS (and RSS) of a process tree and the ssh masters, with what made up
    the peak (process_class: PSS and the number of processes of each kind at the sample of the peak)."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root, self.stop_event = root, threading.Event()
        self.peak_pss = self.peak_rss = 0
        self.peak_breakdown: dict[str, dict[str, int]] = {}

    def run(self) -> None:
        while not self.stop_event.is_set():
            masters = set(ssh_masters())
            pss = rss = 0
            breakdown: dict[str, dict[str, int]] = {}
            for pid in set(descendants(self.root)) | masters:
                p, r = memory_of(pid)
                pss, rss = pss + p, rss + r
                kind = breakdown.setdefault(
                    process_class(pid, self.root, masters, process_comm(pid)), {"processes": 0, "pss_bytes": 0}
                )
                kind["processes"] += 1
                kind["pss_bytes"] += p
            if pss > self.peak_pss:
                self.peak_breakdown = breakdown
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
            self.stop_event.wait(SAMPLE_S)


def describe_breakdown(breakdown: dict[str, dict[str, int]]) -> str:
    """'workers 512 MiB (25), ssh masters 173 MiB (100), ...': the largest first."""
    kinds = sorted(breakdown.items(), key=lambda item: -item[1]["pss_bytes"])
    return ", ".join(f"{name} {kind['pss_bytes'] / 2**20:.0f} MiB ({kind['processes']})" for name, kind in kinds)


# --------------------------------------------------------------------------- the machine and the nodes


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS


def cgroup_cpu_file(container: str) -> Path | None:
    path = podman("inspect", "--format", "{{.State.CgroupPath}}", container, check=False).stdout.strip()
    for candidate in (
        Path("/sys/fs/cgroup/cpuacct") / path.lstrip("/") / "cpuacct.usage",  # cgroup v1
        Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.stat",
    ):  # cgroup v2
        if path and candidate.exists():
            return candidate
    return None


def cgroup_cpu_s(path: Path | None) -> float:
    if path is None:
        return 0.0
    try:
        text = path.read_text()
    except OSError:
        return 0.0
    if path.name == "cpuacct.usage":
        return int(text) / 1e9
    return int(re.search(r"^usage_usec (\d+)", text, re.M).group(1)) / 1e6


def node_memory_bytes(names: list[str]) -> list[int]:
    """Each node's memory use as podman stats gives it (its cgroup, less the page cache)."""
    out = podman("stats", "--no-stream", "--format", "json", *names).stdout
    return [parse_size(entry["mem_usage"].split("/")[0]) for entry in json.loads(out)]


def parse_size(text: str) -> int:
    """'6.828MB' -> 6828000 (podman's decimal units)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([kKMGT]?i?B)\s*", text)
    if not match:
        raise ValueError(f"not a size: {text!r}")
    units = {
        "B": 1,
        "kB": 1e3,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
        "TB": 1e12,
        "KiB": 2**10,
        "kiB": 2**10,
        "MiB": 2**20,
        "GiB": 2**30,
        "TiB": 2**40,
    }
    return int(float(match.group(1)) * units[match.group(2)])


# --------------------------------------------------------------------------- one measured run


def task_seconds(output: str, task: str) -> float | None:
    """A task's time from profile_tasks' closing list ("<role> : <task> ---- 0.52s")."""
    found = re.findall(rf"^(?:\S+ : )?{re.escape(task)} -+ (\d+(?:\.\d+)?)s\s*$", output, re.M)
    return float(found[-1]) if found else None


_RESULT_LINE = re.compile(r"^(?:ok|changed|skipping|fatal|failed): \[([^\]]+)\]", re.M)
_INCLUDED_LINE = re.compile(r"^included: \S+ for (.+?)(?: => .*)?$", re.M)


def task_counts(output: str) -> dict[str, int]:
    """Each host's task results in a run's output (ok, changed, skipping, failed; an include counts for each host it
    names): the tasks a host costs the controller, each a forked worker."""
    counts: dict[str, int] = {}
    for host in _RESULT_LINE.findall(output):
        counts[host] = counts.get(host, 0) + 1
    for names in _INCLUDED_LINE.findall(output):
        for host in names.split(", "):
            counts[host.strip()] = counts.get(host.strip(), 0) + 1
    return counts


def tasks_per_host(output: str) -> int:
    """The most task results one host had: the play's first host, which also runs the once-per-run tasks."""
    return max(task_counts(output).values(), default=0)


def tasks_per_typical_host(output: str) -> int:
    """The median host's task results: what each host added to the play costs (the once-per-run tasks run on the
    first host only)."""
    counts = sorted(task_counts(output).values())
    return counts[(len(counts) - 1) // 2] if counts else 0


def changed_tasks(output: str) -> int:
    """The changed tasks of all hosts (PLAY RECAP's changed=N): a converged re-run changes nothing."""
    return sum(int(n) for n in re.findall(r"^\S+\s+:\s.*\bchanged=(\d+)", output, re.M))


def measure(
    play: str, inventory: Path, workdir: Path, cgroups: dict, env: dict | None = None, repo: Path = REPO
) -> dict:
    """One ansible-playbook run of a play on an inventory, measured; repo: the tree whose plays, roles and
    ansible.cfg run (a worktree of BEFORE_COMMIT for the before/after)."""
    end_ssh_masters()
    reports = workdir / "reports"
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(inventory),
        PLAYBOOKS[play],
        "-e",
        json.dumps({"gpu_verify_report_dir": str(reports)}),
    ]
    environment = {
        **os.environ,
        "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(workdir / "facts"),
        "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
        **(env or {}),
    }
    nodes_before = {name: cgroup_cpu_s(path) for name, path in cgroups.items()}
    busy_before, children_before = machine_busy_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=repo, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(proc.pid)
    sampler.start()
    output = proc.communicate()[0]
    wall = time.monotonic() - start
    sampler.stop_event.set()
    sampler.join()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    masters = [proc_stat(pid) for pid in ssh_masters()]
    controller_cpu = (
        children.ru_utime
        - children_before.ru_utime
        + children.ru_stime
        - children_before.ru_stime
        + sum(cpu for _ppid, cpu in filter(None, masters))
    )
    busy = machine_busy_s() - busy_before
    nodes_cpu = sum(cgroup_cpu_s(path) - nodes_before[name] for name, path in cgroups.items())
    end_ssh_masters()
    (workdir / f"{play.replace(' ', '-')}.log").write_text(output)
    result = {
        "play": play,
        "nodes": len(cgroups),
        "rc": proc.returncode,
        "wall_s": round(wall, 2),
        "controller_cpu_s": round(controller_cpu, 2),
        "controller_peak_pss_bytes": sampler.peak_pss,
        "controller_peak_rss_bytes": sampler.peak_rss,
        "controller_peak_breakdown": sampler.peak_breakdown,
        "nodes_cpu_s": round(nodes_cpu, 2),
        "machine_busy_cpu_s": round(busy, 2),
        "env": env or {},
        "tasks_per_host": tasks_per_host(output),
        "tasks_per_typical_host": tasks_per_typical_host(output),
        "changed": changed_tasks(output),
    }
    if play == "verify":
        report = reports / "fleet-report.json"
        result["report_write_s"] = task_seconds(output, REPORT_TASK)
        result["report_bytes"] = {p.suffix: p.stat().st_size for p in reports.glob("fleet-report.*")}
        result["report_lead"] = lead_of(reports / "fleet-report.md")
        if report.exists():
            result["summary"] = json.loads(report.read_text())["summary"]
    if proc.returncode != 0:
        result["tail"] = output.strip().splitlines()[-15:]
    return result


def lead_of(markdown: Path) -> list[str]:
    """The verdict line and the grouped failures at the top of the Markdown report."""
    if not markdown.exists():
        return []
    lines = [line for line in markdown.read_text().splitlines() if line.strip()][1:]
    lead = lines[:1]
    for line in lines[1:]:
        if not line.startswith("- "):
            break  # the grouped failures end where the inventory line and the table begin
        lead.append(line)
    return lead


# --------------------------------------------------------------------------- the benchmark


def inventory_of(hosts: dict, names: list[str], workdir: Path) -> Path:
    return lone_inventory(workdir / f"inventory-{len(names)}", {name: hosts[name] for name in names})


def per_added_node(by_size: dict, key: str) -> float | None:
    """(value at the largest size - value at 1 node) / (nodes added)."""
    sizes = sorted(by_size)
    if len(sizes) < 2 or sizes[0] != 1:
        return None
    return (by_size[sizes[-1]][key] - by_size[1][key]) / (sizes[-1] - 1)


def run_benchmark(
    sizes: list[int], runs: int, compare: str, failures: bool, root: Path, plays: tuple[str, ...] = tuple(PLAYS)
) -> dict:
    count = max(sizes)
    log(f"starting {count} light nodes")
    start = time.monotonic()
    hosts = start_light_nodes(count, "bench")
    names = sorted(hosts, key=lambda n: int(n.rsplit("-", 1)[1]))
    CONTROL_PATHS.update(control_path(hosts[name]["ansible_host"]) for name in names)
    results: dict = {"start_nodes_s": round(time.monotonic() - start, 1)}
    try:
        memory = node_memory_bytes(names)
        results["node_memory_bytes"] = {"median": int(statistics.median(memory)), "max": max(memory)}
        cgroups = {name: cgroup_cpu_file(name) for name in names}
        log(
            f"{count} light nodes up in {results['start_nodes_s']} s, "
            f"{statistics.median(memory) / 2**20:.1f} MiB each (median)"
        )
        runs_out = []
        for size in sizes:
            inventory = inventory_of(hosts, names[:size], root)
            for play in plays:
                for _run in range(runs):
                    result = measure(
                        play,
                        inventory,
                        root / f"{play.replace(' ', '-')}-{size}",
                        {n: cgroups[n] for n in names[:size]},
                    )
                    result["variant"] = "tuned"
                    runs_out.append(result)
                    log(describe(result))
        if compare:
            inventory = inventory_of(hosts, names, root)
            with worktree(compare, root / "before") as before:
                for play in plays:
                    result = measure(play, inventory, root / f"before-{play.replace(' ', '-')}", cgroups, repo=before)
                    result.update(variant="before", commit=compare)
                    runs_out.append(result)
                    log(describe(result))
        results["node_memory_after_bytes"] = int(statistics.median(node_memory_bytes(names)))
        if failures and "verify" in plays:
            runs_out.append(failing_run(hosts, names, root, cgroups))
        results["runs"] = runs_out
    finally:
        remove_lab_nodes(names)
    return results


def lab_nodes() -> list[str]:
    """The lab's own nodes (its inventory; each a container of that name)."""
    groups = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())["all"]["children"]
    return sorted({name for group in groups.values() for name in group.get("hosts") or {}})


def run_rerun(runs: int, compare: str, root: Path) -> list[dict]:
    """The converged re-run of site.yml on the lab's own nodes, this tree and the tree before in turn (a pair a run,
    so that both see the machine alike); the lab must be converged (`make run`) by this tree."""
    names = lab_nodes()
    cgroups = {name: cgroup_cpu_file(name) for name in names}
    variants = [("tuned", REPO)]
    out = []
    with contextlib.ExitStack() as stack:
        if compare:
            variants.append(("before", stack.enter_context(worktree(compare, root / "before-rerun"))))
        for run in range(runs):
            for variant, repo in variants:
                result = measure(RERUN, LAB_INVENTORY, root / f"rerun-{variant}-{run}", cgroups, repo=repo)
                result.update(variant=variant, commit=compare if variant == "before" else "")
                out.append(result)
                log(describe(result) + f", {result['changed']} changed")
    return out


def report_rerun(runs: list[dict]) -> list[str]:
    """The converged re-run's controller CPU a node, before and after (medians of the runs, median_runs)."""
    lines, per_node = [], {}
    for variant in ("before", "tuned"):
        group = [r for r in runs if r["play"] == RERUN and r["variant"] == variant]
        if not group:
            continue
        nodes, figures = next(iter(median_runs(runs, RERUN, variant).items()))
        per_node[variant] = figures["controller_cpu_s"] / nodes
        label = f"before ({group[0]['commit']})" if variant == "before" else "this tree"
        failed = [r["rc"] for r in group if r["rc"] != 0]
        each = ", ".join(f"{r['controller_cpu_s']:.1f}" for r in group)
        lines.append(
            f"  {label}: {per_node[variant]:.2f} controller CPU s a node ({nodes} nodes; runs "
            f"{each} CPU s), {figures['wall_s']:.1f} s wall, "
            f"changed tasks {sorted({r['changed'] for r in group})}" + (f", FAILED rc {failed}" if failed else "")
        )
    if not lines:
        return []
    if len(per_node) == 2:
        ratio = per_node["tuned"] / per_node["before"]
        lines.append(f"  after / before: {ratio:.2f} (goal: 0.5 or less: {'met' if ratio <= 0.5 else 'NOT met'})")
    return ["", "converged re-run of site.yml on the lab's own nodes (the runs alternate, median shown):", *lines]


@contextlib.contextmanager
def worktree(commit: str, path: Path) -> Iterator[Path]:
    """A checkout of commit at path (git worktree) while the block runs, removed after it; linked as the collection
    gpufleet.fleet as `make venv` links a clone, so that its playbooks run its own roles and plugins."""
    subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], cwd=REPO, check=True, capture_output=True)
    try:
        link = path / ".ansible" / "collections" / "ansible_collections" / "gpufleet" / "fleet"
        link.parent.mkdir(parents=True)
        link.symlink_to("../../../..")
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, check=False)


def failing_run(hosts: dict, names: list[str], root: Path, cgroups: dict) -> dict:
    """verify with 3 nodes failing for two reasons: two forged mismatches, one stopped node."""
    count = len(names)
    mismatched, stopped = [names[count // 6], names[(2 * count) // 3]], names[count // 2]
    for name in mismatched:
        podman("exec", name, "sh", "-c", f"echo {FORGED_MODULE} > /run/gpufleet-lab/nvidia-module-version")
    podman("stop", "--time", "0", stopped)
    result = measure("verify", inventory_of(hosts, names, root), root / "failing", cgroups)
    result.update(variant="3 failing", mismatched=mismatched, stopped=stopped)
    log(describe(result))
    for line in result.get("report_lead", []):
        log(f"  {line}")
    return result


def describe(result: dict) -> str:
    return (
        f"{result['play']} on {result['nodes']} node(s) [{result['variant']}]: {result['wall_s']:.1f} s, "
        f"controller {result['controller_cpu_s']:.1f} CPU s, peak {result['controller_peak_pss_bytes'] / 2**20:.0f} MiB"
        f" PSS, nodes {result['nodes_cpu_s']:.1f} CPU s, rc {result['rc']}"
    )


def median_runs(runs: list[dict], play: str, variant: str = "tuned") -> dict:
    """size -> the median of each figure over the runs of that play, size and variant."""
    by_size: dict = {}
    for run in runs:
        if run["play"] == play and run["variant"] == variant:
            by_size.setdefault(run["nodes"], []).append(run)
    keys = (
        "wall_s",
        "controller_cpu_s",
        "controller_peak_pss_bytes",
        "controller_peak_rss_bytes",
        "nodes_cpu_s",
        "machine_busy_cpu_s",
    )
    return {
        size: {k: statistics.median(r[k] for r in group) for k in keys} | {"first": group[0]}
        for size, group in sorted(by_size.items())
    }


def report(results: dict) -> str:
    head = [f"Scale benchmark, {results['date']}, {results['machine']}"]
    if not results.get("runs"):
        return "\n".join(head + report_rerun(results.get("rerun_runs", [])))
    lines = head + [
        f"light nodes: {results['node_memory_bytes']['median'] / 2**20:.1f} MiB each at boot (median; max "
        f"{results['node_memory_bytes']['max'] / 2**20:.1f} MiB), {results['node_memory_after_bytes'] / 2**20:.1f}"
        f" MiB after the runs; {results['start_nodes_s']} s to start {max(results['sizes'])}",
        "",
        "| play | nodes | wall s | x 1 node | target | controller CPU s | peak PSS MiB (RSS) | nodes' CPU share |"
        " report write s | report KiB (json/md/xml) | tasks a host |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for play in PLAYS:
        by_size = median_runs(results["runs"], play)
        if not by_size:
            continue
        one = by_size.get(1, {}).get("wall_s")
        for size, figures in by_size.items():
            first = figures["first"]
            ratio = figures["wall_s"] / one if one else None
            target = TARGETS.get((play, size))
            verdict = (
                "" if target is None or ratio is None else f"<= {target:g} x: {'met' if ratio <= target else 'NOT met'}"
            )
            share = figures["nodes_cpu_s"] / figures["machine_busy_cpu_s"] if figures["machine_busy_cpu_s"] else 0
            sizes = first.get("report_bytes") or {}
            lines.append(
                f"| {play} | {size} | {figures['wall_s']:.1f} | {'-' if ratio is None else f'{ratio:.2f}'} | {verdict} "
                f"| {figures['controller_cpu_s']:.1f} | {figures['controller_peak_pss_bytes'] / 2**20:.0f} "
                f"({figures['controller_peak_rss_bytes'] / 2**20:.0f}) | {share:.0%} | "
                f"{'-' if first.get('report_write_s') is None else first['report_write_s']} | "
                + ("/".join(f"{sizes.get(s, 0) / 1024:.0f}" for s in (".json", ".md", ".xml")) if sizes else "-")
                + f" | {first.get('tasks_per_host', '-')} |"
            )
        for key, label in (("wall_s", "wall s"), ("controller_cpu_s", "controller CPU s")):
            added = per_added_node(by_size, key)
            if added is not None:
                target = ""
                if play == "play 1" and key == "controller_cpu_s":
                    met = added <= PLAY_1_CPU_PER_NODE_TARGET_S
                    target = f"<= {PLAY_1_CPU_PER_NODE_TARGET_S:g} s: {'met' if met else 'NOT met'}"
                lines.append(f"| {play} | per added node | | | {target} | {label}: {added:.3f} | | | | | |")
        largest = max(by_size) if by_size else None
        counted = by_size[largest]["first"] if largest is not None else {}
        if play == "play 1" and "tasks_per_host" in counted:
            typical = counted.get("tasks_per_typical_host", counted["tasks_per_host"])
            lines.append(
                f"| {play} | tasks a host | | | <= {PLAY_1_TASKS_TARGET}: "
                f"{'met' if typical <= PLAY_1_TASKS_TARGET else 'NOT met'} | {typical} on a host of {largest} "
                f"({counted['tasks_per_host']} on the first, with the once-per-run tasks) | | | | | |"
            )
    for run in results["runs"]:
        if run["variant"] != "3 failing" and run["rc"] != 0:
            reason = next((line.strip() for line in run.get("tail", []) if line.startswith("failed: ")), "see its log")
            lines.append(
                f"FAILED: {run['play']} on {run['nodes']} nodes ({run['variant']}), rc {run['rc']}: its figures"
                f" are of a failed run, not comparable; {reason[:300]}"
            )
    peak = max((r["controller_peak_pss_bytes"] for r in results["runs"] if r["variant"] == "tuned"), default=0)
    lines += [
        "",
        f"controller peak memory (PSS): {peak / 2**20:.0f} MiB; target <= {PEAK_TARGET_BYTES / 1e9:g} GB: "
        f"{'met' if peak <= PEAK_TARGET_BYTES else 'NOT met'}",
    ]
    for run in results["runs"]:
        if run["variant"] == "tuned" and run["nodes"] == max(results["sizes"]) and run.get("controller_peak_breakdown"):
            lines.append(
                f"  {run['play']} on {run['nodes']} nodes, at its peak ({run['controller_peak_pss_bytes'] / 2**20:.0f}"
                f" MiB; PSS and processes): {describe_breakdown(run['controller_peak_breakdown'])}"
            )
    before = {r["play"]: r for r in results["runs"] if r["variant"] == "before"}
    if before:
        lines += [
            "",
            f"before / after the tuning (the tree of {next(iter(before.values()))['commit']} / this one), "
            f"{max(results['sizes'])} nodes:",
        ]
        for play, old in before.items():
            new = median_runs(results["runs"], play)[old["nodes"]]
            lines.append(
                f"  {play}: {old['wall_s']:.1f} s -> {new['wall_s']:.1f} s, controller "
                f"{old['controller_cpu_s']:.1f} -> {new['controller_cpu_s']:.1f} CPU s, peak PSS "
                f"{old['controller_peak_pss_bytes'] / 2**20:.0f} -> {new['controller_peak_pss_bytes'] / 2**20:.0f} MiB"
                f", tasks a host {old.get('tasks_per_typical_host', old.get('tasks_per_host', '-'))} -> "
                f"{new['first'].get('tasks_per_typical_host', '-')} (the first host "
                f"{old.get('tasks_per_host', '-')} -> {new['first'].get('tasks_per_host', '-')})"
            )
    failing = next((r for r in results["runs"] if r["variant"] == "3 failing"), None)
    if failing:
        lines += [
            "",
            f"verify with 3 of {failing['nodes']} nodes failing (forged mismatch: "
            f"{', '.join(failing['mismatched'])}; stopped: {failing['stopped']}): {failing['wall_s']:.1f} s, "
            f"rc {failing['rc']}; the report begins:",
        ]
        lines += [f"  {line}" for line in failing.get("report_lead", [])]
    lines += report_rerun(results.get("rerun_runs", []))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes", default="1,10,50,100", help="node counts, comma-separated (default 1,10,50,100)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each play at each size (the median is shown)")
    parser.add_argument(
        "--before-commit",
        dest="compare",
        default=BEFORE_COMMIT,
        help=f"the tree before the tuning, run at the largest size (default {BEFORE_COMMIT})",
    )
    parser.add_argument(
        "--no-compare",
        dest="compare",
        action="store_const",
        const="",
        help="leave out the runs of the tree before the tuning",
    )
    parser.add_argument(
        "--no-failures", dest="failures", action="store_false", help="leave out verify with 3 failing nodes"
    )
    parser.add_argument(
        "--plays", default=",".join(PLAYS), help=f"the plays to run, comma-separated (default {','.join(PLAYS)})"
    )
    parser.add_argument(
        "--rerun",
        type=int,
        default=0,
        help="runs of the converged re-run of site.yml on the lab's own nodes, this tree and the tree before in turn"
        " (needs the lab converged by this tree: make run); --plays '' for this alone",
    )
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "bench")
    args = parser.parse_args(argv)
    plays = tuple(p.strip() for p in args.plays.split(",") if p.strip())
    if (not plays and args.rerun < 1) or set(plays) - set(PLAYS) or args.rerun < 0:
        print(f"--plays: some of {', '.join(PLAYS)}, or none with --rerun N >= 1; got {args.plays!r}", file=sys.stderr)
        return 2
    if not (LAB_INVENTORY / "hosts.yml").exists():
        print("the lab is not built: run `make lab` first", file=sys.stderr)
        return 2
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if not sizes or sizes[0] < 1 or sizes[-1] > LIGHT_NODE_MAX or args.runs < 1:
        print(
            f"--sizes: node counts from 1 to {LIGHT_NODE_MAX} (the light nodes' addresses), --runs >= 1; "
            f"got {args.sizes}, {args.runs}",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("CONTAINERS_CONF", str(REPO / "tests" / "lab" / "files" / "containers.conf"))
    results: dict = {**results_file.header(), "sizes": sizes}
    with tempfile.TemporaryDirectory(prefix="gpufleet-scale-") as tmp:
        if plays:
            results.update(run_benchmark(sizes, args.runs, args.compare, args.failures, Path(tmp), plays))
        if args.rerun:
            results["rerun_runs"] = run_rerun(args.rerun, args.compare, Path(tmp))
    return results_file.finish(results, args.out, "scale", report(results))


if __name__ == "__main__":
    sys.exit(main())
