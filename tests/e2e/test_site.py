"""site.yml on the lab: every node converges, a second run changes nothing."""

from conftest import LAB_INVENTORY, run_playbook

DRIVER_FACTS_TASK = "Publish the driver facts"


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

    second = run_playbook(tmp_path, "site.yml", LAB_INVENTORY)
    assert second.status == "successful", second.failures()
    assert second.changed_tasks() == {}
    assert all(second.changed().get(h, 0) == 0 for h in lab_hosts)
