"""Slurm in the lab, after test_site.py ran site.yml (gpufleet_slurm is on in
tests/lab/inventory): slurmctld on the head node, slurmd on every GPU node, one
munge key, every node idle, the DDP payload submitted with sbatch across all
nodes, and the munge key never in Ansible's output, even at -vvv --diff.

Slurm's own health check (slurm_health_check, every 10 s in the lab): a
driver/library mismatch forged on one node (the lab's loaded-module fixture)
is drained by slurmd's health check alone, with no playbook run, and resumed
once the fault is gone; an administrator's drain is left alone."""

from __future__ import annotations

import base64
import json
import subprocess
import time

import pytest
import yaml
from conftest import LAB_INVENTORY, podman, run_playbook
from test_site_monitoring import eventually, firing

HEAD = "gpufleet-head"
JOB_SCRIPT = "/opt/gpufleet/slurm/gpufleet-train.sbatch"
CPU_RANKS_PER_NODE = 2  # slurm_job_cpu_nproc_per_node's default
MUNGE_KEY = "/etc/munge/munge.key"


def on(host: str, *argv: str, check: bool = True) -> str:
    return podman("exec", host, *argv, check=check).stdout


def sinfo() -> dict:
    lines = on(HEAD, "sinfo", "--noheader", "--Node", "--format", "%N %t").split("\n")
    return dict(line.split() for line in lines if line.strip())


def test_daemons_run_and_every_node_is_idle(lab_hosts):
    assert on(HEAD, "systemctl", "is-active", "munge", "slurmctld").split() == ["active", "active"]
    assert on(HEAD, "systemctl", "is-enabled", "slurmctld").strip() == "enabled"
    for host in lab_hosts:
        assert on(host, "systemctl", "is-active", "munge", "slurmd").split() == ["active", "active"], host
    # A node an earlier module forged a fault on (test_site_monitoring.py) is back within a health check or two.
    eventually(sinfo, lambda got: got == {host: "idle" for host in lab_hosts}, "every node idle", 60)
    partitions = on(HEAD, "sinfo", "--noheader", "--format", "%P %D").split()
    assert partitions == ["gpu*", str(len(lab_hosts))]


def test_one_munge_key_private_to_munge_and_trusted_across_hosts(lab_hosts):
    digests = {h: on(h, "sha256sum", MUNGE_KEY).split()[0] for h in [HEAD, *lab_hosts]}
    assert len(set(digests.values())) == 1, digests
    for host in [HEAD, *lab_hosts]:
        assert on(host, "stat", "-c", "%a %U %G", MUNGE_KEY).split() == ["400", "munge", "munge"], host
    # A credential made on a node decodes on the controller: same key.
    credential = on(lab_hosts[-1], "munge", "-n")
    result = subprocess.run(
        ["podman", "exec", "-i", HEAD, "unmunge"], input=credential, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and "STATUS:          Success (0)" in result.stdout, result.stdout + result.stderr


def test_sbatch_runs_the_payload_across_every_node(lab_hosts):
    job = on(
        HEAD,
        "sbatch",
        "--parsable",
        "--wait",
        f"--nodes={len(lab_hosts)}",
        "--chdir=/tmp",
        "--time=10",
        JOB_SCRIPT,
        "--steps",
        "20",
        "--batch-size",
        str(8 * CPU_RANKS_PER_NODE * len(lab_hosts)),
        "--busbw-mib",
        "8",
        "--json",
        check=False,
    ).strip()  # the lab's size of the all-reduce timing (group_vars)
    assert job.isdigit(), job
    state = on(HEAD, "scontrol", "show", "job", job)
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state
    batch_host = sorted(lab_hosts)[0]  # the first node of the allocation runs the batch script and rank 0
    output = on(batch_host, "cat", f"/tmp/gpufleet-train-{job}.out")
    # Rank 0's indented JSON document, among the workers' logs.
    result, _end = json.JSONDecoder().raw_decode(output[output.rindex("\n{\n") + 1 :])
    assert result["world_size"] == CPU_RANKS_PER_NODE * len(lab_hosts), output[-2000:]
    assert sorted(set(result["hosts"])) == sorted(lab_hosts)
    assert result["verdict"] == "pass" and result["losses"][-1] < result["losses"][0]


def test_munge_key_never_in_ansible_output(tmp_path, lab_hosts):
    """Forces the copy path (a node with a foreign key) at -vvv --diff and
    searches every event and the log file for the key in any encoding."""
    node = lab_hosts[-1]
    key = base64.b64decode(on(HEAD, "base64", "-w0", MUNGE_KEY))
    on(node, "sh", "-c", f"dd if=/dev/urandom of={MUNGE_KEY} bs=128 count=1 status=none")
    log = tmp_path / "ansible.log"
    run = run_playbook(
        tmp_path, "playbooks/services.yml", LAB_INVENTORY, cmdline="-vvv --diff", envvars={"ANSIBLE_LOG_PATH": str(log)}
    )
    assert run.status == "successful", run.failures()
    # no_log censors the result (its "changed" too): the task ran on that node only, and the node changed.
    wrote = {
        ev["event_data"]["host"]
        for ev in run.events
        if ev.get("event") == "runner_on_ok"
        and ev["event_data"].get("task") == "Write the munge key on the node (mode 0400, owner munge)"
    }
    assert wrote == {node}
    assert run.changed().get(node, 0) >= 1 and set(run.changed()) == {node}
    text = json.dumps(run.events) + "".join(ev.get("stdout", "") for ev in run.events)
    if log.exists():
        text += log.read_text(errors="replace")
    assert log.stat().st_size > 0
    forms = {
        "base64": base64.b64encode(key).decode(),
        "hex": key.hex(),
        "raw": key.decode("latin-1"),
        "base64-prefix": base64.b64encode(key).decode()[:24],
    }
    for name, form in forms.items():
        assert form not in text, f"the munge key appears ({name}) in Ansible's output"
    assert on(node, "sha256sum", MUNGE_KEY).split()[0] == on(HEAD, "sha256sum", MUNGE_KEY).split()[0]
    deadline = time.monotonic() + 60
    while sinfo().get(node) != "idle" and time.monotonic() < deadline:
        time.sleep(2)
    assert sinfo()[node] == "idle"


@pytest.mark.slow
def test_unreachable_hosts_do_not_stop_the_others(tmp_path, lab_hosts):
    """site.yml with Slurm on and two extra GPU nodes that cannot be reached (one name that does not resolve,
    one address that does not answer): they are named, and every play still runs for the healthy hosts,
    including the delegated fact gathering of the Slurm play, verification and the smoke training; the
    reports are this run's and the end of the run says so (issue 16, item 14)."""
    ghosts = {
        "gpufleet-ghost-dns": {"ansible_host": "no-such-host.invalid"},
        "gpufleet-ghost-silent": {"ansible_host": "10.89.77.250", "ansible_timeout": 5},
    }
    hosts = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())
    hosts["all"]["children"]["gpu_nodes"]["hosts"].update(ghosts)
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(LAB_INVENTORY / "group_vars")
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    reports = tmp_path / "reports"
    lines: list[str] = []
    # Limited to the head, one lab node and the two extra nodes, as an operator limits a run to the hosts at
    # hand: the Slurm play then also gathers the facts of the lab nodes outside the run (delegated), and the
    # provisioning plays run on one node instead of three (the CI budget).
    node, others = lab_hosts[0], lab_hosts[1:]
    config = "/etc/prometheus/prometheus.yml"
    before = podman("exec", HEAD, "cat", config).stdout
    try:
        run = run_playbook(
            tmp_path,
            "site.yml",
            inventory,
            limit=",".join([HEAD, node, *ghosts]),
            extravars={
                "gpu_verify_report_dir": str(reports / "verify"),
                "smoke_training_report_dir": str(reports / "smoke"),
            },
            on_event=lambda event: lines.extend(event.get("stdout", "").splitlines()),
        )
        scrape = yaml.safe_load(podman("exec", HEAD, "cat", config).stdout)
    finally:
        # The lab as it was: the extra nodes leave Prometheus (later runs on the lab inventory expect no change).
        subprocess.run(
            ["podman", "exec", "-i", HEAD, "sh", "-c", f"cat > {config}"], input=before, text=True, check=True
        )
        podman("exec", HEAD, "systemctl", "reload", "prometheus")
    assert run.status == "failed"
    assert set(run.hosts("dark")) == set(ghosts), run.hosts("dark")
    assert not set(run.hosts("failures")) - set(ghosts), run.failures()
    # The two extra nodes are in the inventory's gpu_nodes: Prometheus scrapes them from then on, so that its
    # node-down alert names them. That is the one change of the run.
    prometheus = ["Write the Prometheus configuration (scrape targets)", "Reload Prometheus"]
    assert run.changed_tasks() == {HEAD: prometheus}, run.changed_tasks()
    instances = {
        target["labels"]["instance"]
        for job in scrape["scrape_configs"]
        if job["job_name"] == "node"
        for target in job["static_configs"]
    }
    assert set(ghosts) <= instances, instances
    plays = {
        ev["event_data"]["play"]
        for ev in run.events
        if ev.get("event") == "runner_on_ok" and ev["event_data"]["host"] == node
    }
    assert {"Slurm", "Monitoring", "Verify the GPU nodes (read-only)", "Smoke-train across the GPU nodes"} <= plays, (
        plays
    )
    assert not {ev["event_data"]["host"] for ev in run.events if ev.get("event") == "runner_on_ok"} & set(others)
    fleet = json.loads((reports / "verify" / "fleet-report.json").read_text())
    verdicts = {entry["host"]: entry["verdict"] for entry in fleet["nodes"]}
    assert verdicts[node] == "pass" and all(verdicts[ghost] == "unreachable" for ghost in ghosts), verdicts
    smoke = json.loads((reports / "smoke" / "smoke-result.json").read_text())
    assert smoke["verdict"] == "pass" and sorted(set(smoke["result"]["hosts"])) == [node]
    # slurm.conf still describes the nodes outside the run (their delegated facts): every lab node stays idle.
    assert sinfo() == {host: "idle" for host in lab_hosts}
    # The end of the run names each unreachable host once and points at this run's reports.
    summary = "\n".join(lines[lines.index("GPUFLEET SUMMARY") :])
    assert all(f"unreachable: {ghost} " in summary for ghost in ghosts), summary
    assert f"report verify: {reports / 'verify' / 'fleet-report.md'} (verdict: " in summary, summary


# --------------------------------------------------------------------------- Slurm's own health check

# slurm.conf(5) (https://github.com/SchedMD/slurm/blob/slurm-22-05-8-1/doc/man/man5/slurm.conf.5, Debian 12's 22.05):
# HealthCheckProgram runs "periodically on all compute nodes that are not in the NOT_RESPONDING state", every
# HealthCheckInterval seconds (10 in tests/lab/inventory), on the nodes of HealthCheckNodeState (IDLE: a drained idle
# node is idle too), and is killed after 60 s. The drain and the resume are the program's own scontrol calls.
HEALTH_WAIT_S = 120  # a few 10 s intervals, each check a couple of seconds
MODULE_FIXTURE = "/run/gpufleet-lab/nvidia-module-version"  # the lab's loaded-module fixture (tests/lab/files)
HEALTH_METRICS = "/var/lib/prometheus/node-exporter/gpufleet-slurm-health.prom"
GPUFLEET_REASON = "gpufleet: driver_version [reboot]: "
ADMIN_REASON = "admin: maintenance"
DRAIN_ALERT = "GpufleetNodeDrainedByHealthCheck"
PROMETHEUS_HOST = HEAD  # the lab's monitoring_server


def node_state(host: str) -> tuple[str, str]:
    """The node's state (%t: idle, drain, drng, ...) and reason (%E) as the controller sees them."""
    state, reason = (
        on(HEAD, "sinfo", "--noheader", "--Node", "--nodes", host, "--format", "%t|%E").strip().split("|", 1)
    )
    return state, reason


def health_metrics(host: str) -> dict[str, str]:
    """The node's gpufleet-slurm-health.prom, series -> value."""
    text = on(host, "cat", HEALTH_METRICS, check=False)
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))


def forge_mismatch(host: str) -> str | None:
    """The loaded module's version set to one the installed driver is not; returns the fixture as it was."""
    saved = podman("exec", host, "cat", MODULE_FIXTURE, check=False)
    podman("exec", host, "sh", "-c", f"printf '535.1.0\\n' > {MODULE_FIXTURE}")
    return saved.stdout if saved.returncode == 0 else None


def restore(host: str, original: str | None) -> None:
    if original is None:
        podman("exec", host, "rm", "-f", MODULE_FIXTURE)
    else:
        podman("exec", host, "sh", "-c", f'printf %s "$1" > {MODULE_FIXTURE}', "sh", original)


def test_a_forged_fault_is_drained_by_slurms_health_check_and_resumed_once_removed(lab_hosts):
    """No playbook runs here: slurmd's own health check drains the node with gpufleet's reason, naming the failed
    check and its action class, writes the metric the drain alert reads, and resumes the node once the fault is gone."""
    node, others = lab_hosts[0], lab_hosts[1:]
    eventually(sinfo, lambda got: got == {host: "idle" for host in lab_hosts}, "every node idle", 60)
    original = forge_mismatch(node)
    try:
        state, reason = eventually(
            lambda: node_state(node),
            lambda got: got[0].startswith("drain") and got[1].startswith(GPUFLEET_REASON),
            f"{node} drained by the health check",
            HEALTH_WAIT_S,
        )
        assert "535.1.0" in reason, reason
        assert all(node_state(host)[0] == "idle" for host in others), sinfo()
        series = eventually(
            lambda: health_metrics(node),
            lambda got: any(k.startswith("gpufleet_slurm_drained{") and v == "1" for k, v in got.items()),
            "the drain metric",
            30,
        )
        assert series[f'gpufleet_slurm_drained{{reason="{reason}"}}'] == "1", series
        assert series["gpufleet_slurm_health_check_passed"] == "0"
        # Prometheus (the head node, every 5 s in the lab) fires the drain alert for that node alone.
        alerts = eventually(
            lambda: firing(PROMETHEUS_HOST),
            lambda got: node in got.get(DRAIN_ALERT, set()),
            f"{DRAIN_ALERT} firing for {node}",
            60,
        )
        assert alerts[DRAIN_ALERT] == {node}, alerts
    finally:
        restore(node, original)
    eventually(
        lambda: node_state(node), lambda got: got[0] == "idle", f"{node} resumed by the health check", HEALTH_WAIT_S
    )
    series = eventually(
        lambda: health_metrics(node),
        lambda got: got.get('gpufleet_slurm_drained{reason=""}') == "0",
        "the drain metric back to 0",
        30,
    )
    assert series["gpufleet_slurm_health_check_passed"] == "1"
    assert sinfo() == {host: "idle" for host in lab_hosts}


def test_an_administrators_drain_is_left_alone_by_the_health_check(lab_hosts):
    """A node an administrator drained stays drained, with the administrator's reason, through health checks that pass
    and one that fails; the test resumes it itself."""
    node = lab_hosts[-1]
    on(HEAD, "scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={ADMIN_REASON}")
    forged, original = False, None
    try:

        def checked_after(stamp: float):
            return lambda got: float(got.get("gpufleet_slurm_health_check_timestamp_seconds", "0")) > stamp

        first = float(health_metrics(node).get("gpufleet_slurm_health_check_timestamp_seconds", "0"))
        seen = eventually(
            lambda: health_metrics(node), checked_after(first), "a health check after the drain", HEALTH_WAIT_S
        )
        seen = eventually(
            lambda: health_metrics(node),
            checked_after(float(seen["gpufleet_slurm_health_check_timestamp_seconds"])),
            "a second health check",
            HEALTH_WAIT_S,
        )
        assert seen["gpufleet_slurm_health_check_passed"] == "1", seen  # passed twice...
        assert node_state(node) == ("drain", ADMIN_REASON)  # ... and the node stays the administrator's
        assert seen['gpufleet_slurm_drained{reason=""}'] == "0"

        original, forged = forge_mismatch(node), True  # a failing check does not take the node over either
        eventually(
            lambda: health_metrics(node),
            lambda got: got.get("gpufleet_slurm_health_check_passed") == "0",
            "a failed health check",
            HEALTH_WAIT_S,
        )
        assert node_state(node) == ("drain", ADMIN_REASON)
    finally:
        if forged:
            restore(node, original)
            eventually(
                lambda: health_metrics(node),
                lambda got: got.get("gpufleet_slurm_health_check_passed") == "1",
                "a passing health check again",
                HEALTH_WAIT_S,
            )
        on(HEAD, "scontrol", "update", f"NodeName={node}", "State=RESUME")
    eventually(sinfo, lambda got: got == {host: "idle" for host in lab_hosts}, "every node idle", 60)
