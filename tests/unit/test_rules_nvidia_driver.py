"""The nvidia_driver role's rules (plugins/module_utils/rules/nvidia_driver.py), judged directly with plain values.

Each rule: settings it accepts, and one it refuses with its exact message. The
matrix is the collection's one reader of files/compatibility.yml (the lookup
gpufleet.fleet.stack's resolve); the package layouts are the role's vars
files. The role run of the same rules on fake hosts is in
test_driver_rendering.py and test_driver_origin.py.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpufleet.fleet.plugins.lookup.stack import load_matrix, resolve
from ansible_collections.gpufleet.fleet.plugins.module_utils.rules.nvidia_driver import READS
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import judge

REPO = Path(__file__).resolve().parents[2]
MATRIX = load_matrix()
STACK = functools.partial(resolve, MATRIX)
DEFAULT_535 = str(MATRIX["driver_branches"]["535"]["default_version"])
# A B200 (Blackwell: branch 570 or newer) and a device the matrix does not know, as preflight_report gives them.
B200_AND_UNKNOWN = {"gpu_device_ids": ["0x2901", "0xffff"], "gpu_pci_addresses": ["0000:18:00.0", "0000:2a:00.0"]}


def layouts(distribution: str) -> dict[str, Any]:
    """The role's package layouts for this OS (vars/<distribution>.yml), as include_vars loads them."""
    layout = yaml.safe_load((REPO / "roles/nvidia_driver/vars" / f"{distribution}.yml").read_text())
    return layout["__nvidia_driver_sources"]


def settings(distribution: str = "Ubuntu", **changed: Any) -> dict[str, Any]:
    """The defaults on a new host of this OS (no cuda_release, preflight_report, driver fact), changed."""
    return {
        "nvidia_driver_branch": "535",
        "nvidia_driver_version": "",
        "nvidia_driver_source": "",
        "nvidia_driver_repository_url": "",
        "nvidia_driver_repository_key_url": "",
        "nvidia_driver_repository_suites": [],
        "nvidia_driver_repository_components": [],
        "nvidia_driver_repository_manage": True,
        "nvidia_driver_repository_keyring": "",
        "nvidia_driver_kernel_release": "5.15.0-106-generic" if distribution == "Ubuntu" else "6.1.0-50-amd64",
        "nvidia_driver_module_source": "dkms",
        "nvidia_driver_headless": True,
        "nvidia_driver_fabricmanager": False,
        "nvidia_driver_blacklist_nouveau": True,
        "nvidia_driver_signed_flavours": [],
        "nvidia_driver_pin": True,
        "ansible_facts": {"distribution": distribution},
        "__nvidia_driver_sources": layouts(distribution),
        **{
            name: value
            for name, value in yaml.safe_load((REPO / "roles/nvidia_driver/vars/main.yml").read_text()).items()
            if name in READS
        },
        "__nvidia_driver_nvidia_repo_os": "ubuntu2204" if distribution == "Ubuntu" else "debian12",
        **changed,
    }


def judged(distribution: str = "Ubuntu", **changed: Any):
    return judge("nvidia_driver", "gpu-1", settings(distribution, **changed), STACK)


def reasons(distribution: str = "Ubuntu", **changed: Any) -> list[str]:
    return judged(distribution, **changed).errors


# --------------------------------------------------------------------------- resolution

RELEASE_FACTS = (
    "__nvidia_driver_source",
    "__nvidia_driver_stack",
    "__nvidia_driver_version",
    "__nvidia_driver_eol_warning",
)


@pytest.mark.parametrize(("distribution", "source"), [("Ubuntu", "nvidia"), ("Debian", "debian_nonfree")])
def test_the_defaults_resolve_the_source_stack_and_release(distribution, source):
    j = judged(distribution)
    assert j.errors == [] and j.message == ""
    stack = resolve(MATRIX, driver_branch="535", driver_version="", distribution=distribution, cuda_release="")
    assert {name: j.facts[name] for name in RELEASE_FACTS} == {
        "__nvidia_driver_source": source,
        "__nvidia_driver_stack": stack,
        "__nvidia_driver_version": DEFAULT_535,
        "__nvidia_driver_eol_warning": stack["driver"]["lifecycle"]["warning"],
    }


def test_an_explicit_source_and_version_are_kept():
    j = judged(nvidia_driver_source="ubuntu", nvidia_driver_version="535.247.01")
    assert j.errors == []
    assert (j.facts["__nvidia_driver_source"], j.facts["__nvidia_driver_version"]) == ("ubuntu", "535.247.01")
    assert j.facts["__nvidia_driver_stack"]["driver"]["version"] == "535.247.01"


def test_latest_is_empty_until_preflight_resolves_it_and_the_matrix_sees_the_default_release():
    j = judged(nvidia_driver_version="latest")
    assert j.errors == [] and j.facts["__nvidia_driver_version"] == ""
    assert j.facts["__nvidia_driver_stack"]["driver"]["version"] == DEFAULT_535
    later = judged(nvidia_driver_version="latest", __nvidia_driver_latest="535.274.02")
    assert later.facts["__nvidia_driver_version"] == "535.274.02"


def test_a_branch_past_its_end_of_life_is_noted_not_refused():
    eol = resolve(MATRIX, driver_branch="535", distribution="Ubuntu", cuda_release="12.1")["driver"]["lifecycle"]
    j = judged(cuda_release=12.1)
    assert j.errors == [] and j.facts["__nvidia_driver_eol_warning"] == eol["warning"]
    assert (
        judged(nvidia_driver_branch=580).facts["__nvidia_driver_eol_warning"]
        == resolve(MATRIX, driver_branch="580", distribution="Ubuntu")["driver"]["lifecycle"]["warning"]
    )


# --------------------------------------------------------------------------- the matrix's reasons


def test_an_unknown_branch_is_refused_and_the_release_is_the_setting():
    j = judged(nvidia_driver_branch="999", nvidia_driver_version="999.1.2")
    known = ", ".join(str(branch) for branch in MATRIX["driver_branches"])
    assert j.errors == [
        (f"nvidia_driver_branch '999' is not a driver branch gpufleet knows (the compatibility matrix lists {known})")
    ]
    assert j.facts["__nvidia_driver_version"] == "999.1.2" and j.facts["__nvidia_driver_eol_warning"] == ""


def test_a_release_of_another_branch_is_refused():
    assert reasons(nvidia_driver_version="550.127.05") == [
        (
            f"nvidia_driver_version '550.127.05' is not a release of branch 535"
            f" (expected the form 535.NNN.NN, for example {DEFAULT_535})"
        )
    ]


def test_the_gpu_gate_refuses_for_the_branch_and_warns_of_unknown_gpus_and_leaves_cuda_to_its_role():
    j = judged(preflight_report=B200_AND_UNKNOWN, cuda_release="11.0")
    assert j.errors == [
        (
            "nvidia_driver_branch 535 cannot drive the NVIDIA B200 (PCI ID 10de:2901, Blackwell; 1 GPU: 0000:18:00.0): "
            "Blackwell needs driver branch 570 or newer "
            "(https://docs.nvidia.com/datacenter/tesla/drivers/cuda-toolkit-driver-and-architecture-matrix.html); "
            "set nvidia_driver_branch to 580"
        )
    ]
    (warning,) = j.facts["__nvidia_driver_stack"]["gpus"]["warnings"]
    assert warning.startswith("a GPU with PCI ID 10de:ffff (0000:2a:00.0) is not in the compatibility matrix")
    assert reasons(preflight_report=B200_AND_UNKNOWN, nvidia_driver_branch="580", nvidia_driver_source="nvidia") == []


# --------------------------------------------------------------------------- the source


def test_a_source_of_another_os_is_refused_naming_the_valid_ones():
    """The matrix's sources of the branch on this OS do not have it either: both are said."""
    assert reasons("Debian", nvidia_driver_source="ubuntu") == [
        "nvidia_driver_source 'ubuntu' does not exist on Debian (choose one of debian_nonfree, nvidia)",
        "branch 535 is not offered by source 'ubuntu' on Debian (the compatibility matrix)",
    ]
    # A layout the matrix does not list for the branch: the first rule alone.
    assert reasons("Debian", nvidia_driver_source="nvidia", __nvidia_driver_sources={"debian_nonfree": {}}) == [
        "nvidia_driver_source 'nvidia' does not exist on Debian (choose one of debian_nonfree)"
    ]


def test_a_branch_the_source_does_not_offer_is_refused():
    assert reasons(nvidia_driver_branch="580") == []
    assert reasons(nvidia_driver_branch="580", nvidia_driver_source="ubuntu") == [
        "branch 580 is not offered by source 'ubuntu' on Ubuntu (the compatibility matrix)"
    ]


# --------------------------------------------------------------------------- the mirror


def test_the_repository_url_must_be_http():
    assert reasons(nvidia_driver_repository_url="http://mirror.example.com:8080/ubuntu") == []
    assert reasons(nvidia_driver_repository_url="ftp://mirror.example.com/ubuntu") == [
        (
            "nvidia_driver_repository_url 'ftp://mirror.example.com/ubuntu' is not an http(s) URL "
            "(for example http://mirror.example.com/debian)"
        )
    ]


def test_the_key_url_must_be_http_and_come_with_the_repository_url():
    mirror = "https://mirror.example.com/nvidia"
    assert reasons(nvidia_driver_repository_url=mirror, nvidia_driver_repository_key_url=f"{mirror}/key.asc") == []
    assert reasons(nvidia_driver_repository_url=mirror, nvidia_driver_repository_key_url="mirror/key.asc") == [
        "nvidia_driver_repository_key_url 'mirror/key.asc' is not an http(s) URL"
    ]
    assert reasons(nvidia_driver_repository_key_url=f"{mirror}/key.asc") == [
        (
            "nvidia_driver_repository_key_url is set but nvidia_driver_repository_url is empty:"
            " a mirror's key needs the mirror's URL (set nvidia_driver_repository_url to the mirror's repository root)"
        )
    ]


# --------------------------------------------------------------------------- the installed driver's source


MOVE = (
    "the driver on this host (535.230.02) came from source 'ubuntu', and the default source is 'nvidia', whose "
    "packages would replace it: set nvidia_driver_source: ubuntu to keep it, or nvidia_driver_source: nvidia to "
    "move this host"
)


def _installed(version: str = "535.230.02", **fact: Any) -> dict[str, Any]:
    return {"ansible_local": {"nvidia_driver": {"installed_version": version, **fact}}}


def test_a_default_source_that_would_replace_the_installed_driver_is_refused():
    assert reasons(**_installed(source="ubuntu")) == [MOVE]


@pytest.mark.parametrize(
    ("distribution", "changed"),
    [
        ("Ubuntu", _installed(source="nvidia")),
        ("Ubuntu", {**_installed(source="ubuntu"), "nvidia_driver_source": "nvidia"}),
        ("Ubuntu", _installed("not installed")),
        ("Ubuntu", {"ansible_local": {}}),
        ("Debian", _installed()),
    ],
    ids=["same-source", "explicit-move", "not-installed", "no-fact", "debian-old-fact"],
)
def test_the_installed_drivers_source_is_kept_or_moved_explicitly(distribution, changed):
    assert reasons(distribution, **changed) == []


def test_a_fact_of_gpufleet_0_3_came_from_canonicals_archive_on_ubuntu():
    assert reasons(**_installed()) == [MOVE]


# --------------------------------------------------------------------------- every reason, in one message


def test_every_reason_is_given_in_order_in_one_message():
    j = judged(
        "Debian",
        nvidia_driver_source="ubuntu",
        nvidia_driver_version="550.127.05",
        nvidia_driver_repository_key_url="key.asc",
    )
    assert j.message == (
        "nvidia_driver settings rejected on gpu-1: "
        f"[1] nvidia_driver_version '550.127.05' is not a release of branch 535 (expected the form 535.NNN.NN, for "
        f"example {DEFAULT_535}); "
        "[2] nvidia_driver_source 'ubuntu' does not exist on Debian (choose one of debian_nonfree, nvidia); "
        "[3] branch 535 is not offered by source 'ubuntu' on Debian (the compatibility matrix); "
        "[4] nvidia_driver_repository_key_url 'key.asc' is not an http(s) URL; "
        "[5] nvidia_driver_repository_key_url is set but nvidia_driver_repository_url is empty: a mirror's key needs "
        "the mirror's URL (set nvidia_driver_repository_url to the mirror's repository root)"
    )


def test_the_rules_resolve_the_package_lists_of_the_hosts_source():
    """What preflight.yml once resolved host by host in four set_fact tasks, from the source's layout
    (vars/Ubuntu.yml): Canonical's signed modules with the kernel's flavour metapackage (neither versioned nor held),
    a mirror's key in the repository's own keyring, and the files the managed source replaces."""
    signed = judged(nvidia_driver_source="ubuntu", nvidia_driver_module_source="signed").facts
    flavour = "linux-modules-nvidia-535-server-generic"
    assert signed["__nvidia_driver_signed_flavour_packages"] == [flavour]
    assert signed["__nvidia_driver_packages"][-1] == flavour
    assert "linux-modules-nvidia-535-server-5.15.0-106-generic" in signed["__nvidia_driver_packages"]
    assert flavour not in signed["__nvidia_driver_versioned_packages"]
    assert signed["__nvidia_driver_support_packages"] == ["initramfs-tools", "kmod"]
    assert signed["__nvidia_driver_repo_managed"] is False and signed["__nvidia_driver_replaced_sources"] == []
    mirror = judged(
        nvidia_driver_repository_url="http://mirror.example.com/cuda/ubuntu2204/x86_64/",
        nvidia_driver_repository_key_url="http://mirror.example.com/cuda/key.asc",
    ).facts
    assert mirror["__nvidia_driver_repo_url"] == "http://mirror.example.com/cuda/ubuntu2204/x86_64"
    assert mirror["__nvidia_driver_keyring"] == (
        "/etc/apt/keyrings/gpufleet-mirror.example.com_cuda_ubuntu2204_x86-5f64.asc"
    )
    assert mirror["__nvidia_driver_keyring_deb_url"] == ""
    assert mirror["__nvidia_driver_replaced_sources"] == [
        "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list",
        "/etc/apt/keyrings/gpufleet-nvidia-driver.asc",
    ]
    assert mirror["__nvidia_driver_support_packages"][:2] == ["dkms", "linux-headers-5.15.0-106-generic"]
    assert mirror["__nvidia_driver_pin"]["version"] == "-*" and mirror["__nvidia_driver_pin"]["present"] is True
    # A kernel release without an Ubuntu flavour and no nvidia_driver_signed_flavours: refused, with the fix.
    assert any(
        "no Ubuntu kernel flavour" in reason and "nvidia_driver_signed_flavours" in reason
        for reason in reasons(
            nvidia_driver_source="ubuntu", nvidia_driver_module_source="signed", nvidia_driver_kernel_release="6.8.0"
        )
    )


def test_a_source_without_signed_modules_or_fabric_manager_is_refused_where_the_host_needs_them():
    """Debian's non-free ships neither: Secure Boot (module source signed) or NVSwitches (Fabric Manager) there are
    refused by the rules, each with what to do."""
    assert reasons("Debian", nvidia_driver_module_source="signed") == [
        "Secure Boot calls for signed prebuilt modules (nvidia_driver_module_source=signed) but Debian source"
        " 'debian_nonfree' has none. Enrol a MOK for DKMS (preflight_secure_boot_policy=mok) or turn Secure Boot off"
    ]
    assert reasons("Debian", nvidia_driver_fabricmanager=True, preflight_report={"nvswitch_count": 4}) == [
        "4 NVSwitch(es) need nvidia-fabricmanager-535, which source 'debian_nonfree' does not ship: set"
        " nvidia_driver_source=nvidia (NVIDIA's CUDA repository) for this host"
    ]
    assert reasons("Debian", nvidia_driver_source="nvidia", nvidia_driver_fabricmanager=True) == []
    assert reasons("Ubuntu", nvidia_driver_source="ubuntu", nvidia_driver_module_source="signed") == []


def test_an_os_without_a_package_layout_is_refused_and_nothing_else_judged():
    values = settings("Ubuntu", ansible_facts={"distribution": "Rocky", "distribution_version": "9.3"})
    del values["__nvidia_driver_sources"]
    judgement = judge("nvidia_driver", "gpu-1", values, STACK)
    assert judgement.errors == ["no package layout for Rocky 9.3 (roles/nvidia_driver/vars has Ubuntu and Debian)"]
    assert judgement.facts == {}
