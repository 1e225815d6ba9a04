"""roles/preflight's Secure Boot check with policy mok: the MOK certificate it looks for and names, per OS.

The role runs for real on fake hosts (tests/unit/role_run.py): its
tasks/os.yml (the OS's values, controller-side), then tasks/check.yml, the
results of probe.yml's host probes given as host variables as they are
registered; the stat task of probe.yml is templated as a copy (its path and
its ``when``) in the same play.

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

from typing import Any

import pytest
import role_run
from conftest import FAKE_FACTS

SHIM = "/var/lib/shim-signed/mok/MOK.der"
DKMS = "/var/lib/dkms/mok.pub"
STAT = role_run.role_task("preflight", "probe.yml", "Look for the enrolled MOK certificate")
FACTS = {name: {**facts, "memtotal_mb": 2_063_000} for name, facts in FAKE_FACTS.items()}
CHECK = role_run.Batch(
    FACTS,
    [
        role_run.import_role("preflight", "os"),
        role_run.import_role("preflight", "check"),
    ],
    after=[
        role_run.capture({"stat_path": STAT["ansible.builtin.stat"]["path"], "stat_runs": role_run.condition(STAT)})
    ],
)


def _probed(mok_exists: bool | None) -> dict[str, Any]:
    """probe.yml's registered results on a healthy 8-GPU host with Secure Boot on; mok_exists None: not looked for."""
    return {
        "__preflight_pci": {"stdout_lines": [f"0x10de 0x0302 0x2330 0000:{bus:02x}:00.0" for bus in (0x18, 0x2A)]},
        "__preflight_df": {
            "stdout_lines": [
                "Filesystem 1-blocks Used Available Capacity Mounted on",
                "/dev/nvme0n1p2 1967317618688 96148692992 1771081269248 6% /",
            ]
        },
        "__preflight_secure_boot": {"stdout": "enabled"},
        "__preflight_nouveau": {"stat": {"exists": False}},
        "__preflight_mok": {"skipped": True, "changed": False}
        if mok_exists is None
        else {"stat": {"exists": mok_exists}},
        "__preflight_headers_installed": {"stdout": "install ok installed"},
        "preflight_secure_boot_policy": "mok",
    }


CASES = [
    ("ubuntu2004", {}),
    ("ubuntu2204", {}),
    ("debian12", {}),
    ("debian12", {"preflight_mok_certificate": "/root/mok/MOK.der"}),
]
for _host, _settings in CASES:
    for _exists in (False, True):
        CHECK.declare(_host, **_probed(_exists), **_settings)


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
def test_a_missing_mok_certificate_stops_the_host_naming_the_oss_path(host, settings, expected):
    outcome = CHECK.get(host, **_probed(False), **settings)
    assert outcome["__preflight_mok_certificate"] == expected
    assert outcome.failed_task == "Stop when the host is not fit for provisioning"
    assert f"`mokutil --import {expected}`, reboot" in outcome.failure
    assert "UEFI Secure Boot is enabled and the policy is 'mok'" in outcome.failure


@pytest.mark.parametrize(
    "host, settings, expected",
    [
        ("ubuntu2004", {}, SHIM),
        ("ubuntu2204", {}, SHIM),
        ("debian12", {}, DKMS),
        ("debian12", {"preflight_mok_certificate": "/root/mok/MOK.der"}, "/root/mok/MOK.der"),
    ],
)
def test_an_enrolled_mok_certificate_lets_dkms_build(host, settings, expected):
    outcome = CHECK.get(host, **_probed(True), **settings)
    assert outcome.failure is None
    # probe.yml's stat looks for that certificate.
    assert outcome["stat_path"] == expected and outcome["stat_runs"] is True
    assert outcome["preflight_report"]["driver_module_source"] == "dkms"
    assert outcome["preflight_report"]["secure_boot"] == "enabled"


def test_an_os_without_a_default_looks_for_no_certificate():
    """An OS outside the Debian family has no values file: nothing to stat, and the OS check stops the host."""
    rocky = {
        **FACTS["debian12"],
        "distribution": "Rocky",
        "distribution_version": "9.3",
        "distribution_major_version": "9",
        "os_family": "RedHat",
    }
    outcome = CHECK.get(rocky, **_probed(None))
    assert outcome["__preflight_mok_certificate"] == ""
    assert "unsupported operating system Rocky 9" in outcome.failure
    assert (
        "(`mokutil --import` the certificate DKMS signs with, named in preflight_mok_certificate, reboot"
        in outcome.failure
    )


# --------------------------------------------------------------------------- the one host probe

PROBE = role_run.role_task("preflight", "probe.yml", "Read the PCI devices, the free space")
KEEP = role_run.role_task("preflight", "probe.yml", "Keep each answer of the probe")


def _probe_script(disk_path: str, require_headers: bool) -> str:
    """The probe's shell script as the role renders it (Ansible's Jinja: trim_blocks, the quote filter)."""
    import shlex

    import jinja2

    environment = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    environment.filters["quote"] = lambda value: shlex.quote(str(value))
    environment.filters["bool"] = bool
    return environment.from_string(PROBE["ansible.builtin.shell"]).render(
        preflight_disk_path=disk_path,
        preflight_require_kernel_headers=require_headers,
        preflight_kernel_release="0.0.0-gpufleet-test",
        __preflight_secure_boot_efivar="/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c",
    )


def _run_probe(disk_path: str, require_headers: bool) -> Any:
    import subprocess

    return subprocess.run(
        ["/bin/bash", "-c", _probe_script(disk_path, require_headers)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("require_headers", [True, False])
def test_the_probe_answers_each_question_in_the_shape_of_its_own_command(tmp_path, require_headers):
    """The probe runs for real here (bash, /sys, df, dpkg-query) and each answer is kept as the five commands
    it replaced registered theirs, which is what check.yml reads (one round trip per host: issue 17)."""
    result = _run_probe(str(tmp_path), require_headers)
    assert result.returncode == 0, result.stderr
    host = role_run.Host("probed", FAKE_FACTS["debian12"], {"__preflight_probe": {"stdout": result.stdout}})
    outcome = role_run.run(
        [host],
        [KEEP],
        after=[
            role_run.capture(
                role_run.names(
                    "__preflight_pci",
                    "__preflight_df",
                    "__preflight_secure_boot",
                    "__preflight_nouveau",
                    "__preflight_headers_installed",
                )
            )
        ],
    )["probed"]
    assert outcome.failure is None
    assert all(len(line.split()) == 4 and line.startswith("0x") for line in outcome["__preflight_pci"]["stdout_lines"])
    df = outcome["__preflight_df"]["stdout_lines"]
    assert df[0].startswith("Filesystem") and df[-1].split()[3].isdigit()
    assert outcome["__preflight_secure_boot"]["stdout"] in ("bios", "disabled", "enabled")
    assert outcome["__preflight_nouveau"]["stat"]["exists"] in (True, False)
    # Not installed (no such kernel) reads as not installed; not asked for, nothing.
    assert "install ok installed" not in outcome["__preflight_headers_installed"]["stdout"]
    assert ("[headers]" in result.stdout) is require_headers


def test_a_missing_disk_path_fails_the_probe_naming_it(tmp_path):
    result = _run_probe(str(tmp_path / "absent"), False)
    assert result.returncode != 0
    assert f"{tmp_path / 'absent'}" in result.stderr
