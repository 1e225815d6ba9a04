"""The framework of the roles' Python rules (plugins/module_utils/settings.py) and the cuda role's rules, directly.

The other roles' rules have their own test_rules_<role>.py; every role's rules also run for real through its
tasks/validate.yml in the role's tests (tests/unit/role_run.py), and through play 1 in tests/e2e/test_bad_input.py.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

settings = importlib.import_module("ansible_collections.gpufleet.fleet.plugins.module_utils.settings")
cuda = importlib.import_module("ansible_collections.gpufleet.fleet.plugins.module_utils.rules.cuda")
stack_plugin = importlib.import_module("ansible_collections.gpufleet.fleet.plugins.lookup.stack")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text", ["8", "8.0", " 8 ", "abc", "", None, True, 3.7, "-1", "1e3", [1]])
def test_to_int_and_to_float_are_jinjas_filters(text):
    """The rules read a setting as Jinja's | int and | float did (a non-number is 0)."""
    templar = Templar(loader=DataLoader(), variables={"v": text})
    assert settings.to_int(text) == templar.evaluate_expression(trust_as_template("v | int"))
    assert settings.to_float(text) == templar.evaluate_expression(trust_as_template("v | float"))


@pytest.mark.parametrize("value", ["yes", "True", "on", "1", 1, True, "no", "false", "0", 0, "", None, "perhaps"])
def test_to_bool_is_ansibles_bool_filter(value):
    templar = Templar(loader=DataLoader(), variables={"v": value})
    assert settings.to_bool(value) is templar.evaluate_expression(trust_as_template("v | bool"))


def test_a_rule_message_is_one_line_and_the_rejection_numbers_them():
    judgement = settings.Judgement("cuda", "node-1", {"a": 1})
    assert judgement.check(True, "never said")
    assert not judgement.check(False, "first\n   rule ")
    judgement.refuse(["second"])
    assert judgement.message == "cuda settings rejected on node-1: [1] first rule; [2] second"
    with pytest.raises(KeyError, match="rules of role cuda: variable b is not defined"):
        judgement["b"]


def test_a_rejection_several_hosts_share_is_said_once_naming_them():
    hosts = ["n1", "n2", "n3"]
    first = settings.rejection_of_hosts(["bad"], "cuda", "n1", "n1", hosts)
    assert first == "cuda settings rejected on 3 hosts (n1, n2, n3): [1] bad"
    other = settings.rejection_of_hosts(["bad"], "cuda", "n2", "n1", hosts)
    assert "bad" not in other and "same settings as n1" in other
    assert settings.rejection_of_hosts(["bad"], "cuda", "n1", "n1", ["n1"]) == "cuda settings rejected on n1: [1] bad"


def test_the_part_switches_and_the_roles_play_1_judges_and_probes():
    switched = settings.parts({"gpufleet_pytorch": "yes", "gpufleet_slurm": True, "gpufleet_monitoring": False})
    assert switched == {"pytorch": True, "slurm": True, "monitoring": False, "container": False}
    assert settings.judged_roles(switched) == [
        "gpufleet",
        "nvidia_driver",
        "cuda",
        "pytorch",
        "slurm",
        "gpu_verify",
        "smoke_training",
    ]
    assert settings.probed_roles(switched) == ["nvidia_driver", "cuda", "pytorch", "slurm"]


def test_every_judged_role_has_rules_and_reads_what_it_names():
    for role in settings.judged_roles(dict.fromkeys(settings.PARTS, True)):
        module = settings.rules_of(role)
        assert callable(module.judge) and module.READS, role
    with pytest.raises(ValueError, match="role payload has no rules module"):
        settings.rules_of("payload")


def test_read_names_takes_prefixes_and_names():
    assert settings.read_names(
        ["cuda_*", "preflight_report", "absent"], ["cuda_release", "cuda_toolkit", "cudax", "preflight_report"]
    ) == ["cuda_release", "cuda_toolkit", "preflight_report"]


def test_a_mapping_read_by_key_is_cut_to_those_keys():
    reads = ["ansible_facts.distribution", "ansible_facts.os_family", "cuda_*"]
    assert settings.read_names(reads, ["ansible_facts", "cuda_release"]) == ["ansible_facts", "cuda_release"]
    values = {"ansible_facts": {"distribution": "Ubuntu", "os_family": "Debian", "hostname": "n1"}, "cuda_release": ""}
    assert settings.narrowed(reads, values) == {
        "ansible_facts": {"distribution": "Ubuntu", "os_family": "Debian"},
        "cuda_release": "",
    }


# --- the cuda role's rules ------------------------------------------------------------------------------------

CUDA_DEFAULTS = {
    "cuda_release": "",
    "cuda_repository_url": "",
    "cuda_repository_key_url": "",
    "cuda_driver_version": "",
    "cuda_toolkit": True,
    "cuda_libraries": ["cudnn", "nccl"],
    "cuda_compile_check_archs": ["sm_80"],
    "cuda_repository_keyring": "",
    "cuda_pin": True,
    "__cuda_supported_os": ["ubuntu2004", "ubuntu2204", "debian12"],
    "__cuda_public_repository_url": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64",
    "__cuda_keyring_package_keyring": "/usr/share/keyrings/cuda-archive-keyring.gpg",
}


def judge_cuda(**values):
    matrix = stack_plugin.load_matrix()
    judgement = settings.Judgement(
        "cuda",
        "node-1",
        {**CUDA_DEFAULTS, "__cuda_repo_os": "ubuntu2204", **values},
        stack=lambda **choices: stack_plugin.resolve(matrix, **choices),
    )
    cuda.judge(judgement)
    return judgement


def test_cuda_resolves_the_default_release_and_its_driver():
    judgement = judge_cuda(nvidia_driver_branch="535")
    assert judgement.errors == []
    assert judgement.facts["__cuda_release"] == "12.1"
    assert judgement.facts["__cuda_driver_source"] == "nvidia_driver_branch 535 (its default release)"
    assert judgement.facts["__cuda_spec"]["min_driver"] == "530.30.02"


def test_cuda_resolves_the_toolkit_the_repository_and_the_pins_main_writes():
    """What roles/cuda's tasks once resolved host by host in set_fact tasks (the toolkit package and home, the
    repository URL and keyring, the pins), resolved by the rules once per combination of settings."""
    facts = judge_cuda(nvidia_driver_branch="535", cuda_libraries=["nccl", "cudnn", "nccl"]).facts
    spec = facts["__cuda_spec"]
    assert (facts["__cuda_dashed"], facts["__cuda_home"], facts["__cuda_toolkit_package"]) == (
        "12-1",
        "/usr/local/cuda-12.1",
        "cuda-toolkit-12-1",
    )
    assert facts["__cuda_repo_url"] == CUDA_DEFAULTS["__cuda_public_repository_url"]
    assert facts["__cuda_keyring"] == "/usr/share/keyrings/cuda-archive-keyring.gpg"
    assert facts["__cuda_libraries"] == ["nccl", "cudnn"]
    assert facts["__cuda_repository_pins"] == [
        {"name": "cuda", "packages": ["cuda-toolkit-12-1"], "version": spec["toolkit_version"], "present": True},
        {
            "name": "nccl",
            "packages": spec["nccl"]["packages"],
            "version": spec["nccl"]["package_version"],
            "present": True,
        },
        {
            "name": "cudnn",
            "packages": spec["cudnn"]["packages"],
            "version": spec["cudnn"]["package_version"],
            "present": True,
        },
    ]
    # A key fetched from a URL signs into the repository's own keyring file; a site URL loses its trailing slash;
    # no toolkit, no toolkit pin; cuda_pin false keeps the records but absent.
    site = judge_cuda(
        nvidia_driver_branch="535",
        cuda_repository_url="https://mirror.example.com/cuda/",
        cuda_repository_key_url="https://mirror.example.com/cuda/key.asc",
        cuda_toolkit=False,
        cuda_pin=False,
        cuda_libraries=["nccl"],
    ).facts
    assert site["__cuda_repo_url"] == "https://mirror.example.com/cuda"
    assert site["__cuda_keyring"] == "/etc/apt/keyrings/gpufleet-mirror.example.com_cuda.asc"
    assert [(pin["name"], pin["present"]) for pin in site["__cuda_repository_pins"]] == [("nccl", False)]


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"nvidia_driver_branch": "470"},
            "CUDA 12.1 needs NVIDIA driver 530.30.02 or newer, but nvidia_driver_branch 470"
            " (its default release) is driver 470.256.02: choose a newer driver branch (nvidia_driver_branch)"
            " or an older CUDA release (cuda_release)",
        ),
        ({"cuda_driver_version": "470.256.02"}, "but cuda_driver_version is driver 470.256.02"),
        ({"cuda_release": "11.0"}, "cuda_release '11.0' is not a CUDA release gpufleet knows"),
        (
            {"__cuda_repo_os": "ubuntu1804"},
            "NVIDIA publishes no CUDA repository for ubuntu1804 (it does for ubuntu2004, ubuntu2204, debian12)",
        ),
        # NVIDIA's debian12 directory starts at CUDA 12.3
        # (https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ lists no cuda-toolkit-12-1).
        ({"__cuda_repo_os": "debian12"}, "Set cuda_repository_url to a site repository that carries"),
        ({"cuda_repository_url": "mirror/cuda"}, "cuda_repository_url 'mirror/cuda' is not an http(s) URL"),
        (
            {"cuda_repository_key_url": "ftp://mirror/key"},
            "cuda_repository_key_url 'ftp://mirror/key' is not an http(s) URL",
        ),
        (
            {"cuda_compile_check_archs": ["sm_80", "compute_90"]},
            "cuda_compile_check_archs must be GPU architectures like sm_80 or sm_90, got ['sm_80', 'compute_90']",
        ),
    ],
)
def test_cuda_refuses_naming_the_setting(values, message):
    judgement = judge_cuda(**values)
    assert any(message in error for error in judgement.errors), judgement.errors


def test_cuda_debian_12_passes_with_a_site_repository_or_nothing_to_install():
    assert judge_cuda(__cuda_repo_os="debian12", cuda_repository_url="http://mirror/cuda").errors == []
    assert judge_cuda(__cuda_repo_os="debian12", cuda_toolkit=False, cuda_libraries=[]).errors == []


def test_each_role_reads_what_its_rules_resolved_under_the_same_name():
    """A role's vars/main.yml reads each name its rules resolve from one place, ``__<role>_resolved``: the judgement its
    validate.yml registers (``__<role>_judged``), else, in play 1's entry point probe, which judges nothing itself,
    what play 1's run-once judgement resolved for the host (``gpufleet_judgement``, by host and role); each under that
    very name, which the role's rules set: a name read under another would give the wrong value silently."""
    roles = Path(__file__).resolve().parents[2] / "roles"
    rules_dir = Path(__file__).resolve().parents[2] / "plugins" / "module_utils" / "rules"
    mapped = 0
    for role_vars in sorted(roles.glob("*/vars/main.yml")):
        role = role_vars.parent.parent.name
        names = yaml.safe_load(role_vars.read_text()) or {}
        reading = {name: value for name, value in names.items() if f"__{role}_resolved." in str(value)}
        if not reading:
            assert f"__{role}_resolved" not in names, role
            continue
        source = " ".join(str(names[f"__{role}_resolved"]).split())
        assert source == (
            "{{ __%s_judged.resolved if __%s_judged is defined"
            " else gpufleet_judgement.resolved[inventory_hostname].%s }}" % (role, role, role)
        ), role
        rules = (rules_dir / f"{role}.py").read_text()
        for name, value in reading.items():
            mapped += 1
            assert value == "{{ __%s_resolved.%s }}" % (role, name), (role_vars, name)
            assert f'"{name}"' in rules, (role, name)
        if f"__{role}_invalid" in names:
            assert names[f"__{role}_invalid"] == "{{ __%s_judged.errors | default([]) }}" % role
        validate = (role_vars.parents[1] / "tasks" / "validate.yml").read_text()
        assert f"register: __{role}_judged" in validate, role
    assert mapped >= 60


def test_a_roles_os_vars_file_is_the_first_of_the_three_names_that_exists(tmp_path):
    """settings.os_vars_file (the lookup gpufleet.fleet.os_vars and the run-once judgement): <distribution>-<major>,
    then <distribution>, then <os_family>; '' where none exists."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import os_vars_file

    ubuntu = {"distribution": "Ubuntu", "distribution_major_version": "22", "os_family": "Debian"}
    assert os_vars_file(str(tmp_path), ubuntu) == ""
    (tmp_path / "Debian.yml").write_text("{}\n")
    assert os_vars_file(str(tmp_path), ubuntu) == str(tmp_path / "Debian.yml")
    (tmp_path / "Ubuntu.yml").write_text("{}\n")
    assert os_vars_file(str(tmp_path), ubuntu) == str(tmp_path / "Ubuntu.yml")
    (tmp_path / "Ubuntu-22.yml").write_text("{}\n")
    assert os_vars_file(str(tmp_path), ubuntu) == str(tmp_path / "Ubuntu-22.yml")
    assert os_vars_file(str(tmp_path), {}) == ""
