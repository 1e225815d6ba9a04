"""What roles/slurm writes, rendered without a host: slurm.conf, gres.conf,
cgroup.conf and the DDP job script for an 8-GPU cluster on Ubuntu 20.04,
Ubuntu 22.04 and Debian 12, the CPU-only lab, and each validation rule.

The role runs for real (tests/unit/role_run.py) on fake clusters of three GPU
nodes and a controller (one play each, all in one run): its validate.yml on
every host, then cgroup.yml's comparison of each node's cgroup mode with its
Slurm release and configure.yml's tasks that describe the nodes for
slurm.conf (copies of the role's own tasks: their files begin with host
probes, whose registered results are given as host variables, as they are
when every node is in the play: the cgroup filesystem and the node's
`apt-cache policy slurmd`), then the templates, rendered on the controller by
the template lookup. The validation cases run validate.yml on one host of a
cluster whose other hosts are only in the inventory; the cgroup cases run
validate.yml and cgroup.yml's checks on nodes of one cluster."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import role_run
from conftest import FAKE_FACTS, ROLES_DIR, SLURMD_POLICY, host_facts_found, load_trusted

from ansible_collections.gpufleet.fleet.plugins.module_utils import host_facts

ROLE = ROLES_DIR / "slurm"
NODES = ["gpu-a01", "gpu-a02", "gpu-a03"]
CONTROLLER = "head-01"
# configure.yml's probes of nodes outside the play, as registered when every node is in it: nothing probed.
EVERY_NODE_IN_THE_PLAY = {
    "__slurm_other_facts": {"results": [], "skipped": True, "changed": False},
    "__slurm_other_hosts": {"results": [], "skipped": True, "changed": False},
    "__slurm_current_conf": {"skipped": True, "changed": False},
}
# cgroup.yml after its probe (gpufleet.fleet.host_facts: the cgroup file system, apt-cache policy slurmd, the GPUs).
PROBE = role_run.role_task("slurm", "cgroup.yml", "Read this node's cgroup mode")
DESCRIBE = [
    role_run.role_task("slurm", "configure.yml", name)
    for name in (
        "List the nodes outside this run that did not answer",
        "Start the node list for slurm.conf",
        "Describe every node for slurm.conf",
        "Decide whether the cluster confines jobs with cgroups",
    )
]

# The file system of /sys/fs/cgroup as gpufleet.fleet.host_facts reads it (found.cgroup_filesystem, named as
# `stat --file-system --format=%T /sys/fs/cgroup/` names it): cgroup v2 (unified; Ubuntu 22.04's and Debian 12's
# default: https://lists.ubuntu.com/archives/ubuntu-devel/2021-August/041598.html), or the tmpfs of the v1 and hybrid
# layouts (systemd mounts the unified hierarchy on /sys/fs/cgroup "instead of a tmpfs": systemd commit
# efdb02375beb0a940c3320865572913780b4d7de).
CGROUP_V2 = "cgroup2fs"
CGROUP_V1 = "tmpfs"
POLICY = SLURMD_POLICY
# A node's probes as each OS boots by default, Ubuntu 22.04 with cgroup v1 (systemd.unified_cgroup_hierarchy=0, the fix
# the role names): the clusters of the rendering tests, whose files are those of a confined cluster.
BOOTED = {"debian12": CGROUP_V2, "ubuntu2204": CGROUP_V1, "ubuntu2004": CGROUP_V1}
# The Slurm release each OS ships (vars/<OS>.yml's __slurm_release) and the one that brought cgroup/v2 (vars/main.yml):
# what cgroup.yml's probe passes the module (test_the_probe_passes_the_role_s_settings).
SHIPPED = {"debian12": "22.05", "ubuntu2204": "21.08", "ubuntu2004": "19.05"}


def probed(
    os: str, filesystem: str, policy: str, gpus: int = 8, without_plugin: str = "refuse", host: str = ""
) -> dict:
    """gpufleet.fleet.host_facts' registered result on a node of ``os`` (cgroup.yml's probe): its GPUs, and its
    slurm_cgroup as the module compares them (module_utils/host_facts.py slurm_cgroup; the module fails with its
    message, warns with its warning)."""
    settings = {
        "package": "slurmd",
        "shipped_release": SHIPPED[os],
        "cgroup_v2_release": "22.05",
        "without_plugin": without_plugin,
    }
    return {
        **host_facts_found(gpus),
        "slurm_cgroup": host_facts.slurm_cgroup(filesystem, policy, settings, FAKE_FACTS[os], host),
    }


TEMPLATES = [
    "slurm.conf.j2",
    "gres.conf.j2",
    "cgroup.conf.j2",
    "gpufleet-train.sbatch.j2",
    "gpufleet-slurm-health-check.j2",
]


def node_facts(name: str, cpus: int = 128) -> dict:
    return {
        "hostname": name,
        "processor_vcpus": cpus,
        "processor_count": 2,
        "processor_cores": cpus // 4,
        "processor_threads_per_core": 2,
        "memtotal_mb": 2_063_000,
    }


class Clusters:
    """Fake clusters, run together in one run the first time one is read (the whole cluster in a play of its own,
    or its first host alone)."""

    def __init__(self, tasks: list[dict], after: list[dict], whole: bool) -> None:
        self._tasks, self._after, self._whole = tasks, after, whole
        self._pending: dict[str, list[role_run.Host]] = {}
        self._done: dict[str, role_run.Outcome] = {}

    def _hosts(
        self, key: str, os: str, gpus: int, controllers: int, node_vars: dict, settings: dict
    ) -> list[role_run.Host]:
        # The first cluster uses the role's default group names; the others have their own (one inventory).
        n = len(self._pending) + len(self._done)
        prefix, suffix = ("", "") if n == 0 else (f"c{n}-", f"_c{n}")
        groups = {"node": f"gpu_nodes{suffix}", "controller": f"slurm_controller{suffix}"}
        # "booted": the cgroup file system of every node, else the OS's default (BOOTED).
        common = {**{k: v for k, v in settings.items() if k != "booted"}, **EVERY_NODE_IN_THE_PLAY}
        if suffix:
            common.update(slurm_node_group=groups["node"], slurm_controller_group=groups["controller"])
        heads = [CONTROLLER, "head-02"][:controllers]
        hosts = [
            role_run.Host(
                prefix + name, {**FAKE_FACTS[os], **node_facts(name, 16)}, common, (groups["controller"],), key
            )
            for name in heads
        ]
        without_plugin = settings.get("slurm_cgroup_v2_without_plugin", "refuse")
        probe = probed(os, settings.get("booted", BOOTED[os]), POLICY[os], gpus, without_plugin)
        hosts += [
            role_run.Host(
                prefix + name,
                {**FAKE_FACTS[os], **node_facts(name)},
                {
                    **common,
                    "ansible_host": f"10.0.0.{i + 11}",
                    "__slurm_host": probe,
                    **node_vars.get(name, {}),
                },
                (groups["node"],),
                key,
            )
            for i, name in enumerate(NODES)
        ]
        # The whole cluster in a play of its own (run_once), or its first host alone in the one play of the
        # run (the others only in the inventory).
        return [
            h if self._whole else role_run.Host(h.name, h.facts, h.vars, h.groups, "first hosts", targeted=i == 0)
            for i, h in enumerate(hosts)
        ]

    def get(
        self, os: str = "debian12", gpus: int = 8, controllers: int = 1, node_vars: dict | None = None, **settings: Any
    ) -> role_run.Outcome:
        """The outcome on the cluster's first host (its controller), running every pending cluster first."""
        key = repr((os, gpus, controllers, sorted((node_vars or {}).items()), sorted(settings.items())))
        if key not in self._done:
            self.declare(os, gpus, controllers, node_vars, **settings)
            hosts = [h for cluster in self._pending.values() for h in cluster]
            outcomes = role_run.run(hosts, self._tasks, self._after)
            self._done.update({k: outcomes[cluster[0].name] for k, cluster in self._pending.items()})
            self._pending = {}
        return self._done[key]

    def declare(
        self, os: str = "debian12", gpus: int = 8, controllers: int = 1, node_vars: dict | None = None, **settings: Any
    ) -> None:
        key = repr((os, gpus, controllers, sorted((node_vars or {}).items()), sorted(settings.items())))
        if key not in self._done and key not in self._pending:
            self._pending[key] = self._hosts(key, os, gpus, controllers, node_vars or {}, settings)


# validate.yml on every host, the nodes described, the files rendered on the controller.
RENDERED = Clusters(
    [role_run.import_role("slurm"), *DESCRIBE],
    [
        role_run.capture(
            {**{name: role_run.template("slurm", name) for name in TEMPLATES}, **role_run.names("__slurm_config_dir")},
            run_once=True,
            name="Render the Slurm files on the controller",
        )
    ],
    whole=True,
)
# validate.yml on the controller alone.
VALIDATED = Clusters([role_run.import_role("slurm")], [], whole=False)


def cluster(os: str = "debian12", gpus: int | str = 8, **overrides) -> role_run.Outcome:
    """The role on a cluster of NODES + CONTROLLER, as configure.yml leaves it on the controller."""
    cfg = RENDERED.get(os, gpus, **overrides)
    assert cfg.failure is None, cfg.failure
    return cfg


def render(name: str, cfg: role_run.Outcome) -> str:
    return cfg[name]


def conf(text: str) -> list[dict]:
    """slurm.conf/gres.conf lines as dicts of their key=value words."""
    return [
        dict(word.split("=", 1) for word in line.split())
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def rejections(controllers: int = 1, **overrides) -> list[str]:
    """The messages of validate.yml's failed checks on the controller (what it stops with)."""
    cfg = VALIDATED.get(controllers=controllers, **overrides)
    messages = [" ".join(str(m).split()) for m in cfg["__slurm_judged"]["errors"]]
    assert (cfg.failure is not None) is bool(messages), cfg.failure
    return messages


@pytest.mark.parametrize("host", ["ubuntu2004", "ubuntu2204", "debian12"])
def test_slurm_conf_describes_every_node_with_its_gpus(host):
    cfg = cluster(host)
    lines = conf(render("slurm.conf.j2", cfg))
    settings = {
        k: val for line in lines for k, val in line.items() if "NodeName" not in line and "PartitionName" not in line
    }
    # The controller's host name (its facts), then its address: its inventory name, having no ansible_host.
    assert settings["SlurmctldHost"] == f"{CONTROLLER}({cfg.host})"
    assert settings["AuthType"] == "auth/munge" and settings["GresTypes"] == "gpu"
    assert settings["SelectType"] == "select/cons_tres" and settings["ProctrackType"] == "proctrack/cgroup"
    assert settings["TaskPlugin"] == "task/cgroup,task/affinity"
    nodes = [line for line in lines if "NodeName" in line]
    assert [n["NodeName"] for n in nodes] == NODES
    for i, node in enumerate(nodes):
        assert node["NodeAddr"] == f"10.0.0.{i + 11}"
        assert (node["CPUs"], node["Sockets"], node["CoresPerSocket"], node["ThreadsPerCore"]) == (
            "128",
            "2",
            "32",
            "2",
        )
        assert node["RealMemory"] == str(2_063_000 - 2048) and node["Gres"] == "gpu:8"
    (partition,) = [line for line in lines if "PartitionName" in line]
    assert partition == {
        "PartitionName": "gpu",
        "Nodes": ",".join(NODES),
        "Default": "YES",
        "MaxTime": "INFINITE",
        "State": "UP",
    }


def test_gres_conf_lists_device_files_and_type():
    v = cluster(slurm_gpu_type="h100")
    lines = conf(render("gres.conf.j2", v))
    assert lines == [{"NodeName": n, "Name": "gpu", "Type": "h100", "File": "/dev/nvidia[0-7]"} for n in NODES]
    assert conf(render("slurm.conf.j2", v))[-2]["Gres"] == "gpu:h100:8"


def test_one_gpu_and_no_gpu_nodes():
    assert conf(render("gres.conf.j2", cluster(gpus=1)))[0]["File"] == "/dev/nvidia0"
    v = cluster(gpus=0)
    assert conf(render("gres.conf.j2", v)) == []
    assert all("Gres" not in line for line in conf(render("slurm.conf.j2", v)))
    assert "#SBATCH --gpus-per-node" not in render("gpufleet-train.sbatch.j2", v)


# A host variable of the second node (the PCI count of every node is 8).
FOUR_ON_THE_SECOND = {NODES[1]: {"slurm_node_gpus": "4"}}


def test_per_host_gpu_override_wins_over_the_pci_count():
    v = cluster(gpus=8, node_vars=FOUR_ON_THE_SECOND)
    assert [n["gpus"] for n in v["__slurm_nodes"]] == [8, 4, 8]
    script = render("gpufleet-train.sbatch.j2", v)
    assert "#SBATCH --gpus-per-node=4" in script  # the smallest node decides the default


@pytest.mark.parametrize(
    "host, plugin_line",
    [
        ("ubuntu2004", "CgroupAutomount=yes"),
        ("ubuntu2204", "CgroupPlugin=autodetect"),
        ("debian12", "CgroupPlugin=autodetect"),
    ],
)
def test_cgroup_conf_confines_devices(host, plugin_line):
    text = render("cgroup.conf.j2", cluster(host))
    assert plugin_line in text.splitlines()
    assert {"ConstrainDevices=yes", "ConstrainCores=yes", "ConstrainRAMSpace=yes"} <= set(text.splitlines())


def test_config_dir_follows_the_release():
    assert cluster("ubuntu2004")["__slurm_config_dir"] == "/etc/slurm-llnl"
    assert cluster("ubuntu2204")["__slurm_config_dir"] == cluster("debian12")["__slurm_config_dir"] == "/etc/slurm"


EXTRA_CONFIG = {"slurm_extra_config": {"DefMemPerGPU": 64000, "MaxJobCount": 20000}}


def test_extra_config_lines():
    lines = conf(render("slurm.conf.j2", cluster(**EXTRA_CONFIG)))
    flat = {k: val for line in lines for k, val in line.items()}
    assert flat["DefMemPerGPU"] == "64000" and flat["MaxJobCount"] == "20000"


def test_job_script_runs_one_torchrun_per_node_with_rendezvous_on_the_first():
    script = render("gpufleet-train.sbatch.j2", cluster())
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gpus-per-node=8" in script
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    assert re.search(r'exec srun "\$\{step\[@\]\}" \\\n  /opt/gpufleet/venv/bin/torchrun', script)
    assert '--rdzv-endpoint="$head_node:29500"' in script and "--rdzv-backend=c10d" in script
    assert '/opt/gpufleet/payload/train.py "$@"' in script
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


# --------------------------------------------------------------------------- the health check

# slurm.conf(5) of Slurm 19.05.5, 21.08.5 and 22.05.8 (Ubuntu 20.04, 22.04, Debian 12) has HealthCheckProgram,
# HealthCheckInterval ("The interval in seconds between executions of HealthCheckProgram") and HealthCheckNodeState
# (ALLOC, ANY, CYCLE, IDLE, MIXED): https://github.com/SchedMD/slurm/blob/slurm-19-05-5-1/doc/man/man5/slurm.conf.5,
# .../slurm-21-08-5-1/..., .../slurm-22-05-8-1/doc/man/man5/slurm.conf.5. The program is named by its path alone:
# slurmd runs it without arguments (src/slurmd/slurmd/slurmd.c, run_script_health_check), so the settings travel in
# the wrapper the role writes.
HEALTH_PROGRAM = "/usr/local/sbin/gpufleet-slurm-health-check"


@pytest.mark.parametrize("host", ["ubuntu2004", "ubuntu2204", "debian12"])
def test_slurm_conf_runs_gpufleet_s_health_check(host):
    flat = {k: val for line in conf(render("slurm.conf.j2", cluster(host))) for k, val in line.items()}
    assert (flat["HealthCheckProgram"], flat["HealthCheckInterval"], flat["HealthCheckNodeState"]) == (
        HEALTH_PROGRAM,
        "300",
        "IDLE",
    )


def test_health_check_settings_and_off():
    text = render(
        "slurm.conf.j2", cluster(slurm_health_check_interval=10, slurm_health_check_node_state=["IDLE", "CYCLE"])
    )
    flat = {k: val for line in conf(text) for k, val in line.items()}
    assert (flat["HealthCheckInterval"], flat["HealthCheckNodeState"]) == ("10", "IDLE,CYCLE")
    assert "HealthCheck" not in render("slurm.conf.j2", cluster(slurm_health_check=False))


def test_health_check_wrapper_passes_the_settings_to_the_program():
    script = render("gpufleet-slurm-health-check.j2", cluster())
    assert script.startswith("#!/bin/sh\n")
    command = " ".join(line.rstrip("\\").strip() for line in script.splitlines() if not line.startswith("#"))
    assert command == (
        "exec /usr/bin/python3 /usr/local/lib/gpufleet/gpufleet_slurm_health.py"
        " --zipapp /opt/gpufleet/payload/gpufleet_check.pyz --python /opt/gpufleet/venv/bin/python --timeout 40"
        " --textfile-dir /var/lib/prometheus/node-exporter"
        " -- --quick --dcgm-level 0 --module-version-file /sys/module/nvidia/version --require-gpus"
    ), command
    lab = render(
        "gpufleet-slurm-health-check.j2",
        cluster(
            slurm_health_check_require_gpus=False,
            slurm_health_check_skip=["torch_cuda", "libraries"],
            nvidia_driver_module_version_file="/run/gpufleet-lab/nvidia-module-version",
            slurm_health_check_args=["--expect-gpus", 8, "--xid-drain", "48,79"],
            slurm_health_check_textfile_dir="",
        ),
    )
    assert lab.rstrip().endswith(
        "--textfile-dir '' \\\n  -- --quick --dcgm-level 0 --module-version-file "
        "/run/gpufleet-lab/nvidia-module-version --skip=torch_cuda --skip=libraries --expect-gpus 8 "
        "--xid-drain 48,79"
    ), lab
    if shutil.which("sh"):
        subprocess.run(["sh", "-n"], input=script, text=True, check=True)


BAD_SETTINGS = [
    ({"slurm_cluster_name": "GPU Fleet"}, "slurm_cluster_name"),
    ({"slurm_partition_name": "gpu nodes"}, "slurm_partition_name"),
    ({"slurm_partition_max_time": "forever"}, "slurm_partition_max_time"),
    ({"slurm_node_gpus": "-1"}, "slurm_node_gpus"),
    ({"slurm_gpu_type": "h100 sxm"}, "slurm_gpu_type"),
    ({"slurm_proctrack_type": "proctrack/linuxproc"}, "slurm_task_plugins"),  # task/cgroup without proctrack/cgroup
    ({"slurm_torchrun": "torchrun"}, "slurm_torchrun"),
    ({"slurm_rendezvous_port": 80}, "slurm_rendezvous_port"),
    ({"slurm_job_cpu_nproc_per_node": 0}, "slurm_job_cpu_nproc_per_node"),
    ({"slurm_register_timeout": "soon"}, "slurm_register_timeout"),
    ({"slurm_health_check_interval": 0}, "slurm_health_check_interval"),
    ({"slurm_health_check_interval": "5m"}, "slurm_health_check_interval"),
    ({"slurm_health_check_timeout": 60}, "slurm_health_check_timeout"),  # Slurm kills the program at 60 s
    ({"slurm_health_check_timeout": 0}, "slurm_health_check_timeout"),
    ({"slurm_health_check_node_state": ["CYCLE"]}, "slurm_health_check_node_state"),
    ({"slurm_health_check_node_state": []}, "slurm_health_check_node_state"),
    ({"slurm_health_check_node_state": ["IDLE", "DRAINED"]}, "slurm_health_check_node_state"),
    ({"slurm_health_check_zipapp": "gpufleet_check.pyz"}, "slurm_health_check_zipapp"),
    ({"slurm_health_check_python": "python3"}, "slurm_health_check_python"),
    ({"slurm_health_check_textfile_dir": "node-exporter"}, "slurm_health_check_textfile_dir"),
    ({"slurm_extra_config": {"HealthCheckProgram": "/usr/sbin/nhc"}}, "slurm_extra_config"),
    ({"controllers": 0}, "slurm_controller_group"),  # no host in the controller group
    ({"controllers": 2}, "slurm_controller_group"),
]


@pytest.mark.parametrize("overrides, variable", BAD_SETTINGS)
def test_each_bad_setting_is_rejected_naming_the_variable(overrides, variable):
    found = rejections(**overrides)
    assert len(found) == 1 and found[0].startswith(variable), found


def test_defaults_pass_validation():
    assert rejections() == []
    # Without gpufleet's health check, a site's own (NHC) through slurm_extra_config.
    assert rejections(slurm_health_check=False, slurm_extra_config={"HealthCheckProgram": "/usr/sbin/nhc"}) == []
    assert rejections(slurm_health_check_node_state=["CYCLE", "IDLE"], slurm_health_check_textfile_dir="") == []
    assert rejections(slurm_proctrack_type="proctrack/linuxproc", slurm_task_plugins=["task/affinity"]) == []


# --------------------------------------------------------------------------- cgroup mode against the Slurm release

# Slurm 22.05 brought the cgroup/v2 plugin: "Added support for Cgroup Version 2." (HIGHLIGHTS of
# https://github.com/SchedMD/slurm/blob/slurm-22-05-0-1/RELEASE_NOTES); 21.08.5 has src/plugins/cgroup/v1 only
# (https://github.com/SchedMD/slurm/tree/slurm-21-08-5-1/src/plugins/cgroup), and its slurmd loads a cgroup plugin at
# every start, autodetect choosing cgroup/v2 on cgroup2fs (src/slurmd/slurmd/slurmd.c, src/common/cgroup.c at
# slurm-21-08-5-1): "cannot find cgroup plugin for cgroup/v2". Debian 12 ships cgroup_v2.so
# (https://packages.debian.org/bookworm/amd64/slurm-wlm-basic-plugins/filelist).
NODE_CASES = {
    "jammy-v2": ("ubuntu2204", CGROUP_V2, POLICY["ubuntu2204"], {}),
    "jammy-v2-no-index": ("ubuntu2204", CGROUP_V2, "", {}),  # apt has no list yet: the release Ubuntu 22.04 ships
    "jammy-v1": ("ubuntu2204", CGROUP_V1, POLICY["ubuntu2204"], {}),
    "jammy-v2-unconfined": (
        "ubuntu2204",
        CGROUP_V2,
        POLICY["ubuntu2204"],
        {"slurm_cgroup_v2_without_plugin": "no_confinement"},
    ),
    "bookworm-v2": ("debian12", CGROUP_V2, POLICY["debian12"], {}),
    "focal-v1": ("ubuntu2004", CGROUP_V1, POLICY["ubuntu2004"], {}),
    "focal-v2": ("ubuntu2004", CGROUP_V2, POLICY["ubuntu2004"], {}),
}


@functools.cache
def node_checks() -> dict[str, role_run.Outcome]:
    """validate.yml on one node per case, in one play, and what cgroup.yml's probe task would pass the module
    (captured as "probe"); the controller only in the inventory."""
    controller = role_run.Host(
        CONTROLLER, {**FAKE_FACTS["debian12"], **node_facts(CONTROLLER, 16)}, {}, ("slurm_controller",), targeted=False
    )
    nodes = [
        role_run.Host(case, {**FAKE_FACTS[os], **node_facts(case)}, settings, ("gpu_nodes",))
        for case, (os, _fs, _policy, settings) in NODE_CASES.items()
    ]
    arguments = role_run.capture({"probe": PROBE["gpufleet.fleet.host_facts"]}, name="Capture the probe's arguments")
    return role_run.run([controller, *nodes], [role_run.import_role("slurm")], [arguments])


def node_check(case: str) -> role_run.Outcome:
    return node_checks()[case]


def compared(case: str) -> dict:
    """The module's comparison on the node of ``case`` (its settings as validate.yml leaves them)."""
    os, filesystem, policy, settings = NODE_CASES[case]
    without_plugin = settings.get("slurm_cgroup_v2_without_plugin", "refuse")
    return probed(os, filesystem, policy, without_plugin=without_plugin, host=case)["slurm_cgroup"]


def test_cgroup_v2_with_slurm_21_08_is_refused_with_the_fix():
    cgroup = compared("jammy-v2")
    assert cgroup["warning"] == ""
    message = " ".join(cgroup["message"].split())
    assert message.startswith("slurm on jammy-v2: this node boots with cgroup v2 (/sys/fs/cgroup is cgroup2fs)"), (
        message
    )
    assert "its Slurm is 21.08 (apt candidate slurmd 21.08.5-2ubuntu1)" in message
    assert "it came with Slurm 22.05" in message
    assert "add systemd.unified_cgroup_hierarchy=0 to GRUB_CMDLINE_LINUX" in message
    assert "set slurm_cgroup_v2_without_plugin: no_confinement" in message
    assert "not confined to their GPUs" in message


def test_without_a_package_list_the_release_the_os_ships_counts():
    message = " ".join(compared("jammy-v2-no-index")["message"].split())
    assert "its Slurm is 21.08 (the release Ubuntu 22.04 ships)" in message, message


def test_slurm_19_05_on_cgroup_v2_is_refused_too():
    message = " ".join(compared("focal-v2")["message"].split())
    assert "its Slurm is 19.05 (installed slurmd 19.05.5-1)" in message, message


@pytest.mark.parametrize(
    "case, release, v2", [("jammy-v1", "21.08", False), ("bookworm-v2", "22.05", True), ("focal-v1", "19.05", False)]
)
def test_a_cgroup_mode_the_release_has_a_plugin_for_passes(case, release, v2):
    assert node_check(case).failure is None
    cgroup = compared(case)
    assert (cgroup["release"], cgroup["v2"], cgroup["plugin_missing"], cgroup["unconfined"]) == (
        release,
        v2,
        False,
        False,
    )
    assert cgroup["message"] == cgroup["warning"] == ""


@pytest.mark.parametrize("case, os", [("jammy-v2-unconfined", "ubuntu2204"), ("bookworm-v2", "debian12")])
def test_the_probe_passes_the_role_s_settings(case, os):
    """What cgroup.yml's host_facts task passes on a node: the settings probed() compares with (SHIPPED)."""
    arguments = node_check(case)["probe"]
    assert arguments == {
        "facts": {
            "distribution": FAKE_FACTS[os]["distribution"],
            "distribution_version": FAKE_FACTS[os]["distribution_version"],
        },
        "slurm": {
            "package": "slurmd",
            "shipped_release": SHIPPED[os],
            "cgroup_v2_release": "22.05",
            "without_plugin": NODE_CASES[case][3].get("slurm_cgroup_v2_without_plugin", "refuse"),
        },
        "host": case,
    }, arguments


def test_no_confinement_lets_the_node_pass_unconfined_with_a_warning():
    assert node_check("jammy-v2-unconfined").failure is None
    cgroup = compared("jammy-v2-unconfined")
    assert cgroup["plugin_missing"] is True and cgroup["unconfined"] is True and cgroup["message"] == ""
    warning = " ".join(cgroup["warning"].split())
    assert warning.startswith("slurm on jammy-v2-unconfined: cgroup v2 and Slurm 21.08 (apt candidate slurmd ")
    assert "the cluster runs without cgroups (proctrack/linuxproc, no task/cgroup)" in warning


# The comparison itself (module_utils/host_facts.py slurm_cgroup, run by gpufleet.fleet.host_facts on the node),
# on apt's answers (tests/unit/data/apt/policy-slurmd-*.txt: Debian 12's captured; Ubuntu's edited from it, each
# file says how).
def _compared(os: str, filesystem: str, policy: str, without_plugin: str = "refuse") -> tuple:
    c = probed(os, filesystem, policy, without_plugin=without_plugin)["slurm_cgroup"]
    assert c["filesystem"] == filesystem and c["v2"] is (filesystem == "cgroup2fs"), c
    return c["release"], c["version_from"], c["plugin_missing"], c["unconfined"]


JAMMY = ("21.08", "apt candidate slurmd 21.08.5-2ubuntu1")
BOOKWORM = ("22.05", "apt candidate slurmd 22.05.8-4+deb12u3")
FOCAL = ("19.05", "installed slurmd 19.05.5-1")
# Ubuntu 20.04's installed 19.05 under bookworm's candidate: the installed one counts (apt state=present keeps it).
FOCAL_UNDER_BOOKWORM = POLICY["ubuntu2004"].replace("Candidate: 19.05.5-1", "Candidate: 22.05.8-4+deb12u3")
assert "Candidate: 22.05.8-4+deb12u3" in FOCAL_UNDER_BOOKWORM


@pytest.mark.parametrize(
    "os, filesystem, policy, without_plugin, expected",
    [
        ("ubuntu2204", CGROUP_V2, POLICY["ubuntu2204"], "refuse", (*JAMMY, True, False)),
        ("ubuntu2204", CGROUP_V2, POLICY["ubuntu2204"], "no_confinement", (*JAMMY, True, True)),
        ("ubuntu2204", CGROUP_V1, POLICY["ubuntu2204"], "no_confinement", (*JAMMY, False, False)),
        ("ubuntu2204", CGROUP_V2, "", "refuse", ("21.08", "the release Ubuntu 22.04 ships", True, False)),
        ("debian12", CGROUP_V2, POLICY["debian12"], "no_confinement", (*BOOKWORM, False, False)),
        ("ubuntu2004", CGROUP_V2, POLICY["ubuntu2004"], "refuse", (*FOCAL, True, False)),
        ("ubuntu2004", CGROUP_V1, POLICY["ubuntu2004"], "refuse", (*FOCAL, False, False)),
        # Bookworm's slurmd offered on Ubuntu 22.04 (a backport counts as what it is): its release, not the OS's.
        ("ubuntu2204", CGROUP_V2, POLICY["debian12"], "refuse", (*BOOKWORM, False, False)),
        ("debian12", CGROUP_V2, FOCAL_UNDER_BOOKWORM, "refuse", (*FOCAL, True, False)),
    ],
)
def test_the_comparison_on_apt_s_answers(os, filesystem, policy, without_plugin, expected):
    assert _compared(os, filesystem, policy, without_plugin) == expected


def test_releases_compare_as_numbers():
    """9.10 is older than 22.05, 100.0 newer (a text comparison would say the opposite of both)."""
    settings = {"package": "slurmd", "cgroup_v2_release": "22.05", "without_plugin": "refuse"}
    facts = FAKE_FACTS["debian12"]
    assert host_facts.slurm_cgroup(CGROUP_V2, "", {**settings, "shipped_release": "9.10"}, facts)["plugin_missing"]
    assert not host_facts.slurm_cgroup(CGROUP_V2, "", {**settings, "shipped_release": "100.0"}, facts)["plugin_missing"]
    assert not host_facts.slurm_cgroup(CGROUP_V2, "", {**settings, "shipped_release": "22.05"}, facts)["plugin_missing"]


# /proc/self/mountinfo of a node with the hybrid layout (systemd's legacy hierarchy: a tmpfs with v1 controllers and
# cgroup2 under unified; captured on this project's build machine), of one booted with cgroup v2 (systemd's default
# since v247, Debian 12 and Ubuntu 22.04: cgroup2 on /sys/fs/cgroup), and of a container whose /sys/fs/cgroup is no
# mount of its own.
HYBRID = """23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED = """22 28 0:20 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""
NO_MOUNT = """1 0 0:50 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
60 1 0:55 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
"""


@pytest.mark.parametrize(
    "mountinfo, expected",
    [
        (HYBRID, "tmpfs"),
        (UNIFIED, "cgroup2fs"),
        (NO_MOUNT, "sysfs"),
        # A second mount on the same point hides the first.
        (UNIFIED + "90 26 0:60 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", "tmpfs"),
    ],
)
def test_the_cgroup_file_system_is_read_from_the_mount_table(tmp_path, mountinfo, expected):
    (tmp_path / "mountinfo").write_text(mountinfo)
    assert host_facts.cgroup_filesystem(str(tmp_path / "mountinfo")) == expected


def test_an_unreadable_mount_table_reads_as_no_file_system(tmp_path):
    assert host_facts.cgroup_filesystem(str(tmp_path / "absent")) == ""


def test_the_cgroup_file_system_is_named_as_stat_names_it():
    """On this machine: the mount table's answer is stat's (the command cgroup.yml ran before)."""
    if not (shutil.which("stat") and Path("/sys/fs/cgroup").is_dir()):
        pytest.skip("no stat or no /sys/fs/cgroup here")
    stat = subprocess.run(
        ["stat", "--file-system", "--format=%T", "/sys/fs/cgroup/"], capture_output=True, text=True, check=True
    )
    assert host_facts.cgroup_filesystem() == stat.stdout.strip()


UNCONFINED = {"slurm_cgroup_v2_without_plugin": "no_confinement", "booted": CGROUP_V2}


def test_no_confinement_writes_a_configuration_without_cgroup_plugins():
    cfg = cluster("ubuntu2204", **UNCONFINED)
    settings = {k: val for line in conf(render("slurm.conf.j2", cfg)) for k, val in line.items()}
    assert settings["ProctrackType"] == "proctrack/linuxproc" and settings["TaskPlugin"] == "task/affinity"
    prefix = cfg.host[: -len(CONTROLLER)]  # the cluster's inventory names
    for name in ("slurm.conf.j2", "cgroup.conf.j2"):
        comments = " ".join(line[2:] for line in render(name, cfg).splitlines() if line.startswith("# "))
        assert f"node(s) {', '.join(prefix + n for n in NODES)} boot with cgroup v2" in comments, comments
    lines = [line for line in render("cgroup.conf.j2", cfg).splitlines() if line and not line.startswith("#")]
    # Slurm 21.08's slurmd loads cgroup/v1 on a cgroup v2 node as long as no plugin uses it; autodetect would stop it.
    assert lines == ["CgroupPlugin=cgroup/v1", "ConstrainDevices=no", "ConstrainCores=no", "ConstrainRAMSpace=no"]


def test_no_confinement_keeps_task_none_where_only_task_cgroup_was_set():
    cfg = cluster("ubuntu2204", slurm_task_plugins=["task/cgroup"], **UNCONFINED)
    settings = {k: val for line in conf(render("slurm.conf.j2", cfg)) for k, val in line.items()}
    assert (settings["ProctrackType"], settings["TaskPlugin"]) == ("proctrack/linuxproc", "task/none")


def test_no_confinement_changes_nothing_where_the_plugin_exists():
    """Debian 12 on cgroup v2 (Slurm 22.05): the setting does not matter, the cluster stays confined."""
    cfg = cluster("debian12", **UNCONFINED)
    settings = {k: val for line in conf(render("slurm.conf.j2", cfg)) for k, val in line.items()}
    assert (settings["ProctrackType"], settings["TaskPlugin"]) == ("proctrack/cgroup", "task/cgroup,task/affinity")
    assert "CgroupPlugin=autodetect" in render("cgroup.conf.j2", cfg).splitlines()
    assert render("cgroup.conf.j2", cfg) == render("cgroup.conf.j2", cluster("debian12"))


def test_unregistered_state_pattern():
    pattern = re.compile(load_trusted(ROLE / "vars" / "main.yml")["__slurm_unregistered_state"])
    bad = [
        "n1|down*|Not responding",
        "n1|unk|none",
        "n1|idle*|none",
        "n1|down|Low RealMemory",
        "n1|fail|x",
        "n1|inval|bad",
    ]
    good = ["n1|idle|none", "n1|alloc|none", "n1|drain|gpufleet driver upgrade", "n1|drng|gpufleet", "n1|mix|none"]
    assert all(pattern.search(line) for line in bad)
    assert not any(pattern.search(line) for line in good)


# --------------------------------------------------------------------------- the clusters, known up front: two runs

for _os in ("debian12", "ubuntu2004", "ubuntu2204"):
    RENDERED.declare(_os)
for _gpus in (1, 0):
    RENDERED.declare(gpus=_gpus)
RENDERED.declare(slurm_gpu_type="h100")
RENDERED.declare(node_vars=FOUR_ON_THE_SECOND)
RENDERED.declare(**EXTRA_CONFIG)
RENDERED.declare("ubuntu2204", **UNCONFINED)
RENDERED.declare("ubuntu2204", slurm_task_plugins=["task/cgroup"], **UNCONFINED)
RENDERED.declare("debian12", **UNCONFINED)
for _overrides, _ in [
    ({}, None),
    ({"slurm_proctrack_type": "proctrack/linuxproc", "slurm_task_plugins": ["task/affinity"]}, None),
    *BAD_SETTINGS,
]:
    VALIDATED.declare(**_overrides)


def test_nodes_outside_the_run_are_described_from_their_registered_facts_when_one_did_not_answer():
    """A run limited to the controller: the nodes' facts are gathered delegated, and one node does not answer.
    Ansible then keeps none of the task's delegated facts (the task's result is unreachable), so the nodes are
    described from the registered results, and the silent node keeps its line (issue 16, item 14: found by the
    e2e run limited to the head, one node and two unreachable ones)."""
    ghost = "gpu-ghost"
    # As setup registers them: each fact named ansible_<fact>.
    registered = {
        "results": [
            {
                "item": name,
                "ansible_facts": {
                    f"ansible_{key}": value for key, value in {**FAKE_FACTS["debian12"], **node_facts(name)}.items()
                },
            }
            for name in NODES
        ]
        + [{"item": ghost, "unreachable": True, "msg": "No route to host"}],
        "changed": False,
    }
    controller = role_run.Host(
        CONTROLLER,
        {**FAKE_FACTS["debian12"], **node_facts(CONTROLLER, 16)},
        {
            "__slurm_other_facts": registered,
            "__slurm_other_hosts": {"results": [{"item": name, **host_facts_found(8)} for name in NODES]},
            "__slurm_current_conf": {"skipped": True, "changed": False},
        },
        ("slurm_controller",),
        play="limited",
    )
    # What hostvars holds for them: no facts of this run (a stale host name shows if they were read).
    nodes = [
        role_run.Host(
            name,
            {**FAKE_FACTS["debian12"], **node_facts("stale-" + name)},
            {
                "ansible_host": f"10.0.0.{i + 11}",
                "__slurm_host": probed("debian12", CGROUP_V1, POLICY["debian12"]),
            },
            ("gpu_nodes",),
            targeted=False,
        )
        for i, name in enumerate(NODES)
    ]
    silent = role_run.Host(ghost, FAKE_FACTS["debian12"], {"ansible_host": "10.0.0.99"}, ("gpu_nodes",), targeted=False)
    outcome = role_run.run(
        [controller, *nodes, silent],
        [role_run.import_role("slurm"), *DESCRIBE],
        [
            role_run.capture(
                {"slurm.conf.j2": role_run.template("slurm", "slurm.conf.j2"), **role_run.names("__slurm_silent")}
            )
        ],
    )[CONTROLLER]
    assert outcome.failure is None, outcome.failure
    assert outcome["__slurm_silent"] == [ghost]
    described = [line for line in conf(outcome["slurm.conf.j2"]) if "NodeName" in line]
    assert [line["NodeName"] for line in described] == NODES
    assert all(line["CPUs"] == "128" and line["Gres"] == "gpu:8" for line in described)
