"""roles/preflight: the host read in one module run (gpufleet.fleet.host_facts) and judged in Python.

* The judgement (plugins/module_utils/host_facts.py ``judge``) is tested
  directly: every requirement's message, the warnings, the report.
* The reading runs for real here: ``read_pci`` on a sysfs tree laid out as
  the kernel's (vendor, class, device files), the module itself through
  ``ansible localhost`` on this machine.
* The MOK certificate the role names and looks for is resolved per OS by the
  role's vars (vars/main.yml: the first_found OS vars file), on fake hosts
  (tests/unit/role_run.py).

Where DKMS's MOK certificate is by default:

* Ubuntu: /var/lib/shim-signed/mok/MOK.der, the key shim-signed's
  update-secureboot-policy makes (dell/dkms: sign_build of v2.8.1 and v2.8.7,
  Ubuntu 20.04's and 22.04's dkms, signs with kmodsign and
  /var/lib/shim-signed/mok/MOK.der; prepare_signing of v3.0.10 sets it for
  ubuntu* hosts);
* Debian 12: /var/lib/dkms/mok.pub (prepare_signing of dell/dkms v3.0.10,
  and /usr/sbin/dkms of Debian's dkms 3.0.10-8+deb12u1, pool/main/d/dkms:
  mok_certificate="/var/lib/dkms/mok.pub" unless framework.conf sets it; the
  package's /etc/dkms/framework.conf has it commented out).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import role_run
from conftest import FAKE_FACTS, REPO_ROOT, preflight_found, preflight_requirements, run_module

from ansible_collections.gpufleet.fleet.plugins.module_utils import fetch, host_facts
from ansible_collections.gpufleet.fleet.plugins.module_utils.command_answer import apt_busy, run_apt

SHIM = "/var/lib/shim-signed/mok/MOK.der"
DKMS = "/var/lib/dkms/mok.pub"
FACTS = {name: {**facts, "memtotal_mb": 2_063_000} for name, facts in FAKE_FACTS.items()}


requirements = preflight_requirements
found = preflight_found


def judge(host: str = "ubuntu2204", facts: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    settings = {k: v for k, v in changes.items() if k in requirements()}
    read = {k: v for k, v in changes.items() if k not in settings}
    return host_facts.judge("gpu-a01", found(**read), facts or FACTS[host], requirements(**settings))


# --------------------------------------------------------------------------- the judgement


def test_a_healthy_host_passes_and_is_reported():
    verdict = judge()
    assert verdict["failures"] == [] and verdict["message"] == ""
    assert verdict["report"] == {
        "passed": True,
        "os": "Ubuntu 22.04",
        "gpu_pci_addresses": ["0000:18:00.0", "0000:2a:00.0"],
        "gpu_device_ids": ["0x2330", "0x2330"],
        "gpu_count": 2,
        "nvswitch_count": 0,
        "secure_boot": "disabled",
        "driver_module_source": "dkms",
        "nouveau_loaded": False,
        "in_container": False,
        "kernel_release": "6.8.0-49-generic",
        "free_disk_gb": 1649.4,
    }
    assert verdict["summary"] == (
        "gpu-a01: Ubuntu 22.04 x86_64, kernel target 6.8.0-49-generic, 2 NVIDIA GPU(s), 0 NVSwitch(es), "
        "Secure Boot disabled, nouveau not loaded, 1649.4 GB free under /usr"
    )


def test_every_unmet_requirement_is_named_in_one_message_with_what_to_do():
    verdict = host_facts.judge(
        "gpu-a01",
        found(nvidia={"gpus": [], "nvswitches": []}, free_bytes=5 * host_facts.GIB, headers_installed=False),
        {**FACTS["ubuntu2204"], "architecture": "aarch64", "distribution_version": "24.04"},
        requirements(),
    )
    assert verdict["message"].startswith(
        "gpufleet preflight failed on gpu-a01 (5 problem(s), nothing was changed): [1] "
    )
    text = verdict["message"]
    assert (
        "[1] unsupported operating system Ubuntu 24.04: gpufleet supports Ubuntu 20.04, Ubuntu 22.04, Debian 12; "
        "reinstall the host or extend preflight_supported_os at your own risk; " in text
    )
    assert (
        "[2] unsupported CPU architecture aarch64: the NVIDIA packages and cu121 wheels gpufleet installs exist "
        "for x86_64; " in text
    )
    assert "[3] only 5.0 GB free under /usr, 20 GB needed (preflight_min_free_disk_gb)" in text
    assert (
        "[4] no kernel headers for kernel 6.8.0-49-generic: linux-headers-6.8.0-49-generic is neither installed" in text
    )
    assert "[5] no NVIDIA GPU on the PCI bus (vendor 0x10de): check that the cards are seated" in text


def test_installable_headers_and_a_host_without_gpus_allowed_pass():
    verdict = judge(
        headers_installed=False, headers_candidate=True, nvidia={"gpus": [], "nvswitches": []}, require_gpus=False
    )
    assert verdict["failures"] == []
    assert judge(headers_installed=False, require_kernel_headers=False)["failures"] == []


@pytest.mark.parametrize(
    "policy, host, expected",
    [
        ("fail", "ubuntu2204", "UEFI Secure Boot is enabled and the policy is 'fail' (preflight_secure_boot_policy)."),
        (
            "signed_modules",
            "debian12",
            "the policy is 'signed_modules' (preflight_secure_boot_policy): Debian ships no signed NVIDIA modules.",
        ),
    ],
)
def test_secure_boot_stops_a_host_its_policy_cannot_serve(policy, host, expected):
    verdict = judge(host, secure_boot="enabled", secure_boot_policy=policy)
    assert len(verdict["failures"]) == 1 and expected in verdict["failures"][0]
    assert "An unsigned DKMS module will not load" in verdict["failures"][0]


def test_signed_modules_on_ubuntu_pass_and_report_the_signed_source():
    verdict = judge(secure_boot="enabled", secure_boot_policy="signed_modules")
    assert verdict["failures"] == [] and verdict["report"]["driver_module_source"] == "signed"


@pytest.mark.parametrize("certificate", [SHIM, DKMS, "/root/mok/MOK.der"])
def test_a_missing_mok_certificate_stops_the_host_naming_it(certificate):
    verdict = judge(secure_boot="enabled", secure_boot_policy="mok", mok_certificate=certificate, mok_enrolled=False)
    assert f"`mokutil --import {certificate}`, reboot" in verdict["message"]
    assert "UEFI Secure Boot is enabled and the policy is 'mok'" in verdict["message"]
    enrolled = judge(secure_boot="enabled", secure_boot_policy="mok", mok_certificate=certificate, mok_enrolled=True)
    assert enrolled["failures"] == [] and enrolled["report"]["driver_module_source"] == "dkms"


def test_an_os_without_a_default_certificate_says_which_to_enrol():
    rocky = {
        **FACTS["debian12"],
        "distribution": "Rocky",
        "distribution_version": "9.3",
        "distribution_major_version": "9",
    }
    verdict = host_facts.judge(
        "gpu-a01", found(secure_boot="enabled"), rocky, requirements(secure_boot_policy="mok", mok_certificate="")
    )
    assert "unsupported operating system Rocky 9" in verdict["message"]
    assert (
        "(`mokutil --import` the certificate DKMS signs with, named in preflight_mok_certificate, reboot"
        in verdict["message"]
    )


def test_nouveau_warns_or_stops_as_its_policy_says():
    warned = judge(nouveau_loaded=True)
    assert warned["failures"] == []
    assert "WARNING gpu-a01: nouveau is loaded; the NVIDIA driver will only load after a reboot" in warned["warnings"]
    stopped = judge(nouveau_loaded=True, nouveau_policy="fail")
    assert stopped["failures"] == [
        "the nouveau driver is loaded and preflight_nouveau_policy is 'fail': blacklist it (the nvidia_driver role "
        "does) and reboot before installing"
    ]


def test_memory_below_the_recommended_size_warns():
    small = {**FACTS["ubuntu2204"], "memtotal_mb": 64_000}
    verdict = host_facts.judge("gpu-a01", found(), small, requirements())
    assert verdict["failures"] == []
    assert verdict["warnings"] == [
        "WARNING gpu-a01: 62.5 GB RAM, below the 128 GB recommended for multi-GPU training (data loaders and pinned "
        "memory)"
    ]


def test_a_container_guest_is_reported_as_one():
    podman = {**FACTS["debian12"], "virtualization_role": "guest", "virtualization_type": "podman"}
    verdict = host_facts.judge("gpu-a01", found(), podman, requirements())
    assert verdict["report"]["in_container"] is True and verdict["summary"].endswith(", in a container")
    assert verdict["report"]["os"] == "Debian 12"


# --------------------------------------------------------------------------- the reading


def _device(sysfs: Path, address: str, vendor: str, pci_class: str, device: str) -> None:
    directory = sysfs / address
    directory.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("class", pci_class), ("device", device)):
        (directory / name).write_text(value + "\n")


def pci_tree(sysfs: Path) -> Path:
    """An HGX-like bus: a B200 and an H100 (3D controllers), an NVSwitch (bridge), an Intel E810 NIC, and an
    ASPEED BMC VGA controller. IDs as the kernel's sysfs files hold them (README.md "Compatible GPUs" of
    NVIDIA/open-gpu-kernel-modules for 2901 and 2330; 22a3 is the H100 NVSwitch, 1593 the E810, 1a03:2000
    the AST2500 VGA)."""
    _device(sysfs, "0000:18:00.0", "0x10de", "0x030200", "0x2901")
    _device(sysfs, "0000:19:00.0", "0x8086", "0x020000", "0x1593")
    _device(sysfs, "0000:05:00.0", "0x10de", "0x068000", "0x22a3")
    _device(sysfs, "0000:2a:00.0", "0x10de", "0x030200", "0x2330")
    _device(sysfs, "0000:03:00.0", "0x1a03", "0x030000", "0x2000")
    (sysfs / "0000:00:00.0").mkdir()  # a function without readable files is skipped
    return sysfs


def test_the_gpus_and_nvswitches_are_told_apart_on_the_pci_bus(tmp_path):
    devices = host_facts.nvidia_devices(host_facts.read_pci(str(pci_tree(tmp_path))))
    assert devices == {
        "gpus": [
            {"address": "0000:18:00.0", "device_id": "0x2901"},
            {"address": "0000:2a:00.0", "device_id": "0x2330"},
        ],
        "nvswitches": [{"address": "0000:05:00.0", "device_id": "0x22a3"}],
    }
    assert host_facts.read_pci(str(tmp_path / "absent")) == []


def test_the_standalone_check_counts_the_same_gpus(tmp_path):
    """gpufleet_check (the node's own check, without Ansible) reads the same sysfs files its own way."""
    sys.path.insert(0, str(REPO_ROOT / "roles/payload/files"))
    try:
        from gpufleet_check import facts
    finally:
        sys.path.pop(0)
    pci_tree(tmp_path)
    assert facts.count_pci_gpus(tmp_path) == len(host_facts.nvidia_devices(host_facts.read_pci(str(tmp_path)))["gpus"])
    assert facts.NVIDIA_PCI_VENDOR == host_facts.NVIDIA_PCI_VENDOR
    assert tuple(facts.GPU_PCI_CLASSES) == host_facts.GPU_PCI_CLASSES


def test_the_headers_answers_of_dpkg_and_apt_are_read():
    # dpkg-query -W -f='${Status}' of an installed package, and apt-cache policy's Candidate line
    # (apt's own wording, cmdline/apt-cache.cc: "  Candidate: " then the version or "(none)").
    assert host_facts.headers_installed("install ok installed")
    assert not host_facts.headers_installed("deinstall ok config-files")
    assert host_facts.headers_candidate(
        "linux-headers-6.8.0-49-generic:\n  Installed: (none)\n  Candidate: 6.8.0-49.49\n"
    )
    assert not host_facts.headers_candidate("linux-headers-0.0:\n  Installed: (none)\n  Candidate: (none)\n")
    assert not host_facts.headers_candidate("")


def test_apt_waits_for_a_lock_another_apt_holds():
    """apt's words when another apt holds the lock: the module waits and tries again (many inventory names of one
    node refresh its index at once). Verbatim from a lab run of 2026-12-04 (Debian 12's apt 2.6)."""
    assert apt_busy(
        "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 509 (apt-get)\n"
        "E: Unable to lock directory /var/lib/apt/lists/"
    )
    assert not apt_busy("E: The repository 'http://gpufleet-mirror/debian bookworm Release' is not signed.")
    assert not fetch.fetch_failure("E: Could not get lock /var/lib/apt/lists/lock. It is held by process 509")


def test_apt_tries_again_when_another_apt_rebuilt_the_cache_at_the_same_moment():
    """apt-get update's words when another apt (another inventory name of the same node) replaced the package cache
    while it wrote its own: verbatim from the e2e bad-input batch of 2026-12-05 on the lab (Debian 12's apt 2.6, its
    stderr). Passing: the module waits and tries again, as for the lock."""
    assert apt_busy(
        "E: Problem renaming the file /var/cache/apt/srcpkgcache.bin.iSNUXD to /var/cache/apt/srcpkgcache.bin - rename "
        "(2: No such file or directory)\n"
        "W: You may want to run apt-get update to correct these problems\n"
        "E: The package cache file is corrupted\n"
    )
    assert not apt_busy("E: The package cache file is corrupted\n")


class _Apt:
    """A module whose apt answers, in turn, each of ``answers`` ((rc, stdout, stderr)), then the last again."""

    def __init__(self, *answers: tuple[int, str, str]):
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def run_command(self, argv: list[str], environ_update: dict | None = None) -> tuple[int, str, str]:
        self.calls.append(argv)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


RENAMED = (
    100,
    "",
    "E: Problem renaming the file /var/cache/apt/srcpkgcache.bin.iSNUXD to /var/cache/apt/srcpkgcache.bin - rename "
    "(2: No such file or directory)\n",
)


def test_an_apt_command_runs_again_while_another_apt_is_at_work_and_no_longer():
    """command_answer.run_apt (host_facts' index refresh and apt-cache policy, apt_trial's apt-cache madison and show
    on a converged host): again while apt's words say another apt is at work (the verbatim words above), the answer
    as it is otherwise, and the last busy answer once the time is up."""
    slept: list[float] = []
    busy_then_ok = _Apt(RENAMED, RENAMED, (0, "nvidia-utils-535 | 535.261.03-1 | http://mirror bookworm/main\n", ""))
    assert run_apt(busy_then_ok, ["apt-cache", "madison", "x"], sleep=slept.append)[0] == 0
    assert len(busy_then_ok.calls) == 3 and slept == [1, 1]
    other_error = _Apt((100, "", "E: The package cache file is corrupted\n"))
    assert run_apt(other_error, ["apt-cache", "madison", "x"], sleep=slept.append)[0] == 100
    assert len(other_error.calls) == 1
    always_busy = _Apt(RENAMED)
    assert run_apt(always_busy, ["apt-cache", "madison", "x"], timeout_s=0, sleep=slept.append) == RENAMED
    assert len(always_busy.calls) == 1


def _module(tmp_path: Path, **arguments: Any) -> dict[str, Any]:
    """The module run for real on this machine, as Ansible runs it (its arguments in a JSON file), its result."""
    return run_module(tmp_path, "host_facts", **arguments)


def test_the_module_reads_this_machine_in_one_run(tmp_path):
    result = _module(tmp_path, disk_path=str(tmp_path), kernel_release="0.0.0-gpufleet-test", refresh_index=False)
    assert result.get("failed") is not True, result
    read = result["found"]
    assert read["free_bytes"] > 0 and isinstance(read["free_bytes"], int)
    assert read["secure_boot"] in ("bios", "disabled", "enabled")
    assert read["headers_installed"] is False and read["headers_candidate"] is False
    assert result["changed"] is False and "passed" not in result and "summary" not in result


def test_the_judged_result_is_the_report_and_reads_what_the_play_did_not_gather(tmp_path):
    """With requirements, the result's fields are the report (preflight registers it as preflight_report); the RAM
    and the virtualization pair the play did not gather (empty) are read here, as Ansible's setup reads them."""
    facts = {**FACTS["debian12"], "memtotal_mb": "", "virtualization_role": "", "virtualization_type": ""}
    settings = {**requirements(), "supported_os": [{"distribution": "Debian", "version": "12"}], "require_gpus": False}
    settings.update(min_free_disk_gb=0, warn_ram_below_gb=0, require_kernel_headers=False)
    given = {name: value for name, value in settings.items() if name not in ("disk_path", "mok_certificate")}
    result = _module(tmp_path, disk_path=str(tmp_path), host="gpu-a01", facts=facts, requirements=given)
    settings.update(disk_path=str(tmp_path), mok_certificate="")
    assert result.get("failed") is not True, result
    verdict = host_facts.judge("gpu-a01", result["found"], {**facts, **_setup_facts(tmp_path)}, settings)
    assert {name: result[name] for name in verdict["report"]} == verdict["report"]
    assert result["summary"] == verdict["summary"] and "report" not in result
    assert host_facts.memtotal_mb() == _setup_facts(tmp_path)["memtotal_mb"] > 0


def _setup_facts(tmp_path: Path) -> dict[str, Any]:
    """memtotal_mb and the virtualization pair as ansible.builtin.setup reads them on this machine."""
    out = subprocess.run(
        ["ansible", "localhost", "-m", "ansible.builtin.setup", "-a", "gather_subset=!all,hardware,virtual", "-o"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    facts = json.loads(out.split(" => ", 1)[1])["ansible_facts"]
    return {
        "memtotal_mb": facts["ansible_memtotal_mb"],
        "virtualization_role": facts["ansible_virtualization_role"],
        "virtualization_type": facts["ansible_virtualization_type"],
    }


def test_a_missing_disk_path_fails_the_module_naming_it(tmp_path):
    result = _module(tmp_path, disk_path=str(tmp_path / "absent"))
    assert result["failed"] is True
    assert result["msg"].startswith(f"cannot read the free space under {tmp_path / 'absent'} on the host: ")


def test_the_module_judges_with_the_roles_settings(tmp_path):
    result = _module(
        tmp_path,
        disk_path=str(tmp_path),
        host="here",
        facts={**FACTS["debian12"], "architecture": "x86_64"},
        # The path read is the one judged and named: the requirements do not repeat it (nor the certificate).
        requirements={
            name: value
            for name, value in requirements(min_free_disk_gb=10**9, require_kernel_headers=False).items()
            if name not in ("disk_path", "mok_certificate")
        },
    )
    # An unmet requirement fails the module with the message that names them all, and only its reasons (the host
    # stops there).
    assert result["failed"] is True and set(result) >= {"msg", "failures"} and "found" not in result, result
    assert (
        result["msg"].startswith("gpufleet preflight failed on here (")
        and "nothing was changed): [1] only " in (result["msg"])
    )
    assert f"GB free under {tmp_path}, 1000000000 GB" in result["msg"] and result["failures"][0].startswith("only ")


def test_the_module_compares_the_cgroup_mode_with_the_slurm_release(tmp_path):
    """slurm's comparison (tasks/cgroup.yml) in the same run: the cgroup file system is always read; with a package
    apt has no list of, the release the distribution ships counts."""
    settings = {"shipped_release": "21.08", "cgroup_v2_release": "22.05", "without_plugin": "no_confinement"}
    result = _module(
        tmp_path,
        disk_path=str(tmp_path),
        facts={"distribution": "Ubuntu", "distribution_version": "22.04"},
        slurm={**settings, "package": "gpufleet-no-such-package"},
    )
    assert result.get("failed") is not True, result
    cgroup = result["slurm_cgroup"]
    filesystem = result["found"]["cgroup_filesystem"]
    assert cgroup == host_facts.slurm_cgroup(
        filesystem,
        "",
        {**settings, "package": "gpufleet-no-such-package"},
        {"distribution": "Ubuntu", "distribution_version": "22.04"},
    )
    assert cgroup["release"] == "21.08" and cgroup["version_from"] == "the release Ubuntu 22.04 ships"
    assert "slurm_cgroup" not in _module(tmp_path, disk_path=str(tmp_path))


# --------------------------------------------------------------------------- the role's MOK certificate per OS

RESOLVED = role_run.Batch(
    FACTS,
    [role_run.expose("preflight", "check")],
    after=[
        role_run.capture(
            role_run.names("__preflight_mok_certificate"), vars={"role_path": str(REPO_ROOT / "roles" / "preflight")}
        )
    ],
)


@pytest.mark.parametrize(
    "host, settings, expected",
    [
        ("ubuntu2004", {}, SHIM),
        ("ubuntu2204", {}, SHIM),
        ("debian12", {}, DKMS),
        # The user's setting wins on every OS.
        ("debian12", {"preflight_mok_certificate": "/root/mok/MOK.der"}, "/root/mok/MOK.der"),
    ],
)
def test_the_role_names_the_oss_mok_certificate(host, settings, expected):
    outcome = RESOLVED.get(host, **settings)
    assert outcome.failure is None
    assert outcome["__preflight_mok_certificate"] == expected


def test_an_os_without_a_default_names_no_certificate():
    rocky = {**FACTS["debian12"], "distribution": "Rocky", "distribution_major_version": "9", "os_family": "RedHat"}
    assert RESOLVED.get(rocky)["__preflight_mok_certificate"] == ""
