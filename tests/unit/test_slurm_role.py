"""What roles/slurm writes, rendered without a host: slurm.conf, gres.conf,
cgroup.conf and the DDP job script for an 8-GPU cluster on Ubuntu 20.04,
Ubuntu 22.04 and Debian 12, the CPU-only lab, and each validation rule.

The templates and the validation expressions are the role's own files,
evaluated with ansible-core's Templar (as tests/unit/conftest.py does for the
driver role)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from ansible.template import Templar

from conftest import ANSIBLE_MANAGED, FAKE_FACTS, ROLES_DIR, _loader, load_trusted, render_role_template

ROLE = ROLES_DIR / "slurm"
NODES = ["gpu-a01", "gpu-a02", "gpu-a03"]
CONTROLLER = "head-01"


def node_facts(name: str, cpus: int = 128) -> dict:
    return {"hostname": name, "processor_vcpus": cpus, "processor_count": 2, "processor_cores": cpus // 4,
            "processor_threads_per_core": 2, "memtotal_mb": 2_063_000}


def variables(host: str = "debian12", gpus: int | str = 8, **overrides) -> dict:
    """The role's variables on a cluster of NODES + CONTROLLER, as configure.yml leaves them."""
    facts = FAKE_FACTS[host]
    v: dict = {}
    v.update(load_trusted(ROLE / "defaults" / "main.yml"))
    v.update(load_trusted(ROLE / "vars" / "main.yml"))
    layout = {"ubuntu2004": "Ubuntu-20.yml", "ubuntu2204": "Ubuntu.yml", "debian12": "Debian.yml"}[host]
    v.update(load_trusted(ROLE / "vars" / layout))
    hostvars = {name: {"ansible_facts": {**facts, **node_facts(name)}, "ansible_host": f"10.0.0.{i + 11}"}
                for i, name in enumerate(NODES)}
    hostvars[CONTROLLER] = {"ansible_facts": {**facts, **node_facts(CONTROLLER, 16)}}
    v.update(ansible_facts=dict(facts), inventory_hostname=CONTROLLER, ansible_managed=ANSIBLE_MANAGED,
             role_path=str(ROLE), groups={"slurm_controller": [CONTROLLER], "gpu_nodes": list(NODES), "all": NODES + [CONTROLLER]},
             hostvars=hostvars)
    v.update(overrides)
    v["__slurm_nodes"] = describe_nodes(v, gpus)
    return v


def describe_nodes(v: dict, gpus) -> list:
    """configure.yml's "Describe every node" loop, evaluated with the role's own expressions."""
    task = next(t for t in load_trusted(ROLE / "tasks" / "configure.yml") if t.get("name") == "Describe every node for slurm.conf")
    nodes = []
    for host in v["groups"][v["slurm_node_group"]]:
        local = dict(v, __host=host, __slurm_pci_gpus={"stdout": str(gpus)}, __slurm_other_gpus={"results": []})
        local["hostvars"] = {**v["hostvars"], host: {**v["hostvars"][host], "__slurm_pci_gpus": {"stdout": str(gpus)}}}
        scoped = Templar(loader=_loader, variables={**local, **task["vars"]})
        nodes.append(scoped.template(task["vars"]["__node"]))
    return nodes


def render(name: str, v: dict) -> str:
    return render_role_template(ROLE, name, v)


def conf(text: str) -> list[dict]:
    """slurm.conf/gres.conf lines as dicts of their key=value words."""
    return [dict(word.split("=", 1) for word in line.split()) for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


def rejections(**overrides) -> list[str]:
    v = variables(**overrides)
    task = next(t for t in load_trusted(ROLE / "tasks" / "validate.yml") if t.get("name") == "List the Slurm settings that are wrong")
    templar = Templar(loader=_loader, variables={**v, **task["vars"]})
    return [str(c["msg"]).strip() for c in templar.template(task["vars"]["__slurm_checks"]) if not c["ok"]]


@pytest.mark.parametrize("host", ["ubuntu2004", "ubuntu2204", "debian12"])
def test_slurm_conf_describes_every_node_with_its_gpus(host):
    lines = conf(render("slurm.conf.j2", variables(host)))
    settings = {k: val for line in lines for k, val in line.items() if "NodeName" not in line and "PartitionName" not in line}
    assert settings["SlurmctldHost"] == f"{CONTROLLER}({CONTROLLER})"
    assert settings["AuthType"] == "auth/munge" and settings["GresTypes"] == "gpu"
    assert settings["SelectType"] == "select/cons_tres" and settings["ProctrackType"] == "proctrack/cgroup"
    assert settings["TaskPlugin"] == "task/cgroup,task/affinity"
    nodes = [line for line in lines if "NodeName" in line]
    assert [n["NodeName"] for n in nodes] == NODES
    for i, node in enumerate(nodes):
        assert node["NodeAddr"] == f"10.0.0.{i + 11}"
        assert (node["CPUs"], node["Sockets"], node["CoresPerSocket"], node["ThreadsPerCore"]) == ("128", "2", "32", "2")
        assert node["RealMemory"] == str(2_063_000 - 2048) and node["Gres"] == "gpu:8"
    (partition,) = [line for line in lines if "PartitionName" in line]
    assert partition == {"PartitionName": "gpu", "Nodes": ",".join(NODES), "Default": "YES", "MaxTime": "INFINITE", "State": "UP"}


def test_gres_conf_lists_device_files_and_type():
    v = variables(slurm_gpu_type="h100")
    lines = conf(render("gres.conf.j2", v))
    assert lines == [{"NodeName": n, "Name": "gpu", "Type": "h100", "File": "/dev/nvidia[0-7]"} for n in NODES]
    assert conf(render("slurm.conf.j2", v))[-2]["Gres"] == "gpu:h100:8"


def test_one_gpu_and_no_gpu_nodes():
    assert conf(render("gres.conf.j2", variables(gpus=1)))[0]["File"] == "/dev/nvidia0"
    v = variables(gpus=0)
    assert conf(render("gres.conf.j2", v)) == []
    assert all("Gres" not in line for line in conf(render("slurm.conf.j2", v)))
    assert "#SBATCH --gpus-per-node" not in render("gpufleet-train.sbatch.j2", v)


def test_per_host_gpu_override_wins_over_the_pci_count():
    v = variables(gpus=8)
    v["hostvars"][NODES[1]]["slurm_node_gpus"] = "4"
    v["__slurm_nodes"] = describe_nodes(v, 8)
    assert [n["gpus"] for n in v["__slurm_nodes"]] == [8, 4, 8]
    script = render("gpufleet-train.sbatch.j2", v)
    assert "#SBATCH --gpus-per-node=4" in script  # the smallest node decides the default


@pytest.mark.parametrize("host, plugin_line", [("ubuntu2004", "CgroupAutomount=yes"), ("ubuntu2204", "CgroupPlugin=autodetect"),
                                               ("debian12", "CgroupPlugin=autodetect")])
def test_cgroup_conf_confines_devices(host, plugin_line):
    text = render("cgroup.conf.j2", variables(host))
    assert plugin_line in text.splitlines()
    assert {"ConstrainDevices=yes", "ConstrainCores=yes", "ConstrainRAMSpace=yes"} <= set(text.splitlines())


def test_config_dir_follows_the_release():
    assert variables("ubuntu2004")["__slurm_config_dir"] == "/etc/slurm-llnl"
    assert variables("ubuntu2204")["__slurm_config_dir"] == variables("debian12")["__slurm_config_dir"] == "/etc/slurm"


def test_extra_config_lines():
    lines = conf(render("slurm.conf.j2", variables(slurm_extra_config={"DefMemPerGPU": 64000, "MaxJobCount": 20000})))
    flat = {k: val for line in lines for k, val in line.items()}
    assert flat["DefMemPerGPU"] == "64000" and flat["MaxJobCount"] == "20000"


def test_job_script_runs_one_torchrun_per_node_with_rendezvous_on_the_first():
    script = render("gpufleet-train.sbatch.j2", variables())
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gpus-per-node=8" in script
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    assert re.search(r'exec srun "\$\{step\[@\]\}" \\\n  /opt/gpufleet/venv/bin/torchrun', script)
    assert '--rdzv-endpoint="$head_node:29500"' in script and '--rdzv-backend=c10d' in script
    assert '/opt/gpufleet/payload/train.py "$@"' in script
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.parametrize("overrides, variable", [
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
    ({"groups": {"slurm_controller": [], "gpu_nodes": NODES}}, "slurm_controller_group"),
    ({"groups": {"slurm_controller": ["a", "b"], "gpu_nodes": NODES}}, "slurm_controller_group"),
])
def test_each_bad_setting_is_rejected_naming_the_variable(overrides, variable):
    groups = overrides.pop("groups", None)
    if groups:
        v = variables()
        v["groups"] = groups
        task = next(t for t in load_trusted(ROLE / "tasks" / "validate.yml") if t.get("name") == "List the Slurm settings that are wrong")
        templar = Templar(loader=_loader, variables={**v, **task["vars"]})
        found = [str(c["msg"]).strip() for c in templar.template(task["vars"]["__slurm_checks"]) if not c["ok"]]
    else:
        found = rejections(**overrides)
    assert len(found) == 1 and found[0].startswith(variable), found


def test_defaults_pass_validation():
    assert rejections() == []
    assert rejections(slurm_proctrack_type="proctrack/linuxproc", slurm_task_plugins=["task/affinity"]) == []


def test_unregistered_state_pattern():
    pattern = re.compile(load_trusted(ROLE / "vars" / "main.yml")["__slurm_unregistered_state"])
    bad = ["n1|down*|Not responding", "n1|unk|none", "n1|idle*|none", "n1|down|Low RealMemory", "n1|fail|x", "n1|inval|bad"]
    good = ["n1|idle|none", "n1|alloc|none", "n1|drain|gpufleet driver upgrade", "n1|drng|gpufleet", "n1|mix|none"]
    assert all(pattern.search(line) for line in bad)
    assert not any(pattern.search(line) for line in good)
