"""Types and choices come from the roles' argument specs, applied by Ansible's own validator.

Play 1 applies each role's main spec with ``ansible.builtin.validate_argument_spec``
(playbooks/tasks/validate-role.yml, the spec from ``lookup('gpufleet.fleet.role_settings',
role=...)``); a role run on its own applies it at its start. These tests apply the
same spec with the same validator (``ArgumentSpecValidator``), so a wrongly typed
setting needs no hand-written check in the role (tests/e2e/test_bad_input.py runs
the real play 1)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("role_settings", REPO / "plugins/lookup/role_settings.py")
role_settings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(role_settings)


def errors(role: str, values: dict) -> list[str]:
    return ArgumentSpecValidator(role_settings.role_spec(role)).validate(values).error_messages


WRONG = [
    (
        "pytorch",
        {"pytorch_require_gpu": "perhaps"},
        "'pytorch_require_gpu' is of type str and we were unable to convert to bool",
    ),
    ("pytorch", {"pytorch_require_hashes_offline": "maybe"}, "'pytorch_require_hashes_offline' is of type str"),
    (
        "pytorch",
        {"pytorch_pip_timeout": "soon"},
        "'pytorch_pip_timeout' is of type str and we were unable to convert to int",
    ),
    (
        "monitoring",
        {"monitoring_dcgm": "maybe"},
        "'monitoring_dcgm' is of type str and we were unable to convert to bool",
    ),
    ("monitoring", {"monitoring_node_exporter_port": "http"}, "'monitoring_node_exporter_port' is of type str"),
    ("slurm", {"slurm_node_memory_reserved_mb": "2G"}, "'slurm_node_memory_reserved_mb' is of type str"),
    (
        "slurm",
        {"slurm_proctrack_type": "proctrack/cray"},
        "value of slurm_proctrack_type must be one of: proctrack/cgroup",
    ),
    (
        "slurm",
        {"slurm_task_plugins": ["task/magic"]},
        "value of slurm_task_plugins must be one or more of: task/cgroup",
    ),
    (
        "slurm",
        {"slurm_extra_config": "not a mapping"},
        "'slurm_extra_config' is of type str and we were unable to convert to dict",
    ),
    ("gpu_verify", {"gpu_verify_expected_gpus": "many"}, "'gpu_verify_expected_gpus' is of type str"),
    (
        "gpu_verify",
        {"gpu_verify_skip_checks": ["gemmm"]},
        "value of gpu_verify_skip_checks must be one or more of: driver_version",
    ),
    (
        "gpu_verify",
        {"gpu_verify_gemm_min_fraction": "most"},
        "'gpu_verify_gemm_min_fraction' is of type str and we were unable to convert to float",
    ),
    ("smoke_training", {"smoke_training_steps": "x"}, "'smoke_training_steps' is of type str"),
    (
        "smoke_training",
        {"smoke_training_amp": "fp8"},
        "value of smoke_training_amp must be one of: auto, bf16, fp16, off",
    ),
    (
        "smoke_training",
        {"smoke_training_expect_transport": "infiniband"},
        "value of smoke_training_expect_transport must be one of: any, ib, roce, socket",
    ),
    (
        "smoke_training",
        {"smoke_training_expect_gdr": "maybe"},
        "value of smoke_training_expect_gdr must be one of: any, true, false",
    ),
    (
        "smoke_training",
        {"smoke_training_min_busbw_rdma_gbps": "fast"},
        "'smoke_training_min_busbw_rdma_gbps' is of type str and we were unable to convert to float",
    ),
    (
        "nvidia_driver",
        {"nvidia_driver_module_source": "kmod"},
        "value of nvidia_driver_module_source must be one of: dkms, signed",
    ),
    (
        "cuda",
        {"cuda_compile_check": "perhaps"},
        "'cuda_compile_check' is of type str and we were unable to convert to bool",
    ),
]


@pytest.mark.parametrize(("role", "values", "message"), WRONG, ids=[next(iter(v)) for _role, v, _message in WRONG])
def test_the_spec_rejects_a_wrong_type_or_choice_naming_the_setting(role, values, message):
    found = errors(role, values)
    assert len(found) == 1 and message in found[0], found


ACCEPTED = [
    # The forms -e gives: strings that the spec converts, and lists as comma-separated strings
    # (the roles read them with gpufleet.fleet.as_list / as_dict, the same rules).
    (
        "pytorch",
        {"pytorch_require_gpu": "true", "pytorch_pip_timeout": "60", "pytorch_extra_packages": "numpy==1.26.4"},
    ),
    ("slurm", {"slurm_task_plugins": "task/cgroup,task/affinity", "slurm_extra_config": "DefMemPerGPU=8192"}),
    ("gpu_verify", {"gpu_verify_skip_checks": "gemm,allreduce_busbw", "gpu_verify_gemm_min_fraction": "0.5"}),
    ("smoke_training", {"smoke_training_amp": "off", "smoke_training_steps": "8"}),
    # YAML's true (an inventory's `smoke_training_expect_gdr: true`) and -e's string.
    ("smoke_training", {"smoke_training_expect_gdr": True, "smoke_training_min_busbw_rdma_gbps": "20"}),
    ("smoke_training", {"smoke_training_expect_gdr": "false", "smoke_training_expect_transport": "roce"}),
]


@pytest.mark.parametrize(("role", "values"), ACCEPTED, ids=[r for r, _values in ACCEPTED])
def test_the_spec_accepts_the_forms_extra_vars_give(role, values):
    assert errors(role, values) == []


ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))


@pytest.mark.parametrize("role", ROLES)
def test_nothing_given_fails_only_what_a_role_requires(role):
    """Play 1 checks what the inventory gives: nothing given is no error for a role a user runs;
    an internal role's required inputs (apt_source's, from its callers) are named."""
    required = sorted(name for name, option in role_settings.role_spec(role).items() if option.get("required"))
    found = errors(role, {})
    assert [name for name in required if not any(name in message for message in found)] == []
    assert bool(found) == bool(required)
