"""site.yml on the lab: every node converges, a second run changes nothing."""

from conftest import LAB_INVENTORY, run_playbook

DRIVER_FACTS_TASK = "Publish the driver facts"
CUDA_FACTS_TASK = "Publish the toolkit facts"
PYTORCH_FACTS_TASK = "Publish the PyTorch facts"


def test_site_converges_then_is_idempotent(tmp_path, lab_hosts):
    first = run_playbook(tmp_path, "site.yml", LAB_INVENTORY)
    assert first.status == "successful", first.failures()
    assert set(first.hosts("ok")) == set(lab_hosts)
    assert not first.failed_hosts()

    facts = first.results(DRIVER_FACTS_TASK)
    assert set(facts) == set(lab_hosts)
    for host, res in facts.items():
        f = res["ansible_facts"]
        assert f["nvidia_driver_installed_version"] == "535.261.03", host
        assert f["nvidia_driver_loaded_version"] == "not loaded", host
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
        assert f["pytorch_torch_version"] == "2.13.0+cpu", host
        assert f["pytorch_cpu_only"] is True, host

    second = run_playbook(tmp_path, "site.yml", LAB_INVENTORY)
    assert second.status == "successful", second.failures()
    assert second.changed_tasks() == {}
    assert all(second.changed().get(h, 0) == 0 for h in lab_hosts)
