"""Security properties of what the roles and plays write, read from their sources.

* every apt source the roles write is a deb822 file with a Signed-By keyring;
  nothing anywhere trusts a repository blindly (trusted=yes), uses the
  deprecated global apt-key, or pipes a download into a shell;
* every file mode the roles, plays and molecule scenarios set is a quoted
  octal string, and none is world-writable;
* a task whose arguments template a secret variable (password, token,
  private key, munge key) has no_log.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIRS = [REPO / "roles", REPO / "playbooks", REPO / "molecule", REPO / "tests" / "lab"]
SCANNED_SUFFIXES = {".yml", ".yaml", ".j2", ".sh", ".py", ".cfg", ".conf", ""}
BLIND_TRUST = re.compile(r"trusted\s*=\s*yes|\[\s*trusted|apt-key\b|allow-unauthenticated|AllowUnauthenticated")
PIPE_TO_SHELL = re.compile(r"\b(curl|wget)\b[^\n|]*\|\s*(sudo\s+)?(ba|z)?sh\b")
# A task argument that templates a secret variable (a value, not a command's wording).
SECRET_ARGUMENT = re.compile(
    r"\{\{[^}]*(password|passwd|secret|token|private_key|munge_key(?!_path))[^}]*\}\}", re.IGNORECASE
)


def source_files() -> Iterator[Path]:
    for top in [*ANSIBLE_DIRS, REPO / "files", REPO / "tools", REPO / "site.yml", REPO / "ansible.cfg"]:
        paths = [top] if top.is_file() else top.rglob("*")
        for path in paths:
            if path.is_file() and path.suffix in SCANNED_SUFFIXES and "__pycache__" not in path.parts:
                yield path


def yaml_files() -> Iterator[Path]:
    for top in ANSIBLE_DIRS:
        yield from sorted(top.rglob("*.yml"))


def tasks_in(node: Any) -> Iterator[dict]:
    """Every task-like mapping in a YAML document, blocks and plays included."""
    if isinstance(node, list):
        for item in node:
            yield from tasks_in(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            yield from tasks_in(node.get(key))


def module_args(task: dict) -> Iterator[tuple[str, Any]]:
    """(module name, its arguments) of a task, for the keys that name a module."""
    for key, value in task.items():
        if "." in key or key in {"copy", "template", "file", "command", "shell", "user", "uri"}:
            yield key, value


def test_the_scan_sees_the_roles():
    names = {p.name for p in source_files()}
    # The payload's sources (gpufleet_check.pyz, the zipapp built from them, is not text) and the tools.
    assert {
        "source.sources.j2",
        "pin.pref.j2",
        "apt-repository-trial.sh",
        "main.yml",
        "checks.py",
        "launcher.py",
        "build_pyz.py",
    } <= names


@pytest.mark.parametrize("path", sorted(source_files()), ids=lambda p: str(p.relative_to(REPO)))
def test_no_blind_trust_and_no_pipe_to_shell(path):
    text = path.read_text(errors="replace")
    assert not BLIND_TRUST.search(text), f"{path}: {BLIND_TRUST.search(text)[0]}"
    assert not PIPE_TO_SHELL.search(text), f"{path}: {PIPE_TO_SHELL.search(text)[0]}"


@pytest.mark.parametrize("template", sorted(REPO.glob("roles/*/templates/*.sources.j2")), ids=lambda p: p.name)
def test_every_apt_source_is_signed_by_a_keyring(template):
    text = template.read_text()
    assert re.search(r"^Types:\s*deb\b", text, re.MULTILINE), "not a deb822 source"
    assert re.search(r"^Signed-By:\s*\S", text, re.MULTILINE), "no Signed-By keyring"


def test_roles_write_apt_sources_only_from_deb822_templates():
    """No role writes a one-line .list source (which could go without Signed-By)."""
    offenders = [
        str(p.relative_to(REPO))
        for p in yaml_files()
        if p.is_relative_to(REPO / "roles")
        and ("apt_repository" in p.read_text() or re.search(r"sources\.list\.d/[^\s\"']*\.list", p.read_text()))
    ]
    assert offenders == []


def mode_values() -> Iterator[tuple[Path, Any]]:
    for path in yaml_files():
        for doc in yaml.safe_load_all(path.read_text()):
            for task in tasks_in(doc):
                for _module, args in module_args(task):
                    if isinstance(args, dict) and "mode" in args:
                        yield path, args["mode"]


def test_modes_are_quoted_octal_and_never_world_writable():
    modes = list(mode_values())
    assert len(modes) > 20, "the scan found too few modes"
    for path, mode in modes:
        if isinstance(mode, str) and "{{" in mode:
            continue  # a templated mode (the lab's directory list) is checked where it is defined
        assert isinstance(mode, str) and re.fullmatch(r"0[0-7]{3}", mode), (
            f"{path}: mode {mode!r} is not a quoted octal"
        )
        assert int(mode[-1]) & 2 == 0, f"{path}: mode {mode} is world-writable"


def test_lab_directory_modes_are_not_world_writable():
    text = (REPO / "tests" / "lab" / "lab.yml").read_text()
    for mode in re.findall(r"mode:\s*\"(0[0-7]{3})\"", text):
        assert int(mode[-1]) & 2 == 0, mode


def test_tasks_with_secrets_have_no_log():
    for path in yaml_files():
        for doc in yaml.safe_load_all(path.read_text()):
            for task in tasks_in(doc):
                for module, args in module_args(task):
                    if SECRET_ARGUMENT.search(yaml.safe_dump(args)) and not module.endswith(
                        ("debug", "assert", "fail")
                    ):
                        assert task.get("no_log") in (True, "true"), (
                            f"{path}: task {task.get('name')!r} handles a secret"
                        )


def _munge_key_tasks() -> list[dict]:
    tasks = yaml.safe_load((REPO / "roles" / "slurm" / "tasks" / "munge.yml").read_text())
    return list(tasks_in(tasks))


def test_munge_key_is_private_to_munge():
    """Every task that creates or sets the munge key leaves it 0400, owned by munge."""
    path = yaml.safe_load((REPO / "roles" / "slurm" / "vars" / "main.yml").read_text())["__slurm_munge_key_path"]
    assert path == "/etc/munge/munge.key"
    tasks = _munge_key_tasks()
    modes = [
        t["ansible.builtin.file"]
        for t in tasks
        if "ansible.builtin.file" in t and "__slurm_munge_key_path" in t["ansible.builtin.file"]["path"]
    ]
    assert modes and all((m["mode"], m["owner"], m["group"]) == ("0400", "munge", "munge") for m in modes)
    (writer,) = [t for t in tasks if "stdin" in str(t.get("ansible.builtin.shell", ""))]
    command = writer["ansible.builtin.shell"]["cmd"]
    # Written under umask 0377 (0400 from the first byte), owned by munge, then moved into place.
    assert "umask 0377" in command and "chown munge:munge" in command and "mv -f" in command
    assert writer["no_log"] is True


def test_munge_key_copy_never_shows_its_content():
    """The block that reads and writes the key is no_log and diff-free, and so is each of its tasks."""
    blocks = [t for t in yaml.safe_load((REPO / "roles" / "slurm" / "tasks" / "munge.yml").read_text()) if "block" in t]
    (block,) = [b for b in blocks if any("slurp" in str(t) for t in b["block"])]
    assert block["no_log"] is True and block["diff"] is False
    assert all(task.get("no_log") is True for task in block["block"])


# --- offline installs are hash-checked ------------------------------------------


def test_offline_wheel_installs_need_a_hash_lock():
    """A wheelhouse install is refused without pytorch_hashes_file (by default), the
    lock reaches pip with --require-hashes, and the lab installs that way."""
    defaults = yaml.safe_load((REPO / "roles" / "pytorch" / "defaults" / "main.yml").read_text())
    assert defaults["pytorch_require_hashes_offline"] is True
    install = next(
        t
        for t in tasks_in(yaml.safe_load((REPO / "roles" / "pytorch" / "tasks" / "install.yml").read_text()))
        if "pip" in str(t.get("ansible.builtin.command", {}).get("argv", "")) and "install" in t.get("name", "").lower()
    )
    argv = install["ansible.builtin.command"]["argv"]
    assert "['--require-hashes', '-r', '/dev/stdin'] if __pytorch_hash_lines | length > 0" in argv
    lab = yaml.safe_load((REPO / "tests" / "lab" / "inventory" / "group_vars" / "all" / "main.yml").read_text())
    assert lab["pytorch_wheelhouse_url"] and lab["pytorch_hashes_file"] == "{{ lab_wheelhouse_lock }}"


# --- downloads retry, interrupted dpkg runs are finished ---------------------------


def role_task_files() -> Iterator[Path]:
    yield from sorted((REPO / "roles").glob("*/tasks/*.yml"))


def downloads(task: dict) -> bool:
    apt = task.get("ansible.builtin.apt")
    # A removal (state absent: nvidia_driver's purge of a driver gpufleet did not install) fetches nothing.
    if (
        isinstance(apt, dict)
        and any(k in apt for k in ("name", "deb", "update_cache"))
        and apt.get("state") != "absent"
    ):
        return True
    if "ansible.builtin.get_url" in task:
        return True
    argv = (
        str(task.get("ansible.builtin.command", {}).get("argv", ""))
        if isinstance(task.get("ansible.builtin.command"), dict)
        else ""
    )
    return "'pip', 'install'" in argv


DOWNLOADS = [
    (path, task["name"])
    for path in role_task_files()
    for task in tasks_in(yaml.safe_load(path.read_text()) or [])
    if downloads(task)
]


def test_the_download_scan_sees_the_installs():
    names = {name for _path, name in DOWNLOADS}
    assert "Install the NVIDIA driver packages" in names and "Install the library packages" in names
    # The key, keyring package and index refresh of every apt source are roles/apt_source's, once.
    assert "Fetch the signing key of the source" in names and "Refresh the package index" in names
    assert len(DOWNLOADS) >= 15


@pytest.mark.parametrize(("path", "name"), DOWNLOADS, ids=[f"{p.parent.parent.name}:{n}" for p, n in DOWNLOADS])
def test_every_download_retries_while_its_source_does_not_answer(path, name):
    """retries/until on every task that fetches (apt, get_url, pip), again only for an unreachable source."""
    task = next(t for t in tasks_in(yaml.safe_load(path.read_text())) if t.get("name") == name)
    assert int(task.get("retries", 0)) >= 2, f"{path.name}: {name} has no retries"
    register = task.get("register")
    until = " ".join(str(task.get("until", "")).split())
    # The rule itself (which failures are a source that did not answer) is the
    # test plugin gpufleet.fleet.fetch_failure, tested in test_plugins_jinja_tests.py.
    assert register and until == f"{register} is not gpufleet.fleet.fetch_failure"


INSTALLING_ROLES = sorted(
    {
        p.parent.parent.name
        for p, _name in DOWNLOADS
        if any(
            t.get("ansible.builtin.apt", {}).get("name") or t.get("ansible.builtin.apt", {}).get("deb")
            for t in tasks_in(yaml.safe_load(p.read_text()))
            if isinstance(t.get("ansible.builtin.apt"), dict)
        )
    }
    - {"preflight"}
)


@pytest.mark.parametrize("role", INSTALLING_ROLES)
def test_installing_roles_finish_an_interrupted_dpkg_run_first(role):
    """The role includes dpkg_recovery (once per run) before its first package install."""
    text = "\n".join(p.read_text() for p in sorted((REPO / "roles" / role / "tasks").glob("*.yml")))
    assert "name: dpkg_recovery" in text and "when: dpkg_recovery_checked is not defined" in text


def test_the_recovery_finishes_dpkg_and_reinstalls_half_installed_packages():
    tasks = list(tasks_in(yaml.safe_load((REPO / "roles" / "dpkg_recovery" / "tasks" / "main.yml").read_text())))
    commands = [t.get("ansible.builtin.command") for t in tasks]
    assert "dpkg --configure -a" in commands
    assert {"state": "fixed"} in [t.get("ansible.builtin.apt") for t in tasks]
    assert INSTALLING_ROLES == ["apt_source", "container", "cuda", "monitoring", "nvidia_driver", "pytorch", "slurm"]
