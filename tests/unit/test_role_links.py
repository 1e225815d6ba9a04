"""How a role may take a value from another: the one rule, checked over every role's defaults.

A role's default may follow another role's *public* setting (one its
argument spec defines) or preflight's published report, never a private
``__`` variable of another role. Where it follows one, three things hold:

* its spec's description names what it follows (docs/roles.md shows it);
* the fallback literal (``| default(...)``, used when the other role is not
  in the play, as in verify.yml) is that role's own default, so the two
  cannot drift;
* it reads no path and no file of the other role.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))

# Facts roles publish for others to read (set_fact or register in the named task file).
PUBLISHED = {"preflight_report": REPO / "roles/preflight/tasks/probe.yml"}
# What every role may read: Ansible's own variables.
ANSIBLE_VARS = {
    "ansible_facts",
    "inventory_hostname",
    "role_path",
    "lookup",
    "default",
    "int",
    "bool",
    "string",
    "lower",
    "regex_replace",
    "true",
    "false",
    "if",
    "else",
    "and",
    "or",
    "not",
    "in",
    "is",
    "none",
}

_NAME = re.compile(r"(?<![\w.'\"])([a-z_][a-z0-9_]*)")
_FALLBACK = re.compile(r"\b([a-z][a-z0-9_]*)\s*\|\s*default\('([^']*)'\)")


def _specs(role: Path) -> dict:
    return yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def _defaults(role: Path) -> dict:
    path = role / "defaults/main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


OWNER = {name: role for role in ROLES for name in _specs(role)}
LINKS = [
    (role.name, name, value)
    for role in ROLES
    for name, value in _defaults(role).items()
    if isinstance(value, str) and "{{" in value
]


def _read_names(value: str) -> set[str]:
    expressions = " ".join(re.findall(r"{{(.*?)}}", value, re.S))
    expressions = re.sub(r"'[^']*'", "''", expressions)  # no names inside string literals
    return set(_NAME.findall(expressions)) - ANSIBLE_VARS


def test_the_rule_sees_the_links_there_are():
    """The scan finds the known links (a scan that finds nothing would pass everything)."""
    assert {
        ("slurm", "slurm_payload_dir"),
        ("gpu_verify", "gpu_verify_python"),
        ("nvidia_driver", "nvidia_driver_module_source"),
    } <= {(role, name) for role, name, _value in LINKS}


@pytest.mark.parametrize(("role", "name", "value"), LINKS, ids=[f"{r}.{n}" for r, n, _value in LINKS])
def test_a_default_follows_only_public_settings_and_says_so(role, name, value):
    description = " ".join(
        _specs(REPO / "roles" / role)[name]["description"]
        if isinstance(_specs(REPO / "roles" / role)[name]["description"], list)
        else [_specs(REPO / "roles" / role)[name]["description"]]
    )
    for read in _read_names(value):
        assert not read.startswith("__"), f"{role}.{name} reads the private variable {read}"
        if read.startswith(role + "_"):
            continue
        assert read in OWNER or read in PUBLISHED, (
            f"{role}.{name} reads {read}, which is neither a setting in a role's spec nor a published fact"
        )
        if read in PUBLISHED:
            assert re.search(rf"^\s+({read}:|register: {read}$)", PUBLISHED[read].read_text(), re.M), (
                f"{read} is not set where it is said to be"
            )
        assert read in description, f"{role}.{name} follows {read}, but its spec's description does not say so"


@pytest.mark.parametrize(("role", "name", "value"), LINKS, ids=[f"{r}.{n}" for r, n, _value in LINKS])
def test_a_fallback_is_the_followed_roles_own_default(role, name, value):
    for followed, fallback in _FALLBACK.findall(value):
        if followed not in OWNER or OWNER[followed].name == role:
            continue
        own = _defaults(OWNER[followed]).get(followed, "")
        assert fallback == ("" if own is None else str(own)), (
            f"{role}.{name} falls back to {fallback!r}, but {OWNER[followed].name}'s {followed} defaults to {own!r}"
        )


def test_no_role_reaches_into_another_roles_folder():
    for role in ROLES:
        for path in role.rglob("*"):
            if path.is_file() and path.suffix in {".yml", ".yaml", ".j2"}:
                assert not re.search(r"role_path\s*~?\s*['\"]?/\.\.", path.read_text()), f"{path} leaves its role"


# The playbooks read their own settings (roles/gpufleet) before any role loads,
# each with a `| default(...)`: that fallback must be the spec's default.
_PLAYBOOK_READ = re.compile(r"\b(gpufleet_[a-z_]+)\s*\|\s*default\(([^)]*)\)")


PART_SWITCHES = {"gpufleet_pytorch", "gpufleet_slurm", "gpufleet_monitoring", "gpufleet_container"}


def _playbook_reads() -> list[tuple[str, str, str]]:
    reads = []
    for path in sorted(
        [
            *(REPO / "playbooks").rglob("*.yml"),
            *(REPO / "roles").glob("*/defaults/main.yml"),
            *(REPO / "roles").glob("*/tasks/*.yml"),
        ]
    ):
        for name, fallback in _PLAYBOOK_READ.findall(path.read_text()):
            reads.append((str(path.relative_to(REPO)), name, fallback))
    return reads


def test_the_playbooks_fall_back_to_their_settings_spec_defaults():
    reads = _playbook_reads()
    assert {name for _path, name, _fallback in reads} >= {"gpufleet_example_inventory"}
    # The part switches are read through the lookup gpufleet.fleet.parts, over roles/gpufleet's defaults: none is
    # restated with a fallback of its own (issue 30).
    assert not [(where, name) for where, name, _fallback in reads if name in PART_SWITCHES]
    spec = _specs(REPO / "roles" / "gpufleet")
    for where, name, fallback in reads:
        assert name in spec, f"{where} reads {name}, which roles/gpufleet's spec does not define"
        assert yaml.safe_load(fallback) == spec[name]["default"], (
            f"{where} falls back to {fallback} for {name}; the spec's default is {spec[name]['default']!r}"
        )
