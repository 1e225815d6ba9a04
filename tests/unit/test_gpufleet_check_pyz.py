"""gpufleet_check.pyz, the one file a node receives, and the package it is built from.

* the committed roles/payload/files/gpufleet_check.pyz is a fresh build of
  roles/payload/files/gpufleet_check/ (tools/build_pyz.py --check), and a build is
  byte-identical whatever the file times, umask or stray __pycache__;
* it runs (``--help``, ``--json``) under a python without torch and reports
  torch as missing, also through gpu_verify's ``executable`` wrapper from a
  copy in another directory, as the script module runs it on a node;
* ``from gpufleet_check import count_pci_gpus`` works from it, with the
  smoke_training role's own command;
* train.py is found beside the .pyz (or beside the package from source);
* each module imports on its own: standard library only at import time (torch
  inside functions), no star imports, no import cycle, and only the imports
  the package docstring lists.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from conftest import load_script, load_trusted

REPO_ROOT = Path(__file__).resolve().parents[2]
PAYLOAD_DIR = REPO_ROOT / "roles" / "payload" / "files"
PACKAGE_DIR = PAYLOAD_DIR / "gpufleet_check"
PYZ = PAYLOAD_DIR / "gpufleet_check.pyz"
BUILDER = REPO_ROOT / "tools" / "build_pyz.py"
MODULES = (
    "checks",
    "cli",
    "common",
    "dcgm",
    "facts",
    "health",
    "health_checks",
    "launcher",
    "metrics",
    "nccl",
    "profiles",
    "xid",
)
# Each module's imports within the package (the package docstring draws them).
PACKAGE_IMPORTS = {
    "common": set(),
    "facts": {"common"},
    "launcher": {"common", "nccl"},
    "metrics": set(),
    "nccl": set(),
    "profiles": {"common"},
    "health": {"common", "profiles"},
    "xid": set(),
    "dcgm": set(),
    "health_checks": {"common", "dcgm", "facts", "health", "profiles", "xid"},
    "checks": {"common", "facts", "health", "health_checks", "launcher", "profiles"},
    "cli": {"checks", "common", "launcher", "metrics", "profiles"},
    "__init__": {"facts"},
    "__main__": {"cli"},
}
HEALTH_CHECKS = ("gpu_errors", "pcie", "clocks", "nvlink", "xid", "interconnect", "dcgm")
TORCH_MISSING = "torch_cuda: torch is not installed in this environment"


@pytest.fixture(scope="module")
def builder() -> Any:
    return load_script(BUILDER, "gpufleet_build_pyz")


def has_torch(python: str) -> bool:
    probe = subprocess.run(
        [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """(interpreter, environment) of a python without torch: the system's python3 (a node before
    the pytorch role), else this one with a torch that cannot be imported first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONWARNINGS"] = "ignore"
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK) and not has_torch(candidate):
            return candidate, env
    blocker = tmp_path_factory.mktemp("no-torch") / "torch"
    blocker.mkdir()
    (blocker / "__init__.py").write_text('raise ImportError("torch is blocked by the test")\n')
    return sys.executable, {**env, "PYTHONPATH": str(blocker.parent)}


@pytest.fixture
def empty_host(tmp_path: Path) -> list[str]:
    """The check's options for a machine without GPUs, drivers or nvidia-smi."""
    for name in ("sysfs", "libs"):
        (tmp_path / name).mkdir()
    return [
        "--sysfs-pci-dir",
        str(tmp_path / "sysfs"),
        "--module-version-file",
        str(tmp_path / "none"),
        "--driver-proc-file",
        str(tmp_path / "none"),
        "--driver-lib-dir",
        str(tmp_path / "libs"),
    ]


def run(cmd: list[str], env: dict[str, str], check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=check, **kwargs)


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


def assert_torch_reported_missing(proc: subprocess.CompletedProcess[str]) -> None:
    """As before the split: rc 1, torch_cuda the only failure, the GPU checks skipped "no GPU"."""
    assert proc.returncode == 1, explain(proc)
    report = json.loads(proc.stdout)
    assert (report["schema"], report["verdict"], report["reasons"]) == ("gpufleet-check/1", "fail", [TORCH_MISSING])
    assert report["versions"]["torch"] is None
    checks = {check["name"]: check for check in report["checks"]}
    assert list(checks) == [
        "driver_version",
        "nvidia_smi",
        "torch_cuda",
        "libraries",
        "gemm",
        "memory_bandwidth",
        "allreduce_busbw",
        "p2p_topology",
        *HEALTH_CHECKS,
    ]
    for name in (
        "driver_version",
        "nvidia_smi",
        "gemm",
        "memory_bandwidth",
        "allreduce_busbw",
        "p2p_topology",
        *HEALTH_CHECKS,
    ):
        assert checks[name]["verdict"] == "skipped" and checks[name]["detail"].startswith("no GPU"), checks[name]
    assert checks["libraries"]["detail"] == "no GPU (torch is not installed)"


# --------------------------------------------------------------------------- the build


def test_committed_pyz_is_current() -> None:
    """make payload-build after every change to roles/payload/files/gpufleet_check/, and commit the .pyz with it."""
    proc = run([sys.executable, str(BUILDER), "--check"], dict(os.environ))
    assert proc.returncode == 0, explain(proc)
    assert "is current" in proc.stdout


def test_check_names_a_stale_archive(tmp_path: Path) -> None:
    stale = tmp_path / "gpufleet_check.pyz"
    stale.write_bytes(PYZ.read_bytes() + b"\n")
    proc = run([sys.executable, str(BUILDER), "--check", "--output", str(stale)], dict(os.environ))
    assert proc.returncode == 1, explain(proc)
    assert f"{stale} is not a build of" in proc.stderr and "make payload-build" in proc.stderr
    proc = run([sys.executable, str(BUILDER), "--check", "--output", str(tmp_path / "missing.pyz")], dict(os.environ))
    assert proc.returncode == 1 and "cannot be read" in proc.stderr, explain(proc)


def test_build_is_reproducible(builder: Any, tmp_path: Path) -> None:
    """Two builds, one from a copy with other file times, a stray __pycache__ and another umask: the same bytes."""
    copy = tmp_path / "gpufleet_check"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path in copy.iterdir():
        os.utime(path, (1_900_000_000, 1_900_000_000))
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "checks.cpython-311.pyc").write_bytes(b"\0" * 16)
    (copy / "notes.txt").write_text("not a module\n")
    old_umask = os.umask(0o077)
    try:
        first, second = builder.build(), builder.build(copy)
    finally:
        os.umask(old_umask)
    assert first == second == PYZ.read_bytes()
    written = tmp_path / "out" / "gpufleet_check.pyz"
    written.parent.mkdir()
    proc = run([sys.executable, str(BUILDER), "--output", str(written)], dict(os.environ))
    assert proc.returncode == 0, explain(proc)
    assert written.read_bytes() == first and written.stat().st_mode & 0o777 == 0o755


def test_archive_layout() -> None:
    """Shebang, then the modules and a top-level __main__.py: sorted, stored, dated 1980-01-01, mode 0644."""
    data = PYZ.read_bytes()
    assert data.startswith(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(PYZ) as archive:
        infos = archive.infolist()
        names = [info.filename for info in infos]
        assert names == sorted(names)
        assert names == ["__main__.py", *sorted(f"gpufleet_check/{p.name}" for p in PACKAGE_DIR.glob("*.py"))]
        assert {f"gpufleet_check/{m}.py" for m in (*MODULES, "__init__", "__main__")} == set(names[1:])
        for info in infos:
            assert info.date_time == (1980, 1, 1, 0, 0, 0), info
            assert info.compress_type == zipfile.ZIP_STORED and info.external_attr >> 16 == 0o100644, info
            if info.filename != "__main__.py":
                assert archive.read(info) == (PAYLOAD_DIR / info.filename).read_bytes(), info.filename


# --------------------------------------------------------------------------- running it without torch


def test_pyz_help_without_torch(bare_python: tuple[str, dict[str, str]]) -> None:
    python, env = bare_python
    proc = run([python, str(PYZ), "--help"], env)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.startswith("usage: gpufleet_check.pyz ")
    assert "Multi-node training: gpufleet_check.pyz train --help. Exit codes: 0 pass, 1 fail, 2 usage." in " ".join(
        proc.stdout.split()
    )  # argparse wraps the epilog
    proc = run([python, str(PYZ), "train", "--help"], env)
    assert proc.returncode == 0 and proc.stdout.startswith(
        "usage: gpufleet_check.pyz train [options] [-- payload args...]"
    ), explain(proc)


def test_pyz_json_without_torch(bare_python: tuple[str, dict[str, str]], empty_host: list[str], tmp_path: Path) -> None:
    python, env = bare_python
    env = {**env, "PATH": str(tmp_path)}  # no nvidia-smi
    assert_torch_reported_missing(run([python, str(PYZ), "--json", *empty_host], env))


def test_gpu_verify_runs_the_pyz_through_its_launcher(
    bare_python: tuple[str, dict[str, str]], empty_host: list[str], tmp_path: Path
) -> None:
    """gpu_verify sends the .pyz base64-encoded on the stdin of one command, `sh -c <launcher> gpufleet-check
    <gpu_verify_python> <fallback> <args>`: the launcher falls back to the system python3 where gpu_verify_python does
    not exist yet, runs the checks from a private temporary directory and leaves nothing behind."""
    python, env = bare_python
    role = REPO_ROOT / "roles" / "gpu_verify"
    tasks = {t.get("name"): t for t in load_trusted(role / "tasks" / "check.yml")}
    variables = load_trusted(role / "vars" / "main.yml")
    # The payload role's file, located by its `locate` entry point (no path out of gpu_verify's folder), read once
    # on the controller and sent on the command's stdin.
    assert variables["__gpu_verify_check_script"] == "{{ payload_files.check }}"
    locate = load_trusted(REPO_ROOT / "roles" / "payload" / "tasks" / "locate.yml")[0]["ansible.builtin.set_fact"]
    assert locate["payload_files"]["check"] == "{{ role_path }}/files/gpufleet_check.pyz"
    read = tasks["Read the health checks for every node"]
    assert read["ansible.builtin.slurp"]["src"] == "{{ __gpu_verify_check_script }}"
    assert read["run_once"] is True and read["delegate_to"] == "localhost"
    command = tasks["Run the health checks"]["ansible.builtin.command"]
    assert command["stdin"] == "{{ %s.content }}" % read["register"]
    words = shlex.split(command["cmd"])
    assert words[:6] == ["sh", "-c", "{{", "__gpu_verify_launcher", "|", "quote"]
    remote_tmp = tmp_path / "tmp"
    remote_tmp.mkdir()
    zipapp = base64.b64encode(PYZ.read_bytes()).decode() + "\n"  # the command module adds the newline
    proc = run(
        [
            "/bin/sh",
            "-c",
            variables["__gpu_verify_launcher"],
            "gpufleet-check",
            str(tmp_path / "venv" / "bin" / "python"),
            python,
            "--json",
            *empty_host,
        ],
        {**env, "TMPDIR": str(remote_tmp)},
        input=zipapp,
    )
    assert_torch_reported_missing(proc)
    assert list(remote_tmp.iterdir()) == []
    # The venv's interpreter when it is there (here a stand-in that names itself and the file it was given).
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text('#!/bin/sh\necho "venv python: $(basename "$1") $2"\n')
    venv_python.chmod(0o755)
    proc = run(
        ["/bin/sh", "-c", variables["__gpu_verify_launcher"], "gpufleet-check", str(venv_python), python, "--json"],
        {**env, "TMPDIR": str(remote_tmp)},
        input=zipapp,
    )
    assert (proc.returncode, proc.stdout) == (0, "venv python: gpufleet_check.pyz --json\n"), explain(proc)
    assert list(remote_tmp.iterdir()) == []


def test_count_pci_gpus_imports_from_the_pyz(bare_python: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    """smoke_training's own command (with a stand-in torch) imports from the .pyz, even beside a stale
    gpufleet_check.py that an older release installed in the payload directory."""
    python, env = bare_python
    payload_dir = tmp_path / "payload"
    payload_dir.mkdir()
    shutil.copyfile(PYZ, payload_dir / PYZ.name)
    (payload_dir / "gpufleet_check.py").write_text('raise ImportError("the stale single-file gpufleet_check.py")\n')
    fake = tmp_path / "fake-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("class cuda:\n    device_count = staticmethod(lambda: 3)\n")
    [task] = [
        t
        for t in load_trusted(REPO_ROOT / "roles" / "smoke_training" / "tasks" / "run.yml")
        if t.get("name") == "Count the GPUs torch sees and those on the PCI bus"
    ]
    argv = Templar(
        loader=DataLoader(), variables={"smoke_training_python": python, "smoke_training_payload_dir": str(payload_dir)}
    ).template(task["ansible.builtin.command"]["argv"])
    assert argv[-1] == str(payload_dir / "gpufleet_check.pyz")
    proc = run([str(a) for a in argv], {**env, "PYTHONPATH": str(fake.parent)})
    assert proc.returncode == 0, explain(proc)
    counts = json.loads(proc.stdout)
    assert counts["torch"] == 3 and isinstance(counts["pci"], int)

    sysfs = tmp_path / "sysfs"
    for address, pci_class in (
        ("0000:18:00.0", "0x030200"),
        ("0000:19:00.0", "0x030000"),
        ("0000:05:00.0", "0x068000"),
    ):
        (sysfs / address).mkdir(parents=True)
        (sysfs / address / "vendor").write_text("0x10de\n")
        (sysfs / address / "class").write_text(pci_class + "\n")
    code = (
        f"import sys; sys.path.insert(0, {str(PYZ)!r}); from gpufleet_check import count_pci_gpus; "
        f"print(count_pci_gpus({str(sysfs)!r}))"
    )
    proc = run([python, "-c", code], env)
    assert (proc.returncode, proc.stdout.strip()) == (0, "2"), explain(proc)


# --------------------------------------------------------------------------- where train.py is looked for


def test_payload_is_found_beside_the_pyz(bare_python: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    python, env = bare_python
    where = tmp_path / "somewhere"
    where.mkdir()
    shutil.copyfile(PYZ, where / PYZ.name)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gpufleet_check import launcher; "
        "print(launcher.find_payload())"
    )
    proc = run([python, "-c", code, str(where / PYZ.name)], env)
    assert proc.stdout.strip() == "/opt/gpufleet/payload/train.py", explain(proc)  # nothing beside it
    (where / "train.py").write_text("")
    for archive in (str(where / PYZ.name), PYZ.name):  # also a relative sys.path entry
        proc = run([python, "-c", code, archive], env, cwd=where)
        assert proc.stdout.strip() == str(where / "train.py"), explain(proc)
    proc = run([python, "-c", code.replace("sys.argv[1]", repr(str(PAYLOAD_DIR)))], env)
    assert proc.stdout.strip() == str(PAYLOAD_DIR / "train.py"), explain(
        proc
    )  # from source: roles/payload/files/train.py


@pytest.mark.skipif(Path("/opt/gpufleet/payload/train.py").exists(), reason="this machine has an installed payload")
def test_train_without_a_payload_is_a_usage_error(bare_python: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    python, env = bare_python
    shutil.copyfile(PYZ, tmp_path / PYZ.name)
    proc = run([python, str(tmp_path / PYZ.name), "train", "--nproc-per-node", "1"], env)
    assert proc.returncode == 2, explain(proc)
    out = json.loads(proc.stdout)
    assert (out["rc"], out["result"], out["log_tail"]) == (2, None, "payload not found: /opt/gpufleet/payload/train.py")


# --------------------------------------------------------------------------- the modules


def module_tree(name: str) -> ast.Module:
    path = PACKAGE_DIR / f"{name}.py"
    return ast.parse(path.read_text(), filename=str(path))


def package_imports(tree: ast.Module) -> set[str]:
    """The modules of the package a module imports (relative imports: the package's only kind)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1, ast.dump(node)
            found |= {node.module} if node.module else {alias.name for alias in node.names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(n.split(".")[0] == "gpufleet_check" for n in names), f"absolute import: {ast.dump(node)}"
    return found


@pytest.mark.parametrize("name", sorted(PACKAGE_IMPORTS))
def test_module_imports_are_standard_library_and_declared(name: str) -> None:
    tree = module_tree(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert all(alias.name != "*" for alias in node.names), f"{name}: star import"
    top_level = [
        node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
    ]
    for node in top_level:
        modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
        for module in modules:
            root = module.split(".")[0]
            assert root == "__future__" or root in sys.stdlib_module_names, f"{name}: imports {module} at import time"
    assert package_imports(tree) == PACKAGE_IMPORTS[name]


def test_no_import_cycle() -> None:
    done: list[str] = []
    todo = {name: set(deps) for name, deps in PACKAGE_IMPORTS.items() if name in MODULES}
    while todo:
        ready = sorted(name for name, deps in todo.items() if deps <= set(done))
        assert ready, f"import cycle among {sorted(todo)}"
        done += ready
        for name in ready:
            del todo[name]
    assert done.index("common") < done.index("checks") < done.index("cli")


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports_on_its_own(bare_python: tuple[str, dict[str, str]], name: str) -> None:
    """A fresh interpreter imports the module alone: no torch, and nothing of the package it does not need."""
    python, env = bare_python
    code = (
        f"import importlib, sys; importlib.import_module('gpufleet_check.{name}'); "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('gpufleet_check.') or m == 'torch')))"
    )
    pythonpath = os.pathsep.join(filter(None, [str(PAYLOAD_DIR), env.get("PYTHONPATH")]))
    proc = run([python, "-c", code], {**env, "PYTHONPATH": pythonpath})
    assert proc.returncode == 0, explain(proc)
    loaded = {m.removeprefix("gpufleet_check.") for m in proc.stdout.split()}
    needed, todo = set(), [name, "__init__"]
    while todo:
        module = todo.pop()
        for dep in PACKAGE_IMPORTS[module] - needed:
            needed.add(dep)
            todo.append(dep)
    assert loaded == (needed | {name}) - {"__init__", "__main__"}, loaded


def test_metrics_loads_without_its_package() -> None:
    """metrics.py imports nothing of the package: the monitoring tests load it as a file."""
    module = load_script(PACKAGE_DIR / "metrics.py", "gpufleet_metrics_alone")
    try:
        assert module.metrics_text({"verdict": "pass"}).startswith("# HELP gpufleet_verify_passed ")
    finally:
        del sys.modules[module.__name__]


def test_package_runs_from_source(
    bare_python: tuple[str, dict[str, str]], empty_host: list[str], tmp_path: Path
) -> None:
    """PYTHONPATH=roles/payload/files python3 -m gpufleet_check: the same command line as the .pyz."""
    python, env = bare_python
    env = {
        **env,
        "PATH": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PAYLOAD_DIR), env.get("PYTHONPATH")])),
    }
    proc = run([python, "-m", "gpufleet_check", "--help"], env)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python3 -m gpufleet_check "), explain(proc)
    assert_torch_reported_missing(run([python, "-m", "gpufleet_check", "--json", *empty_host], env))
