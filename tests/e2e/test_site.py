"""site.yml on the lab: every node converges, is verified and smoke-trained
across all nodes (one torchrun world); a second run changes nothing."""

import json

from conftest import LAB_INVENTORY, podman, run_playbook

DRIVER_FACTS_TASK = "Publish the driver facts"
CUDA_FACTS_TASK = "Publish the toolkit facts"
PYTORCH_FACTS_TASK = "Publish the PyTorch facts"


CPU_RANKS_PER_NODE = 2  # smoke_training_cpu_nproc_per_node's default
HEAD = "gpufleet-head"  # the Slurm controller and Prometheus server (playbooks/services.yml)


def check_reports(reports, lab_hosts):
    """The fleet report lists every node as passed; the smoke training spanned every rank of every node."""
    fleet = json.loads((reports / "verify" / "fleet-report.json").read_text())
    assert [n["host"] for n in fleet["nodes"]] == sorted(lab_hosts)
    assert fleet["verdict"] == "pass", fleet["summary"]
    for node in fleet["nodes"]:
        assert node["verdict"] == "pass", node
        # PyPI's cu121 build of torch 2.3.1 (the lab's wheelhouse; pip's metadata says 2.3.1, torch itself
        # 2.3.1+cu121), read on a node without a GPU.
        assert node["driver"] == "535.261.03" and node["torch"] == "2.3.1+cu121", node
        assert (node["cuda"], node["cudnn"], node["nccl"]) == ("12.1", "8.9.2", "2.20.5"), node
        assert node["checks"]["libraries"] == "pass", node
        # The lab's first-install fixture: the first verify compares the loaded module with the installed driver.
        assert node["checks"]["driver_version"] == "pass", node
        # No GPU in the lab: GPU checks are skipped, never passed.
        assert node["checks"]["gemm"] == "skipped" and node["checks"]["allreduce_busbw"] == "skipped", node
    markdown = (reports / "verify" / "fleet-report.md").read_text()
    assert all(f"| {host} |" in markdown for host in lab_hosts)

    smoke = json.loads((reports / "smoke" / "smoke-result.json").read_text())
    result = smoke["result"]
    assert smoke["verdict"] == "pass", smoke["problems"]
    assert result["world_size"] == CPU_RANKS_PER_NODE * len(lab_hosts) == smoke["expected_world_size"]
    assert sorted(set(result["hosts"])) == sorted(lab_hosts)  # each node's hostname is its inventory name
    assert result["losses"][-1] < result["losses"][0]
    assert result["grad_accum"] == 2 and result["backend"] == "gloo"
    # The network between the nodes (issue 29): after its steps the payload timed an all-reduce over one rank per
    # node, here gloo over the lab's podman network (8 MiB: the lab's smoke_training_busbw_mib); NCCL's transport
    # is not read, and says so: no GPU, no NCCL. Each node's compute time per step is there for outlier rules.
    network, measured = smoke["network"], result["network"]
    assert measured["measured"] == network["measured"] == "gloo over TCP" and network["backend"] == "gloo"
    assert measured["size_bytes"] == 8 * 2**20 and measured["world"]["ranks"] == result["world_size"]
    assert measured["inter_node"]["ranks"] == len(lab_hosts) == network["nodes_crossed"]
    assert measured["inter_node"]["busbw_gbps"] > 0 and network["busbw_gbps"] == measured["inter_node"]["busbw_gbps"]
    assert network["transport"] is None and network["verdict"] == "pass", network
    assert "transport not read: the run used gloo, not NCCL" in " ".join(network["notes"]), network["notes"]
    assert sorted(n["host"] for n in network["nodes"]) == sorted(lab_hosts)
    assert all(n["transport"] is None and n["evidence"] == [] for n in network["nodes"])  # no NCCL log on any node
    assert sorted(n["host"] for n in result["nodes"]) == sorted(lab_hosts)
    assert all(n["ranks"] == CPU_RANKS_PER_NODE and n["compute_s_per_step"] > 0 for n in result["nodes"])


def test_site_converges_then_is_idempotent(tmp_path, lab_hosts):
    reports = tmp_path / "reports"
    extravars = {"gpu_verify_report_dir": str(reports / "verify"), "smoke_training_report_dir": str(reports / "smoke")}
    first = run_playbook(tmp_path, "site.yml", LAB_INVENTORY, extravars=extravars)
    assert first.status == "successful", first.failures()
    assert set(first.hosts("ok")) == set(lab_hosts) | {HEAD, "localhost"}  # play 0 runs on the controller
    assert not first.failed_hosts()

    facts = first.results(DRIVER_FACTS_TASK)
    assert set(facts) == set(lab_hosts)
    for host, res in facts.items():
        f = res["ansible_facts"]
        assert f["nvidia_driver_installed_version"] == "535.261.03", host
        # The lab's fixture of the reboot after a first install: loaded as soon as it is installed.
        assert f["nvidia_driver_loaded_version"] == "535.261.03", host
        assert f["nvidia_driver_reboot_required"] is False, host

    for host, res in first.results(CUDA_FACTS_TASK).items():
        f = res["ansible_facts"]
        assert f["cuda_toolkit_release"] == "12.1", host
        compiled = f["cuda_compile_result"]
        assert compiled["ok"] is True and compiled["toolkit_release"] == "12.1", host
        assert {a["arch"] for a in compiled["archs"] if a["ok"]} == {"sm_80", "sm_90"}, host
    assert set(first.results(CUDA_FACTS_TASK)) == set(lab_hosts)

    torch = first.results(PYTORCH_FACTS_TASK)
    assert set(torch) == set(lab_hosts)
    for host, res in torch.items():
        f = res["ansible_facts"]
        assert f["pytorch_torch_version"] == "2.3.1+cu121", host
        assert f["pytorch_cpu_only"] is False and f["pytorch_variant_installed"] == "cu121", host
        assert (f["pytorch_cuda_version"], f["pytorch_cudnn_version"], f["pytorch_nccl_version"]) == (
            "12.1",
            "8.9.2",
            "2.20.5",
        ), host

    check_reports(reports, lab_hosts)
    [show] = list(first.results("Show the smoke training").values())  # run once
    assert (
        " GB/s busbw (" in show["msg"] and "one rank each; gloo over TCP, transport not read: not NCCL)" in show["msg"]
    )

    second = run_playbook(tmp_path, "site.yml", LAB_INVENTORY, extravars=extravars)
    assert second.status == "successful", second.failures()
    check_reports(reports, lab_hosts)
    assert second.changed_tasks() == {}
    assert all(second.changed().get(h, 0) == 0 for h in [*lab_hosts, HEAD])


def test_a_source_that_installed_nothing_is_not_recorded(tmp_path, lab_hosts):
    """A re-run with another wheel source on a converged node installs nothing from it, so the node's
    /var/lib/gpufleet/pytorch.json keeps the source that was used and nothing changes (issue 16, item 17).
    The dead address is never contacted: a complete environment needs no source."""
    node = sorted(lab_hosts)[0]
    report = ["exec", node, "cat", "/var/lib/gpufleet/pytorch.json"]
    before = json.loads(podman(*report).stdout)
    assert before["source"].startswith("http://gpufleet-mirror/"), before["source"]
    run = run_playbook(
        tmp_path,
        "playbooks/provision.yml",
        LAB_INVENTORY,
        limit=node,
        extravars={"pytorch_wheelhouse_url": "http://gpufleet-mirror/never-used-wheels/"},
    )
    assert run.status == "successful", run.failures()
    assert run.changed_tasks() == {}
    after = json.loads(podman(*report).stdout)
    assert after == before
