"""The published outputs the health checks are tested on (tests/unit/data/gpu/), and the command line run on a
machine without GPUs.

Every input under tests/unit/data/gpu/ is a published output copied verbatim, with a sidecar
``<file>.source`` naming the repository, path and commit (or URL) it came from; a failure case is
such an output edited in ONE field, its .source saying which field, from what to what. An output
captured on the lent H200 (tests/gpu/device-check.sh) says so, with its date and stack. The
InfiniBand sysfs tree is the real one of an H100 node (leptonai/gpud's testdata); where a test
edits one of its files, it does so in a copy under tmp_path, and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpufleet_check import health

from .payload_path import PYZ

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"


def data(kind: str, name: str) -> str:
    return (DATA / kind / name).read_text()


def smi(name: str) -> list[dict[str, Any]]:
    kind = "smi-xml" if name.endswith(".xml") else "smi-text"
    return health.parse_smi_query(data(kind, name))


def verdicts(found: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(f["gpu"], f["verdict"]) for f in found]


IB_TREE = DATA / "ib-sysfs" / "h100-8ib-1roce"


def run_cli(
    tmp_path: Path, *args: str, path: str | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """gpufleet_check.pyz on a machine without GPUs (empty sysfs, no driver, no tools on PATH) and a torch
    that cannot be imported; returns the process and its checks by name."""
    for name in ("sysfs", "libs", "bin", "ib", "modules"):
        (tmp_path / name).mkdir(exist_ok=True)
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / "__init__.py").write_text('raise ImportError("torch is blocked by the test")\n')
    env = {
        **os.environ,
        "PATH": path or str(tmp_path / "bin"),
        "PYTHONPATH": str(blocker.parent),
        "PYTHONWARNINGS": "ignore",
    }
    argv = [
        "--json",
        "--sysfs-pci-dir",
        str(tmp_path / "sysfs"),
        "--module-version-file",
        str(tmp_path / "none"),
        "--driver-proc-file",
        str(tmp_path / "none"),
        "--driver-lib-dir",
        str(tmp_path / "libs"),
        "--sysfs-infiniband-dir",
        str(tmp_path / "ib"),
        "--sysfs-module-dir",
        str(tmp_path / "modules"),
        *args,
    ]
    proc = subprocess.run(
        [sys.executable, str(PYZ), *argv], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    try:
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    except ValueError:
        checks = {}
    return proc, checks


CAT, SLEEP = shutil.which("cat"), shutil.which("sleep")  # absolute: PATH holds the fakes only


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    tool = bin_dir / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
