#!/usr/bin/python3
"""Slurm's HealthCheckProgram for gpufleet: run gpufleet_check's quick tier on this node under a hard time
limit, drain the node when it fails, resume it when it passes again, but only a node gpufleet drained.

slurmd runs /usr/local/sbin/gpufleet-slurm-health-check (the role's wrapper, which calls this with the
role's settings) every HealthCheckInterval seconds on the nodes of HealthCheckNodeState, and once when
slurmd starts, as root, and kills it after 60 seconds (slurm.conf(5), HealthCheckProgram). The checks run
under coreutils' ``timeout`` well inside that (--timeout, at most 45 s), so that a check that hangs (a GPU
that does not answer nvidia-smi) never hangs slurmd (aws/aws-parallelcluster#6777 is such a prolog).

Decision (``decide``), the node's current drain reason read with
``sinfo --noheader --Node --nodes=<node> --states=DRAIN --format=%E`` (empty: not drained):

  the checks             node                               action
  fail                   not drained                        drain, Reason="gpufleet: <check> [<class>]: <detail>"
  fail                   drained by gpufleet, same reason   nothing
  fail                   drained by gpufleet, other reason  drain again with the new reason
  fail                   drained by anyone else             nothing: an administrator's drain is never touched
  pass                   drained by gpufleet                resume
  pass                   not drained / drained by others    nothing
  timed out              as a failure, reason "gpufleet: health check timed out after <n> s" (as NHC does)
  no report              as a failure, reason "gpufleet: health check could not run: <why>" (the checks
                         crashed, printed no JSON or a malformed one, the zipapp is missing)

"Drained by gpufleet" is a reason that starts with MARKER ("gpufleet: "); playbooks/upgrade-driver.yml's
"gpufleet driver upgrade to ..." is not one (no colon), so the health check leaves a rollout's drain alone.
<class> is the remediation class of the failed check's first finding (gpufleet_check's health.ACTION_CLASSES:
replace, drain, reboot, configure; "reboot" for a driver whose loaded module is not the installed one),
left out when the check carries none.

The node's name is SLURMD_NODENAME (slurmd sets it from 21.08 on), else the short host name, which is
slurmd's own default name and the NodeName the role writes (ansible_facts.hostname).

With --textfile-dir (node exporter's textfile collector; skipped when the directory does not exist) it
replaces gpufleet-slurm-health.prom there: gpufleet_slurm_drained{reason} (1 while gpufleet keeps the node
drained), gpufleet_slurm_health_check_passed and gpufleet_slurm_health_check_timestamp_seconds.

Exit 0 once the node's state is what the checks call for; 1 when Slurm could not be asked or told (sinfo or
scontrol failed: slurmd logs "health_check failed" with this program's output); 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

MARKER = "gpufleet: "
# gpufleet_check's health.ACTION_CLASSES (tests/unit keeps the two equal).
ACTION_CLASSES = ("replace", "drain", "reboot", "configure")
# Slurm kills the program after 60 s: the checks get at most this, the rest is for sinfo and scontrol.
MAX_TIMEOUT_S = 45
SLURM_COMMAND_TIMEOUT_S = 5
# coreutils timeout(1): 124 when the command timed out, 137 when it had to be killed (--kill-after).
TIMEOUT_CODES = (124, 137)
KILL_AFTER_S = 3
DETAIL_MAX_CHARS = 120
METRICS_FILE = "gpufleet-slurm-health.prom"
# slurmd 19.05 runs the program with an empty environment.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXIT_OK, EXIT_SLURM, EXIT_USAGE = 0, 1, 2


@dataclass
class Outcome:
    """What the checks said: healthy or not, and the drain reason when not."""

    healthy: bool
    reason: str = ""


@dataclass
class Action:
    """What to do with the node: "drain" (with reason), "resume" or "none", and why, in words."""

    kind: str
    reason: str = ""
    why: str = ""


def one_line(text: str, limit: int = DETAIL_MAX_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def check_action_class(check: dict[str, Any]) -> str:
    """The remediation class a failed check carries: its first failing finding's, else "reboot" for a check
    that says the driver needs one, else ""."""
    findings = [f for f in check.get("findings") or [] if isinstance(f, dict)]
    for finding in sorted(findings, key=lambda f: f.get("verdict") != "fail"):
        if finding.get("action_class") in ACTION_CLASSES:
            return finding["action_class"]
    return "reboot" if check.get("reboot_required") else ""


def judge_report(report: Any) -> Outcome:
    """The checks' JSON document (gpufleet-check/1) judged: its verdict, and for a failure the reason to drain
    with: the first failed check, its action class and its detail, and how many more failed."""
    if (
        not isinstance(report, dict)
        or report.get("verdict") not in ("pass", "fail")
        or not isinstance(report.get("checks"), list)
    ):
        return Outcome(False, MARKER + "health check could not run: its report has no verdict and checks")
    if report["verdict"] == "pass":
        return Outcome(True)
    failed = [c for c in report["checks"] if isinstance(c, dict) and c.get("verdict") == "fail"]
    if not failed:  # "nothing was checked: no GPU" and the like
        reasons = report.get("reasons") or ["failed"]
        return Outcome(False, MARKER + one_line(reasons[0]))
    first = failed[0]
    klass = check_action_class(first)
    more = f" (+{len(failed) - 1} more failed)" if len(failed) > 1 else ""
    label = f"{first.get('name', '?')}" + (f" [{klass}]" if klass else "")
    return Outcome(False, f"{MARKER}{label}: {one_line(first.get('detail', ''))}{more}")


def judge_run(returncode: int | None, stdout: str, stderr: str, timeout_s: int) -> Outcome:
    """The run of the checks judged: timed out (None, or timeout(1)'s codes), no JSON document, or its
    document. The verdict is read from the document, never from the exit code."""
    if returncode is None or returncode in TIMEOUT_CODES:
        return Outcome(False, f"{MARKER}health check timed out after {timeout_s} s")
    try:
        report = json.loads(stdout)
    except ValueError:
        why = one_line(stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {returncode}, no JSON report", 100)
        return Outcome(False, f"{MARKER}health check could not run: {why}")
    return judge_report(report)


def is_ours(reason: str | None) -> bool:
    return bool(reason) and str(reason).startswith(MARKER)


def decide(outcome: Outcome, drain_reason: str | None) -> Action:
    """The decision table of the module docstring; drain_reason is the node's current one, None when not drained."""
    if outcome.healthy:
        if is_ours(drain_reason):
            return Action("resume", why="passed; drained by gpufleet: resumed")
        if drain_reason:
            return Action("none", why=f"passed; drained by someone else ({drain_reason}): left alone")
        return Action("none", why="passed")
    if drain_reason and not is_ours(drain_reason):
        return Action(
            "none",
            outcome.reason,
            why=f"failed ({outcome.reason}); drained by someone else ({drain_reason}): left alone",
        )
    if drain_reason == outcome.reason:
        return Action("none", outcome.reason, why=f"failed ({outcome.reason}); already drained for it")
    return Action("drain", outcome.reason, why=f"failed: drained ({outcome.reason})")


def drain_reason_from_sinfo(stdout: str) -> str | None:
    """sinfo's %E for a node filtered with --states=DRAIN: its reason when it is drained or draining (one line
    per partition it is in), nothing when it is not; "none" is how sinfo prints a missing reason."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    return "" if lines[0] == "none" else lines[0]


def metrics_text(passed: bool, held_reason: str | None, now: float) -> str:
    """node exporter's textfile format; held_reason is gpufleet's drain reason while it holds the node
    drained, "" when it does not, None when Slurm could not be asked."""

    def label(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    lines = []
    if held_reason is not None:
        lines += [
            "# HELP gpufleet_slurm_drained 1 while gpufleet's Slurm health check keeps this node drained "
            "(reason: the drain reason), else 0.",
            "# TYPE gpufleet_slurm_drained gauge",
            f'gpufleet_slurm_drained{{reason="{label(held_reason)}"}} {1 if held_reason else 0}',
        ]
    lines += [
        "# HELP gpufleet_slurm_health_check_passed 1 when the last Slurm health check passed, else 0 "
        "(failed, timed out, or could not run).",
        "# TYPE gpufleet_slurm_health_check_passed gauge",
        f"gpufleet_slurm_health_check_passed {1 if passed else 0}",
        "# HELP gpufleet_slurm_health_check_timestamp_seconds When the last Slurm health check ran (Unix time).",
        "# TYPE gpufleet_slurm_health_check_timestamp_seconds gauge",
        f"gpufleet_slurm_health_check_timestamp_seconds {now:.3f}",
    ]
    return "\n".join(lines) + "\n"


def write_metrics(directory: str, text: str) -> None:
    """Replace METRICS_FILE in the textfile directory atomically (mode 0644); no directory, no file."""
    if not directory or not os.path.isdir(directory):
        return
    path = os.path.join(directory, METRICS_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def node_name(environ: dict[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


Runner = Callable[..., subprocess.CompletedProcess]


class SlurmError(RuntimeError):
    """sinfo or scontrol did not answer or refused."""


def slurm(run: Runner, argv: list[str]) -> str:
    try:
        done = run(argv, capture_output=True, text=True, timeout=SLURM_COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise SlurmError(f"{' '.join(argv[:3])}: exit {done.returncode}: {one_line(done.stderr or done.stdout, 200)}")
    return done.stdout


def run_checks(run: Runner, python: str, zipapp: str, check_args: list[str], timeout_s: int) -> Outcome:
    if not os.path.isfile(zipapp):
        return Outcome(False, f"{MARKER}health check could not run: {zipapp} is missing")
    argv = ["timeout", f"--kill-after={KILL_AFTER_S}", str(timeout_s), python, zipapp, "--json", *check_args]
    try:
        done = run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout_s + KILL_AFTER_S + 2)
    except subprocess.TimeoutExpired:
        return judge_run(None, "", "", timeout_s)
    except OSError as exc:
        return Outcome(False, f"{MARKER}health check could not run: {one_line(exc, 100)}")
    return judge_run(done.returncode, done.stdout, done.stderr, timeout_s)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpufleet-slurm-health-check",
        description=__doc__.split("\n\n", maxsplit=1)[0],
        epilog="Arguments after -- go to gpufleet_check (after --json).",
    )
    p.add_argument("--zipapp", required=True, help="gpufleet_check.pyz on this node")
    p.add_argument("--python", required=True, help="the interpreter to run it with (the PyTorch environment's)")
    p.add_argument("--fallback-python", default="/usr/bin/python3", help="used when --python is not executable")
    p.add_argument("--timeout", type=int, default=40, help=f"seconds the checks may take (1 to {MAX_TIMEOUT_S})")
    p.add_argument("--textfile-dir", default="", help="node exporter's textfile directory (skipped when absent)")
    p.add_argument(
        "--node", default="", help="the Slurm node name (default: SLURMD_NODENAME, else the short host name)"
    )
    p.add_argument("check_args", nargs="*", help="gpufleet_check's options")
    args = p.parse_args(argv)
    if not 1 <= args.timeout <= MAX_TIMEOUT_S:
        p.error(f"--timeout {args.timeout}: 1 to {MAX_TIMEOUT_S} seconds (Slurm kills the program after 60)")
    return args


def main(
    argv: Sequence[str] | None = None,
    run: Runner = subprocess.run,
    environ: dict[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> int:
    environ = dict(os.environ if environ is None else environ)
    environ.setdefault("PATH", DEFAULT_PATH)
    os.environ["PATH"] = environ["PATH"]
    try:
        args = parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return EXIT_OK if exc.code in (None, 0) else EXIT_USAGE  # argparse: 0 after --help, 2 on an error
    node = args.node or node_name(environ)
    python = args.python if os.access(args.python, os.X_OK) else args.fallback_python
    outcome = run_checks(run, python, args.zipapp, args.check_args, args.timeout)
    held: str | None = None
    code = EXIT_OK
    try:
        current = drain_reason_from_sinfo(
            slurm(run, ["sinfo", "--noheader", "--Node", f"--nodes={node}", "--states=DRAIN", "--format=%E"])
        )
        action = decide(outcome, current)
        if action.kind == "drain":
            slurm(run, ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={action.reason}"])
            held = action.reason
        elif action.kind == "resume":
            slurm(run, ["scontrol", "update", f"NodeName={node}", "State=RESUME"])
            held = ""
        else:
            held = current if is_ours(current) else ""
        print(f"gpufleet health check on {node}: {action.why}")
    except SlurmError as exc:
        print(
            f"gpufleet health check on {node}: {'passed' if outcome.healthy else outcome.reason}; "
            f"Slurm could not be asked or told: {exc}",
            file=sys.stderr,
        )
        code = EXIT_SLURM
    try:
        write_metrics(args.textfile_dir, metrics_text(outcome.healthy, held, clock()))
    except OSError as exc:
        print(f"gpufleet health check on {node}: metrics not written: {exc}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
