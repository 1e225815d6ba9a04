"""The GPU-generation gate (issue 27, item 2): files/compatibility.yml's gpu_architectures and gpu_devices, the
stack lookup's gpu_generations() that judges a host's PCI device IDs against a driver branch and CUDA release, and
the roles that stop on it in play 1 (nvidia_driver for the branch, cuda for the release) with the device IDs
preflight publishes.

Sources of the facts the tests encode (the matrix cites them next to the data):

* device IDs and names: the "Compatible GPUs" table (PCI ID) of NVIDIA's driver README as published per release in
  github.com/NVIDIA/open-gpu-kernel-modules, README.md at the release's tag: "NVIDIA B200 | 2901 10DE 1999" first
  at tag 570.86.15 (54d69484da940413ba6017df9cf43bed8b75da46; no Blackwell device at 565.77), "NVIDIA H100 80GB
  HBM3 | 2330 10DE 16C0" and "NVIDIA H100 PCIe | 2331 10DE 1626" at 535.261.03
  (9c67f19366ec495a0ec5816a379a7e80451fc1d9), "NVIDIA H200 | 2335 10DE 18BE" first at 550.40.65
  (91726f2e216fc66e00737fae2c3d09114c320aa4; in no 535 release up to 535.288.01); V100s from the driver's table of
  released chips, src/nvidia/generated/g_nv_name_released.h at 535.261.03 ("{ 0x1DB4, ... "Tesla V100-PCIE-16GB" }");
* per architecture, the first CUDA release and the last driver branch: NVIDIA's "CUDA Toolkit, Driver, and
  Architecture Matrix", https://docs.nvidia.com/datacenter/tesla/drivers/cuda-toolkit-driver-and-architecture-matrix.html
  (Blackwell 10.0/12.0: CUDA 12.8; Hopper 9.0: CUDA 11.8; Volta 7.0: last CUDA 12.x, last driver R580);
* what preflight reads: /sys/bus/pci/devices/*/device, "0x2330" (the kernel's sysfs format, %#06x).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import role_run
from conftest import (
    FAKE_FACTS,
    declare_driver,
    driver_config,
    load_script,
    preflight_found,
    preflight_report,
    preflight_requirements,
)

from ansible_collections.gpufleet.fleet.plugins.module_utils import host_facts

REPO = Path(__file__).resolve().parents[2]
stack = load_script(REPO / "plugins" / "lookup" / "stack.py", "gpufleet_stack")
MATRIX = stack.load_matrix()
ARCHITECTURES = MATRIX["gpu_architectures"]
DEVICES = MATRIX["gpu_devices"]
ARCH_MATRIX = "https://docs.nvidia.com/datacenter/tesla/drivers/cuda-toolkit-driver-and-architecture-matrix.html"

B200 = "0x2901"  # NVIDIA B200, open-gpu-kernel-modules README, 570.86.15
H100_SXM = "0x2330"  # NVIDIA H100 80GB HBM3, README at 535.261.03
H100_PCIE = "0x2331"  # NVIDIA H100 PCIe, README at 535.261.03 (first listed at 520.56.06)
H200 = "0x2335"  # NVIDIA H200, README first at 550.40.65
V100 = "0x1db4"  # Tesla V100-PCIE-16GB, g_nv_name_released.h at 535.261.03
UNKNOWN = "0x1234"  # no NVIDIA GPU the matrix lists
ADDRESSES = [f"0000:{bus:02x}:00.0" for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)]


def gate(ids: list[str], branch: str = "535", cuda: str = "12.1", matrix: dict[str, Any] | None = None) -> dict:
    return stack.gpu_generations(matrix or MATRIX, ids, branch, cuda, ADDRESSES[: len(ids)])


# --- the tables ----------------------------------------------------------------


def test_every_architecture_row_is_well_formed():
    assert set(ARCHITECTURES) == {"Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell"}
    for name, row in ARCHITECTURES.items():
        assert set(row) <= {"compute_capability", "min_cuda", "min_driver_branch", "last_driver_branch"}, name
        assert re.fullmatch(r"[0-9]+\.[0-9]", row["min_cuda"]) and re.fullmatch(r"[0-9]{3}", row["min_driver_branch"])
        assert all(re.fullmatch(r"[0-9]+\.[0-9]", cc) for cc in row["compute_capability"])


def test_the_architecture_minimums_are_nvidias():
    """First CUDA toolkit per architecture (NVIDIA's architecture matrix) and its driver branch: Blackwell R570 / CUDA
    12.8, Hopper and Ada CUDA 11.8, Volta's last branch R580."""
    assert {name: (row["min_cuda"], row["min_driver_branch"]) for name, row in ARCHITECTURES.items()} == {
        "Volta": ("9.0", "384"),
        "Turing": ("10.0", "410"),
        "Ampere": ("11.0", "450"),
        "Ada Lovelace": ("11.8", "520"),
        "Hopper": ("11.8", "520"),
        "Blackwell": ("12.8", "570"),
    }
    assert ARCHITECTURES["Volta"]["last_driver_branch"] == "580"
    assert ARCHITECTURES["Blackwell"]["compute_capability"] == ["10.0", "12.0"]


def test_every_device_row_is_well_formed():
    for key, row in DEVICES.items():
        assert re.fullmatch(r"[0-9A-F]{4}(-[0-9A-F]{4})?", key), f"{key}: 4 upper-case hex digits, or a range"
        assert set(row) <= {"name", "architecture", "min_driver_branch"}, key
        assert row["architecture"] in ARCHITECTURES, key
        if "min_driver_branch" in row:
            # A device's own minimum is later than its architecture's (else it says nothing).
            assert int(row["min_driver_branch"]) > int(ARCHITECTURES[row["architecture"]]["min_driver_branch"]), key


# The GPUs the project targets (README "Supported": GEMM reference figures) and Blackwell, by the IDs NVIDIA
# publishes for them (module docstring).
TARGETS = {
    "V100": ("1DB4", "Volta"),
    "T4": ("1EB8", "Turing"),
    "A100": ("20B2", "Ampere"),
    "A10": ("2236", "Ampere"),
    "A30": ("20B7", "Ampere"),
    "A40": ("2235", "Ampere"),
    "L4": ("27B8", "Ada Lovelace"),
    "L40S": ("26B9", "Ada Lovelace"),
    "RTX 3090": ("2204", "Ampere"),
    "RTX 4090": ("2684", "Ada Lovelace"),
    "H100 PCIe": ("2331", "Hopper"),
    "H100 SXM": ("2330", "Hopper"),
    "H200": ("2335", "Hopper"),
    "GH200": ("2342", "Hopper"),
    "B200": ("2901", "Blackwell"),
    "B300": ("3182", "Blackwell"),
    "GB300": ("31C2", "Blackwell"),
    "RTX 5090": ("2B85", "Blackwell"),
}


@pytest.mark.parametrize("model", list(TARGETS))
def test_the_targeted_gpus_and_blackwell_are_listed(model):
    device, architecture = TARGETS[model]
    assert DEVICES[device]["architecture"] == architecture
    assert model.split()[0] in DEVICES[device]["name"].replace("GeForce ", "")


def test_the_own_minimums_are_the_first_releases_that_list_the_device():
    """The README's Compatible GPUs table first names L40S and H100 NVL at 535.43.09, GH200 at 535.43.19, H200 at
    550.40.65, H200 NVL and GH200 144G HBM3e at 565.57.01, B300/GB300 at 580.82.07."""
    own = {key: row["min_driver_branch"] for key, row in DEVICES.items() if "min_driver_branch" in row}
    assert own == {
        "27B8": "525",
        "26B9": "535",
        "2330": "525",
        "2339": "525",
        "2321": "535",
        "2342": "535",
        "2335": "550",
        "233B": "565",
        "2348": "565",
        "3182": "580",
        "31C2": "580",
        "2BB5": "575",
    }


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0x2330", "2330"),
        ("2330", "2330"),
        ("0X2b85", "2B85"),
        (" 0x1db4\n", "1DB4"),
        ("0x23", ""),
        ("NVIDIA", ""),
        ("", ""),
    ],
)
def test_device_id_reads_sysfs_and_bare_forms(raw, expected):
    assert stack.device_id(raw) == expected


def test_a_range_classifies_an_unlisted_gb100_class_device():
    """0x2900-0x29FF: the devices NVIDIA's gpu_mgr.c (595.45.04) gives the GB100 BAR-firewall wait."""
    assert stack.gpu_device(MATRIX, "29BC")["architecture"] == "Blackwell"
    assert stack.gpu_device(MATRIX, "2901")["name"] == "NVIDIA B200"  # the exact ID wins
    assert stack.gpu_device(MATRIX, "2A00") == {}


# --- the judgement -------------------------------------------------------------


def test_blackwell_is_refused_with_535_and_cuda_12_1():
    """A B200 server on gpufleet's default stack: the branch and the CUDA release are both refused, each naming the
    GPU, its architecture, the minimum and the fix; no warning."""
    result = gate([B200] * 8)
    assert result["warnings"] == []
    assert result["errors"] == [
        "nvidia_driver_branch 535 cannot drive the NVIDIA B200 (PCI ID 10de:2901, Blackwell; 8 GPUs: 0000:18:00.0, "
        f"0000:2a:00.0, 0000:3a:00.0, ...): Blackwell needs driver branch 570 or newer ({ARCH_MATRIX}); set "
        "nvidia_driver_branch to 580",
        "cuda_release 12.1 does not support the NVIDIA B200 (PCI ID 10de:2901, Blackwell; 8 GPUs: 0000:18:00.0, "
        f"0000:2a:00.0, 0000:3a:00.0, ...): Blackwell needs CUDA 12.8 or newer ({ARCH_MATRIX}), and torch's cu121 "
        "wheels are built for CUDA 12.1; the compatibility matrix has no such CUDA release (it lists 12.1): leave "
        "this host out of the run until it has one",
    ]
    assert result["gpus"] == [
        {
            "device_id": "2901",
            "name": "NVIDIA B200",
            "architecture": "Blackwell",
            "min_driver_branch": "570",
            "last_driver_branch": "",
            "min_cuda": "12.8",
            "addresses": ADDRESSES,
        }
    ]


@pytest.mark.parametrize("device", [H100_SXM, H100_PCIE])
def test_h100_is_accepted_with_535_and_cuda_12_1(device):
    result = gate([device] * 8)
    assert result["errors"] == [] and result["warnings"] == []
    assert result["gpus"][0]["architecture"] == "Hopper"


def test_h100_is_refused_with_470():
    """Hopper needs R520 (CUDA 11.8's driver); the H100 80GB HBM3 is first listed at 525.47.07."""
    errors = gate([H100_SXM], branch="470", cuda="")["errors"]
    assert errors == [
        "nvidia_driver_branch 470 cannot drive the NVIDIA H100 80GB HBM3 (PCI ID 10de:2330, Hopper; 1 GPU: "
        "0000:18:00.0): the NVIDIA H100 80GB HBM3 needs driver branch 525 or newer, the first whose "
        "supported-GPU list names it (the Compatible GPUs table of README.md in "
        "github.com/NVIDIA/open-gpu-kernel-modules at each release's tag); set nvidia_driver_branch to "
        "525 or 535 or 580"
    ]


def test_h200_needs_a_later_branch_than_535():
    """No R535 release lists the H200 (2335); 550.40.65 is the first: 535 is refused, 580 accepted."""
    assert gate([H200], branch="535")["errors"][0].startswith(
        "nvidia_driver_branch 535 cannot drive the NVIDIA H200 (PCI ID 10de:2335, Hopper; 1 GPU: 0000:18:00.0): the "
        "NVIDIA H200 needs driver branch 550 or newer"
    )
    assert gate([H200], branch="580")["errors"] == []


def test_an_unknown_device_id_warns_and_goes_on():
    result = gate([H100_SXM, UNKNOWN, UNKNOWN])
    assert result["errors"] == []
    assert result["warnings"] == [
        "2 GPUs with PCI ID 10de:1234 (0000:2a:00.0, 0000:3a:00.0) are not in the compatibility matrix "
        "(files/compatibility.yml gpu_devices): the driver branch and CUDA release they need are not checked; add the "
        "device ID with its architecture, from NVIDIA's supported-GPU list of the driver release, to gpu_devices"
    ]
    assert [gpu["device_id"] for gpu in result["gpus"]] == ["2330", "1234"]


def test_a_mixed_host_is_refused_for_its_blackwell_gpus_only():
    result = gate([H100_SXM] * 4 + [B200] * 4)
    assert len(result["errors"]) == 2 and all(
        "NVIDIA B200" in e and "4 GPUs: 0000:9a:00.0" in e for e in result["errors"]
    )


def test_volta_is_refused_past_its_last_branch():
    """Volta's last driver branch is R580 (NVIDIA's architecture matrix): a matrix with a later branch refuses it
    there."""
    later = {**MATRIX, "driver_branches": {**MATRIX["driver_branches"], "590": MATRIX["driver_branches"]["580"]}}
    assert gate([V100], branch="580", matrix=later)["errors"] == []
    assert gate([V100], branch="590", matrix=later)["errors"] == [
        "nvidia_driver_branch 590 no longer drives the Tesla V100-PCIE-16GB (PCI ID 10de:1db4, Volta; 1 GPU: "
        f"0000:18:00.0): branch 580 is the last for Volta ({ARCH_MATRIX}); set nvidia_driver_branch to 470 or 525 or "
        "535 or 580"
    ]


def test_nothing_is_judged_without_device_ids_or_choices():
    assert gate([]) == {"gpus": [], "errors": [], "warnings": []}
    assert gate([B200], branch="", cuda="")["errors"] == []


def test_the_stack_lookup_gives_the_gate_its_choices():
    """resolve(): the reasons among the stack's errors (the branch's and the release's), the findings under gpus."""
    resolved = stack.resolve(
        MATRIX, driver_branch="535", distribution="Ubuntu", gpu_device_ids=[B200, UNKNOWN], gpu_addresses=ADDRESSES[:2]
    )
    assert [e.split(" ")[0] for e in resolved["errors"]] == ["nvidia_driver_branch", "cuda_release"]
    assert len(resolved["gpus"]["warnings"]) == 1 and "10de:1234" in resolved["gpus"]["warnings"][0]
    assert stack.resolve(MATRIX, driver_branch="535", gpu_device_ids=[H100_SXM])["errors"] == []


# --- play 1: preflight publishes the IDs, the roles refuse ---------------------


def _b200_report(host: str) -> dict[str, Any]:
    return preflight_report(FAKE_FACTS[host], gpu_device_ids=[B200] * 8)


declare_driver("ubuntu2204", preflight={"gpu_device_ids": [B200] * 8})
declare_driver("ubuntu2204", preflight={"gpu_device_ids": [H100_SXM] * 7 + [UNKNOWN]})


def test_the_driver_role_refuses_a_blackwell_host_on_535():
    cfg = driver_config("ubuntu2204", preflight={"gpu_device_ids": [B200] * 8})
    assert cfg.failed_task == "Stop on wrong driver settings (nothing has been changed)"
    assert cfg.failure.startswith(
        f"nvidia_driver settings rejected on {cfg.host}: [1] nvidia_driver_branch 535 cannot "
        "drive the NVIDIA B200 (PCI ID 10de:2901, Blackwell; 8 GPUs"
    )
    # The CUDA release is the cuda role's to refuse.
    assert "cuda_release" not in cfg.failure


def test_the_driver_role_accepts_h100s_and_warns_about_an_unknown_gpu():
    cfg = driver_config("ubuntu2204", preflight={"gpu_device_ids": [H100_SXM] * 7 + [UNKNOWN]})
    assert cfg.failure is None
    assert cfg["__nvidia_driver_stack"]["gpus"]["warnings"] == [
        "a GPU with PCI ID 10de:1234 (0000:db:00.0) is not in the compatibility matrix (files/compatibility.yml "
        "gpu_devices): the driver branch and CUDA release it needs are not checked; add the device ID with its "
        "architecture, from NVIDIA's supported-GPU list of the driver release, to gpu_devices"
    ]
    # Said once per run, with the other hosts' (validate.yml's run_once collection).
    assert cfg["__nvidia_driver_gpu_warnings"] == [
        f"WARNING {cfg.host}: " + "; ".join(cfg["__nvidia_driver_stack"]["gpus"]["warnings"])
    ]


CUDA = role_run.Batch(FAKE_FACTS, [role_run.import_role("cuda", "validate")])
CUDA.declare("ubuntu2204", preflight_report=_b200_report("ubuntu2204"))
CUDA.declare("ubuntu2204", preflight_report=preflight_report(FAKE_FACTS["ubuntu2204"]))


def test_the_cuda_role_refuses_cuda_12_1_on_a_blackwell_host():
    cfg = CUDA.get("ubuntu2204", preflight_report=_b200_report("ubuntu2204"))
    assert cfg.failure is not None
    assert cfg.failure.startswith(
        f"cuda settings rejected on {cfg.host}: [1] cuda_release 12.1 does not support the "
        "NVIDIA B200 (PCI ID 10de:2901, Blackwell; 8 GPUs"
    )
    assert "nvidia_driver_branch" not in cfg.failure


def test_the_cuda_role_accepts_the_default_h100_host():
    assert CUDA.get("ubuntu2204", preflight_report=preflight_report(FAKE_FACTS["ubuntu2204"])).failure is None


# preflight's judgement (gpufleet.fleet.host_facts) on the PCI functions as read_pci reads them: vendor, class,
# device, address, as sysfs holds them. The NVSwitch (class 0x0680) is not a GPU.
PCI = [
    ("0x10de", "0x0302", "0x2901", "0000:18:00.0"),
    ("0x8086", "0x0200", "0x1593", "0000:19:00.0"),
    ("0x10de", "0x0680", "0x22a3", "0000:05:00.0"),
    ("0x10de", "0x0302", "0x2330", "0000:2a:00.0"),
]


def test_preflight_publishes_the_gpus_device_ids_with_their_addresses():
    requirements = preflight_requirements()
    found = preflight_found(nvidia=host_facts.nvidia_devices(PCI))
    facts = {**FAKE_FACTS["ubuntu2204"], "memtotal_mb": 2_063_000}
    report = host_facts.judge("gpu-a01", found, facts, requirements)["report"]
    assert report["gpu_pci_addresses"] == ["0000:18:00.0", "0000:2a:00.0"]
    assert report["gpu_device_ids"] == ["0x2901", "0x2330"]
    assert report["nvswitch_count"] == 1
