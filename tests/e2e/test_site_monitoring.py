"""Monitoring in the lab: Prometheus on the head node (inventory group
monitoring_server) scrapes node exporter on every host, and the gpufleet_*
metrics each node's verification writes through the textfile collector.

Runs after test_site.py, which ran site.yml (monitoring included: the lab
inventory sets gpufleet_monitoring, 5 s scrape and evaluation intervals and
alerts that fire at once, monitoring_alert_for: 0s); this module provisions
nothing. Prometheus is asked from inside the lab only (its API on the head
node, through python3 there: the lab network has no route to this machine).

A node is driven into "reboot required" through the lab's fixture of the
loaded module version (the kernel's /sys/module/nvidia/version): the alerts
must fire for that node and for no other, and stop once the fixture is
restored and the node verified again."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import LAB_INVENTORY, REPO, podman, run_playbook

PINNED = "535.261.03"
MODULE_FIXTURE = "/run/gpufleet-lab/nvidia-module-version"
PROMETHEUS_API = "http://localhost:9090/api/v1/"
RULES_TEST_FILE = REPO / "roles" / "monitoring" / "files" / "gpufleet-alerts.test.yml"
RULES_FILE = yaml.safe_load((REPO / "roles" / "monitoring" / "vars" / "main.yml").read_text())[
    "__monitoring_rules_file"
]
ALERTS = {
    "GpufleetVerificationFailed",
    "GpufleetRebootRequired",
    "GpufleetUncorrectedEccErrors",
    "GpufleetVerificationStale",
    "GpufleetVerificationMissing",
    "GpufleetNodeExporterDown",
    "GpufleetDcgmExporterDown",
    "GpufleetGpuXid",
    "GpufleetRowRemapPending",
    "GpufleetRowRemapFailure",
    "GpufleetNvlinkDown",
    "GpufleetNvlinkErrors",
    "GpufleetGpuThrottled",
    "GpufleetPcieDowntrained",
    "GpufleetNodeDrainedByHealthCheck",
    "GpufleetLemonNode",
}
MISMATCH_ALERTS = {"GpufleetRebootRequired", "GpufleetVerificationFailed"}
WAIT_S = 60  # scrape and evaluation every 5 s, alerts without a "for": a few cycles are plenty


@pytest.fixture(scope="module")
def head() -> str:
    """The lab's Prometheus host: the monitoring_server group of tests/lab/inventory/hosts.yml."""
    hosts_file = LAB_INVENTORY / "hosts.yml"
    if not hosts_file.exists():
        pytest.fail("the lab is not built: run `make lab` first")
    servers = (yaml.safe_load(hosts_file.read_text())["all"]["children"].get("monitoring_server") or {}).get(
        "hosts"
    ) or {}
    if not servers:
        pytest.fail("the lab inventory has no monitoring_server host: rebuild the lab (`make lab`)")
    return sorted(servers)[0]


def prometheus(head: str, path: str, **params: str) -> Any:
    """GET Prometheus' API on the head node; the "data" of a successful answer."""
    url = PROMETHEUS_API + path + ("?" + urllib.parse.urlencode(params) if params else "")
    code = f"import sys, urllib.request; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    proc = podman("exec", head, "python3", "-c", code, check=False)
    assert proc.returncode == 0, f"{url}: {proc.stderr[-2000:]}"
    answer = json.loads(proc.stdout)
    assert answer["status"] == "success", answer
    return answer["data"]


def by_node(head: str, query: str) -> dict[str, dict[str, Any]]:
    """node label -> {"labels", "value"} of an instant query (series without a node label, e.g. left from
    the package's default configuration before the role's, are ignored)."""
    out = {}
    for series in prometheus(head, "query", query=query)["result"]:
        if series["metric"].get("node"):
            out[series["metric"]["node"]] = {"labels": series["metric"], "value": float(series["value"][1])}
    return out


def firing(head: str) -> dict[str, set[str]]:
    """alert name -> the nodes it fires for."""
    out: dict[str, set[str]] = {}
    for alert in prometheus(head, "alerts")["alerts"]:
        if alert["state"] == "firing":
            out.setdefault(alert["labels"]["alertname"], set()).add(alert["labels"].get("node", "?"))
    return out


def eventually(probe: Callable[[], Any], done: Callable[[Any], bool], what: str, timeout: float = WAIT_S) -> Any:
    """Call probe() every 2 s until done(result); fail naming ``what`` and the last result after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if done(result):
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"after {timeout:.0f} s, still not {what}: {result}")
        time.sleep(2)


def verify(tmp_path: Path, name: str):
    return run_playbook(
        tmp_path, "playbooks/verify.yml", LAB_INVENTORY, extravars={"gpu_verify_report_dir": str(tmp_path / name)}
    )


def test_prometheus_sees_every_verified_node(head, lab_hosts):
    """Every GPU node's verification passed, as Prometheus scraped it; node exporter is up on every host."""
    passed = eventually(
        lambda: by_node(head, "gpufleet_verify_passed"),
        lambda got: {n: s["value"] for n, s in got.items()} == {h: 1.0 for h in lab_hosts},
        "gpufleet_verify_passed 1 for every node",
    )
    for node, series in passed.items():
        assert series["labels"]["instance"] == node and series["labels"]["job"] == "node", series

    info = by_node(head, "gpufleet_versions_info")
    assert set(info) == set(lab_hosts)
    for node, series in info.items():
        assert series["labels"]["driver_installed"] == PINNED, series
        assert series["labels"]["host"] == node, series  # each node's hostname is its inventory name
        assert series["labels"]["torch"] == "2.3.1+cu121", series

    up = eventually(
        lambda: by_node(head, 'up{job="node"}'),
        lambda got: {n: s["value"] for n, s in got.items()} == {h: 1.0 for h in [*lab_hosts, head]},
        "node exporter up on every host",
    )
    assert {n: s["labels"]["gpu_node"] for n, s in up.items()} == {**{h: "true" for h in lab_hosts}, head: "false"}
    assert {n: s["value"] for n, s in by_node(head, 'node_textfile_scrape_error{job="node"}').items()} == {
        h: 0.0 for h in [*lab_hosts, head]
    }

    # Fresh (test_site.py verified a few minutes ago), never judged stale; the lab has no GPU.
    age = by_node(head, "time() - gpufleet_verify_timestamp_seconds")
    assert set(age) == set(lab_hosts) and all(0 <= s["value"] < 3600 for s in age.values()), age
    assert all(s["value"] == 0 for s in by_node(head, "gpufleet_gpus").values())
    checks = by_node(head, 'gpufleet_check_status{check="gemm", status="skipped"}')
    assert {n: s["value"] for n, s in checks.items()} == {h: 1.0 for h in lab_hosts}
    assert not (set(firing(head)) & (ALERTS - {"GpufleetDcgmExporterDown"})), firing(head)


def test_reboot_required_node_fires_its_alerts_only(tmp_path, head, lab_hosts):
    """A loaded module that is not the installed driver: that node's verification fails with reboot required,
    and Prometheus fires GpufleetRebootRequired and GpufleetVerificationFailed for it and for no other node."""
    node = lab_hosts[0]
    saved = podman("exec", node, "cat", MODULE_FIXTURE, check=False)
    original = saved.stdout if saved.returncode == 0 else None  # absent: the module "not loaded" since the install
    try:
        podman("exec", node, "sh", "-c", f"printf '535.1.0\\n' > {MODULE_FIXTURE}")
        run = verify(tmp_path, "verify-mismatch")
        assert run.status == "failed" and set(run.failures()) == {node}, run.failures()

        alerts = eventually(
            lambda: firing(head),
            lambda got: all(node in got.get(a, set()) for a in MISMATCH_ALERTS),
            f"{sorted(MISMATCH_ALERTS)} firing for {node}",
        )
        for name in MISMATCH_ALERTS:
            assert alerts[name] == {node}, (name, alerts[name])
        assert by_node(head, "gpufleet_reboot_required")[node]["value"] == 1.0
        assert by_node(head, "gpufleet_versions_info")[node]["labels"]["driver_loaded"] == "535.1.0"
        failed = [
            a
            for a in prometheus(head, "alerts")["alerts"]
            if a["labels"]["alertname"] == "GpufleetVerificationFailed" and a["labels"].get("node") == node
        ]
        assert "failed checks: driver_version" in failed[0]["annotations"]["description"], failed
        assert failed[0]["labels"]["severity"] == "critical"
    finally:
        if original is None:
            podman("exec", node, "rm", "-f", MODULE_FIXTURE)
        else:
            podman("exec", node, "sh", "-c", f'printf %s "$1" > {MODULE_FIXTURE}', "sh", original)
        restored = verify(tmp_path, "verify-restored")
        assert restored.status == "successful", restored.failures()
        eventually(
            lambda: firing(head),
            lambda got: not any(node in got.get(a, set()) for a in MISMATCH_ALERTS),
            f"{sorted(MISMATCH_ALERTS)} resolved for {node}",
        )
    assert by_node(head, "gpufleet_verify_passed")[node]["value"] == 1.0


def test_promtool_unit_tests_of_the_deployed_rules(head):
    """The role's promtool tests pass against the rules as deployed (monitoring_alert_for 0s in the lab), and
    Prometheus has loaded every rule."""
    workdir = podman("exec", head, "mktemp", "-d").stdout.strip()
    try:
        podman("cp", str(RULES_TEST_FILE), f"{head}:{workdir}/{RULES_TEST_FILE.name}")
        podman("exec", head, "cp", RULES_FILE, f"{workdir}/")
        proc = podman("exec", head, "promtool", "test", "rules", f"{workdir}/{RULES_TEST_FILE.name}", check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout
    finally:
        podman("exec", head, "rm", "-rf", workdir, check=False)

    groups = prometheus(head, "rules", type="alert")["groups"]
    rules = {rule["name"]: rule for group in groups if group["file"] == RULES_FILE for rule in group["rules"]}
    assert set(rules) == ALERTS
    assert all(rule["health"] == "ok" and rule["duration"] == 0 for rule in rules.values()), rules


# LAB FIXTURE (README, "what is tested where"): a container has no kernel log of its own, so the xid check reads
# this file (gpu_verify_kernel_log_file, the setting for nodes whose kernel messages go to /var/log/kern.log).
# Its line is a real one: leptonai/gpud pkg/dmesg/testdata/dmesg-time-format-iso.log (line 11 of
# tests/unit/data/gpu/xid/dmesg-iso-h100-xid48-63-94.log, its source in the .source file beside it); the window is
# the whole log (gpu_verify_xid_window_hours 0), since the line is dated 2024.
KERNEL_LOG_FIXTURE = "/run/gpufleet-lab/kern.log"
XID_LINE = (
    (REPO / "tests" / "unit" / "data" / "gpu" / "xid" / "dmesg-iso-h100-xid48-63-94.log").read_text().splitlines()[10]
)
XID_ALERTS = {"GpufleetGpuXid", "GpufleetVerificationFailed"}


def test_an_xid_in_the_kernel_log_reaches_the_report_the_metric_and_its_alert(tmp_path, head, lab_hosts):
    """Xid 48 (a double-bit ECC error, drain by NVIDIA's catalog) in one node's kernel log: verify.yml fails that
    node with the xid check, the report names the GPU, the line and the action, the node's metrics carry it, and
    GpufleetGpuXid fires for that node and for no other; gone from the log, everything resolves."""
    node = lab_hosts[0]
    assert "Xid (PCI:0000:19:00): 48," in XID_LINE, XID_LINE
    extravars = {"gpu_verify_kernel_log_file": KERNEL_LOG_FIXTURE, "gpu_verify_xid_window_hours": 0}
    try:
        for host in lab_hosts:
            text = XID_LINE + "\n" if host == node else ""
            podman(
                "exec",
                host,
                "sh",
                "-c",
                f'mkdir -p /run/gpufleet-lab && printf %s "$1" > {KERNEL_LOG_FIXTURE}',
                "sh",
                text,
            )
        reports = tmp_path / "verify-xid"
        run = run_playbook(
            tmp_path,
            "playbooks/verify.yml",
            LAB_INVENTORY,
            extravars={**extravars, "gpu_verify_report_dir": str(reports)},
        )
        assert run.status == "failed" and set(run.failures()) == {node}, run.failures()

        report = {n["host"]: n for n in json.loads((reports / "fleet-report.json").read_text())["nodes"]}
        assert report[node]["checks"]["xid"] == "fail", report[node]["checks"]
        findings = [f for f in report[node]["findings"] if f.get("signal") == "xid"]
        assert any(f.get("gpu") == "PCI:0000:19:00" and f.get("action_class") == "drain" for f in findings), findings
        assert report[node]["actions"] == ["drain"], report[node]["actions"]
        for other in set(lab_hosts) - {node}:
            assert report[other]["verdict"] == "pass", report[other]
        markdown = (reports / "fleet-report.md").read_text()
        assert f"failed xid ({node})" in markdown and f"1 node to drain and investigate: {node}" in markdown, markdown

        events = eventually(
            lambda: by_node(head, 'gpufleet_xid_events{code="48",verdict="fail"}'),
            lambda got: set(got) == {node},
            f"gpufleet_xid_events of Xid 48 for {node} only",
        )
        assert events[node]["value"] == 1.0, events
        alerts = eventually(
            lambda: firing(head),
            lambda got: all(node in got.get(a, set()) for a in XID_ALERTS),
            f"{sorted(XID_ALERTS)} firing for {node}",
        )
        assert alerts["GpufleetGpuXid"] == {node}, alerts
        assert by_node(head, 'gpufleet_action_required{action_class="drain"}')[node]["value"] == 1.0
    finally:
        for host in lab_hosts:
            podman("exec", host, "rm", "-f", KERNEL_LOG_FIXTURE, check=False)
        restored = verify(tmp_path, "verify-after-xid")
        assert restored.status == "successful", restored.failures()
        eventually(
            lambda: firing(head),
            lambda got: not any(node in got.get(a, set()) for a in XID_ALERTS),
            f"{sorted(XID_ALERTS)} resolved for {node}",
        )
