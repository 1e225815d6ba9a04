"""roles/monitoring without a host: the configuration it renders for a 3-node fleet, and what it rejects.

As tests/unit/conftest.py does for nvidia_driver, the role's own files are
read: its defaults, vars (vars/main.yml and the OS layout validate.yml's
first_found picks), templates and the validation task, rendered with
ansible-core's Templar over a fake inventory (groups, hostvars) of three GPU
nodes and a head node (the lab's shape). Nothing is copied from the role.

The alert rules and the metrics writer (roles/payload/files/gpufleet_check/metrics.py) are
cross-checked: every gpufleet_* name the rules (and the promtool tests of the
rules) use is a metric the writer emits, so neither can drift alone.
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
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from conftest import ANSIBLE_MANAGED, FAKE_FACTS, load_script, load_trusted, render_role_template

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLE = REPO_ROOT / "roles" / "monitoring"
GPU_VERIFY = REPO_ROOT / "roles" / "gpu_verify"
# Standard library only and nothing else of its package: it loads on its own.
METRICS_WRITER = REPO_ROOT / "roles" / "payload" / "files" / "gpufleet_check" / "metrics.py"
RULES_TEST_FILE = ROLE / "files" / "gpufleet-alerts.test.yml"
COUNTERS_FILE = ROLE / "files" / "dcgm-exporter-counters.csv"
COMPATIBILITY_FILE = REPO_ROOT / "files" / "compatibility.yml"

NODES = ["gpufleet-node-1", "gpufleet-node-2", "gpufleet-node-3"]
HEAD = "gpufleet-head"
ALERTS = {"GpufleetVerificationFailed", "GpufleetRebootRequired", "GpufleetUncorrectedEccErrors",
          "GpufleetVerificationStale", "GpufleetVerificationMissing", "GpufleetNodeExporterDown",
          "GpufleetDcgmExporterDown"}
# What tests/lab/inventory sets (the e2e contract).
LAB_SETTINGS = {"gpufleet_monitoring": True, "monitoring_scrape_interval": "5s", "monitoring_evaluation_interval": "5s",
                "monitoring_alert_for": "0s"}
SHA256 = "0f" * 32

_loader = DataLoader()


@pytest.fixture(scope="module")
def writer() -> Iterator[ModuleType]:
    module = load_script(METRICS_WRITER, "gpufleet_metrics_for_monitoring")
    yield module
    del sys.modules[module.__name__]


def _os_layout(facts: dict[str, Any]) -> dict[str, Any]:
    """The vars file validate.yml's first_found picks (<Distribution>-<major>, <Distribution>, <os_family>)."""
    for name in (f"{facts['distribution']}-{facts['distribution_major_version']}.yml", f"{facts['distribution']}.yml",
                 f"{facts['os_family']}.yml"):
        if (ROLE / "vars" / name).is_file():
            return load_trusted(ROLE / "vars" / name)
    raise FileNotFoundError(f"no layout in {ROLE / 'vars'} for {facts['distribution']}")


class Monitoring:
    """The role's variables on one host of a fake inventory, and its rendered templates."""

    def __init__(self, host: str = HEAD, os: str = "debian12", hostvars: dict[str, dict[str, Any]] | None = None,
                 groups: dict[str, list[str]] | None = None, **overrides: Any) -> None:
        groups = groups if groups is not None else {"gpu_nodes": list(NODES), "monitoring_server": [HEAD]}
        groups = {"all": sorted({h for hosts in groups.values() for h in hosts}), "ungrouped": [], **groups}
        hostvars = {h: {"inventory_hostname": h, **(hostvars or {}).get(h, {})} for h in groups["all"]}
        facts = FAKE_FACTS[os]
        self.variables: dict[str, Any] = {}
        self.variables.update(load_trusted(ROLE / "defaults" / "main.yml"))
        self.variables.update(load_trusted(ROLE / "vars" / "main.yml"))
        self.variables.update(_os_layout(facts))
        self.variables.update(ansible_facts=dict(facts), inventory_hostname=host, role_path=str(ROLE),
                              ansible_managed=ANSIBLE_MANAGED, groups=groups, hostvars=hostvars)
        self.variables.update(hostvars[host])
        self.variables.update(overrides)

    def templar(self, extra: dict[str, Any] | None = None) -> Templar:
        return Templar(loader=_loader, variables={**self.variables, **(extra or {})})

    def __getitem__(self, name: str) -> Any:
        return self.templar().template(self.variables[name])

    def render(self, template_name: str) -> str:
        """roles/monitoring/templates/<name> as the template action renders it (trim_blocks, no lstrip)."""
        return render_role_template(ROLE, template_name, self.variables)

    def rejected(self) -> list[str]:
        """The messages of tasks/validate.yml's checks that fail (what the role stops with)."""
        [task] = [t for t in load_trusted(ROLE / "tasks" / "validate.yml") if "settings that are wrong" in t.get("name", "")]
        templar = self.templar(task.get("vars"))
        return list(templar.template(task["ansible.builtin.set_fact"]["__monitoring_invalid"]))


def prometheus_config(**kwargs: Any) -> dict[str, Any]:
    return yaml.safe_load(Monitoring(**kwargs).render("prometheus.yml.j2"))


def scrape_job(config: dict[str, Any], job: str) -> dict[str, dict[str, Any]]:
    """instance -> {"target", "labels"} of one job's static configs."""
    [scrape] = [s for s in config["scrape_configs"] if s["job_name"] == job]
    out = {}
    for static in scrape["static_configs"]:
        [target] = static["targets"]
        out[static["labels"]["instance"]] = {"target": target, "labels": static["labels"]}
    return out


def alert_rules(**kwargs: Any) -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(Monitoring(**kwargs).render("gpufleet-alerts.yml.j2"))
    [group] = document["groups"]
    return {rule["alert"]: rule for rule in group["rules"]}


def defaults_args(text: str) -> list[str]:
    """The words of ARGS="..." in a Debian defaults file, as the systemd unit passes them."""
    [line] = [line for line in text.splitlines() if line.startswith("ARGS=")]
    return shlex.split(shlex.split(line[len("ARGS="):])[0])


# --------------------------------------------------------------------------- Prometheus: scrape configuration


def test_every_node_is_scraped_by_its_inventory_name() -> None:
    config = prometheus_config(**LAB_SETTINGS)
    assert config["global"] == {"scrape_interval": "5s", "evaluation_interval": "5s"}
    assert config["rule_files"] == ["/etc/prometheus/gpufleet-alerts.yml"]
    node = scrape_job(config, "node")
    assert list(node) == [*NODES, HEAD]
    for host in NODES:
        assert node[host] == {"target": f"{host}:9100",
                              "labels": {"instance": host, "node": host, "gpu_node": "true"}}
    assert node[HEAD]["labels"] == {"instance": HEAD, "node": HEAD, "gpu_node": "false"}
    assert scrape_job(config, "prometheus") == {HEAD: {"target": "localhost:9090", "labels": {"instance": HEAD, "node": HEAD}}}
    assert [s["job_name"] for s in config["scrape_configs"]] == ["prometheus", "node"]  # no DCGM unless switched on


def test_ansible_host_and_per_host_ports_are_scraped() -> None:
    hostvars = {"gpufleet-node-2": {"ansible_host": "10.1.0.12"}, "gpufleet-node-3": {"ansible_host": "fd00::13"},
                "gpufleet-node-1": {"monitoring_node_exporter_port": 9200}}
    node = scrape_job(prometheus_config(hostvars=hostvars), "node")
    assert node["gpufleet-node-1"]["target"] == "gpufleet-node-1:9200"
    assert node["gpufleet-node-2"]["target"] == "10.1.0.12:9100"
    assert node["gpufleet-node-3"]["target"] == "[fd00::13]:9100"
    assert node["gpufleet-node-2"]["labels"]["instance"] == "gpufleet-node-2"  # the inventory name, not the address


def test_scrape_groups_and_hosts_in_several_groups() -> None:
    groups = {"gpu_nodes": NODES, "monitoring_server": [HEAD], "login": ["login-1", "gpufleet-node-1"]}
    node = scrape_job(prometheus_config(groups=groups, monitoring_scrape_groups=["gpu_nodes", "login", "monitoring_server"]),
                      "node")
    assert list(node) == [*NODES, "login-1", HEAD]  # each host once, in the groups' order
    assert node["login-1"]["labels"]["gpu_node"] == "false"


def test_prometheus_self_scrape_follows_its_listen_address() -> None:
    assert Monitoring(monitoring_prometheus_listen_address="127.0.0.1:9091")["__monitoring_prometheus_self_target"] \
        == "127.0.0.1:9091"
    assert Monitoring(monitoring_prometheus_listen_address=":9090")["__monitoring_prometheus_self_target"] == "localhost:9090"
    assert Monitoring(monitoring_prometheus_listen_address="[::]:9090")["__monitoring_prometheus_self_target"] \
        == "localhost:9090"


def test_dcgm_exporter_is_scraped_on_gpu_nodes_with_gpus() -> None:
    hostvars = {"gpufleet-node-2": {"ansible_host": "10.1.0.12"},
                # DCGM's tasks found no GPU there in this run: not scraped.
                "gpufleet-node-3": {"__monitoring_gpu_count": 0}}
    config = prometheus_config(hostvars=hostvars, monitoring_dcgm=True)
    dcgm = scrape_job(config, "dcgm")
    assert dcgm == {"gpufleet-node-1": {"target": "gpufleet-node-1:9400",
                                        "labels": {"instance": "gpufleet-node-1", "node": "gpufleet-node-1", "gpu_node": "true"}},
                    "gpufleet-node-2": {"target": "10.1.0.12:9400",
                                        "labels": {"instance": "gpufleet-node-2", "node": "gpufleet-node-2", "gpu_node": "true"}}}
    # A node's own monitoring_dcgm (host or group variable) wins over the server's.
    only_one = prometheus_config(hostvars={"gpufleet-node-1": {"monitoring_dcgm": True}})
    assert list(scrape_job(only_one, "dcgm")) == ["gpufleet-node-1"]


# --------------------------------------------------------------------------- node exporter and Prometheus options


def test_node_exporter_args_name_the_textfile_directory() -> None:
    args = defaults_args(Monitoring(host="gpufleet-node-1").render("node-exporter.default.j2"))
    assert args == ["--collector.textfile.directory=/var/lib/prometheus/node-exporter", "--web.listen-address=:9100"]
    args = defaults_args(Monitoring(host="gpufleet-node-1", monitoring_textfile_dir="/srv/textfile",
                                    monitoring_node_exporter_address="10.1.0.11", monitoring_node_exporter_port=9200,
                                    monitoring_node_exporter_extra_args=["--collector.systemd"])
                         .render("node-exporter.default.j2"))
    assert args == ["--collector.textfile.directory=/srv/textfile", "--web.listen-address=10.1.0.11:9200",
                    "--collector.systemd"]


def test_prometheus_args() -> None:
    args = defaults_args(Monitoring().render("prometheus.default.j2"))
    assert args == ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/var/lib/prometheus/metrics2/",
                    "--storage.tsdb.retention.time=15d", "--web.listen-address=0.0.0.0:9090"]
    args = defaults_args(Monitoring(monitoring_prometheus_retention="90d", monitoring_prometheus_listen_address="10.0.0.5:9090",
                                    monitoring_prometheus_extra_args=["--web.enable-lifecycle"]).render("prometheus.default.j2"))
    assert args[2:] == ["--storage.tsdb.retention.time=90d", "--web.listen-address=10.0.0.5:9090", "--web.enable-lifecycle"]


@pytest.mark.parametrize("os", sorted(FAKE_FACTS))
def test_every_supported_os_has_a_package_layout(os: str) -> None:
    config = Monitoring(os=os)
    assert config["__monitoring_node_exporter_package"] == "prometheus-node-exporter"
    assert config["__monitoring_prometheus_defaults_file"] == "/etc/default/prometheus"
    assert config.rejected() == []


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
    assert {rules[n]["labels"]["severity"] for n in ("GpufleetVerificationFailed", "GpufleetUncorrectedEccErrors",
                                                     "GpufleetNodeExporterDown")} == {"critical"}


def test_alert_rules_follow_the_settings() -> None:
    rules = alert_rules(**LAB_SETTINGS)
    assert {rule["for"] for rule in rules.values()} == {"0s"}
    stale = alert_rules(monitoring_verify_stale_after="1d12h30m")["GpufleetVerificationStale"]
    assert stale["expr"].endswith("> 131400")


def test_alert_annotations_are_prometheus_templates() -> None:
    """Jinja renders the role's settings and leaves Prometheus' own {{ $labels }} / {{ $value }} templates alone."""
    rules = alert_rules()
    assert rules["GpufleetUncorrectedEccErrors"]["annotations"]["summary"] \
        == "GPU {{ $labels.gpu }} of {{ $labels.node }} has {{ $value }} uncorrected ECC errors"
    assert "{{ $value | humanizeDuration }}" in rules["GpufleetVerificationStale"]["annotations"]["description"]
    failed = rules["GpufleetVerificationFailed"]["annotations"]["description"]
    assert 'query (printf "gpufleet_check_status{status=\\"fail\\",instance=\\"%s\\"} == 1" $labels.instance)' in failed


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\bgpufleet_[a-z_]+\b", text))


def test_rules_use_only_metrics_the_writer_emits(writer: ModuleType) -> None:
    rendered = Monitoring().render("gpufleet-alerts.yml.j2")
    rules = yaml.safe_load(rendered)["groups"][0]["rules"]
    queries = [q for rule in rules for text in rule["annotations"].values() for q in re.findall(r'query \(printf "(.*?)"', text)]
    assert queries, "the annotations query the failed checks"
    used = set().union(*(metric_names(rule["expr"]) for rule in rules), *(metric_names(q) for q in queries))
    assert used == {"gpufleet_verify_passed", "gpufleet_reboot_required", "gpufleet_gpu_ecc_uncorrected_errors",
                    "gpufleet_verify_timestamp_seconds", "gpufleet_check_status"}
    assert used <= set(writer.METRICS), used - set(writer.METRICS)

    # ... and the writer really emits them, with the labels the rules read.
    report = {"verdict": "fail", "reboot_required": True, "started": "2024-01-01T00:00:00Z", "duration_s": 2.0,
              "host": "gpufleet-node-1", "versions": {}, "gpu_count_pci": 1,
              "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "ecc_uncorrected": 2,
                        "gemm_tflops": 700.0}],
              "checks": [{"name": "driver_version", "verdict": "fail"}]}
    emitted = writer.metrics_text(report)
    for name in used:
        assert re.search(rf"^{name}[{{ ]", emitted, re.MULTILINE), f"the writer emits no {name}"
    assert 'gpufleet_gpu_ecc_uncorrected_errors{gpu="0",model="NVIDIA H100 80GB HBM3",uuid="GPU-0"} 2' in emitted
    assert 'gpufleet_check_status{check="driver_version",status="fail"} 1' in emitted
    labels_read = set(re.findall(r"\$labels\.([a-z_]+)", rendered)) | set(re.findall(r"\.Labels\.([a-z_]+)", rendered))
    assert labels_read == {"node", "instance", "gpu", "model", "uuid", "check"}


def test_rules_read_the_jobs_and_labels_prometheus_scrapes() -> None:
    rendered = Monitoring().render("gpufleet-alerts.yml.j2")
    config = prometheus_config(monitoring_dcgm=True)
    jobs = {scrape["job_name"] for scrape in config["scrape_configs"]}
    assert set(re.findall(r'job="([a-z]+)"', rendered)) == {"node", "dcgm"} <= jobs
    target_labels = {key for scrape in config["scrape_configs"] for static in scrape["static_configs"] for key in static["labels"]}
    assert {"node", "instance", "gpu_node"} <= target_labels and 'gpu_node="true"' in rendered


def test_promtool_tests_cover_every_alert(writer: ModuleType) -> None:
    tests = yaml.safe_load(RULES_TEST_FILE.read_text())
    assert tests["rule_files"] == [Path(Monitoring()["__monitoring_rules_file"]).name]
    tested = {case["alertname"] for group in tests["tests"] for case in group["alert_rule_test"]}
    assert tested == ALERTS
    firing = {case["alertname"] for group in tests["tests"] for case in group["alert_rule_test"] if case["exp_alerts"]}
    assert firing == ALERTS, "each alert is shown firing once"
    series = {s["series"].split("{")[0] for group in tests["tests"] for s in group["input_series"]}
    assert series - {"up"} <= set(writer.METRICS), series - {"up"} - set(writer.METRICS)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed here (the e2e test runs it)")
@pytest.mark.parametrize("settings", [{}, LAB_SETTINGS], ids=["defaults", "lab"])
def test_promtool_passes_the_rendered_rules(tmp_path: Path, settings: dict[str, Any]) -> None:
    (tmp_path / "gpufleet-alerts.yml").write_text(Monitoring(**settings).render("gpufleet-alerts.yml.j2"))
    shutil.copy(RULES_TEST_FILE, tmp_path)
    proc = subprocess.run(["promtool", "test", "rules", str(tmp_path / RULES_TEST_FILE.name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- DCGM


def test_dcgm_exporter_unit() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(Monitoring(host="gpufleet-node-1", monitoring_dcgm=True).render("dcgm-exporter.service.j2"))
    assert unit["Unit"]["Requires"] == "nvidia-dcgm.service" and "nvidia-dcgm.service" in unit["Unit"]["After"]
    assert shlex.split(unit["Service"]["ExecStart"]) == [
        "/usr/local/bin/dcgm-exporter", "--address", ":9400", "--collectors", "/etc/dcgm-exporter/gpufleet-counters.csv",
        "--remote-hostengine-info", "localhost:5555"]
    assert unit["Service"]["DynamicUser"] == "true" and unit["Service"]["Restart"] == "on-failure"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    custom = configparser.ConfigParser(interpolation=None)
    custom.read_string(Monitoring(host="gpufleet-node-1", monitoring_dcgm_exporter_port=9500).render("dcgm-exporter.service.j2"))
    assert "--address :9500" in custom["Service"]["ExecStart"]


def test_dcgm_exporter_fields() -> None:
    fields = [line.split(",") for line in COUNTERS_FILE.read_text().splitlines() if line.strip() and not line.startswith("#")]
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
    templar = Monitoring(monitoring_dcgm_exporter_checksum="SHA256:" + SHA256.upper()).templar()
    assert templar.template(download["checksum"]) == "sha256:" + SHA256


# --------------------------------------------------------------------------- validation


def test_defaults_and_lab_settings_are_accepted() -> None:
    assert Monitoring().rejected() == []
    assert Monitoring(host="gpufleet-node-1", **LAB_SETTINGS).rejected() == []
    assert Monitoring(monitoring_dcgm=True, monitoring_dcgm_exporter_url="https://repo.example.com/dcgm-exporter",
                      monitoring_dcgm_exporter_checksum=SHA256, monitoring_dcgm_version="1:3.3.9").rejected() == []


@pytest.mark.parametrize("overrides, variable", [
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
    ({"monitoring_node_exporter_extra_args": ["--collector.textfile.directory=/tmp x"]}, "monitoring_node_exporter_extra_args"),
    ({"monitoring_prometheus_extra_args": ['--web.external-url="$HOST"']}, "monitoring_prometheus_extra_args"),
    ({"monitoring_dcgm": True, "monitoring_dcgm_exporter_checksum": SHA256}, "monitoring_dcgm_exporter_url"),
    ({"monitoring_dcgm": True, "monitoring_dcgm_exporter_url": "https://repo.example.com/dcgm-exporter"},
     "monitoring_dcgm_exporter_checksum"),
    ({"monitoring_dcgm": True, "monitoring_dcgm_exporter_url": "ftp://repo/dcgm-exporter",
      "monitoring_dcgm_exporter_checksum": SHA256}, "monitoring_dcgm_exporter_url"),
    ({"monitoring_dcgm_version": "latest"}, "monitoring_dcgm_version"),
    ({"monitoring_dcgm_exporter_port": 9100}, "monitoring_dcgm_exporter_port"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_wrong_settings_are_named(overrides: dict[str, Any], variable: str) -> None:
    messages = Monitoring(**overrides).rejected()
    assert len(messages) == 1, messages
    assert messages[0].startswith(variable + " "), messages[0]


def test_dcgm_switched_on_without_its_binary_names_both() -> None:
    messages = Monitoring(monitoring_dcgm=True).rejected()
    assert [m.split(" ")[0] for m in messages] == ["monitoring_dcgm_exporter_url", "monitoring_dcgm_exporter_checksum"]


def test_unknown_os_is_rejected() -> None:
    config = Monitoring()
    for name in [n for n in config.variables if n.startswith("__monitoring_") and n in _os_layout(FAKE_FACTS["debian12"])]:
        del config.variables[name]
    config.variables["ansible_facts"] = {**FAKE_FACTS["debian12"], "distribution": "Rocky", "os_family": "RedHat"}
    assert config.rejected()[0].startswith("monitoring has no package layout for Rocky")


# --------------------------------------------------------------------------- gpu_verify's metrics file


def gpu_verify_vars(**overrides: Any) -> dict[str, Any]:
    variables: dict[str, Any] = {}
    variables.update(load_trusted(GPU_VERIFY / "defaults" / "main.yml"))
    variables.update(load_trusted(GPU_VERIFY / "vars" / "main.yml"))
    variables.update(role_path=str(GPU_VERIFY), inventory_hostname="gpufleet-node-1",
                     __gpu_verify_matrix=load_trusted(COMPATIBILITY_FILE), __gpu_verify_cuda="12.1",
                     __gpu_verify_check_script="/x/gpufleet_check.pyz")
    variables.update(overrides)
    return variables


@pytest.mark.parametrize("overrides, expected", [
    ({}, ""),
    ({"gpufleet_monitoring": False}, ""),
    ({"gpufleet_monitoring": True}, "/var/lib/prometheus/node-exporter/gpufleet.prom"),
    ({"gpufleet_monitoring": True, "monitoring_textfile_dir": "/srv/textfile"}, "/srv/textfile/gpufleet.prom"),
])
def test_gpu_verify_metrics_file_follows_gpufleet_monitoring(overrides: dict[str, Any], expected: str) -> None:
    variables = gpu_verify_vars(**overrides)
    assert Templar(loader=_loader, variables=variables).template(variables["gpu_verify_metrics_file"]) == expected


def test_gpu_verify_passes_the_metrics_file_to_the_checks() -> None:
    [task] = [t for t in load_trusted(GPU_VERIFY / "tasks" / "check.yml") if t.get("name") == "Run the health checks"]
    for monitoring, expected in ((True, "--metrics-file /var/lib/prometheus/node-exporter/gpufleet.prom"), (False, None)):
        cmd = str(Templar(loader=_loader, variables=gpu_verify_vars(gpufleet_monitoring=monitoring))
                  .template(task["ansible.builtin.script"]["cmd"]))
        words = shlex.split(cmd)
        if expected:
            assert expected in " ".join(words)
        else:
            assert "--metrics-file" not in words


@pytest.mark.parametrize("value, ok", [
    ("", True), ("/var/lib/prometheus/node-exporter/gpufleet.prom", True), ("/srv/x/gpufleet.prom", True),
    ("gpufleet.prom", False), ("/var/lib/prometheus/node-exporter/gpufleet.txt", False),
    ("/var/lib/prometheus/node-exporter/", False), ("/var/lib/prometheus/node-exporter/.prom", False),
])
def test_gpu_verify_validates_the_metrics_file(value: str, ok: bool) -> None:
    [task] = [t for t in load_trusted(GPU_VERIFY / "tasks" / "validate.yml") if "setting is wrong" in t.get("name", "")]
    variables = gpu_verify_vars(gpu_verify_metrics_file=value)
    templar = Templar(loader=_loader, variables={**variables, **task["vars"]})
    messages = list(templar.template(task["vars"]["__gpu_verify_invalid"]))
    assert [m for m in messages if m.startswith("gpu_verify_metrics_file ")] == ([] if ok else [messages[0]])
    assert len(messages) == (0 if ok else 1), messages
