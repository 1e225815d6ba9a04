#!/usr/bin/env python
"""Runs the test suite stage by stage and prints how long each stage took.

``make test`` (and so ``.ci/run``) runs this. The stages, in order:

  lint, unit, payload        make lint / unit / payload
  lab                        make lab (builds or updates the lab)
  molecule <scenario>        one ``molecule test -s <scenario>`` per scenario
  e2e scale                  pytest tests/e2e/test_scale.py (verify on 20
                             light nodes; needs the lab, not its converge)
  e2e converge               pytest tests/e2e/test_site.py (first site.yml
                             converge of the lab, then the idempotent re-run)
  e2e <module>               pytest of the other e2e modules, one run; the
                             table shows each module and each of its tests
                             (from pytest's JUnit XML)

Two lanes run at once first (2 cores): lint, unit and payload, which use the
controller's CPU, then the molecule scenario that builds the driver's DKMS
module (CPU, once the lab is built), beside the lab's build, the molecule
scenarios that mostly wait on SSH and apt, and the scale test; their output is kept in
reports/logs/<stage>.log and printed whole when each stage ends. The e2e
stages then run one at a time.

The first stage that fails stops the run (the rest are listed as not run),
as ``make test`` did. At the end the stage table is printed and written to
``reports/ci-stages.json`` and ``reports/ci-stages.md``; the table that was
there before is kept as ``reports/ci-stages.previous.json`` and shown beside
the new figures, and so is the committed record of the last rehearsal
(``docs/ci-rehearsal.json``). The suite's budget is BUDGET_S: the table says
whether the run was within it.

  tools/stages.py                  run every stage (make test)
  tools/stages.py --tier slow      the slow tier (make test-slow): the lab, the
                                   e2e converge, then every e2e test marked
                                   ``@pytest.mark.slow`` (those ``make test``
                                   leaves out); its record is docs/slow-tier-run.json
  tools/stages.py --only e2e       run the stages whose name starts with e2e
  tools/stages.py --list           print the stage names
  tools/stages.py --record         also copy the table to docs/ci-rehearsal.json
                                   (a rehearsal on a fresh clone: STAGES_RECORD=1
                                   CI=true bash .ci/run does the same)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 45 * 60  # the suite's budget on the build machine (2 cores, 24 GiB); CI allows 90 min
COLD_BUDGET_S = 70 * 60  # the same on a machine whose download cache is empty (it never built the lab)
REPORTS = REPO / "reports"
RECORD = REPO / "docs" / "ci-rehearsal.json"
SLOW_RECORD = REPO / "docs" / "slow-tier-run.json"
E2E_CONVERGE = "tests/e2e/test_site.py"
# Verify on 20 light nodes (no converged lab needed): the last stage of the lab's lane; also
# `make test-scale` alone (docs/testing.md, "The scale test").
E2E_SCALE = "tests/e2e/test_scale.py"
SLOW = "slow"  # the pytest mark of the slow tier (tests/e2e/conftest.py registers it)
DKMS_SCENARIOS = {"nvidia_driver"}  # molecule scenarios that build the driver module: CPU-bound, run alone
LOGS = REPORTS / "logs"


@dataclass
class Stage:
    name: str
    argv: list
    junit: str = ""  # pytest stages: where their JUnit XML goes
    lane: int = 0  # consecutive stages with a lane > 0 run at once, one thread per lane (see run_stages)
    after: str = ""  # a stage of another lane that must have passed before this one starts
    seconds: float | None = None
    status: str = "not run"  # passed, failed, not run
    detail: list = field(default_factory=list)  # e2e: [module, seconds, [[test, seconds, outcome], ...]]


def molecule_scenarios() -> list:
    return sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))


def e2e_modules() -> list:
    return sorted(p.name for p in (REPO / "tests" / "e2e").glob("test_*.py"))


def _is_slow_mark(node: ast.expr) -> bool:
    """``pytest.mark.slow`` (or a call of it)."""
    node = node.func if isinstance(node, ast.Call) else node
    return (
        isinstance(node, ast.Attribute)
        and node.attr == SLOW
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    )


def e2e_tests() -> dict:
    """{module file name: {test function name: True when marked slow}}, read from the source (no import,
    no lab): a module-wide ``pytestmark = pytest.mark.slow`` marks every test of the module."""
    out = {}
    for name in e2e_modules():
        tree = ast.parse((REPO / "tests" / "e2e" / name).read_text())
        module_slow = any(
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
            and any(_is_slow_mark(v) for v in (n.value.elts if isinstance(n.value, ast.List) else [n.value]))
            for n in tree.body
        )
        out[name] = {
            n.name: module_slow or any(_is_slow_mark(d) for d in n.decorator_list)
            for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
        }
    return out


def slow_tests() -> list:
    """The slow tier's tests, as ``module::test`` (module without .py)."""
    return [f"{m.removesuffix('.py')}::{t}" for m, tests in e2e_tests().items() for t, slow in tests.items() if slow]


def suite_modules() -> list:
    """The e2e modules with at least one test in ``make test`` (not all of it slow)."""
    return [m for m, tests in e2e_tests().items() if not all(tests.values())]


def plan(tier: str = "suite") -> list:
    """The stages of ``make test`` (tier suite) or of ``make test-slow`` (tier slow)."""
    bin_dir = Path(sys.executable).parent
    make = ["make", "--no-print-directory"]
    pytest = [str(bin_dir / "pytest"), "-q", "-p", "no:cacheprovider"]
    converge = Stage("e2e converge", [*pytest, E2E_CONVERGE], junit="reports/e2e-converge.xml")
    if tier == "slow":
        # The slow tests start from a converged lab, as they do after the suite's converge.
        modules = sorted({f"tests/e2e/{t.split('::')[0]}.py" for t in slow_tests()})
        return [
            Stage("lab", [*make, "lab"]),
            converge,
            Stage("e2e slow", [*pytest, "-m", SLOW, *modules], junit="reports/e2e-slow.xml"),
        ]
    # Two lanes at once: the controller-only stages (CPU), then the scenarios that build the driver's DKMS
    # module (CPU, after the lab is built), beside the lab's build and the molecule scenarios that mostly wait
    # on SSH and apt; then the e2e stages, one at a time.
    stages = [Stage(name, [*make, name], lane=1) for name in ("lint", "unit", "payload")]
    stages.append(Stage("lab", [*make, "lab"], lane=2))
    molecule = {
        s: Stage(
            f"molecule {s}",
            [str(bin_dir / "molecule"), "-c", "molecule/shared/base.yml", "test", "-s", s],
            lane=1 if s in DKMS_SCENARIOS else 2,
            after="lab" if s in DKMS_SCENARIOS else "",
        )
        for s in molecule_scenarios()
    }
    stages += [m for m in molecule.values() if m.lane == 2]
    stages.append(Stage("e2e scale", [*pytest, E2E_SCALE], junit="reports/e2e-scale.xml", lane=2))
    stages += [m for m in molecule.values() if m.lane == 1]
    stages.append(converge)
    others = [f"tests/e2e/{m}" for m in suite_modules() if f"tests/e2e/{m}" not in (E2E_CONVERGE, E2E_SCALE)]
    stages.append(Stage("e2e modules", [*pytest, "-m", f"not {SLOW}", *others], junit="reports/e2e-modules.xml"))
    return stages


def junit_detail(path: Path) -> list:
    """[[module, seconds, [[test, seconds, outcome], ...]], ...] in file order."""
    if not path.exists():
        return []
    modules: dict = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1] or "?"
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
        seconds = float(case.get("time") or 0)
        entry = modules.setdefault(module, [module, 0.0, []])
        entry[1] += seconds
        entry[2].append([case.get("name"), round(seconds, 1), outcome])
    return [[m, round(s, 1), tests] for m, s, tests in modules.values()]


def minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{int(seconds // 60)}:{int(round(seconds % 60)):02d}" if seconds >= 60 else f"{seconds:.0f} s"


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def table(run: dict, previous: dict, record: dict) -> str:
    """The stage table as Markdown: this run, the previous run here, the last recorded rehearsal."""

    def seconds_by_name(data: dict) -> dict:
        out = {}
        for s in data.get("stages", []):
            out[s["name"]] = s.get("seconds")
            for module, secs, _tests in s.get("detail", []):
                out[f"  {module}"] = secs
        return out

    prev, rec = seconds_by_name(previous), seconds_by_name(record)
    rows = ["| stage | status | time | previous run | last rehearsal |", "|---|---|---|---|---|"]
    for s in run["stages"]:
        rows.append(
            f"| {s['name']} | {s['status']} | {minutes(s['seconds'])} | "
            f"{minutes(prev.get(s['name']))} | {minutes(rec.get(s['name']))} |"
        )
        if s["name"] == "e2e converge":
            continue  # one module, the stage itself
        for module, secs, tests in s.get("detail", []):
            rows.append(
                f"| &nbsp;&nbsp;{module} | | {minutes(secs)} | {minutes(prev.get('  ' + module))} | "
                f"{minutes(rec.get('  ' + module))} |"
            )
            for test, tsecs, outcome in tests:
                rows.append(f"| &nbsp;&nbsp;&nbsp;&nbsp;{test} | {outcome} | {minutes(tsecs)} | | |")
    total = run["total_s"]
    verdict = _verdict(run)
    rows.append(
        f"| **total** | {run['status']} | **{minutes(total)}** | {minutes(previous.get('total_s'))} | "
        f"{minutes(record.get('total_s'))} |"
    )
    rows.append("")
    rows.append(
        f"{verdict} "
        f"({run['host']}, {run['cores']} cores, download cache {run.get('download_cache', '?')}, "
        f"started {run['started']}, CI={run['ci']})"
    )
    return "\n".join(rows) + "\n"


def _verdict(run: dict) -> str:
    if run.get("tier") == "slow":
        return "the slow tier: outside the suite's budget (docs/testing.md)"
    return f"{'within' if run['total_s'] <= run['budget_s'] else 'OVER'} the budget of {minutes(run['budget_s'])}"


def terminal_table(run: dict) -> str:
    width = 58
    lines = [f"{'stage':<{width}} {'status':<8} {'time':>8}"]
    for s in run["stages"]:
        lines.append(f"{s['name']:<{width}} {s['status']:<8} {minutes(s['seconds']):>8}")
        for module, secs, tests in s.get("detail", []):
            if s["name"] != "e2e converge":
                lines.append(f"  {module:<{width - 2}} {'':<8} {minutes(secs):>8}")
            for test, tsecs, outcome in tests:
                lines.append(f"    {test[: width - 4]:<{width - 4}} {outcome:<8} {minutes(tsecs):>8}")
    lines.append(f"{'total':<{width}} {run['status']:<8} {minutes(run['total_s']):>8}")
    lines.append(f"{_verdict(run)} (download cache {run['download_cache']})")
    return "\n".join(lines)


def write_reports(run: dict, record_too: bool) -> Path:
    """Writes the table; a partial run (--only) under its own name. Returns the Markdown file."""
    REPORTS.mkdir(exist_ok=True)
    slow = run.get("tier") == "slow"
    stem = "ci-stages" + ("-slow" if slow else "") + (f"-{run['only'].replace(' ', '-')}" if run["only"] else "")
    record = SLOW_RECORD if slow else RECORD
    current = REPORTS / f"{stem}.json"
    previous = load(current)
    if previous:
        shutil.copyfile(current, REPORTS / f"{stem}.previous.json")
    current.write_text(json.dumps(run, indent=1) + "\n")
    markdown = REPORTS / f"{stem}.md"
    markdown.write_text(table(run, previous, load(record)))
    if record_too and not run["only"]:
        record.parent.mkdir(exist_ok=True)
        record.write_text(json.dumps(run, indent=1) + "\n")
    return markdown


def download_cache_state() -> str:
    """'warm' when the lab's download cache (tests/lab/files/lab_cache.py) holds entries, else 'cold'."""
    cache = Path(os.environ.get("GPUFLEET_LAB_CACHE") or "/var/cache/gpufleet-lab")
    try:
        return "warm" if any(p.is_dir() and not p.name.startswith(".") for p in cache.iterdir()) else "cold"
    except OSError:
        return "cold"


def run_stage(stage: Stage, log: Path | None = None) -> int:
    """Runs one stage, timed; its output goes to the terminal, or to ``log`` (a stage run beside others)."""
    argv_ = list(stage.argv)
    if stage.junit:
        (REPO / stage.junit).parent.mkdir(exist_ok=True)
        argv_ += [f"--junitxml={REPO / stage.junit}"]
    t0 = time.monotonic()
    if log is None:
        rc = subprocess.run(argv_, cwd=REPO, check=False).returncode
    else:
        with log.open("w") as out:
            rc = subprocess.run(argv_, cwd=REPO, check=False, stdout=out, stderr=subprocess.STDOUT).returncode
    stage.seconds = round(time.monotonic() - t0, 1)
    stage.status = "passed" if rc == 0 else "failed"
    if stage.junit:
        stage.detail = junit_detail(REPO / stage.junit)
    return rc


def run_stages(stages: list) -> int:
    """Runs the stages in order; consecutive stages with a lane run at once, one thread per lane, each lane's
    stages in order, their output kept in reports/logs/<stage>.log and printed whole when the stage ends. The
    first failure stops the run: no later stage starts (in any lane); the rest are listed as not run."""
    failed = threading.Event()
    printing = threading.Lock()
    done = {stage.name: threading.Event() for stage in stages}

    def lane(members: list) -> None:
        for stage in members:
            if stage.after in done:
                while not done[stage.after].wait(1) and not failed.is_set():
                    pass
            if failed.is_set():
                return
            log = LOGS / f"{stage.name.replace(' ', '-')}.log"
            with printing:
                print(
                    f"===== stage: {stage.name} ({time.strftime('%H:%M:%S')}, beside other stages; output when it "
                    "ends)",
                    flush=True,
                )
            if run_stage(stage, log) != 0:
                failed.set()
            done[stage.name].set()
            with printing:
                print(
                    f"\n===== stage: {stage.name} =====\n{log.read_text(errors='replace')}"
                    f"===== stage: {stage.name} {stage.status} in {minutes(stage.seconds)} =====",
                    flush=True,
                )

    index = 0
    while index < len(stages) and not failed.is_set():
        if not stages[index].lane:
            stage = stages[index]
            print(f"\n===== stage: {stage.name} ({time.strftime('%H:%M:%S')}) =====", flush=True)
            if run_stage(stage) != 0:
                failed.set()
            done[stage.name].set()
            print(f"===== stage: {stage.name} {stage.status} in {minutes(stage.seconds)} =====", flush=True)
            index += 1
            continue
        end = index
        while end < len(stages) and stages[end].lane:
            end += 1
        LOGS.mkdir(parents=True, exist_ok=True)
        lanes: dict = {}
        for stage in stages[index:end]:
            lanes.setdefault(stage.lane, []).append(stage)
        threads = [threading.Thread(target=lane, args=(members,)) for members in lanes.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        index = end
    return 1 if failed.is_set() else 0


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--only", default="", help="run only the stages whose name starts with this")
    parser.add_argument("--list", action="store_true", help="print the stage names and exit")
    parser.add_argument(
        "--tier",
        choices=("suite", "slow"),
        default="suite",
        help="suite: make test (the default); slow: make test-slow",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="also write the table to docs/ci-rehearsal.json (the slow tier: docs/slow-tier-run.json)",
    )
    args = parser.parse_args(argv)
    stages = [s for s in plan(args.tier) if s.name.startswith(args.only)]
    if args.list:
        print("\n".join(s.name for s in stages))
        return 0
    if not stages:
        print(f"stages: no stage starts with {args.only!r}", file=sys.stderr)
        return 2
    started = time.time()
    cache_state = download_cache_state()
    rc = run_stages(stages)
    run = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "host": os.uname().nodename,
        "cores": os.cpu_count(),
        "ci": os.environ.get("CI", "") == "true",
        "download_cache": cache_state,
        "budget_s": BUDGET_S if cache_state == "warm" else COLD_BUDGET_S,
        "total_s": round(time.time() - started, 1),
        "status": "passed" if rc == 0 else "failed",
        "only": args.only,
        "tier": args.tier,
        "stages": [asdict(s) for s in stages],
    }
    markdown = write_reports(run, args.record or os.environ.get("STAGES_RECORD") == "1")
    print("\n" + terminal_table(run))
    print(f"stage table: {markdown}")
    counts = {status: sum(s.status == status for s in stages) for status in ("passed", "failed")}
    print(f"stages: {counts['passed']} passed, {counts['failed']} failed")
    return rc


if __name__ == "__main__":
    sys.exit(main())
