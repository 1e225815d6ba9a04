"""Kernel-log XID and SXID events, NVIDIA's Xid catalog, and their judgement: pure functions of text.

``parse_kernel_log`` finds the driver's Xid lines and the NVSwitch driver's SXid lines::

    NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error ...
    nvidia-nvswitch1: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 57 Minion Link DLREQ interrupt

with the timestamp of each line where the log gives one: ``dmesg --time-format iso``
(``2024-11-15T12:02:03,470068+00:00``, with or without ``--decode``'s ``kern  :warn  :``),
``journalctl -k -o short-iso`` / ``short-iso-precise`` (``2025-01-02T15:20:12+0800 host kernel:``),
``dmesg -T`` (``[Sun Feb 23 16:24:18 2025]``, local time) and syslog's ``Mar 29 15:38:59 host
kernel:`` (no year: the year that makes it the most recent past date). A plain ``dmesg``
timestamp (seconds since boot) has no wall time: such an event counts as recent.

``judge_events`` keeps the events of the last ``window_hours`` (0: the whole log) and classes
each by NVIDIA's Xid catalog ("Resolution Bucket (Immediate Action)"):

drain   the node should take no new work until the action is done: RESET_GPU, RESTART_BM
        (reboot), RESTART_VM, WORKFLOW_XID_48 (double-bit ECC), WORKFLOW_NVLINK_ERR /
        WORKFLOW_NVLINK5_ERR, CHECK_MECHANICALS, UPDATE_SWFW, CONTACT_SUPPORT, and an Xid the
        catalog lists as unused (it is not expected at all) -> the check fails;
watch   RESTART_APP, WORKFLOW_XID_45, CHECK_UVM, and an Xid the catalog gives no bucket or
        does not list -> a warning;
ignore  IGNORE -> listed, not a finding.

Xid 154 (GPU recovery action changed) says its action in its own text ("... to 0x1 (GPU Reset
Required)"): any action but None drains. Per GPU generation: the catalog covers Ampere and
later; on Volta and older (the architecture from ``nvidia-smi -q``, matched by PCI address)
Xid 63 is a retired page that takes effect when the driver reloads (drain: reboot) and 64 a
page that could not be retired (drain), after NVIDIA's Dynamic Page Retirement document
(https://docs.nvidia.com/deploy/dynamic-page-retirement/). SXids are classed by the word the
NVSwitch driver prints: Fatal -> drain (reset the fabric), Non-fatal -> watch; one without
(a "Data {...}" continuation line) takes its predecessor's. SXids and their handling are
documented in NVIDIA's Fabric Manager User Guide
(https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/).

A site moves codes between the classes: ``drain_codes`` / ``ignore_codes`` (the CLI's
``--xid-drain`` / ``--xid-ignore``); Azure's azurehpc-health-checks, for one, fails on
48 56 57 58 62 63 64 65 68 69 73 74 79 80 81 92 119 120 (customTests/azure_gpu_xid.nhc).

Standard library only, nothing of the package.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

# NVIDIA's Xid catalog for Ampere and later GPUs, https://docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html (the page carries no version number). Pinned to the spreadsheet as
# exported on 2025-10-29T00:35:32Z, in leptonai/gpud components/accelerator/nvidia/xid/
# catalog_generated.go @ b9842de2b11177a482560391805f1691c9ef9607 ("Generated at 2025-10-29T00:35:32Z.
# Source: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html", from NVIDIA's
# Xid-Catalog.xlsx); cross-checked against NVIDIA/NVSentinel distros/kubernetes/nvsentinel/charts/
# gpu-health-monitor/xiderrorsmapping.csv @ 6f8b0fcfa8e502bdda78fabf96facef729a9285b (the same bucket
# for every code below but 160, which NVSentinel's copy, from another catalog release, gives
# RESTART_BM) and the docs page's own first rows (8 RESTART_APP, 11 RESTART_APP).
# code -> (mnemonic, immediate-action resolution bucket); "" where the catalog gives none yet.
XID_CATALOG_VERSION = "NVIDIA Xid catalog (Ampere and later), spreadsheet as exported 2025-10-29"
XID_CATALOG: dict[int, tuple[str, str]] = {
    8: ("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP"),
    11: ("ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP"),
    13: ("ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "RESTART_APP"),
    25: ("ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    32: ("ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP"),
    37: ("ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE"),
    38: ("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE"),
    39: ("ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP"),
    40: ("ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP"),
    41: ("ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE"),
    44: ("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE"),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45"),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48"),
    54: ("SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS"),
    60: ("ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP"),
    62: ("PMU_HALT_ERROR", "RESET_GPU"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU"),
    66: ("ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE"),
    67: ("ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE"),
    68: ("ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP"),
    69: ("ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP"),
    70: ("ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP"),
    71: ("ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP"),
    72: ("ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP"),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    75: ("ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP"),
    76: ("ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP"),
    77: ("ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP"),
    78: ("VGPU_START_ERROR", "UPDATE_SWFW"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    80: ("PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP"),
    82: ("ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP"),
    83: ("ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP"),
    84: ("ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP"),
    85: ("ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP"),
    86: ("ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP"),
    88: ("ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP"),
    89: ("ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "IGNORE"),
    93: ("INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    96: ("ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP"),
    97: ("ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP"),
    98: ("ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP"),
    99: ("ROBUST_CHANNEL_NVJPG1_ERROR", "RESTART_APP"),
    100: ("ROBUST_CHANNEL_NVJPG2_ERROR", "RESTART_APP"),
    101: ("ROBUST_CHANNEL_NVJPG3_ERROR", "RESTART_APP"),
    102: ("ROBUST_CHANNEL_NVJPG4_ERROR", "RESTART_APP"),
    103: ("ROBUST_CHANNEL_NVJPG5_ERROR", "RESTART_APP"),
    104: ("ROBUST_CHANNEL_NVJPG6_ERROR", "RESTART_APP"),
    105: ("ROBUST_CHANNEL_NVJPG7_ERROR", "RESTART_APP"),
    106: ("SMBPBI_TEST_MESSAGE", "IGNORE"),
    107: ("SMBPBI_TEST_MESSAGE_SILENT", "IGNORE"),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU"),
    110: ("SEC_FAULT_ERROR", "RESET_GPU"),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU"),
    120: ("GSP_ERROR", "RESET_GPU"),
    121: ("C2C_ERROR", "IGNORE"),
    126: ("ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP"),
    127: ("ROBUST_CHANNEL_CE11_ERROR", "RESTART_APP"),
    128: ("ROBUST_CHANNEL_CE12_ERROR", "RESTART_APP"),
    129: ("ROBUST_CHANNEL_CE13_ERROR", "RESTART_APP"),
    130: ("ROBUST_CHANNEL_CE14_ERROR", "RESTART_APP"),
    131: ("ROBUST_CHANNEL_CE15_ERROR", "RESTART_APP"),
    132: ("ROBUST_CHANNEL_CE16_ERROR", "RESTART_APP"),
    133: ("ROBUST_CHANNEL_CE17_ERROR", "RESTART_APP"),
    134: ("ROBUST_CHANNEL_CE18_ERROR", "RESTART_APP"),
    135: ("ROBUST_CHANNEL_CE19_ERROR", "RESTART_APP"),
    136: ("ALI_TRAINING_FAIL", "RESET_GPU"),
    137: ("NVLINK_PRIV_ERR", "IGNORE"),
    139: ("ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU"),
    141: ("ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE"),
    142: ("ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT"),
    143: ("GPU_INIT_ERROR", "RESET_GPU"),
    144: ("NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR"),
    151: ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM"),
    152: ("ROBUST_CHANNEL_DLA_SMMU_ERROR", "IGNORE"),
    153: ("ROBUST_CHANNEL_DLA_TIMEOUT", "IGNORE"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "XID_154"),
    155: ("NVLINK_SW_DEFINED_ERROR", "RESET_GPU"),
    156: ("RESOURCE_RETIREMENT_EVENT", "RESET_GPU"),
    157: ("RESOURCE_RETIREMENT_FAILURE", "IGNORE"),
    158: ("GPU_FATAL_TIMEOUT", "RESET_GPU"),
    159: ("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM"),
    160: ("CHANNEL_RETIREMENT_EVENT", "IGNORE"),
    161: ("CHANNEL_RETIREMENT_FAILURE", "IGNORE"),
    162: ("PSHC_REENGAGED", ""),
    163: ("PSHC_DISENGAGED", ""),
    164: ("PSHC_LOW_LIFETIME", ""),
    165: ("PSHC_ZERO_LIFETIME", ""),
    166: ("NVLINK_SECURE_CRYPTO_ERR", ""),
    167: ("PCIE_FATAL_TIMEOUT", ""),
    168: ("REDUCED_GPU_MEMORY_CAPACITY", ""),
    169: ("SEC2_HALT_ERROR", ""),
    170: ("NVLINK_SECURE_OTHER", ""),
    171: ("UNCORRECTABLE_DRAM_ERROR", ""),
    172: ("UNCORRECTABLE_SRAM_ERROR", ""),
}
# Codes the catalog lists as "Unused": not expected from a current driver. Their bucket is
# CONTACT_SUPPORT (drain), but for 14 (ROBUST_CHANNEL_FAKE_ERROR) and 108, IGNORE.
XID_UNUSED_IGNORE = frozenset((14, 108))
XID_UNUSED = frozenset(
    (
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        9,
        10,
        12,
        14,
        15,
        16,
        17,
        18,
        19,
        20,
        21,
        22,
        23,
        24,
        26,
        27,
        28,
        29,
        30,
        33,
        34,
        35,
        36,
        42,
        47,
        49,
        50,
        51,
        52,
        53,
        55,
        56,
        57,
        58,
        59,
        61,
        65,
        73,
        81,
        87,
        90,
        91,
        108,
        111,
        112,
        113,
        114,
        115,
        116,
        117,
        118,
        122,
        123,
        124,
        125,
        138,
    )
)

DRAIN_BUCKETS = frozenset(
    (
        "RESET_GPU",
        "RESTART_BM",
        "RESTART_VM",
        "RESET_FABRIC",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "CHECK_MECHANICALS",
        "UPDATE_SWFW",
        "CONTACT_SUPPORT",
    )
)
WATCH_BUCKETS = frozenset(("RESTART_APP", "WORKFLOW_XID_45", "CHECK_UVM", ""))
IGNORE_BUCKETS = frozenset(("IGNORE",))
PRE_AMPERE = frozenset(("kepler", "maxwell", "pascal", "volta", "turing"))
SEVERITY_VERDICT = {"drain": "fail", "watch": "warn", "ignore": "pass"}
# The kind of work a drain bucket asks for (health.ACTION_CLASSES): a GPU reset or a restart of the
# machine (the catalog's RESET_GPU, RESTART_BM, RESTART_VM; RESET_FABRIC, the SXid's) is "reboot"; a
# workflow to follow, a mechanical check or support is "drain" (drain and investigate); a software or
# firmware update is "configure". A drain code of the site's without a bucket is "drain".
BUCKET_ACTION_CLASS = {
    "RESET_GPU": "reboot",
    "RESTART_BM": "reboot",
    "RESTART_VM": "reboot",
    "RESET_FABRIC": "reboot",
    "WORKFLOW_XID_48": "drain",
    "WORKFLOW_NVLINK_ERR": "drain",
    "WORKFLOW_NVLINK5_ERR": "drain",
    "CHECK_MECHANICALS": "drain",
    "CONTACT_SUPPORT": "drain",
    "UPDATE_SWFW": "configure",
}
# Xid 154's recovery actions in its own words (NVIDIA, Error Recovery and Response Flags: Reset, Reboot,
# Drain P2P, Drain and Reset; NVML's nvmlDeviceGpuRecoveryAction_t adds bus reset, system reboot).
RECOVERY_ACTION_CLASS = (("drain", "drain"), ("reset", "reboot"), ("reboot", "reboot"))

XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<device>[0-9A-Fa-f:.]+)\): (?P<code>\d+), (?P<rest>.*)$")
SXID_LINE = re.compile(
    r"(?P<switch>nvidia-nvswitch\d+): SXid \((?:PCI:)?(?P<device>[0-9A-Fa-f:.]+)\): "
    r"(?P<code>\d+), (?P<rest>.*)$"
)
PID_NAME = re.compile(r"^pid=(?P<pid>[^,]*), name=(?P<name>[^,]*), (?P<text>.*)$")
ISO_TIME = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})T(?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d+))?"
    r"(?P<tz>Z|[+-]\d{2}:?\d{2})?"
)
CTIME = re.compile(r"^\[(?P<stamp>[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]")
SYSLOG_TIME = re.compile(r"^(?P<stamp>[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}) ")
RECOVERY_ACTION = re.compile(r"recovery action changed from .* to (?P<code>0x[0-9A-Fa-f]+) \((?P<action>[^)]*)\)")


def line_time(line: str, now: datetime) -> datetime | None:
    """The wall time a kernel-log line carries (aware, UTC), or None (seconds since boot, or none)."""
    head = line[:80]
    iso = ISO_TIME.search(head)
    if iso:
        frac = (iso.group("frac") or "0")[:6].ljust(6, "0")
        stamp = datetime.strptime(f"{iso.group('date')}T{iso.group('time')}", "%Y-%m-%dT%H:%M:%S")
        stamp = stamp.replace(microsecond=int(frac))
        tz = iso.group("tz")
        if tz is None:
            return stamp.astimezone(timezone.utc)  # naive: the machine's local time
        if tz == "Z":
            return stamp.replace(tzinfo=timezone.utc)
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        return stamp.replace(tzinfo=timezone(sign * offset)).astimezone(timezone.utc)
    ctime = CTIME.match(line)
    if ctime:
        stamp = datetime.strptime(" ".join(ctime.group("stamp").split()), "%a %b %d %H:%M:%S %Y")
        return stamp.astimezone(timezone.utc)
    syslog = SYSLOG_TIME.match(line)
    if syslog:
        local_now = now.astimezone()
        stamp = datetime.strptime(f"{local_now.year} {' '.join(syslog.group('stamp').split())}", "%Y %b %d %H:%M:%S")
        stamp = stamp.astimezone(timezone.utc)
        if stamp > now + timedelta(days=1):  # a December line read in January
            stamp = stamp.replace(year=stamp.year - 1)
        return stamp
    return None


def parse_kernel_log(text: str, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every Xid and SXid line of a kernel log: [{"kind": "xid" | "sxid", "code", "device" (the PCI
    address in the line), "switch" (SXid), "severity_word" (SXid: "Fatal", "Non-fatal" or None),
    "pid", "process", "text", "time" (aware datetime or None), "line"}], in log order."""
    now = now or datetime.now(timezone.utc)
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        xid = XID_LINE.search(line)
        sxid = None if xid else SXID_LINE.search(line)
        match = xid or sxid
        if not match:
            continue
        rest = match.group("rest").strip()
        event: dict[str, Any] = {
            "kind": "xid" if xid else "sxid",
            "code": int(match.group("code")),
            "device": match.group("device"),
            "switch": None,
            "severity_word": None,
            "pid": None,
            "process": None,
            "text": rest,
            "time": line_time(line, now),
            "line": line.strip(),
        }
        if xid:
            named = PID_NAME.match(rest)
            if named:
                event.update(pid=named.group("pid").strip("'"), process=named.group("name"), text=named.group("text"))
        else:
            event["switch"] = match.group("switch")
            word = re.match(r"(Fatal|Non-fatal)\b,?\s*(.*)$", rest)
            if word:
                event.update(severity_word=word.group(1), text=word.group(2))
        events.append(event)
    return events


def pci_key(address: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of '0000:19:00', 'PCI:0000:19:00' or '00000000:19:00.0'."""
    match = re.search(r"(?:([0-9A-Fa-f]+):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?$", address or "")
    if not match:
        return None
    return int(match.group(1) or "0", 16), int(match.group(2), 16), int(match.group(3), 16)


def classify(
    event: dict[str, Any],
    architecture: str | None = None,
    drain_codes: Iterable[int] = (),
    ignore_codes: Iterable[int] = (),
) -> dict[str, Any]:
    """{"severity": "drain" | "watch" | "ignore", "bucket", "mnemonic", "why"} of one event (see the
    module docstring); the site's drain_codes / ignore_codes (Xids) win over the catalog."""
    code = event["code"]
    if event["kind"] == "sxid":
        word = event["severity_word"]
        if word == "Fatal":
            return {
                "severity": "drain",
                "bucket": "RESET_FABRIC",
                "mnemonic": f"SXid {code}",
                "why": "Fatal NVSwitch error (the driver's word): the fabric needs a reset",
            }
        if word == "Non-fatal":
            return {"severity": "watch", "bucket": "", "mnemonic": f"SXid {code}", "why": "Non-fatal NVSwitch error"}
        return {
            "severity": "watch",
            "bucket": "",
            "mnemonic": f"SXid {code}",
            "why": "NVSwitch error without a Fatal/Non-fatal word",
        }
    mnemonic, bucket = XID_CATALOG.get(code, ("", None)) if code not in XID_UNUSED else ("unused", None)
    if code in set(drain_codes):
        return {"severity": "drain", "bucket": bucket or "", "mnemonic": mnemonic, "why": "the site drains on it"}
    if code in set(ignore_codes):
        return {"severity": "ignore", "bucket": bucket or "", "mnemonic": mnemonic, "why": "the site ignores it"}
    arch = (architecture or "").lower()
    if arch in PRE_AMPERE and code in (63, 64):
        what = (
            "a page was retired: it takes effect when the driver reloads (reboot)"
            if code == 63
            else "a page could not be retired"
        )
        return {
            "severity": "drain",
            "bucket": "RESTART_BM" if code == 63 else "CONTACT_SUPPORT",
            "mnemonic": "DYNAMIC_PAGE_RETIREMENT",
            "why": f"{architecture}: {what} (Dynamic Page Retirement)",
        }
    if code == 154:
        action = RECOVERY_ACTION.search(event["text"])
        if action and action.group("action").strip().lower() != "none":
            return {
                "severity": "drain",
                "bucket": action.group("action"),
                "mnemonic": mnemonic,
                "why": f"recovery action {action.group('action')}",
            }
        return {"severity": "watch", "bucket": "XID_154", "mnemonic": mnemonic, "why": "recovery action changed"}
    if code in XID_UNUSED:
        if code in XID_UNUSED_IGNORE:
            return {"severity": "ignore", "bucket": "IGNORE", "mnemonic": "unused", "why": "unused in the catalog"}
        return {
            "severity": "drain",
            "bucket": "CONTACT_SUPPORT",
            "mnemonic": "unused",
            "why": "the catalog lists it as unused: not expected",
        }
    if bucket is None:
        return {"severity": "watch", "bucket": "", "mnemonic": "", "why": f"not in the {XID_CATALOG_VERSION}"}
    severity = "drain" if bucket in DRAIN_BUCKETS else "ignore" if bucket in IGNORE_BUCKETS else "watch"
    why = f"catalog: {bucket}" if bucket else "the catalog gives no resolution"
    if arch and arch in PRE_AMPERE:
        why += f" (the catalog covers Ampere and later; this GPU is {architecture})"
    return {"severity": severity, "bucket": bucket, "mnemonic": mnemonic, "why": why}


def judge_events(
    events: list[dict[str, Any]],
    now: datetime,
    window_hours: float = 24.0,
    architectures: dict[tuple[int, int, int], str] | None = None,
    drain_codes: Iterable[int] = (),
    ignore_codes: Iterable[int] = (),
) -> dict[str, Any]:
    """The events of the window, grouped by (kind, code, device) and classed: {"findings": [...] (one per
    drain or watch group), "ignored": [...], "in_window": n, "outside_window": n, "undated": n}. A
    finding: {"gpu", "verdict", "action", "evidence", "signal" ("xid" or "sxid"), "action_class" (action_class),
    "code", "kind", "count", "first", "last"}."""
    start = now - timedelta(hours=window_hours) if window_hours else None
    architectures = architectures or {}
    kept, outside, undated = [], 0, 0
    for event in events:
        when = event["time"]
        if when is None:
            undated += 1
            kept.append(event)
        elif start is None or when >= start:
            kept.append(event)
        else:
            outside += 1
    groups: dict[tuple[str, int, str], dict[str, Any]] = {}
    previous_word: dict[tuple[str | None, int], str] = {}
    for event in kept:
        if event["kind"] == "sxid":
            key_word = (event["switch"], event["code"])
            if event["severity_word"]:
                previous_word[key_word] = event["severity_word"]
            elif key_word in previous_word:
                event = {**event, "severity_word": previous_word[key_word]}
        arch = architectures.get(pci_key(event["device"]) or (-1, -1, -1))
        cls = classify(event, arch, drain_codes, ignore_codes)
        key = (event["kind"], event["code"], event["device"])
        group = groups.get(key)
        if group is None or SEVERITY_RANK[cls["severity"]] > SEVERITY_RANK[group["class"]["severity"]]:
            groups[key] = group = {"class": cls, "events": (group or {}).get("events", [])}
        group["events"].append(event)
    findings, ignored = [], []
    for (kind, code, device), group in groups.items():
        cls, members = group["class"], group["events"]
        times = [e["time"] for e in members if e["time"] is not None]
        first, last = (min(times).isoformat(), max(times).isoformat()) if times else (None, None)
        label = "SXid" if kind == "sxid" else "Xid"
        where = f"{members[0]['switch']} (PCI:{device})" if kind == "sxid" else f"PCI:{device}"
        when = f"last {last}" if last else "time unknown (since boot)"
        sample = members[-1]["text"]
        evidence = (
            f"{label} {code}{' ' + cls['mnemonic'] if cls['mnemonic'] and kind == 'xid' else ''} "
            f"x{len(members)}, {when}: {sample[:160]} ({cls['why']})"
        )
        entry = {
            "gpu": where,
            "verdict": SEVERITY_VERDICT[cls["severity"]],
            "action": {"drain": f"drain: {cls['bucket'] or 'contact support'}", "watch": "watch", "ignore": "none"}[
                cls["severity"]
            ],
            "evidence": evidence,
            "signal": kind,
            "action_class": action_class(cls),
            "code": code,
            "kind": kind,
            "count": len(members),
            "first": first,
            "last": last,
        }
        (ignored if cls["severity"] == "ignore" else findings).append(entry)
    return {
        "findings": findings,
        "ignored": ignored,
        "in_window": len(kept) - undated,
        "outside_window": outside,
        "undated": undated,
    }


def action_class(cls: dict[str, Any]) -> str | None:
    """The kind of work a classed event asks for: None unless it drains; else by its bucket
    (BUCKET_ACTION_CLASS), Xid 154's by the words of its recovery action, "drain" otherwise."""
    if cls["severity"] != "drain":
        return None
    bucket = cls["bucket"] or ""
    if bucket in BUCKET_ACTION_CLASS:
        return BUCKET_ACTION_CLASS[bucket]
    words = bucket.lower()
    return next((klass for word, klass in RECOVERY_ACTION_CLASS if word in words), "drain")


SEVERITY_RANK = {"ignore": 0, "watch": 1, "drain": 2}
