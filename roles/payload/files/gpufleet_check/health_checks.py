"""The passive health checks and DCGM's diagnostic: where their inputs come from, and their verdicts.

Each check reads its input (a command's output or sysfs, or a saved copy given
with a ``--*-file`` option), hands it to a pure parser and judgement (health,
xid, dcgm, profiles) and returns check_result with ``findings`` (each ``{"gpu",
"verdict", "action", "evidence"}``). Without a GPU on the machine a check says
"no GPU" (a failure with --require-gpus), unless a saved input or an expectation
(``--expect-ib-ports``, ``--expect-peermem``) is given: then it is judged. Where
its tool is absent it says "skipped: not installed"; where nvidia-smi fails,
"skipped ... (see nvidia_smi)", which fails on it already.

``gpu_errors``    nvidia-smi -q -x: remapped rows, retired pages, ECC
                  (``--max-ecc-errors``, ``--max-corrected-ecc``)
``pcie``          nvidia-smi -q -x: link width and generation (``--pcie-gen-policy``)
``clocks``        nvidia-smi -q -x: clock event reasons, temperature, MIG mode
                  (``--expect-mig``)
``nvlink``        nvidia-smi nvlink --status and -e, and the Fabric Manager state of
                  nvidia-smi -q -x (``--nvlink-max-errors``)
``xid``           the kernel log (journalctl -k, else dmesg): Xid and SXid events of the
                  last ``--xid-window-hours`` (``--xid-drain``, ``--xid-ignore``)
``interconnect``  /sys/class/infiniband ports and nvidia_peermem (``--expect-ib-ports``,
                  ``--ib-min-rate``, ``--ib-link-layer``, ``--expect-peermem``)
``dcgm``          dcgmi diag -r ``--dcgm-level`` -j under ``--dcgm-timeout`` seconds;
                  refused on MIG-partitioned GPUs

The judgements and their sources are in health's, xid's and dcgm's docstrings.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Tuple

from . import dcgm, health, profiles, xid
from .common import check_result, first_lines, no_gpu
from .facts import run_nvidia_smi

KERNEL_LOG_TIMEOUT_S = 60
# What a check on nvidia-smi -q's records returns to smi_check: findings, summary, findings_result's keywords.
SmiJudgement = Tuple[List[Dict[str, Any]], str, Dict[str, Any]]
SmiJudge = Callable[[Any, List[Dict[str, Any]]], SmiJudgement]


# --------------------------------------------------------------------------- inputs


def read_saved(path: str) -> tuple[str | None, str]:
    """(text, "") of a saved output, or (None, why not)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(), ""
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"


def smi_details(args: argparse.Namespace) -> tuple[list[dict[str, Any]] | None, str, str]:
    """(GPU records, "", source) from --smi-query-file or ``nvidia-smi -q -x``; (None, why not, source)."""
    if args.smi_query_file:
        text, error = read_saved(args.smi_query_file)
        source = args.smi_query_file
    else:
        code, output = run_nvidia_smi("-q", "-x")
        source = "nvidia-smi -q -x"
        if code is None:
            return None, output, source
        if code != 0:
            return None, f"nvidia-smi -q -x failed (rc {code}): {first_lines(output) or 'no output'}", source
        text, error = output, ""
    if text is None:
        return None, error, source
    try:
        return health.parse_smi_query(text), "", source
    except ValueError as exc:
        return None, f"{source}: {exc}", source


def nvlink_outputs(args: argparse.Namespace) -> tuple[str | None, str | None, str]:
    """(nvlink --status text, nvlink -e text or None, why the status is missing)."""
    if args.nvlink_status_file:
        status, error = read_saved(args.nvlink_status_file)
        errors = read_saved(args.nvlink_errors_file)[0] if args.nvlink_errors_file else None
        return status, errors, error
    code, output = run_nvidia_smi("nvlink", "--status")
    if code is None:
        return None, None, output
    if code != 0 and "inactive" not in output.lower():
        return None, None, f"nvidia-smi nvlink --status failed (rc {code}): {first_lines(output) or 'no output'}"
    err_code, err_output = run_nvidia_smi("nvlink", "-e")
    return output, err_output if err_code == 0 else None, ""


def run_command(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of argv; exit code None when the program is absent, -1 on timeout."""
    binary = shutil.which(argv[0])
    if binary is None:
        return None, "", f"{argv[0]} not found on PATH"
    try:
        proc = subprocess.run(
            [binary, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            errors="replace",
            check=False,
        )
    except subprocess.TimeoutExpired:
        return -1, "", f"{' '.join(argv)} did not finish within {timeout:g} s"
    except OSError as exc:
        return -1, "", f"{argv[0]} could not run: {exc}"
    return proc.returncode, proc.stdout, proc.stderr


def kernel_log(args: argparse.Namespace, now: datetime) -> tuple[str | None, str, list[str]]:
    """(the kernel log's text, where it came from, the failed attempts): --kernel-log-file, else
    ``journalctl -k`` (ISO timestamps, since the window's start), else ``dmesg --time-format iso``."""
    if args.kernel_log_file:
        text, error = read_saved(args.kernel_log_file)
        return text, args.kernel_log_file, [error] if error else []
    tried = []
    journal = ["journalctl", "-k", "-o", "short-iso-precise", "--no-pager", "-q"]
    if args.xid_window_hours:
        journal += ["--since", f"@{int(now.timestamp() - args.xid_window_hours * 3600)}"]
    code, out, err = run_command(journal, KERNEL_LOG_TIMEOUT_S)
    # Without the rights journalctl exits 0 with no kernel line and a hint on stderr ("You are
    # currently not seeing messages from other users and the system"): not a clean log.
    if code == 0 and not any(text in err.lower() for text in ("insufficient permissions", "not seeing messages")):
        return out, "journalctl -k", tried
    tried.append(err.strip().splitlines()[0] if err.strip() else f"journalctl rc {code}")
    code, out, err = run_command(["dmesg", "--time-format", "iso"], KERNEL_LOG_TIMEOUT_S)
    if code == 0:
        return out, "dmesg --time-format iso", tried
    tried.append(err.strip().splitlines()[0] if err.strip() else f"dmesg rc {code}")
    return None, "", tried


# --------------------------------------------------------------------------- shared


def findings_result(
    name: str,
    found: list[dict[str, Any]],
    summary: str,
    value: Any = None,
    unit: str | None = None,
    threshold: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """A check's result from its findings: fail / warn / pass, the findings first in the detail. A finding
    whose action class is "reboot" (a pending row remap or retired page) says so in its action_class, which
    the report counts in its "actions" (and the metric gpufleet_action_required); the report's
    reboot_required (and gpufleet_reboot_required) stays the driver's."""
    verdict = health.verdict_of(found)
    detail = "; ".join(part for part in (health.describe(found), summary) if part)
    return check_result(name, verdict, detail, value=value, unit=unit, threshold=threshold, findings=found, **extra)


def needs_smi(name: str, probe: Any) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None]:
    """(GPU records, None) or (None, the result to return: no GPU, or skipped with the reason)."""
    if not probe.args.smi_query_file and not probe.gpu_present:
        return None, no_gpu(name, probe)
    gpus, error, _source = probe.smi_details
    if gpus is None:
        return None, check_result(name, "skipped", f"{error} (see nvidia_smi)")
    if not gpus:
        return None, check_result(name, "skipped", "nvidia-smi -q lists no GPU (see nvidia_smi)")
    return gpus, None


def models(gpus: list[dict[str, Any]], table: dict[str, dict[str, Any]]) -> str:
    """ "8 x H100 80GB HBM3 (profile H100 80GB HBM3)", or "... (unknown model: no per-SKU figures)"."""
    seen: dict[tuple[str, str], int] = {}
    for gpu in gpus:
        key = (gpu["name"] or "?", health.gpu_profile(gpu, table)[0])
        seen[key] = seen.get(key, 0) + 1
    unknown = "unknown model: no per-SKU figures, conservative floors"
    return ", ".join(
        f"{n} x {name} ({unknown if key == profiles.DEFAULT_PROFILE else 'profile ' + key})"
        for (name, key), n in seen.items()
    )


# --------------------------------------------------------------------------- checks


def smi_check(name: str) -> Callable[[SmiJudge], Callable[[Any], dict[str, Any]]]:
    """A check on nvidia-smi -q's GPU records (gpu_errors, pcie, clocks): without them its result is needs_smi's;
    with them, findings_result of what the decorated function returns for (probe, gpus): its findings, the
    summary, and findings_result's threshold and per_gpu."""

    def wrap(judge: SmiJudge) -> Callable[[Any], dict[str, Any]]:
        @functools.wraps(judge)
        def check(probe: Any) -> dict[str, Any]:
            gpus, early = needs_smi(name, probe)
            if early:
                return early
            found, summary, extra = judge(probe, gpus)
            return findings_result(name, found, summary, value=len(found), unit="findings", **extra)

        return check

    return wrap


@smi_check("gpu_errors")
def check_gpu_errors(probe: Any, gpus: list[dict[str, Any]]) -> SmiJudgement:
    """Remapped rows, retired pages and ECC errors of every GPU (nvidia-smi -q -x)."""
    args = probe.args
    found = health.judge_gpu_errors(gpus, args.max_ecc_errors, args.max_corrected_ecc)
    per_gpu = [
        {
            "gpu": health.gpu_label(g),
            "ecc_volatile": g["ecc"]["volatile"],
            "ecc_aggregate": g["ecc"]["aggregate"],
            "remapped_rows": g["remapped_rows"],
            "retired_pages": g["retired_pages"],
        }
        for g in gpus
    ]
    summary = f"{len(gpus)} GPU(s) read: {models(gpus, probe.profile_table)}"
    return found, summary, {"threshold": args.max_ecc_errors, "per_gpu": per_gpu}


@smi_check("pcie")
def check_pcie(probe: Any, gpus: list[dict[str, Any]]) -> SmiJudgement:
    """Each GPU's PCIe link against its SKU's floor and its own maximum."""
    found = health.judge_pcie(gpus, probe.profile_table, probe.args.pcie_gen_policy)
    links = ", ".join(
        sorted(
            {
                f"Gen{g['pcie']['gen_current']} x{g['pcie']['width_current']} of "
                f"Gen{g['pcie']['gen_max']} x{g['pcie']['width_max']}"
                for g in gpus
            }
        )
    )
    summary = f"{len(gpus)} GPU(s): {links}; {models(gpus, probe.profile_table)}"
    return found, summary, {"per_gpu": [{"gpu": health.gpu_label(g), **g["pcie"]} for g in gpus]}


@smi_check("clocks")
def check_clocks(probe: Any, gpus: list[dict[str, Any]]) -> SmiJudgement:
    """Active clock event (throttle) reasons, temperature against the slowdown threshold, MIG mode."""
    expect_mig = probe.args.expect_mig
    found = health.judge_clocks(gpus, expect_mig)
    active = sorted({reason for g in gpus for reason, on in g["clock_reasons"].items() if on})
    temps = [g["temperature"]["gpu"] for g in gpus if g["temperature"]["gpu"] is not None]
    summary = f"{len(gpus)} GPU(s); active reasons: {', '.join(active) or 'none'}"
    summary += f"; hottest {max(temps):g} C" if temps else ""
    summary += f"; MIG {', '.join(sorted({str(g['mig']['current']) for g in gpus}))} (expected: {expect_mig})"
    per_gpu = [
        {
            "gpu": health.gpu_label(g),
            "clock_reasons": g["clock_reasons"],
            "temperature": g["temperature"],
            "mig": g["mig"],
        }
        for g in gpus
    ]
    return found, summary, {"threshold": expect_mig, "per_gpu": per_gpu}


def check_nvlink(probe: Any) -> dict[str, Any]:
    """Every NVLink up at its SKU's count and speed, error counters, and Fabric Manager's state."""
    name, args = "nvlink", probe.args
    if not args.nvlink_status_file and not args.smi_query_file and not probe.gpu_present:
        return no_gpu(name, probe)
    smi_gpus = probe.smi_details[0] or []
    status_text, errors_text, error = nvlink_outputs(args)
    status = health.parse_nvlink_status(status_text) if status_text is not None else []
    errors = health.parse_nvlink_errors(errors_text) if errors_text else {}
    # NVLink joins GPUs to each other (or to NVSwitches): on a node with one GPU it carries nothing, and a
    # hypervisor that passes one SXM GPU through shows none of its links (the H200 of
    # tests/gpu/device-check.sh, 2026-12-04: an empty nvlink --status). The profile's link count is then
    # not expected; links that are listed are still judged.
    multi_gpu = len(smi_gpus) >= 2 or len(status) >= 2
    found = health.judge_nvlink(
        status, errors, smi_gpus, probe.profile_table, args.nvlink_max_errors, expect_count=multi_gpu
    )
    found += health.judge_fabric(smi_gpus, probe.profile_table)
    # A GPU whose profile has NVLinks must be listed with them, unless MIG partitions it (NVLink is not
    # used in MIG mode: DCGM 2.0.15 release notes, "NVLink is not supported when in MIG mode" on A100).
    expects = [
        g
        for g in smi_gpus
        if multi_gpu
        and profiles.figure(health.gpu_profile(g, probe.profile_table)[1], "nvlink_links")
        and (g["mig"]["current"] or "").lower() != "enabled"
    ]
    listed = {g["index"] for g in status}
    if status_text is not None:
        for gpu in expects:
            if gpu["index"] not in listed:
                key, profile = health.gpu_profile(gpu, probe.profile_table)
                found.append(
                    health.finding(
                        gpu,
                        "fail",
                        "drain: check the NVLink/NVSwitch",
                        f"nvidia-smi nvlink --status lists no NVLink, the {key} has "
                        f"{profiles.figure(profile, 'nvlink_links')}",
                        signal="nvlink_links",
                        action_class="drain",
                    )
                )
    fabric = sorted({str(g["fabric"]["state"]) for g in smi_gpus})
    if status_text is None:
        if not found and not expects:
            return check_result(name, "skipped", f"{error} (see nvidia_smi)")
        found.append(
            health.finding(
                "node",
                "fail" if expects else "warn",
                "check nvidia-smi",
                f"NVLink status unreadable: {error}",
                signal="nvlink_status",
                action_class="drain" if expects else None,
            )
        )
    links = sum(len(g["links"]) for g in status)
    if status_text is not None and not links and not expects and not found:
        if not multi_gpu and smi_gpus:
            return check_result(
                name,
                "skipped",
                f"one GPU ({models(smi_gpus, probe.profile_table)}): NVLink joins GPUs, none listed and none expected",
                value=0,
                unit="links",
            )
        return check_result(
            name,
            "skipped",
            f"no NVLink on these GPUs ({len(status)} GPU(s) listed, none with links)",
            value=0,
            unit="links",
        )
    up = sum(1 for g in status for s in g["links"].values() if s is not None)
    summary = (
        f"{up}/{links} NVLinks up on {len(status)} GPU(s)"
        + (f"; error counters read for {len(errors)} GPU(s)" if errors else "; no error counters")
        + f"; Fabric Manager state: {', '.join(fabric) if smi_gpus else 'not read'}"
    )
    counters = [
        {"gpu": gpu, "link": link, "counter": counter, "value": count}
        for gpu, per_link in sorted(errors.items())
        for link, named in sorted(per_link.items())
        for counter, count in named.items()
    ]
    return findings_result(
        name,
        found,
        summary,
        value=up,
        unit="links",
        threshold=args.nvlink_max_errors,
        per_gpu=[{"gpu": g["index"], "name": g["name"], "links": g["links"]} for g in status],
        error_counters=counters,
    )


def integer_list(text: str) -> list[int]:
    return [int(part) for part in text.replace(",", " ").split()] if text else []


def check_xid(probe: Any) -> dict[str, Any]:
    """Xid and SXid events of the kernel log in the window, classed by NVIDIA's Xid catalog."""
    name, args = "xid", probe.args
    if not args.kernel_log_file and not probe.gpu_present:
        return no_gpu(name, probe)
    now = datetime.now(timezone.utc)
    text, source, tried = kernel_log(args, now)
    window = f"last {args.xid_window_hours:g} h" if args.xid_window_hours else "whole log"
    if text is None:
        return check_result(
            name,
            "warn",
            f"kernel log not readable, Xids not checked: {'; '.join(tried)}",
            threshold=args.xid_window_hours,
        )
    architectures = {}
    for gpu in probe.smi_details[0] or []:
        key = xid.pci_key(gpu["bus_id"])
        if key and gpu["architecture"]:
            architectures[key] = gpu["architecture"]
    events = xid.parse_kernel_log(text, now)
    judged = xid.judge_events(
        events, now, args.xid_window_hours, architectures, integer_list(args.xid_drain), integer_list(args.xid_ignore)
    )
    found = judged["findings"]
    ignored = ", ".join(f"Xid {f['code']} x{f['count']}" for f in judged["ignored"])
    summary = (
        f"{judged['in_window'] + judged['undated']} Xid/SXid event(s) in the {window} of {source}"
        + (f" ({judged['undated']} without a wall time, counted)" if judged["undated"] else "")
        + (f", {judged['outside_window']} older" if judged["outside_window"] else "")
        + (f"; ignored per the catalog: {ignored}" if ignored else "")
        + f"; {xid.XID_CATALOG_VERSION}"
    )
    return findings_result(
        name,
        found,
        summary,
        value=len(found),
        unit="findings",
        threshold=args.xid_window_hours,
        ignored=judged["ignored"],
        source=source,
    )


def check_interconnect(probe: Any) -> dict[str, Any]:
    """InfiniBand/RoCE ports ACTIVE at the expected rate (sysfs), and nvidia_peermem for GPUDirect RDMA."""
    name, args = "interconnect", probe.args
    expectations = args.expect_ib_ports or args.expect_peermem
    if not expectations and not probe.gpu_present:
        return no_gpu(name, probe)
    ports = health.parse_ib_ports(args.sysfs_infiniband_dir)
    peermem = health.peermem_loaded(args.sysfs_module_dir)
    if not ports and not expectations:
        return check_result(
            name,
            "skipped",
            f"no InfiniBand/RoCE device in {args.sysfs_infiniband_dir}",
            value=0,
            unit="ports",
            peermem=peermem,
        )
    found, counted = health.judge_ib_ports(ports, args.expect_ib_ports, args.ib_min_rate, args.ib_link_layer)
    if args.expect_peermem and not peermem:
        found.append(
            health.finding(
                "node",
                "fail",
                "load nvidia_peermem (modprobe nvidia-peermem)",
                f"nvidia_peermem not loaded (no {os.path.join(args.sysfs_module_dir, 'nvidia_peermem')}): "
                "no GPUDirect RDMA",
                signal="peermem",
                action_class="configure",
            )
        )
    rates = ", ".join(sorted({f"{p['link_layer']} {p['rate']}" for p in counted})) or "none"
    summary = (
        f"{len(counted)} of {len(ports)} port(s) ACTIVE at >= {args.ib_min_rate:g} Gb/s ({rates}); "
        f"nvidia_peermem {'loaded' if peermem else 'not loaded'}" + ("" if args.expect_peermem else " (not expected)")
    )
    return findings_result(
        name,
        found,
        summary,
        value=len(counted),
        unit="ports",
        threshold=args.expect_ib_ports,
        ports=ports,
        peermem=peermem,
    )


def check_dcgm(probe: Any) -> dict[str, Any]:
    """DCGM's diagnostic at --dcgm-level, per test and per GPU."""
    name, args = "dcgm", probe.args
    level = args.dcgm_level
    if level == 0 and not args.dcgm_json_file:
        return check_result(name, "skipped", "not requested (--dcgm-level 0)")
    if args.dcgm_json_file:
        text, error = read_saved(args.dcgm_json_file)
        if text is None:
            return check_result(name, "fail", error)
        source, elapsed = args.dcgm_json_file, None
    else:
        if not probe.gpu_present:
            return no_gpu(name, probe)
        if shutil.which("dcgmi") is None:
            return check_result(name, "skipped", "not installed (dcgmi not on PATH)", threshold=level)
        refusal = dcgm.mig_refusal(probe.smi_details[0] or [])
        if refusal:
            return check_result(name, "skipped", refusal, threshold=level)
        timeout = args.dcgm_timeout or dcgm.DEFAULT_TIMEOUT_S[level]
        began = time.monotonic()
        code, out, err = run_command(dcgm.command(level), timeout)
        elapsed = round(time.monotonic() - began, 1)
        if code == -1:
            return check_result(
                name, "fail", f"{err} (a GPU that hangs the diagnostic is itself a finding)", threshold=level
            )
        problem = dcgm.connection_problem(out + err)
        if problem:
            return check_result(name, "warn", f"not judged: {problem} (is nv-hostengine running?)", threshold=level)
        text, source = out, f"dcgmi diag -r {level} -j (rc {code}, {elapsed} s)"
    try:
        parsed = dcgm.parse_dcgm_json(text)
    except ValueError as exc:
        return check_result(name, "warn", f"not judged: {exc}", threshold=level)
    if parsed["runtime_error"]:
        return check_result(name, "warn", f"not judged: dcgmi: {parsed['runtime_error']}", threshold=level)
    if not parsed["tests"]:
        return check_result(name, "warn", "not judged: the diagnostic reported no test", threshold=level)
    judged = dcgm.judge_dcgm(parsed)
    counts = ", ".join(f"{n} {status}" for status, n in sorted(judged["counts"].items()))
    summary = (
        f"{len(parsed['tests'])} test(s) ({counts}) from {source}; DCGM {parsed['version'] or '?'} "
        f"({parsed['schema']} JSON)"
    )
    if judged["unknown"]:
        summary += f"; status not understood for {', '.join(judged['unknown'])}"
    result = findings_result(
        name,
        judged["findings"],
        summary,
        value=len(judged["findings"]),
        unit="findings",
        threshold=level,
        tests=judged["tests"],
        duration_s=elapsed,
    )
    if judged["verdict"] == "warn" and result["verdict"] == "pass":
        result["verdict"] = "warn"
    return result


HEALTH_CHECKS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "gpu_errors": check_gpu_errors,
    "pcie": check_pcie,
    "clocks": check_clocks,
    "nvlink": check_nvlink,
    "xid": check_xid,
    "interconnect": check_interconnect,
    "dcgm": check_dcgm,
}
