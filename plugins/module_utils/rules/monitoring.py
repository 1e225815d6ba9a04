"""The monitoring role's rules: node exporter, Prometheus and its inventory groups, the alert rules' durations, DCGM.

Run by roles/monitoring/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes, after it
loaded the package layout of the host's OS (vars/<OS>.yml). The patterns are the role's (vars/main.yml).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import (
    Judgement,
    as_list,
    is_http_url,
    matches,
    text,
    to_bool,
    to_int,
)

READS = (
    "monitoring_*",
    "ansible_facts.distribution",
    "ansible_facts.distribution_version",
    "groups",
    "__monitoring_node_exporter_package",
    "__monitoring_duration_pattern",
    "__monitoring_zero_duration_pattern",
    "__monitoring_host_pattern",
    "__monitoring_listen_pattern",
    "__monitoring_option_pattern",
    "__monitoring_sha256_pattern",
    "__monitoring_package_version_pattern",
    "__monitoring_dcgm_major_packages",
    "__monitoring_dcgm_exporter_release",
)


def _json(value: Any) -> str:
    """Ansible's ``| to_json``."""
    return json.dumps(value)


def _port(value: Any) -> int:
    """A TCP port setting (``| int``), 0 when it is none."""
    port = to_int(value)
    return port if 0 < port < 65536 else 0


def _duration(j: Judgement, name: str, above_zero: bool) -> bool:
    """A Prometheus duration (1h30m, 10m, 0s, 15d); ``above_zero``: not 0s."""
    value = j[name]
    return matches(j["__monitoring_duration_pattern"], value) and not (
        above_zero and matches(j["__monitoring_zero_duration_pattern"], value)
    )


def check_services(j: Judgement) -> None:
    """The package layout for this OS, node exporter's and Prometheus' settings, the inventory groups."""
    facts = j.get("ansible_facts") or {}
    groups = j["groups"]
    j.check(
        "__monitoring_node_exporter_package" in j.values,
        f"monitoring has no package layout for {facts.get('distribution', 'this OS')}"
        f" {facts.get('distribution_version', '')} (roles/monitoring/vars has the Debian family: Debian 12,"
        " Ubuntu 20.04 and 22.04)",
    )
    textfile_dir = j["monitoring_textfile_dir"]
    j.check(
        matches("^/", textfile_dir) and not matches(".*/$", textfile_dir),
        f"monitoring_textfile_dir '{textfile_dir}' is not an absolute directory path"
        " (the package's own is /var/lib/prometheus/node-exporter)",
    )
    port = j["monitoring_node_exporter_port"]
    j.check(_port(port), f"monitoring_node_exporter_port '{port}' is not a TCP port (1 to 65535)")
    j.check_form(
        "monitoring_node_exporter_address",
        j["__monitoring_host_pattern"],
        "is not a host name or address (empty for every interface; [::1] for an IPv6 address); the port is"
        " monitoring_node_exporter_port",
    )
    j.check_form(
        "monitoring_prometheus_listen_address", j["__monitoring_listen_pattern"], "is not host:port (e.g. 0.0.0.0:9090)"
    )
    server_group = j["monitoring_server_group"]
    j.check(
        text(server_group) and isinstance(server_group, str) and server_group in groups,
        f"monitoring_server_group '{server_group}' is not a group of the inventory: add it with the host that runs"
        " Prometheus (or with no hosts, for node exporters only)",
    )
    scrape_groups = as_list(j["monitoring_scrape_groups"])
    missing = list(dict.fromkeys(group for group in scrape_groups if group not in list(groups)))
    j.check(
        scrape_groups and not missing,
        f"monitoring_scrape_groups {_json(scrape_groups)} must list inventory groups"
        f" ({', '.join(map(text, missing))} {'is' if len(missing) == 1 else 'are'} not)",
    )
    j.check(
        text(j["monitoring_gpu_group"]),
        "monitoring_gpu_group is empty: name the inventory group of the GPU nodes (gpu_nodes)",
    )


def check_durations(j: Judgement) -> None:
    """Prometheus' intervals and retention, the alert rules' durations."""
    for name in ("monitoring_scrape_interval", "monitoring_evaluation_interval"):
        j.check(
            _duration(j, name, above_zero=True),
            f"{name} '{j[name]}' is not a Prometheus duration above 0 (e.g. 30s, 1m)",
        )
    j.check(
        _duration(j, "monitoring_prometheus_retention", above_zero=False),
        f"monitoring_prometheus_retention '{j['monitoring_prometheus_retention']}' is not a Prometheus duration"
        " (e.g. 15d)",
    )
    j.check(
        _duration(j, "monitoring_alert_for", above_zero=False),
        f"monitoring_alert_for '{j['monitoring_alert_for']}' is not a Prometheus duration (e.g. 10m; 0s fires at once)",
    )
    j.check(
        _duration(j, "monitoring_verify_stale_after", above_zero=True),
        f"monitoring_verify_stale_after '{j['monitoring_verify_stale_after']}' is not a Prometheus duration above 0"
        " (e.g. 26h)",
    )


def check_options(j: Judgement) -> None:
    """The daemons' extra options: each one word that needs no shell quoting in a defaults file's ARGS="..."."""
    for name, example in (
        ("monitoring_node_exporter_extra_args", "--collector.systemd"),
        ("monitoring_prometheus_extra_args", "--web.enable-lifecycle"),
    ):
        options = j[name]
        j.check(
            all(matches(j["__monitoring_option_pattern"], option) for option in as_list(options)),
            f"{name} {_json(options)} must be a list of options like {example} or --name=value"
            " (no spaces, quotes, backslashes or $)",
        )


def check_dcgm(j: Judgement) -> None:
    """DCGM's line, packages and version; dcgm-exporter's binary, release and port."""
    dcgm = to_bool(j["monitoring_dcgm"])
    url = j["monitoring_dcgm_exporter_url"]
    j.check(
        not dcgm or is_http_url(text(url)),
        f"monitoring_dcgm_exporter_url '{url}' is not an http(s) URL: with monitoring_dcgm, name the dcgm-exporter"
        " binary on a site server (NVIDIA's apt repository has none)",
    )
    checksum = j["monitoring_dcgm_exporter_checksum"]
    j.check(
        not dcgm or matches(j["__monitoring_sha256_pattern"], text(checksum).lower()),
        f"monitoring_dcgm_exporter_checksum '{checksum}' is not a SHA-256 (64 hex digits, optionally sha256:...):"
        " with monitoring_dcgm, give the checksum of the dcgm-exporter binary",
    )
    major = text(j["monitoring_dcgm_major"])
    j.check(
        major in j["__monitoring_dcgm_major_packages"],
        f"monitoring_dcgm_major '{major}' is not a DCGM line gpufleet installs: 4 (datacenter-gpu-manager-4-*) or 3",
    )
    packages = j["monitoring_dcgm_packages"]
    j.check(
        major != "4" or "datacenter-gpu-manager" not in as_list(packages),
        f"monitoring_dcgm_packages {_json(packages)} names DCGM 3's datacenter-gpu-manager, which DCGM 4's"
        " datacenter-gpu-manager-4-core conflicts with (monitoring_dcgm_major is 4): leave monitoring_dcgm_packages"
        " empty for DCGM 4's packages, or set monitoring_dcgm_major: 3",
    )
    j.check(
        major != "3" or not any(matches("^datacenter-gpu-manager-4-", package) for package in as_list(packages)),
        f"monitoring_dcgm_packages {_json(packages)} names DCGM 4 packages (datacenter-gpu-manager-4-*) while"
        " monitoring_dcgm_major is 3: set monitoring_dcgm_major: 4, or leave monitoring_dcgm_packages empty",
    )
    version = j["monitoring_dcgm_version"]
    is_version = matches(j["__monitoring_package_version_pattern"], version)
    j.check(is_version, f"monitoring_dcgm_version '{version}' is not a package version (e.g. 1:4.2.3-1) or empty")
    j.check(
        not is_version or not text(version) or matches(f"^([0-9]+:)?{re.escape(major)}[.]", version),
        f"monitoring_dcgm_version '{version}' is not a DCGM {major} release (monitoring_dcgm_major is {major}):"
        f" give a {major}.x version, e.g. {'1:4.2.3-1' if major == '4' else '1:3.3.9'}, or change"
        " monitoring_dcgm_major",
    )
    # The exporter's release, once its URL is right: the setting, else the URL.
    release = j["__monitoring_dcgm_exporter_release"] or {}
    exporter_version = j["monitoring_dcgm_exporter_version"]
    j.check(
        not dcgm or not is_http_url(text(url)) or release,
        f"monitoring_dcgm_exporter_version '{exporter_version}' is not a dcgm-exporter release and"
        " monitoring_dcgm_exporter_url names none: with monitoring_dcgm, give the binary's release as NVIDIA tags"
        " it, <DCGM version>-<exporter version> (e.g. 4.2.3-4.1.1), to be checked against monitoring_dcgm_major",
    )
    named = (
        f"monitoring_dcgm_exporter_version {exporter_version} is a dcgm-exporter"
        if text(exporter_version)
        else f"monitoring_dcgm_exporter_url {url} names dcgm-exporter {release.get('release', '')}"
    )
    j.check(
        not dcgm or not release or text(release.get("dcgm_major")) == major,
        f"{named} built for DCGM {release.get('dcgm', '')}, but monitoring_dcgm_major is {major}: use a"
        f" dcgm-exporter built for DCGM {major} (its release {major}.x.y-...), or set monitoring_dcgm_major:"
        f" {release.get('dcgm_major', '')}",
    )
    exporter_port = j["monitoring_dcgm_exporter_port"]
    j.check(
        _port(exporter_port) and to_int(exporter_port) != to_int(j["monitoring_node_exporter_port"]),
        f"monitoring_dcgm_exporter_port '{exporter_port}' is not a TCP port (1 to 65535) other than node"
        f" exporter's ({j['monitoring_node_exporter_port']})",
    )


def judge(j: Judgement) -> None:
    """Refuse settings the role cannot install, configure or alert with; it resolves nothing (vars/main.yml does)."""
    check_services(j)
    check_durations(j)
    check_options(j)
    check_dcgm(j)
