"""The driver branch's end of life in play 1, and a fleet moved from 535 to 580 with its CUDA release kept.

Role runs (tests/unit/role_run.py) on fake hosts: roles/nvidia_driver's
validate.yml says, once per run, which hosts are on a branch past NVIDIA's end
of life and which supported Long Term Support Branch runs the same CUDA
release; playbooks/upgrade-driver.yml's settings for
``-e upgrade_driver_version=580.95.05`` plan NVIDIA's 580 packages on an
Ubuntu 22.04 host while the cuda role keeps CUDA 12.1. The 580 branch has no
package in the lab: this is where it is tested.
"""

from __future__ import annotations

import datetime
import importlib.util
from pathlib import Path

import pytest
import role_run
import yaml
from conftest import FAKE_FACTS, declare_driver, driver_config

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("stack_for_lifecycle", REPO / "plugins/lookup/stack.py")
stack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stack)
MATRIX = stack.load_matrix()

# 580.95.05: an R580 data center release (NVIDIA's
# https://developer.download.nvidia.com/compute/nvidia-driver/redist/redistrib_580.95.05.json, released
# 2025-10-01, with Fabric Manager; the GPU Operator's life-cycle policy names it, NVIDIA/cloud-native-docs#305).
# Its Ubuntu packages are nvidia-headless-580 and nvidia-utils-580 (packages.ubuntu.com, jammy: source
# nvidia-graphics-drivers-580), the 535 layout of roles/nvidia_driver/vars/Ubuntu.yml; the names change only
# from 590 on (NVIDIA's Driver Installation Guide, "Ubuntu 590 and later packages").
TARGET = "580.95.05"

# --------------------------------------------------------------------------- the warning, once per run

# Two passes of validate.yml in one play, as play 1 and play 2 of site.yml run it (or play 1 and each batch
# of upgrade-driver.yml): the first collects and says the warning, the second says nothing again.
LIFECYCLE_TASKS = [
    role_run.import_role("nvidia_driver", "validate"),
    {
        "name": "Keep what the first pass collected",
        "ansible.builtin.set_fact": {
            "first_pass": "{{ __nvidia_driver_warnings_collected }}",
            "first_warnings": "{{ __nvidia_driver_eol_warnings }}",
        },
    },
    role_run.import_role("nvidia_driver", "validate"),
]
FLEET = [
    role_run.Host("gpu-a", FAKE_FACTS["ubuntu2204"], play="fleet"),
    role_run.Host("gpu-b", FAKE_FACTS["ubuntu2204"], play="fleet"),
    role_run.Host("gpu-c", FAKE_FACTS["debian12"], play="fleet"),
    role_run.Host(
        "gpu-d",
        FAKE_FACTS["ubuntu2204"],
        {"nvidia_driver_branch": "580", "nvidia_driver_source": "nvidia"},
        play="fleet",
    ),
    # Refused (no such branch): its rejection is its message, not a warning.
    role_run.Host("gpu-e", FAKE_FACTS["ubuntu2204"], {"nvidia_driver_branch": "999"}, play="fleet"),
]


@pytest.fixture(scope="module")
def fleet() -> dict[str, role_run.Outcome]:
    return role_run.run(FLEET, LIFECYCLE_TASKS)


def _warning(branch: str, distribution: str) -> str:
    """What the matrix says of the branch today (its dated cases are in test_plugins_stack_lifecycle.py)."""
    return stack.resolve(MATRIX, driver_branch=branch, distribution=distribution)["driver"]["lifecycle"]["warning"]


def test_one_warning_line_per_message_naming_its_hosts(fleet):
    expected = []
    if _warning("535", "Ubuntu"):
        expected.append(f"WARNING gpu-a, gpu-b: {_warning('535', 'Ubuntu')}")
    if _warning("535", "Debian"):
        expected.append(f"WARNING gpu-c: {_warning('535', 'Debian')}")
    if _warning("580", "Ubuntu"):
        expected.append(f"WARNING gpu-d: {_warning('580', 'Ubuntu')}")
    for host in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
        assert fleet[host].failure is None
        # Collected once (run_once), given to every host of the play.
        assert fleet[host]["first_warnings"] == expected
        assert fleet[host]["__nvidia_driver_eol_warnings"] == expected
    assert "999" in fleet["gpu-e"].failure


def test_an_unknown_cuda_release_is_the_cuda_roles_to_refuse():
    """The driver role passes cuda_release for the lifecycle only: a release the matrix does not know is
    refused once, by the cuda role (said once: issue 16, item 21)."""
    host = [role_run.Host("gpu-f", FAKE_FACTS["ubuntu2204"], {"cuda_release": "11.0"})]
    assert role_run.run(host, [role_run.import_role("nvidia_driver", "validate")])["gpu-f"].failure is None
    refusal = role_run.run(host, [role_run.import_role("cuda", "validate")])["gpu-f"].failure
    assert refusal.count("cuda_release '11.0' is not a CUDA release gpufleet knows") == 1


@pytest.mark.skipif(
    datetime.date.today() < datetime.date(2026, 7, 1), reason="535 reaches its end of life in June 2026"
)
def test_535_is_warned_about_and_580_named(fleet):
    """On and after July 2026 (this was written on 2026-12-01), the default branch is warned about, not refused."""
    lines = fleet["gpu-a"]["__nvidia_driver_eol_warnings"]
    assert lines[0].startswith(
        "WARNING gpu-a, gpu-b: NVIDIA driver branch 535 (Long Term Support Branch) is past its end of life (2026-06, "
    )
    assert "branch 580, the Long Term Support Branch supported until 2028-06" in lines[0]
    assert lines[0].endswith("-e upgrade_driver_version=580.95.05")
    assert lines[1].startswith("WARNING gpu-c: ") and lines[1].endswith(
        "but no source gpufleet knows offers it on Debian"
    )
    assert not any("gpu-d" in line or "gpu-e" in line for line in lines)


def test_the_warning_is_collected_and_said_in_the_first_pass_only(fleet):
    for host in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
        assert fleet[host]["first_pass"].get("skipped") is not True
        assert fleet[host]["__nvidia_driver_warnings_collected"]["skipped"] is True
    # The task that says it runs only where the collection ran, once for the play.
    warnings = yaml.safe_load((REPO / "roles/nvidia_driver/tasks/warnings.yml").read_text())
    (say,) = [task for task in warnings if task["name"].startswith("Warn about unknown GPUs and a driver branch")]
    assert say["run_once"] is True and "__nvidia_driver_warnings_collected is not skipped" in say["when"]
    assert "ansible.builtin.debug" in say and "fail" not in str(say)


# --------------------------------------------------------------------------- upgrade-driver.yml: 535 -> 580


def _upgrade_settings(version: str) -> dict[str, str]:
    """The driver settings both plays of playbooks/upgrade-driver.yml give the roles, with -e upgrade_driver_version."""
    plays = yaml.safe_load((REPO / "playbooks/upgrade-driver.yml").read_text())
    check, upgrade = plays[0]["vars"], plays[1]["vars"]
    names = ("nvidia_driver_version", "nvidia_driver_branch")
    assert {name: check[name].replace(" | default('')", "") for name in names} == {
        name: upgrade[name] for name in names
    }
    return {"upgrade_driver_version": version, **{name: upgrade[name] for name in names}}


UPGRADE_580 = {**_upgrade_settings(TARGET), "nvidia_driver_source": "nvidia"}
CUDA_CHECK = role_run.Batch(FAKE_FACTS, [role_run.import_role("cuda", "validate")])


def test_the_upgrade_plans_nvidias_580_packages_at_the_release():
    cfg = driver_config("ubuntu2204", **UPGRADE_580)
    assert cfg.failure is None
    assert cfg["__nvidia_driver_version"] == TARGET
    assert (
        cfg["__nvidia_driver_repo_url"] == "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64"
    )
    assert cfg["__nvidia_driver_packages"] == ["nvidia-headless-580", "nvidia-utils-580"]
    assert cfg["__nvidia_driver_version_package"] == "nvidia-utils-580"
    assert cfg["__nvidia_driver_pin_patterns"] == ["*nvidia*-580", "*nvidia*-580-*", "cuda-drivers-580", "cuda-drivers"]
    (pin,) = cfg["main_pins"]
    assert f"Pin: version {TARGET}-*\n" in pin["text"] and "535" not in pin["text"]


def test_the_upgrade_keeps_fabric_manager_on_nvswitch_hosts():
    cfg = driver_config("ubuntu2204", preflight={"nvswitch_count": 4}, **UPGRADE_580)
    assert cfg["__nvidia_driver_packages"][-2:] == ["nvidia-fabricmanager-580", "libnvidia-nscq-580"]


def test_the_upgrade_keeps_cuda_12_1():
    """The cuda role's check of play 1 with the new driver: CUDA 12.1 (needs >= 530.30.02) stays, at its build."""
    cfg = CUDA_CHECK.get("ubuntu2204", **UPGRADE_580)
    assert cfg.failure is None
    assert (cfg["__cuda_release"], cfg["__cuda_driver"], cfg["__cuda_driver_source"]) == (
        "12.1",
        TARGET,
        "nvidia_driver_version",
    )
    assert cfg["__cuda_spec"]["toolkit_version"] == "12.1.1-1" and cfg["__cuda_invalid"] == []


@pytest.mark.parametrize(
    ("host", "source", "reason"),
    [
        ("ubuntu2204", "ubuntu", "branch 580 is not offered by source 'ubuntu' on Ubuntu (the compatibility matrix)"),
        ("debian12", "nvidia", "branch 580 is not offered by source 'nvidia' on Debian (the compatibility matrix)"),
    ],
    ids=["ubuntu-canonical-archive", "debian"],
)
def test_the_upgrade_to_580_is_refused_where_no_source_offers_it(host, source, reason):
    settings = {**_upgrade_settings(TARGET), **({"nvidia_driver_source": source} if source else {})}
    assert reason in driver_config(host, **settings).failure


declare_driver("ubuntu2204", **UPGRADE_580)
declare_driver("ubuntu2204", preflight={"nvswitch_count": 4}, **UPGRADE_580)
declare_driver("ubuntu2204", **_upgrade_settings(TARGET), nvidia_driver_source="ubuntu")
declare_driver("debian12", **_upgrade_settings(TARGET), nvidia_driver_source="nvidia")
