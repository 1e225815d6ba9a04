"""Helpers for the unit tests; the ``driver`` fixture: what roles/nvidia_driver configures on a fake host.

Roles run for real (tests/unit/role_run.py): ansible-core's executor runs a
play on fake hosts in this process, the settings as inventory variables.
``driver()`` runs nvidia_driver's tasks/validate.yml and tasks/preflight.yml
(``include_role``; preflight.yml's include of roles/apt_source's trial, which
runs apt on the host, is skipped by an ``apply`` condition), then captures in
the same play its blacklist file (unattended-upgrades.j2, through the
template lookup) and what repository.yml and preflight.yml give apt_source,
with the deb822 source and the pins apt_source renders from it.

Given as host variables, as the roles that run before would leave them:
``preflight_report`` (published by roles/preflight) and, where a test says
so, ``apt_source_trial`` (published by apt_source's trial: the build the
repository carries).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
import role_run

# The collection loader, as ansible-playbook starts it (before any Templar use below).
role_run.init_plugin_loader()

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = REPO_ROOT / "roles"
DRIVER_ROLE = ROLES_DIR / "nvidia_driver"
COMPATIBILITY_FILE = REPO_ROOT / "files" / "compatibility.yml"

# Any fixed text: the template action would fill in ansible.cfg's string.
ANSIBLE_MANAGED = "Ansible managed: gpufleet unit test"

# ansible_facts as `setup` reports them on bare-metal GPU servers.
FAKE_FACTS: dict[str, dict[str, Any]] = {
    "ubuntu2004": {
        "distribution": "Ubuntu",
        "distribution_version": "20.04",
        "distribution_major_version": "20",
        "distribution_release": "focal",
        "os_family": "Debian",
        "kernel": "5.4.0-169-generic",
    },
    "ubuntu2204": {
        "distribution": "Ubuntu",
        "distribution_version": "22.04",
        "distribution_major_version": "22",
        "distribution_release": "jammy",
        "os_family": "Debian",
        "kernel": "5.15.0-91-generic",
    },
    "debian12": {
        "distribution": "Debian",
        "distribution_version": "12.5",
        "distribution_major_version": "12",
        "distribution_release": "bookworm",
        "os_family": "Debian",
        "kernel": "6.1.0-18-amd64",
    },
}
for _facts in FAKE_FACTS.values():
    _facts.update(architecture="x86_64", virtualization_role="NA", virtualization_type="NA")

_loader = DataLoader()


@functools.cache
def load_trusted(path: Path) -> Any:
    """Load a role YAML file as Ansible does: its Jinja strings are trusted templates."""
    return _loader.load_from_file(str(path), trusted_as_template=True)


def render_role_template(role: Path, template_name: str, variables: dict[str, Any]) -> str:
    """roles/<role>/templates/<template_name> rendered as ansible.builtin.template renders it.

    Same options as the action's defaults: trim_blocks on, lstrip_blocks
    off, "\\n" newlines, backslashes not escaped.
    """
    path = role / "templates" / template_name
    templar = Templar(loader=_loader).copy_with_new_env(searchpath=[str(path.parent)], available_variables=variables)
    text = templar.template(
        trust_as_template(path.read_text()),
        escape_backslashes=False,
        overrides={"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"},
    )
    return str(text or "")


def preflight_report(facts: dict[str, Any], **found: Any) -> dict[str, Any]:
    """The preflight_report fact roles/preflight publishes (tasks/check.yml), for a healthy 8-GPU host.

    ``found`` replaces entries, e.g. nvswitch_count=4, driver_module_source='signed'.
    """
    version = facts["distribution_version"] if facts["distribution"] == "Ubuntu" else facts["distribution_major_version"]
    report = {
        "passed": True,
        "os": f"{facts['distribution']} {version}",
        "gpu_pci_addresses": [f"0000:{bus:02x}:00.0" for bus in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)],
        "gpu_count": 8,
        "nvswitch_count": 0,
        "secure_boot": "disabled",
        "driver_module_source": "dkms",
        "nouveau_loaded": False,
        "in_container": False,
        "kernel_release": facts["kernel"],
        "free_disk_gb": 812.4,
    }
    unknown = set(found) - set(report)
    assert not unknown, f"preflight_report has no {sorted(unknown)}"
    report.update(found)
    return report


# nvidia_driver's validate.yml and preflight.yml, then what the tests read.
DRIVER = role_run.Batch(FAKE_FACTS, [
    role_run.include_role("nvidia_driver", "validate"),
    role_run.include_role("nvidia_driver", "preflight", skip_apt_source=True),
], after=[
    role_run.expose("apt_source", "hold"),
    role_run.apt_source_capture("nvidia_driver", "repository.yml", "main", "main_", also={
        **role_run.names("nvidia_driver_fabricmanager", "nvidia_driver_kernel_release", "nvidia_driver_module_source",
                         "__nvidia_driver_cuda_keyring", "__nvidia_driver_cuda_keyring_deb"),
        "unattended-upgrades.j2": role_run.template("nvidia_driver", "unattended-upgrades.j2")}),
    role_run.apt_source_capture("nvidia_driver", "preflight.yml", "trial", "trial_"),
])


def _driver_case(host: str, source: str = "", preflight: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    settings = dict(overrides)
    if source:
        settings["nvidia_driver_source"] = source
    if preflight is not None:
        settings["preflight_report"] = preflight_report(FAKE_FACTS[host], **preflight)
    return settings


def declare_driver(host: str, source: str = "", preflight: dict[str, Any] | None = None, **overrides: Any) -> None:
    """Run this case of driver() with the others in one run (test modules declare the cases they know up front)."""
    DRIVER.declare(host, **_driver_case(host, source, preflight, **overrides))


def driver_config(host: str, source: str = "", preflight: dict[str, Any] | None = None, **overrides: Any) -> role_run.Outcome:
    """What roles/nvidia_driver resolved on fake host ``host`` (a FAKE_FACTS key) for nvidia_driver_source ``source``.

    ``preflight``: when given, the preflight role ran first and published
    preflight_report with these entries changed (see preflight_report());
    when None, it did not, and the role's defaults fall back to the facts.
    ``overrides`` are inventory variables (nvidia_driver_*, or apt_source_trial
    as the driver's trial would publish it).
    """
    return DRIVER.get(host, **_driver_case(host, source, preflight, **overrides))


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """A script of the project (not a package) imported as module ``name`` (its file stem by default).

    It is registered in sys.modules, where dataclasses and pickling look their module up.
    """
    spec = importlib.util.spec_from_file_location(name or path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def checker() -> ModuleType:
    """tests/check_argument_specs.py, imported as a module (tests/ is not a package)."""
    return load_script(REPO_ROOT / "tests" / "check_argument_specs.py")


@pytest.fixture(scope="session")
def driver() -> Callable[..., role_run.Outcome]:
    """Factory fixture: ``driver('ubuntu2204', 'nvidia', preflight={'nvswitch_count': 4}, nvidia_driver_headless=False)``.

    Results are cached for the session (the same arguments give the same
    object); tests must not modify them.
    """
    return driver_config

