"""Parsers and judgements of the passive GPU health signals, each a pure function of text.

``parse_smi_query`` reads ``nvidia-smi -q -x`` (XML) or ``nvidia-smi -q``
(text) into one record per GPU (``GPU_KEYS``); the judgements turn records
into findings, each ``{"gpu", "verdict": "fail" | "warn", "action",
"evidence", "signal", "action_class"}``: ``action`` says what to do in words,
``signal`` what was read, in one word a metric and an alert can select on
(``row_remap_pending``, ``pcie_width``, ``clock_event``, ``nvlink_errors``,
...), and ``action_class`` the kind of work it asks for, one of
``ACTION_CLASSES``, or None for a finding to watch:

``reboot``     a GPU reset or a reboot clears it (a pending row remap or retired
               page, a pending MIG change, a fabric that needs a reset; NVIDIA,
               Error Recovery and Response Flags: "Reset ... reset the GPU using
               nvidia-smi -r", "Reboot ... Reboot the operating system");
``drain``      take the node out of service and investigate (uncorrected ECC, an
               inactive or slow NVLink, a downtrained PCIe link, HW slowdown,
               missing InfiniBand ports);
``replace``    the GPU is to be replaced (a row remapping failure: NVIDIA's RMA
               policy for row remapping);
``configure``  the site's configuration is wrong (MIG mode, Fabric Manager not
               running, nvidia_peermem not loaded, a slot or BIOS that caps the
               PCIe generation).

``judge_gpu_errors``  ECC (volatile/aggregate, corrected/uncorrected), retired
                      pages (pre-Ampere), remapped rows (Ampere and later):
                      row remap pending -> reboot (warn: the GPU works, the
                      remap takes effect at the next reset), remap failure ->
                      replace the GPU (fail), retired page pending -> reboot
                      (warn), uncorrected volatile ECC above the threshold ->
                      fail, corrected above its threshold -> warn. NVIDIA, "A100
                      GPU Memory Error Management", Error Recovery and Response
                      Flags (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/
                      error-recovery-and-response-flags.html): "Row-remapping
                      pending flag: ... row-remapping will happen at the next GPU
                      reset ... unaffected applications can continue running";
                      Dynamic Page Retirement (https://docs.nvidia.com/deploy/
                      dynamic-page-retirement/): a retired page takes effect when
                      the driver reloads. Azure's check_gpu_ecc fails a pending
                      remap outright (customTests/azure_gpu_ecc.nhc, NHC2007); here
                      it asks for a reboot: verdict "warn", action "reboot".
``judge_pcie``        link width below the SKU's floor (or the GPU's own maximum
                      when the SKU is unknown) -> fail; generation below maximum
                      -> warn only (``gen_policy="fail"`` to fail): an idle GPU
                      lowers its link generation to save power. nvidia-smi(1),
                      GPU Link Info, Current: "The current link generation and
                      width. These may be reduced when the GPU is not in use";
                      NVIDIA forum, https://forums.developer.nvidia.com/t/
                      prevent-pcie-from-reducing-gen/72537: "Downgrading the PCIe
                      link when not in use is an important integral part of the
                      GPU's power management". Real: gpud's 8 x RTX 4090 at Gen 1 of
                      4 while idle (tests/unit/data/gpu/smi-text/).
``judge_clocks``      active clock event (throttle) reasons: HW thermal slowdown
                      and HW power brake slowdown -> fail, HW slowdown alone and
                      SW thermal slowdown -> warn, SW power cap, idle, application
                      clocks, sync boost, display -> not a finding. NVML
                      (nvml.h 12.4.127, nvmlClocksEventReason*): HW slowdown "is
                      engaged (reducing the core clocks by a factor of 2 or more)
                      ... an indicator of: temperature being too high; External
                      Power Brake Assertion is triggered (e.g. by the system power
                      supply); Power draw is too high and Fast Trigger protection
                      is reducing the clocks; May be also reported during PState
                      or clock change" (hence warn when neither sub-reason says
                      which); HW thermal: "temperature being too high"; power
                      brake: "External Power Brake Assertion being triggered";
                      SW thermal: temperature above the max operating
                      temperature. Azure's check_gpu_clock_throttling ignores
                      idle, none and SW power cap alike. Temperature at or past
                      the GPU's own slowdown threshold -> warn. MIG mode against
                      the site's expectation -> fail; a pending change -> warn.
``judge_fabric``      Fabric Manager's registration of each GPU on NVSwitch
                      systems (``nvidia-smi -q`` Fabric State/Status, Hopper and
                      later): "Completed" with status "Success" passes;
                      "In Progress"/"Not Started" or another status fails (CUDA
                      cannot start until the GPU is registered; Fabric Manager
                      User Guide, quoted in siderolabs/extensions pull 717). "N/A"
                      is not judged (A100 and single-GPU systems report it).
``judge_nvlink``      ``nvidia-smi nvlink --status``: an ``<inactive>`` link, or
                      all links inactive -> fail (Azure check_nvlink_status,
                      customTests/azure_gpu_nvlink.nhc, NHC2016); fewer links or
                      a lower speed than the SKU's profile -> fail;
                      ``nvidia-smi nvlink -e`` counters above a threshold -> warn.
``parse_ib_ports``    /sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,
                      link_layer} under a root directory; ``judge_ib_ports``.

Standard library only; nothing of the package but common and profiles.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Iterable

from . import profiles
from .common import read_text

# The kinds of work a finding asks for (the module docstring), in the order the report lists them.
ACTION_CLASSES = ("replace", "drain", "reboot", "configure")
NOT_A_VALUE = ("", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "none")
# The clock event reasons: nvidia-smi -q's text names (lower-cased) and the report's, in its order (the names of
# nvidia-smi -q -x's elements, without their clocks_event_reason_ or clocks_throttle_reason_ prefix).
TEXT_CLOCK_REASONS = {
    "idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clocks_setting",
}
CLOCK_REASONS = tuple(TEXT_CLOCK_REASONS.values())
FAIL_REASONS = {
    "hw_thermal_slowdown": "HW thermal slowdown (the GPU is too hot: check cooling)",
    "hw_power_brake_slowdown": "HW power brake slowdown (external power brake asserted, e.g. by "
    "the power supply: check power)",
}
WARN_REASONS = {
    "hw_slowdown": "HW slowdown (too hot, power brake or power draw too high; also reported during a clock change)",
    "sw_thermal_slowdown": "SW thermal slowdown (above the max operating temperature)",
}
GPU_KEYS = (
    "index",
    "bus_id",
    "name",
    "architecture",
    "pci_device_id",
    "uuid",
    "persistence_mode",
    "mig",
    "ecc_mode",
    "ecc",
    "retired_pages",
    "remapped_rows",
    "pcie",
    "clock_reasons",
    "temperature",
    "utilization_gpu",
    "fabric",
)


# --------------------------------------------------------------------------- small value readers


def value(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return None if text.lower() in NOT_A_VALUE else text


def number(text: str | None) -> float | None:
    """The leading number of '45 C', '16x', '26.562 GB/s', '0x1' -> None; None for N/A."""
    text = value(text)
    match = re.match(r"-?\d+(?:\.\d+)?", text or "")
    return float(match.group()) if match else None


def integer(text: str | None) -> int | None:
    n = number(text)
    return int(n) if n is not None else None


def yes_no(text: str | None) -> bool | None:
    return {"yes": True, "no": False, "enabled": True, "disabled": False, "active": True, "not active": False}.get(
        (value(text) or "").lower()
    )


def total(values: Iterable[int | None]) -> int | None:
    """Sum of the numbers among values; None when there are none (every one N/A)."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def ecc_counts(
    single_double: tuple[str | None, str | None] | None, counters: list[tuple[str, str | None]]
) -> dict[str, int | None]:
    """{"corrected", "uncorrected"} of an ECC block, in either schema: its single/double bit totals where the
    block has them (drivers 418 and earlier), else the sums of its (lower-case named) (un)correctable counters;
    threshold flags are not counts."""
    if single_double is not None:
        return {"corrected": integer(single_double[0]), "uncorrected": integer(single_double[1])}
    corrected, uncorrected = [], []
    for name, text in counters:
        if "threshold" in name:
            continue
        if "uncorrectable" in name:
            uncorrected.append(integer(text))
        elif "correctable" in name:
            corrected.append(integer(text))
    return {"corrected": total(corrected), "uncorrected": total(uncorrected)}


def gpu_label(gpu: dict[str, Any]) -> str:
    return f"GPU {gpu['index']} ({gpu['bus_id']})"


def finding(
    gpu: dict[str, Any] | str, verdict: str, action: str, evidence: str, *, signal: str, action_class: str | None
) -> dict[str, Any]:
    """One finding (see the module docstring); signal and action_class are named at every call."""
    if action_class is not None and action_class not in ACTION_CLASSES:
        raise ValueError(f"action class {action_class!r} is not one of {', '.join(ACTION_CLASSES)}")
    return {
        "gpu": gpu_label(gpu) if isinstance(gpu, dict) else gpu,
        "verdict": verdict,
        "action": action,
        "evidence": evidence,
        "signal": signal,
        "action_class": action_class,
    }


# --------------------------------------------------------------------------- nvidia-smi -q -x (XML)


def xml_text(node: ET.Element | None, path: str) -> str | None:
    found = node.find(path) if node is not None else None
    return found.text if found is not None and found.text is not None else None


def xml_fields(node: ET.Element | None, base: str, read: Callable[[str | None], Any], **tags: str) -> dict[str, Any]:
    """{key: read(the text of base/tag)} for each key=tag: a group of one kind of figure under one element."""
    return {key: read(xml_text(node, f"{base}/{tag}")) for key, tag in tags.items()}


def xml_ecc_counts(node: ET.Element | None) -> dict[str, int | None]:
    """{"corrected", "uncorrected"} of an <ecc_errors>/<volatile> or <aggregate> element, whatever the
    schema: sram_/dram_ (un)correctable(_parity/_secded) children, or the older single_bit/double_bit
    <total> (418 and earlier). Threshold flags are not counts."""
    if node is None:
        return ecc_counts(None, [])
    legacy = node.find("single_bit") is not None or node.find("double_bit") is not None
    return ecc_counts(
        (xml_text(node, "single_bit/total"), xml_text(node, "double_bit/total")) if legacy else None,
        [(child.tag.lower(), child.text) for child in node],
    )


def xml_clock_reasons(gpu: ET.Element) -> dict[str, bool | None]:
    """The clock event reasons, under <clocks_event_reasons> (drivers 535 and later, DTD v12) or
    <clocks_throttle_reasons> (before), each element prefixed by the block's singular name."""
    for block, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        node = gpu.find(block)
        if node is not None:
            return {reason: yes_no(xml_text(node, prefix + reason)) for reason in CLOCK_REASONS}
    return {reason: None for reason in CLOCK_REASONS}


def parse_smi_xml(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi -q -x`` -> one record per GPU (GPU_KEYS). Raises ValueError when it is not that XML."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise ValueError(f"not nvidia-smi XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi XML: root element <{root.tag}>")
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        remap = gpu.find("remapped_rows")
        remapped = None
        if remap is not None and len(remap):
            remapped = {
                "correctable": integer(xml_text(remap, "remapped_row_corr")),
                "uncorrectable": integer(xml_text(remap, "remapped_row_unc")),
                "pending": yes_no(xml_text(remap, "remapped_row_pending")),
                "failure": yes_no(xml_text(remap, "remapped_row_failure")),
            }
        retired = gpu.find("retired_pages")
        pending = [yes_no(xml_text(retired, tag)) for tag in ("pending_blacklist", "pending_retirement")]
        gpus.append(
            {
                "index": index,  # nvidia-smi lists GPUs in its index order
                "bus_id": gpu.get("id") or value(xml_text(gpu, "pci/pci_bus_id")),
                "name": value(xml_text(gpu, "product_name")),
                "architecture": value(xml_text(gpu, "product_architecture")),
                "pci_device_id": value(xml_text(gpu, "pci/pci_device_id")),
                "uuid": value(xml_text(gpu, "uuid")),
                "persistence_mode": yes_no(xml_text(gpu, "persistence_mode")),
                "mig": xml_fields(gpu, "mig_mode", value, current="current_mig", pending="pending_mig"),
                "ecc_mode": xml_fields(gpu, "ecc_mode", value, current="current_ecc", pending="pending_ecc"),
                "ecc": {
                    "volatile": xml_ecc_counts(gpu.find("ecc_errors/volatile")),
                    "aggregate": xml_ecc_counts(gpu.find("ecc_errors/aggregate")),
                },
                "retired_pages": None
                if retired is None
                else {
                    "single_bit": integer(xml_text(retired, "multiple_single_bit_retirement/retired_count")),
                    "double_bit": integer(xml_text(retired, "double_bit_retirement/retired_count")),
                    "pending": True if True in pending else False if False in pending else None,
                },
                "remapped_rows": remapped,
                "pcie": xml_fields(
                    gpu,
                    "pci/pci_gpu_link_info",
                    integer,
                    gen_current="pcie_gen/current_link_gen",
                    gen_max="pcie_gen/max_link_gen",
                    width_current="link_widths/current_link_width",
                    width_max="link_widths/max_link_width",
                ),
                "clock_reasons": xml_clock_reasons(gpu),
                "temperature": xml_fields(
                    gpu,
                    "temperature",
                    number,
                    gpu="gpu_temp",
                    slowdown="gpu_temp_slow_threshold",
                    shutdown="gpu_temp_max_threshold",
                    max_operating="gpu_temp_max_gpu_threshold",
                    tlimit_margin="gpu_temp_tlimit",
                ),
                "utilization_gpu": number(xml_text(gpu, "utilization/gpu_util")),
                "fabric": xml_fields(gpu, "fabric", value, state="state", status="status"),
            }
        )
    return gpus


# --------------------------------------------------------------------------- nvidia-smi -q (text)


class Node:
    """One line of ``nvidia-smi -q``: its value (after " : ", or None) and the lines indented under it."""

    def __init__(self, text: str | None = None) -> None:
        self.value = text
        self.children: dict[str, Node] = {}

    def get(self, *path: str) -> Node | None:
        node: Node | None = self
        for key in path:
            node = node.children.get(key.lower()) if node is not None else None
        return node

    def text(self, *path: str) -> str | None:
        node = self.get(*path)
        return node.value if node is not None else None


def text_tree(lines: list[str]) -> Node:
    """The indented ``Key : Value`` / ``Section`` lines of one GPU into a tree (keys lower-cased;
    a repeated key keeps its first occurrence)."""
    root = Node()
    stack: list[tuple[int, Node]] = [(-1, root)]
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, rest = line.strip().partition(" : ")
        if not sep and line.rstrip().endswith(" :"):
            key, rest = line.strip()[:-2], ""
        key = key.strip().lower()
        while stack[-1][0] >= indent:
            stack.pop()
        node = Node(rest.strip() if sep or rest else None)
        stack[-1][1].children.setdefault(key, node)
        stack.append((indent, node))
    return root


def text_ecc_counts(node: Node | None) -> dict[str, int | None]:
    """xml_ecc_counts of the text schema's "Volatile"/"Aggregate" block."""
    if node is None:
        return ecc_counts(None, [])
    legacy = node.get("single bit") is not None or node.get("double bit") is not None
    return ecc_counts(
        (node.text("single bit", "total"), node.text("double bit", "total")) if legacy else None,
        [(key, child.value) for key, child in node.children.items()],
    )


def text_clock_reasons(gpu: Node) -> dict[str, bool | None]:
    reasons: dict[str, bool | None] = {reason: None for reason in CLOCK_REASONS}
    block = gpu.get("clocks event reasons") or gpu.get("clocks throttle reasons")
    if block is None:
        return reasons

    def walk(node: Node) -> None:
        for key, child in node.children.items():
            if key in TEXT_CLOCK_REASONS:
                reasons[TEXT_CLOCK_REASONS[key]] = yes_no(child.value)
            walk(child)  # HW Thermal / Power Brake Slowdown are indented under HW Slowdown

    walk(block)
    return reasons


def parse_smi_text(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi -q`` -> the same records as parse_smi_xml. Raises ValueError when it has no GPU section."""
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        match = re.match(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", line)
        if match:
            blocks.append((match.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
    if not blocks and "NVSMI LOG" not in text:
        raise ValueError("not nvidia-smi -q output: no NVSMI LOG header and no GPU section")
    gpus = []
    for index, (bus_id, lines) in enumerate(blocks):
        gpu = text_tree(lines)
        remap = gpu.get("remapped rows")
        remapped = None
        if remap is not None and remap.children:
            remapped = {
                "correctable": integer(remap.text("correctable error")),
                "uncorrectable": integer(remap.text("uncorrectable error")),
                "pending": yes_no(remap.text("pending")),
                "failure": yes_no(remap.text("remapping failure occurred")),
            }
        retired = gpu.get("retired pages")
        pending = [yes_no(retired.text(key)) if retired else None for key in ("pending page blacklist", "pending")]
        gpus.append(
            {
                "index": index,
                "bus_id": bus_id,
                "name": value(gpu.text("product name")),
                "architecture": value(gpu.text("product architecture")),
                "pci_device_id": value(gpu.text("pci", "device id")),
                "uuid": value(gpu.text("gpu uuid")),
                "persistence_mode": yes_no(gpu.text("persistence mode")),
                "mig": {
                    "current": value(gpu.text("mig mode", "current")),
                    "pending": value(gpu.text("mig mode", "pending")),
                },
                "ecc_mode": {
                    "current": value(gpu.text("ecc mode", "current")),
                    "pending": value(gpu.text("ecc mode", "pending")),
                },
                "ecc": {
                    "volatile": text_ecc_counts(gpu.get("ecc errors", "volatile")),
                    "aggregate": text_ecc_counts(gpu.get("ecc errors", "aggregate")),
                },
                "retired_pages": None
                if retired is None
                else {
                    "single_bit": integer(retired.text("single bit ecc")),
                    "double_bit": integer(retired.text("double bit ecc")),
                    "pending": True if True in pending else False if False in pending else None,
                },
                "remapped_rows": remapped,
                "pcie": {
                    "gen_current": integer(gpu.text("pci", "gpu link info", "pcie generation", "current")),
                    "gen_max": integer(gpu.text("pci", "gpu link info", "pcie generation", "max")),
                    "width_current": integer(gpu.text("pci", "gpu link info", "link width", "current")),
                    "width_max": integer(gpu.text("pci", "gpu link info", "link width", "max")),
                },
                "clock_reasons": text_clock_reasons(gpu),
                "temperature": {
                    "gpu": number(gpu.text("temperature", "gpu current temp")),
                    "slowdown": number(gpu.text("temperature", "gpu slowdown temp")),
                    "shutdown": number(gpu.text("temperature", "gpu shutdown temp")),
                    "max_operating": number(gpu.text("temperature", "gpu max operating temp")),
                    "tlimit_margin": number(gpu.text("temperature", "gpu t.limit temp")),
                },
                "utilization_gpu": number(gpu.text("utilization", "gpu")),
                "fabric": {"state": value(gpu.text("fabric", "state")), "status": value(gpu.text("fabric", "status"))},
            }
        )
    return gpus


def parse_smi_query(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi -q -x`` or ``nvidia-smi -q``, told apart by their first character."""
    return parse_smi_xml(text) if text.lstrip().startswith("<") else parse_smi_text(text)


# --------------------------------------------------------------------------- judgements of the GPU records


def judge_gpu_errors(
    gpus: list[dict[str, Any]], max_uncorrected: int = 0, max_corrected: int | None = None
) -> list[dict[str, Any]]:
    """Findings from ECC counts, retired pages and remapped rows (see the module docstring).
    max_uncorrected: most volatile uncorrected ECC errors (fail above); max_corrected: most
    volatile corrected ones (warn above; None: not judged)."""
    found = []
    for gpu in gpus:
        rows = gpu["remapped_rows"]
        if rows is not None:
            if rows["failure"]:
                found.append(
                    finding(
                        gpu,
                        "fail",
                        "replace GPU",
                        f"row remapping failure (remapped rows: {rows['correctable']} correctable, "
                        f"{rows['uncorrectable']} uncorrectable)",
                        signal="row_remap_failure",
                        action_class="replace",
                    )
                )
            if rows["pending"]:
                found.append(
                    finding(
                        gpu,
                        "warn",
                        "reboot",
                        "row remap pending: takes effect at the next GPU reset "
                        f"({rows['uncorrectable']} uncorrectable, {rows['correctable']} correctable rows)",
                        signal="row_remap_pending",
                        action_class="reboot",
                    )
                )
        pages = gpu["retired_pages"]
        if pages is not None and pages["pending"]:
            found.append(
                finding(
                    gpu,
                    "warn",
                    "reboot",
                    f"retired page pending: takes effect when the driver reloads "
                    f"({pages['single_bit']} single-bit, {pages['double_bit']} double-bit pages retired)",
                    signal="retired_pages_pending",
                    action_class="reboot",
                )
            )
        volatile, aggregate = gpu["ecc"]["volatile"], gpu["ecc"]["aggregate"]
        if volatile["uncorrected"] is not None and volatile["uncorrected"] > max_uncorrected:
            found.append(
                finding(
                    gpu,
                    "fail",
                    "drain",
                    f"{volatile['uncorrected']} uncorrected volatile ECC error(s), max {max_uncorrected} "
                    f"(aggregate {aggregate['uncorrected']})",
                    signal="ecc_uncorrected",
                    action_class="drain",
                )
            )
        if max_corrected is not None and volatile["corrected"] is not None and volatile["corrected"] > max_corrected:
            found.append(
                finding(
                    gpu,
                    "warn",
                    "watch",
                    f"{volatile['corrected']} corrected volatile ECC error(s), max {max_corrected} "
                    f"(aggregate {aggregate['corrected']})",
                    signal="ecc_corrected",
                    action_class=None,
                )
            )
    return found


def gpu_profile(gpu: dict[str, Any], table: dict[str, dict[str, Any]] | None = None) -> tuple[str, dict[str, Any]]:
    return profiles.find_profile(gpu["name"], gpu["pci_device_id"], table)


def judge_pcie(
    gpus: list[dict[str, Any]], table: dict[str, dict[str, Any]] | None = None, gen_policy: str = "warn"
) -> list[dict[str, Any]]:
    """Findings from each GPU's PCIe link (see the module docstring). gen_policy: "warn" or "fail"
    for a generation below the maximum."""
    found = []
    for gpu in gpus:
        link = gpu["pcie"]
        key, profile = gpu_profile(gpu, table)
        floor = profiles.figure(profile, "pcie_min_width")
        width, width_max = link["width_current"], link["width_max"]
        if width is not None:
            if floor is not None and width < floor:
                found.append(
                    finding(
                        gpu,
                        "fail",
                        "reseat or replace (downtrained PCIe link)",
                        f"PCIe x{width}, below the {key} floor x{floor} (max x{width_max})",
                        signal="pcie_width",
                        action_class="drain",
                    )
                )
            elif floor is None and width_max is not None and width < width_max:
                found.append(
                    finding(
                        gpu,
                        "fail",
                        "reseat or replace (downtrained PCIe link)",
                        f"PCIe x{width} of max x{width_max} ({key}: no per-SKU floor)",
                        signal="pcie_width",
                        action_class="drain",
                    )
                )
            elif width_max is not None and width < width_max:
                found.append(
                    finding(
                        gpu,
                        "warn",
                        "watch",
                        f"PCIe x{width} of max x{width_max} (the {key} floor x{floor} is met)",
                        signal="pcie_width",
                        action_class=None,
                    )
                )
        gen, gen_max = link["gen_current"], link["gen_max"]
        expected = profiles.figure(profile, "pcie_gen")
        if gen is not None and gen_max is not None and gen < gen_max:
            idle = gpu["clock_reasons"].get("gpu_idle")
            note = "; the GPU is idle: an idle GPU lowers its link generation" if idle else ""
            found.append(
                finding(
                    gpu,
                    "fail" if gen_policy == "fail" else "warn",
                    "check under load",
                    f"PCIe Gen {gen} of max Gen {gen_max}{note}",
                    signal="pcie_generation",
                    action_class="drain" if gen_policy == "fail" else None,
                )
            )
        if expected is not None and gen_max is not None and gen_max < expected:
            found.append(
                finding(
                    gpu,
                    "warn",
                    "check the slot / BIOS",
                    f"PCIe max Gen {gen_max}, the {key} links at Gen {expected}",
                    signal="pcie_max_generation",
                    action_class="configure",
                )
            )
    return found


def judge_clocks(gpus: list[dict[str, Any]], expect_mig: str = "any") -> list[dict[str, Any]]:
    """Findings from active clock event reasons, temperature and MIG mode (see the module docstring).
    expect_mig: "any" (not judged), "enabled" or "disabled"."""
    found = []
    for gpu in gpus:
        reasons = gpu["clock_reasons"]
        failing = [text for reason, text in FAIL_REASONS.items() if reasons.get(reason)]
        for text in failing:
            found.append(
                finding(
                    gpu,
                    "fail",
                    "drain: check cooling and power",
                    f"active {text}",
                    signal="clock_event",
                    action_class="drain",
                )
            )
        if not failing:
            for reason, text in WARN_REASONS.items():
                if reasons.get(reason):
                    found.append(
                        finding(gpu, "warn", "watch", f"active {text}", signal="clock_event", action_class=None)
                    )
        temp = gpu["temperature"]
        if temp["gpu"] is not None and temp["slowdown"] is not None and temp["gpu"] >= temp["slowdown"]:
            found.append(
                finding(
                    gpu,
                    "warn",
                    "check cooling",
                    f"{temp['gpu']:g} C, at or past its slowdown threshold {temp['slowdown']:g} C",
                    signal="temperature",
                    action_class=None,
                )
            )
        mig = gpu["mig"]
        if expect_mig != "any" and mig["current"] is not None and mig["current"].lower() != expect_mig:
            found.append(
                finding(
                    gpu,
                    "fail",
                    f"set MIG mode {expect_mig}",
                    f"MIG mode {mig['current']}, the site expects {expect_mig}",
                    signal="mig_mode",
                    action_class="configure",
                )
            )
        if mig["current"] and mig["pending"] and mig["current"] != mig["pending"]:
            found.append(
                finding(
                    gpu,
                    "warn",
                    "reset the GPU",
                    f"MIG mode {mig['current']}, {mig['pending']} pending (takes effect at a GPU reset)",
                    signal="mig_pending",
                    action_class="reboot",
                )
            )
    return found


def judge_fabric(gpus: list[dict[str, Any]], table: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Findings from Fabric Manager's per-GPU state (see the module docstring)."""
    found = []
    for gpu in gpus:
        state, status = gpu["fabric"]["state"], gpu["fabric"]["status"]
        if state is None:
            continue
        if state.lower() != "completed":
            found.append(
                finding(
                    gpu,
                    "fail",
                    "start nvidia-fabricmanager / reset the fabric",
                    f"Fabric Manager state {state!r} (status {status}): the GPU is not registered "
                    "with the NVLink fabric",
                    signal="fabric_manager",
                    action_class="configure",
                )
            )
        elif (status or "").lower() != "success":
            found.append(
                finding(
                    gpu,
                    "fail",
                    "reset the fabric",
                    f"Fabric Manager state Completed with status {status!r}",
                    signal="fabric_manager",
                    action_class="reboot",
                )
            )
    return found


# --------------------------------------------------------------------------- NVLink


def parse_nvlink_status(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi nvlink --status`` -> [{"index", "name", "uuid", "links": {link: GB/s or None when
    <inactive>}, "all_inactive": bool}]; a GPU without NVLink has no links."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        header = re.match(r"GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$", line)
        if header:
            gpus.append(
                {
                    "index": int(header.group(1)),
                    "name": header.group(2),
                    "uuid": header.group(3),
                    "links": {},
                    "all_inactive": False,
                }
            )
            continue
        if not gpus:
            continue
        link = re.match(r"\s*Link (\d+): (.*)$", line)
        if link:
            speed = number(link.group(2)) if "GB/s" in link.group(2) else None
            gpus[-1]["links"][int(link.group(1))] = speed
        elif "all links are inactive" in line.lower():
            gpus[-1]["all_inactive"] = True
    return gpus


def parse_nvlink_errors(text: str) -> dict[int, dict[int, dict[str, int]]]:
    """``nvidia-smi nvlink -e`` -> {gpu: {link: {counter: value}}} ("Replay Errors", "Recovery Errors",
    "CRC Errors", or whichever counters the driver prints)."""
    counters: dict[int, dict[int, dict[str, int]]] = {}
    gpu = None
    for line in text.splitlines():
        header = re.match(r"GPU (\d+): ", line)
        if header:
            gpu = int(header.group(1))
            counters[gpu] = {}
            continue
        match = re.match(r"\s*Link (\d+): (.+?): (\d+)\s*$", line)
        if match and gpu is not None:
            counters[gpu].setdefault(int(match.group(1)), {})[match.group(2).strip()] = int(match.group(3))
    return counters


def judge_nvlink(
    status: list[dict[str, Any]],
    errors: dict[int, dict[int, dict[str, int]]] | None = None,
    smi_gpus: list[dict[str, Any]] | None = None,
    table: dict[str, dict[str, Any]] | None = None,
    max_errors: int = 0,
    expect_count: bool = True,
) -> list[dict[str, Any]]:
    """Findings from NVLink status and error counters (see the module docstring). smi_gpus (the
    -q records, matched by index) give the PCI device ID for the profile; the name is the fallback.
    expect_count False (a node of one GPU) leaves the profile's link count unjudged."""
    found = []
    by_index = {g["index"]: g for g in smi_gpus or []}
    for gpu in status:
        record = by_index.get(gpu["index"], {})
        key, profile = profiles.find_profile(gpu["name"], record.get("pci_device_id"), table)
        label = f"GPU {gpu['index']}" + (f" ({record['bus_id']})" if record.get("bus_id") else "")
        expected_links = profiles.figure(profile, "nvlink_links")
        expected_speed = profiles.figure(profile, "nvlink_link_gbps")
        links = gpu["links"]
        if gpu["all_inactive"]:
            found.append(
                finding(
                    label,
                    "fail",
                    "drain: reset the GPU, then check the NVLink/NVSwitch",
                    "all NVLinks inactive",
                    signal="nvlink_inactive",
                    action_class="drain",
                )
            )
            continue
        inactive = sorted(n for n, speed in links.items() if speed is None)
        if inactive:
            found.append(
                finding(
                    label,
                    "fail",
                    "drain: reset the GPU, then check the NVLink/NVSwitch",
                    f"NVLink {', '.join(map(str, inactive))} inactive ({len(links) - len(inactive)} "
                    f"of {len(links)} up)",
                    signal="nvlink_inactive",
                    action_class="drain",
                )
            )
        if expect_count and expected_links is not None and len(links) < expected_links:
            found.append(
                finding(
                    label,
                    "fail",
                    "drain: check the NVLink/NVSwitch",
                    f"{len(links)} NVLinks listed, the {key} has {expected_links}",
                    signal="nvlink_links",
                    action_class="drain",
                )
            )
        slow = sorted(
            n
            for n, speed in links.items()
            if speed is not None and expected_speed is not None and speed < expected_speed * 0.999
        )
        if slow:
            speeds = sorted({links[n] for n in slow})
            found.append(
                finding(
                    label,
                    "fail",
                    "drain: check the NVLink/NVSwitch",
                    f"NVLink {', '.join(map(str, slow))} at {', '.join(f'{s:g}' for s in speeds)} GB/s, "
                    f"the {key} runs {expected_speed:g}",
                    signal="nvlink_speed",
                    action_class="drain",
                )
            )
    for gpu, per_link in sorted((errors or {}).items()):
        label = f"GPU {gpu}" + (f" ({by_index[gpu]['bus_id']})" if gpu in by_index else "")
        high = [
            (link, name, count)
            for link, named in sorted(per_link.items())
            for name, count in named.items()
            if count > max_errors
        ]
        if high:
            shown = ", ".join(f"link {link} {name} {count}" for link, name, count in high[:6])
            more = f" and {len(high) - 6} more" if len(high) > 6 else ""
            found.append(
                finding(
                    label,
                    "warn",
                    "watch (counters since the driver loaded)",
                    f"NVLink error counters above {max_errors}: {shown}{more}",
                    signal="nvlink_errors",
                    action_class=None,
                )
            )
    return found


# --------------------------------------------------------------------------- InfiniBand / RoCE (sysfs)


def parse_ib_ports(root: str | Path) -> list[dict[str, Any]]:
    """/sys/class/infiniband under root -> [{"device", "port", "state", "phys_state", "rate_gbps",
    "rate", "link_layer"}], sorted; [] when root does not exist. A value reads like the sysfs files:
    state "4: ACTIVE", phys_state "5: LinkUp", rate "400 Gb/sec (4X NDR)", link_layer "InfiniBand"."""
    root = Path(root)
    ports = []
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return []
    for device in devices:
        try:
            numbers = sorted(os.listdir(root / device / "ports"), key=lambda n: (len(n), n))
        except OSError:
            continue
        for port in numbers:
            base = root / device / "ports" / port
            state, phys = read_text(base / "state"), read_text(base / "phys_state")
            rate = read_text(base / "rate")
            ports.append(
                {
                    "device": device,
                    "port": port,
                    "state": state.split(":", 1)[-1].strip() if state else None,
                    "phys_state": phys.split(":", 1)[-1].strip() if phys else None,
                    "rate": rate,
                    "rate_gbps": number(rate),
                    "link_layer": read_text(base / "link_layer"),
                }
            )
    return ports


def judge_ib_ports(
    ports: list[dict[str, Any]], expect_ports: int = 0, min_rate_gbps: float = 0.0, link_layer: str = "any"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(findings, the ports counted) for InfiniBand/RoCE readiness. A port counts when it is ACTIVE,
    LinkUp, at min_rate_gbps or more and of link_layer ("InfiniBand", "Ethernet" or "any"); fewer counted
    ports than expect_ports fail. Without an expectation a port that is not up is a warning."""
    counted, found = [], []
    for port in ports:
        name = f"{port['device']} port {port['port']}"
        layer_ok = link_layer == "any" or (port["link_layer"] or "").lower() == link_layer.lower()
        up = port["state"] == "ACTIVE" and port["phys_state"] == "LinkUp"
        fast = port["rate_gbps"] is not None and port["rate_gbps"] >= min_rate_gbps
        if up and fast and layer_ok:
            counted.append(port)
        elif layer_ok and not up:
            found.append(
                finding(
                    name,
                    "warn",
                    "check the cable / switch port",
                    f"{port['link_layer']} port {port['state']} / {port['phys_state']} ({port['rate']})",
                    signal="ib_port",
                    action_class=None,
                )
            )
        elif layer_ok and not fast:
            found.append(
                finding(
                    name,
                    "warn",
                    "check the cable / switch port",
                    f"{port['link_layer']} port at {port['rate']}, below {min_rate_gbps:g} Gb/s",
                    signal="ib_port",
                    action_class=None,
                )
            )
    if expect_ports and len(counted) < expect_ports:
        found.append(
            finding(
                "node",
                "fail",
                "drain: check the NICs, cables and switch ports",
                f"{len(counted)} {link_layer if link_layer != 'any' else 'InfiniBand/RoCE'} port(s) ACTIVE "
                f"at >= {min_rate_gbps:g} Gb/s, expected {expect_ports}",
                signal="ib_ports",
                action_class="drain",
            )
        )
    return found, counted


def peermem_loaded(sys_module_dir: str | Path = "/sys/module") -> bool:
    """nvidia_peermem (GPUDirect RDMA) is loaded: /sys/module/nvidia_peermem exists."""
    return Path(sys_module_dir, "nvidia_peermem").is_dir()


# --------------------------------------------------------------------------- shared by the checks


def verdict_of(found: list[dict[str, Any]]) -> str:
    verdicts = {f["verdict"] for f in found}
    return "fail" if "fail" in verdicts else "warn" if "warn" in verdicts else "pass"


def describe(found: list[dict[str, Any]], limit: int = 8) -> str:
    """The findings as one line, failures first: "GPU 0 (bus): evidence [action]; ..."."""
    ordered = sorted(found, key=lambda f: f["verdict"] != "fail")
    parts = [f"{f['gpu']}: {f['evidence']} [{f['action']}]" for f in ordered[:limit]]
    if len(ordered) > limit:
        parts.append(f"and {len(ordered) - limit} more")
    return "; ".join(parts)
