"""roles/monitoring without a host: the configuration it renders for a 3-node fleet, and what it rejects.

The role runs for real (tests/unit/role_run.py): an inventory of three GPU
nodes and a head node (the lab's shape; per-host variables and extra groups
where a test says), its validate.yml on one host, then, in the same play, its
templates through the template lookup. prometheus.yml, which names the hosts
it scrapes and the one it runs on, is rendered on the head node, one run per
fleet; the other files and the validation cases are rendered and run on
extra hosts of the same inventory, one per case, in one run per file. Nothing is
copied from the role.

The alert rules and the metrics writers (roles/payload/files/gpufleet_check/metrics.py, each
node's checks; plugins/module_utils/fleet_report.py's history_metrics, the fleet report's history
the verify play writes beside them) are cross-checked: every gpufleet_* name the rules (and the
promtool tests of the rules) use is a metric a writer emits, so neither can drift alone.
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest
import role_run
import yaml
from conftest import FAKE_FACTS, load_script, load_trusted

from ansible_collections.gpufleet.fleet.plugins.module_utils import fleet_report

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLE = REPO_ROOT / "roles" / "monitoring"
GPU_VERIFY = REPO_ROOT / "roles" / "gpu_verify"
# Standard library only and nothing else of its package: it loads on its own.
METRICS_WRITER = REPO_ROOT / "roles" / "payload" / "files" / "gpufleet_check" / "metrics.py"
RULES_TEST_FILE = ROLE / "files" / "gpufleet-alerts.test.yml"
COUNTERS_FILE = ROLE / "files" / "dcgm-exporter-counters.csv"

NODES = ["gpufleet-node-1", "gpufleet-node-2", "gpufleet-node-3"]
HEAD = "gpufleet-head"
ALERTS = {
    "GpufleetVerificationFailed",
    "GpufleetRebootRequired",
    "GpufleetUncorrectedEccErrors",
    "GpufleetVerificationStale",
    "GpufleetVerificationMissing",
    "GpufleetNodeExporterDown",
    "GpufleetDcgmExporterDown",
    # the passive health checks' findings (issue 28)
    "GpufleetGpuXid",
    "GpufleetRowRemapPending",
    "GpufleetRowRemapFailure",
    "GpufleetNvlinkDown",
    "GpufleetNvlinkErrors",
    "GpufleetGpuThrottled",
    "GpufleetPcieDowntrained",
    # Slurm's health check (roles/slurm, issue 29)
    "GpufleetNodeDrainedByHealthCheck",
    # the fleet report's history (issue 29)
    "GpufleetLemonNode",
}
# Slurm's health check program writes its own metrics file (gpufleet-slurm-health.prom).
SLURM_HEALTH = REPO_ROOT / "roles" / "slurm" / "files" / "gpufleet_slurm_health.py"
# What tests/lab/inventory sets (the e2e contract).
LAB_SETTINGS = {
    "gpufleet_monitoring": True,
    "monitoring_scrape_interval": "5s",
    "monitoring_evaluation_interval": "5s",
    "monitoring_alert_for": "0s",
}
SHA256 = "0f" * 32
# DCGM switched on, with what it needs (validate.yml refuses it without the binary's URL and checksum).
# The URL names the exporter's release (DCGM 4, the default monitoring_dcgm_major).
EXPORTER_URL = "https://repo.example.com/dcgm-exporter/4.2.3-4.1.1/dcgm-exporter"
DCGM = {
    "monitoring_dcgm": True,
    "monitoring_dcgm_exporter_url": EXPORTER_URL,
    "monitoring_dcgm_exporter_checksum": SHA256,
    "monitoring_dcgm_version": "1:4.2.3-1",
}
DEFAULT_GROUPS = {"gpu_nodes": NODES, "monitoring_server": [HEAD]}


@pytest.fixture(scope="module")
def writer() -> Iterator[ModuleType]:
    module = load_script(METRICS_WRITER, "gpufleet_metrics_for_monitoring")
    yield module
    del sys.modules[module.__name__]


def slurm_health_metrics() -> set[str]:
    """The metric names Slurm's health check program writes (both of its states: drained by gpufleet, not)."""
    module = load_script(SLURM_HEALTH, "gpufleet_slurm_health_for_monitoring")
    try:
        text = module.metrics_text(False, "gpufleet: x: y", 0.0) + module.metrics_text(True, "", 0.0)
    finally:
        del sys.modules[module.__name__]
    return {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}


def emitted_names(writer: ModuleType) -> set[str]:
    """Every metric a writer emits: the checks' (metrics.py), the fleet report's history (fleet_report.py) and Slurm's
    health check program's."""
    return set(writer.METRICS) | set(fleet_report.HISTORY_METRICS) | slurm_health_metrics()


def fleet(groups: dict[str, list[str]], hostvars: dict[str, dict[str, Any]], targeted: str = "") -> list[role_run.Host]:
    """The hosts of ``groups`` (Debian 12, their ``hostvars``), in the inventory; ``targeted`` runs the play."""
    names = list(dict.fromkeys(h for hosts in groups.values() for h in hosts))
    return [
        role_run.Host(
            name,
            FAKE_FACTS["debian12"],
            hostvars.get(name, {}),
            tuple(group for group, hosts in groups.items() if name in hosts),
            targeted=name == targeted,
        )
        for name in names
    ]


_DOWNLOAD = role_run.role_task("monitoring", "dcgm.yml", "Download dcgm-exporter")
FILES = ["gpufleet-alerts.yml.j2", "node-exporter.default.j2", "prometheus.default.j2", "dcgm-exporter.service.j2"]
_TASKS = [role_run.import_role("monitoring")]
# What a case captures after validate.yml: "check" some role variables and the DCGM download's checksum, or one file.
_KINDS = {
    "check": [
        role_run.capture(
            {
                **role_run.names(
                    "__monitoring_prometheus_self_target",
                    "__monitoring_node_exporter_package",
                    "__monitoring_dcgm_packages",
                    "__monitoring_prometheus_defaults_file",
                    "__monitoring_rules_file",
                ),
                "dcgm_exporter_checksum": _DOWNLOAD["ansible.builtin.get_url"]["checksum"],
            },
            name="Capture role variables",
        )
    ],
    **{
        name: [role_run.capture({name: role_run.template("monitoring", name)}, name=f"Render {name}")] for name in FILES
    },
}
_cases: dict[str, dict[str, tuple[dict, dict]]] = {kind: {} for kind in _KINDS}
_case_outcomes: dict[tuple[str, str], role_run.Outcome] = {}


def _case_key(facts: dict, settings: dict) -> str:
    return repr((sorted(facts.items()), sorted(settings.items())))


def declare(kind: str, os: str | dict = "debian12", **overrides: Any) -> None:
    facts = FAKE_FACTS[os] if isinstance(os, str) else os
    _cases[kind].setdefault(_case_key(facts, overrides), (facts, overrides))


def _case(kind: str, os: str | dict = "debian12", **overrides: Any) -> role_run.Outcome:
    """validate.yml and the capture ``kind`` on a host of the lab-shaped inventory, ``overrides`` its variables.

    Every declared case of the kind runs with it, one extra ungrouped host
    each, beside the fleet (three GPU nodes and the head node, not in the
    play).
    """
    declare(kind, os, **overrides)
    facts = FAKE_FACTS[os] if isinstance(os, str) else os
    key = _case_key(facts, overrides)
    if (kind, key) not in _case_outcomes:
        pending = {k: case for k, case in _cases[kind].items() if (kind, k) not in _case_outcomes}
        names = {k: f"case-{n}" for n, k in enumerate(pending)}
        hosts = fleet(DEFAULT_GROUPS, {}) + [role_run.Host(names[k], f, o) for k, (f, o) in pending.items()]
        outcomes = role_run.run(hosts, _TASKS, _KINDS[kind])
        _case_outcomes.update({(kind, k): outcomes[names[k]] for k in pending})
    return _case_outcomes[(kind, key)]


def monitoring(os: str | dict = "debian12", **overrides: Any) -> role_run.Outcome:
    """The role on a host with ``overrides`` as its variables (``os``: its facts): what validate.yml set, or stopped
    with, and some of the role's variables."""
    return _case("check", os, **overrides)


def rejected(cfg: role_run.Outcome) -> list[str]:
    """The messages of tasks/validate.yml's checks that fail (what the role stops with)."""
    messages = list(cfg["__monitoring_invalid"])
    assert (cfg.failure is not None) is bool(messages), cfg.failure
    return messages


def render(name: str, os: str = "debian12", **overrides: Any) -> str:
    """roles/monitoring/templates/<name> (not prometheus.yml.j2) as the role renders it with ``overrides``."""
    cfg = _case(name, os, **overrides)
    assert cfg.failure is None, cfg.failure
    return cfg[name]


_fleets: dict[str, role_run.Outcome] = {}


def prometheus_config(
    hostvars: dict[str, dict[str, Any]] | None = None, groups: dict[str, list[str]] | None = None, **overrides: Any
) -> dict[str, Any]:
    """prometheus.yml as the role renders it on the head node (``overrides``: its variables) of a fleet of
    ``groups`` (three GPU nodes and the head node) with ``hostvars`` (one run per fleet)."""
    groups = groups if groups is not None else DEFAULT_GROUPS
    hostvars = {**(hostvars or {}), HEAD: {**(hostvars or {}).get(HEAD, {}), **overrides}}
    key = repr((sorted(groups.items()), sorted((h, sorted(v.items())) for h, v in hostvars.items())))
    if key not in _fleets:
        _fleets[key] = role_run.run(
            fleet(groups, hostvars, targeted=HEAD),
            _TASKS,
            [
                role_run.capture(
                    {"prometheus.yml.j2": role_run.template("monitoring", "prometheus.yml.j2")},
                    name="Render prometheus.yml",
                )
            ],
        )[HEAD]
    cfg = _fleets[key]
    assert cfg.failure is None, cfg.failure
    return yaml.safe_load(cfg["prometheus.yml.j2"])


def scrape_job(config: dict[str, Any], job: str) -> dict[str, dict[str, Any]]:
    """instance -> {"target", "labels"} of one job's static configs."""
    [scrape] = [s for s in config["scrape_configs"] if s["job_name"] == job]
    out = {}
    for static in scrape["static_configs"]:
        [target] = static["targets"]
        out[static["labels"]["instance"]] = {"target": target, "labels": static["labels"]}
    return out


def alert_rules(**kwargs: Any) -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(render("gpufleet-alerts.yml.j2", **kwargs))
    [group] = document["groups"]
    return {rule["alert"]: rule for rule in group["rules"]}


def defaults_args(text: str) -> list[str]:
    """The words of ARGS="..." in a Debian defaults file, as the systemd unit passes them."""
    [line] = [line for line in text.splitlines() if line.startswith("ARGS=")]
    return shlex.split(shlex.split(line[len("ARGS=") :])[0])


# --------------------------------------------------------------------------- Prometheus: scrape configuration


def test_every_node_is_scraped_by_its_inventory_name() -> None:
    config = prometheus_config(**LAB_SETTINGS)
    assert config["global"] == {"scrape_interval": "5s", "evaluation_interval": "5s"}
    assert config["rule_files"] == ["/etc/prometheus/gpufleet-alerts.yml"]
    node = scrape_job(config, "node")
    assert list(node) == [*NODES, HEAD]
    for host in NODES:
        assert node[host] == {"target": f"{host}:9100", "labels": {"instance": host, "node": host, "gpu_node": "true"}}
    assert node[HEAD]["labels"] == {"instance": HEAD, "node": HEAD, "gpu_node": "false"}
    assert scrape_job(config, "prometheus") == {
        HEAD: {"target": "localhost:9090", "labels": {"instance": HEAD, "node": HEAD}}
    }
    assert [s["job_name"] for s in config["scrape_configs"]] == ["prometheus", "node"]  # no DCGM unless switched on


def test_ansible_host_and_per_host_ports_are_scraped() -> None:
    hostvars = {
        "gpufleet-node-2": {"ansible_host": "10.1.0.12"},
        "gpufleet-node-3": {"ansible_host": "fd00::13"},
        "gpufleet-node-1": {"monitoring_node_exporter_port": 9200},
    }
    node = scrape_job(prometheus_config(hostvars=hostvars), "node")
    assert node["gpufleet-node-1"]["target"] == "gpufleet-node-1:9200"
    assert node["gpufleet-node-2"]["target"] == "10.1.0.12:9100"
    assert node["gpufleet-node-3"]["target"] == "[fd00::13]:9100"
    assert node["gpufleet-node-2"]["labels"]["instance"] == "gpufleet-node-2"  # the inventory name, not the address


def test_scrape_groups_and_hosts_in_several_groups() -> None:
    groups = {"gpu_nodes": NODES, "monitoring_server": [HEAD], "login": ["login-1", "gpufleet-node-1"]}
    node = scrape_job(
        prometheus_config(groups=groups, monitoring_scrape_groups=["gpu_nodes", "login", "monitoring_server"]), "node"
    )
    assert list(node) == [*NODES, "login-1", HEAD]  # each host once, in the groups' order
    assert node["login-1"]["labels"]["gpu_node"] == "false"


def test_prometheus_self_scrape_follows_its_listen_address() -> None:
    assert (
        monitoring(monitoring_prometheus_listen_address="127.0.0.1:9091")["__monitoring_prometheus_self_target"]
        == "127.0.0.1:9091"
    )
    assert (
        monitoring(monitoring_prometheus_listen_address=":9090")["__monitoring_prometheus_self_target"]
        == "localhost:9090"
    )
    assert (
        monitoring(monitoring_prometheus_listen_address="[::]:9090")["__monitoring_prometheus_self_target"]
        == "localhost:9090"
    )


def test_dcgm_exporter_is_scraped_on_gpu_nodes_with_gpus() -> None:
    hostvars = {
        "gpufleet-node-2": {"ansible_host": "10.1.0.12"},
        # DCGM's tasks found no GPU there in this run: not scraped.
        "gpufleet-node-3": {"__monitoring_gpu_count": 0},
    }
    config = prometheus_config(hostvars=hostvars, **DCGM)
    dcgm = scrape_job(config, "dcgm")
    assert dcgm == {
        "gpufleet-node-1": {
            "target": "gpufleet-node-1:9400",
            "labels": {"instance": "gpufleet-node-1", "node": "gpufleet-node-1", "gpu_node": "true"},
        },
        "gpufleet-node-2": {
            "target": "10.1.0.12:9400",
            "labels": {"instance": "gpufleet-node-2", "node": "gpufleet-node-2", "gpu_node": "true"},
        },
    }
    # A node's own monitoring_dcgm (host or group variable) wins over the server's.
    only_one = prometheus_config(hostvars={"gpufleet-node-1": {"monitoring_dcgm": True}})
    assert list(scrape_job(only_one, "dcgm")) == ["gpufleet-node-1"]


# --------------------------------------------------------------------------- node exporter and Prometheus options


NODE_EXPORTER = {
    "monitoring_textfile_dir": "/srv/textfile",
    "monitoring_node_exporter_address": "10.1.0.11",
    "monitoring_node_exporter_port": 9200,
    "monitoring_node_exporter_extra_args": ["--collector.systemd"],
}
PROMETHEUS = {
    "monitoring_prometheus_retention": "90d",
    "monitoring_prometheus_listen_address": "10.0.0.5:9090",
    "monitoring_prometheus_extra_args": ["--web.enable-lifecycle"],
}


def test_node_exporter_args_name_the_textfile_directory() -> None:
    args = defaults_args(render("node-exporter.default.j2"))
    assert args == ["--collector.textfile.directory=/var/lib/prometheus/node-exporter", "--web.listen-address=:9100"]
    args = defaults_args(render("node-exporter.default.j2", **NODE_EXPORTER))
    assert args == [
        "--collector.textfile.directory=/srv/textfile",
        "--web.listen-address=10.1.0.11:9200",
        "--collector.systemd",
    ]


def test_prometheus_args() -> None:
    args = defaults_args(render("prometheus.default.j2"))
    assert args == [
        "--config.file=/etc/prometheus/prometheus.yml",
        "--storage.tsdb.path=/var/lib/prometheus/metrics2/",
        "--storage.tsdb.retention.time=15d",
        "--web.listen-address=0.0.0.0:9090",
    ]
    args = defaults_args(render("prometheus.default.j2", **PROMETHEUS))
    assert args[2:] == [
        "--storage.tsdb.retention.time=90d",
        "--web.listen-address=10.0.0.5:9090",
        "--web.enable-lifecycle",
    ]


@pytest.mark.parametrize("os", sorted(FAKE_FACTS))
def test_every_supported_os_has_a_package_layout(os: str) -> None:
    config = monitoring(os)
    assert config["__monitoring_node_exporter_package"] == "prometheus-node-exporter"
    assert config["__monitoring_prometheus_defaults_file"] == "/etc/default/prometheus"
    assert rejected(config) == []


# --------------------------------------------------------------------------- alert rules


def test_alert_rules_with_the_defaults() -> None:
    rules = alert_rules()
    assert set(rules) == ALERTS
    for name, rule in rules.items():
        assert rule["for"] == "10m", name
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert "$labels.node" in rule["annotations"]["summary"], f"{name}: the summary names the node"
        assert "{{" not in rule["expr"], name
    assert rules["GpufleetVerificationFailed"]["expr"] == "gpufleet_verify_passed == 0"
    assert rules["GpufleetRebootRequired"]["expr"] == "gpufleet_reboot_required == 1"
    assert rules["GpufleetUncorrectedEccErrors"]["expr"] == "gpufleet_gpu_ecc_uncorrected_errors > 0"
    assert rules["GpufleetVerificationStale"]["expr"] == "time() - gpufleet_verify_timestamp_seconds > 93600"  # 26h
    assert rules["GpufleetNodeExporterDown"]["expr"] == 'up{job="node"} == 0'
    assert rules["GpufleetDcgmExporterDown"]["expr"] == 'up{job="dcgm"} == 0'
    assert rules["GpufleetGpuXid"]["expr"] == 'gpufleet_xid_events{verdict="fail"} > 0'
    assert rules["GpufleetRowRemapPending"]["expr"] == 'gpufleet_health_finding{signal="row_remap_pending"} == 1'
    assert rules["GpufleetRowRemapFailure"]["expr"] == 'gpufleet_health_finding{signal="row_remap_failure"} == 1'
    assert rules["GpufleetNvlinkDown"]["expr"] == 'gpufleet_health_finding{check="nvlink", verdict="fail"} == 1'
    assert rules["GpufleetNvlinkErrors"]["expr"] == 'gpufleet_health_finding{signal="nvlink_errors"} == 1'
    assert rules["GpufleetGpuThrottled"]["expr"] == 'gpufleet_health_finding{signal="clock_event", verdict="fail"} == 1'
    assert (
        rules["GpufleetPcieDowntrained"]["expr"] == 'gpufleet_health_finding{signal="pcie_width", verdict="fail"} == 1'
    )
    assert {name for name, rule in rules.items() if rule["labels"]["severity"] == "warning"} >= {
        "GpufleetRowRemapPending",
        "GpufleetNvlinkErrors",
    }
    assert {
        rules[n]["labels"]["severity"]
        for n in ("GpufleetVerificationFailed", "GpufleetUncorrectedEccErrors", "GpufleetNodeExporterDown")
    } == {"critical"}


def test_alert_rules_follow_the_settings() -> None:
    rules = alert_rules(**LAB_SETTINGS)
    assert {rule["for"] for rule in rules.values()} == {"0s"}
    stale = alert_rules(monitoring_verify_stale_after="1d12h30m")["GpufleetVerificationStale"]
    assert stale["expr"].endswith("> 131400")


def test_alert_annotations_are_prometheus_templates() -> None:
    """Jinja renders the role's settings and leaves Prometheus' own {{ $labels }} / {{ $value }} templates alone."""
    rules = alert_rules()
    assert (
        rules["GpufleetUncorrectedEccErrors"]["annotations"]["summary"]
        == "GPU {{ $labels.gpu }} of {{ $labels.node }} has {{ $value }} uncorrected ECC errors"
    )
    assert "{{ $value | humanizeDuration }}" in rules["GpufleetVerificationStale"]["annotations"]["description"]
    failed = rules["GpufleetVerificationFailed"]["annotations"]["description"]
    assert 'query (printf "gpufleet_check_status{status=\\"fail\\",instance=\\"%s\\"} == 1" $labels.instance)' in failed


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\bgpufleet_[a-z_]+\b", text))


def test_rules_use_only_metrics_the_writer_emits(writer: ModuleType) -> None:
    rendered = render("gpufleet-alerts.yml.j2")
    rules = yaml.safe_load(rendered)["groups"][0]["rules"]
    queries = [
        q
        for rule in rules
        for text in rule["annotations"].values()
        for q in re.findall(r'query \(printf "(.*?)"', text)
    ]
    assert queries, "the annotations query the failed checks"
    used = set().union(*(metric_names(rule["expr"]) for rule in rules), *(metric_names(q) for q in queries))
    assert used == {
        "gpufleet_verify_passed",
        "gpufleet_reboot_required",
        "gpufleet_gpu_ecc_uncorrected_errors",
        "gpufleet_verify_timestamp_seconds",
        "gpufleet_check_status",
        "gpufleet_xid_events",
        "gpufleet_health_finding",
        "gpufleet_slurm_drained",
        "gpufleet_repeat_offender",
    }
    assert used <= emitted_names(writer), used - emitted_names(writer)

    # ... and the writer really emits them, with the labels the rules read.
    report = {
        "verdict": "fail",
        "reboot_required": True,
        "started": "2024-01-01T00:00:00Z",
        "duration_s": 2.0,
        "host": "gpufleet-node-1",
        "versions": {},
        "gpu_count_pci": 1,
        "gpus": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "ecc_uncorrected": 2, "gemm_tflops": 700.0}
        ],
        "checks": [
            {"name": "driver_version", "verdict": "fail"},
            {
                "name": "xid",
                "verdict": "fail",
                "findings": [
                    {
                        "gpu": "PCI:0000:19:00",
                        "verdict": "fail",
                        "action": "drain: WORKFLOW_XID_48",
                        "evidence": "Xid 48",
                        "signal": "xid",
                        "action_class": "drain",
                        "code": 48,
                        "kind": "xid",
                        "count": 1,
                    }
                ],
            },
            {
                "name": "gpu_errors",
                "verdict": "warn",
                "findings": [
                    {
                        "gpu": "GPU 0 (00000000:53:00.0)",
                        "verdict": "warn",
                        "action": "reboot",
                        "evidence": "row remap pending",
                        "signal": "row_remap_pending",
                        "action_class": "reboot",
                    }
                ],
            },
        ],
    }
    history = fleet_report.history_metrics(
        {
            "history": {"rule": {"failures": 2, "runs": 3}},
            "repeat_offenders": [{"host": "gpufleet-node-1"}],
            "nodes": [{"host": "gpufleet-node-1", "recent_runs": {"failed": 2, "runs": 3, "window": 3}}],
        }
    )
    emitted = writer.metrics_text(report) + history["gpufleet-node-1"]
    assert 'gpufleet_repeat_offender{window="3",threshold="2"} 1' in emitted
    for name in used - slurm_health_metrics():
        assert re.search(rf"^{name}[{{ ]", emitted, re.MULTILINE), f"the writer emits no {name}"
    assert 'gpufleet_gpu_ecc_uncorrected_errors{gpu="0",model="NVIDIA H100 80GB HBM3",uuid="GPU-0"} 2' in emitted
    assert 'gpufleet_check_status{check="driver_version",status="fail"} 1' in emitted
    assert 'gpufleet_xid_events{kind="xid",code="48",device="PCI:0000:19:00",verdict="fail"} 1' in emitted
    # Slurm's health check program writes the one the drain alert reads, with its reason label.
    module = load_script(SLURM_HEALTH, "gpufleet_slurm_health_for_monitoring")
    try:
        assert 'gpufleet_slurm_drained{reason="gpufleet: a: b"} 1' in module.metrics_text(False, "gpufleet: a: b", 0.0)
    finally:
        del sys.modules[module.__name__]
    assert (
        'gpufleet_health_finding{check="gpu_errors",signal="row_remap_pending",subject="GPU 0 (00000000:53:00.0)",'
        'verdict="warn",action_class="reboot"} 1'
    ) in emitted
    labels_read = set(re.findall(r"\$labels\.([a-z_]+)", rendered)) | set(re.findall(r"\.Labels\.([a-z_]+)", rendered))
    assert labels_read == {
        "node",
        "instance",
        "gpu",
        "model",
        "uuid",
        "check",
        "kind",
        "code",
        "device",
        "subject",
        "signal",
        "reason",
        "window",
        "threshold",
    }  # reason: gpufleet_slurm_drained's (above)
    # the values the rules select on are the ones gpufleet_check gives (health.finding's signals, xid's verdicts)
    selected = set(re.findall(r'signal="([a-z_]+)"', rendered)) | set(re.findall(r'check="([a-z_]+)"', rendered))
    assert selected == {
        "row_remap_pending",
        "row_remap_failure",
        "nvlink_errors",
        "clock_event",
        "pcie_width",
        "nvlink",
    }
    health = (METRICS_WRITER.parent / "health.py").read_text()
    assert all(f'signal="{signal}"' in health for signal in selected - {"nvlink"}), "a signal the checks never give"


def test_rules_read_the_jobs_and_labels_prometheus_scrapes() -> None:
    rendered = render("gpufleet-alerts.yml.j2")
    config = prometheus_config(**DCGM)
    jobs = {scrape["job_name"] for scrape in config["scrape_configs"]}
    assert set(re.findall(r'job="([a-z]+)"', rendered)) == {"node", "dcgm"} <= jobs
    target_labels = {
        key for scrape in config["scrape_configs"] for static in scrape["static_configs"] for key in static["labels"]
    }
    assert {"node", "instance", "gpu_node"} <= target_labels and 'gpu_node="true"' in rendered


def test_promtool_tests_cover_every_alert(writer: ModuleType) -> None:
    tests = yaml.safe_load(RULES_TEST_FILE.read_text())
    assert tests["rule_files"] == [Path(monitoring()["__monitoring_rules_file"]).name]
    tested = {case["alertname"] for group in tests["tests"] for case in group["alert_rule_test"]}
    assert tested == ALERTS
    firing = {case["alertname"] for group in tests["tests"] for case in group["alert_rule_test"] if case["exp_alerts"]}
    assert firing == ALERTS, "each alert is shown firing once"
    series = {s["series"].split("{")[0] for group in tests["tests"] for s in group["input_series"]}
    assert series - {"up"} <= emitted_names(writer), series - {"up"} - emitted_names(writer)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed here (the e2e test runs it)")
@pytest.mark.parametrize("settings", [{}, LAB_SETTINGS], ids=["defaults", "lab"])
def test_promtool_passes_the_rendered_rules(tmp_path: Path, settings: dict[str, Any]) -> None:
    (tmp_path / "gpufleet-alerts.yml").write_text(render("gpufleet-alerts.yml.j2", **settings))
    shutil.copy(RULES_TEST_FILE, tmp_path)
    proc = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / RULES_TEST_FILE.name)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- DCGM


def test_dcgm_exporter_unit() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(render("dcgm-exporter.service.j2", **DCGM))
    assert unit["Unit"]["Requires"] == "nvidia-dcgm.service" and "nvidia-dcgm.service" in unit["Unit"]["After"]
    assert shlex.split(unit["Service"]["ExecStart"]) == [
        "/usr/local/bin/dcgm-exporter",
        "--address",
        ":9400",
        "--collectors",
        "/etc/dcgm-exporter/gpufleet-counters.csv",
        "--remote-hostengine-info",
        "localhost:5555",
    ]
    assert unit["Service"]["DynamicUser"] == "true" and unit["Service"]["Restart"] == "on-failure"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    custom = configparser.ConfigParser(interpolation=None)
    custom.read_string(render("dcgm-exporter.service.j2", monitoring_dcgm_exporter_port=9500))
    assert "--address :9500" in custom["Service"]["ExecStart"]


def test_dcgm_exporter_fields() -> None:
    fields = [
        line.split(",") for line in COUNTERS_FILE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert fields and all(len(f) == 3 for f in fields)
    assert all(re.fullmatch(r"DCGM_FI_(DEV|PROF)_[A-Z0-9_]+", f[0].strip()) for f in fields)
    assert {f[1].strip() for f in fields} <= {"gauge", "counter"}
    names = [f[0].strip() for f in fields]
    assert len(names) == len(set(names))
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"} <= set(names)


def test_dcgm_comes_from_the_cuda_roles_repository() -> None:
    """No second NVIDIA source: the DCGM tasks run the cuda role's public entry point `repository` (with its spec)."""
    tasks = load_trusted(ROLE / "tasks" / "dcgm.yml")
    [block] = [t for t in tasks if "block" in t]
    included = [t["ansible.builtin.include_role"] for t in block["block"] if "ansible.builtin.include_role" in t]
    assert included == [{"name": "cuda", "tasks_from": "repository"}]
    cuda_specs = yaml.safe_load((ROLE.parent / "cuda" / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert cuda_specs["repository"]["options"] == cuda_specs["main"]["options"]
    assert not list((ROLE / "templates").glob("*.sources.j2"))
    download = next(t for t in block["block"] if "ansible.builtin.get_url" in t)["ansible.builtin.get_url"]
    assert download == _DOWNLOAD["ansible.builtin.get_url"]
    # The task's checksum, templated on a host with the setting in capitals and with its prefix.
    assert (
        monitoring(monitoring_dcgm_exporter_checksum="SHA256:" + SHA256.upper())["dcgm_exporter_checksum"]
        == "sha256:" + SHA256
    )


# --------------------------------------------------------------------------- validation


def test_defaults_and_lab_settings_are_accepted() -> None:
    assert rejected(monitoring()) == []
    assert rejected(monitoring(**LAB_SETTINGS)) == []
    assert rejected(monitoring(**DCGM)) == []


WRONG = [
    ({"monitoring_textfile_dir": "var/lib/node-exporter"}, "monitoring_textfile_dir"),
    ({"monitoring_node_exporter_port": 70000}, "monitoring_node_exporter_port"),
    ({"monitoring_node_exporter_address": "10.0.0.1:9100"}, "monitoring_node_exporter_address"),
    ({"monitoring_prometheus_listen_address": "9090"}, "monitoring_prometheus_listen_address"),
    ({"monitoring_server_group": "prometheus"}, "monitoring_server_group"),
    ({"monitoring_scrape_groups": ["gpu_nodes", "gpu_node"]}, "monitoring_scrape_groups"),
    ({"monitoring_scrape_interval": "5 seconds"}, "monitoring_scrape_interval"),
    ({"monitoring_scrape_interval": "0s"}, "monitoring_scrape_interval"),
    ({"monitoring_evaluation_interval": "1.5m"}, "monitoring_evaluation_interval"),
    ({"monitoring_prometheus_retention": "forever"}, "monitoring_prometheus_retention"),
    ({"monitoring_alert_for": "10"}, "monitoring_alert_for"),
    ({"monitoring_verify_stale_after": "0h"}, "monitoring_verify_stale_after"),
    (
        {"monitoring_node_exporter_extra_args": ["--collector.textfile.directory=/tmp x"]},
        "monitoring_node_exporter_extra_args",
    ),
    ({"monitoring_prometheus_extra_args": ['--web.external-url="$HOST"']}, "monitoring_prometheus_extra_args"),
    ({"monitoring_dcgm": True, "monitoring_dcgm_exporter_checksum": SHA256}, "monitoring_dcgm_exporter_url"),
    ({"monitoring_dcgm": True, "monitoring_dcgm_exporter_url": EXPORTER_URL}, "monitoring_dcgm_exporter_checksum"),
    (
        {
            "monitoring_dcgm": True,
            "monitoring_dcgm_exporter_url": "ftp://repo/dcgm-exporter",
            "monitoring_dcgm_exporter_checksum": SHA256,
        },
        "monitoring_dcgm_exporter_url",
    ),
    ({"monitoring_dcgm_version": "latest"}, "monitoring_dcgm_version"),
    ({"monitoring_dcgm_exporter_port": 9100}, "monitoring_dcgm_exporter_port"),
    # DCGM 3 and DCGM 4 are two lines (datacenter-gpu-manager 1:3.3.x; datacenter-gpu-manager-4-*, whose -core package
    # Conflicts: datacenter-gpu-manager, github.com/NVIDIA/DCGM cmake/packaging.cmake): the settings keep to one.
    ({"monitoring_dcgm_version": "1:3.3.9"}, "monitoring_dcgm_version"),
    ({"monitoring_dcgm_major": 3, "monitoring_dcgm_version": "1:4.2.3-1"}, "monitoring_dcgm_version"),
    ({"monitoring_dcgm_packages": ["datacenter-gpu-manager"]}, "monitoring_dcgm_packages"),
    (
        {"monitoring_dcgm_major": 3, "monitoring_dcgm_packages": ["datacenter-gpu-manager-4-core"]},
        "monitoring_dcgm_packages",
    ),
    # The exporter's release: named, and built for the chosen DCGM major (the part of the tag before the dash).
    (
        {**DCGM, "monitoring_dcgm_exporter_url": "https://repo.example.com/dcgm-exporter"},
        "monitoring_dcgm_exporter_version",
    ),
    ({**DCGM, "monitoring_dcgm_exporter_version": "4.2.3"}, "monitoring_dcgm_exporter_version"),
    ({**DCGM, "monitoring_dcgm_exporter_version": "3.3.9-3.6.1"}, "monitoring_dcgm_exporter_version"),
    (
        {**DCGM, "monitoring_dcgm_exporter_url": "https://repo.example.com/dcgm-exporter/3.3.9-3.6.1/dcgm-exporter"},
        "monitoring_dcgm_exporter_url",
    ),
]
WRONG_SETTINGS = [overrides for overrides, _setting in WRONG]


@pytest.mark.parametrize("overrides, variable", WRONG, ids=lambda v: v if isinstance(v, str) else None)
def test_wrong_settings_are_named(overrides: dict[str, Any], variable: str) -> None:
    messages = rejected(monitoring(**overrides))
    assert len(messages) == 1, messages
    assert messages[0].startswith(variable + " "), messages[0]


def test_an_exporter_of_the_other_dcgm_major_is_refused_with_the_fix() -> None:
    [message] = rejected(monitoring(**DCGM, monitoring_dcgm_exporter_version="3.3.9-3.6.1"))
    assert message == (
        "monitoring_dcgm_exporter_version 3.3.9-3.6.1 is a dcgm-exporter built for DCGM 3.3.9, but "
        "monitoring_dcgm_major is 4: use a dcgm-exporter built for DCGM 4 (its release 4.x.y-...), or set "
        "monitoring_dcgm_major: 3"
    )
    url = "https://repo.example.com/dcgm-exporter/3.3.9-3.6.1/dcgm-exporter"
    [message] = rejected(monitoring(**{**DCGM, "monitoring_dcgm_exporter_url": url}))
    assert message.startswith(
        f"monitoring_dcgm_exporter_url {url} names dcgm-exporter 3.3.9-3.6.1 built for DCGM 3.3.9, "
        "but monitoring_dcgm_major is 4"
    )


DCGM_3 = {
    **DCGM,
    "monitoring_dcgm_major": 3,
    "monitoring_dcgm_version": "1:3.3.9",
    "monitoring_dcgm_exporter_version": "3.3.9-3.6.1",
}


def test_dcgm_3_with_a_dcgm_3_exporter_is_accepted() -> None:
    assert rejected(monitoring(**DCGM_3)) == []


# The packages of each line: DCGM 3 is datacenter-gpu-manager (NVIDIA's repository: "Package: datacenter-gpu-manager
# Version: 1:3.3.6", developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/Packages); DCGM 4 is
# datacenter-gpu-manager-4-core plus -cuda11/-cuda12/-cuda13 per CUDA user-mode driver major
# (github.com/NVIDIA/DCGM cmake/packaging.cmake: CPACK_DEBIAN_CORE_PACKAGE_NAME "${CPACK_PACKAGE_NAME}-core",
# CPACK_DEBIAN_CUDA12_PACKAGE_NAME "${CPACK_PACKAGE_NAME}-cuda12"; NVIDIA's install guide:
# apt-get install --install-recommends datacenter-gpu-manager-4-cuda<CUDA major>).
@pytest.mark.parametrize(
    "settings, packages",
    [
        ({}, ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"]),
        ({"monitoring_dcgm_major": 3}, ["datacenter-gpu-manager"]),
        ({"monitoring_dcgm_packages": ["datacenter-gpu-manager-4-cuda-all"]}, ["datacenter-gpu-manager-4-cuda-all"]),
    ],
)
def test_dcgm_packages_follow_the_major(settings: dict[str, Any], packages: list[str]) -> None:
    assert monitoring(**settings)["__monitoring_dcgm_packages"] == packages


def test_dcgm_switched_on_without_its_binary_names_both() -> None:
    messages = rejected(monitoring(monitoring_dcgm=True))
    assert [m.split(" ")[0] for m in messages] == ["monitoring_dcgm_exporter_url", "monitoring_dcgm_exporter_checksum"]


ROCKY = {**FAKE_FACTS["debian12"], "distribution": "Rocky", "os_family": "RedHat"}


def test_unknown_os_is_rejected() -> None:
    assert rejected(monitoring(ROCKY))[0].startswith("monitoring has no package layout for Rocky")


# --------------------------------------------------------------------------- gpu_verify's metrics file


# gpu_verify's validate.yml on a host of its own, then its metrics file setting and the command line of check.yml's
# health checks, templated in the same play (payload_files as the payload role's locate publishes it).
_CHECKS = role_run.role_task("gpu_verify", "check.yml", "Run the health checks")
GPU_VERIFY_RUNS = role_run.Batch(
    FAKE_FACTS,
    [role_run.import_role("gpu_verify")],
    after=[
        role_run.capture(
            {
                **role_run.names("gpu_verify_metrics_file", "__gpu_verify_cuda", "__gpu_verify_check_script"),
                "checks_cmd": _CHECKS["ansible.builtin.command"]["cmd"],
            },
            vars=_CHECKS.get("vars"),
            name="Template the metrics file and the health checks' command line",
        )
    ],
)
PAYLOAD_LOCATED = {"payload_files": {"check": "/x/gpufleet_check.pyz"}}


def gpu_verify(**settings: Any) -> role_run.Outcome:
    return GPU_VERIFY_RUNS.get("debian12", **PAYLOAD_LOCATED, **settings)


METRICS_FILES = [
    ({}, ""),
    ({"gpufleet_monitoring": False}, ""),
    ({"gpufleet_monitoring": True}, "/var/lib/prometheus/node-exporter/gpufleet.prom"),
    ({"gpufleet_monitoring": True, "monitoring_textfile_dir": "/srv/textfile"}, "/srv/textfile/gpufleet.prom"),
]


@pytest.mark.parametrize("overrides, expected", METRICS_FILES)
def test_gpu_verify_metrics_file_follows_gpufleet_monitoring(overrides: dict[str, Any], expected: str) -> None:
    assert gpu_verify(**overrides)["gpu_verify_metrics_file"] == expected


def test_gpu_verify_passes_the_metrics_file_to_the_checks() -> None:
    for monitoring_on, expected in (
        (True, "--metrics-file /var/lib/prometheus/node-exporter/gpufleet.prom"),
        (False, None),
    ):
        cfg = gpu_verify(gpufleet_monitoring=monitoring_on)
        assert cfg["__gpu_verify_cuda"] == "12.1"
        assert cfg["__gpu_verify_check_script"] == "/x/gpufleet_check.pyz"
        words = shlex.split(str(cfg["checks_cmd"]))
        assert words[:2] == ["sh", "-c"] and words[3:7] == [
            "gpufleet-check",
            "/opt/gpufleet/venv/bin/python",
            "/usr/bin/python3",
            "--json",
        ]
        assert "--expect-cuda 12.1" in " ".join(words)
        if expected:
            assert expected in " ".join(words)
        else:
            assert "--metrics-file" not in words


# The matrix's bundled builds of torch's own cuDNN/NCCL (the cu121 wheels' Requires-Dist nvidia-cudnn-cu12 /
# nvidia-nccl-cu12 pins: PyPI's metadata of torch 2.3.1; pytorch's .github/scripts/generate_binary_build_matrix.py
# for 2.5.x cu121) reach the checks; a CPU build passes neither: the checks say it has no CUDA. The wheel source does
# not change them: PyPI's torch 2.3.1 (the lab's; https://pypi.org/project/torch/2.3.1/, Requires-Dist
# nvidia-cudnn-cu12==8.9.2.26, nvidia-nccl-cu12==2.20.5) is the same cu121 build as download.pytorch.org's 2.3.1+cu121.
TORCH_LIBRARY_CASES = [
    ({}, "--expect-torch-cudnn 9.1.0.70 --expect-torch-nccl 2.21.5"),
    ({"pytorch_release": "2.3.1"}, "--expect-torch-cudnn 8.9.2.26 --expect-torch-nccl 2.20.5"),
    (
        {"pytorch_release": "2.3.1", "pytorch_wheel_source": "pypi"},
        "--expect-cuda 12.1 --expect-torch-cudnn 8.9.2.26 --expect-torch-nccl 2.20.5",
    ),
    ({"pytorch_release": "2.3.1", "pytorch_variant": "cpu"}, None),
]
for _settings, _ in TORCH_LIBRARY_CASES:
    GPU_VERIFY_RUNS.declare("debian12", **PAYLOAD_LOCATED, **_settings)


@pytest.mark.parametrize("settings, expected", TORCH_LIBRARY_CASES)
def test_gpu_verify_passes_torch_own_libraries_from_the_matrix(settings: dict[str, Any], expected: str | None) -> None:
    words = " ".join(shlex.split(str(gpu_verify(**settings)["checks_cmd"])))
    if expected:
        assert expected in words
    else:
        assert (
            "--expect-torch-cudnn" not in words and "--expect-torch-nccl" not in words and "--expect-cuda" not in words
        )


METRICS_FILE_VALUES = [
    ("", True),
    ("/var/lib/prometheus/node-exporter/gpufleet.prom", True),
    ("/srv/x/gpufleet.prom", True),
    ("gpufleet.prom", False),
    ("/var/lib/prometheus/node-exporter/gpufleet.txt", False),
    ("/var/lib/prometheus/node-exporter/", False),
    ("/var/lib/prometheus/node-exporter/.prom", False),
]


@pytest.mark.parametrize("value, ok", METRICS_FILE_VALUES)
def test_gpu_verify_validates_the_metrics_file(value: str, ok: bool) -> None:
    cfg = gpu_verify(gpu_verify_metrics_file=value)
    if ok:
        assert cfg.failure is None
    else:
        assert cfg.failure is not None and cfg.failure.startswith(f"gpu_verify settings rejected on {cfg.host}: [1] ")
        assert f"[1] gpu_verify_metrics_file '{value}' is not an absolute path ending in .prom" in " ".join(
            cfg.failure.split()
        )
        assert "[2]" not in cfg.failure, cfg.failure


# --------------------------------------------------------------------------- the cases, known up front

for _settings in [
    {},
    LAB_SETTINGS,
    DCGM,
    {"monitoring_dcgm": True},
    {"monitoring_dcgm_exporter_checksum": "SHA256:" + SHA256.upper()},
    *({"monitoring_prometheus_listen_address": _address} for _address in ("127.0.0.1:9091", ":9090", "[::]:9090")),
    *WRONG_SETTINGS,
    DCGM_3,
    {**DCGM, "monitoring_dcgm_exporter_version": "3.3.9-3.6.1"},
    {"monitoring_dcgm_major": 3},
    {"monitoring_dcgm_packages": ["datacenter-gpu-manager-4-cuda-all"]},
]:
    declare("check", **_settings)
for _os in sorted(FAKE_FACTS):
    declare("check", _os)
declare("check", ROCKY)
for _name, _settings in [
    ("gpufleet-alerts.yml.j2", {}),
    ("gpufleet-alerts.yml.j2", LAB_SETTINGS),
    ("gpufleet-alerts.yml.j2", {"monitoring_verify_stale_after": "1d12h30m"}),
    ("node-exporter.default.j2", {}),
    ("node-exporter.default.j2", NODE_EXPORTER),
    ("prometheus.default.j2", {}),
    ("prometheus.default.j2", PROMETHEUS),
    ("dcgm-exporter.service.j2", DCGM),
    ("dcgm-exporter.service.j2", {"monitoring_dcgm_exporter_port": 9500}),
]:
    declare(_name, **_settings)
for _overrides, _ in METRICS_FILES:
    GPU_VERIFY_RUNS.declare("debian12", **PAYLOAD_LOCATED, **_overrides)
for _value, _ in METRICS_FILE_VALUES:
    GPU_VERIFY_RUNS.declare("debian12", **PAYLOAD_LOCATED, gpu_verify_metrics_file=_value)
