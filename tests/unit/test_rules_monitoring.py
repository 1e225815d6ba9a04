"""The monitoring role's rules (plugins/module_utils/rules/monitoring.py), judged directly on plain values.

Each rule: the role's defaults (and DCGM switched on with what it needs) pass it, one wrong value fails it with its
exact message (the one rule that fails). What validate.yml makes of them on a fake host is test_monitoring_role.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpufleet.fleet.plugins.filter.gpufleet_filters import (
    dcgm_exporter_release,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.rules import monitoring
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import Judgement

ROLE = Path(__file__).resolve().parents[2] / "roles" / "monitoring"
DEBIAN12 = {"distribution": "Debian", "distribution_version": "12", "os_family": "Debian"}
ROCKY = {"distribution": "Rocky", "distribution_version": "9.3", "os_family": "RedHat"}
GROUPS = {
    "all": ["node-1", "node-2", "head"],
    "ungrouped": [],
    "gpu_nodes": ["node-1", "node-2"],
    "monitoring_server": ["head"],
    "login": [],
}
SHA = "ab" * 32
URL = "https://files.example.com/dcgm-exporter/4.2.3-4.1.1/dcgm-exporter"
DCGM = {"monitoring_dcgm": True, "monitoring_dcgm_exporter_url": URL, "monitoring_dcgm_exporter_checksum": SHA}


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def values(facts: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
    """What the action gives the rules: the role's defaults and vars (the Debian family's for a Debian host), the
    host's facts (Debian 12's by default), the inventory's groups, ``settings``; __monitoring_dcgm_exporter_release
    as vars/main.yml has it."""
    facts = facts or DEBIAN12
    found = {**_load(ROLE / "defaults" / "main.yml"), **_load(ROLE / "vars" / "main.yml")}
    if facts["os_family"] == "Debian":
        found.update(_load(ROLE / "vars" / "Debian.yml"))
    found.update(ansible_facts=facts, groups=GROUPS, **settings)
    found["__monitoring_dcgm_exporter_release"] = dcgm_exporter_release(
        found["monitoring_dcgm_exporter_version"], found["monitoring_dcgm_exporter_url"]
    )
    return found


def judged(facts: dict[str, Any] | None = None, **settings: Any) -> Judgement:
    judgement = Judgement("monitoring", "node-1", values(facts, **settings))
    monitoring.judge(judgement)
    return judgement


def duration(name: str, value: str, above_zero: bool, example: str) -> tuple[dict[str, Any], str]:
    kind = "a Prometheus duration above 0" if above_zero else "a Prometheus duration"
    return {name: value}, f"{name} '{value}' is not {kind} (e.g. {example})"


RULES = [
    (
        {"monitoring_textfile_dir": "/var/lib/node-exporter/"},
        (
            "monitoring_textfile_dir '/var/lib/node-exporter/' is not an absolute directory path"
            " (the package's own is /var/lib/prometheus/node-exporter)"
        ),
    ),
    ({"monitoring_node_exporter_port": "http"}, "monitoring_node_exporter_port 'http' is not a TCP port (1 to 65535)"),
    ({"monitoring_node_exporter_port": 65536}, "monitoring_node_exporter_port '65536' is not a TCP port (1 to 65535)"),
    (
        {"monitoring_node_exporter_address": "::1"},
        (
            "monitoring_node_exporter_address '::1' is not a host name or address"
            " (empty for every interface; [::1] for an IPv6 address); the port is monitoring_node_exporter_port"
        ),
    ),
    (
        {"monitoring_prometheus_listen_address": "0.0.0.0"},
        "monitoring_prometheus_listen_address '0.0.0.0' is not host:port (e.g. 0.0.0.0:9090)",
    ),
    (
        {"monitoring_server_group": "prometheus"},
        (
            "monitoring_server_group 'prometheus' is not a group of the inventory:"
            " add it with the host that runs Prometheus (or with no hosts, for node exporters only)"
        ),
    ),
    (
        {"monitoring_server_group": ""},
        (
            "monitoring_server_group '' is not a group of the inventory: add it with the host that runs Prometheus"
            " (or with no hosts, for node exporters only)"
        ),
    ),
    (
        {"monitoring_scrape_groups": ["gpu_nodes", "storage"]},
        'monitoring_scrape_groups ["gpu_nodes", "storage"] must list inventory groups (storage is not)',
    ),
    (
        {"monitoring_scrape_groups": "gpu_nodes,storage,web,storage"},
        (
            'monitoring_scrape_groups ["gpu_nodes", "storage", "web", "storage"] must list inventory groups'
            " (storage, web are not)"
        ),
    ),
    ({"monitoring_scrape_groups": []}, "monitoring_scrape_groups [] must list inventory groups ( are not)"),
    (
        {"monitoring_gpu_group": ""},
        "monitoring_gpu_group is empty: name the inventory group of the GPU nodes (gpu_nodes)",
    ),
    duration("monitoring_scrape_interval", "0s", True, "30s, 1m"),
    duration("monitoring_scrape_interval", "30", True, "30s, 1m"),
    duration("monitoring_evaluation_interval", "0m0s", True, "30s, 1m"),
    duration("monitoring_prometheus_retention", "15 days", False, "15d"),
    duration("monitoring_alert_for", "10", False, "10m; 0s fires at once"),
    duration("monitoring_verify_stale_after", "0h", True, "26h"),
    (
        {"monitoring_node_exporter_extra_args": ["--collector.systemd", "--web.config.file=/etc/a b"]},
        (
            'monitoring_node_exporter_extra_args ["--collector.systemd", "--web.config.file=/etc/a b"]'
            " must be a list of options like --collector.systemd or --name=value (no spaces, quotes, backslashes or $)"
        ),
    ),
    (
        {"monitoring_prometheus_extra_args": "web.enable-lifecycle"},
        (
            'monitoring_prometheus_extra_args "web.enable-lifecycle"'
            " must be a list of options like --web.enable-lifecycle or --name=value"
            " (no spaces, quotes, backslashes or $)"
        ),
    ),
    (
        {"monitoring_dcgm_major": 5},
        "monitoring_dcgm_major '5' is not a DCGM line gpufleet installs: 4 (datacenter-gpu-manager-4-*) or 3",
    ),
    (
        {"monitoring_dcgm_packages": ["datacenter-gpu-manager"]},
        (
            'monitoring_dcgm_packages ["datacenter-gpu-manager"]'
            " names DCGM 3's datacenter-gpu-manager,"
            " which DCGM 4's datacenter-gpu-manager-4-core conflicts with (monitoring_dcgm_major is 4):"
            " leave monitoring_dcgm_packages empty for DCGM 4's packages, or set monitoring_dcgm_major: 3"
        ),
    ),
    (
        {"monitoring_dcgm_major": 3, "monitoring_dcgm_packages": "datacenter-gpu-manager-4-core"},
        (
            'monitoring_dcgm_packages "datacenter-gpu-manager-4-core"'
            " names DCGM 4 packages (datacenter-gpu-manager-4-*) while monitoring_dcgm_major is 3:"
            " set monitoring_dcgm_major: 4, or leave monitoring_dcgm_packages empty"
        ),
    ),
    (
        {"monitoring_dcgm_version": "latest"},
        "monitoring_dcgm_version 'latest' is not a package version (e.g. 1:4.2.3-1) or empty",
    ),
    (
        {"monitoring_dcgm_version": "1:3.3.9"},
        (
            "monitoring_dcgm_version '1:3.3.9' is not a DCGM 4 release (monitoring_dcgm_major is 4):"
            " give a 4.x version, e.g. 1:4.2.3-1, or change monitoring_dcgm_major"
        ),
    ),
    (
        {"monitoring_dcgm_major": "3", "monitoring_dcgm_version": "4.2.3-1"},
        (
            "monitoring_dcgm_version '4.2.3-1' is not a DCGM 3 release (monitoring_dcgm_major is 3):"
            " give a 3.x version, e.g. 1:3.3.9, or change monitoring_dcgm_major"
        ),
    ),
    (
        {"monitoring_dcgm_exporter_port": 0},
        "monitoring_dcgm_exporter_port '0' is not a TCP port (1 to 65535) other than node exporter's (9100)",
    ),
    (
        {"monitoring_dcgm_exporter_port": "9100"},
        "monitoring_dcgm_exporter_port '9100' is not a TCP port (1 to 65535) other than node exporter's (9100)",
    ),
]
DCGM_RULES = [
    (
        {"monitoring_dcgm_exporter_url": "files.example.com/dcgm-exporter"},
        (
            "monitoring_dcgm_exporter_url 'files.example.com/dcgm-exporter' is not an http(s) URL:"
            " with monitoring_dcgm, name the dcgm-exporter binary on a site server (NVIDIA's apt repository has none)"
        ),
    ),
    (
        {"monitoring_dcgm_exporter_checksum": "sha256:" + "ab" * 31},
        (
            f"monitoring_dcgm_exporter_checksum 'sha256:{'ab' * 31}'"
            " is not a SHA-256 (64 hex digits, optionally sha256:...):"
            " with monitoring_dcgm, give the checksum of the dcgm-exporter binary"
        ),
    ),
    (
        {"monitoring_dcgm_exporter_url": "https://files.example.com/dcgm-exporter"},
        (
            "monitoring_dcgm_exporter_version '' is not a dcgm-exporter release"
            " and monitoring_dcgm_exporter_url names none: with monitoring_dcgm,"
            " give the binary's release as NVIDIA tags it, <DCGM version>-<exporter version>"
            " (e.g. 4.2.3-4.1.1), to be checked against monitoring_dcgm_major"
        ),
    ),
    (
        {"monitoring_dcgm_exporter_version": "3.3.9-3.6.1"},
        (
            "monitoring_dcgm_exporter_version 3.3.9-3.6.1 is a dcgm-exporter built for DCGM 3.3.9,"
            " but monitoring_dcgm_major is 4: use a dcgm-exporter built for DCGM 4 (its release 4.x.y-...),"
            " or set monitoring_dcgm_major: 3"
        ),
    ),
    (
        {"monitoring_dcgm_major": 3},
        (
            f"monitoring_dcgm_exporter_url {URL} names dcgm-exporter 4.2.3-4.1.1 built for DCGM 4.2.3, but"
            " monitoring_dcgm_major is 3: use a dcgm-exporter built for DCGM 3 (its release 3.x.y-...), or set"
            " monitoring_dcgm_major: 4"
        ),
    ),
]


def test_the_defaults_pass_every_rule() -> None:
    assert judged().errors == []
    assert judged(**DCGM).errors == []
    assert (
        judged(
            **DCGM,
            monitoring_dcgm_major=3,
            monitoring_dcgm_version="1:3.3.9",
            monitoring_dcgm_exporter_version="3.3.9-3.6.1",
        ).errors
        == []
    )
    assert (
        judged(
            monitoring_node_exporter_address="[::1]",
            monitoring_prometheus_listen_address="[::]:9091",
            monitoring_scrape_groups="gpu_nodes,login",
            monitoring_alert_for="0s",
            monitoring_node_exporter_extra_args=["--collector.systemd", "--collector.textfile.directory=/x"],
            monitoring_dcgm_exporter_port="9401",
        ).errors
        == []
    )


def test_the_rules_resolve_nothing() -> None:
    assert judged(**DCGM).facts == {}


def test_an_os_without_a_package_layout_is_named() -> None:
    assert judged(ROCKY).errors == [
        (
            "monitoring has no package layout for Rocky 9.3 (roles/monitoring/vars has the Debian family: Debian 12,"
            " Ubuntu 20.04 and 22.04)"
        )
    ]
    assert judged({"os_family": "Plan9"}).errors == [
        (
            "monitoring has no package layout for this OS (roles/monitoring/vars has the Debian family: Debian 12,"
            " Ubuntu 20.04 and 22.04)"
        )
    ]


@pytest.mark.parametrize(("settings", "message"), RULES, ids=[m[:48] for _s, m in RULES])
def test_each_rule_refuses_with_its_message(settings: dict[str, Any], message: str) -> None:
    assert judged(**settings).errors == [message]


@pytest.mark.parametrize(("settings", "message"), DCGM_RULES, ids=[m[:48] for _s, m in DCGM_RULES])
def test_each_dcgm_exporter_rule_refuses_with_its_message(settings: dict[str, Any], message: str) -> None:
    assert judged(**{**DCGM, **settings}).errors == [message]
    if "monitoring_dcgm_major" not in settings:
        assert judged(**{**DCGM, **settings, "monitoring_dcgm": "no"}).errors == []


def test_every_reason_is_said_in_order() -> None:
    j = judged(
        monitoring_node_exporter_port=0,
        monitoring_scrape_interval="0s",
        monitoring_dcgm_version="x y",
        monitoring_dcgm_exporter_port=70000,
    )
    assert [error.split(" ")[0] for error in j.errors] == [
        "monitoring_node_exporter_port",
        "monitoring_scrape_interval",
        "monitoring_dcgm_version",
        "monitoring_dcgm_exporter_port",
    ]
    assert j.message.startswith("monitoring settings rejected on node-1: [1] monitoring_node_exporter_port '0' ")
