"""``dcgmi diag -r <level> -j``: its JSON document, read per test and per GPU, and judged.

DCGM's diagnostic prints one JSON document whose shape changed with DCGM 4
(NVIDIA's release notes, "Deprecations and breaking changes"; facebookresearch/gcm
pull 38 reads both):

DCGM 3 and earlier  ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests":
                    [{"name", "results": [{"gpu_ids": "0" | "gpu_id": "0" | none (every
                    GPU), "status": "Pass", "info": str, "warnings": [...]}]}]}]}}``
                    (microsoft/VirtualClient Examples/DCGMI/DCGMIDiag_r2/_r3_results.json;
                    NVIDIA/DCGM issue 139, "gpu_id")
DCGM 4              ``{"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name",
                    "results": [{"entity_group": "GPU", "entity_id": 0, "status", "info":
                    [str, ...], "warnings": [{"warning", "error_id", ...}]}], "test_summary":
                    {"status"}}]}]}, "entity_groups": [...], "metadata": {"version", ...}}``
                    (NVIDIA/DCGM testing/python3/dcgm_diag_schema.json; issue 215, a DCGM 4
                    run on 8 GPUs); ``"runtime_error"`` when the run did not happen.

NVIDIA says the JSON "has no published stable schema, so release-pin and test CLI
consumers" (docs.nvidia.com/datacenter/dcgm/latest/reference/diagnostics/errors.html):
``parse_dcgm_json`` accepts both shapes and refuses a document it cannot read, naming why.
A status is read case-insensitively: Pass, Fail, Warn, Skip, "Not Run". ``judge_dcgm``:
a Fail -> fail; a Warn -> warn; Skip/Not Run are listed, not findings; no test at all ->
not judged. The levels (dcgmi-diag(1)): 1 quick deployment checks "normally lasting
seconds", 2 "approximately two minutes", 3 "approximately 15 minutes".

Standard library only, nothing of the package.
"""

from __future__ import annotations

import json
import re
from typing import Any

STATUSES = {
    "pass": "Pass",
    "fail": "Fail",
    "warn": "Warn",
    "warning": "Warn",
    "skip": "Skip",
    "skipped": "Skip",
    "not run": "Not Run",
    "notrun": "Not Run",
}
LEVEL_SECONDS = {1: "seconds", 2: "about 2 minutes", 3: "about 15 minutes"}
DEFAULT_TIMEOUT_S = {1: 300, 2: 900, 3: 2700}  # each well above the level's normal duration


def status_word(text: Any) -> str:
    """A result's status as Pass / Fail / Warn / Skip / Not Run; anything else is kept as given (and is
    not a pass)."""
    raw = str(text or "").strip()
    return STATUSES.get(raw.lower(), raw or "unknown")


def result_gpus(result: dict[str, Any]) -> list[str]:
    """The GPUs a result is for: DCGM 4's entity_id (entity_group GPU), DCGM 3's gpu_ids "0,1" /
    gpu_id; ["all"] when it names none (DCGM 3's deployment tests cover every GPU)."""
    if "entity_id" in result:
        group = str(result.get("entity_group", "GPU"))
        return [str(result["entity_id"]) if group.upper() == "GPU" else f"{group} {result['entity_id']}"]
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None or str(ids).strip() == "":
        return ["all"]
    return [part.strip() for part in str(ids).split(",") if part.strip()]


def messages(value: Any, key: str) -> list[str]:
    """DCGM's info (a string in 3, a list in 4) or warnings ([{"warning": str}] or strings) as strings."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, dict):
            text = item.get(key) or item.get("warning") or item.get("info")
            if text:
                out.append(str(text))
        elif str(item).strip():
            out.append(str(item))
    return out


def parse_test(test: dict[str, Any], category: str = "") -> dict[str, Any]:
    """One test of the document: {"category", "name", "summary" (DCGM 4's test_summary status or None),
    "results": [{"gpu", "status", "info": [...], "warnings": [...]}]}."""
    results = []
    for result in test.get("results") or []:
        if not isinstance(result, dict):
            continue
        for gpu in result_gpus(result):
            results.append(
                {
                    "gpu": gpu,
                    "status": status_word(result.get("status")),
                    "info": messages(result.get("info"), "info"),
                    "warnings": messages(result.get("warnings"), "warning"),
                }
            )
    summary = test.get("test_summary")
    return {
        "category": category,
        "name": str(test.get("name", "?")),
        "summary": status_word(summary.get("status")) if isinstance(summary, dict) and summary.get("status") else None,
        "results": results,
    }


def parse_dcgm_json(text: str) -> dict[str, Any]:
    """The document -> {"schema": "dcgm3" | "dcgm4", "version", "driver", "runtime_error", "tests":
    [parse_test(...)]}. Text before the document (dcgmi's "Successfully ran diagnostic for group.")
    is skipped. Raises ValueError when there is no document or neither shape's key."""
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON document in dcgmi's output: {text.strip()[:120] or 'empty'}")
    try:
        doc = json.loads(text[start:])
    except ValueError as exc:
        raise ValueError(f"dcgmi's JSON does not parse: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError("dcgmi's JSON is not an object")
    if "DCGM Diagnostic" in doc:
        schema, body = "dcgm4", doc["DCGM Diagnostic"]
    elif "DCGM GPU Diagnostic" in doc:
        schema, body = "dcgm3", doc["DCGM GPU Diagnostic"]
    else:
        raise ValueError(
            f"neither 'DCGM Diagnostic' (DCGM 4) nor 'DCGM GPU Diagnostic' (DCGM 3) in dcgmi's JSON "
            f"(keys: {', '.join(map(str, doc)) or 'none'})"
        )
    if not isinstance(body, dict):
        raise ValueError("dcgmi's diagnostic section is not an object")
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    tests = []
    for category in body.get("test_categories") or []:
        if isinstance(category, dict):
            for test in category.get("tests") or []:
                if isinstance(test, dict):
                    tests.append(parse_test(test, str(category.get("category", ""))))
    return {
        "schema": schema,
        "version": metadata.get("version") or body.get("version"),
        "driver": metadata.get("Driver Version Detected") or doc.get("Driver Version Detected"),
        "runtime_error": body.get("runtime_error") or doc.get("runtime_error"),
        "tests": tests,
    }


def judge_dcgm(parsed: dict[str, Any]) -> dict[str, Any]:
    """{"verdict", "findings": [{"gpu", "verdict", "action", "evidence", "test", "signal": "dcgm_test",
    "action_class": "drain" for a Fail, None}], "tests": {name: status},
    "counts": {status: n}}: a Fail fails, a Warn warns (see the module docstring)."""
    findings, statuses, counts = [], {}, {}
    for test in parsed["tests"]:
        seen = [r["status"] for r in test["results"]] + ([test["summary"]] if test["summary"] else [])
        ran = [s for s in seen if s not in ("Skip", "Not Run")]
        if "Fail" in seen or "Warn" in seen:
            status = "Fail" if "Fail" in seen else "Warn"
        elif ran:
            status = "Pass" if all(s == "Pass" for s in ran) else next(s for s in ran if s != "Pass")
        else:
            status = seen[0] if seen else "unknown"
        statuses[test["name"]] = status
        counts[status] = counts.get(status, 0) + 1
        for result in test["results"]:
            if result["status"] in ("Fail", "Warn"):
                why = "; ".join(result["warnings"] or result["info"]) or "no message"
                failed = result["status"] == "Fail"
                findings.append(
                    {
                        "gpu": f"GPU {result['gpu']}",
                        "verdict": result["status"].lower(),
                        "action": "drain: see the DCGM error" if failed else "watch",
                        "evidence": f"{test['name']}: {result['status']}: {why[:300]}",
                        "test": test["name"],
                        "signal": "dcgm_test",
                        "action_class": "drain" if failed else None,
                    }
                )
        if test["summary"] in ("Fail", "Warn") and not any(r["status"] == test["summary"] for r in test["results"]):
            findings.append(
                {
                    "gpu": "all",
                    "verdict": test["summary"].lower(),
                    "action": "see the DCGM log",
                    "evidence": f"{test['name']}: test summary {test['summary']}",
                    "test": test["name"],
                    "signal": "dcgm_test",
                    "action_class": "drain" if test["summary"] == "Fail" else None,
                }
            )
    verdicts = {f["verdict"] for f in findings}
    unknown = [name for name, status in statuses.items() if status not in ("Pass", "Fail", "Warn", "Skip", "Not Run")]
    verdict = "fail" if "fail" in verdicts else "warn" if "warn" in verdicts or unknown else "pass"
    return {"verdict": verdict, "findings": findings, "tests": statuses, "counts": counts, "unknown": unknown}


def mig_refusal(gpus: list[dict[str, Any]]) -> str:
    """Why dcgmi diag is refused here ("" when it is not): GPUs in MIG mode, from the -q records."""
    partitioned = [
        f"GPU {g['index']} ({g['bus_id']})"
        for g in gpus
        if (g.get("mig") or {}).get("current") and g["mig"]["current"].lower() == "enabled"
    ]
    if not partitioned:
        return ""
    return (
        f"refused: MIG mode is enabled on {', '.join(partitioned)}; the diagnostic's hardware tests need "
        "whole GPUs (run it with MIG disabled)"
    )


def command(level: int, dcgmi: str = "dcgmi") -> list[str]:
    return [dcgmi, "diag", "-r", str(level), "-j"]


def connection_problem(output: str) -> str:
    """dcgmi's complaint when it reached no host engine, else ""."""
    match = re.search(
        r"(Unable to connect to host engine[^\n]*|Error: unable to establish a connection[^\n]*|"
        r"Host engine connection invalid[^\n]*)",
        output,
        re.IGNORECASE,
    )
    return match.group(1).strip() if match else ""
