"""Helpers for the unit tests; the ``driver`` fixture: what roles/nvidia_driver configures on a fake host.

Role logic runs for real (tests/unit/role_run.py): ansible-core's
PlaybookExecutor runs a play in this process on fake hosts (one per case; the
settings are inventory host variables, the facts are put in an in-memory fact
cache, and the hosts' connection refuses any module or command, so only
controller-side tasks can run). Variable precedence, task order, ``when``,
task ``vars``, loops, ``include_role``/``include_vars`` and the lookups are
Ansible's own. ``driver()`` runs nvidia_driver's tasks/validate.yml and
tasks/preflight.yml, then captures in the same play (where the role's
defaults and vars are visible) its blacklist file, what repository.yml and
preflight.yml give roles/apt_source, and the source and pins apt_source
renders from it.

What is still done by hand, and why (here and in the role test modules):

* the facts: fake ``ansible_facts`` instead of ``setup`` on a real host, and
  the facts other roles publish, given as host variables where a test needs
  them (``preflight_report`` of roles/preflight, ``apt_source_trial`` of
  apt_source's trial, ``payload_files`` of the payload role);
* tasks that run on a host do not run: the includes of apt_source's trial
  and configuration in nvidia_driver's preflight.yml and cuda's trial.yml and source.yml
  are skipped (``apply`` adds ``apt_source_repository is not defined``, which
  only those includes set; role_run checks that); where a role's file mixes
  host probes (command, shell, stat, uri) with the set_fact/fail tasks that
  read their results (pytorch's preflight.yml, slurm's configure.yml), the
  test runs copies of those set_fact/fail tasks after validate.yml, the
  probes' registered results given as host variables;
* the arguments of tasks that run commands (pytorch's pip install,
  container's apt, nvidia-ctk and image build tasks and its handler,
  gpu_verify's health checks), and the ``when`` of container's CDI block,
  are templated in a set_fact of the play (their registered inputs as task
  variables) instead of being run;
* templates are rendered by the ``ansible.builtin.template`` lookup (the
  template action would copy the file to the host), from the play rather
  than from inside the role: none of the roles' templates reads role_path or
  a relative file.

Everything else a test reads is what the run left on the host.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
import role_run
import yaml
from ansible.parsing.dataloader import DataLoader

# The collection loader, as ansible-playbook starts it (the clone is gpufleet.fleet), then the process the role
# runs happen in, forked while pytest is still small (role_run.start_runner).
role_run.init_plugin_loader()
role_run.start_runner()

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = REPO_ROOT / "roles"
# The payload's package (gpufleet_check) imports as on a node: roles/payload/files on sys.path, before any test
# module (tests/unit/gpu_checks/ among them) imports it.
if str(ROLES_DIR / "payload" / "files") not in sys.path:
    sys.path.insert(0, str(ROLES_DIR / "payload" / "files"))

# `LC_ALL=C apt-cache policy slurmd` on each OS (tests/unit/data/apt/policy-slurmd-*.txt: Debian 12's captured,
# Ubuntu's edited from it in the fields that name the release; each file's header lines say so): slurmd not
# installed yet (the node's first run), or installed (Ubuntu 20.04).
SLURMD_POLICY = {
    os: "".join(
        line
        for line in (REPO_ROOT / "tests/unit/data/apt" / f"policy-slurmd-{name}.txt").read_text().splitlines(True)
        if not line.startswith("# ")
    )
    for os, name in (("debian12", "bookworm"), ("ubuntu2204", "jammy"), ("ubuntu2004", "focal"))
}

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


def preflight_requirements(**settings: Any) -> dict[str, Any]:
    """roles/preflight's defaults as gpufleet.fleet.host_facts receives them (no prefix), ``settings`` replacing
    some; the kernel is a fixed release."""
    defaults = load_trusted(ROLES_DIR / "preflight" / "defaults" / "main.yml")
    values = {name[len("preflight_") :]: value for name, value in defaults.items()}
    values.update(kernel_release="6.8.0-49-generic", mok_certificate="")
    values.update(settings)
    return values


def preflight_found(**changes: Any) -> dict[str, Any]:
    """What gpufleet.fleet.host_facts reads on a healthy 2-GPU host (two H100s, PCI ID 2330): 1771 GB free, headers
    installed, Secure Boot off; ``changes`` replacing some."""
    value = {
        "nvidia": {
            "gpus": [{"address": f"0000:{bus:02x}:00.0", "device_id": "0x2330"} for bus in (0x18, 0x2A)],
            "nvswitches": [],
        },
        "free_bytes": 1771081269248,
        "secure_boot": "disabled",
        "nouveau_loaded": False,
        "headers_installed": True,
        "headers_candidate": False,
        "mok_enrolled": False,
    }
    value.update(changes)
    return value


def host_facts_found(gpus: int, device_id: str = "0x2330") -> dict[str, Any]:
    """A registered result of gpufleet.fleet.host_facts (its ``found``) on a host with ``gpus`` NVIDIA GPUs."""
    return {
        "changed": False,
        "found": {
            "nvidia": {
                "gpus": [{"address": f"0000:{0x18 + i:02x}:00.0", "device_id": device_id} for i in range(gpus)],
                "nvswitches": [],
            }
        },
    }


def preflight_report(facts: dict[str, Any], **found: Any) -> dict[str, Any]:
    """The preflight_report fact roles/preflight publishes (tasks/probe.yml), for a healthy 8-GPU host.

    ``found`` replaces entries, e.g. nvswitch_count=4, driver_module_source='signed'.
    """
    version = (
        facts["distribution_version"] if facts["distribution"] == "Ubuntu" else facts["distribution_major_version"]
    )
    report = {
        "passed": True,
        "os": f"{facts['distribution']} {version}",
        "gpu_pci_addresses": [f"0000:{bus:02x}:00.0" for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)],
        # An HGX H100: NVIDIA H100 80GB HBM3, PCI ID 2330 (README.md "Compatible GPUs" of
        # github.com/NVIDIA/open-gpu-kernel-modules, tag 535.261.03), as sysfs reads it.
        "gpu_device_ids": ["0x2330"] * 8,
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
DRIVER = role_run.Batch(
    FAKE_FACTS,
    [
        role_run.import_role("nvidia_driver", "validate"),
        role_run.import_role("nvidia_driver", "preflight", skip_apt_source=True),
    ],
    after=[
        role_run.expose("apt_source", "hold"),
        role_run.apt_source_capture(
            "nvidia_driver",
            "repository.yml",
            "main_",
            also={
                **role_run.names(
                    "nvidia_driver_fabricmanager",
                    "nvidia_driver_kernel_release",
                    "nvidia_driver_module_source",
                    "__nvidia_driver_cuda_keyring",
                    "__nvidia_driver_cuda_keyring_deb",
                ),
                "unattended-upgrades.j2": role_run.template("nvidia_driver", "unattended-upgrades.j2"),
                "trial_inputs": role_run.apt_source_inputs("nvidia_driver", "preflight.yml", "trial"),
            },
            trial_file="preflight.yml",
        ),
    ],
)

# The facts roles/cuda reads.
CUDA_FACTS: dict[str, dict[str, Any]] = {
    "ubuntu2004": {"distribution": "Ubuntu", "distribution_version": "20.04", "distribution_major_version": "20"},
    "ubuntu2204": {"distribution": "Ubuntu", "distribution_version": "22.04", "distribution_major_version": "22"},
    "debian12": {"distribution": "Debian", "distribution_version": "12.7", "distribution_major_version": "12"},
}
# roles/cuda's validate.yml and trial.yml on each case's host (main's first steps; the entry point probe is trial.yml
# alone, after play 1's judgement), then what trial.yml and source.yml give apt_source's trial and main (and what
# apt_source writes).
CUDA = role_run.Batch(
    CUDA_FACTS,
    [role_run.import_role("cuda", "validate"), role_run.import_role("cuda", "trial", skip_apt_source=True)],
    after=[
        role_run.expose("apt_source", "hold"),
        role_run.apt_source_capture(
            "cuda",
            "source.yml",
            "main_",
            also={
                **role_run.names("__cuda_public_repository_url", "__cuda_repo_os", "__cuda_supported_os"),
                "trial_inputs": role_run.apt_source_inputs("cuda", "trial.yml", "trial"),
            },
            trial_file="trial.yml",
        ),
    ],
)


def cuda_config(host: str, **settings: Any) -> role_run.Outcome:
    """What roles/cuda resolved on fake host ``host`` (a CUDA_FACTS key; or the message it stopped with); ``settings``:
    inventory variables."""
    return CUDA.get(host, **settings)


def _driver_case(
    host: str, source: str = "", preflight: dict[str, Any] | None = None, **overrides: Any
) -> dict[str, Any]:
    settings = dict(overrides)
    if source:
        settings["nvidia_driver_source"] = source
    if preflight is not None:
        settings["preflight_report"] = preflight_report(FAKE_FACTS[host], **preflight)
    return settings


def declare_driver(host: str, source: str = "", preflight: dict[str, Any] | None = None, **overrides: Any) -> None:
    """Run this case of driver() with the others in one run (test modules declare the cases they know up front)."""
    DRIVER.declare(host, **_driver_case(host, source, preflight, **overrides))


def driver_config(
    host: str, source: str = "", preflight: dict[str, Any] | None = None, **overrides: Any
) -> role_run.Outcome:
    """What roles/nvidia_driver resolved on fake host ``host`` (a FAKE_FACTS key) for nvidia_driver_source ``source``.

    ``preflight``: when given, the preflight role ran first and published
    preflight_report with these entries changed (see preflight_report());
    when None, it did not, and the role's defaults fall back to the facts.
    ``overrides`` are inventory variables (nvidia_driver_*, or apt_source_trial
    as the driver's trial would publish it).
    """
    return DRIVER.get(host, **_driver_case(host, source, preflight, **overrides))


def host_tool(tool: str) -> str:
    """The path of a tool of the build machine (apt-get, apt-ftparchive, gpg, ...); the test is skipped without it."""
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed on this controller")
    return path


def run_module(tmp_path: Path, name: str, env: dict[str, str] | None = None, **arguments: Any) -> dict[str, Any]:
    """The collection's module ``name`` run for real on this machine, as Ansible runs it (its arguments in a JSON
    file, in ``tmp_path``), with ``env`` added to this process's environment; its result."""
    arguments_file = tmp_path / "arguments.json"
    arguments_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": arguments}))
    proc = subprocess.run(
        [sys.executable, "-m", f"ansible_collections.gpufleet.fleet.plugins.modules.{name}", str(arguments_file)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO_ROOT / ".ansible" / "collections")},
        cwd=tmp_path,
    )
    return json.loads(proc.stdout)


def ansible_playbook(
    tmp_path: Path, plays: list, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``plays`` run by the venv's ansible-playbook in ``tmp_path``, with the clone's roles and collection
    (an ansible.cfg there), on localhost unless ``args`` give an inventory; ``env`` adds to its environment."""
    config = tmp_path / "ansible.cfg"
    config.write_text(
        "[defaults]\n"
        f"roles_path = {ROLES_DIR}\n"
        f"collections_path = {REPO_ROOT / '.ansible' / 'collections'}\n"
        "retry_files_enabled = false\n"
        "interpreter_python = auto_silent\n"
    )
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    inventory = [] if "-i" in args else ["-i", "localhost,"]
    venv_bin = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin"
    return subprocess.run(
        [str(venv_bin / "ansible-playbook"), *inventory, str(playbook), *args],
        cwd=tmp_path,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(config),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


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
    """tools/check_argument_specs.py, imported as a module (tools/ is not a package)."""
    return load_script(REPO_ROOT / "tools" / "check_argument_specs.py")


@pytest.fixture(scope="session")
def driver() -> Callable[..., role_run.Outcome]:
    """Factory fixture: ``driver('ubuntu2204', 'nvidia', preflight={'nvswitch_count': 4},
    nvidia_driver_headless=False)``.

    Results are cached for the session (the same arguments give the same
    object); tests must not modify them.
    """
    return driver_config
