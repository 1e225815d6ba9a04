"""The plugins under plugins/ (gpufleet.fleet.*), called directly: the shared rules of the roles."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parents[2]


def load(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tests_plugin = load("plugins/test/gpufleet_tests.py")
filters = load("plugins/filter/gpufleet_filters.py")
stack = load("plugins/lookup/stack.py")
settings = load("plugins/lookup/role_settings.py")
MATRIX = stack.load_matrix()


# --- fetch_failure -----------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        {"failed": True, "msg": "Failed to fetch http://mirror/debian/dists/bookworm/InRelease"},
        {"failed": True, "stderr": "curl: (7) Failed to connect to mirror port 80: Connection refused"},
        {"failed": True, "msg": "Temporary failure resolving 'mirror.gpufleet.lab'"},
        {"failed": True, "msg": "Request failed: <urlopen error timed out>"},
        {
            "failed": True,
            "msg": "Status code was -1: Request failed: <urlopen error [Errno -2] Name or service not known>",
        },
        {
            "failed": True,
            "stderr": (
                "ERROR: Could not install packages due to an OSError: HTTPConnectionPool(host='mirror', port=80): Max "
                "retries exceeded (Caused by NewConnectionError: Failed to establish a new connection: [Errno 111] "
                "Connection refused)"
            ),
        },
        {
            "failed": True,
            "msg": "One or more items failed",
            "results": [{"msg": "ok"}, {"msg": "Could not fetch index"}],
        },
    ],
)
def test_fetch_failure_holds_for_a_source_that_did_not_answer(result):
    assert tests_plugin.fetch_failure(result)


@pytest.mark.parametrize(
    "result",
    [
        {"failed": False, "msg": "Failed to fetch (but the task succeeded)"},
        {"failed": True, "msg": "No package matching 'nvidia-driver-999' is available"},
        {"failed": True, "stderr": "E: Unable to correct problems, you have held broken packages."},
        # A template error is not a source that did not answer.
        {
            "failed": True,
            "msg": "Task failed: Finalization of task args for 'ansible.builtin.set_fact' failed: "
            "Error while resolving value for 'pytorch_report': 'NoneType' object has no attribute 'group'",
        },
        {},
        None,
        "Failed to fetch",
    ],
)
def test_fetch_failure_does_not_hold_for_other_failures_or_successes(result):
    assert not tests_plugin.fetch_failure(result)


@pytest.mark.parametrize(
    "url", ["http://mirror/debian", "https://apt.corp.example:8443/nvidia/cuda/", "http://10.0.0.5"]
)
def test_http_url_accepts_http_urls(url):
    assert tests_plugin.http_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "mirror/debian",
        "ftp://mirror/debian",
        "http://",
        "http://mirror/a b",
        "http://mirror/{variant}",
        "https://mirror/$(id)x{",
        42,
        None,
    ],
)
def test_http_url_rejects_anything_else(url):
    assert not tests_plugin.http_url(url)


# --- filters -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (["sm_80", "sm_90"], ["sm_80", "sm_90"]),
        ("sm_80,sm_90", ["sm_80", "sm_90"]),
        ("gpu_nodes", ["gpu_nodes"]),
        (None, []),
        (5, ["5"]),
    ],
)
def test_as_list_applies_the_spec_rule(value, expected):
    assert filters.as_list(value) == expected


def test_as_list_refuses_a_mapping():
    with pytest.raises(AnsibleFilterError, match="as_list"):
        filters.as_list({"a": 1})


@pytest.mark.parametrize(
    "value, expected",
    [
        ({"DefMemPerGPU": 8192}, {"DefMemPerGPU": 8192}),
        ("DefMemPerGPU=8192 MaxJobCount=500", {"DefMemPerGPU": "8192", "MaxJobCount": "500"}),
        ('{"a": 1}', {"a": 1}),
        ("", {}),
        (None, {}),
    ],
)
def test_as_dict_applies_the_spec_rule(value, expected):
    assert filters.as_dict(value) == expected


def test_as_dict_refuses_what_the_spec_refuses():
    with pytest.raises(AnsibleFilterError, match="as_dict"):
        filters.as_dict("not a mapping")


def test_failed_checks_keeps_the_failing_messages_in_order_with_folded_whitespace():
    checks = [
        {"ok": True, "msg": "fine"},
        {"ok": False, "msg": "first\n  wrong"},
        {"ok": "False", "msg": "second"},
        {"ok": "True", "msg": "also fine"},
    ]
    assert filters.failed_checks(checks) == ["first wrong", "second"]


def test_failed_checks_refuses_a_rule_without_ok():
    with pytest.raises(AnsibleFilterError, match="rule 2"):
        filters.failed_checks([{"ok": True, "msg": "x"}, {"msg": "no ok"}])


def test_rejection_numbers_the_messages_and_names_role_and_host():
    assert filters.rejection(["a", "b"], "cuda", "node-1") == "cuda settings rejected on node-1: [1] a; [2] b"


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


def test_per_message_says_each_warning_once_with_its_hosts():
    messages = ["branch 535 is past its end of life", "", "branch 535 is past its end of life", "other  \n text", None]
    assert filters.per_message(messages, ["n1", "n2", "n3", "n4", "n5"]) == [
        "WARNING n1, n3: branch 535 is past its end of life",
        "WARNING n4: other text",
    ]
    assert filters.per_message(["", ""], ["n1", "n2"]) == []
    with pytest.raises(AnsibleFilterError, match="1 message"):
        filters.per_message(["x"], ["n1", "n2"])


ROLE_SETTINGS = settings.role_settings()


@pytest.mark.parametrize(
    "name, role, meant",
    [
        ("cuda_version", "cuda", "cuda_release"),
        ("pytorch_version", "pytorch", "pytorch_release"),
        ("nvidia_driver_verison", "nvidia_driver", "nvidia_driver_version"),
        ("gpu_verify_expected_gpu", "gpu_verify", "gpu_verify_expected_gpus"),
    ],
)
def test_unknown_settings_names_the_setting_meant(name, role, meant):
    assert filters.unknown_settings([name], ROLE_SETTINGS) == [
        f"{name} is not a setting of role {role} (did you mean {meant}?)"
    ]


def test_unknown_settings_passes_real_settings_and_other_prefixes():
    names = ["cuda_release", "nvidia_driver_branch", "lab_mirror_url", "ansible_host", "gpufleet_slurm"]
    assert filters.unknown_settings(names, ROLE_SETTINGS) == []


def test_unknown_settings_without_a_close_match_points_to_the_reference():
    assert filters.unknown_settings(["slurm_frobnicate"], ROLE_SETTINGS) == [
        "slurm_frobnicate is not a setting of role slurm (docs/roles.md lists the settings of slurm)"
    ]


def test_the_longest_role_prefix_owns_a_name():
    assert filters._owner("nvidia_driver_x", ["nvidia", "nvidia_driver"]) == "nvidia_driver"


# --- role_settings -----------------------------------------------------------


def test_role_settings_lists_every_role_and_every_option_of_its_spec():
    roles = sorted(path.parent.parent.name for path in (REPO / "roles").glob("*/meta/argument_specs.yml"))
    assert sorted(ROLE_SETTINGS) == roles
    cuda = yaml.safe_load((REPO / "roles/cuda/meta/argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    assert ROLE_SETTINGS["cuda"] == sorted(cuda)


def test_role_spec_drops_defaults_only():
    spec = settings.role_spec("pytorch")
    assert spec["pytorch_require_gpu"] == {
        key: value
        for key, value in yaml.safe_load((REPO / "roles/pytorch/meta/argument_specs.yml").read_text())[
            "argument_specs"
        ]["main"]["options"]["pytorch_require_gpu"].items()
        if key != "default"
    }
    assert all("default" not in option for option in spec.values())


def test_the_spec_files_and_the_matrix_read_as_pyyaml_safe_load_reads_them():
    """The lookups' faster parser (libyaml's, when PyYAML has it: every task of every host is a new worker that
    parses them again) gives the same data as yaml.safe_load, for every spec file and the matrix."""
    for spec_file in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        assert settings.entry_points(spec_file) == yaml.safe_load(spec_file.read_text())["argument_specs"], spec_file
    assert stack.load_matrix() == yaml.safe_load((REPO / "files" / "compatibility.yml").read_text())


def test_a_spec_file_is_read_again_once_it_changed(tmp_path):
    spec_file = tmp_path / "demo" / "meta" / "argument_specs.yml"
    spec_file.parent.mkdir(parents=True)
    spec_file.write_text("argument_specs:\n  main:\n    options:\n      demo_a: {type: str}\n")
    assert settings.role_settings(tmp_path) == {"demo": ["demo_a"]}
    spec_file.write_text("argument_specs:\n  main:\n    options:\n      demo_b: {type: int, default: 1}\n")
    os.utime(spec_file, ns=(spec_file.stat().st_atime_ns, spec_file.stat().st_mtime_ns + 10**9))
    assert settings.role_settings(tmp_path) == {"demo": ["demo_b"]}
    assert settings.role_spec("demo", tmp_path) == {"demo_b": {"type": "int"}}


def test_role_spec_of_an_unknown_role_is_a_clear_error():
    with pytest.raises(Exception, match="no argument spec for role 'nope'"):
        settings.role_spec("nope")


# --- dcgm_exporter_release ---------------------------------------------------------


# dcgm-exporter's tags are <DCGM version>-<exporter version>[-<platform>]: "The long form:
# ${DCGM_VERSION}-${EXPORTER_VERSION}-${PLATFORM}" (github.com/NVIDIA/dcgm-exporter, RELEASE.md; its Makefile:
# FULL_VERSION := $(DCGM_VERSION)-$(VERSION)); published tags such as 3.3.9-3.6.1 and 4.2.3-4.1.1 (nvcr.io/nvidia/k8s/
# dcgm-exporter:4.2.3-4.1.1-ubuntu22.04, 4.2.0-4.1.0-ubuntu22.04).
@pytest.mark.parametrize(
    "version, url, expected",
    [
        ("4.2.3-4.1.1", "", {"release": "4.2.3-4.1.1", "dcgm": "4.2.3", "dcgm_major": 4}),
        ("3.3.9-3.6.1-ubuntu22.04", "", {"release": "3.3.9-3.6.1", "dcgm": "3.3.9", "dcgm_major": 3}),
        (
            "",
            "https://repo.example.com/dcgm-exporter/3.3.9-3.6.1/dcgm-exporter",
            {"release": "3.3.9-3.6.1", "dcgm": "3.3.9", "dcgm_major": 3},
        ),
        (
            "",
            "https://repo.example.com/bin/dcgm-exporter-4.2.3-4.1.1-amd64",
            {"release": "4.2.3-4.1.1", "dcgm": "4.2.3", "dcgm_major": 4},
        ),
        # The setting wins over the URL.
        (
            "4.2.3-4.1.1",
            "https://repo.example.com/3.3.9-3.6.1/dcgm-exporter",
            {"release": "4.2.3-4.1.1", "dcgm": "4.2.3", "dcgm_major": 4},
        ),
    ],
)
def test_dcgm_exporter_release_names_the_dcgm_version_it_was_built_for(version, url, expected):
    assert filters.dcgm_exporter_release(version, url) == expected


@pytest.mark.parametrize(
    "version, url",
    [
        ("", "https://repo.example.com/dcgm-exporter"),  # nothing names a release
        ("", "https://repo.example.com/v1.2.3/dcgm-exporter"),
        ("4.2.3", "https://repo.example.com/3.3.9-3.6.1/x"),  # a wrong setting is not made up from the URL
        ("latest", ""),
        (None, None),
    ],
)
def test_dcgm_exporter_release_without_a_release_is_empty(version, url):
    assert filters.dcgm_exporter_release(version, url) == {}


# --- stack -------------------------------------------------------------------


def test_defaults_resolve_to_one_complete_stack():
    resolved = stack.resolve(MATRIX, driver_branch="535", distribution="Ubuntu")
    assert resolved["errors"] == []
    driver = dict(resolved["driver"])
    assert driver.pop("lifecycle")["designation"] == "Long Term Support Branch"
    assert driver == {
        "branch": "535",
        "version": MATRIX["driver_branches"]["535"]["default_version"],
        "fabricmanager": True,
        "sources": ["ubuntu", "nvidia"],
    }
    assert resolved["cuda"]["release"] == MATRIX["defaults"]["cuda_release"] == "12.1"
    assert resolved["cuda"]["toolkit_package"] == "cuda-toolkit-12-1"
    assert resolved["cudnn"]["version"] == "8.9.2.26" and resolved["nccl"]["packages"] == ["libnccl2", "libnccl-dev"]
    assert resolved["pytorch"]["variant"] == "cu121" and resolved["pytorch"]["expected_cuda"] == "12.1"
    assert resolved["pytorch"]["label"] == "+cu121"


def test_every_wrong_choice_is_a_reason_and_its_part_is_empty():
    resolved = stack.resolve(MATRIX, driver_branch="999", cuda_release="12.4", pytorch_release="1.0")
    assert resolved["driver"] == {} and resolved["cuda"] == {} and resolved["pytorch"] == {}
    assert [reason.split(" ")[0] for reason in resolved["errors"]] == [
        "nvidia_driver_branch",
        "cuda_release",
        "pytorch_release",
    ]
    assert "lists 470, 525, 535, 580" in resolved["errors"][0]


def test_a_driver_version_outside_its_branch_is_a_reason():
    resolved = stack.resolve(MATRIX, driver_branch="535", driver_version="550.54.15")
    assert resolved["errors"] == [
        "nvidia_driver_version '550.54.15' is not a release of branch 535 "
        f"(expected the form 535.NNN.NN, for example {MATRIX['driver_branches']['535']['default_version']})"
    ]


# A CPU-only row (every real row has cu121 and cpu; this one is made up).
CPU_ONLY = {
    **MATRIX,
    "pytorch_releases": {
        **MATRIX["pytorch_releases"],
        "2.9.9": {"variants": ["cpu"], "torchvision": "", "torchaudio": ""},
    },
}


def test_a_variant_the_release_lacks_is_a_reason():
    resolved = stack.resolve(CPU_ONLY, pytorch_release="2.9.9")
    assert resolved["errors"] == [
        "torch 2.9.9 is published for cpu only, not cu121 (the variant of CUDA 12.1, pytorch_cuda_release; "
        "pytorch_release 2.9.9); files/compatibility.yml: cu121 wheels exist for torch 2.1.0 ... 2.5.1"
    ]
    assert resolved["pytorch"] == {}


def test_the_lab_only_cpu_release_is_gone_from_the_matrix():
    """2.13.0 was the lab's CPU wheel; the lab now installs PyPI's cu121 build of 2.3.1 (issue 15)."""
    assert list(MATRIX["pytorch_releases"]) == [
        "2.1.0",
        "2.1.1",
        "2.1.2",
        "2.2.0",
        "2.2.1",
        "2.2.2",
        "2.3.0",
        "2.3.1",
        "2.4.0",
        "2.4.1",
        "2.5.0",
        "2.5.1",
    ]


# The PyTorch part: every reason the pytorch and container roles stop on.
PYTORCH_REASONS = [
    (
        {"pytorch_release": "2.0.1"},
        [
            "pytorch_release '2.0.1' is not a PyTorch release gpufleet knows (files/compatibility.yml "
            "lists 2.1.0 ... 2.5.1; cu121 wheels exist for torch 2.1.0 ... 2.5.1)"
        ],
    ),
    # A release the matrix does not know is said to be unknown, not to lack a
    # variant whose span it lies in (issue 16, item 21).
    (
        {"pytorch_release": "2.6.0", "pytorch_variant": "cpu"},
        [
            "pytorch_release '2.6.0' is not a PyTorch release gpufleet knows (files/compatibility.yml lists 2.1.0 ... "
            "2.5.1; cpu wheels exist for torch 2.1.0 ... 2.5.1)"
        ],
    ),
    (
        {"pytorch_release": "2.1.0", "pytorch_variant": "cu124"},
        [
            "pytorch_variant cu124 does not match CUDA 12.1 (pytorch_cuda_release): files/compatibility.yml gives "
            "CUDA 12.1 the cu121 wheels; use cu121, or cpu for a CPU-only environment",
            "torch 2.1.0 is published for cu118, cu121, cpu only, not cu124 (pytorch_variant cu124; pytorch_release "
            "2.1.0); files/compatibility.yml: cu124 wheels exist for torch 2.4.0 ... 2.5.1",
        ],
    ),
    (
        {"pytorch_variant": "cuda121"},
        [
            "pytorch_variant 'cuda121' is not a wheel variant: cpu or cuXYZ "
            "(files/compatibility.yml knows cu118, cu121, cpu, cu124)"
        ],
    ),
    (
        {"pytorch_cuda_release": "12.4"},
        [
            "pytorch_cuda_release '12.4' is not a CUDA release gpufleet knows "
            "(files/compatibility.yml lists 12.1); set pytorch_variant=cpu for a CPU-only environment"
        ],
    ),
    # CUDA from the CUDA setting: its reason is given once, by that setting.
    (
        {"cuda_release": "12.4"},
        ["cuda_release '12.4' is not a CUDA release gpufleet knows (the compatibility matrix lists 12.1)"],
    ),
]


@pytest.mark.parametrize(("choices", "reasons"), PYTORCH_REASONS, ids=[str(i) for i in range(len(PYTORCH_REASONS))])
def test_pytorch_choices_outside_the_matrix_are_reasons(choices, reasons):
    resolved = stack.resolve(MATRIX, **choices)
    assert resolved["errors"] == reasons and resolved["pytorch"] == {}


def test_the_caller_names_its_own_settings():
    names = {
        "cuda_release": "container_image_cuda_release",
        "pytorch_release": "container_image_torch_release",
        "pytorch_cuda_release": "container_image_cuda_release",
        "pytorch_variant": "container_image_torch_variant",
    }
    assert stack.resolve(MATRIX, pytorch_release="2.0.1", names=names)["errors"][0].startswith(
        "container_image_torch_release '2.0.1' is not a PyTorch release"
    )
    assert stack.resolve(MATRIX, cuda_release="11.0", names=names)["errors"] == [
        "container_image_cuda_release '11.0' is not a CUDA release gpufleet knows (the compatibility matrix lists 12.1)"
    ]


def test_pins_carry_the_variant_and_follow_the_companion_switches():
    assert stack.resolve(MATRIX)["pytorch"]["pins"] == [
        "torch==2.5.1+cu121",
        "torchvision==0.20.1+cu121",
        "torchaudio==2.5.1+cu121",
    ]
    assert stack.resolve(MATRIX, pytorch_release="2.3.1", torchaudio=False)["pytorch"]["pins"] == [
        "torch==2.3.1+cu121",
        "torchvision==0.18.1+cu121",
    ]
    # A row without companions pins torch alone.
    assert stack.resolve(CPU_ONLY, pytorch_release="2.9.9", pytorch_variant="cpu")["pytorch"]["pins"] == [
        "torch==2.9.9+cpu"
    ]


def test_the_caller_names_the_wheel_source_setting():
    names = {"pytorch_wheel_source": "container_image_wheel_source"}
    assert stack.resolve(MATRIX, pytorch_wheel_source="conda", names=names)["errors"] == [
        "container_image_wheel_source 'conda' is not a wheel source gpufleet knows (files/compatibility.yml lists "
        "pytorch, pypi)"
    ]


# --- stack: where the wheels come from (pytorch_wheel_source, issue 15) -------
# PyPI's default Linux x86_64 torch wheels are CUDA builds without a local version label. Their variant is
# what their Requires-Dist pins (pip install --dry-run --no-deps --ignore-installed --report r.json
# --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.11 --implementation cp torch==X,
# which reads only the metadata):
#   https://pypi.org/project/torch/2.1.0/  nvidia-cuda-runtime-cu12==12.1.105, nvidia-cudnn-cu12==8.9.2.26,
#                                          nvidia-nccl-cu12==2.18.1: cu121
#   https://pypi.org/project/torch/2.3.1/  nvidia-cuda-runtime-cu12==12.1.105, nvidia-cudnn-cu12==8.9.2.26,
#                                          nvidia-nccl-cu12==2.20.5: cu121
#   https://pypi.org/project/torch/2.4.1/  nvidia-cuda-runtime-cu12==12.1.105, nvidia-cudnn-cu12==9.1.0.70,
#                                          nvidia-nccl-cu12==2.20.5: cu121
#   https://pypi.org/project/torch/2.5.0/  nvidia-cuda-runtime-cu12==12.4.127: cu124
#   https://pypi.org/project/torch/2.5.1/  nvidia-cuda-runtime-cu12==12.4.127, nvidia-cudnn-cu12==9.1.0.70,
#                                          nvidia-nccl-cu12==2.21.5: cu124
# (2.1.1 ... 2.4.0 between them: cu121, Requires-Dist nvidia-cuda-runtime-cu12==12.1.105.) PyPI has no CPU-only
# Linux torch wheel; https://download.pytorch.org/whl/cu121 has torch 2.1.0+cu121 ... 2.5.1+cu121.
PYPI_VARIANTS = {
    "2.1.0": "cu121",
    "2.1.1": "cu121",
    "2.1.2": "cu121",
    "2.2.0": "cu121",
    "2.2.1": "cu121",
    "2.2.2": "cu121",
    "2.3.0": "cu121",
    "2.3.1": "cu121",
    "2.4.0": "cu121",
    "2.4.1": "cu121",
    "2.5.0": "cu124",
    "2.5.1": "cu124",
}


def test_every_release_records_the_variant_of_its_pypi_build():
    assert {release: row.get("pypi") for release, row in MATRIX["pytorch_releases"].items()} == PYPI_VARIANTS


def test_the_two_wheel_sources_and_their_indexes():
    assert MATRIX["pytorch_wheel_sources"] == {
        "pytorch": {"index_url": "https://download.pytorch.org/whl/{variant}", "local_version": True},
        "pypi": {"index_url": "https://pypi.org/simple", "local_version": False},
    }


@pytest.mark.parametrize(
    ("source", "index_url", "pins"),
    [
        (
            "",
            "https://download.pytorch.org/whl/cu121",
            ["torch==2.3.1+cu121", "torchvision==0.18.1+cu121", "torchaudio==2.3.1+cu121"],
        ),
        (
            "pytorch",
            "https://download.pytorch.org/whl/cu121",
            ["torch==2.3.1+cu121", "torchvision==0.18.1+cu121", "torchaudio==2.3.1+cu121"],
        ),
        # https://pypi.org/project/torch/2.3.1/: the cu121 build, published as plain 2.3.1.
        ("pypi", "https://pypi.org/simple", ["torch==2.3.1", "torchvision==0.18.1", "torchaudio==2.3.1"]),
    ],
)
def test_the_source_gives_the_index_and_the_form_of_the_pins(source, index_url, pins):
    resolved = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_wheel_source=source)
    assert resolved["errors"] == []
    assert resolved["pytorch"]["source"] == (source or "pytorch")
    assert resolved["pytorch"]["index_url"] == index_url and resolved["pytorch"]["pins"] == pins
    assert resolved["pytorch"]["label"] == ("" if source == "pypi" else "+cu121")
    # The build is the same: CUDA 12.1, the same bundled cuDNN and NCCL.
    assert resolved["pytorch"]["expected_cuda"] == "12.1"
    assert resolved["pytorch"]["bundled"] == {"cudnn": "8.9.2.26", "nccl": "2.20.5"}


def test_the_cpu_index_of_the_pytorch_source():
    resolved = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_variant="cpu", pytorch_wheel_source="pytorch")
    assert resolved["pytorch"]["index_url"] == "https://download.pytorch.org/whl/cpu"
    assert resolved["pytorch"]["pins"][0] == "torch==2.3.1+cpu"


@pytest.mark.parametrize("release", [release for release, variant in PYPI_VARIANTS.items() if variant == "cu121"])
def test_pypi_gives_the_cu121_build_of_2_1_to_2_4_unlabelled(release):
    # https://pypi.org/project/torch/<release>/ (table above).
    resolved = stack.resolve(MATRIX, pytorch_release=release, pytorch_wheel_source="pypi")
    assert resolved["errors"] == []
    assert resolved["pytorch"]["pins"][0] == f"torch=={release}" and resolved["pytorch"]["expected_cuda"] == "12.1"


def test_pypi_refuses_2_5_1_whose_pypi_build_is_cu124():
    # https://pypi.org/project/torch/2.5.1/: Requires-Dist nvidia-cuda-runtime-cu12==12.4.127, the cu124 build.
    resolved = stack.resolve(MATRIX, pytorch_release="2.5.1", pytorch_wheel_source="pypi")
    assert resolved["errors"] == [
        "torch 2.5.1 on PyPI (pytorch_wheel_source pypi) is the cu124 build, not cu121 (the variant of CUDA 12.1, "
        "pytorch_cuda_release): use pytorch_wheel_source pytorch (https://download.pytorch.org/whl/cu121), or a "
        "release PyPI publishes as cu121: 2.1.0 ... 2.4.1"
    ]
    assert resolved["pytorch"] == {}


def test_pypi_refuses_the_default_release_2_5_1_too():
    assert stack.resolve(MATRIX, pytorch_wheel_source="pypi")["errors"][0].startswith(
        "torch 2.5.1 on PyPI (pytorch_wheel_source pypi) is the cu124 build, not cu121"
    )


def test_pypi_has_no_cpu_build():
    # https://pypi.org/project/torch/2.3.1/: its Linux x86_64 wheel is the cu121 build; PyPI has no CPU-only one.
    resolved = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_variant="cpu", pytorch_wheel_source="pypi")
    assert resolved["errors"] == [
        "torch 2.3.1 on PyPI (pytorch_wheel_source pypi) has no CPU-only build: PyPI's Linux x86_64 torch wheels are "
        "CUDA builds (cu121 for 2.3.1); use pytorch_wheel_source pytorch (https://download.pytorch.org/whl/cpu) for "
        "the cpu wheels"
    ]


def test_an_unknown_wheel_source_lists_the_known_ones():
    resolved = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_wheel_source="artifactory")
    assert resolved["errors"] == [
        "pytorch_wheel_source 'artifactory' is not a wheel source gpufleet knows (files/compatibility.yml lists "
        "pytorch, pypi)"
    ]
    assert resolved["pytorch"] == {}


def test_a_row_without_a_pypi_build_is_refused_for_pypi():
    matrix = {
        **MATRIX,
        "pytorch_releases": {
            **MATRIX["pytorch_releases"],
            "2.9.9": {"variants": ["cu121", "cpu"], "torchvision": "", "torchaudio": ""},
        },
    }
    assert stack.resolve(matrix, pytorch_release="2.9.9", pytorch_wheel_source="pypi")["errors"] == [
        "torch 2.9.9 on PyPI (pytorch_wheel_source pypi) is not recorded as a cu121 build (the variant of CUDA 12.1, "
        "pytorch_cuda_release): use pytorch_wheel_source pytorch (https://download.pytorch.org/whl/cu121), or a "
        "release PyPI publishes as cu121: 2.1.0 ... 2.4.1"
    ]


def test_the_cpu_variant_expects_no_cuda():
    resolved = stack.resolve(MATRIX, pytorch_release="2.5.1", pytorch_variant="cpu")
    assert resolved["pytorch"]["expected_cuda"] == "" and resolved["errors"] == []


# --- stack: driver branch lifecycle ------------------------------------------

# NVIDIA's "Supported Drivers and CUDA Toolkit Versions" table
# (https://docs.nvidia.com/datacenter/tesla/drivers/615/supported-drivers-and-cuda-toolkit-versions.html):
# R535 Long Term Support Branch, end of life June 2026; R580 Long Term Support Branch, June 2028 (the 620
# edition of the table says the same for R580). 470 and 525: https://endoflife.date/nvidia (endoflife-date/
# endoflife.date, products/nvidia-driver.md, from NVIDIA's releases.json): R470 LTSB until 2024-07, R525
# Production Branch until 2023-12.
LIFECYCLES = {
    "470": ("Long Term Support Branch", "2024-07"),
    "525": ("Production Branch", "2023-12"),
    "535": ("Long Term Support Branch", "2026-06"),
    "580": ("Long Term Support Branch", "2028-06"),
}


def test_every_branch_has_its_published_lifecycle():
    for branch, (designation, end_of_life) in LIFECYCLES.items():
        life = MATRIX["driver_branches"][branch]["lifecycle"]
        assert (life["designation"], life["end_of_life"]) == (designation, end_of_life), branch
        assert life["published"].startswith("https://"), branch
    assert set(MATRIX["driver_branches"]) == set(LIFECYCLES)


@pytest.mark.parametrize(
    ("end_of_life", "today", "past"),
    [
        ("2026-06", "2026-06-30", False),
        ("2026-06", "2026-07-01", True),
        ("2026-06", "2026-12-01", True),
        ("2028-06", "2026-12-01", False),
        ("2024-07", "2025-01-01", True),
        ("", "2030-01-01", False),
        ("June 2026", "2030-01-01", False),
    ],
)
def test_a_branch_is_past_its_end_of_life_once_that_month_is_over(end_of_life, today, past):
    assert stack.past_end_of_life(end_of_life, stack.datetime.date.fromisoformat(today)) is past


# The warning of play 1 on 2026-12-01, the day this was written: R535 is past its end of life; R580, the
# LTSB until June 2028, runs CUDA 12.1 (580.95.05 >= 530.30.02, CUDA 12.1's minimum driver).
WARNING_535 = (
    "NVIDIA driver branch 535 (Long Term Support Branch) is past its end of life (2026-06, "
    "https://docs.nvidia.com/datacenter/tesla/drivers/615/supported-drivers-and-cuda-toolkit-versions.html): branch "
    "580, the Long Term Support Branch supported until 2028-06 "
    "(https://docs.nvidia.com/datacenter/tesla/drivers/620/supported-drivers-and-cuda-toolkit-versions.html), runs "
    "CUDA 12.1 too"
)


def test_535_past_its_end_of_life_names_580_which_runs_cuda_12_1():
    life = stack.resolve(MATRIX, driver_branch="535", distribution="Ubuntu", today="2026-12-01")["driver"]["lifecycle"]
    assert life["past_end_of_life"] is True
    assert life["successor"] == {
        "branch": "580",
        "version": "580.95.05",
        "end_of_life": "2028-06",
        "sources": ["nvidia"],
        "published": "https://docs.nvidia.com/datacenter/tesla/drivers/620/supported-drivers-and-cuda-toolkit-versions.html",
    }
    assert life["warning"] == WARNING_535 + (
        ", on Ubuntu from source nvidia (nvidia_driver_source); move to it with playbooks/upgrade-driver.yml "
        "-e upgrade_driver_version=580.95.05"
    )


def test_on_debian_the_warning_says_no_source_offers_580():
    """Debian has no 580 build (bookworm-backports: 535.216.03, trixie: 550.163.01;
    https://neurite.github.io/debian-setup/0302-nvidia.html lists Debian's nvidia-driver per release)."""
    life = stack.resolve(MATRIX, driver_branch="535", distribution="Debian", today="2026-12-01")["driver"]["lifecycle"]
    assert life["warning"] == WARNING_535 + ", but no source gpufleet knows offers it on Debian"
    assert "Debian" not in MATRIX["driver_branches"]["580"]["sources"]


def test_a_supported_branch_gives_no_warning():
    before = stack.resolve(MATRIX, driver_branch="535", distribution="Ubuntu", today="2026-06-15")["driver"][
        "lifecycle"
    ]
    assert (before["past_end_of_life"], before["successor"], before["warning"]) == (False, {}, "")
    life = stack.resolve(MATRIX, driver_branch="580", distribution="Ubuntu", today="2026-12-01")["driver"]["lifecycle"]
    assert (life["past_end_of_life"], life["warning"]) == (False, "")


def test_no_successor_when_every_ltsb_is_past_or_too_old():
    """After June 2028 the matrix has no supported LTSB left: the warning says so instead of naming one."""
    life = stack.resolve(MATRIX, driver_branch="535", today="2028-07-01")["driver"]["lifecycle"]
    assert life["successor"] == {}
    assert life["warning"].endswith(
        ": the compatibility matrix has no supported Long Term Support Branch that runs CUDA 12.1"
    )


def test_a_malformed_today_is_a_clear_error():
    with pytest.raises(Exception, match="today '2026-13-01' is not a date"):
        stack.resolve(MATRIX, driver_branch="535", today="2026-13-01")


# --- stack: where NVIDIA publishes a CUDA release ----------------------------


# NVIDIA's index of https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ starts its
# cuda-12-* packages at cuda-12-3_12.3.0-1_amd64.deb; .../debian11/x86_64/ and .../debian10/x86_64/ list
# cuda-12-1_12.1.0-1 and cuda-12-1_12.1.1-1. Ubuntu 22.04: NVIDIA's CUDA 12.1 download page offers the deb
# (network) install from .../ubuntu2204/x86_64 (developer.nvidia.com/cuda-12-1-0-download-archive?...
# target_version=22.04&target_type=deb_network, quoted in NVIDIA/cuda-samples#291); ubuntu2004: its arm64 index
# lists cuda-12-1_12.1.1-1 (the x86_64 index was not seen down to its cuda-12-* lines).
def test_cuda_12_1_is_published_for_ubuntu_and_old_debian_not_debian_12():
    assert MATRIX["cuda_releases"]["12.1"]["repositories"] == ["ubuntu2004", "ubuntu2204", "debian10", "debian11"]
    assert MATRIX["cuda_repositories"]["debian12"]["oldest_release"] == "12.3"


def test_the_repository_gap_names_the_directory_and_what_it_has():
    assert stack.resolve(MATRIX, repository_os="debian12")["cuda"]["repository_gap"] == (
        "NVIDIA publishes no CUDA 12.1 (cuda-toolkit-12-1) for debian12: its debian12 repository starts at CUDA 12.3 "
        "and has none of the releases the compatibility matrix lists (12.1); CUDA 12.1 is published for ubuntu2004, "
        "ubuntu2204, debian10, debian11"
    )
    for directory in ("ubuntu2004", "ubuntu2204", ""):
        assert stack.resolve(MATRIX, repository_os=directory)["cuda"]["repository_gap"] == ""


def test_the_repository_gap_lists_the_releases_a_directory_has():
    matrix = {
        **MATRIX,
        "cuda_releases": {
            **MATRIX["cuda_releases"],
            "12.4": {**MATRIX["cuda_releases"]["12.1"], "repositories": ["debian12"]},
        },
    }
    gap = stack.resolve(matrix, repository_os="debian12")["cuda"]["repository_gap"]
    assert "has CUDA 12.4 of the releases the compatibility matrix lists (12.1, 12.4)" in gap
    assert stack.resolve(matrix, cuda_release="12.4", repository_os="debian12")["cuda"]["repository_gap"] == ""


# The cuDNN / NCCL builds torch's cu121 wheels pin (Requires-Dist nvidia-cudnn-cu12==, nvidia-nccl-cu12==).
# 2.1.0-2.4.1: the wheels' metadata on PyPI (https://pypi.org/project/torch/<release>/, whose default Linux
# wheels are the cu121 builds; `pip install --dry-run --report - torch==<release>`);
# 2.5.x: PYTORCH_EXTRA_INSTALL_REQUIREMENTS["12.1"] in pytorch's .github/scripts/generate_binary_build_matrix.py
# (github.com/pytorch/pytorch, as of the 2.5 cycle: CUDA_ARCHES 11.8, 12.1, 12.4).
CU121_BUNDLED = {
    "2.1.0": ("8.9.2.26", "2.18.1"),
    "2.1.1": ("8.9.2.26", "2.18.1"),
    "2.1.2": ("8.9.2.26", "2.18.1"),
    "2.2.0": ("8.9.2.26", "2.19.3"),
    "2.2.1": ("8.9.2.26", "2.19.3"),
    "2.2.2": ("8.9.2.26", "2.19.3"),
    "2.3.0": ("8.9.2.26", "2.20.5"),
    "2.3.1": ("8.9.2.26", "2.20.5"),
    "2.4.0": ("9.1.0.70", "2.20.5"),
    "2.4.1": ("9.1.0.70", "2.20.5"),
    "2.5.0": ("9.1.0.70", "2.21.5"),
    "2.5.1": ("9.1.0.70", "2.21.5"),
}


@pytest.mark.parametrize("release", list(CU121_BUNDLED))
def test_the_cu121_wheels_bring_their_own_cudnn_and_nccl(release):
    cudnn, nccl = CU121_BUNDLED[release]
    resolved = stack.resolve(MATRIX, pytorch_release=release)
    assert resolved["errors"] == []
    assert resolved["pytorch"]["bundled"] == {"cudnn": cudnn, "nccl": nccl}


def test_every_cu121_release_of_the_matrix_records_its_bundled_builds():
    """A new cu121 row without its bundled builds would be reported as unknown: the table above names them all."""
    cu121 = [release for release, row in MATRIX["pytorch_releases"].items() if "cu121" in row["variants"]]
    assert cu121 == list(CU121_BUNDLED)


def test_bundled_builds_are_unknown_where_the_matrix_records_none_and_none_for_cpu():
    # cu118 wheels bundle other builds (cuDNN 8.7 before 2.4): not recorded, so not guessed from cu121.
    row = {"variants": ["cu118", "cu121"], "bundled": {"cu121": {"cudnn": "8.9.2.26", "nccl": "2.18.1"}}}
    assert stack.bundled_libraries(row, "cu118") == {"cudnn": "unknown", "nccl": "unknown"}
    assert stack.bundled_libraries({"bundled": {"cu121": {"cudnn": "8.9.2.26"}}}, "cu121") == {
        "cudnn": "8.9.2.26",
        "nccl": "unknown",
    }
    assert stack.bundled_libraries(row, "cpu") == {"cudnn": "none", "nccl": "none"}
    cpu = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_variant="cpu")
    assert cpu["pytorch"]["bundled"] == {"cudnn": "none", "nccl": "none"}


def test_no_driver_branch_resolves_no_driver():
    assert stack.resolve(MATRIX)["driver"] == {}


def test_a_damaged_matrix_is_a_clear_error(tmp_path):
    bad = tmp_path / "compatibility.yml"
    bad.write_text("just: text\n")
    with pytest.raises(Exception, match="is not gpufleet's compatibility matrix"):
        stack.load_matrix(bad)


# --- apt_stanzas ---------------------------------------------------------------
# Stanzas as apt-cache show / a Packages index prints them (Debian Policy 5.1, 5.6, 7.1). packages.ubuntu.com shows a
# binary's version, source, synopsis and the relations of each architecture; the stanzas below are those facts for
# amd64, written out in the Packages format (one per page cited above it).

# https://packages.ubuntu.com/noble/libs/libnvidia-extra-535-server (535.309.01-0ubuntu0.24.04.2, noble-security:
# "dep: libnvidia-extra-580-server [not arm64]", "dep: libc6 (>= 2.34) [arm64]").
NOBLE_EXTRA_535_TRANSITIONAL = """Package: libnvidia-extra-535-server
Architecture: amd64
Version: 535.309.01-0ubuntu0.24.04.2
Source: nvidia-graphics-drivers-535-server
Depends: libnvidia-extra-580-server
Description: Extra libraries for the NVIDIA Server Driver (transitional package)
"""
# https://packages.ubuntu.com/ca/noble-updates/libnvidia-extra-535-server (535.309.01-0ubuntu0.24.04.1, the build
# before: a real 535 library, "dep: libc6 (>= 2.34)").
NOBLE_EXTRA_535 = """Package: libnvidia-extra-535-server
Architecture: amd64
Version: 535.309.01-0ubuntu0.24.04.1
Source: nvidia-graphics-drivers-535-server
Depends: libc6 (>= 2.34)
Description: Extra libraries for the NVIDIA Server Driver
"""
# https://packages.ubuntu.com/cs/noble-updates/libnvidia-compute-535-server (535.309.01-0ubuntu0.24.04.1: "dep: libc6
# (>= 2.34)", "dep: libgcc-s1 (>= 4.2) [not i386]", "dep: libssl3t64 (>= 3.0.0) [amd64]").
NOBLE_COMPUTE_535 = """Package: libnvidia-compute-535-server
Architecture: amd64
Version: 535.309.01-0ubuntu0.24.04.1
Source: nvidia-graphics-drivers-535-server
Depends: libc6 (>= 2.34), libgcc-s1 (>= 4.2), libssl3t64 (>= 3.0.0)
Description: NVIDIA libcompute package
"""
# https://packages.ubuntu.com/jammy/cuda-drivers-fabricmanager-535 (535.309.01-0ubuntu0.22.04.1, jammy-security,
# source fabric-manager-535: "dep: nvidia-fabricmanager-535 (= 535.309.01-0ubuntu0.22.04.1)"). Since then jammy
# carries 535.309.01-0ubuntu0.22.04.2, "Meta-package for FM and Driver (transitional package)"
# (https://packages.ubuntu.com/search?lang=fr&arch=any&keywords=cuda-drivers-fabricmanager-535); the Depends of that
# build were not seen (not confirmed), so it is not written out here.
JAMMY_FM_535 = """Package: cuda-drivers-fabricmanager-535
Architecture: amd64
Version: 535.309.01-0ubuntu0.22.04.1
Source: fabric-manager-535
Depends: nvidia-fabricmanager-535 (= 535.309.01-0ubuntu0.22.04.1)
Description: Meta-package for FM and Driver
"""
# https://packages.ubuntu.com/ca/questing/cuda-drivers-fabricmanager-535 (535.261.03-0ubuntu2, questing:
# "dep: cuda-drivers-fabricmanager-580").
QUESTING_FM_535 = """Package: cuda-drivers-fabricmanager-535
Architecture: amd64
Version: 535.261.03-0ubuntu2
Source: fabric-manager-535
Depends: cuda-drivers-fabricmanager-580
Description: Meta-package for FM and Driver
"""
# https://packages.ubuntu.com/uk/questing/amd64/nvidia-kernel-common-535-server (535.261.03-0ubuntu2:
# "dep: nvidia-kernel-common-580-server").
QUESTING_KERNEL_COMMON_535 = """Package: nvidia-kernel-common-535-server
Architecture: amd64
Version: 535.261.03-0ubuntu2
Source: nvidia-graphics-drivers-535-server
Depends: nvidia-kernel-common-580-server
Description: Shared files used with the kernel module (transitional package)
"""
# https://packages.ubuntu.com/pl/plucky/nvidia-utils-580-server (580.95.05-0ubuntu0.25.04.1: "dep: libc6 (>= 2.34)",
# "dep: libnvidia-compute-580-server (>= 580.95.05)", "dep: nvidia-kernel-common-580-server
# (= 580.95.05-0ubuntu0.25.04.1)", "sug: nvidia-driver-580-server").
PLUCKY_UTILS_580 = """Package: nvidia-utils-580-server
Architecture: amd64
Version: 580.95.05-0ubuntu0.25.04.1
Source: nvidia-graphics-drivers-580-server
Depends: libc6 (>= 2.34), libnvidia-compute-580-server (>= 580.95.05),
 nvidia-kernel-common-580-server (= 580.95.05-0ubuntu0.25.04.1)
Suggests: nvidia-driver-580-server
Description: NVIDIA Server Driver support binaries
"""
# https://packages.ubuntu.com/uk/questing-updates/nvidia-utils-580-server (580.159.03-0ubuntu0.25.10.1: the kernel
# side as the virtual package "nvidia-kernel-common-580-server-580.159.03", "virtual package provided by
# nvidia-kernel-common-580-server").
QUESTING_UTILS_580 = """Package: nvidia-utils-580-server
Architecture: amd64
Version: 580.159.03-0ubuntu0.25.10.1
Source: nvidia-graphics-drivers-580-server
Depends: libc6 (>= 2.34), libnvidia-compute-580-server (>= 580.159.03), nvidia-kernel-common-580-server-580.159.03
Suggests: nvidia-driver-580-server
Description: NVIDIA Server Driver support binaries
"""
# Debian Policy 7.1's example (as quoted in Debian bug #892142, Policy 4.1.3): a relation with alternatives.
POLICY_MUTT = """Package: mutt
Version: 1.3.17-1
Depends: libc6 (>= 2.2.1), exim | mail-transport-agent
"""


def _rel(name, relation="", version=""):
    return {"name": name, "relation": relation, "version": version}


def test_apt_stanzas_reads_package_version_source_description_and_depends():
    [stanza] = filters.apt_stanzas(NOBLE_EXTRA_535_TRANSITIONAL)
    assert (stanza["Package"], stanza["Version"], stanza["Source"], stanza["Architecture"]) == (
        "libnvidia-extra-535-server",
        "535.309.01-0ubuntu0.24.04.2",
        "nvidia-graphics-drivers-535-server",
        "amd64",
    )
    assert stanza["Description"] == "Extra libraries for the NVIDIA Server Driver (transitional package)"
    assert stanza["Depends"] == [[_rel("libnvidia-extra-580-server")]]
    assert stanza["Pre-Depends"] == stanza["Recommends"] == stanza["Provides"] == []


def test_apt_stanzas_reads_versioned_relations_continuation_lines_and_alternatives():
    [utils] = filters.apt_stanzas(PLUCKY_UTILS_580)
    assert utils["Depends"] == [
        [_rel("libc6", ">=", "2.34")],
        [_rel("libnvidia-compute-580-server", ">=", "580.95.05")],
        [_rel("nvidia-kernel-common-580-server", "=", "580.95.05-0ubuntu0.25.04.1")],
    ]
    assert utils["Suggests"] == [[_rel("nvidia-driver-580-server")]]
    [mutt] = filters.apt_stanzas(POLICY_MUTT)
    assert mutt["Depends"] == [[_rel("libc6", ">=", "2.2.1")], [_rel("exim"), _rel("mail-transport-agent")]]
    # No Source field: the source package has the binary's name (Debian Policy 5.6.1).
    assert mutt["Source"] == "mutt" and mutt["Description"] == ""


def test_apt_stanzas_reads_several_stanzas_in_order_and_skips_other_lines():
    text = (
        "N: There are 2 additional records. Please use the '-a' switch to see them.\n\n"
        + NOBLE_EXTRA_535_TRANSITIONAL
        + "\n"
        + NOBLE_EXTRA_535.replace("\n", "\r\n")
        + "\n\n"
    )
    stanzas = filters.apt_stanzas(text)
    assert [s["Version"] for s in stanzas] == ["535.309.01-0ubuntu0.24.04.2", "535.309.01-0ubuntu0.24.04.1"]
    assert stanzas[1]["Depends"] == [[_rel("libc6", ">=", "2.34")]]
    assert filters.apt_stanzas("") == filters.apt_stanzas(None) == []


def test_apt_stanzas_keeps_the_synopsis_and_the_source_name_only():
    # Format features of Debian Policy 5.6.1 (Source: name (version)), 5.6.13 (Description: synopsis, then the
    # extended description on continuation lines) and 7.1 (arch qualifiers, [arch] restrictions); apt-cache show
    # prints Description-en where translated descriptions are shipped (Ubuntu).
    text = (
        "Package: libnvidia-extra-535-server\n"
        "Version: 535.309.01-0ubuntu0.24.04.2\n"
        "Source: nvidia-graphics-drivers-535-server (535.309.01-0ubuntu0.24.04.2)\n"
        "Depends: libc6:any (>= 2.34) [arm64],\n libnvidia-extra-580-server [!arm64]\n"
        "Description-en: Extra libraries for the NVIDIA Server Driver (transitional package)\n"
        " This is a transitional package.\n .\n Second paragraph.\n"
    )
    [stanza] = filters.apt_stanzas(text)
    assert stanza["Source"] == "nvidia-graphics-drivers-535-server"
    assert stanza["Description"] == "Extra libraries for the NVIDIA Server Driver (transitional package)"
    assert stanza["Description-en"].splitlines()[1:] == ["This is a transitional package.", ".", "Second paragraph."]
    assert stanza["Depends"] == [[_rel("libc6", ">=", "2.34")], [_rel("libnvidia-extra-580-server")]]


def test_apt_stanzas_refuses_a_relation_it_cannot_read():
    with pytest.raises(AnsibleFilterError, match="not a package relation"):
        filters.apt_stanzas("Package: x\nVersion: 1\nDepends: libc6 (>= 2.34\n")


# --- debian_version_compare / newest_build -------------------------------------


@pytest.mark.parametrize(
    "older, newer",
    [
        # Debian Policy 5.6.12: "~" sorts before anything, even the end of a part; the epoch counts first.
        ("1.0~rc1", "1.0"),
        ("1.0", "1.0+b1"),
        ("1.0-1", "1:0.9-1"),
        ("1.0-1~deb12u1", "1.0-1"),
        ("2.9", "2.10"),
        ("1.0a", "1.0+"),
        # Canonical's revision of a stable-release update: 0ubuntu0.22.04.2 replaces 0ubuntu0.22.04.1
        # (https://packages.ubuntu.com/source/jammy/libs/fabric-manager-535: 535.309.01-0ubuntu0.22.04.2 after
        # https://packages.ubuntu.com/jammy/cuda-drivers-fabricmanager-535: 535.309.01-0ubuntu0.22.04.1).
        ("535.309.01-0ubuntu0.22.04.1", "535.309.01-0ubuntu0.22.04.2"),
        # NVIDIA's revisions sort above Canonical's for one upstream version (issue 14 finding 3): its repository's
        # "-1" (cuda-drivers-fabricmanager 535.129.03-1, NVIDIA/apt-packaging-fabric-manager#3) and "-0ubuntu1"
        # (libnvidia-extra-535_535.261.03-0ubuntu1_amd64.deb of .../repos/ubuntu2204/x86_64, as an apt log quotes it).
        # Canonical's side has the form of its jammy builds above; these two exact jammy builds were not seen.
        ("535.129.03-0ubuntu0.22.04.1", "535.129.03-1"),
        ("535.261.03-0ubuntu0.22.04.1", "535.261.03-0ubuntu1"),
        ("535.261.03-0ubuntu1", "535.261.03-1"),
        # Debian's builds: trixie's libnvidia-tesla-535-cuda1 535.216.03-3 (https://packages.debian.org/trixie/libnvidia-tesla-535-cuda1)
        # and bookworm's libcuda1 535.261.03-1 (https://packages.debian.org/it/bookworm/libcuda1).
        ("535.216.03-3", "535.261.03-1"),
    ],
)
def test_debian_version_compare_orders_as_dpkg_does(older, newer):
    assert filters.debian_version_compare(older, newer) == -1
    assert filters.debian_version_compare(newer, older) == 1
    assert filters.debian_version_compare(newer, newer) == 0


def test_debian_version_compare_treats_a_missing_revision_and_epoch_as_zero():
    assert filters.debian_version_compare("0:1.0", "1.0") == 0
    assert filters.debian_version_compare("1.0", "1.0-0") == 0
    assert filters.debian_version_compare("1.00", "1.0") == 0


@pytest.mark.parametrize("version", ["", None, "x1.0", "1.0 2", "a:1.0"])
def test_debian_version_compare_refuses_what_is_not_a_version(version):
    with pytest.raises(AnsibleFilterError, match="not a Debian version"):
        filters.debian_version_compare(version, "1.0")


# `apt-cache policy cuda-drivers-fabricmanager` against NVIDIA's ubuntu2204/x86_64 repository, as posted in
# https://github.com/NVIDIA/apt-packaging-fabric-manager/issues/3: NVIDIA keeps every build of every branch.
NVIDIA_FM_VERSIONS = ["550.54.14-1", "545.23.08-1", "545.23.06-1", "535.161.07-1", "535.154.05-1", "535.129.03-1"]
# Builds Canonical published for jammy, one at a time (a pocket keeps the newest only): 535.247.01-0ubuntu0.22.04.1
# of nvidia-graphics-drivers-535-server (https://packages.ubuntu.com/en/jammy-updates/nvidia-kernel-common-535-server
# when it was current), 535.309.01-0ubuntu0.22.04.1 of fabric-manager-535 and 535.309.01-0ubuntu0.22.04.2 of both
# (pages cited above); a jammy 535.288.01 build was not seen (not confirmed), so it is not among them.
CANONICAL_JAMMY_535 = ["535.247.01-0ubuntu0.22.04.1", "535.309.01-0ubuntu0.22.04.2", "535.309.01-0ubuntu0.22.04.1"]


def test_newest_build_picks_the_newest_of_the_branch_in_nvidia_repository():
    assert filters.newest_build(NVIDIA_FM_VERSIONS, "535") == "535.161.07-1"
    assert filters.newest_build(NVIDIA_FM_VERSIONS, 545) == "545.23.08-1"
    assert filters.newest_build(NVIDIA_FM_VERSIONS, "580") == ""


def test_newest_build_picks_canonical_latest_revision():
    assert filters.newest_build(CANONICAL_JAMMY_535, "535") == "535.309.01-0ubuntu0.22.04.2"


def test_newest_build_reads_stanzas_too():
    stanzas = filters.apt_stanzas(NOBLE_EXTRA_535 + "\n" + NOBLE_EXTRA_535_TRANSITIONAL + "\n" + PLUCKY_UTILS_580)
    assert filters.newest_build(stanzas, "535") == "535.309.01-0ubuntu0.24.04.2"
    assert filters.newest_build(stanzas, "580") == "580.95.05-0ubuntu0.25.04.1"
    assert filters.newest_build([], "535") == filters.newest_build(None, "535") == ""


# --- fleet_release (nvidia_driver_version: latest) ------------------------------


def test_fleet_release_is_the_newest_release_every_host_offers():
    # A focal host: Canonical's focal builds have the form -0ubuntu0.20.04.N (this exact build is assumed, not seen);
    # the release, not the version string, is what the hosts share.
    jammy = CANONICAL_JAMMY_535
    focal = ["535.247.01-0ubuntu0.20.04.1"]
    assert filters.fleet_release([jammy, focal], "535") == "535.247.01"
    assert filters.fleet_release([jammy], "535") == "535.309.01"
    assert filters.fleet_release([NVIDIA_FM_VERSIONS, NVIDIA_FM_VERSIONS[1:]], 545) == "545.23.08"


def test_fleet_release_is_empty_without_a_common_release_of_the_branch():
    assert filters.fleet_release([CANONICAL_JAMMY_535, NVIDIA_FM_VERSIONS], "535") == ""
    assert filters.fleet_release([NVIDIA_FM_VERSIONS], "580") == ""
    assert filters.fleet_release([], "535") == filters.fleet_release(None, "535") == ""
    assert filters.fleet_release([[]], "535") == ""


def test_fleet_release_reads_stanzas_too():
    stanzas = filters.apt_stanzas(NOBLE_EXTRA_535 + "\n" + NOBLE_EXTRA_535_TRANSITIONAL)
    assert filters.fleet_release([stanzas], "535") == "535.309.01"


# --- package_branch / foreign_branches ------------------------------------------


@pytest.mark.parametrize(
    "name, branch",
    [
        ("libnvidia-extra-580-server", "580"),
        ("nvidia-utils-535-server", "535"),
        ("cuda-drivers-580", "580"),
        ("cuda-drivers-fabricmanager-535", "535"),
        ("nvidia-fabricmanager-535", "535"),
        ("libnvidia-nscq-535", "535"),
        ("libnvidia-cfg1-535", "535"),
        ("nvidia-headless-no-dkms-535-server", "535"),
        # Virtual package of the 580-server kernel side (packages.ubuntu.com, questing-updates nvidia-utils-580-server).
        ("nvidia-kernel-common-580-server-580.159.03", "580"),
        # Signed modules: per kernel, and flavour metapackages (packages.ubuntu.com, jammy linux-restricted-modules).
        ("linux-modules-nvidia-535-server-5.15.0-91-generic", "535"),
        ("linux-modules-nvidia-390-5.15.0-186-generic", "390"),
        ("linux-modules-nvidia-535-server-generic-hwe-22.04", "535"),
        ("linux-modules-nvidia-580-server-generic", "580"),
        ("nvidia-tesla-535-driver", "535"),
        # No branch: generic libraries, Debian's unversioned names, the kernel's ABI number, the meta cuda-drivers.
        ("libc6", ""),
        ("libgcc-s1", ""),
        ("libssl3t64", ""),
        ("nvidia-kernel-dkms", ""),
        ("nvidia-driver", ""),
        ("cuda-drivers", ""),
        ("linux-image-5.15.0-106-generic", ""),
        ("linux-signatures-nvidia-5.15.0-106-generic", ""),
        ("cuda-toolkit-12-1", ""),
        ("datacenter-gpu-manager", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_package_branch_reads_the_branch_a_name_carries(name, branch):
    assert filters.package_branch(name) == branch


def _foreign(package, version, depends_on, branch):
    return {"package": package, "version": version, "depends_on": depends_on, "branch": branch}


def test_foreign_branches_names_canonical_transitional_535_server_packages():
    # Canonical's 535-server packages after R535's end of life depend on 580-server ones (issue 14 finding 1).
    stanzas = filters.apt_stanzas(
        "\n".join([NOBLE_EXTRA_535_TRANSITIONAL, QUESTING_FM_535, QUESTING_KERNEL_COMMON_535])
    )
    assert filters.foreign_branches(stanzas, "535") == [
        _foreign("libnvidia-extra-535-server", "535.309.01-0ubuntu0.24.04.2", "libnvidia-extra-580-server", "580"),
        _foreign("cuda-drivers-fabricmanager-535", "535.261.03-0ubuntu2", "cuda-drivers-fabricmanager-580", "580"),
        _foreign("nvidia-kernel-common-535-server", "535.261.03-0ubuntu2", "nvidia-kernel-common-580-server", "580"),
    ]


def test_foreign_branches_passes_genuine_535_packages():
    # Depends on libc6, libgcc-s1, libssl3t64 and on 535 names only.
    text = "\n".join([NOBLE_EXTRA_535, NOBLE_COMPUTE_535, JAMMY_FM_535])
    assert filters.foreign_branches(text, "535") == []
    assert filters.foreign_branches(filters.apt_stanzas(text), 535) == []


def test_foreign_branches_reads_versioned_and_virtual_names_and_the_branch_asked_for():
    stanzas = filters.apt_stanzas(PLUCKY_UTILS_580 + "\n" + QUESTING_UTILS_580)
    assert filters.foreign_branches(stanzas, "580") == []
    # The same stanzas are foreign to 535: what a 535 candidate must not pull in. Suggests do not count.
    assert filters.foreign_branches(stanzas, "535") == [
        _foreign("nvidia-utils-580-server", "580.95.05-0ubuntu0.25.04.1", "libnvidia-compute-580-server", "580"),
        _foreign("nvidia-utils-580-server", "580.95.05-0ubuntu0.25.04.1", "nvidia-kernel-common-580-server", "580"),
        _foreign("nvidia-utils-580-server", "580.159.03-0ubuntu0.25.10.1", "libnvidia-compute-580-server", "580"),
        _foreign(
            "nvidia-utils-580-server",
            "580.159.03-0ubuntu0.25.10.1",
            "nvidia-kernel-common-580-server-580.159.03",
            "580",
        ),
    ]


def test_foreign_branches_names_a_535_package_built_from_580():
    # https://packages.ubuntu.com/ru/resolute/libnvidia-extra-535-server: 580.159.03-0ubuntu0.26.04.1, source
    # nvidia-graphics-drivers-580-server, "dep: libnvidia-extra-580-server", "(transitional package)".
    text = (
        "Package: libnvidia-extra-535-server\nVersion: 580.159.03-0ubuntu0.26.04.1\n"
        "Source: nvidia-graphics-drivers-580-server\nDepends: libnvidia-extra-580-server\n"
        "Description: Extra libraries for the NVIDIA Server Driver (transitional package)\n"
    )
    assert filters.foreign_branches(text, "535") == [
        _foreign("libnvidia-extra-535-server", "580.159.03-0ubuntu0.26.04.1", "", "580"),
        _foreign("libnvidia-extra-535-server", "580.159.03-0ubuntu0.26.04.1", "libnvidia-extra-580-server", "580"),
    ]


def test_foreign_branches_names_signed_module_metapackages_moved_to_580():
    # https://packages.ubuntu.com/questing/kernel/linux-modules-nvidia-535-server-generic-hwe-24.04-edge
    # (6.17.0-40.40, "dummy transitional package": "dep: linux-modules-nvidia-580-server-generic-hwe-24.04-edge").
    # Its own version is the kernel's, which is no branch.
    text = (
        "Package: linux-modules-nvidia-535-server-generic-hwe-24.04-edge\nVersion: 6.17.0-40.40\n"
        "Source: linux-restricted-modules\nDepends: linux-modules-nvidia-580-server-generic-hwe-24.04-edge\n"
    )
    assert filters.foreign_branches(text, "535") == [
        _foreign(
            "linux-modules-nvidia-535-server-generic-hwe-24.04-edge",
            "6.17.0-40.40",
            "linux-modules-nvidia-580-server-generic-hwe-24.04-edge",
            "580",
        )
    ]


def test_foreign_branches_does_not_judge_names_of_no_branch():
    # NVIDIA's Debian cuda-drivers-580 580.105.08-1 (its Depends as quoted in NVIDIA's developer forum,
    # https://forums.developer.nvidia.com/t/debian-cuda-drivers-580-package-580-105-08-1-improperly-pulls-in-v590-components/353805)
    # pulls 590 components through unbounded ">=" on names of no branch: not a case this filter can see.
    text = (
        "Package: cuda-drivers-580\nVersion: 580.105.08-1\n"
        "Depends: nvidia-driver (>= 580.65.06), nvidia-driver-cuda (>= 580.65.06), nvidia-kernel-dkms (>= 580.65.06),"
        " nvidia-settings (>= 580.65.06), nvidia-xconfig (>= 580.65.06)\n"
    )
    assert filters.foreign_branches(text, "580") == []
    # An entry that a package of the branch (or of no branch) also satisfies is not foreign.
    either = (
        "Package: x-nvidia-535\nVersion: 535.1-1\nDepends: libnvidia-gl-580 | libnvidia-gl-535, libfoo-580 | libgl1\n"
    )
    assert filters.foreign_branches(either, "535") == []


# --- signed_module_packages / signed_module_version / module_version_matches ----


def test_signed_module_packages_names_the_kernel_packages_and_the_flavour_metapackage():
    # Names of Canonical's linux-restricted-modules. Per kernel, linux-modules-nvidia-<branch>[-server]-<uname -r>:
    # https://packages.ubuntu.com/jammy/kernel/linux-modules-nvidia-550-5.15.0-106-generic lists
    # linux-modules-nvidia-470-server-5.15.0-106-generic and linux-modules-nvidia-535-5.15.0-106-generic (the 535-server
    # one of that kernel was not in the part of the list seen; the pattern was). The flavour metapackage
    # linux-modules-nvidia-535-server-generic: jammy's linux-modules-nvidia-510-server-generic depends on it on amd64
    # (https://packages.ubuntu.com/eu/jammy/linux-modules-nvidia-510-server-generic).
    assert filters.signed_module_packages(["5.15.0-106-generic"], "535") == [
        "linux-modules-nvidia-535-server-5.15.0-106-generic",
        "linux-modules-nvidia-535-server-generic",
    ]
    assert filters.signed_module_packages("5.15.0-106-generic", 535, server=False) == [
        "linux-modules-nvidia-535-5.15.0-106-generic",
        "linux-modules-nvidia-535-generic",
    ]


def test_signed_module_packages_takes_the_hwe_flavour_of_the_kernel_metapackage():
    # canonical/ubuntu-drivers-common: get_linux_modules_metapackage() (UbuntuDrivers/detect.py) names
    # linux-modules-nvidia-<driver>-<linux metapackage without "linux-">; its tests/test_ubuntu_drivers.py archive has
    # linux-modules-nvidia-535-server-generic-hwe-20.04 depending on linux-modules-nvidia-535-server-5.4.0-25-generic
    # and expects linux-modules-nvidia-535-generic-hwe-20.04 for linux-generic-hwe-20.04. On 22.04,
    # `ubuntu-drivers list` prints "nvidia-driver-535-server, (kernel modules provided by
    # linux-modules-nvidia-535-server-generic-hwe-22.04)" (as users posted it).
    assert filters.signed_module_packages(["5.4.0-25-generic"], "535", ["linux-generic-hwe-20.04"]) == [
        "linux-modules-nvidia-535-server-5.4.0-25-generic",
        "linux-modules-nvidia-535-server-generic-hwe-20.04",
    ]
    assert filters.signed_module_packages([], "535", "generic-hwe-22.04") == [
        "linux-modules-nvidia-535-server-generic-hwe-22.04"
    ]
    # Two kernels of one flavour (the running one and the one the next boot starts): one metapackage.
    assert filters.signed_module_packages(["5.15.0-106-generic", "5.15.0-174-generic"], "535") == [
        "linux-modules-nvidia-535-server-5.15.0-106-generic",
        "linux-modules-nvidia-535-server-5.15.0-174-generic",
        "linux-modules-nvidia-535-server-generic",
    ]


def test_signed_module_packages_needs_a_flavour():
    with pytest.raises(AnsibleFilterError, match="no Ubuntu kernel flavour"):
        filters.signed_module_packages(["5.15.0-106"], "535")


# https://packages.ubuntu.com/pl/resolute/kernel/linux-modules-nvidia-595-server-nvidia (7.0.0-1015.15+1, source
# linux-restricted-modules-nvidia: "dep: linux-modules-nvidia-595-server-7.0.0-1015-nvidia (= 7.0.0-1015.15+1)",
# "dep: nvidia-kernel-common-595-server (>= 595.71.05)"): the package has the kernel's version, the driver version
# is in its dependency on the branch's kernel-common package.
RESOLUTE_MODULES_595 = """Package: linux-modules-nvidia-595-server-nvidia
Architecture: amd64
Version: 7.0.0-1015.15+1
Source: linux-restricted-modules-nvidia
Depends: linux-modules-nvidia-595-server-7.0.0-1015-nvidia (= 7.0.0-1015.15+1),
 nvidia-kernel-common-595-server (>= 595.71.05)
Description: Extra drivers for nvidia-595-server for the nvidia flavour
"""
# https://packages.ubuntu.com/jammy/linux-modules-nvidia-390-generic-5.15 (5.15.0-186.196+1: "dep:
# linux-modules-nvidia-390-5.15.0-186-generic (= 5.15.0-186.196+1)", "dep: nvidia-kernel-common-390 (>= 390.157)").
JAMMY_MODULES_390 = """Package: linux-modules-nvidia-390-generic-5.15
Architecture: amd64
Version: 5.15.0-186.196+1
Source: linux-restricted-modules
Depends: linux-modules-nvidia-390-5.15.0-186-generic (= 5.15.0-186.196+1), nvidia-kernel-common-390 (>= 390.157)
Description: Extra drivers for nvidia-390 for the generic-5.15 flavour
"""


def test_signed_module_version_is_the_kernel_common_dependency_not_the_package_version():
    assert filters.signed_module_version(RESOLUTE_MODULES_595) == "595.71.05"
    assert filters.signed_module_version(filters.apt_stanzas(JAMMY_MODULES_390)[0]) == "390.157"
    assert filters.signed_module_version(NOBLE_EXTRA_535) == ""
    assert filters.signed_module_version("") == filters.signed_module_version(None) == ""


def test_module_version_matches_the_userspace_upstream_version():
    # Userspace of resolute: nvidia-utils-595-server 595.71.05-0ubuntu0.26.04.1
    # (https://packages.ubuntu.com/ru/resolute/nvidia-utils-595-server) and nvidia-utils-580-server
    # 580.159.03-0ubuntu0.26.04.1 (https://packages.ubuntu.com/pl/resolute-updates/nvidia-utils-580-server).
    assert filters.module_version_matches(RESOLUTE_MODULES_595, "595.71.05-0ubuntu0.26.04.1")
    assert filters.module_version_matches(filters.apt_stanzas(RESOLUTE_MODULES_595)[0], "595.71.05-0ubuntu0.26.04.1")
    assert not filters.module_version_matches(RESOLUTE_MODULES_595, "580.159.03-0ubuntu0.26.04.1")
    # A version given as such; jammy's 535.309.01 builds (Canonical's and NVIDIA's revisions) against 535.261.03.
    assert filters.module_version_matches("535.309.01", "535.309.01-0ubuntu0.22.04.2")
    assert not filters.module_version_matches("535.309.01-0ubuntu0.22.04.2", "535.261.03-1")
    # Unknown module version, or no userspace version: no match.
    assert not filters.module_version_matches(NOBLE_EXTRA_535, "535.309.01-0ubuntu0.24.04.1")
    assert not filters.module_version_matches("", "535.309.01") and not filters.module_version_matches("535.309.01", "")


def test_signed_module_mismatches_lists_the_packages_of_another_release():
    text = RESOLUTE_MODULES_595 + "\n" + JAMMY_MODULES_390 + "\n" + NOBLE_EXTRA_535
    assert filters.signed_module_mismatches(text, "595.71.05-0ubuntu0.26.04.1") == [
        {"package": "linux-modules-nvidia-390-generic-5.15 5.15.0-186.196+1", "module": "390.157"}
    ]
    # A package that names no release (NOBLE_EXTRA_535) is not judged; none given, none found.
    assert filters.signed_module_mismatches(NOBLE_EXTRA_535, "535.309.01") == []
    assert filters.signed_module_mismatches("", "535.309.01") == filters.signed_module_mismatches(None, "1") == []


def test_the_driver_build_filters_are_registered():
    registered = filters.FilterModule().filters()
    for name in (
        "apt_stanzas",
        "debian_version_compare",
        "newest_build",
        "package_branch",
        "foreign_branches",
        "signed_module_packages",
        "signed_module_version",
        "module_version_matches",
        "signed_module_mismatches",
        "apt_policy",
        "dkms_status",
        "per_message",
    ):
        assert callable(registered[name]), name


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


# --- profile_overrides_problem, dcgm_level (gpu_verify's settings, judged by gpufleet_check's own rules) ----


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({}, ""),
        (None, ""),
        ("", ""),
        ({"H200": {"allreduce_8gpu_busbw_gbps": 440}}, ""),
        ({"GB200": {"device_ids": ["2941"], "nvlink_links": 18}}, ""),
        (
            {"H200": {"allreduce_8gpu_busbw_gbpss": 440}},
            "profile overrides: 'H200': unknown field(s) allreduce_8gpu_busbw_gbpss",
        ),
        ({"B300": {"h2d_gbps": 50}}, "profile overrides: 'B300' is not a known profile"),
        ({"H200": {"nvlink_links": 17.5}}, "profile overrides: 'H200': nvlink_links must be a whole number, got 17.5"),
        ({"H200": {"nvswitch_fabric": "yes"}}, "profile overrides: 'H200': nvswitch_fabric must be true or false"),
        ({"H200": 440}, "profile overrides: 'H200' must be an object of fields, got int"),
        (["H200"], "profile overrides must be a JSON object of profiles, got list"),
    ],
)
def test_profile_overrides_problem_is_gpufleet_checks_own_validator(overrides, problem):
    found = filters.profile_overrides_problem(overrides)
    assert found.startswith(problem) and bool(found) == bool(problem), found


def test_dcgm_level_and_its_time_limit_are_gpufleet_checks():
    """dcgmi diag -r 1/2/3 (dcgmi-diag(1): seconds, about 2 minutes, about 15 minutes); the limits are
    gpufleet_check's dcgm.DEFAULT_TIMEOUT_S, one place."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import gpufleet_check_module

    limits = gpufleet_check_module("dcgm").DEFAULT_TIMEOUT_S
    assert filters.dcgm_level("none") == {"level": 0, "timeout": 0}
    assert filters.dcgm_level("quick") == {"level": 1, "timeout": limits[1]} == {"level": 1, "timeout": 300}
    assert filters.dcgm_level("r2") == {"level": 2, "timeout": 900}
    assert filters.dcgm_level("r3", 0) == {"level": 3, "timeout": 2700}
    assert filters.dcgm_level("r3", "3600") == {"level": 3, "timeout": 3600}
    with pytest.raises(AnsibleFilterError, match="'r4' is not one of none, quick, r2, r3"):
        filters.dcgm_level("r4")


# --- the environment's Python and the default PyTorch release ------------------
# os_pythons: python3 3.8.2-0ubuntu2 (https://packages.ubuntu.com/focal/python/python3), 3.10.6-1~22.04
# (https://packages.ubuntu.com/jammy/python3), 3.11.2-1+b1 (https://packages.debian.org/bookworm/python3);
# pytorch_pythons from PyPI's metadata (torch 2.5.x: cp39 ... cp313, no cp38).


@pytest.mark.parametrize(
    ("interpreter", "distribution", "version", "python"),
    [
        ("/usr/bin/python3", "Ubuntu", "20.04", "3.8"),
        ("", "Ubuntu", "22.04", "3.10"),
        ("/usr/bin/python3", "Debian", "12.5", "3.11"),
        ("/usr/bin/python3.9", "Ubuntu", "20.04", "3.9"),
        ("/opt/conda/bin/python", "Ubuntu", "20.04", ""),
        ("/usr/bin/python3", "Ubuntu", "24.04", ""),
    ],
)
def test_the_environment_python_is_the_os_python3_or_the_interpreters_own(interpreter, distribution, version, python):
    assert stack.environment_python(MATRIX, interpreter, distribution, version)["version"] == python


@pytest.mark.parametrize(
    ("python", "release"),
    [("3.8", "2.4.1"), ("3.10", "2.5.1"), ("3.11", "2.5.1"), ("3.13", "2.5.1"), ("", "2.5.1"), ("3.7", "")],
)
def test_the_default_release_is_the_newest_the_python_takes(python, release):
    assert stack.default_release(MATRIX, python) == release


def test_the_default_never_passes_the_matrix_default():
    """defaults.pytorch_release is the ceiling: with 2.4.1 as the default, Python 3.11 gets 2.4.1, not 2.5.1."""
    older = {**MATRIX, "defaults": {**MATRIX["defaults"], "pytorch_release": "2.4.1"}}
    assert stack.default_release(older, "3.11") == "2.4.1"


def test_a_release_the_python_cannot_take_is_a_reason_naming_those_it_can():
    resolved = stack.resolve(
        MATRIX, pytorch_release="2.5.0", distribution="Ubuntu", os_version="20.04", python="/usr/bin/python3"
    )
    assert resolved["pytorch"] == {}
    assert resolved["errors"] == [
        "pytorch_release 2.5.0: torch 2.5.0 has no wheels for Python 3.8 (/usr/bin/python3, the python3 of Ubuntu "
        "20.04), only for Python 3.9, 3.10, 3.11, 3.12, 3.13; choose a release whose wheels exist for Python 3.8: "
        "2.1.0 ... 2.4.1 (or leave pytorch_release empty for the newest of them, 2.4.1), or make the environment with "
        "an interpreter torch 2.5.0 has wheels for (pytorch_python, pytorch_python_packages)"
    ]
    ok = stack.resolve(MATRIX, distribution="Ubuntu", os_version="20.04", python="/usr/bin/python3")
    assert ok["errors"] == [] and ok["pytorch"]["release"] == "2.4.1" and ok["pytorch"]["default"] is True
