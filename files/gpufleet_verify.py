#!/usr/bin/env python
"""Verify the GPU fleet from cron or CI: run playbooks/verify.yml, print the fleet table, exit 0/1/2.

Usage::

    gpufleet_verify.py -i INVENTORY [--limit PATTERN] [--report-dir DIR] [--check]
                       [--history-keep N] [--repeat-failures K] [--repeat-runs N]
                       [--outlier-fraction F] [-e KEY=VALUE ...] [--quiet]

It runs playbooks/verify.yml of this checkout (the directory above files/)
through ansible-runner with this checkout's ansible.cfg, the report directory
passed as gpu_verify_report_dir (default ./reports/verify), then reads the
fleet-report.json the play wrote there, cross-checks it with the run's
per-host stats, and prints the report's Markdown table. The files beside it:
fleet-report.md (the same table for people) and fleet-report.xml (JUnit).

Each run is kept in the report's history (DIR/history/fleet-history.jsonl,
the last --history-keep runs): what it prints names the repeat offenders,
nodes that failed in --repeat-failures of their last --repeat-runs runs,
with each failing run's reasons, and the outliers, nodes more than
--outlier-fraction below their GPU model's fleet median (the gpu_verify
role's settings gpu_verify_history_keep, gpu_verify_repeat_failures,
gpu_verify_repeat_runs, gpu_verify_outlier_fraction; unset: the role's
defaults). A repeat offender or an outlier that passed does not change the
exit status: cron mails the output, a CI job shows it.

Exit status:

* 0: every node passed;
* 1: one or more nodes failed, were unreachable, or are inconsistent between
  the report and the run (unreachable in the run but not in the report, or
  run but absent from the report); each one is named on stderr;
* 2: the run produced no report (the playbook stopped before it, or the
  report lists no node), or the arguments are wrong; stderr gives
  ansible-runner's status and rc.

Hourly from cron, in the checkout on the controller (mail on output; cron passes REPORTS to the command)::

    REPORTS=/var/lib/gpufleet/reports
    0 * * * * cd /opt/gpufleet && .venv/bin/python files/gpufleet_verify.py -i inventory/prod --report-dir "$REPORTS"

In CI (GitLab), the job fails unless every node passed and the dashboard
reads the JUnit file::

    verify-fleet:
      script:
        - .venv/bin/python files/gpufleet_verify.py -i inventory/prod --quiet --report-dir reports/verify
      artifacts:
        when: always
        paths: [reports/verify/]
        reports:
          junit: reports/verify/fleet-report.xml

Use the Python of the virtual environment that holds ansible-core and
ansible-runner (.venv/bin/python); its bin directory is put first on the
playbook's PATH, so that cron's bare PATH still finds ansible-playbook.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO_ROOT / "playbooks" / "verify.yml"
ANSIBLE_CONFIG = REPO_ROOT / "ansible.cfg"
DEFAULT_REPORT_DIR = "reports/verify"
# Set from --report-dir; the role's other variables may come from -e.
REPORT_DIR_VARIABLE = "gpu_verify_report_dir"
# The options for the report's history and outlier rule, and the role's variables they set.
REPORT_OPTIONS = {
    "history_keep": "gpu_verify_history_keep",
    "repeat_failures": "gpu_verify_repeat_failures",
    "repeat_runs": "gpu_verify_repeat_runs",
    "outlier_fraction": "gpu_verify_outlier_fraction",
}
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The fleet report's code, the one the play's action gpufleet.fleet.fleet_report writes with.
FLEET_REPORT_MODULE = "ansible_collections.gpufleet.fleet.plugins.module_utils.fleet_report"


def collection_root(repo_root: Path = REPO_ROOT) -> Path | None:
    """The directory holding ansible_collections/gpufleet/fleet that is this checkout or installed
    collection: the installed collection's own collections path, else the checkout's link
    (.ansible/collections, made by `make venv`; ansible.cfg's collections_path); None without either."""
    candidates = [repo_root.parents[2]] if len(repo_root.parents) > 2 else []
    candidates.append(repo_root / ".ansible" / "collections")
    for root in candidates:
        link = root / "ansible_collections" / "gpufleet" / "fleet"
        if link.is_dir() and link.resolve() == repo_root.resolve():
            return root
    return None


def load_fleet_report(repo_root: Path = REPO_ROOT) -> ModuleType:
    """The fleet report's module (plugins/module_utils/fleet_report.py), imported through the collection
    gpufleet.fleet; by its path where this checkout has no collection link yet."""
    root = collection_root(repo_root)
    if root is not None:
        if str(root) not in sys.path:
            sys.path.append(str(root))
        return importlib.import_module(FLEET_REPORT_MODULE)
    spec = importlib.util.spec_from_file_location(
        "gpufleet_fleet_report", repo_root / "plugins" / "module_utils" / "fleet_report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fleet_report = load_fleet_report()


@dataclass(frozen=True)
class PlaybookRun:
    """What to run: the inventory, the hosts, the variables, and how."""

    inventory: Path
    limit: str | None
    extravars: dict[str, Any]
    check_mode: bool
    quiet: bool


@dataclass(frozen=True)
class RunOutcome:
    """What ansible-runner says about the run: status ("successful", "failed", "timeout", ...),
    the playbook's rc, and the per-host stats (dark, failures, ok, processed, ...; empty when the
    playbook ended before its recap)."""

    status: str
    rc: int | None
    stats: dict[str, dict[str, int]]


class NoReport(Exception):
    """The run left no usable fleet report."""


def run_playbook(run: PlaybookRun) -> RunOutcome:
    """Run playbooks/verify.yml with ansible-runner, in a private data directory removed afterwards."""
    import ansible_runner  # imported here: --help and the tests need no ansible-runner

    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    with tempfile.TemporaryDirectory(prefix="gpufleet-verify-") as private_data_dir:
        runner = ansible_runner.run(
            private_data_dir=private_data_dir,
            project_dir=str(REPO_ROOT),
            playbook=str(PLAYBOOK),
            inventory=str(run.inventory),
            limit=run.limit,
            extravars=run.extravars,
            cmdline="--check" if run.check_mode else None,
            envvars={"ANSIBLE_CONFIG": str(ANSIBLE_CONFIG), "PATH": path},
            quiet=run.quiet,
        )
        # The stats are read from the run's artifacts, inside the private data directory.
        return RunOutcome(status=runner.status, rc=runner.rc, stats=runner.stats or {})


def extra_variable(text: str) -> tuple[str, str]:
    """argparse type for -e: KEY=VALUE with KEY a variable name; the value stays a string (as with ansible -e)."""
    key, separator, value = text.partition("=")
    if not separator or not VARIABLE_NAME.fullmatch(key):
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE with KEY a variable name")
    if key == REPORT_DIR_VARIABLE:
        raise argparse.ArgumentTypeError(f"set {REPORT_DIR_VARIABLE} with --report-dir, not -e")
    options = {variable: option for option, variable in REPORT_OPTIONS.items()}
    if key in options:
        raise argparse.ArgumentTypeError(f"set {key} with --{options[key].replace('_', '-')}, not -e")
    return key, value


def runs(text: str) -> int:
    """argparse type for a number of runs (0 or more)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of runs (0 or more)")
    return value


def fraction(text: str) -> float:
    """argparse type for the outlier fraction (above 0, below 1)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction (above 0, below 1)")
    return value


def add_report_options(parser: argparse.ArgumentParser, defaults: bool = False) -> None:
    """The options for the report's history and outlier rule (REPORT_OPTIONS), for this command and
    files/gpufleet_report.py: unset by default here (None: the role's defaults, which are the report code's),
    the report code's defaults with ``defaults``."""
    history = f"DIR/{fleet_report.HISTORY_DIR}/{fleet_report.HISTORY_FILE}"
    for option, metavar, kind, default, words in (
        ("history_keep", "N", runs, fleet_report.DEFAULT_HISTORY_KEEP, f"runs the report's history keeps in {history}"),
        (
            "repeat_failures",
            "K",
            runs,
            fleet_report.DEFAULT_REPEAT_FAILURES,
            "a node that failed in K of its last --repeat-runs runs is a repeat offender",
        ),
        ("repeat_runs", "N", runs, fleet_report.DEFAULT_REPEAT_RUNS, "the runs the repeat-offender rule looks at"),
        (
            "outlier_fraction",
            "F",
            fraction,
            fleet_report.DEFAULT_OUTLIER_FRACTION,
            "name the nodes more than F below their GPU model's fleet median, the outliers",
        ),
    ):
        parser.add_argument(
            f"--{option.replace('_', '-')}",
            metavar=metavar,
            type=kind,
            default=default if defaults else None,
            help=f"{words} ({'0: none; ' if option == 'history_keep' else ''}default {default})",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet_verify.py",
        description="Run playbooks/verify.yml and print the fleet report. "
        "Exit 0: every node passed; 1: a node failed or was unreachable; 2: no report.",
    )
    parser.add_argument("-i", "--inventory", required=True, type=Path, help="inventory file or directory")
    parser.add_argument("--limit", metavar="PATTERN", help="verify only the hosts matching PATTERN (ansible --limit)")
    parser.add_argument(
        "--report-dir",
        metavar="DIR",
        type=Path,
        default=Path(DEFAULT_REPORT_DIR),
        help=f"where the play writes fleet-report.json, .md, .xml (default: ./{DEFAULT_REPORT_DIR})",
    )
    parser.add_argument("--check", action="store_true", help="run the playbook in check mode")
    parser.add_argument(
        "-e",
        "--extra-var",
        dest="extra_vars",
        action="append",
        default=[],
        type=extra_variable,
        metavar="KEY=VALUE",
        help="a variable for the play, e.g. gpu_verify_quick=true (repeatable)",
    )
    add_report_options(parser)
    parser.add_argument("--quiet", action="store_true", help="hide the playbook's output")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # argparse exits on --help (0) and on wrong arguments (2)
        return int(stop.code or 0)
    try:  # the options' combination, as the role's validation would judge it (defaults for the options not given)
        fleet_report.check_history_settings(
            fleet_report.DEFAULT_HISTORY_KEEP if args.history_keep is None else args.history_keep,
            fleet_report.DEFAULT_REPEAT_FAILURES if args.repeat_failures is None else args.repeat_failures,
            fleet_report.DEFAULT_REPEAT_RUNS if args.repeat_runs is None else args.repeat_runs,
        )
    except fleet_report.InputError as error:
        return fail_without_report(f"{error} (--history-keep, --repeat-failures, --repeat-runs)")
    inventory = args.inventory.resolve()
    if not inventory.exists():
        return fail_without_report(f"the inventory {args.inventory} does not exist")
    report_dir = args.report_dir.resolve()
    report_path = report_dir / f"{fleet_report.DEFAULT_BASENAME}.json"
    previous_report = file_identity(report_path)
    run = PlaybookRun(
        inventory=inventory,
        limit=args.limit,
        extravars={
            **dict(args.extra_vars),
            REPORT_DIR_VARIABLE: str(report_dir),
            **{
                variable: getattr(args, option)
                for option, variable in REPORT_OPTIONS.items()
                if getattr(args, option) is not None
            },
        },
        check_mode=args.check,
        quiet=args.quiet,
    )
    try:
        outcome = run_playbook(run)
    except ImportError as error:
        return fail_without_report(
            f"{error}: run this script with the Python of the virtual environment "
            "that holds ansible-runner (.venv/bin/python)"
        )
    try:
        report = load_report(report_path, previous_report)
    except NoReport as error:
        return fail_without_report(f"{error} (ansible-runner status {outcome.status}, rc {outcome.rc})")
    print(fleet_report.render_terminal(report), flush=True)  # before the stderr summary, also in a shared log
    problems = node_problems(report, outcome.stats)
    if problems:
        print(
            f"gpufleet_verify: {len(problems)} node{'' if len(problems) == 1 else 's'} did not pass "
            f"(report: {report_dir / fleet_report.DEFAULT_BASENAME}.md):",
            file=sys.stderr,
        )
        for host, problem in problems.items():
            print(f"  {host}: {problem}", file=sys.stderr)
        return 1
    return 0


def fail_without_report(message: str) -> int:
    print(f"gpufleet_verify: no fleet report: {message}", file=sys.stderr)
    return 2


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime, size) of ``path``, None when it does not exist; the report is written by
    rename, so a report this run wrote has another identity than the one before the run."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_mtime_ns, status.st_size


def load_report(path: Path, previous_identity: tuple[int, int, int] | None) -> dict[str, Any]:
    """The fleet report this run wrote at ``path``; NoReport when there is none, or it is left from an earlier run."""
    identity = file_identity(path)
    if identity is None or identity == previous_identity:
        left_over = " (the file there is from an earlier run)" if identity else ""
        raise NoReport(f"playbooks/verify.yml did not write {path}{left_over}")
    try:
        report = json.loads(path.read_bytes())
    except ValueError as error:
        raise NoReport(f"{path} is not JSON: {error}") from error
    if (
        not isinstance(report, dict)
        or report.get("schema") != fleet_report.REPORT_SCHEMA
        or not isinstance(report.get("nodes"), list)
    ):
        raise NoReport(f"{path} is not a {fleet_report.REPORT_SCHEMA} report")
    if not report["nodes"]:
        raise NoReport(f"{path} lists no nodes (does --limit match a host of the inventory's gpu_nodes?)")
    return report


def node_problems(report: dict[str, Any], stats: dict[str, dict[str, int]]) -> dict[str, str]:
    """Every node that did not pass, with why, cross-checked with the run's per-host stats:
    a host ansible found unreachable ("dark") must be UNREACHABLE in the report, and every host
    the playbook ran on must be in it."""
    reported = {node["host"]: node for node in report["nodes"]}
    problems = {
        host: f"{node['verdict'].upper()}: {reasons_text(node)}"
        for host, node in reported.items()
        if node["verdict"] != "pass"
    }
    dark = {host for host, count in stats.get("dark", {}).items() if count}
    for host in sorted(dark | set(stats.get("processed", {})), key=fleet_report.natural_key):
        node = reported.get(host)
        if node is None:
            status = "unreachable" if host in dark else "ran"
            problems[host] = f"{status} in the playbook run, but absent from the report"
        elif host in dark and node["verdict"] != "unreachable":
            problems[host] = (
                f"unreachable in the playbook run, but {node['verdict'].upper()} in the report: {reasons_text(node)}"
            )
    return problems


def reasons_text(node: dict[str, Any]) -> str:
    return "; ".join(node["reasons"]) or "no reason given"


if __name__ == "__main__":
    sys.exit(main())
