"""The slurm role's rules: its OS layout, its host groups, the names, limits, paths and the health check's settings.

Run by roles/slurm/tasks/validate.yml (the action gpufleet.fleet.settings) after it has loaded the OS's
layout (roles/slurm/vars: ``__slurm_config_dir``), before anything changes. It resolves the release the OS ships
(``__slurm_shipped_release``), which the cgroup check compares with where apt knows no slurmd.
"""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import (
    Judgement,
    as_dict,
    as_list,
    matches,
    text,
    to_bool,
    to_int,
)

READS = (
    "slurm_*",
    "groups",
    "ansible_facts.distribution",
    "ansible_facts.distribution_version",
    "__slurm_config_dir",
    "__slurm_release",
    "__slurm_health_check_keys",
)

_TIME_LIMIT = r"^(INFINITE|UNLIMITED|[0-9]+|([0-9]+-)?[0-9]+:[0-9]{2}(:[0-9]{2})?)$"
_NODE_STATES = ("ALLOC", "ANY", "CYCLE", "IDLE", "MIXED")


def absolute(j: Judgement, name: str, what: str) -> None:
    """The setting ``name`` is an absolute path; ``what`` says which (in the message's parentheses)."""
    j.check(matches("^/", j[name]), f"{name} '{text(j[name])}' is not an absolute path{what}")


def judge(j: Judgement) -> None:
    """Refuse an OS without a layout, a controller group without one host, an empty node group, and wrong values."""
    facts = j.get("ansible_facts") or {}
    groups = j.get("groups") or {}
    controllers = list(groups.get(j["slurm_controller_group"]) or [])
    nodes = list(groups.get(j["slurm_node_group"]) or [])
    tasks = as_list(j["slurm_task_plugins"])
    states = [text(state).upper() for state in as_list(j["slurm_health_check_node_state"])]
    j.check(
        "__slurm_config_dir" in j.values,
        f"slurm on {j.host}: no Slurm package layout for {facts.get('distribution', '?')}"
        f" {facts.get('distribution_version', '')} (roles/slurm/vars has Ubuntu and Debian)",
    )
    j.check(
        len(controllers) == 1,
        f"slurm_controller_group '{j['slurm_controller_group']}' has {len(controllers)} host(s)"
        f" ({', '.join(controllers) or 'none'}): Slurm needs exactly one controller host in the inventory",
    )
    j.check(nodes, f"slurm_node_group '{j['slurm_node_group']}' has no host: Slurm needs compute nodes")
    j.check_form("slurm_cluster_name", "^[a-z0-9_-]{1,40}$", "must be 1-40 lowercase letters, digits, - or _")
    j.check_form("slurm_partition_name", "^[A-Za-z0-9_-]{1,64}$", "must be letters, digits, - or _")
    j.check(
        matches(_TIME_LIMIT, j["slurm_partition_max_time"]),
        f"slurm_partition_max_time '{j['slurm_partition_max_time']}' is not a Slurm time limit"
        " (INFINITE, minutes, or [days-]hours:minutes:seconds)",
    )
    gpus = j["slurm_node_gpus"]
    j.check(
        text(gpus) == "" or matches("^[0-9]+$", gpus),
        f"slurm_node_gpus '{text(gpus)}' is not a GPU count (empty: count the GPUs on the PCI bus)",
    )
    j.check(
        matches("^[A-Za-z0-9_.-]*$", j["slurm_gpu_type"]),
        f"slurm_gpu_type '{j['slurm_gpu_type']}' must be letters, digits, '.', - or _ (h100, a100-80gb)",
    )
    j.check(
        to_int(j["slurm_node_memory_reserved_mb"]) >= 0,
        f"slurm_node_memory_reserved_mb '{j['slurm_node_memory_reserved_mb']}' is not a number of MiB (0 or more)",
    )
    j.check(tasks, "slurm_task_plugins is empty: name one or more task plugins (task/cgroup, task/affinity, task/none)")
    j.check(
        "task/cgroup" not in tasks or j["slurm_proctrack_type"] == "proctrack/cgroup",
        "slurm_task_plugins has task/cgroup, which needs slurm_proctrack_type proctrack/cgroup"
        f" (not {j['slurm_proctrack_type']})",
    )
    absolute(j, "slurm_job_script_dir", "")
    absolute(j, "slurm_torchrun", " (the PyTorch environment's bin/torchrun)")
    absolute(j, "slurm_payload_dir", " (where train.py is installed)")
    j.check(
        1024 <= to_int(j["slurm_rendezvous_port"]) <= 65535,
        f"slurm_rendezvous_port '{j['slurm_rendezvous_port']}' is not an unprivileged TCP port (1024-65535)",
    )
    j.check(
        to_int(j["slurm_job_cpu_nproc_per_node"]) > 0,
        f"slurm_job_cpu_nproc_per_node '{j['slurm_job_cpu_nproc_per_node']}' is not a process count (1 or more)",
    )
    j.check(
        to_int(j["slurm_register_timeout"]) > 0,
        f"slurm_register_timeout '{j['slurm_register_timeout']}' is not a number of seconds (above 0)",
    )
    interval = j["slurm_health_check_interval"]
    j.check(
        matches("^[0-9]+$", interval) and to_int(interval) > 0,
        f"slurm_health_check_interval '{interval}' is not a number of seconds (above 0; 300 checks every 5 minutes)",
    )
    timeout = j["slurm_health_check_timeout"]
    j.check(
        matches("^[0-9]+$", timeout) and 1 <= to_int(timeout) <= 45,
        f"slurm_health_check_timeout '{timeout}' must be 1 to 45 seconds: Slurm kills the health check program"
        " at 60 s, and drains and resumes need the rest",
    )
    node_state = j["slurm_health_check_node_state"]
    j.check(
        any(state != "CYCLE" for state in states),
        f"slurm_health_check_node_state '{node_state}' needs a node state (IDLE, ANY, ALLOC, MIXED;"
        " CYCLE only beside one)",
    )
    j.check(
        all(state in _NODE_STATES for state in states),
        f"slurm_health_check_node_state '{node_state}' may hold ALLOC, ANY, CYCLE, IDLE and MIXED only",
    )
    absolute(j, "slurm_health_check_zipapp", " (where gpufleet_check.pyz goes)")
    absolute(j, "slurm_health_check_python", " (the PyTorch environment's bin/python)")
    textfile_dir = j["slurm_health_check_textfile_dir"]
    j.check(
        text(textfile_dir) in ("", "None") or matches("^/", textfile_dir),
        f"slurm_health_check_textfile_dir '{textfile_dir}' is not an absolute path (empty: no metrics)",
    )
    health_keys = j["__slurm_health_check_keys"]
    # In slurm_extra_config's order (Ansible's intersect, in the YAML rule, gave a set's order: a run's string hashes).
    written = [key for key in as_dict(j["slurm_extra_config"]) if key in health_keys]
    j.check(
        not to_bool(j["slurm_health_check"]) or not written,
        f"slurm_extra_config sets {', '.join(written)}, which slurm_health_check writes: set slurm_health_check:"
        " false to use your own health check, or leave them out",
    )
    # The release the OS ships (its layout), for the cgroup check (tasks/cgroup.yml) without the layout loaded again.
    j.set("__slurm_shipped_release", text(j.get("__slurm_release", "")))
