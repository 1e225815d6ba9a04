#!/usr/bin/env python
"""gpufleet's provisioning benchmark on the lab: prints figures, asserts nothing.

    make bench                               # sizes 1 and 3 nodes (about 30 min on 2 cores), then tools/bench/scale.py
    .venv/bin/python tools/bench/provisioning.py --sizes 1 --skip-shell
    .venv/bin/python tools/bench/provisioning.py --verify-only  # verify on 1, 3, 6 copies of a converged node (minutes)

Needs the lab (`make lab`: the mirror and the node image). For each size N
it starts N never-provisioned nodes beside the lab's own (gpufleet-bench-*,
on the lab's internal network, no cluster services) and measures:

* the first converge of site.yml (provision, verify, smoke training) and
  the part of it that is provisioning (the plays of playbooks/provision.yml);
* the idempotent re-run of site.yml: its time as a fraction of the first,
  its changed tasks, and the requests the mirror served during it, read
  from the mirror's nginx access log (a re-run must download nothing: GETs
  answered with a body are downloads);
* playbooks/verify.yml on the converged nodes (median of 3 runs).

Then, side by side, the plain shell sequence of the source document (apt
installs of the driver, CUDA, cuDNN and NCCL, a venv and pip install of
torch; no Ansible) on one fresh node, so the toolkit's cost is a ratio
against doing it by hand; and the payload's samples/s on CPU for 1 rank and
for N ranks (torchrun --standalone on this machine).

With --verify-only, only the verify figures, in minutes instead of an
hour: the lab's first node (converged by `make run`) is copied (podman
commit) and verify.yml runs on 1..N running copies, the sizes interleaved.

The targets (issue 6) are printed next to the figures: re-run <= 20 % of
the first converge, verify on 6 nodes <= 1.5 x verify on 1 node, no download
in a re-run. Results also go to reports/bench/provisioning-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from conftest import LAB_INVENTORY, lab_vars, lone_inventory, podman, run_playbook, start_lab_nodes  # noqa: E402

sys.path.insert(0, str(REPO / "tools" / "bench"))
import results as results_file  # noqa: E402

MIRROR = "gpufleet-mirror"
MIRROR_LOG = "/var/log/nginx/mirror-access.log"
PREFIX = "gpufleet-bench"
PROVISION_PLAYS = ("Check hosts and settings (read-only)", "Install the driver, the CUDA stack and PyTorch")
RERUN_TARGET = 0.20
VERIFY_SCALING_TARGET = 1.5


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def start_nodes(names: list[str], workdir: Path) -> Path:
    """Fresh nodes from the lab's node image, and an inventory of them (the lab's group_vars)."""
    return lone_inventory(workdir / "inventory", start_lab_nodes(names, "bench"))


def remove_nodes(names: list[str]) -> None:
    for name in names:
        podman("rm", "-f", "--time", "5", name, check=False)


def mirror_log() -> list[str]:
    """The mirror's nginx access log (combined format), one request per line."""
    return podman("exec", MIRROR, "sh", "-c", f"cat {MIRROR_LOG} 2>/dev/null || true", check=False).stdout.splitlines()


def downloads_in(lines: list[str]) -> list[str]:
    """The requests that fetched something (GET answered with a body), as "METHOD path status"."""
    fetched = []
    for line in lines:
        parts = line.split('"')
        if len(parts) < 3:
            continue
        request, status_bytes = parts[1].split(), parts[2].split()
        if request and request[0] == "GET" and status_bytes[:1] != ["304"] and status_bytes[1:2] not in (["0"], ["-"]):
            fetched.append(f"{request[0]} {request[1] if len(request) > 1 else '?'} {status_bytes[0]}")
    return fetched


def timed(workdir: Path, playbook: str, inventory: Path, **kwargs):
    reports = workdir / "reports"
    extravars = {"gpu_verify_report_dir": str(reports / "verify"), "smoke_training_report_dir": str(reports / "smoke")}
    start = time.monotonic()
    run = run_playbook(workdir, playbook, inventory, extravars=extravars, **kwargs)
    return time.monotonic() - start, run


def timed_verify(workdir: Path, inventory: Path, where: str) -> float:
    """Seconds of one verify.yml run; a failed run stops the benchmark, naming where it ran."""
    seconds, run = timed(workdir, "playbooks/verify.yml", inventory)
    if run.status != "successful":
        raise SystemExit(
            f"verify.yml failed on {where} (status {run.status}, rc {run.rc}): {run.failures() or 'no task failed'}"
        )
    return seconds


def provisioning_seconds(run) -> float:
    """Seconds between the start of provision.yml's first play and the start of the play after its last."""
    starts = [
        (ev["event_data"].get("play", ""), dt.datetime.fromisoformat(ev["created"]))
        for ev in run.events
        if ev.get("event") == "playbook_on_play_start"
    ]
    first = next(t for name, t in starts if name == PROVISION_PLAYS[0])
    after = [t for name, t in starts if t > first and name not in PROVISION_PLAYS]
    end = min(after) if after else dt.datetime.fromisoformat(run.events[-1]["created"])
    return (end - first).total_seconds()


def bench_size(size: int, root: Path) -> dict:
    names = [f"{PREFIX}-{i}" for i in range(1, size + 1)]
    workdir = root / f"size-{size}"
    workdir.mkdir()
    log(f"{size} node(s): starting {', '.join(names)}")
    inventory = start_nodes(names, workdir)
    try:
        log(f"{size} node(s): first converge (site.yml)")
        first_s, first = timed(workdir, "site.yml", inventory)
        if first.status != "successful":
            raise SystemExit(f"site.yml failed on {size} node(s): {first.failures()}")
        provision_s = provisioning_seconds(first)
        log(f"{size} node(s): first converge {first_s:.0f} s (provisioning {provision_s:.0f} s); re-run")
        log_before = len(mirror_log())
        rerun_s, rerun = timed(workdir, "site.yml", inventory)
        rerun_requests = mirror_log()[log_before:]
        downloads = downloads_in(rerun_requests)
        if rerun.status != "successful":
            raise SystemExit(f"the site.yml re-run failed on {size} node(s): {rerun.failures()}")
        verify = [timed_verify(workdir, inventory, f"{size} node(s)") for _round in range(3)]
        log(
            f"{size} node(s): re-run {rerun_s:.0f} s, {len(rerun_requests)} mirror requests ({len(downloads)} "
            f"downloads); verify {statistics.median(verify):.1f} s"
        )
        return {
            "nodes": size,
            "first_converge_s": round(first_s, 1),
            "first_provisioning_s": round(provision_s, 1),
            "rerun_s": round(rerun_s, 1),
            "rerun_ratio": round(rerun_s / first_s, 3),
            "rerun_changed_tasks": rerun.changed_tasks(),
            "rerun_mirror_requests": len(rerun_requests),
            "rerun_downloads": downloads,
            "verify_s": [round(s, 1) for s in verify],
            "verify_median_s": round(statistics.median(verify), 1),
        }
    finally:
        remove_nodes(names)


def shell_sequence() -> str:
    """The source document's steps, by hand, against the lab's mirror (what a runbook does)."""
    # The default stack, as the collection's one reader of the matrix resolves it.
    spec = importlib.util.spec_from_file_location("stack", REPO / "plugins" / "lookup" / "stack.py")
    stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stack)
    resolved = stack.resolve(stack.load_matrix(), driver_branch="535")
    cuda = {**resolved["cuda"], "cudnn": resolved["cudnn"], "nccl": resolved["nccl"]}
    driver = resolved["driver"]["version"]
    kernel = lab_vars()["lab_kernel_release"]
    mirror = lab_vars()["lab_mirror_url"]
    # What the lab's wheelhouse carries (tests/lab/vars/lab.yml): PyPI's cu121 build of torch 2.3.1 and its companions.
    wheels = yaml.safe_load((REPO / "tests" / "lab" / "vars" / "lab.yml").read_text())["lab_wheelhouse_requirements"]
    # The lab's site repository for CUDA on Debian 12 (NVIDIA's debian12 directory has no CUDA 12.1).
    cuda_repo = f"{mirror}/site/cuda-{cuda['release']}/debian12"
    return f"""set -eux
export DEBIAN_FRONTEND=noninteractive
echo 'deb [signed-by=/usr/share/keyrings/gpufleet-lab-archive-keyring.gpg] {mirror}/debian bookworm' \\
  'contrib non-free non-free-firmware' > /etc/apt/sources.list.d/nvidia.list
printf 'Package: *nvidia* libcuda* libnvidia*\\nPin: version {driver}-*\\nPin-Priority: 1001\\n' \\
  > /etc/apt/preferences.d/nvidia.pref
apt-get update
apt-get install -y --no-install-recommends linux-headers-{kernel} nvidia-kernel-dkms={driver}-* nvidia-smi={driver}-* \\
  libcuda1={driver}-* nvidia-persistenced
python3 -c "import urllib.request
urllib.request.urlretrieve('{cuda_repo}/cuda-keyring_1.1-1_all.deb', '/tmp/cuda-keyring.deb')"
dpkg -i /tmp/cuda-keyring.deb
echo 'deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {cuda_repo}/ /' > /etc/apt/sources.list.d/cuda.list
apt-get update
apt-get install -y --no-install-recommends cuda-toolkit-12-1={cuda["toolkit_version"]} \\
  libcudnn8={cuda["cudnn"]["package_version"]} libnccl2={cuda["nccl"]["package_version"]}
apt-get install -y --no-install-recommends python3-venv
python3 -m venv /opt/venv
/opt/venv/bin/pip install --no-index --find-links {mirror}/wheels/ --trusted-host {mirror.split("//")[1]} \\
  {" ".join(wheels)}
/opt/venv/bin/python -c 'import torch; print(torch.__version__)'
"""


def bench_verify_copies(sizes: list[int], root: Path) -> dict:
    """verify.yml on copies of the lab's converged first node: 3 runs per size, the sizes interleaved."""
    groups = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())["all"]["children"]
    source = sorted(groups["gpu_nodes"]["hosts"])[0]
    image = f"localhost/{PREFIX}-converged:latest"
    log(f"copying the converged lab node {source} (podman commit)")
    podman("commit", "--quiet", source, image)
    names = [f"{PREFIX}-{i}" for i in range(1, max(sizes) + 1)]
    try:
        log(f"starting {len(names)} copies")
        hosts = start_lab_nodes(names, "bench", image=image)
        inventories = {
            size: lone_inventory(root / f"verify-{size}", {n: hosts[n] for n in names[:size]}) for size in sizes
        }
        seconds: dict[int, list[float]] = {size: [] for size in sizes}
        for _round in range(3):
            for size in sizes:
                seconds[size].append(
                    timed_verify(
                        root, inventories[size], f"{size} copies of {source} (converge the lab first: make run)"
                    )
                )
        for size in sizes:
            log(f"verify on {size} node(s): {', '.join(f'{s:.1f}' for s in seconds[size])} s")
        return {
            "verify_copies_of": source,
            "verify_copies": [
                {
                    "nodes": size,
                    "verify_s": [round(s, 2) for s in seconds[size]],
                    "verify_median_s": round(statistics.median(seconds[size]), 2),
                }
                for size in sizes
            ],
        }
    finally:
        remove_nodes(names)
        podman("rmi", image, check=False)


def bench_shell(root: Path) -> dict:
    name = f"{PREFIX}-9"
    start_nodes([name], root / "shell")
    try:
        log("the shell sequence on a fresh node")
        start = time.monotonic()
        done = subprocess.run(
            ["podman", "exec", "-i", name, "bash"], input=shell_sequence(), text=True, capture_output=True, check=False
        )
        seconds = time.monotonic() - start
        if done.returncode != 0:  # the other figures still count
            log(f"the shell sequence failed:\n{done.stderr[-3000:]}")
            return {"shell_error": done.stderr[-3000:]}
        log(f"the shell sequence: {seconds:.0f} s")
        return {"shell_s": round(seconds, 1)}
    finally:
        remove_nodes([name])


def bench_payload(ranks: list[int], root: Path) -> dict:
    torchrun = REPO / ".venv" / "bin" / "torchrun"
    figures = {}
    for n in ranks:
        result = root / f"payload-{n}.json"
        cmd = [
            str(torchrun),
            "--standalone",
            f"--nproc-per-node={n}",
            str(REPO / "roles" / "payload" / "files" / "train.py"),
            "--device",
            "cpu",
            "--amp",
            "off",
            "--steps",
            "60",
            "--batch-size",
            "512",
            "--hidden",
            "256",
            "--num-samples",
            "16384",
            "--result",
            str(result),
        ]
        subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        data = json.loads(result.read_text())
        figures[n] = round(data["samples_per_s"], 1)
        log(f"payload on CPU, {n} rank(s): {figures[n]} samples/s")
    return {"payload_samples_per_s": figures}


def verify_scaling(by_n: dict) -> str:
    """The verify target's line: the largest size's median against one node's."""
    if 1 not in by_n or max(by_n) == 1:
        return "verify scaling: needs 1 node and a larger size"
    big = max(by_n)
    scaling = by_n[big]["verify_median_s"] / by_n[1]["verify_median_s"]
    return (
        f"verify on {big} nodes / on 1 node: {scaling:.2f} x (target <= {VERIFY_SCALING_TARGET} x): "
        f"{'met' if scaling <= VERIFY_SCALING_TARGET else 'NOT met'}"
    )


def report_verify_copies(results: dict) -> str:
    copies = results["verify_copies"]
    lines = [
        f"gpufleet verify benchmark, {results['date']}, {results['machine']}",
        f"(copies of the converged lab node {results['verify_copies_of']})",
        "",
        "| nodes | verify.yml runs | median |",
        "|---|---|---|",
    ]
    lines += [
        f"| {c['nodes']} | {', '.join(f'{s:.1f}' for s in c['verify_s'])} s | {c['verify_median_s']:.1f} s |"
        for c in copies
    ]
    lines += ["", verify_scaling({c["nodes"]: c for c in copies})]
    return "\n".join(lines)


def report(results: dict) -> str:
    if "verify_copies" in results:
        return report_verify_copies(results)
    lines = [f"gpufleet provisioning benchmark, {results['date']}, {results['machine']}", ""]
    sizes = results["sizes"]
    lines.append(
        "| nodes | first converge | of which provisioning | re-run | re-run / first "
        "| mirror requests / downloads in re-run | verify.yml (median of 3) |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for s in sizes:
        lines.append(
            f"| {s['nodes']} | {s['first_converge_s']:.0f} s | {s['first_provisioning_s']:.0f} s | {s['rerun_s']:.0f} "
            f"s | {s['rerun_ratio']:.0%} | {s['rerun_mirror_requests']} / {len(s['rerun_downloads'])} | "
            f"{s['verify_median_s']:.1f} s |"
        )
    lines.append("")
    by_n = {s["nodes"]: s for s in sizes}
    worst_ratio = max(s["rerun_ratio"] for s in sizes)
    lines.append(
        f"re-run / first converge: worst {worst_ratio:.0%} (target <= {RERUN_TARGET:.0%}): "
        f"{'met' if worst_ratio <= RERUN_TARGET else 'NOT met'}"
    )
    downloads = [d for s in sizes for d in s["rerun_downloads"]]
    lines.append(
        f"downloads in re-runs: {len(downloads)} (target 0): "
        f"{'met' if not downloads else 'NOT met: ' + ', '.join(downloads[:5])}"
    )
    lines.append(verify_scaling(by_n))
    if "shell_error" in results:
        lines.append("by hand (shell sequence): FAILED, see shell_error in the JSON")
    if "shell_s" in results and 1 in by_n:
        shell = results["shell_s"]
        lines.append(
            f"by hand (shell sequence, 1 node): {shell:.0f} s; gpufleet's provisioning of 1 node: "
            f"{by_n[1]['first_provisioning_s']:.0f} s ({by_n[1]['first_provisioning_s'] / shell:.2f} x), whole "
            f"site.yml with verify and smoke: {by_n[1]['first_converge_s']:.0f} s "
            f"({by_n[1]['first_converge_s'] / shell:.2f} x)"
        )
    if "payload_samples_per_s" in results:
        figures = results["payload_samples_per_s"]
        lines.append("payload on CPU (gloo): " + ", ".join(f"{n} rank(s) {v} samples/s" for n, v in figures.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    # Each converged node holds 6.8 GB (the cu121 venv, CUDA, the driver build): 3 at once keep the
    # benchmark's disk peak under 40 GB (docs/benchmarks.md). Verify on many nodes: tools/bench/scale.py.
    parser.add_argument("--sizes", default="1,3", help="node counts, comma-separated (default 1,3)")
    parser.add_argument("--skip-shell", action="store_true", help="leave out the by-hand shell sequence")
    parser.add_argument("--payload-ranks", default=f"1,{os.cpu_count() or 2}", help="CPU ranks for the payload figure")
    parser.add_argument(
        "--verify-only",
        action="store_true",
        help="only verify.yml, on copies of the lab's converged first node (run `make run` first)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "bench")
    args = parser.parse_args(argv)
    if not (LAB_INVENTORY / "hosts.yml").exists():
        print("the lab is not built: run `make lab` first", file=sys.stderr)
        return 2
    os.environ.setdefault("CONTAINERS_CONF", str(REPO / "tests" / "lab" / "files" / "containers.conf"))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1 or max(sizes) > 8:
        print(f"--sizes: node counts from 1 to 8 (the lab's extra-node addresses), got {args.sizes}", file=sys.stderr)
        return 2
    results: dict = {**results_file.header(), "sizes": []}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        root = Path(tmp)
        if args.verify_only:
            results.update(bench_verify_copies(sizes, root))
            return finish(results, args.out, "verify")
        results.update(bench_payload([int(n) for n in args.payload_ranks.split(",")], root))
        if not args.skip_shell:
            results.update(bench_shell(root))
        for size in sizes:
            results["sizes"].append(bench_size(size, root))
    return finish(results, args.out, "provisioning")


def finish(results: dict, out_dir: Path, kind: str) -> int:
    return results_file.finish(results, out_dir, kind, report(results))


if __name__ == "__main__":
    sys.exit(main())
