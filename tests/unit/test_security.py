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
ANSIBLE_DIRS = [REPO / "roles", REPO / "playbooks", REPO / "molecule"]
SCANNED_SUFFIXES = {".yml", ".yaml", ".j2", ".sh", ".py", ".cfg", ".conf", ""}
BLIND_TRUST = re.compile(r"trusted\s*=\s*yes|\[\s*trusted|apt-key\b|allow-unauthenticated|AllowUnauthenticated")
PIPE_TO_SHELL = re.compile(r"\b(curl|wget)\b[^\n|]*\|\s*(sudo\s+)?(ba|z)?sh\b")
# A task argument that templates a secret variable (a value, not a command's wording).
SECRET_ARGUMENT = re.compile(r"\{\{[^}]*(password|passwd|secret|token|private_key|munge_key(?!_path))[^}]*\}\}", re.IGNORECASE)


def source_files() -> Iterator[Path]:
    for top in [*ANSIBLE_DIRS, REPO / "files", REPO / "site.yml", REPO / "ansible.cfg"]:
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
    assert {"nvidia-driver.sources.j2", "cuda.sources.j2", "main.yml", "gpufleet_check.py"} <= names


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
    offenders = [str(p.relative_to(REPO)) for p in yaml_files()
                 if p.is_relative_to(REPO / "roles") and ("apt_repository" in p.read_text() or
                                                         re.search(r"sources\.list\.d/[^\s\"']*\.list", p.read_text()))]
    assert offenders == []


def mode_values() -> Iterator[tuple[Path, Any]]:
    for path in yaml_files():
        for doc in yaml.safe_load_all(path.read_text()):
            for task in tasks_in(doc):
                for _, args in module_args(task):
                    if isinstance(args, dict) and "mode" in args:
                        yield path, args["mode"]


def test_modes_are_quoted_octal_and_never_world_writable():
    modes = list(mode_values())
    assert len(modes) > 20, "the scan found too few modes"
    for path, mode in modes:
        if isinstance(mode, str) and "{{" in mode:
            continue  # a templated mode (the lab's directory list) is checked where it is defined
        assert isinstance(mode, str) and re.fullmatch(r"0[0-7]{3}", mode), f"{path}: mode {mode!r} is not a quoted octal"
        assert int(mode[-1]) & 2 == 0, f"{path}: mode {mode} is world-writable"


def test_lab_directory_modes_are_not_world_writable():
    text = (REPO / "playbooks" / "lab.yml").read_text()
    for mode in re.findall(r"mode:\s*\"(0[0-7]{3})\"", text):
        assert int(mode[-1]) & 2 == 0, mode


def test_tasks_with_secrets_have_no_log():
    for path in yaml_files():
        for doc in yaml.safe_load_all(path.read_text()):
            for task in tasks_in(doc):
                for module, args in module_args(task):
                    if SECRET_ARGUMENT.search(yaml.safe_dump(args)) and not module.endswith(("debug", "assert", "fail")):
                        assert task.get("no_log") in (True, "true"), f"{path}: task {task.get('name')!r} handles a secret"


def _munge_key_tasks() -> list[dict]:
    tasks = yaml.safe_load((REPO / "roles" / "slurm" / "tasks" / "munge.yml").read_text())
    return list(tasks_in(tasks))


def test_munge_key_is_private_to_munge():
    """Every task that creates or sets the munge key leaves it 0400, owned by munge."""
    path = yaml.safe_load((REPO / "roles" / "slurm" / "vars" / "main.yml").read_text())["__slurm_munge_key_path"]
    assert path == "/etc/munge/munge.key"
    tasks = _munge_key_tasks()
    modes = [t["ansible.builtin.file"] for t in tasks if "ansible.builtin.file" in t
             and "__slurm_munge_key_path" in t["ansible.builtin.file"]["path"]]
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
