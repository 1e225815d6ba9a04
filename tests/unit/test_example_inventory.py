"""inventory: the settings it shows are the roles' real settings (and site.yml's real switches), with their real
defaults; every other setting is documented in docs/roles.md, which the example points to."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "inventory"
ROLES_DIR = REPO_ROOT / "roles"
ROLE_REFERENCE = "docs/roles.md"
DOCUMENTATION_NET = ipaddress.ip_network("192.0.2.0/24")  # RFC 5737 TEST-NET-1

# A commented-out setting: "# preflight_x: value" (or a switch "# gpufleet_x: value"), continued by "#   - item" lines.
_ROLE_PREFIXES = sorted(path.parent.parent.name for path in ROLES_DIR.glob("*/meta/argument_specs.yml"))
_SETTING = re.compile(r"^# ((?:gpufleet|" + "|".join(_ROLE_PREFIXES) + r")_\w+):")
# How site.yml's playbooks read a switch of an optional part: "gpufleet_slurm | default(false)".
_SWITCH_USE = re.compile(r"\b(gpufleet_\w+) \| default\((true|false|'[a-z]+')\)")


def commented_settings(path: Path) -> list[tuple[str, Any, str]]:
    """(name, YAML value, comment line above) of every commented-out setting in ``path``."""
    lines = path.read_text().splitlines()
    settings = []
    for i, line in enumerate(lines):
        match = _SETTING.match(line)
        if not match:
            continue
        block = [line[2:]]
        for following in lines[i + 1 :]:
            if not following.startswith("#   "):
                break
            block.append(following[2:])
        value = yaml.safe_load("\n".join(block))[match[1]]
        settings.append((match[1], value, lines[i - 1] if i else ""))
    return settings


def spec_options(checker) -> dict[str, dict[str, Any]]:
    """Every option of every role's argument spec (entry point main), by variable name."""
    options: dict[str, dict[str, Any]] = {}
    for role_dir in sorted(path.parent.parent for path in ROLES_DIR.glob("*/meta/argument_specs.yml")):
        spec, _source = checker.load_argument_spec(role_dir)
        options.update({name: attrs or {} for name, attrs in ((spec or {}).get("options") or {}).items()})
    return options


def site_switches() -> dict[str, bool | str]:
    """The switches of site.yml (its optional parts, gpufleet_unknown_settings) with their defaults: the gpufleet
    role's defaults, which the plays read through the lookup gpufleet.fleet.parts (issue 30), and any other
    switch a playbook reads with a `| default(...)` of its own."""
    switches: dict[str, bool | str] = {
        name: value
        for name, value in yaml.safe_load((REPO_ROOT / "roles/gpufleet/defaults/main.yml").read_text()).items()
        if name != "gpufleet_example_inventory"
    }
    for path in [REPO_ROOT / "site.yml", *sorted((REPO_ROOT / "playbooks").rglob("*.yml"))]:
        for name, default in _SWITCH_USE.findall(path.read_text()):
            if name != "gpufleet_example_inventory":
                value = default.strip("'") if default.startswith("'") else default == "true"
                assert switches.get(name, value) == value, f"{name} has two defaults"
                switches[name] = value
    return switches


def test_all_yml_settings_are_real_with_their_real_defaults(checker):
    """Each setting group_vars/all.yml shows is an option of a role's argument spec,
    shown once, with the spec's default."""
    documented = [
        (name, value)
        for name, value, _above in commented_settings(EXAMPLE / "group_vars" / "all.yml")
        if not name.startswith("gpufleet_")
    ]
    names = [name for name, _value in documented]
    assert names, "the example shows no setting"
    assert len(names) == len(set(names)), "a setting is shown twice"
    options = spec_options(checker)
    assert [name for name in names if name not in options] == [], (
        "not a setting of any role (roles/*/meta/argument_specs.yml)"
    )
    wrong = [
        name
        for name, value in documented
        if "default" not in options[name] or not checker.same_value(value, options[name]["default"])
    ]
    assert wrong == [], "defaults differ from the roles' argument specs"


def test_all_yml_shows_every_switch_of_site_yml_with_its_default():
    """The optional parts (gpufleet_slurm, gpufleet_pytorch, ...) are all in group_vars/all.yml,
    each with the default site.yml gives it."""
    switches = site_switches()
    assert {"gpufleet_slurm", "gpufleet_monitoring", "gpufleet_container", "gpufleet_pytorch"} <= set(switches)
    shown = {
        name: value
        for name, value, _above in commented_settings(EXAMPLE / "group_vars" / "all.yml")
        if name.startswith("gpufleet_")
    }
    assert shown == switches


def test_all_yml_points_to_the_role_reference():
    """The example shows a handful of settings and names docs/roles.md (which exists) for every other one."""
    text = (EXAMPLE / "group_vars" / "all.yml").read_text()
    assert ROLE_REFERENCE in text
    assert (REPO_ROOT / ROLE_REFERENCE).is_file()
    assert len(commented_settings(EXAMPLE / "group_vars" / "all.yml")) <= 40, (
        "the example copies the role reference again"
    )


def test_all_yml_explains_every_setting():
    """Each setting in group_vars/all.yml has a one-line explanation right above it."""
    for name, _value, above in commented_settings(EXAMPLE / "group_vars" / "all.yml"):
        assert above.startswith("# ") and not _SETTING.match(above) and len(above) > 10, f"{name} has no explanation"


def test_all_yml_sets_nothing():
    """Everything in group_vars/all.yml is commented out but the example marker: the example
    changes no default by itself."""
    assert yaml.safe_load((EXAMPLE / "group_vars" / "all.yml").read_text()) == {"gpufleet_example_inventory": True}


def test_gpu_nodes_yml_overrides_only_real_settings(checker):
    """The commented mirror overrides in group_vars/gpu_nodes.yml name real role settings
    with values of the right type."""
    options = spec_options(checker)
    settings = commented_settings(EXAMPLE / "group_vars" / "gpu_nodes.yml")
    assert settings, "no example override"
    for name, value, _above in settings:
        assert name in options, f"{name} is not a role setting"
        default = options[name]["default"]
        assert type(value) is type(default), f"{name}: {value!r} is not a {type(default).__name__}"
        if name.endswith("_url"):
            assert re.match(r"^https?://[A-Za-z0-9.-]+(:[0-9]+)?(/\S*)?$", value), name


def _hosts() -> dict[str, dict]:
    inventory = yaml.safe_load((EXAMPLE / "hosts.yml").read_text())
    group = inventory["all"]["children"]["gpu_nodes"]
    return {name: {**group.get("vars", {}), **(host or {})} for name, host in group["hosts"].items()}


def test_hosts_are_gpu_nodes():
    """hosts.yml puts several hosts in gpu_nodes, the group playbooks/provision.yml targets."""
    assert len(_hosts()) >= 4


@pytest.mark.parametrize("name", list(_hosts()))
def test_host_connection_settings(name):
    """Every host has an address from the documentation range 192.0.2.0/24 and an SSH user with become."""
    host = _hosts()[name]
    assert ipaddress.ip_address(host["ansible_host"]) in DOCUMENTATION_NET
    assert host["ansible_user"]
    assert host.get("ansible_become") is True


def test_site_on_the_unedited_example_inventory_stops_before_any_connection(tmp_path):
    """`ansible-playbook site.yml -i inventory` on a fresh clone: one message that says to
    edit the example, before any host is contacted (its addresses are TEST-NET placeholders)."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path),
        "ANSIBLE_FACT_CACHING_CONNECTION": str(tmp_path / "facts"),
    }
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "site.yml", "-i", "inventory"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert "This is gpufleet's example inventory" in out
    assert "delete gpufleet_example_inventory" in out and "Nothing was changed" in out
    # No host was contacted: the first task of the first play is the only one that ran.
    assert "UNREACHABLE" not in out and "Gathering Facts" not in out
    assert out.count("TASK [") == 1
