#!/usr/bin/env python3
"""The fleet report of a verification run, in one place: from every node's health-check run to the files.

Everything about the report lives here, for every caller:

* the action plugin ``gpufleet.fleet.fleet_report`` (plugins/action/fleet_report.py),
  which roles/gpu_verify/tasks/report.yml runs once on the controller with every
  node's registered run: ``collect_document``, ``build_report``, ``write_reports``,
  ``render_terminal``, ``metrics_not_written``;
* the filter ``gpufleet.fleet.check_entry`` (a node's entry from its run, for the
  role's ``gpu_verify_result``): ``check_entry``;
* files/gpufleet_verify.py (cron, CI), which imports this module through the
  collection for the schema, the failure lines and the table: ``render_terminal``,
  ``REPORT_SCHEMA``, ``natural_key``, ``DEFAULT_BASENAME``;
* this file as a command, which writes the report of a saved collector document
  (below).

The collector's document, one per run (``collect_document`` makes it from the
registered runs; a node whose checks never ran is named with why)::

    {"generated": "2026-11-29T22:40:00Z", "inventory": "tests/lab/inventory", "playbook": "verify",
     "hosts": {"node-1": {"result": {...gpufleet-check/1...}, "error": null},
               "node-2": {"result": null, "error": "no answer: ..."}}}

and the report files, each written atomically (temporary file, then rename):

* ``<out-dir>/fleet-report.json``: the machine-readable report
  ("gpufleet-fleet-report/1"): the fleet verdict, counts, warnings, and one
  summary per node (versions, GPU count and model, slowest GEMM, all-reduce
  bandwidth, each check's verdict, the health checks' findings with their
  evidence and action class, the classes of work the node needs) with the
  node's raw result;
* ``<out-dir>/fleet-report.md``: a title, the verdict line, the failed nodes
  grouped by cause and the work the findings ask for, one table to read at a
  glance, the evidence of each failed check grouped by failure reason, the
  findings on nodes that passed, and a note on the checks that were skipped;
* ``<out-dir>/fleet-report.xml``: JUnit XML for CI dashboards, one testcase
  per node and check.

A node without a result is UNREACHABLE with the collector's error as its
reason (FAIL when the collector says it was reached); a result that is not a
gpufleet-check/1 document is a FAIL that says what is wrong with it.

The evidence: gpufleet_check's passive health checks (gpu_errors, pcie,
clocks, nvlink, xid, interconnect, dcgm) give each failure or warning as a
finding ``{"gpu", "verdict", "action", "evidence", "signal",
"action_class"}``; the action class is the kind of work it asks for:
``replace`` (replace the GPU), ``drain`` (drain and investigate), ``reboot``,
``configure`` (fix the configuration), or none (watch). The Markdown report
lists, per failure reason, each failed check of each node with its evidence
line (its findings, else the check's detail) and the action class; the lead
names the nodes per action class ("1 node to reboot: node-5"), passed or not.
The driver's ``reboot_required`` (a loaded module that is not the installed
driver) stays its own cause, "reboot required".

The driver: each node's entry carries driver_requested and driver_pinned, what
the operator asked the nvidia_driver role for ("latest", an exact version,
"default") and the exact release that run pinned (the node's local fact, read
by the checks' --driver-fact; null without one). The Driver cell adds
"(asked: latest)" to the installed version when something other than the
default was asked. A fleet must never mix builds: when the nodes' pinned
versions differ, the report's "warnings" say so ("2 driver builds pinned
across the fleet: 535.261.03 (node-1), 535.309.01 (node-2)"), shown under the
verdict line; the nodes' verdicts and the fleet's are not changed by it.

As a command (a saved document on stdin)::

    python3 plugins/module_utils/fleet_report.py --out-dir DIR [--basename fleet-report] < document.json

it prints render_terminal and exits 0 once the files are written, whatever the
nodes' verdicts; 2 when stdin is not the document above (nothing is written);
1 when the files cannot be written.

Standard library only: it runs with the controller's Ansible Python and
imports nothing of Ansible, so that the action plugin, the filter, the cron
entry point and the tests share this one copy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CHECK_SCHEMA = "gpufleet-check/1"
REPORT_SCHEMA = "gpufleet-fleet-report/1"
NODE_VERDICTS = ("pass", "fail")
CHECK_VERDICTS = ("pass", "fail", "warn", "skipped")
JUNIT_SUITE_NAME = "gpufleet-verify"
DEFAULT_BASENAME = "fleet-report"
MISSING = "—"
# torch's own cuDNN/NCCL (the builds its wheels bring, what torch reports) and the
# system's (the dpkg versions of libcudnn8 / libnccl2, which torch does not load)
# are separate columns.
TABLE_HEADER = ("Node", "Verdict", "Driver", "CUDA", "torch", "torch's own cuDNN/NCCL", "system cuDNN/NCCL", "GPUs",
                "TFLOP/s (min)", "busbw GB/s", "Reason")
# The "Checks skipped" note names this many nodes per line, then counts the rest.
NOTE_MAX_HOSTS = 8
# Characters XML 1.0 cannot carry, even escaped (terminal control codes in a detail).
XML_INVALID_CHARACTERS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# The kinds of work a finding asks for (gpufleet_check's health.ACTION_CLASSES), in the report's order, and
# how the report says them.
ACTION_LABELS = {"replace": "replace the GPU", "drain": "drain and investigate", "reboot": "reboot",
                 "configure": "fix the configuration"}
# Findings the evidence section shows per check of a node, then "and N more".
EVIDENCE_MAX_FINDINGS = 10
# What a node that left the play before its checks ran is reported with.
GONE_ERROR = "left the play before its checks ran (a task above failed on it)"
_TASK_FAILED = re.compile(r"^Task failed:\s*")


class InputError(ValueError):
    """The document on stdin is not the collector's document."""


# --- from the nodes' runs to the collector's document -------------------------------------------

def check_entry(run: Any) -> dict[str, Any]:
    """A node's entry for the fleet report from the registered result of its health-check run (gpu_verify):
    ``{result, error, unreachable, metrics_not_written}``.

    ``result`` is the JSON document the checks printed (schema gpufleet-check/1), else None with ``error``
    saying why there is none: ``no answer: <ssh's message>`` for an unreachable node (Ansible's ``Task
    failed:`` prefix dropped), ``the checks gave no result (killed by signal <n>: the node stopped, or ran
    out of memory)`` for an exit status above 128, else ``(rc <n>)``, each followed by the last line of
    stderr (or of the module's message). The verdict is read from the document, never from the exit code.
    ``metrics_not_written``: the stderr lines that say the metrics file could not be written.
    """
    run = run if isinstance(run, Mapping) else {}
    stdout = str(run.get("stdout") or "").strip()
    document: Any = None
    if stdout.startswith("{"):
        try:
            document = json.loads(stdout)
        except ValueError:
            document = None
    stderr_lines = [str(line) for line in (run.get("stderr_lines") or str(run.get("stderr") or "").splitlines())]
    metrics = [line for line in stderr_lines if "metrics not written" in line]
    unreachable = bool(run.get("unreachable", False))
    if isinstance(document, Mapping) and document.get("schema") == CHECK_SCHEMA:
        return {"result": dict(document), "error": None, "unreachable": unreachable, "metrics_not_written": metrics}
    message = _TASK_FAILED.sub("", str(run.get("msg") or "").strip())
    if unreachable:
        error = f"no answer: {message}"
    else:
        try:
            rc = int(run.get("rc", -1))
        except (TypeError, ValueError):
            rc = -1
        cause = f"killed by signal {rc - 128}: the node stopped, or ran out of memory" if rc > 128 else f"rc {rc}"
        stderr = str(run.get("stderr") or run.get("module_stderr") or "").strip()
        last = stderr.splitlines()[-1].strip() if stderr else ""
        error = f"the checks gave no result ({cause}): {last or message}"
    return {"result": None, "error": error, "unreachable": unreachable, "metrics_not_written": metrics}


def collect_document(runs: Mapping[str, Any], gone: Any = (), inventory: str = "", playbook: str = "verify",
                     generated: str | None = None) -> dict[str, Any]:
    """The collector's document from every node's registered run (``runs``: host -> the registered result of
    gpu_verify's "Run the health checks") and the nodes that left the play before their checks ran."""
    if not isinstance(runs, Mapping):
        raise InputError(f"runs must be a mapping of host to its registered run, got {type(runs).__name__}")
    hosts: dict[str, Any] = {str(host): check_entry(run) for host, run in runs.items()}
    for host in gone or ():
        hosts.setdefault(str(host), {"result": None, "error": GONE_ERROR})
    return {"generated": generated or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "inventory": inventory, "playbook": playbook, "hosts": hosts}


def metrics_not_written(runs: Mapping[str, Any]) -> dict[str, list[str]]:
    """{host: the lines in which its checks say the metrics file was not written}, only the hosts with some."""
    lines = {str(host): check_entry(run)["metrics_not_written"] for host, run in runs.items()}
    return {host: found for host, found in sorted(lines.items(), key=lambda item: natural_key(item[0])) if found}


# --- the report ---------------------------------------------------------------------------------

def build_report(doc: Any) -> dict[str, Any]:
    """Summarise the collector's document: the fleet verdict, the counts and one entry per node.

    Raises InputError when ``doc`` has no "hosts" object; a bad node entry or
    result only fails that node.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), dict):
        raise InputError('expected a JSON object with a "hosts" object (inventory hostname: {"result", "error"})')
    hosts = sorted(doc["hosts"].items(), key=lambda item: natural_key(item[0]))
    nodes = [build_node(host, entry) for host, entry in hosts]
    verdicts = Counter(node["verdict"] for node in nodes)
    return {
        "schema": REPORT_SCHEMA,
        "generated": doc.get("generated"),
        "inventory": doc.get("inventory"),
        "playbook": doc.get("playbook"),
        # A run that verified no node has not shown that the fleet works.
        "verdict": "pass" if nodes and verdicts["pass"] == len(nodes) else "fail",
        "summary": {
            "nodes": len(nodes),
            "passed": verdicts["pass"],
            "failed": verdicts["fail"],
            "unreachable": verdicts["unreachable"],
        },
        "warnings": fleet_warnings(nodes),
        "nodes": nodes,
    }


def fleet_warnings(nodes: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the fleet as a whole without failing a node: more than one pinned driver build."""
    pinned: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        if node.get("driver_pinned"):
            pinned[node["driver_pinned"]].append(str(node["host"]))
    if len(pinned) < 2:
        return []
    builds = ", ".join(f"{version} ({named_hosts(hosts)})" for version, hosts in
                       sorted(pinned.items(), key=lambda item: natural_key(item[0])))
    return [f"{len(pinned)} driver builds pinned across the fleet: {builds}"]


def named_hosts(hosts: list[str]) -> str:
    """'node-1, node-2', or past NOTE_MAX_HOSTS '120 nodes: node-1, ..., node-8 and 112 more'."""
    if len(hosts) <= NOTE_MAX_HOSTS:
        return ", ".join(hosts)
    return f"{len(hosts)} nodes: {', '.join(hosts[:NOTE_MAX_HOSTS])} and {len(hosts) - NOTE_MAX_HOSTS} more"


def build_node(host: str, entry: Any) -> dict[str, Any]:
    """One node's summary from its collector entry {"result": <check JSON or null>, "error": <str or null>,
    "unreachable": <bool, optional>}. A node without a result is "unreachable" unless the collector says it
    was reached (the checks ran but gave no result: then it failed)."""
    if not isinstance(entry, dict):
        return node_summary(host, "fail", [f"the collector's entry is not an object: {short_repr(entry)}"], None)
    result = entry.get("result")
    if result is None:
        error = entry.get("error")
        reason = str(error) if error else "no result, and the collector gave no error"
        verdict = "fail" if entry.get("unreachable") is False else "unreachable"
        return node_summary(host, verdict, [reason], None)
    problems = document_problems(result)
    if problems:
        return node_summary(host, "fail", [f"invalid {CHECK_SCHEMA} result: {'; '.join(problems)}"], result)
    return node_summary(host, result["verdict"], node_reasons(result), result)


def node_summary(host: str, verdict: str, reasons: list[str], result: Any) -> dict[str, Any]:
    """The report's entry for a node; every field read from ``result`` is None where it is absent or malformed."""
    data = result if isinstance(result, dict) else {}
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    gpus = [gpu for gpu in data["gpus"] if isinstance(gpu, dict)] if isinstance(data.get("gpus"), list) else None
    check_values = {check["name"]: check.get("value") for check in valid_checks(result)}
    findings = node_findings(result)
    return {
        "host": host,
        "verdict": verdict,
        "reasons": reasons,
        "reboot_required": data["reboot_required"] if isinstance(data.get("reboot_required"), bool) else None,
        "driver": version_text(versions.get("driver_installed")),
        "driver_loaded": version_text(versions.get("driver_loaded")),
        "driver_requested": version_text(versions.get("driver_requested")),  # the nvidia_driver role's fact
        "driver_pinned": version_text(versions.get("driver_pinned")),
        "cuda": version_text(versions.get("cuda")),
        "torch": version_text(versions.get("torch")),
        "cudnn": version_text(versions.get("cudnn")),  # torch's own
        "nccl": version_text(versions.get("nccl")),
        "system_cudnn": version_text(versions.get("system_cudnn")),  # the system's packages (dpkg)
        "system_nccl": version_text(versions.get("system_nccl")),
        "gpus": len(gpus) if gpus is not None else None,
        "gpu_model": gpu_model(gpus or []),
        "tflops_min": finite_number(check_values.get("gemm")),
        "busbw_gbps": finite_number(check_values.get("allreduce_busbw")),
        "checks": {check["name"]: check["verdict"] for check in valid_checks(result)},
        "findings": findings,
        "actions": [klass for klass in ACTION_LABELS if any(f["action_class"] == klass for f in findings)],
        "result": result,
    }


def node_findings(result: Any) -> list[dict[str, Any]]:
    """The health checks' findings of a result, each with its check: {"check", "gpu", "verdict", "signal",
    "action", "action_class", "evidence"} (strings, None where absent; an unknown action class is None)."""
    found = []
    for check in valid_checks(result):
        for finding in check.get("findings") if isinstance(check.get("findings"), list) else []:
            if not isinstance(finding, dict):
                continue
            klass = finding.get("action_class")
            found.append({"check": check["name"], **{key: version_text(finding.get(key)) for key in
                                                     ("gpu", "verdict", "signal", "action", "evidence")},
                          "action_class": klass if klass in ACTION_LABELS else None})
    return found


def document_problems(result: Any) -> list[str]:
    """What keeps ``result`` from being a gpufleet-check/1 document; empty when it is one."""
    if not isinstance(result, dict):
        return [f"not a JSON object: {short_repr(result)}"]
    problems = []
    if result.get("schema") != CHECK_SCHEMA:
        problems.append(f"schema is {short_repr(result.get('schema'))}, expected \"{CHECK_SCHEMA}\"")
    if "verdict" not in result:
        problems.append("no verdict")
    elif result["verdict"] not in NODE_VERDICTS:
        problems.append(f"verdict {short_repr(result['verdict'])} is not \"pass\" or \"fail\"")
    checks = result.get("checks", [])
    if not isinstance(checks, list):
        problems.append(f"checks is not a list: {short_repr(checks)}")
    else:
        problems.extend(f"checks[{index}] is not a check (a name and a verdict of {', '.join(CHECK_VERDICTS)}): "
                        f"{short_repr(check)}" for index, check in enumerate(checks) if not is_check(check))
    return problems


def node_reasons(result: dict[str, Any]) -> list[str]:
    """The node's own reasons; for a failed node that gave none, its failed checks' details."""
    reasons = result.get("reasons")
    if isinstance(reasons, list) and reasons:
        return [str(reason) for reason in reasons]
    if result["verdict"] == "fail":
        return [f"{check['name']}: {check.get('detail') or 'failed'}" for check in valid_checks(result)
                if check["verdict"] == "fail"] or ["the node failed and gave no reason"]
    return []


def is_check(check: Any) -> bool:
    return isinstance(check, dict) and isinstance(check.get("name"), str) and check.get("verdict") in CHECK_VERDICTS


def valid_checks(result: Any) -> list[dict[str, Any]]:
    """The well-formed entries of a result's "checks" list (none for a result that is not an object)."""
    checks = result.get("checks") if isinstance(result, dict) else None
    return [check for check in checks if is_check(check)] if isinstance(checks, list) else []


def gpu_model(gpus: list[dict[str, Any]]) -> str | None:
    """The GPUs' common model name, "mixed: 1× A, 7× B" (by name) when they differ, None when none is named."""
    names = Counter(gpu["name"].strip() for gpu in gpus if isinstance(gpu.get("name"), str) and gpu["name"].strip())
    if len(names) <= 1:
        return next(iter(names), None)
    return "mixed: " + ", ".join(f"{count}× {name}" for name, count in sorted(names.items()))


def version_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def finite_number(value: Any) -> float | int | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def short_repr(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def natural_key(name: str) -> list[Any]:
    """Sort key that puts node-2 before node-10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


# --- Markdown -----------------------------------------------------------------------------------

def render_markdown(report: dict[str, Any]) -> str:
    """The whole Markdown report: title with the date, verdict line, context, table, skipped checks."""
    lines = [
        f"# GPU fleet verification, {report.get('generated') or 'undated'}",
        "",
        f"**{str(report.get('verdict', 'fail')).upper()}**: {summary_line(report)}",
        "",
        *([f"- {line}" for line in lead_lines(report)] + [""] if lead_lines(report) else []),
        f"Inventory `{report.get('inventory') or MISSING}`, playbook `{report.get('playbook') or MISSING}`.",
        "",
        render_table(report),
    ]
    lines.extend(evidence_section(report))
    lines.extend(skipped_checks_note(report))
    return "\n".join(lines) + "\n"


def summary_line(report: dict[str, Any]) -> str:
    """The verdict line's counts: "3 nodes: 2 passed, 1 failed, 0 unreachable"."""
    summary = report.get("summary", {})
    nodes = summary.get("nodes", 0)
    return (f"{nodes} node{'' if nodes == 1 else 's'}: {summary.get('passed', 0)} passed, "
            f"{summary.get('failed', 0)} failed, {summary.get('unreachable', 0)} unreachable")


def failure_cause(node: dict[str, Any]) -> str:
    """What a node that did not pass has, in the words shared by the nodes with the same cause.

    A due reboot explains the rest (a driver/library mismatch fails more checks
    than driver_version), so it comes before the failed checks.
    """
    if node.get("verdict") == "unreachable":
        return "unreachable"
    if node.get("reboot_required"):
        return "reboot required"
    failed = sorted(name for name, verdict in (node.get("checks") or {}).items() if verdict == "fail")
    if failed:
        return "failed " + ", ".join(failed)
    if node.get("result") is None:
        return "no result"
    return "failed"


def failure_groups(report: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """[(cause, hosts)] of the nodes that did not pass, the largest group first, hosts in inventory order."""
    groups: dict[str, list[str]] = defaultdict(list)
    for node in report.get("nodes", []):
        if node.get("verdict") != "pass":
            groups[failure_cause(node)].append(str(node.get("host", MISSING)))
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))


def failure_lines(report: dict[str, Any]) -> list[str]:
    """'2 nodes: reboot required (gpu-node-17, gpu-node-63)': one line per cause, every host named."""
    return [f"{len(hosts)} node{'' if len(hosts) == 1 else 's'}: {cause} ({', '.join(hosts)})"
            for cause, hosts in failure_groups(report)]


def warning_lines(report: dict[str, Any]) -> list[str]:
    """The fleet's warnings ("warning: 2 driver builds pinned across the fleet: ...")."""
    warnings = report.get("warnings")
    return [f"warning: {warning}" for warning in warnings] if isinstance(warnings, list) else []


def action_lines(report: dict[str, Any]) -> list[str]:
    """'1 node to reboot: node-5': per action class (ACTION_LABELS' order), the nodes whose findings ask for
    it, passed or failed; none for a class no finding asks for."""
    lines = []
    for klass, label in ACTION_LABELS.items():
        hosts = [str(node.get("host", MISSING)) for node in report.get("nodes", []) if klass in (node.get("actions") or [])]
        if hosts:
            lines.append(f"{len(hosts)} node{'' if len(hosts) == 1 else 's'} to {label}: {named_hosts(hosts)}")
    return lines


def lead_lines(report: dict[str, Any]) -> list[str]:
    """What follows the verdict line: the failures grouped by cause, the work the findings ask for, then the
    fleet's warnings."""
    return failure_lines(report) + action_lines(report) + warning_lines(report)


def evidence_section(report: dict[str, Any]) -> list[str]:
    """Per failure reason (failure_groups' order), each node's failed checks with their evidence line: each
    finding ("GPU 0 (bus): evidence [action] (action class)") or, for a check without findings, its detail;
    a node without a failed check, its reasons. Then the findings of the nodes that passed, when they ask for
    work (a pending row remap: reboot)."""
    nodes = {str(node.get("host", MISSING)): node for node in report.get("nodes", [])}
    lines: list[str] = []
    for cause, hosts in failure_groups(report):
        lines.append(f"- {len(hosts)} node{'' if len(hosts) == 1 else 's'}: {cause} ({', '.join(hosts)})")
        for host in hosts:
            lines += [f"  - {host}: {line}" for line in node_evidence(nodes[host])]
    passed = [(host, [f for f in node.get("findings") or [] if f.get("action_class")])
              for host, node in nodes.items() if node.get("verdict") == "pass"]
    passed = [(host, found) for host, found in passed if found]
    if passed:
        lines.append(f"- {len(passed)} node{'' if len(passed) == 1 else 's'} passed with findings that ask for work "
                     f"({', '.join(host for host, _ in passed)})")
        for host, found in passed:
            lines += [f"  - {host}: {finding['check']}, {finding_line(finding)}" for finding in found]
    return ["", "**Evidence, by failure reason**", "", *lines] if lines else []


def node_evidence(node: dict[str, Any]) -> list[str]:
    """The evidence lines of a node that did not pass (see evidence_section), then its other findings that ask
    for work (a pending row remap beside a failed Xid check), marked with their check's verdict."""
    failed = [check for check in valid_checks(node.get("result")) if check["verdict"] == "fail"]
    lines = [] if failed else [one_line(reason) for reason in node.get("reasons") or ["no reason given"]]
    for check in failed:
        found = [f for f in node.get("findings") or [] if f["check"] == check["name"] and f.get("verdict") == "fail"]
        if not found:
            lines.append(f"{check['name']}: {one_line(check.get('detail') or 'failed')}")
            continue
        lines += [f"{check['name']}, {finding_line(finding)}" for finding in found[:EVIDENCE_MAX_FINDINGS]]
        if len(found) > EVIDENCE_MAX_FINDINGS:
            lines.append(f"{check['name']}: and {len(found) - EVIDENCE_MAX_FINDINGS} more findings (fleet-report.json)")
    shown = {check["name"] for check in failed}
    lines += [f"{finding['check']} ({finding.get('verdict') or MISSING}), {finding_line(finding)}"
              for finding in node.get("findings") or []
              if finding.get("action_class") and (finding["check"] not in shown or finding.get("verdict") != "fail")]
    return lines


def finding_line(finding: dict[str, Any]) -> str:
    """'GPU 0 (00000000:53:00.0): row remap pending: ... [reboot] → reboot': subject, evidence, action, class."""
    klass = finding.get("action_class")
    text = f"{finding.get('gpu') or MISSING}: {finding.get('evidence') or MISSING}"
    if finding.get("action"):
        text += f" [{finding['action']}]"
    return one_line(text + (f" → {ACTION_LABELS[klass]}" if klass in ACTION_LABELS else ""))


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


def render_terminal(report: dict[str, Any]) -> str:
    """What a terminal shows: the verdict, the failures grouped by cause, the warnings, then one line per node."""
    lines = [f"{str(report.get('verdict', 'fail')).upper()}: {summary_line(report)}"]
    lines += [f"  {line}" for line in lead_lines(report)]
    return "\n".join(lines + ["", render_table(report)])


def render_table(report: dict[str, Any]) -> str:
    """One row per node; columns padded so that the text reads as a table before rendering too."""
    rows = [TABLE_HEADER] + [table_row(node) for node in report.get("nodes", [])]
    widths = [max(len(row[column]) for row in rows) for column in range(len(TABLE_HEADER) - 1)]

    def line(cells: tuple[str, ...]) -> str:
        padded = [cell.ljust(width) for cell, width in zip(cells, widths)] + [cells[-1]]
        return "| " + " | ".join(padded) + " |"

    separator = "|" + "|".join("-" * (width + 2) for width in widths) + "|" + "-" * (len(TABLE_HEADER[-1]) + 2) + "|"
    return "\n".join([line(rows[0]), separator] + [line(row) for row in rows[1:]])


def table_row(node: dict[str, Any]) -> tuple[str, ...]:
    driver = node.get("driver") or MISSING
    loaded = node.get("driver_loaded")
    if loaded and loaded != node.get("driver"):
        driver += f" (loaded {loaded})"
    requested = node.get("driver_requested")
    if requested and requested != "default":
        driver += f" (asked: {requested})"
    cells = (
        node.get("host", MISSING),
        str(node.get("verdict", "fail")).upper(),
        driver,
        node.get("cuda") or MISSING,
        node.get("torch") or MISSING,
        library_pair(node, "cudnn", "nccl", none="none (no CUDA)" if torch_without_cuda(node) else MISSING),
        library_pair(node, "system_cudnn", "system_nccl", none="not installed"),
        MISSING if node.get("gpus") is None else str(node["gpus"]),
        decimal(node.get("tflops_min")),
        decimal(node.get("busbw_gbps")),
        "; ".join(node.get("reasons") or []) or MISSING,
    )
    return tuple(markdown_cell(cell) for cell in cells)


def torch_without_cuda(node: dict[str, Any]) -> bool:
    """torch was found and is a CPU-only build (no CUDA, hence no cuDNN or NCCL of its own)."""
    return bool(node.get("torch")) and not node.get("cuda")


def library_pair(node: dict[str, Any], cudnn: str, nccl: str, none: str) -> str:
    """"9.1.0 / 2.21.5": a node's cuDNN and NCCL versions, `none` when it has neither, MISSING for an absent one."""
    if not node.get(cudnn) and not node.get(nccl):
        return none if node.get("result") is not None else MISSING
    return f"{node.get(cudnn) or MISSING} / {node.get(nccl) or MISSING}"


def decimal(value: Any) -> str:
    return MISSING if finite_number(value) is None else f"{value:.1f}"


def markdown_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def skipped_checks_note(report: dict[str, Any]) -> list[str]:
    """'"no GPU" on 2 nodes (node-2, node-3): gemm, allreduce_busbw': the skipped checks, grouped by reason."""
    hosts_by_skip: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)
    for node in report.get("nodes", []):
        checks_by_detail: dict[str, list[str]] = defaultdict(list)
        for check in valid_checks(node.get("result")):
            if check["verdict"] == "skipped":
                checks_by_detail[str(check.get("detail") or "no reason given")].append(check["name"])
        for detail, names in checks_by_detail.items():
            hosts_by_skip[detail, tuple(names)].append(node.get("host", MISSING))
    if not hosts_by_skip:
        return []
    lines = ["", "**Checks skipped**", ""]
    for (detail, names), hosts in hosts_by_skip.items():
        named = ", ".join(hosts[:NOTE_MAX_HOSTS])
        if len(hosts) > NOTE_MAX_HOSTS:
            named += f" and {len(hosts) - NOTE_MAX_HOSTS} more"
        lines.append(f"- \"{' '.join(detail.split())}\" on {len(hosts)} node{'' if len(hosts) == 1 else 's'} "
                     f"({named}): {', '.join(names)}")
    return lines


# --- JUnit XML ----------------------------------------------------------------------------------

def render_junit(report: dict[str, Any]) -> str:
    """One <testsuite>: per node a testcase per check (classname = host); an unreachable node gets
    one "reachable" testcase with an <error>; a failed node none of whose checks failed (an invalid
    result, a reason outside the checks) gets a failed "verdict" testcase, so that it never shows green."""
    suite = ET.Element("testsuite", {"name": JUNIT_SUITE_NAME, "tests": "0", "failures": "0", "errors": "0",
                                     "skipped": "0"})
    if report.get("generated"):
        suite.set("timestamp", str(report["generated"]))
    outcomes: Counter[str] = Counter()
    for node in report.get("nodes", []):
        host = str(node.get("host", MISSING))
        reasons = "; ".join(node.get("reasons") or []) or "no reason given"
        if node.get("verdict") == "unreachable":
            add_outcome(testcase(suite, host, "reachable"), "error", reasons)
            outcomes["errors"] += 1
            continue
        check_failed = False
        for check in valid_checks(node.get("result")):
            case = testcase(suite, host, check["name"])
            detail = str(check.get("detail") or "")
            if check["verdict"] == "fail":
                add_outcome(case, "failure", detail or f"{check['name']} failed", measurement(check))
                outcomes["failures"] += 1
                check_failed = True
            elif check["verdict"] == "skipped":
                add_outcome(case, "skipped", detail or "skipped")
                outcomes["skipped"] += 1
            elif check["verdict"] == "warn":
                ET.SubElement(case, "system-out").text = xml_text(f"warn: {detail}\n{measurement(check)}".strip())
        if node.get("verdict") != "pass" and not check_failed:
            add_outcome(testcase(suite, host, "verdict"), "failure", reasons)
            outcomes["failures"] += 1
    suite.set("tests", str(len(suite.findall("testcase"))))
    for outcome in ("failures", "errors", "skipped"):
        suite.set(outcome, str(outcomes[outcome]))
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def testcase(suite: ET.Element, host: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", {"classname": xml_text(host), "name": xml_text(name)})


def add_outcome(case: ET.Element, tag: str, message: str, text: str = "") -> None:
    element = ET.SubElement(case, tag, {"message": xml_text(message)})
    if text:
        element.text = xml_text(text)


def measurement(check: dict[str, Any]) -> str:
    """What a check measured, "value: 412.0 TFLOP/s, threshold: 494.5"; empty when it measured nothing."""
    if check.get("value") is None:
        return ""
    unit = f" {check['unit']}" if check.get("unit") else ""
    text = f"value: {short_repr(check['value'], 400)}{unit}"
    return text + (f", threshold: {short_repr(check['threshold'], 200)}" if check.get("threshold") is not None else "")


def xml_text(text: str) -> str:
    return XML_INVALID_CHARACTERS.sub("\ufffd", text)


# --- files and command line ---------------------------------------------------------------------

def write_reports(report: dict[str, Any], out_dir: Path, basename: str = DEFAULT_BASENAME) -> list[Path]:
    """Write <basename>.json, .md and .xml in ``out_dir`` (created if needed), each replaced atomically."""
    contents = {
        f"{basename}.json": json.dumps(report, indent=2, ensure_ascii=False) + "\n",
        f"{basename}.md": render_markdown(report),
        f"{basename}.xml": render_junit(report),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_atomically(out_dir / name, text) for name, text in contents.items()]


def write_atomically(path: Path, text: str) -> Path:
    """Readers see the old file or the new one, never a partial one."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide the report from a web server or a CI agent
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def file_basename(value: str) -> str:
    if not value or value in (".", "..") or "/" in value or os.sep in value:
        raise argparse.ArgumentTypeError(f"{value!r} is not a file name (no directory part)")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Write the fleet report (JSON, Markdown, JUnit XML) from the "
                                                 "verification document on stdin; print the Markdown table.")
    parser.add_argument("--out-dir", metavar="DIR", required=True, type=Path, help="directory for the three report files")
    parser.add_argument("--basename", metavar="NAME", default=DEFAULT_BASENAME, type=file_basename,
                        help=f"file name without extension (default: {DEFAULT_BASENAME})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = build_report(json.loads(sys.stdin.buffer.read()))
    except ValueError as error:  # not JSON, not UTF-8, or not the collector's document
        print(f"fleet_report.py: unreadable input, nothing written: {error}", file=sys.stderr)
        return 2
    try:
        write_reports(report, args.out_dir, args.basename)
    except OSError as error:
        print(f"fleet_report.py: cannot write the report in {args.out_dir}: {error}", file=sys.stderr)
        return 1
    print(render_terminal(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
