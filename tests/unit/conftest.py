"""Helpers for the unit tests: resolve what roles/nvidia_driver would configure, without a host.

The role decides everything it writes in a handful of ``set_fact`` tasks
(tasks/validate.yml, tasks/preflight.yml) whose Jinja expressions read the
role's defaults, its vars files and ``ansible_facts``. ``driver_config()``
evaluates *those expressions, read from the role's own task files*, with
ansible-core's Templar and a set of fake facts, and renders the role's
templates the way the ``template`` action does. Nothing is copied from the
role into the tests, so the tests follow the role when it changes.

What is mirrored by hand (kept deliberately small):

* variable precedence: role defaults < role vars (vars/main.yml) <
  include_vars results (files/compatibility.yml as __nvidia_driver_matrix,
  the OS layout file) < the scenario's overrides (think ``-e``) < facts set
  by earlier set_fact tasks < the task's own ``vars:``;
* validate.yml's ``first_found`` choice of the OS layout file
  (<Distribution>-<major>.yml, <Distribution>.yml, <os_family>.yml);
* the task order: every ``set_fact`` of validate.yml, stopping at the first
  ``fail`` task whose ``when`` is true (as the play would), then every
  ``set_fact`` of preflight.yml. The other preflight.yml ``fail`` tasks read
  registered results of host probes, so tests evaluate the ones they need
  one at a time with ``DriverConfig.condition()``.
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

# The collection loader, as ansible-playbook starts it: templates that call
# lookups (ansible.builtin.file) resolve their plugins.
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

_SET_FACT = ("ansible.builtin.set_fact", "set_fact")
_FAIL = ("ansible.builtin.fail", "fail")
# Task keys that are not the module (enough for the tasks these tests read).
_TASK_KEYWORDS = frozenset(
    {"name", "when", "vars", "register", "loop", "notify", "changed_when", "failed_when", "check_mode", "args", "tags", "become"}
)

_loader = DataLoader()


@functools.cache
def load_trusted(path: Path) -> Any:
    """Load a role YAML file as Ansible does: its Jinja strings are trusted templates."""
    return _loader.load_from_file(str(path), trusted_as_template=True)


def _action(task: dict, names: tuple[str, ...]) -> Any:
    """The arguments of ``task`` when it uses one of the action ``names``, else None."""
    for name in names:
        if name in task:
            return task[name]
    return None


def _conditions(task: dict) -> list:
    when = task.get("when", [])
    return when if isinstance(when, list) else [when]


def _os_layout_file(facts: dict[str, Any]) -> Path:
    """The vars file validate.yml's first_found lookup picks for these facts."""
    candidates = (
        f"{facts['distribution']}-{facts['distribution_major_version']}.yml",
        f"{facts['distribution']}.yml",
        f"{facts['os_family']}.yml",
    )
    for name in candidates:
        path = DRIVER_ROLE / "vars" / name
        if path.is_file():
            return path
    raise FileNotFoundError(f"no package layout in {DRIVER_ROLE / 'vars'} for {candidates}")


@dataclass
class DriverConfig:
    """What roles/nvidia_driver resolved for one fake host and one set of settings."""

    host: str
    variables: dict[str, Any]
    # Name and rendered message of the validate.yml fail task that stopped the
    # role, or None when every check passed.
    failure: tuple[str, str] | None = None
    # Names of the set_fact results, in the order the role produced them.
    facts_set: list[str] = field(default_factory=list)

    def _templar(self, extra: dict[str, Any] | None = None) -> Templar:
        return Templar(loader=_loader, variables={**self.variables, **(extra or {})})

    def __getitem__(self, name: str) -> Any:
        """A variable as the role sees it, fully templated (e.g. cfg['__nvidia_driver_repo_url'])."""
        return self._templar().template(self.variables[name])

    def template(self, expression: str) -> Any:
        """Template a Jinja expression string with this host's variables."""
        return self._templar().template(trust_as_template(expression))

    def render(self, template_name: str) -> str:
        """Render roles/nvidia_driver/templates/<template_name> as the template action would.

        Same options as ansible.builtin.template's defaults: trim_blocks on,
        lstrip_blocks off, "\\n" newlines, backslashes not escaped.
        """
        return render_role_template(DRIVER_ROLE, template_name, self.variables)

    def task(self, task_file: str, name_contains: str) -> dict:
        """The task of roles/nvidia_driver/tasks/<task_file> whose name contains ``name_contains``."""
        tasks = [t for t in load_trusted(DRIVER_ROLE / "tasks" / task_file) if name_contains in t.get("name", "")]
        if len(tasks) != 1:
            raise LookupError(f"{len(tasks)} tasks in {task_file} have a name containing {name_contains!r}")
        return tasks[0]

    def condition(self, task_file: str, name_contains: str) -> bool:
        """Whether the ``when`` of a task (all conditions ANDed) is true for this host."""
        task = self.task(task_file, name_contains)
        templar = self._templar(task.get("vars"))
        return all(templar.evaluate_conditional(c) for c in _conditions(task))

    def task_args(self, task_file: str, name_contains: str) -> dict:
        """The templated module arguments of a task (its first non-keyword key)."""
        task = self.task(task_file, name_contains)
        module = next(k for k in task if k not in _TASK_KEYWORDS)
        return self._templar(task.get("vars")).template(task[module])

    def _run_set_facts(self, task_file: str, stop_on_fail: bool) -> None:
        """Apply the set_fact tasks of ``task_file`` in order (honouring ``when``).

        With ``stop_on_fail``, a ``fail`` task whose ``when`` is true ends the
        run there and is recorded in ``failure``, as it would end the play.
        """
        for task in load_trusted(DRIVER_ROLE / "tasks" / task_file):
            set_fact = _action(task, _SET_FACT)
            fail = _action(task, _FAIL)
            if set_fact is None and not (stop_on_fail and fail is not None):
                continue
            templar = self._templar(task.get("vars"))
            if not all(templar.evaluate_conditional(c) for c in _conditions(task)):
                continue
            if fail is not None:
                self.failure = (task["name"], str(templar.template(fail["msg"])).strip())
                return
            # set_fact templates all its keys against the variables from before the task.
            results = {key: templar.template(value) for key, value in set_fact.items() if key != "cacheable"}
            self.variables.update(results)
            self.facts_set.extend(results)


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


def driver_config(host: str, source: str = "", preflight: dict[str, Any] | None = None, **overrides: Any) -> DriverConfig:
    """Resolve roles/nvidia_driver for fake host ``host`` (a FAKE_FACTS key) and nvidia_driver_source ``source``.

    ``preflight``: when given, the preflight role ran first and published
    preflight_report with these entries changed (see preflight_report());
    when None, it did not, and the role's defaults fall back to the facts.
    ``overrides`` are inventory or extra variables (nvidia_driver_*).
    """
    facts = FAKE_FACTS[host]
    variables: dict[str, Any] = {}
    variables.update(load_trusted(DRIVER_ROLE / "defaults" / "main.yml"))
    variables.update(load_trusted(DRIVER_ROLE / "vars" / "main.yml"))
    variables.update(
        ansible_facts=dict(facts),
        inventory_hostname=f"gpu-{host}",
        role_path=str(DRIVER_ROLE),
        ansible_managed=ANSIBLE_MANAGED,
    )
    # validate.yml's two include_vars tasks.
    variables["__nvidia_driver_matrix"] = load_trusted(COMPATIBILITY_FILE)
    variables.update(load_trusted(_os_layout_file(facts)))
    variables.update(overrides)
    if preflight is not None:
        variables["preflight_report"] = preflight_report(facts, **preflight)
    if source:
        variables["nvidia_driver_source"] = source

    config = DriverConfig(host=host, variables=variables)
    config._run_set_facts("validate.yml", stop_on_fail=True)
    if config.failure is None:
        config._run_set_facts("preflight.yml", stop_on_fail=False)
    return config


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
def driver() -> Callable[..., DriverConfig]:
    """Factory fixture: ``driver('ubuntu2204', 'nvidia', preflight={'nvswitch_count': 4}, nvidia_driver_headless=False)``.

    Results are cached for the session (the same arguments give the same
    object); tests must not modify them.
    """
    cache: dict[str, DriverConfig] = {}

    def _driver(host: str, source: str = "", preflight: dict[str, Any] | None = None, **overrides: Any) -> DriverConfig:
        key = repr((host, source, preflight, sorted(overrides.items())))
        if key not in cache:
            cache[key] = driver_config(host, source, preflight, **overrides)
        return cache[key]

    return _driver

