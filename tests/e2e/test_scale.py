"""playbooks/verify.yml on 20 light lab nodes (tests/lab/files/Containerfile.light),
three of them made to fail for two reasons: two with a forged driver/library
mismatch (the loaded module's version is not the installed library's, what a
driver upgrade without a reboot leaves) and one stopped. The fleet report
leads with the verdict and the failures grouped by reason, naming exactly
those nodes, then one line per node; its JSON and JUnit keep every node.

Needs only the lab (`make lab`: its network, node image and mirror), not a
converged lab: `make test-scale` (about a minute). It joins `make test` as a
stage of its own once a rehearsal has timed it there (docs/testing.md). The
benchmark of the same plays on 1 to 100 light nodes is tools/bench/scale.py
(docs/scale.md)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest
from conftest import lone_inventory, podman, remove_lab_nodes, run_playbook, start_light_nodes

NODES = 20
MISMATCHED = ["gpufleet-scale-6", "gpufleet-scale-17"]  # natural order: 6 before 17
STOPPED = "gpufleet-scale-13"
FORGED_MODULE = "535.230.02"  # an older 535 build than the installed library's


@pytest.fixture(scope="module")
def light_fleet(tmp_path_factory):
    hosts = start_light_nodes(NODES, "e2e-scale")
    try:
        yield lone_inventory(tmp_path_factory.mktemp("inv-scale"), hosts), sorted(hosts)
    finally:
        remove_lab_nodes(list(hosts))


def test_play_1_says_a_fleet_wide_rejection_once_naming_the_hosts(tmp_path, light_fleet):
    """A wrong setting given for the whole fleet (-e) is judged once on the controller (playbooks/check.yml,
    gpufleet.fleet.settings): its reason appears once in the run's output, naming every host, and every host stops
    before anything changes (issue 30)."""
    inventory, hosts = light_fleet
    reason = "smoke_training_rendezvous_port '80' is not a TCP port (1024-65535)"
    run = run_playbook(tmp_path, "playbooks/check.yml", inventory, extravars={"smoke_training_rendezvous_port": 80})

    assert run.status == "failed"
    assert run.failed_hosts() == set(hosts), run.failures()
    messages = [message for found in run.failures().values() for message in found]
    assert sum(reason in message for message in messages) == 1, messages
    said = next(message for message in messages if reason in message)
    named = re.search(rf"rejected on {NODES} hosts \(([^)]*)\)", said)
    assert named and sorted(named[1].split(", ")) == hosts, said
    output = "".join(ev.get("stdout", "") for ev in run.events)
    assert output.count(reason) == 1, output[-3000:]
    assert run.changed_tasks() == {}


def test_verify_on_20_light_nodes_groups_the_failures_by_reason(tmp_path, light_fleet):
    inventory, hosts = light_fleet
    for host in MISMATCHED:
        podman("exec", host, "sh", "-c", f"echo {FORGED_MODULE} > /run/gpufleet-lab/nvidia-module-version")
    podman("stop", "--time", "0", STOPPED)
    reports = tmp_path / "verify"
    # A stopped server does not answer: a short SSH timeout keeps the test short (ansible.cfg: 30 s).
    run = run_playbook(
        tmp_path,
        "playbooks/verify.yml",
        inventory,
        extravars={"gpu_verify_report_dir": str(reports)},
        envvars={"ANSIBLE_TIMEOUT": "5"},
    )

    assert run.status == "failed"
    assert run.failed_hosts() == {*MISMATCHED, STOPPED}, run.failures()
    report = json.loads((reports / "fleet-report.json").read_text())
    assert report["verdict"] == "fail"
    assert report["summary"] == {"nodes": NODES, "passed": NODES - 3, "failed": 2, "unreachable": 1}
    nodes = {node["host"]: node for node in report["nodes"]}
    assert sorted(nodes) == hosts  # every node, the passed ones too
    for host in MISMATCHED:
        assert nodes[host]["reboot_required"] and nodes[host]["checks"]["driver_version"] == "fail", nodes[host]
        assert any(f"loaded module {FORGED_MODULE}, installed 535.261.03" in r for r in nodes[host]["reasons"])
    assert nodes[STOPPED]["verdict"] == "unreachable"
    for host in set(hosts) - {*MISMATCHED, STOPPED}:
        assert nodes[host]["verdict"] == "pass" and nodes[host]["checks"]["driver_version"] == "pass", nodes[host]

    # The lead of the Markdown and of the terminal summary: the verdict, then the groups, largest first.
    groups = [
        "2 nodes: reboot required (gpufleet-scale-6, gpufleet-scale-17)",
        "1 node: unreachable (gpufleet-scale-13)",
    ]
    verdict = f"{NODES} nodes: {NODES - 3} passed, 2 failed, 1 unreachable"
    markdown = (reports / "fleet-report.md").read_text().splitlines()
    lead = [line for line in markdown if line.strip()][1:4]
    assert lead == [f"**FAIL**: {verdict}", *(f"- {g}" for g in groups)], markdown[:8]
    rows = [line for line in markdown if re.match(r"\| gpufleet-scale-\d+ ", line)]
    assert [row.split("|")[1].strip() for row in rows] == sorted(hosts, key=lambda h: int(h.rsplit("-", 1)[1]))

    terminal = next(iter(run.results("Show the fleet report").values()))["msg"].splitlines()
    assert terminal[:3] == [f"FAIL: {verdict}", *(f"  {g}" for g in groups)], terminal[:5]

    junit = ET.parse(reports / "fleet-report.xml").getroot()
    assert {case.get("classname") for case in junit.iter("testcase")} == set(hosts)
