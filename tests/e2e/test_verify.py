"""playbooks/verify.yml on the provisioned lab: read-only, re-runnable, safe
in check mode, and a node stopped in the middle of its checks is named in
the report while the other nodes' results stay intact.

Runs after test_site.py (the stack is installed); the report is read from
the JSON the play writes, never from console text."""

from __future__ import annotations

import json
import time

import pytest
from conftest import LAB_INVENTORY, podman, restart_node, run_playbook

CHECK_TASK = "Run the health checks"


def fingerprint(host: str) -> str:
    """Everything a verification could have changed on a node."""
    return podman(
        "exec",
        host,
        "sh",
        "-c",
        "md5sum /var/lib/dpkg/status; apt-mark showhold; find /etc /opt/gpufleet /var/lib/gpufleet"
        " -xdev -newer /var/lib/dpkg/status -type f 2>/dev/null | sort; ls -A /tmp",
    ).stdout


def fleet_report(report_dir) -> dict:
    return json.loads((report_dir / "fleet-report.json").read_text())


def test_verify_is_read_only_and_rerunnable(tmp_path, lab_hosts):
    reports = tmp_path / "verify"
    before = {h: fingerprint(h) for h in lab_hosts}
    runs = [
        run_playbook(
            tmp_path,
            "playbooks/verify.yml",
            LAB_INVENTORY,
            extravars={"gpu_verify_report_dir": str(reports)},
            cmdline=cmdline,
        )
        for cmdline in (None, "--check", None)
    ]
    for run in runs:
        assert run.status == "successful", run.failures()
        assert run.changed_tasks() == {}
        report = fleet_report(reports)
        assert report["summary"] == {"nodes": len(lab_hosts), "passed": len(lab_hosts), "failed": 0, "unreachable": 0}
    for host in lab_hosts:
        assert fingerprint(host).splitlines() == before[host].splitlines(), host

    for node in fleet_report(reports)["nodes"]:
        result = node["result"]
        checks = {c["name"]: c for c in result["checks"]}
        assert result["versions"]["driver_installed"] == "535.261.03", node["host"]
        # The done-when of issue 15: what torch reports on every node, per node in the report.
        versions = result["versions"]
        # PyPI's torch 2.3.1 calls itself 2.3.1+cu121 (its torch/version.py); pip's metadata says 2.3.1.
        assert (versions["torch"], versions["cuda"], versions["cudnn"], versions["nccl"]) == (
            "2.3.1+cu121",
            "12.1",
            "8.9.2",
            "2.20.5",
        )
        # What torch was built with needs no GPU: checked against the matrix's row, not skipped.
        assert checks["libraries"]["verdict"] == "pass", (node["host"], checks["libraries"])
        assert checks["libraries"]["threshold"] == "12.1", checks["libraries"]
        # Only what runs on a GPU says "no GPU".
        skipped = {name for name, check in checks.items() if check["verdict"] == "skipped"}
        assert skipped == {
            "nvidia_smi",
            "torch_cuda",
            "gemm",
            "memory_bandwidth",
            "allreduce_busbw",
            "p2p_topology",
            "gpu_errors",
            "pcie",
            "clocks",
            "nvlink",
            "xid",
            "interconnect",
            "dcgm",
        }, (node["host"], skipped)
        for name in skipped:
            assert "no GPU" in checks[name]["detail"], (node["host"], name)
    rows = {
        cells[0]: cells
        for cells in (
            [c.strip() for c in line.strip().strip("|").split("|")]
            for line in (reports / "fleet-report.md").read_text().splitlines()
            if line.startswith("| ")
        )
    }
    for host in lab_hosts:  # Node, Verdict, Driver, CUDA, torch, torch's own cuDNN/NCCL, ...
        assert rows[host][3:6] == ["12.1", "2.3.1+cu121", "8.9.2 / 2.20.5"], rows[host]
    junit = (reports / "fleet-report.xml").read_text()
    assert 'name="gpufleet-verify"' in junit and all(f'classname="{h}"' in junit for h in lab_hosts)


def test_gpu_required_fails_every_lab_node(tmp_path, lab_hosts):
    """With the default gpu_verify_require_gpus, a node without GPUs fails and is named with the reason."""
    reports = tmp_path / "verify"
    run = run_playbook(
        tmp_path,
        "playbooks/verify.yml",
        LAB_INVENTORY,
        extravars={"gpu_verify_report_dir": str(reports), "gpu_verify_require_gpus": True},
    )
    assert run.status == "failed"
    assert set(run.failures()) == set(lab_hosts)
    report = fleet_report(reports)
    assert report["verdict"] == "fail" and report["summary"]["failed"] == len(lab_hosts)
    assert all(any("no GPU" in r for r in node["reasons"]) for node in report["nodes"])


# A GPU that fell off the bus makes nvidia-smi hang: the node's check is
# then certainly still running when the test stops the node (without a GPU,
# the lab's check finishes in about a second, often before the test could
# see it start). The hanging copy shadows the real one on PATH; the real
# /usr/bin/nvidia-smi is not touched.
HANGING_SMI = "/usr/local/bin/nvidia-smi"


@pytest.fixture
def node_to_stop(lab_hosts):
    name = lab_hosts[-1]
    podman("exec", name, "sh", "-c", f"printf '#!/bin/sh\\nsleep 600\\n' > {HANGING_SMI} && chmod 0755 {HANGING_SMI}")
    yield name
    restart_node(name)  # starts it again (a stopped container restarts)
    podman("exec", name, "rm", "-f", HANGING_SMI)


def test_node_stopped_mid_verification_is_named(tmp_path, lab_hosts, node_to_stop):
    """The last node is stopped while its checks run: the report names it, the others pass."""
    reports = tmp_path / "verify"
    stopped = {}

    def stop_when_its_check_runs(event: dict) -> bool:
        data = event.get("event_data", {})
        if (
            not stopped
            and event.get("event") == "runner_on_start"
            and data.get("task") == CHECK_TASK
            and data.get("host") == node_to_stop
        ):
            # The check starts on the node (ansible copies and launches it) and
            # hangs in nvidia-smi: stop the node in the middle.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if podman("exec", node_to_stop, "pgrep", "-f", HANGING_SMI, check=False).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                stopped["late"] = True
            podman("stop", "--time", "0", node_to_stop, check=False)
            stopped["at"] = time.monotonic()
        return True

    run = run_playbook(
        tmp_path,
        "playbooks/verify.yml",
        LAB_INVENTORY,
        extravars={"gpu_verify_report_dir": str(reports)},
        on_event=stop_when_its_check_runs,
    )
    assert stopped, "the check never started on the node"
    assert "late" not in stopped, f"the check on {node_to_stop} did not reach nvidia-smi within 30 s"
    assert run.status == "failed"
    assert set(run.failures()) == {node_to_stop}

    nodes = {n["host"]: n for n in fleet_report(reports)["nodes"]}
    assert set(nodes) == set(lab_hosts)
    assert nodes[node_to_stop]["verdict"] in ("unreachable", "fail")
    assert nodes[node_to_stop]["reasons"], nodes[node_to_stop]
    # Said once, and without Ansible's "Task failed" prefix (issue 16, item 21).
    reasons = " ".join(nodes[node_to_stop]["reasons"])
    assert "unreachable: unreachable" not in reasons.lower() and "Task failed" not in reasons, reasons
    for host in set(lab_hosts) - {node_to_stop}:
        assert nodes[host]["verdict"] == "pass", nodes[host]
        assert nodes[host]["result"]["host"] == host
    markdown = (reports / "fleet-report.md").read_text()
    assert node_to_stop in markdown
