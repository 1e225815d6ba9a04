"""The plugins that judge and report the roles' settings, called directly: the filters as_list, as_dict,
failed_checks, rejection, per_message, unknown_settings, dcgm_exporter_release, profile_overrides_problem and
dcgm_level; the lookup role_settings."""

from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from plugin_files import REPO, filters, settings, stack

from ansible_collections.gpufleet.fleet.plugins.module_utils import settings as rules

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


def test_per_message_says_each_warning_once_with_its_hosts():
    messages = ["branch 535 is past its end of life", "", "branch 535 is past its end of life", "other  \n text", None]
    assert filters.per_message(messages, ["n1", "n2", "n3", "n4", "n5"]) == [
        "WARNING n1, n3: branch 535 is past its end of life",
        "WARNING n4: other text",
    ]
    assert filters.per_message(["", ""], ["n1", "n2"]) == []
    with pytest.raises(AnsibleFilterError, match="1 message"):
        filters.per_message(["x"], ["n1", "n2"])


# --- unknown_settings ----------------------------------------------------------

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
    assert rules.unknown_settings(["nvidia_driver_x"], {"nvidia": ["nvidia_x"], "nvidia_driver": []}) == [
        "nvidia_driver_x is not a setting of role nvidia_driver (docs/roles.md lists the settings of nvidia_driver)"
    ]


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
