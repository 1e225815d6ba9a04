"""The filters that read what a node's commands printed or returned, called directly: dkms_status, apt_policy,
sections, delegated_facts and check_entry."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from plugin_files import filters

# --- dkms_status --------------------------------------------------------------
# dkms printed "module, version, kernel, arch: state" up to 2.8.5 and prints "module/version, ..." from 2.8.6 on
# (dell/dkms commit f83b758, first in tag v2.8.6; added modules, "module/version: added", from 2.8.7 on: commit
# 65f01a0, first in tag v2.8.7; do_status in dell/dkms's dkms of v2.8.1, v2.8.7 and dkms.in of v3.0.10).


def _record(module, version, kernel, arch, state, notes=()):
    return {"module": module, "version": version, "kernel": kernel, "arch": arch, "state": state, "notes": list(notes)}


@pytest.mark.parametrize(
    "line, expected",
    [
        # Ubuntu 20.04 and 22.04, as printed there (openstack/diskimage-builder commit abc2524a, "Adopted dkms element
        # to work on Ubuntu Jammy and nvidia drivers").
        (
            "nvidia, 510.47.03, 5.4.0-109-generic, x86_64: installed",
            _record("nvidia", "510.47.03", "5.4.0-109-generic", "x86_64", "installed"),
        ),
        (
            "nvidia/510.47.03, 5.15.0-27-generic, x86_64: installed",
            _record("nvidia", "510.47.03", "5.15.0-27-generic", "x86_64", "installed"),
        ),
        # dkms 2.8.4 and 3.0.3 on one host (void-linux/void-packages pull request 35026).
        (
            "v4l2loopback, 0.12.5, 5.15.16_1, x86_64: installed",
            _record("v4l2loopback", "0.12.5", "5.15.16_1", "x86_64", "installed"),
        ),
        (
            "v4l2loopback/0.12.5, 5.15.16_1, x86_64: installed",
            _record("v4l2loopback", "0.12.5", "5.15.16_1", "x86_64", "installed"),
        ),
        # Remarks after the state (module_status_built_extra in dell/dkms): negativo17/nvidia-driver issue 56,
        # strongtz/i915-sriov-dkms issue 274.
        (
            "nvidia, 396.45, 4.17.14-202.fc28.x86_64, x86_64: installed (original_module exists)",
            _record("nvidia", "396.45", "4.17.14-202.fc28.x86_64", "x86_64", "installed", ["original_module exists"]),
        ),
        (
            "i915-sriov-dkms/2025.03.26, 6.11.11-2-pve, x86_64: installed (WARNING! Diff between built and installed "
            "module!)",
            _record(
                "i915-sriov-dkms",
                "2025.03.26",
                "6.11.11-2-pve",
                "x86_64",
                "installed",
                ["WARNING! Diff between built and installed module!"],
            ),
        ),
        # A module built but not installed, and one only added (no kernel): do_status's other cases in dell/dkms v2.8.1
        # ("$m, $v: $status") and v3.0.10 ("$m/$v: $status").
        (
            "nvidia-current/535.261.03, 6.1.0-18-amd64, x86_64: built",
            _record("nvidia-current", "535.261.03", "6.1.0-18-amd64", "x86_64", "built"),
        ),
        ("nvidia, 535.261.03: added", _record("nvidia", "535.261.03", None, None, "added")),
        ("nvidia-current/535.261.03: added", _record("nvidia-current", "535.261.03", None, None, "added")),
        # do_status_weak keeps the comma format in v3.0.10 too ("$m, $v, $k, $a: installed-weak from $kern").
        (
            "nvidia, 535.261.03, 5.4.0-170-generic, x86_64: installed-weak from 5.4.0-169-generic",
            _record(
                "nvidia", "535.261.03", "5.4.0-170-generic", "x86_64", "installed-weak", ["from 5.4.0-169-generic"]
            ),
        ),
    ],
)
def test_dkms_status_reads_both_formats(line, expected):
    assert filters.dkms_status(line) == [expected]


def test_dkms_status_reads_a_whole_output_and_leaves_out_other_lines():
    # negativo17/nvidia-driver issue 56: an error line before the records. The remark is repeated for each of
    # the package's kernel modules (module_status_built_extra's loop over dest_module_name in dell/dkms v3.0.10).
    output = (
        "Error! Could not locate dkms.conf file.\n"
        "File: /var/lib/dkms/nvidia/390.48/source/dkms.conf does not exist.\n"
        "\n"
        "nvidia, 396.45, 4.17.11-200.fc28.x86_64, x86_64: installed\n"
        "nvidia/535.261.03, 6.1.0-18-amd64, x86_64: installed (WARNING! Diff between built and installed module!)"
        " (WARNING! Diff between built and installed module!)\n"
    )
    assert filters.dkms_status(output) == [
        _record("nvidia", "396.45", "4.17.11-200.fc28.x86_64", "x86_64", "installed"),
        _record(
            "nvidia",
            "535.261.03",
            "6.1.0-18-amd64",
            "x86_64",
            "installed",
            ["WARNING! Diff between built and installed module!"],
        ),
    ]
    assert filters.dkms_status(output.splitlines()) == filters.dkms_status(output)
    assert filters.dkms_status("") == filters.dkms_status(None) == []


# --- apt_policy ----------------------------------------------------------------

# `LC_ALL=C apt-cache policy slurmd bash` as printed on a Debian 12 host (bookworm's slurm-wlm 22.05.8-4+deb12u3:
# https://sources.debian.org/src/slurm-wlm/22.05.8-4%2Bdeb12u3/): slurmd not installed, bash installed below its
# candidate.
BOOKWORM_POLICY = """slurmd:
  Installed: (none)
  Candidate: 22.05.8-4+deb12u3
  Version table:
     22.05.8-4+deb12u3 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
"""
BASH_POLICY = """bash:
  Installed: 5.2.15-2+b8
  Candidate: 5.2.15-2+b13
  Version table:
     5.2.15-2+b13 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
 *** 5.2.15-2+b8 100
        100 /var/lib/dpkg/status
"""


def test_apt_policy_takes_the_candidate_of_a_package_not_installed():
    assert filters.apt_policy(BOOKWORM_POLICY) == {
        "installed": "",
        "candidate": "22.05.8-4+deb12u3",
        "version": "22.05.8-4+deb12u3",
        "release": "22.05",
    }


def test_apt_policy_takes_the_installed_version_over_the_candidate():
    # apt state=present keeps what is installed.
    assert filters.apt_policy(BASH_POLICY) == {
        "installed": "5.2.15-2+b8",
        "candidate": "5.2.15-2+b13",
        "version": "5.2.15-2+b8",
        "release": "5.2",
    }


def test_apt_policy_reads_the_first_stanza_only():
    assert filters.apt_policy(BOOKWORM_POLICY + BASH_POLICY)["version"] == "22.05.8-4+deb12u3"


@pytest.mark.parametrize("stdout", ["", None, "slurmd:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n"])
def test_apt_policy_without_a_version_is_empty(stdout):
    # No stanza (apt has no list naming the package) or nothing installable.
    assert filters.apt_policy(stdout) == {"installed": "", "candidate": "", "version": "", "release": ""}


def test_apt_policy_release_drops_the_epoch():
    assert filters.apt_policy("x:\n  Installed: 1:21.08.5-2ubuntu1\n  Candidate: (none)\n")["release"] == "21.08"


# --- sections ----------------------------------------------------------------


def test_sections_splits_a_probe_at_its_name_lines():
    output = (
        "[pci]\n0x10de 0x0302 0x2330 0000:18:00.0\n[df]\nFilesystem 1-blocks\n/dev/x 1 2 3 4% "
        "/\n[nouveau]\nfalse\n[empty]\n"
    )
    assert filters.sections(output) == {
        "pci": ["0x10de 0x0302 0x2330 0000:18:00.0"],
        "df": ["Filesystem 1-blocks", "/dev/x 1 2 3 4% /"],
        "nouveau": ["false"],
        "empty": [],
    }
    assert filters.sections(["[a]", "1"]) == {"a": ["1"]}
    assert filters.sections("") == {}


def test_sections_refuses_output_before_the_first_name():
    with pytest.raises(AnsibleFilterError, match="a line before the first"):
        filters.sections("stray\n[pci]\n")


# --- delegated_facts -----------------------------------------------------------


def test_delegated_facts_are_named_as_hostvars_names_them_and_silent_hosts_left_out():
    results = [
        {
            "item": "node-2",
            "ansible_facts": {
                "ansible_hostname": "node-2",
                "ansible_processor_vcpus": 64,
                "discovered_interpreter_python": "/usr/bin/python3",
            },
        },
        {"item": "ghost", "unreachable": True, "msg": "No route to host"},
        {"item": "node-3", "skipped": True},
    ]
    assert filters.delegated_facts(results) == {
        "node-2": {"hostname": "node-2", "processor_vcpus": 64, "discovered_interpreter_python": "/usr/bin/python3"}
    }
    assert filters.delegated_facts([]) == {} and filters.delegated_facts(None) == {}


# --- check_entry (gpu_verify: a node's fleet-report entry from its run) -------

DOCUMENT = '{"schema": "gpufleet-check/1", "host": "n1", "verdict": "pass", "checks": []}'


def test_check_entry_reads_the_document_whatever_the_exit_code():
    for rc in (0, 1):
        entry = filters.check_entry({"rc": rc, "stdout": DOCUMENT + "\n", "stderr": "", "stderr_lines": []})
        assert entry == {
            "result": {"schema": "gpufleet-check/1", "host": "n1", "verdict": "pass", "checks": []},
            "error": None,
            "unreachable": False,
            "metrics_not_written": [],
        }


def test_check_entry_keeps_the_lines_about_an_unwritten_metrics_file():
    lines = ["warning: /var/lib/node_exporter/gpufleet.prom: metrics not written (No such file or directory)", "other"]
    entry = filters.check_entry({"rc": 0, "stdout": DOCUMENT, "stderr_lines": lines})
    assert entry["metrics_not_written"] == lines[:1]
    assert (
        filters.check_entry({"rc": 0, "stdout": DOCUMENT, "stderr": "\n".join(lines)})["metrics_not_written"]
        == lines[:1]
    )


@pytest.mark.parametrize(
    ("run", "error"),
    [
        (
            {"unreachable": True, "msg": "Task failed: Failed to connect to the host via ssh: Connection timed out"},
            "no answer: Failed to connect to the host via ssh: Connection timed out",
        ),
        (
            {"rc": 137, "stdout": "", "stderr": "starting\n"},
            "the checks gave no result (killed by signal 9: the node stopped, or ran out of memory): starting",
        ),
        (
            {"rc": 2, "stdout": "", "stderr": "python: can't open file\nNo such file or directory\n"},
            "the checks gave no result (rc 2): No such file or directory",
        ),
        # the module itself gave no answer: its stderr, else its message
        ({"rc": 1, "module_stderr": "Killed\n", "msg": "MODULE FAILURE"}, "the checks gave no result (rc 1): Killed"),
        ({"msg": "MODULE FAILURE"}, "the checks gave no result (rc -1): MODULE FAILURE"),
        # JSON of another schema, or broken JSON, is no result
        ({"rc": 0, "stdout": '{"schema": "other/1"}', "stderr": ""}, "the checks gave no result (rc 0): "),
        (
            {"rc": 1, "stdout": '{"schema": "gpufleet-check/1", "host"', "stderr": "Traceback\nBrokenPipeError"},
            "the checks gave no result (rc 1): BrokenPipeError",
        ),
        (None, "the checks gave no result (rc -1): "),
    ],
)
def test_check_entry_says_why_there_is_no_result(run, error):
    entry = filters.check_entry(run)
    assert entry["result"] is None and entry["error"] == error
    assert entry["unreachable"] is bool(run and run.get("unreachable"))


def test_check_entry_is_the_fleet_reports():
    """One home: the filter is plugins/module_utils/fleet_report.py's check_entry, not a copy."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils import fleet_report

    assert filters.check_entry is fleet_report.check_entry
