"""plugins/module_utils/rules/slurm.py called directly: each rule with a value it takes and one it refuses (the exact
message; tests/unit/test_slurm_role.py runs the same rules through roles/slurm/tasks/validate.yml)."""

from __future__ import annotations

import pytest
import rules_case

BASE = {
    **rules_case.defaults(
        "slurm",
        slurm_torchrun="/opt/gpufleet/venv/bin/torchrun",
        slurm_payload_dir="/opt/gpufleet/payload",
        slurm_health_check_zipapp="/opt/gpufleet/payload/gpufleet_check.pyz",
        slurm_health_check_python="/opt/gpufleet/venv/bin/python",
        slurm_health_check_module_version_file="/sys/module/nvidia/version",
    ),
    "groups": {
        "all": ["head-01", "gpu-a01", "gpu-a02"],
        "slurm_controller": ["head-01"],
        "gpu_nodes": ["gpu-a01", "gpu-a02"],
    },
    "ansible_facts": {"distribution": "Debian", "distribution_version": "12.5"},
    "__slurm_config_dir": "/etc/slurm",
    "__slurm_health_check_keys": ["HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState"],
}


def refusals(**overrides):
    return rules_case.refusals("slurm", BASE, **overrides)


def test_the_defaults_on_a_cluster_with_one_controller_pass():
    assert refusals() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"slurm_partition_max_time": "2-12:00:00"},
        {"slurm_partition_max_time": "90"},
        {"slurm_node_gpus": 8},
        {"slurm_gpu_type": "a100-80gb"},
        {"slurm_task_plugins": "task/affinity", "slurm_proctrack_type": "proctrack/linuxproc"},
        {"slurm_health_check_node_state": ["idle", "CYCLE"]},
        {"slurm_health_check_textfile_dir": ""},
        {"slurm_health_check_textfile_dir": None},
        {"slurm_health_check": False, "slurm_extra_config": {"HealthCheckProgram": "/x"}},
        {"slurm_extra_config": "SchedulerType=sched/backfill"},
        {"slurm_health_check_timeout": "45"},
    ],
)
def test_values_the_rules_take(overrides):
    assert refusals(**overrides) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"slurm_controller_group": "heads"},
            "slurm_controller_group 'heads' has 0 host(s) (none):"
            " Slurm needs exactly one controller host in the inventory",
        ),
        (
            {"groups": {**BASE["groups"], "slurm_controller": ["head-01", "head-02"]}},
            "slurm_controller_group 'slurm_controller' has 2 host(s) (head-01, head-02):"
            " Slurm needs exactly one controller host in the inventory",
        ),
        ({"slurm_node_group": "compute"}, "slurm_node_group 'compute' has no host: Slurm needs compute nodes"),
        (
            {"slurm_cluster_name": "GPU fleet"},
            "slurm_cluster_name 'GPU fleet' must be 1-40 lowercase letters, digits, - or _",
        ),
        ({"slurm_partition_name": "gpu:1"}, "slurm_partition_name 'gpu:1' must be letters, digits, - or _"),
        (
            {"slurm_partition_max_time": "1h"},
            "slurm_partition_max_time '1h' is not a Slurm time limit"
            " (INFINITE, minutes, or [days-]hours:minutes:seconds)",
        ),
        (
            {"slurm_node_gpus": "eight"},
            "slurm_node_gpus 'eight' is not a GPU count (empty: count the GPUs on the PCI bus)",
        ),
        (
            {"slurm_gpu_type": "h100 sxm"},
            "slurm_gpu_type 'h100 sxm' must be letters, digits, '.', - or _ (h100, a100-80gb)",
        ),
        (
            {"slurm_node_memory_reserved_mb": -1},
            "slurm_node_memory_reserved_mb '-1' is not a number of MiB (0 or more)",
        ),
        (
            {"slurm_task_plugins": [], "slurm_proctrack_type": "proctrack/linuxproc"},
            "slurm_task_plugins is empty: name one or more task plugins (task/cgroup, task/affinity, task/none)",
        ),
        (
            {"slurm_proctrack_type": "proctrack/linuxproc"},
            "slurm_task_plugins has task/cgroup, which needs slurm_proctrack_type proctrack/cgroup"
            " (not proctrack/linuxproc)",
        ),
        ({"slurm_job_script_dir": "slurm"}, "slurm_job_script_dir 'slurm' is not an absolute path"),
        (
            {"slurm_torchrun": "torchrun"},
            "slurm_torchrun 'torchrun' is not an absolute path (the PyTorch environment's bin/torchrun)",
        ),
        (
            {"slurm_payload_dir": "payload", "slurm_health_check_zipapp": "/opt/x.pyz"},
            "slurm_payload_dir 'payload' is not an absolute path (where train.py is installed)",
        ),
        ({"slurm_rendezvous_port": 80}, "slurm_rendezvous_port '80' is not an unprivileged TCP port (1024-65535)"),
        ({"slurm_rendezvous_port": "x"}, "slurm_rendezvous_port 'x' is not an unprivileged TCP port (1024-65535)"),
        ({"slurm_job_cpu_nproc_per_node": 0}, "slurm_job_cpu_nproc_per_node '0' is not a process count (1 or more)"),
        ({"slurm_register_timeout": "0"}, "slurm_register_timeout '0' is not a number of seconds (above 0)"),
        (
            {"slurm_health_check_interval": "5m"},
            "slurm_health_check_interval '5m' is not a number of seconds (above 0; 300 checks every 5 minutes)",
        ),
        (
            {"slurm_health_check_timeout": 46},
            "slurm_health_check_timeout '46' must be 1 to 45 seconds: Slurm kills the health check program at 60 s, and"
            " drains and"
            " resumes need the rest",
        ),
        (
            {"slurm_health_check_node_state": ["CYCLE"]},
            "slurm_health_check_node_state '['CYCLE']'"
            " needs a node state (IDLE, ANY, ALLOC, MIXED; CYCLE only beside one)",
        ),
        (
            {"slurm_health_check_node_state": "IDLE,DRAIN"},
            "slurm_health_check_node_state 'IDLE,DRAIN' may hold ALLOC, ANY, CYCLE, IDLE and MIXED only",
        ),
        (
            {"slurm_health_check_zipapp": "check.pyz"},
            "slurm_health_check_zipapp 'check.pyz' is not an absolute path (where gpufleet_check.pyz goes)",
        ),
        (
            {"slurm_health_check_python": "python3"},
            "slurm_health_check_python 'python3' is not an absolute path (the PyTorch environment's bin/python)",
        ),
        (
            {"slurm_health_check_textfile_dir": "metrics"},
            "slurm_health_check_textfile_dir 'metrics' is not an absolute path (empty: no metrics)",
        ),
        (
            {"slurm_extra_config": {"HealthCheckInterval": 60, "MaxJobCount": 100, "HealthCheckProgram": "/x"}},
            "slurm_extra_config sets HealthCheckInterval, HealthCheckProgram, which slurm_health_check writes: set"
            " slurm_health_check: false to use your own health check, or leave them out",
        ),
    ],
)
def test_each_rule_refuses_with_its_message(overrides, message):
    assert refusals(**overrides) == [message]


def test_an_os_without_a_package_layout_is_refused():
    """roles/slurm/vars has no file for this OS: validate.yml's include_vars left __slurm_config_dir undefined."""
    values = {name: value for name, value in BASE.items() if name != "__slurm_config_dir"}
    values["ansible_facts"] = {"distribution": "Rocky", "distribution_version": "9.3"}
    assert rules_case.refusals("slurm", values) == [
        "slurm on gpu-a01: no Slurm package layout for Rocky 9.3 (roles/slurm/vars has Ubuntu and Debian)"
    ]


def test_every_refusal_is_listed_in_order():
    errors = refusals(slurm_cluster_name="A", slurm_rendezvous_port=1, slurm_health_check_timeout=0)
    assert [error.split(" ")[0] for error in errors] == [
        "slurm_cluster_name",
        "slurm_rendezvous_port",
        "slurm_health_check_timeout",
    ]
