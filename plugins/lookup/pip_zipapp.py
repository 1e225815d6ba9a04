"""The controller's pip as one zip file that a node's Python runs: play 1 resolves the wheel set on the node with it.

``lookup('gpufleet.fleet.pip_zipapp')`` returns one mapping::

    {"path": "<the controller's local temporary directory>/gpufleet-pip-25.3.pyz",
     "version": "25.3", "min_python": "3.9", "problem": ""}

or, when the controller's pip cannot serve, ``{"path": "", "version": ..., "min_python": ..., "problem": "<why>"}``.

Why the controller's pip and not the node's: a node that play 2 has still to set up has no pip (Debian and
Ubuntu ship it apart from Python, and the virtual environment does not exist yet), and the pips it would get
(python3-venv's bundled 22.0.2 on Ubuntu 22.04, 23.0.1 on Debian 12) download every wheel to read its
dependencies even with ``--dry-run``. pip 25.3 is the first release whose ``pip install --dry-run`` reads
only an index's PEP 658 metadata files when the index serves them (pip's NEWS, 25.3 (2025-10-24):
https://github.com/pypa/pip/blob/main/NEWS.rst#253-2025-10-24, issue https://github.com/pypa/pip/issues/12603,
pull request https://github.com/pypa/pip/pull/13482; checked in the wheels from PyPI: 25.2's
``pip/_internal/resolution/resolvelib/resolver.py`` still calls ``prepare_linked_requirements_more``, which
downloads every file, 25.3's does not). requirements/dev.txt pins it for the controller.

The zip holds the ``pip`` package of the controller's Python as installed (pure Python; it vendors its own
dependencies) and a ``__main__.py`` that runs it, as pip's own zipapp does. It is written once per
ansible-playbook run into ansible's local temporary directory of the run (private to the user, removed when
the run ends), under a lock, so the hosts' workers share one file.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: pip_zipapp
author: gpufleet maintainers (@gpufleet)
short_description: The controller's pip as a zip file a node's Python can run (play 1's wheel resolution)
description:
  - Builds, once per run, a zip of the controller's installed pip package with a __main__.py, in ansible's local
    temporary directory, and returns its path, pip's version and the oldest Python that pip runs on.
  - A pip older than 25.3 (which downloads whole wheels even with --dry-run) is not built; C(problem) says why.
options:
  directory:
    description: Where to write the zip; empty for ansible's local temporary directory of the run.
    type: str
    default: ""
"""

RETURN = r"""
_raw:
  description: One mapping {path, version, min_python, problem} (a list of one element).
  type: list
  elements: dict
"""

import fcntl
import importlib.metadata
import os
import re
import zipfile
from pathlib import Path
from typing import Any

from ansible.plugins.lookup import LookupBase

# The first pip whose --dry-run does not download a wheel whose PEP 658 metadata the index serves (see above).
MIN_PIP = (25, 3)
# A zip's timestamps: fixed, so that the same pip gives the same bytes.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_MAIN = b"import runpy\nrunpy.run_module('pip', run_name='__main__', alter_sys=True)\n"


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: '25.3.post1' -> (25, 3)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:2])


def min_python(requires_python: str | None) -> str:
    """The oldest Python a Requires-Python allows, as X.Y ('>=3.9' -> '3.9'); '' when it names no lower bound."""
    match = re.search(r">=\s*(\d+)\.(\d+)", requires_python or "")
    return f"{match[1]}.{match[2]}" if match else ""


def controller_pip() -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return None


def write_zipapp(package_dir: Path, target: Path) -> None:
    """Zip ``package_dir`` (the pip package) as pip/ with a __main__.py into ``target``, atomically."""
    partial = target.with_name(target.name + f".{os.getpid()}.partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), _MAIN, compress_type=zipfile.ZIP_DEFLATED)
        for path in sorted(package_dir.rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            info = zipfile.ZipInfo("pip/" + path.relative_to(package_dir).as_posix(), _EPOCH)
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED)
    partial.replace(target)


def zipapp(directory: str | os.PathLike[str], dist: importlib.metadata.Distribution | None = None) -> dict[str, Any]:
    """The mapping the lookup returns, the zip written into ``directory`` when it is not there yet."""
    dist = dist if dist is not None else controller_pip()
    if dist is None:
        return {
            "path": "",
            "version": "",
            "min_python": "",
            "problem": (
                "the controller's Python has no pip (install pip 25.3 or newer into the Python that runs ansible)"
            ),
        }
    version = dist.version
    minimum = min_python(dist.metadata.get("Requires-Python"))
    result = {"path": "", "version": version, "min_python": minimum, "problem": ""}
    if _release(version) < MIN_PIP:
        result["problem"] = (
            f"the controller's pip is {version} ({dist.locate_file('')}), which downloads every wheel to read "
            f"its dependencies; pip {'.'.join(map(str, MIN_PIP))} or newer reads only the index's metadata "
            "(requirements/dev.txt pins it: make venv, or python3 -m pip install 'pip>=25.3' in ansible's Python)"
        )
        return result
    package_dir = Path(str(dist.locate_file("pip")))
    if not (package_dir / "__main__.py").is_file():
        result["problem"] = f"the controller's pip {version} has no package directory at {package_dir}"
        return result
    target = Path(directory) / f"gpufleet-pip-{version}.pyz"
    with open(Path(directory) / ".gpufleet-pip.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            write_zipapp(package_dir, target)
    result["path"] = str(target)
    return result


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        self.set_options(var_options=variables, direct=kwargs)
        directory = self.get_option("directory")
        if not directory:
            from ansible import constants as C

            directory = C.DEFAULT_LOCAL_TMP
        Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
        return [zipapp(directory)]
