"""playbooks/upgrade-driver.yml in the lab: the mirror serves a newer 535
release (535.309.01 from bookworm-security) beside the pinned one.

Runs after test_site.py. Every node is restarted first, so that the lab's
boot-time fixture publishes the loaded module version (535.261.03); then a
rollout over the last two nodes, one at a time: the first of them is
upgraded, cannot reboot (a container), fails verification with "reboot
required" and stops the rollout, so the second is never touched. Verify then
names exactly that node. A restart loads the new module and verify passes;
finally the node is moved back to the inventory's release (a downgrade
through the same play), leaving the lab as test_site.py made it.

Slurm runs in the lab (test_site.py's site.yml): the play drains each node
before touching it; the stopped node stays drained with the play's reason,
the untouched one stays idle, and a run after the reboot resumes it."""

from __future__ import annotations

import json

import pytest
from conftest import LAB_INVENTORY, lab_vars, podman, restart_node, run_playbook

# The slow tier (make test-slow; docs/testing.md): a rollout with its reboots and a downgrade, about 10 min.
pytestmark = pytest.mark.slow

PINNED = "535.261.03"


def installed_driver(host: str) -> str:
    return podman("exec", host, "dpkg-query", "-W", "-f=${Version}", "nvidia-smi").stdout.split("-")[0]


def slurm_state(host: str) -> tuple[str, str]:
    """The node's Slurm state and reason, as the controller sees them."""
    out = podman("exec", "gpufleet-head", "sinfo", "--noheader", "--Node", "--nodes", host, "--format", "%t|%E").stdout
    state, reason = out.strip().split("|", 1)
    return state, reason


def verify(tmp_path, name: str) -> dict:
    reports = tmp_path / name
    run_playbook(tmp_path, "playbooks/verify.yml", LAB_INVENTORY, extravars={"gpu_verify_report_dir": str(reports)})
    report = json.loads((reports / "fleet-report.json").read_text())
    return {n["host"]: n for n in report["nodes"]}


def test_upgrade_stops_at_first_failed_node_and_verify_names_it(tmp_path, lab_hosts):
    newer = lab_vars()["lab_upgrade_driver_version"]
    first, second = lab_hosts[-2], lab_hosts[-1]
    for host in lab_hosts:
        restart_node(host)

    nodes = verify(tmp_path, "before")
    for host in lab_hosts:
        assert nodes[host]["verdict"] == "pass", nodes[host]
        assert nodes[host]["driver_loaded"] == nodes[host]["driver"] == PINNED, nodes[host]

    try:
        run = run_playbook(
            tmp_path,
            "playbooks/upgrade-driver.yml",
            LAB_INVENTORY,
            limit=f"{first},{second}",
            extravars={"upgrade_driver_version": newer, "gpu_verify_report_dir": str(tmp_path / "upgrade")},
        )
        assert run.status == "failed"
        assert set(run.failures()) == {first}
        assert "The rollout stops here" in " ".join(run.failures()[first])
        assert installed_driver(first) == newer
        assert installed_driver(second) == PINNED  # the rollout stopped before it
        held = podman("exec", first, "apt-mark", "showhold").stdout.split()
        assert "nvidia-smi" in held and "nvidia-kernel-dkms" in held
        state, reason = slurm_state(first)
        assert state.startswith("drain") and f"gpufleet driver upgrade to {newer}" in reason, (state, reason)
        assert slurm_state(second)[0] == "idle"

        nodes = verify(tmp_path, "after-upgrade")
        assert nodes[first]["verdict"] == "fail" and nodes[first]["reboot_required"] is True, nodes[first]
        assert any("reboot required" in r for r in nodes[first]["reasons"]), nodes[first]["reasons"]
        assert (nodes[first]["driver_loaded"], nodes[first]["driver"]) == (PINNED, newer)
        for host in set(lab_hosts) - {first}:
            assert nodes[host]["verdict"] == "pass" and nodes[host]["reboot_required"] is False, nodes[host]

        restart_node(first)  # the reboot: the new module loads
        nodes = verify(tmp_path, "after-reboot")
        assert all(nodes[h]["verdict"] == "pass" for h in lab_hosts), nodes
        assert nodes[first]["driver_loaded"] == newer
    finally:
        # Back to the inventory's release (staged, then the reboot that loads it).
        back = run_playbook(
            tmp_path,
            "playbooks/upgrade-driver.yml",
            LAB_INVENTORY,
            limit=first,
            extravars={
                "upgrade_driver_version": PINNED,
                "upgrade_driver_accept_reboot_pending": True,
                "gpu_verify_report_dir": str(tmp_path / "back"),
            },
        )
        restart_node(first)
        # After the reboot, the same play finds the node verified and resumes it in Slurm.
        resumed = run_playbook(
            tmp_path,
            "playbooks/upgrade-driver.yml",
            LAB_INVENTORY,
            limit=first,
            extravars={"upgrade_driver_version": PINNED, "gpu_verify_report_dir": str(tmp_path / "resume")},
        )
    assert back.status == "successful", back.failures()
    assert resumed.status == "successful", resumed.failures()
    assert "Resume the node in Slurm" in resumed.changed_tasks()[first]
    assert slurm_state(first)[0] == "idle"
    assert installed_driver(first) == PINNED
    assert verify(tmp_path, "restored")[first]["verdict"] == "pass"
