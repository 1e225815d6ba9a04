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
* files/gpufleet_report.py, the command that writes the report of a saved
  collector document (its usage and exit statuses are there).

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

The history and the comparison (issue 29; docs/gpu.md, "The fleet's memory"):
``write_run_report`` is a run's whole report for every caller. It keeps the run
in ``<out-dir>/history/fleet-history.jsonl`` (``record_history``: one JSON line
per run, "gpufleet-fleet-history/1", the last ``history_keep``, rewritten
atomically under a lock; a file that is not a history is set aside and named
in the warnings), names the **repeat offenders** (``repeat_offenders``: the
nodes that did not pass in k of their last n runs, each failing run's reasons,
"replace" or "drain" as the work) and the **outliers** (``outliers``: a figure
of ``FIGURES`` more than a fraction below the median of the nodes with the
same GPU model; "drain"), as the JSON's ``repeat_offenders``, ``outliers``,
``outlier_rule`` and ``history``, a section each in the Markdown and the
terminal text, and per node ``history_metrics`` (gpufleet_repeat_failures,
gpufleet_repeat_offender) for the play to write beside its gpufleet.prom.
The JUnit file is unchanged by them (an outlier or a repeat offender that
passed is not a failed testcase).

Standard library only: it runs with the controller's Ansible Python and
imports nothing of Ansible, so that the action plugin, the filter, the cron
entry point and the tests share this one copy. Its files are written with
gpufleet_check's own write_atomically (plugins/module_utils/gpufleet_check.py
imports the payload's modules on the controller).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import statistics
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

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
TABLE_HEADER = (
    "Node",
    "Verdict",
    "Driver",
    "CUDA",
    "torch",
    "torch's own cuDNN/NCCL",
    "system cuDNN/NCCL",
    "GPUs",
    "TFLOP/s (min)",
    "busbw GB/s",
    "Reason",
)
# The "Checks skipped" note names this many nodes per line, then counts the rest.
NOTE_MAX_HOSTS = 8
# Characters XML 1.0 cannot carry, even escaped (terminal control codes in a detail).
XML_INVALID_CHARACTERS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# The kinds of work a finding asks for (gpufleet_check's health.ACTION_CLASSES), in the report's order, and
# how the report says them.
ACTION_LABELS = {
    "replace": "replace the GPU",
    "drain": "drain and investigate",
    "reboot": "reboot",
    "configure": "fix the configuration",
}
# A node more than this fraction below its model's median is an outlier (gpu_verify_outlier_fraction;
# docs/gpu.md, "Outliers", says why 0.1), judged among at least this many nodes of the model with the figure.
DEFAULT_OUTLIER_FRACTION = 0.1
OUTLIER_MIN_NODES = 3
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


def collect_document(
    runs: Mapping[str, Any], gone: Any = (), inventory: str = "", playbook: str = "verify", generated: str | None = None
) -> dict[str, Any]:
    """The collector's document from every node's registered run (``runs``: host -> the registered result of
    gpu_verify's "Run the health checks") and the nodes that left the play before their checks ran."""
    if not isinstance(runs, Mapping):
        raise InputError(f"runs must be a mapping of host to its registered run, got {type(runs).__name__}")
    hosts: dict[str, Any] = {str(host): check_entry(run) for host, run in runs.items()}
    for host in gone or ():
        hosts.setdefault(str(host), {"result": None, "error": GONE_ERROR})
    return {
        "generated": generated or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "inventory": inventory,
        "playbook": playbook,
        "hosts": hosts,
    }


def metrics_not_written(runs: Mapping[str, Any]) -> dict[str, list[str]]:
    """{host: the lines in which its checks say the metrics file was not written}, only the hosts with some."""
    lines = {str(host): check_entry(run)["metrics_not_written"] for host, run in runs.items()}
    return {host: found for host, found in sorted(lines.items(), key=lambda item: natural_key(item[0])) if found}


# --- the report ---------------------------------------------------------------------------------


def build_report(
    doc: Any,
    outlier_fraction: float = DEFAULT_OUTLIER_FRACTION,
    extra_figures: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Summarise the collector's document: the fleet verdict, the counts, one entry per node, and the nodes
    whose measured figures are more than ``outlier_fraction`` below their model's fleet median (``outliers``;
    ``extra_figures``: more figures per host, see node_figures).

    Raises InputError when ``doc`` has no "hosts" object, or the fraction is not one; a bad node entry or
    result only fails that node. The history's fields (``history``, ``repeat_offenders``) are added by
    apply_history.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), dict):
        raise InputError('expected a JSON object with a "hosts" object (inventory hostname: {"result", "error"})')
    check_fraction(outlier_fraction)
    hosts = sorted(doc["hosts"].items(), key=lambda item: natural_key(item[0]))
    nodes = [build_node(host, entry) for host, entry in hosts]
    for node in nodes:
        node["figures"].update(extra_figure_entries((extra_figures or {}).get(node["host"])))
    judged = outliers(
        [
            {"host": node["host"], "model": node["gpu_model"], "gpus": node["gpus"], "figures": node["figures"]}
            for node in nodes
        ],
        outlier_fraction,
    )
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
        "outliers": judged["outliers"],
        "outlier_rule": {
            "fraction": outlier_fraction,
            "min_nodes": OUTLIER_MIN_NODES,
            "not_judged": judged["not_judged"],
        },
        "repeat_offenders": [],
        "history": None,
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
    builds = ", ".join(
        f"{version} ({named_hosts(hosts)})"
        for version, hosts in sorted(pinned.items(), key=lambda item: natural_key(item[0]))
    )
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
        "figures": node_figures(result),
        "recent_runs": None,  # apply_history: {"failed", "runs", "window"} of the node's last runs
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
            found.append(
                {
                    "check": check["name"],
                    **{
                        key: version_text(finding.get(key))
                        for key in ("gpu", "verdict", "signal", "action", "evidence")
                    },
                    "action_class": klass if klass in ACTION_LABELS else None,
                }
            )
    return found


def document_problems(result: Any) -> list[str]:
    """What keeps ``result`` from being a gpufleet-check/1 document; empty when it is one."""
    if not isinstance(result, dict):
        return [f"not a JSON object: {short_repr(result)}"]
    problems = []
    if result.get("schema") != CHECK_SCHEMA:
        problems.append(f'schema is {short_repr(result.get("schema"))}, expected "{CHECK_SCHEMA}"')
    if "verdict" not in result:
        problems.append("no verdict")
    elif result["verdict"] not in NODE_VERDICTS:
        problems.append(f'verdict {short_repr(result["verdict"])} is not "pass" or "fail"')
    checks = result.get("checks", [])
    if not isinstance(checks, list):
        problems.append(f"checks is not a list: {short_repr(checks)}")
    else:
        problems.extend(
            f"checks[{index}] is not a check (a name and a verdict of {', '.join(CHECK_VERDICTS)}): {short_repr(check)}"
            for index, check in enumerate(checks)
            if not is_check(check)
        )
    return problems


def node_reasons(result: dict[str, Any]) -> list[str]:
    """The node's own reasons; for a failed node that gave none, its failed checks' details."""
    reasons = result.get("reasons")
    if isinstance(reasons, list) and reasons:
        return [str(reason) for reason in reasons]
    if result["verdict"] == "fail":
        return [
            f"{check['name']}: {check.get('detail') or 'failed'}"
            for check in valid_checks(result)
            if check["verdict"] == "fail"
        ] or ["the node failed and gave no reason"]
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
    return text if len(text) <= limit else text[: limit - 1] + "…"


def natural_key(name: str) -> list[Any]:
    """Sort key that puts node-2 before node-10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


# --- measured figures and outliers --------------------------------------------------------------

# The figures the outlier rule compares, read from a node's checks: name -> the check whose "value" it is
# (or whose ``field``, when given), its unit, how the report says it, and what two nodes must share, besides
# their GPU model, to be compared (``basis``: fields of the check, or "gpus", the node's GPU count). Only a
# check that passed or warned gives a figure (a failed one is a failure already, and would pull its peers'
# median down). Figures from outside the node's checks (the smoke training's per-node throughput) come as
# build_report's ``extra_figures``.
FIGURES: dict[str, dict[str, Any]] = {
    "gemm_tflops": {"check": "gemm", "unit": "TFLOP/s", "label": "GEMM of the slowest GPU", "basis": ()},
    "memory_bandwidth_gbps": {
        "check": "memory_bandwidth",
        "unit": "GB/s",
        "label": "device memory bandwidth of the slowest GPU",
        "basis": ("size_mib",),
    },
    "host_copy_gbps": {
        "check": "memory_bandwidth",
        "field": "host_copy_min_gbps",
        "unit": "GB/s",
        "label": "slowest host<->device copy",
        "basis": ("size_mib",),
    },
    "allreduce_busbw_gbps": {
        "check": "allreduce_busbw",
        "unit": "GB/s",
        "label": "all-reduce bus bandwidth",
        "basis": ("world_size", "size_mib"),
    },
    "training_samples_per_s": {
        "check": "training",
        "unit": "samples/s",
        "label": "training throughput",
        "basis": ("gpus",),
    },
}
BASIS_WORDS = {"world_size": "{} GPUs", "size_mib": "{} MiB", "gpus": "{} GPUs"}
OUTLIER_ACTION = "drain"


def check_fraction(fraction: Any) -> None:
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction < 1:
        raise InputError(
            f"gpu_verify_outlier_fraction (--outlier-fraction) {fraction!r} is not a fraction below the "
            f"median (above 0, below 1; default {DEFAULT_OUTLIER_FRACTION})"
        )


def node_figures(result: Any) -> dict[str, dict[str, Any]]:
    """{figure: {"value", "unit", "label", "basis"}} of a node's result, per FIGURES: the checks that passed or
    warned with a finite value; ``basis`` is what a peer must share ("8 GPUs, 256 MiB"; "" for none)."""
    data = result if isinstance(result, dict) else {}
    gpus = len(data["gpus"]) if isinstance(data.get("gpus"), list) else None
    checks = {check["name"]: check for check in valid_checks(result)}
    figures = {}
    for name, spec in FIGURES.items():
        check = checks.get(spec["check"])
        field = spec.get("field", "value")
        value = finite_number(check.get(field)) if check and check["verdict"] in ("pass", "warn") else None
        if value is None:
            continue
        parts = [(key, gpus if key == "gpus" else check.get(key)) for key in spec["basis"]]
        unit = (check.get("unit") if field == "value" else None) or spec["unit"]
        figures[name] = {
            "value": value,
            "unit": unit,
            "label": spec["label"],
            "basis": ", ".join(BASIS_WORDS[key].format(part) for key, part in parts if part is not None),
        }
    return figures


def extra_figure_entries(entries: Any) -> dict[str, dict[str, Any]]:
    """Figures given from outside the checks, {name: {"value", "unit", "label", "basis"}}: those with a finite
    value, the others' fields as text ("" where absent)."""
    out = {}
    for name, entry in entries.items() if isinstance(entries, Mapping) else ():
        value = finite_number(entry.get("value")) if isinstance(entry, Mapping) else None
        if value is not None:
            out[str(name)] = {"value": value, **{key: str(entry.get(key) or "") for key in ("unit", "label", "basis")}}
    return out


def outliers(
    rows: list[dict[str, Any]], fraction: float = DEFAULT_OUTLIER_FRACTION, min_nodes: int = OUTLIER_MIN_NODES
) -> dict[str, list[dict[str, Any]]]:
    """The outlier rule: each node's figure against the median of that figure over the nodes of the same GPU
    model (and basis, node_figures), the node included; more than ``fraction`` below it is an outlier.

    ``rows``: [{"host", "model", "figures": {figure: {"value", "unit", "label", "basis"}}}]. Returns
    {"outliers": [{"host", "figure", "label", "value", "unit", "median", "model", "basis", "nodes", "below",
    "action_class", "action"}], "not_judged": [{"figure", "label", "model", "basis", "nodes", "hosts", "why"}]}:
    a group of fewer than ``min_nodes`` nodes, and the nodes of mixed or unnamed models, are not judged
    (named with why). A value equal to the floor is not an outlier; a figure a node lacks is not compared.
    """
    check_fraction(fraction)
    groups: dict[tuple[str, str, str], list[tuple[str, float, dict[str, Any]]]] = defaultdict(list)
    unjudged: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for row in rows:
        model = row.get("model")
        for name, figure in (row.get("figures") or {}).items():
            value = finite_number(figure.get("value"))
            if value is None:
                continue
            if not model:
                unjudged[name, "", "the GPU model is not named"].append(str(row["host"]))
            elif model.startswith("mixed: "):
                unjudged[name, model, "the node mixes GPU models"].append(str(row["host"]))
            else:
                groups[name, model, str(figure.get("basis") or "")].append((str(row["host"]), value, figure))
    flagged, not_judged = [], []
    for (name, model, basis), members in sorted(groups.items()):
        label = members[0][2].get("label") or name
        hosts = sorted((host for host, _value, _figure in members), key=natural_key)
        if len(members) < min_nodes:
            not_judged.append(
                {
                    "figure": name,
                    "label": label,
                    "model": model,
                    "basis": basis,
                    "nodes": len(members),
                    "hosts": hosts,
                    "why": f"fewer than {min_nodes} nodes of this model",
                }
            )
            continue
        median = statistics.median(value for _host, value, _figure in members)
        if median <= 0:
            continue
        for host, value, figure in members:
            if value < median * (1 - fraction):
                flagged.append(
                    {
                        "host": host,
                        "figure": name,
                        "label": label,
                        "value": value,
                        "unit": figure.get("unit") or "",
                        "median": median,
                        "model": model,
                        "basis": basis,
                        "nodes": len(members),
                        "below": round(1 - value / median, 4),
                        "action_class": OUTLIER_ACTION,
                        "action": ACTION_LABELS[OUTLIER_ACTION],
                    }
                )
    for (name, model, why), hosts in sorted(unjudged.items()):
        not_judged.append(
            {
                "figure": name,
                "label": FIGURES.get(name, {}).get("label", name),
                "model": model or None,
                "basis": "",
                "nodes": len(hosts),
                "hosts": sorted(hosts, key=natural_key),
                "why": why,
            }
        )
    flagged.sort(key=lambda entry: (natural_key(entry["host"]), entry["figure"]))
    return {"outliers": flagged, "not_judged": not_judged}


def outlier_line(entry: dict[str, Any]) -> str:
    """'node-3: GEMM of the slowest GPU 700.0 TFLOP/s, 12.6% below the median 801.0 of 4 NVIDIA H200 nodes
    → drain and investigate'."""
    basis = f" ({entry['basis']})" if entry.get("basis") else ""
    return (
        f"{entry['host']}: {entry['label']} {entry['value']:.1f} {entry['unit']}".rstrip()
        + f", {entry['below']:.1%} below the median {entry['median']:.1f} of {entry['nodes']} {entry['model']} "
        f"nodes{basis} → {entry['action']}"
    )


def not_judged_line(entry: dict[str, Any]) -> str:
    model = f" on {entry['model']}" if entry.get("model") else ""
    return f"{entry['label']}{model}: not judged, {entry['why']} ({entry['nodes']}: {named_hosts(entry['hosts'])})"


# --- node history and repeat offenders -----------------------------------------------------------

HISTORY_SCHEMA = "gpufleet-fleet-history/1"
# <report dir>/history/fleet-history.jsonl: one JSON line per verification run, the newest last.
HISTORY_DIR = "history"
HISTORY_FILE = "fleet-history.jsonl"
DEFAULT_HISTORY_KEEP = 20
DEFAULT_REPEAT_FAILURES = 2
DEFAULT_REPEAT_RUNS = 3
REPEAT_REPLACE = "replace"
REPEAT_INVESTIGATE = "drain"
# A reason kept in the history is cut to this many characters.
HISTORY_REASON_CHARS = 300
# The metrics of the history the play writes beside each node's gpufleet.prom (history_metrics).
HISTORY_METRICS_FILE = "gpufleet-history.prom"
HISTORY_METRICS: dict[str, tuple[str, str]] = {
    "gpufleet_repeat_failures": (
        "gauge",
        "Verification runs the node failed or was unreachable in, among its last "
        "runs (window) in the fleet report's history.",
    ),
    "gpufleet_repeat_offender": (
        "gauge",
        "1 when the node failed in at least threshold of its last window runs "
        "(the fleet report's repeat offenders), else 0.",
    ),
}


def check_history_settings(keep: Any, failures: Any, runs: Any) -> None:
    """The history's settings, each named with its fix (InputError)."""
    for name, value, least in (
        ("gpu_verify_history_keep", keep, 0),
        ("gpu_verify_repeat_failures", failures, 1),
        ("gpu_verify_repeat_runs", runs, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise InputError(f"{name} {value!r} is not a whole number of runs ({least} or more)")
    if failures > runs:
        raise InputError(
            f"gpu_verify_repeat_failures {failures} is more than gpu_verify_repeat_runs {runs}: a node "
            f"cannot fail in more runs than are looked at"
        )
    if keep and keep < runs:
        raise InputError(
            f"gpu_verify_history_keep {keep} keeps fewer runs than gpu_verify_repeat_runs {runs} looks "
            f"at: keep at least {runs} (or 0: no history)"
        )


def history_record(report: dict[str, Any]) -> dict[str, Any]:
    """This run as one line of the history: when, which playbook, and per node its verdict, reasons, failed
    checks (each with its reason and action class), GPU model and figures."""
    return {
        "schema": HISTORY_SCHEMA,
        "generated": report.get("generated"),
        "playbook": report.get("playbook"),
        "inventory": report.get("inventory"),
        "nodes": {str(node["host"]): node_record(node) for node in report.get("nodes", [])},
    }


def node_record(node: dict[str, Any]) -> dict[str, Any]:
    findings = node.get("findings") or []
    failed = []
    for check in valid_checks(node.get("result")):
        if check["verdict"] != "fail":
            continue
        found = [f for f in findings if f["check"] == check["name"] and f.get("verdict") == "fail"]
        classes = [klass for klass in ACTION_LABELS if any(f.get("action_class") == klass for f in found)]
        if not classes and check["name"] == "driver_version" and node.get("reboot_required"):
            classes = ["reboot"]
        reason = found[0].get("evidence") if found and found[0].get("evidence") else check.get("detail") or "failed"
        failed.append(
            {
                "check": check["name"],
                "reason": one_line(reason)[:HISTORY_REASON_CHARS],
                "action_class": classes[0] if classes else None,
            }
        )
    return {
        "verdict": node.get("verdict"),
        "reasons": [one_line(r)[:HISTORY_REASON_CHARS] for r in node.get("reasons") or []],
        "failed": failed,
        "model": node.get("gpu_model"),
        "figures": {name: figure["value"] for name, figure in (node.get("figures") or {}).items()},
    }


def read_history(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The runs of a history file, oldest first, and what is wrong with it (None when nothing): a line that is
    not JSON, or not a run of HISTORY_SCHEMA. The runs that could be read are returned either way; a
    missing file is an empty history."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], None
    except UnicodeDecodeError:
        return [], "not UTF-8 text"
    runs, problems = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            run = json.loads(line)
        except ValueError:
            problems.append(f"line {number} is not JSON")
            continue
        if not isinstance(run, dict) or run.get("schema") != HISTORY_SCHEMA or not isinstance(run.get("nodes"), dict):
            problems.append(f"line {number} is not a {HISTORY_SCHEMA} run")
            continue
        runs.append(run)
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        return runs, shown
    return runs, None


@contextlib.contextmanager
def history_lock(directory: Path) -> Iterator[None]:
    """One writer at a time (a cron run and a person's run): an exclusive lock on directory/.lock."""
    with open(directory / ".lock", "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record_history(
    report: dict[str, Any], directory: Path, keep: int = DEFAULT_HISTORY_KEEP, now: datetime | None = None
) -> dict[str, Any]:
    """Append this run to directory/HISTORY_FILE, keep the last ``keep`` runs, rewrite it atomically; returns
    {"file", "keep", "runs" (the history, oldest first, this run last), "warnings"}.

    A file that is not wholly a history is set aside (renamed to <file>.set-aside-<UTC time>, kept as it is)
    and said in "warnings"; the runs that could be read from it go on. A history that cannot be read or
    written is a warning too: the report is written all the same, without the history's verdicts.
    ``keep`` 0: no history (nothing read or written).
    """
    path = directory / HISTORY_FILE
    outcome: dict[str, Any] = {"file": str(path), "keep": keep, "runs": [], "warnings": []}
    if not keep:
        return outcome
    record = history_record(report)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with history_lock(directory):
            runs, problem = read_history(path)
            if problem:
                stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
                aside = path.with_name(f"{path.name}.set-aside-{stamp}")
                os.replace(path, aside)
                outcome["warnings"].append(
                    f"the history {path} is not a {HISTORY_SCHEMA} file ({problem}): set aside "
                    f"as {aside.name}, its {len(runs)} readable run(s) kept"
                )
            runs = (runs + [record])[-keep:]
            write_atomically(
                path, "".join(json.dumps(run, ensure_ascii=False, separators=(",", ":")) + "\n" for run in runs)
            )
    except OSError as error:
        outcome["warnings"].append(f"the history in {directory} was not kept this run: {error}")
        return {**outcome, "runs": []}
    outcome["runs"] = runs
    return outcome


def node_runs(runs: list[dict[str, Any]], host: str, window: int) -> list[dict[str, Any]]:
    """{"generated", "playbook", **the node's record} of the last ``window`` runs that include ``host``."""
    mine = [
        {"generated": run.get("generated"), "playbook": run.get("playbook"), **run["nodes"][host]}
        for run in runs
        if isinstance(run["nodes"].get(host), dict)
    ]
    return mine[-window:]


def repeat_offenders(
    runs: list[dict[str, Any]],
    failures: int = DEFAULT_REPEAT_FAILURES,
    window: int = DEFAULT_REPEAT_RUNS,
    hosts: Any = None,
) -> list[dict[str, Any]]:
    """The k-of-n rule: the nodes that did not pass (failed or unreachable) in at least ``failures`` of their
    last ``window`` runs of the history (the runs that include them: a --limit run counts only for its
    hosts), with each failing run's time, verdict, reasons and failed checks, and the work they ask for:
    "replace" (replace the GPU) when a failing run's check asks for it, else "drain" (drain and investigate).
    ``hosts``: only these (default: every host of the history)."""
    names = hosts if hosts is not None else {host for run in runs for host in run["nodes"]}
    found = []
    for host in sorted(names, key=natural_key):
        recent = node_runs(runs, str(host), window)
        failing = [run for run in recent if run.get("verdict") != "pass"]
        if len(failing) < failures:
            continue
        classes = {
            entry.get("action_class") for run in failing for entry in run.get("failed") or [] if isinstance(entry, dict)
        }
        klass = REPEAT_REPLACE if REPEAT_REPLACE in classes else REPEAT_INVESTIGATE
        found.append(
            {
                "host": str(host),
                "failed_runs": len(failing),
                "runs": len(recent),
                "window": window,
                "threshold": failures,
                "action_class": klass,
                "action": "replace the GPU" if klass == REPEAT_REPLACE else "investigate (drain and investigate)",
                "failures": [
                    {key: run.get(key) for key in ("generated", "playbook", "verdict", "reasons", "failed")}
                    for run in failing
                ],
            }
        )
    return found


def apply_history(
    report: dict[str, Any],
    history: dict[str, Any],
    failures: int = DEFAULT_REPEAT_FAILURES,
    window: int = DEFAULT_REPEAT_RUNS,
) -> dict[str, Any]:
    """The history's part of the report (record_history's outcome): ``history`` (file, runs kept, the rule),
    ``repeat_offenders`` among this run's nodes, each node's ``recent_runs`` ({"failed", "runs", "window"}),
    and the history's warnings among the report's."""
    if not history.get("keep"):
        return report  # no history kept: "history" stays None, as build_report left it
    runs = history.get("runs") or []
    hosts = [str(node["host"]) for node in report.get("nodes", [])]
    report["history"] = {
        "file": history.get("file"),
        "keep": history.get("keep"),
        "runs_kept": len(runs),
        "rule": {"failures": failures, "runs": window},
        "warnings": list(history.get("warnings") or []),
    }
    report["repeat_offenders"] = repeat_offenders(runs, failures, window, hosts) if runs else []
    for node in report.get("nodes", []):
        recent = node_runs(runs, str(node["host"]), window) if runs else []
        node["recent_runs"] = (
            {"failed": sum(run.get("verdict") != "pass" for run in recent), "runs": len(recent), "window": window}
            if runs
            else None
        )
    report["warnings"] = list(report.get("warnings") or []) + report["history"]["warnings"]
    return report


def repeat_offender_lines(report: dict[str, Any]) -> list[str]:
    """'node-2: failed 2 of its last 3 runs → replace the GPU' then one line per failing run with its reasons."""
    lines = []
    for entry in report.get("repeat_offenders") or []:
        lines.append(
            f"{entry['host']}: failed {entry['failed_runs']} of its last {entry['runs']} runs → {entry['action']}"
        )
        for run in entry.get("failures") or []:
            failed = [
                f"{item['check']}: {item['reason']}"
                + (f" ({ACTION_LABELS[item['action_class']]})" if item.get("action_class") in ACTION_LABELS else "")
                for item in run.get("failed") or []
                if isinstance(item, dict)
            ]
            why = "; ".join(failed or run.get("reasons") or ["no reason given"])
            lines.append(
                f"  {run.get('generated') or 'undated'} {str(run.get('verdict') or 'fail').upper()}: {one_line(why)}"
            )
    return lines


def history_metrics(report: dict[str, Any]) -> dict[str, str]:
    """{host: the node's history metrics in Prometheus' text format}, for every node of the report with a
    history: gpufleet_repeat_failures{window} and gpufleet_repeat_offender{window, threshold}."""
    history = report.get("history") or {}
    rule = history.get("rule") or {}
    offenders = {entry["host"] for entry in report.get("repeat_offenders") or []}
    out = {}
    for node in report.get("nodes", []):
        recent = node.get("recent_runs")
        if not recent:
            continue
        window, threshold = rule.get("runs", recent["window"]), rule.get("failures", DEFAULT_REPEAT_FAILURES)
        values = {
            "gpufleet_repeat_failures": (f'window="{window}"', recent["failed"]),
            "gpufleet_repeat_offender": (f'window="{window}",threshold="{threshold}"', int(node["host"] in offenders)),
        }
        text = []
        for name, (kind, help_text) in HISTORY_METRICS.items():
            labels, value = values[name]
            text += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"]
        out[str(node["host"])] = "\n".join(text) + "\n"
    return out


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
    lines.extend(history_section(report, markdown=True))
    lines.extend(skipped_checks_note(report))
    return "\n".join(lines) + "\n"


def history_section(report: dict[str, Any], markdown: bool) -> list[str]:
    """The repeat offenders (with each failing run's reasons) and the outliers (the Markdown adds the groups
    not judged), as Markdown list items or indented terminal lines; nothing for a section without entries."""
    out: list[str] = []
    history = report.get("history") or {}
    rule = history.get("rule") or {}
    offenders = repeat_offender_lines(report)
    if offenders:
        title = (
            f"Repeat offenders (failed in {rule.get('failures')} or more of their last {rule.get('runs')} runs, "
            f"history: {history.get('runs_kept')} runs)"
        )
        out += ["", f"**{title}**", ""] if markdown else ["", f"{title}:"]
        out += [
            (f"- {line}" if not line.startswith("  ") else f"  - {line.strip()}") if markdown else f"  {line}"
            for line in offenders
        ]
    flagged = [outlier_line(entry) for entry in report.get("outliers") or []]
    # The groups too small to judge: in the Markdown (and the JSON), the terminal shows only what was flagged.
    unjudged = [
        not_judged_line(entry) for entry in (report.get("outlier_rule") or {}).get("not_judged") or [] if markdown
    ]
    if flagged or unjudged:
        fraction = (report.get("outlier_rule") or {}).get("fraction", DEFAULT_OUTLIER_FRACTION)
        title = f"Outliers (more than {fraction:.0%} below the median of their GPU model)"
        out += ["", f"**{title}**", ""] if markdown else ["", f"{title}:"]
        out += [f"- {line}" if markdown else f"  {line}" for line in flagged or ["none"]]
        out += [f"- {line}" if markdown else f"  {line}" for line in unjudged]
    return out


def summary_line(report: dict[str, Any]) -> str:
    """The verdict line's counts: "3 nodes: 2 passed, 1 failed, 0 unreachable"."""
    summary = report.get("summary", {})
    nodes = summary.get("nodes", 0)
    return (
        f"{nodes} node{'' if nodes == 1 else 's'}: {summary.get('passed', 0)} passed, "
        f"{summary.get('failed', 0)} failed, {summary.get('unreachable', 0)} unreachable"
    )


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
    return [
        f"{len(hosts)} node{'' if len(hosts) == 1 else 's'}: {cause} ({', '.join(hosts)})"
        for cause, hosts in failure_groups(report)
    ]


def warning_lines(report: dict[str, Any]) -> list[str]:
    """The fleet's warnings ("warning: 2 driver builds pinned across the fleet: ...")."""
    warnings = report.get("warnings")
    return [f"warning: {warning}" for warning in warnings] if isinstance(warnings, list) else []


def action_lines(report: dict[str, Any]) -> list[str]:
    """'1 node to reboot: node-5': per action class (ACTION_LABELS' order), the nodes whose findings ask for
    it, passed or failed; none for a class no finding asks for."""
    lines = []
    for klass, label in ACTION_LABELS.items():
        hosts = [
            str(node.get("host", MISSING)) for node in report.get("nodes", []) if klass in (node.get("actions") or [])
        ]
        if hosts:
            lines.append(f"{len(hosts)} node{'' if len(hosts) == 1 else 's'} to {label}: {named_hosts(hosts)}")
    return lines


def lead_lines(report: dict[str, Any]) -> list[str]:
    """What follows the verdict line: the failures grouped by cause, the work the findings ask for, the
    repeat offenders and outliers (named; their section has the detail), then the fleet's warnings."""
    return failure_lines(report) + action_lines(report) + history_lead_lines(report) + warning_lines(report)


def history_lead_lines(report: dict[str, Any]) -> list[str]:
    """'1 repeat offender: node-2', '1 node below its model's median: node-3'."""
    lines = []
    offenders = [str(entry["host"]) for entry in report.get("repeat_offenders") or []]
    if offenders:
        lines.append(f"{len(offenders)} repeat offender{'' if len(offenders) == 1 else 's'}: {named_hosts(offenders)}")
    slow = sorted({str(entry["host"]) for entry in report.get("outliers") or []}, key=natural_key)
    if slow:
        lines.append(
            f"{len(slow)} node{'' if len(slow) == 1 else 's'} below {'its' if len(slow) == 1 else 'their'} "
            f"model's median: {named_hosts(slow)}"
        )
    return lines


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
    passed = [
        (host, [f for f in node.get("findings") or [] if f.get("action_class")])
        for host, node in nodes.items()
        if node.get("verdict") == "pass"
    ]
    passed = [(host, found) for host, found in passed if found]
    if passed:
        lines.append(
            f"- {len(passed)} node{'' if len(passed) == 1 else 's'} passed with findings that ask for work "
            f"({', '.join(host for host, _found in passed)})"
        )
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
    lines += [
        f"{finding['check']} ({finding.get('verdict') or MISSING}), {finding_line(finding)}"
        for finding in node.get("findings") or []
        if finding.get("action_class") and (finding["check"] not in shown or finding.get("verdict") != "fail")
    ]
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
    lines += history_section(report, markdown=False)
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
    """ "9.1.0 / 2.21.5": a node's cuDNN and NCCL versions, `none` when it has neither, MISSING for an absent one."""
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
        lines.append(
            f'- "{" ".join(detail.split())}" on {len(hosts)} node{"" if len(hosts) == 1 else "s"} '
            f"({named}): {', '.join(names)}"
        )
    return lines


# --- JUnit XML ----------------------------------------------------------------------------------


def render_junit(report: dict[str, Any]) -> str:
    """One <testsuite>: per node a testcase per check (classname = host); an unreachable node gets
    one "reachable" testcase with an <error>; a failed node none of whose checks failed (an invalid
    result, a reason outside the checks) gets a failed "verdict" testcase, so that it never shows green."""
    suite = ET.Element(
        "testsuite", {"name": JUNIT_SUITE_NAME, "tests": "0", "failures": "0", "errors": "0", "skipped": "0"}
    )
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


# --- files ---


def write_reports(report: dict[str, Any], out_dir: Path, basename: str = DEFAULT_BASENAME) -> list[Path]:
    """Write <basename>.json, .md and .xml in ``out_dir`` (created if needed), each replaced atomically."""
    contents = {
        f"{basename}.json": json.dumps(report, indent=2, ensure_ascii=False) + "\n",
        f"{basename}.md": render_markdown(report),
        f"{basename}.xml": render_junit(report),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_atomically(out_dir / name, text) for name, text in contents.items()]


def write_run_report(
    doc: Any,
    out_dir: Path,
    basename: str = DEFAULT_BASENAME,
    history_keep: int = DEFAULT_HISTORY_KEEP,
    repeat_failures: int = DEFAULT_REPEAT_FAILURES,
    repeat_runs: int = DEFAULT_REPEAT_RUNS,
    outlier_fraction: float = DEFAULT_OUTLIER_FRACTION,
    extra_figures: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[Path]]:
    """A run's whole report, for every caller (the action, this command): the settings checked (InputError
    before anything is written), the report built, the run kept in <out_dir>/history (record_history), the
    history's verdicts added, the three files written (OSError when they cannot be)."""
    check_history_settings(history_keep, repeat_failures, repeat_runs)
    report = build_report(doc, outlier_fraction, extra_figures)
    history = record_history(report, out_dir / HISTORY_DIR, history_keep)
    apply_history(report, history, repeat_failures, repeat_runs)
    return report, write_reports(report, out_dir, basename)


def write_atomically(path: Path, text: str) -> Path:
    """Readers see the old file or the new one, never a partial one; mode 0644 (mkstemp's 0600 would hide the
    report from a web server or a CI agent). gpufleet_check's own (its common module, imported from the collection
    as the filters import it). Imported here, on first write, so that this module alone still loads by its path
    (files/gpufleet_verify.py in a checkout without the collection link) for the schema and the table."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import write_atomically as write

    return write(path, text)


def file_basename(value: str) -> str:
    if not value or value in (".", "..") or "/" in value or os.sep in value:
        raise argparse.ArgumentTypeError(f"{value!r} is not a file name (no directory part)")
    return value
