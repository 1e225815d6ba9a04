"""Per-SKU thresholds: what a healthy GPU of each model shows, each figure with its source.

A profile is found by the GPU's PCI device ID (the first four hex digits of
nvidia-smi's ``pci_device_id``, ``233010DE`` -> ``2330``), else by its name
(each word of a profile's name as a whole word, as the GEMM table matches).
A GPU that matches none gets ``DEFAULT_PROFILE``: no figure of its own, so
each check falls back to what it can judge without one (a link below the
GPU's own maximum, every NVLink that is reported being up) and says that the
model is unknown. ``merge_overrides`` lays a site's figures over the table
(``--profile-overrides FILE``, a JSON object ``{"<profile>": {"<field>":
value}}``) and refuses an unknown profile, an unknown field or a value of the
wrong kind, naming it.

Fields (``FIELDS``), each a (value, source) pair in the table:

``nvlink_links``              NVLinks ``nvidia-smi nvlink --status`` lists for each GPU
``nvlink_link_gbps``          the speed each of them reports there, GB/s
``nvswitch_fabric``           an NVSwitch system: Fabric Manager registers its GPUs
                              (``nvidia-smi -q``'s Fabric State), Hopper and later
``pcie_gen``                  the PCIe generation the GPU links at (its maximum)
``pcie_min_width``            the narrowest healthy PCIe link, lanes (DCGM's
                              ``min_pci_width`` for the SKU)
``memory_bandwidth_gbps``     device memory bandwidth floor, GB/s (DCGM's
                              ``memory_bandwidth.minimum_bandwidth``, MB/s there)
``h2d_gbps``                  host<->device copy floor per GPU, GB/s (nvbandwidth's
                              host_to_device/device_to_host_memcpy_ce)
``p2p_gbps``                  device<->device copy floor per pair, GB/s (nvbandwidth's
                              device_to_device_memcpy_read_ce)
``allreduce_8gpu_busbw_gbps`` NCCL all-reduce bus bandwidth floor of an 8-GPU node, GB/s
``allreduce_8gpu_size_mib``   the message size that floor is measured at, MiB (Azure's
                              ``check_nccl_allreduce`` third argument, nccl-tests'
                              ``-b``/``-e``: "16G" is 16 GiB, nccl-tests ``parsesize``,
                              NVIDIA/nccl-tests src/common.cu @ a0b82b22)

Sources (cited per figure below):

- DCGM ``nvvs/diag-skus.yaml.in``, NVIDIA/DCGM @ 72fa3feaa67d716a75323a8f47c34ff3ee73f824
  (2026-07-06): per device ID, ``min_pci_width`` and ``minimum_bandwidth`` (MB/s).
- Azure/azurehpc-health-checks @ 0e0a1ac26a64b32ac4dd7632a529638505d3314a: ``conf/nd96asr_v4.conf``
  (8 x A100 40GB), ``conf/nd96amsr_a100_v4.conf`` (8 x A100 80GB), ``conf/nd96isr_h100_v5.conf``
  (8 x H100), ``conf/nd96isr_h200_v5.conf`` (8 x H200), ``conf/nd40rs_v2.conf`` (8 x V100 32GB):
  ``check_nccl_allreduce <GB/s> <repeats> <message size>`` and ``check_gpu_bw <h2d GB/s> <p2p GB/s>``
  (customTests/azure_gpu_bandwidth.nhc: nvbandwidth, those are the failure thresholds).
- Device IDs: NVIDIA/open-gpu-kernel-modules README.md @ df1c9a3de2be4b130f4fc7680f7198193d8ac6ad
  (the supported-GPU table), and DCGM's diag-skus ids for Volta.
- NVLink counts and speeds: real ``nvidia-smi nvlink --status`` outputs: 8 x A100-SXM4-80GB
  (leptonai/gpud components/accelerator/nvidia/fabric-manager/testdata/nvidia-smi.nvlink.status.a100
  @ 40c0f9312ce778cc3f32cc1de31b82b08ff4fb7c: 12 links x 25 GB/s), H100 80GB HBM3
  (bottlerocket-os/bottlerocket pull 4418, https://github.com/bottlerocket-os/bottlerocket/pull/4418:
  18 links x 26.562 GB/s), Tesla V100-SXM2-32GB (Azure/azhpc-diagnostics issue 73,
  https://github.com/Azure/azhpc-diagnostics/issues/73: 6 links x 25.781 GB/s).
- PCIe generation: the ``max_link_gen`` of real outputs (tests/unit/data/gpu/smi/...).

Standard library only, nothing else of the package but common.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from .common import model_pattern

DCGM_SKUS = "NVIDIA/DCGM nvvs/diag-skus.yaml.in @ 72fa3fea"
AZURE = "Azure/azurehpc-health-checks @ 0e0a1ac2"
OPEN_MODULES = "NVIDIA/open-gpu-kernel-modules README.md @ df1c9a3d"
NVLINK_A100 = (
    "leptonai/gpud components/accelerator/nvidia/fabric-manager/testdata/nvidia-smi.nvlink.status.a100"
    " @ 40c0f931 (8 x A100-SXM4-80GB)"
)
NVLINK_H100 = "bottlerocket-os/bottlerocket pull 4418 (nvidia-smi nvlink --status, H100 80GB HBM3)"
NVLINK_V100 = "Azure/azhpc-diagnostics issue 73 (nvidia-smi nvlink -s, Tesla V100-SXM2-32GB)"
HOPPER_NVLINK = (
    "nvidia.com/en-us/data-center/technologies/hopper-architecture/: fourth-generation NVLink, "
    "900 GB/s per GPU in 8 x H200 or H100 servers; the H100's 18 links x 26.562 GB/s "
    "(bottlerocket pull 4418) taken for the H200, no real H200 output found"
)

# nccl-tests' message size suffixes in MiB (parsesize, src/common.cu @ a0b82b22: each 1024 x the one below).
SIZE_MIB = {"M": 1, "G": 1024}


def dcgm_sku(sku: str, min_pci_width: int, minimum_bandwidth: str | None = None) -> dict[str, tuple[Any, str]]:
    """The figures of DCGM's diag-skus entry for sku, each cited: ``min_pci_width`` and, where given (as the
    entry writes it, MB/s), ``minimum_bandwidth`` as the memory bandwidth floor in GB/s."""
    found: dict[str, tuple[Any, str]] = {
        "pcie_min_width": (min_pci_width, f"{DCGM_SKUS}: {sku} min_pci_width {min_pci_width}")
    }
    if minimum_bandwidth is not None:
        found["memory_bandwidth_gbps"] = (
            float(minimum_bandwidth) / 1000,
            f"{DCGM_SKUS}: {sku} minimum_bandwidth {minimum_bandwidth} MB/s",
        )
    return found


def nvlink(links: int, link_gbps: float, source: str) -> dict[str, tuple[Any, str]]:
    """The NVLink figures of a GPU, both read from one source: its link count and each link's GB/s."""
    return {"nvlink_links": (links, source), "nvlink_link_gbps": (link_gbps, source)}


def azure_node(conf: str, gpu_bw: str, nccl_allreduce: str) -> dict[str, tuple[Any, str]]:
    """The figures of an 8-GPU node's Azure conf file (conf/<conf>), each cited, from its lines' arguments as
    written there: ``check_gpu_bw <h2d GB/s> [<p2p GB/s>]`` and ``check_nccl_allreduce <GB/s> <repeats> <size>``."""
    where = f"{AZURE} conf/{conf}"
    bandwidth = f"{where}: check_gpu_bw {gpu_bw}"
    h2d, *p2p = gpu_bw.split()
    found: dict[str, tuple[Any, str]] = {"h2d_gbps": (float(h2d), bandwidth)}
    if p2p:
        found["p2p_gbps"] = (float(p2p[0]), bandwidth)
    allreduce = f"{where}: check_nccl_allreduce {nccl_allreduce}"
    busbw, _repeats, size = nccl_allreduce.split()
    found["allreduce_8gpu_busbw_gbps"] = (float(busbw), allreduce)
    found["allreduce_8gpu_size_mib"] = (
        int(size[:-1]) * SIZE_MIB[size[-1]],
        f"{allreduce} (nccl-tests -b {size} -e {size})",
    )
    return found


# name -> field -> (value, source). "names" and "device_ids" say which GPUs a profile is for.
PROFILES: dict[str, dict[str, Any]] = {
    "H100 80GB HBM3": {  # H100 SXM5
        "device_ids": ("2330",),
        **nvlink(18, 26.562, NVLINK_H100),
        "nvswitch_fabric": (
            True,
            "leptonai/gpud nvidia-smi -q of 8 x H100 80GB HBM3, 535.161.08: Fabric State "
            "Completed on every GPU (tests/unit/data/gpu/smi-text/h100-8gpu-535.161.08-power-brake.txt)",
        ),
        "pcie_gen": (5, "nvidia-smi -q of H100 80GB HBM3: PCIe Generation Max 5 (gpud testdata, 535.161.08)"),
        **dcgm_sku("2330", 16, "1905000"),
        **azure_node("nd96isr_h100_v5.conf", "48 335", "460.0 1 16G"),
    },
    "H200": {  # H200 SXM 141GB; the NVL (233B) is its own profile
        "device_ids": ("2335",),
        **nvlink(18, 26.562, HOPPER_NVLINK),
        "nvswitch_fabric": (
            True,
            "Hopper SXM on NVSwitch, as the H100 80GB HBM3 (same fourth-generation NVLink, "
            "nvidia.com Hopper architecture page)",
        ),
        **dcgm_sku("2335", 16),
        # DCGM's 2335 entry reads "minimum_bandwidth: 2333", a thousandth of its neighbours' MB/s
        # figures (233B: 2212500); read here as 2333 GB/s.
        "memory_bandwidth_gbps": (
            2333.0,
            f"{DCGM_SKUS}: 2335 minimum_bandwidth 2333 (unit read as GB/s: the "
            "entry is 1000 x below its neighbours' MB/s)",
        ),
        **azure_node("nd96isr_h200_v5.conf", "48 335", "431.0 1 16G"),
    },
    "H200 NVL": {"device_ids": ("233B",), **dcgm_sku("233b", 16, "2212500")},
    "H100 NVL": {"device_ids": ("2321",), **dcgm_sku("2321", 16, "2043000")},
    "H100 PCIe": {"device_ids": ("2331",), **dcgm_sku("2331", 16)},
    "H800": {"device_ids": ("2324",), **dcgm_sku("2324", 16, "1920000.0")},
    "A100-SXM4-80GB": {
        "device_ids": ("20B2",),
        **nvlink(12, 25.0, NVLINK_A100),
        "pcie_gen": (
            4,
            "nvidia-smi -q -x of NVIDIA A100-SXM4-80GB: max_link_gen 4 (influxdata/telegraf "
            "plugins/inputs/nvidia_smi/testdata/a100-sxm4-v12.xml)",
        ),
        **dcgm_sku("20b2", 16, "1173000.0"),
        **azure_node("nd96amsr_a100_v4.conf", "21 238", "228.0 1 16G"),
    },
    "A100-SXM4-40GB": {
        "device_ids": ("20B0",),
        **nvlink(12, 25.0, f"{NVLINK_A100}; the SXM4 A100s share the 12-link NVLink 3 of the 80GB part"),
        # DCGM's 20b0 entry reads 137500 MB/s, an eighth of the 80GB part's: not taken as a floor.
        **dcgm_sku("20b0", 16),
        **azure_node("nd96asr_v4.conf", "21 235", "228.0 1 8G"),
    },
    "A100 80GB PCIe": {"device_ids": ("20B5",), **dcgm_sku("20b5", 16, "1121250.0")},
    "A100-PCIE-40GB": {"device_ids": ("20F1",), **dcgm_sku("20f1", 16, "969750.0")},
    "A30": {"device_ids": ("20B7",), **dcgm_sku("20b7", 16, "585000.0")},
    "A10G": {"device_ids": ("2237",), **dcgm_sku("2237", 8, "362700.0")},
    "A10": {
        "device_ids": ("2236",),
        "pcie_min_width": (16, f"{DCGM_SKUS}: 22361482 (A10, subsystem 1482) min_pci_width 16"),
        "memory_bandwidth_gbps": (480.525, f"{DCGM_SKUS}: 22361482 minimum_bandwidth 480525.0 MB/s"),
    },
    "L40S": {"device_ids": ("26B9",), **dcgm_sku("26b9", 8, "525000.0")},
    "L4": {
        "device_ids": ("27B8",),
        "pcie_gen": (4, "nvidia-smi -q -x of NVIDIA L4, 555.42.06: max_link_gen 4"),
        **dcgm_sku("27b8", 16, "198500"),
    },
    "T4": {
        "device_ids": ("1EB8",),
        "pcie_gen": (
            3,
            "nvidia-smi -q -x of Tesla T4, 515.105.01: max_link_gen 3 (influxdata/telegraf "
            "plugins/inputs/nvidia_smi/testdata/tesla-t4.xml)",
        ),
        **dcgm_sku("1eb8", 8, "183000.0"),
    },
    "V100 SXM2 32GB": {
        "device_ids": ("1DB1", "1DB5"),
        "names": ("V100-SXM2-32GB",),
        **nvlink(6, 25.781, NVLINK_V100),
        **dcgm_sku("1db1/1db5", 16, "607500.0"),
        **azure_node("nd40rs_v2.conf", "9", "110.0 1 8G"),
    },
}

# A GPU no profile matches: no figure of its own (see the module docstring).
DEFAULT_PROFILE = "unknown model"
FIELDS: dict[str, type] = {
    "nvlink_links": int,
    "nvlink_link_gbps": float,
    "nvswitch_fabric": bool,
    "pcie_gen": int,
    "pcie_min_width": int,
    "memory_bandwidth_gbps": float,
    "h2d_gbps": float,
    "p2p_gbps": float,
    "allreduce_8gpu_busbw_gbps": float,
    "allreduce_8gpu_size_mib": int,
}
MATCH_KEYS = ("device_ids", "names")
SITE_SOURCE = "site override"


def device_id(pci_device_id: str | None) -> str | None:
    """nvidia-smi's PCI device ID -> the device part: '233010DE' or '0x233010DE' -> '2330'
    (device in the high 16 bits, vendor 10DE in the low); None when it is not one."""
    if not pci_device_id:
        return None
    text = pci_device_id.strip().upper()
    text = text[2:] if text.startswith("0X") else text
    if not re.fullmatch(r"[0-9A-F]{8}", text):
        return None
    return text[:4]


def find_profile(
    name: str | None, pci_device_id: str | None, table: dict[str, dict[str, Any]] | None = None
) -> tuple[str, dict[str, Any]]:
    """(profile name, its figures {field: (value, source)}) for a GPU; (DEFAULT_PROFILE, {}) when none matches.
    The device ID decides; the name is the fallback, longest profile name first ("H200 NVL" before "H200")."""
    table = PROFILES if table is None else table
    dev = device_id(pci_device_id)
    if dev:
        for key, profile in table.items():
            if dev in profile.get("device_ids", ()):
                return key, figures(profile)
    for key in sorted(table, key=len, reverse=True):
        patterns = (key,) + tuple(table[key].get("names", ()))
        if name and any(re.search(model_pattern(p), name, re.IGNORECASE) for p in patterns):
            return key, figures(table[key])
    return DEFAULT_PROFILE, {}


def figures(profile: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    return {k: v for k, v in profile.items() if k not in MATCH_KEYS}


def figure(profile: dict[str, tuple[Any, str]], field: str) -> Any:
    """A profile's value for field, or None when the profile has none."""
    entry = profile.get(field)
    return entry[0] if entry else None


def allreduce_floor(profile: dict[str, tuple[Any, str]], world_size: int) -> tuple[float, str] | None:
    """(floor GB/s, source) for an all-reduce over world_size GPUs of this model, where the
    table has a figure for that size (8-GPU nodes only); else None."""
    entry = profile.get("allreduce_8gpu_busbw_gbps")
    if entry is None or world_size != 8:
        return None
    return float(entry[0]), entry[1]


def allreduce_size_mib(profile: dict[str, tuple[Any, str]], world_size: int) -> tuple[int, str] | None:
    """(message size MiB, source) that the 8-GPU all-reduce floor is measured at; None where there is
    no floor for world_size GPUs or no size beside it."""
    if allreduce_floor(profile, world_size) is None or "allreduce_8gpu_size_mib" not in profile:
        return None
    value, source = profile["allreduce_8gpu_size_mib"]
    return int(value), source


def merge_overrides(site: Any, table: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The table with a site's figures laid over it: ``{"<profile>": {"<field>": value}}``; a profile
    the table lacks may be added with ``"device_ids"`` (a list of 4-hex-digit IDs) and/or ``"names"``.
    Raises ValueError naming what is wrong: not an object, an unknown field, a value of the wrong kind,
    a new profile that says which GPUs it is for neither by ID nor by name."""
    table = copy.deepcopy(PROFILES if table is None else table)
    if not isinstance(site, dict):
        raise ValueError(f"profile overrides must be a JSON object of profiles, got {type(site).__name__}")
    for key, fields in site.items():
        if not isinstance(fields, dict):
            raise ValueError(f"profile overrides: {key!r} must be an object of fields, got {type(fields).__name__}")
        unknown = sorted(set(fields) - set(FIELDS) - set(MATCH_KEYS))
        if unknown:
            raise ValueError(
                f"profile overrides: {key!r}: unknown field(s) {', '.join(unknown)}; "
                f"known: {', '.join(list(FIELDS) + list(MATCH_KEYS))}"
            )
        is_new = key not in table
        target = table.setdefault(key, {})
        for field, value in fields.items():
            if field == "device_ids":
                ids = value if isinstance(value, list) else None
                if not ids or not all(isinstance(i, str) and re.fullmatch(r"[0-9A-Fa-f]{4}", i) for i in ids):
                    raise ValueError(
                        f"profile overrides: {key!r}: device_ids must be a list of 4-hex-digit PCI "
                        f'device IDs like "2330", got {value!r}'
                    )
                target["device_ids"] = tuple(i.upper() for i in ids)
            elif field == "names":
                if not isinstance(value, list) or not all(isinstance(n, str) and n.strip() for n in value):
                    raise ValueError(f"profile overrides: {key!r}: names must be a list of GPU names, got {value!r}")
                target["names"] = tuple(value)
            else:
                target[field] = (check_value(key, field, value), SITE_SOURCE)
        if is_new and not (target.get("device_ids") or target.get("names")):
            raise ValueError(
                f"profile overrides: {key!r} is not a known profile ({', '.join(PROFILES)}); "
                'a new one needs "device_ids" or "names" to say which GPUs it is for'
            )
    return table


def check_value(key: str, field: str, value: Any) -> Any:
    kind = FIELDS[field]
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"profile overrides: {key!r}: {field} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:  # NaN > 0 is false too
        raise ValueError(f"profile overrides: {key!r}: {field} must be a number above 0, got {value!r}")
    if kind is int:
        if int(value) != value:
            raise ValueError(f"profile overrides: {key!r}: {field} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def parse_overrides(text: str) -> dict[str, dict[str, Any]]:
    """merge_overrides of a JSON text (the CLI's --profile-overrides-json); ValueError when it is wrong."""
    try:
        site = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    return merge_overrides(site)


def load_overrides(path: str) -> dict[str, dict[str, Any]]:
    """merge_overrides of a JSON file; ValueError (with the path) when it cannot be read or is wrong."""
    try:
        with open(path, encoding="utf-8") as handle:
            site = json.load(handle)
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    try:
        return merge_overrides(site)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
