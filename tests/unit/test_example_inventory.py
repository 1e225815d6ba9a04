"""inventory: the settings it documents are the roles' real settings, with their real defaults."""

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
DOCUMENTATION_NET = ipaddress.ip_network("192.0.2.0/24")  # RFC 5737 TEST-NET-1

# A commented-out setting: "# preflight_x: value", continued by "#   - item" lines.
_ROLE_PREFIXES = sorted(path.parent.parent.name for path in ROLES_DIR.glob("*/defaults/main.yml"))
_SETTING = re.compile(r"^# ((?:" + "|".join(_ROLE_PREFIXES) + r")_\w+):")


def commented_settings(path: Path) -> list[tuple[str, Any, str]]:
    """(name, YAML value, comment line above) of every commented-out role setting in ``path``."""
    lines = path.read_text().splitlines()
    settings = []
    for i, line in enumerate(lines):
        match = _SETTING.match(line)
        if not match:
            continue
        block = [line[2:]]
        for following in lines[i + 1:]:
            if not following.startswith("#   "):
                break
            block.append(following[2:])
        value = yaml.safe_load("\n".join(block))[match[1]]
        settings.append((match[1], value, lines[i - 1] if i else ""))
    return settings


def role_defaults() -> dict[str, Any]:
    """Every default of every role, by variable name."""
    defaults: dict[str, Any] = {}
    for path in sorted(ROLES_DIR.glob("*/defaults/main.yml")):
        defaults.update(yaml.safe_load(path.read_text()) or {})
    return defaults


def test_all_yml_lists_every_setting_with_its_default(checker):
    """group_vars/all.yml names each variable of defaults/main.yml once, commented out, with the same default."""
    documented = commented_settings(EXAMPLE / "group_vars" / "all.yml")
    names = [name for name, _, _ in documented]
    assert len(names) == len(set(names)), "a setting is listed twice"
    defaults = role_defaults()
    assert sorted(names) == sorted(defaults)
    wrong = [name for name, value, _ in documented if not checker.same_value(value, defaults[name])]
    assert wrong == [], "defaults differ from the roles' defaults/main.yml"


def test_all_yml_explains_every_setting():
    """Each setting in group_vars/all.yml has a one-line explanation right above it."""
    for name, _, above in commented_settings(EXAMPLE / "group_vars" / "all.yml"):
        assert above.startswith("# ") and not _SETTING.match(above) and len(above) > 10, f"{name} has no explanation"


def test_all_yml_sets_nothing():
    """Everything in group_vars/all.yml is commented out but the example marker: the example
    changes no default by itself."""
    assert yaml.safe_load((EXAMPLE / "group_vars" / "all.yml").read_text()) == {"gpufleet_example_inventory": True}


def test_gpu_nodes_yml_overrides_only_real_settings():
    """The commented mirror overrides in group_vars/gpu_nodes.yml name real role variables with values of the right type."""
    defaults = role_defaults()
    settings = commented_settings(EXAMPLE / "group_vars" / "gpu_nodes.yml")
    assert settings, "no example override"
    for name, value, _ in settings:
        assert name in defaults, f"{name} is not a role variable"
        assert type(value) is type(defaults[name]), f"{name}: {value!r} is not a {type(defaults[name]).__name__}"
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
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path), "ANSIBLE_FACT_CACHING_CONNECTION": str(tmp_path / "facts")}
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "site.yml", "-i", "inventory"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert "This is gpufleet's example inventory" in out
    assert "delete gpufleet_example_inventory" in out and "Nothing was changed" in out
    # No host was contacted: the first task of the first play is the only one that ran.
    assert "UNREACHABLE" not in out and "Gathering Facts" not in out
    assert out.count("TASK [") == 1
