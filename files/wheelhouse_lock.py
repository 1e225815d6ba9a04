#!/usr/bin/env python
"""Write a pip hash lock for a wheelhouse: one exact pin per project with the
SHA-256 of each of its wheels, for `pip install --require-hashes -r LOCK`.

    python3 files/wheelhouse_lock.py /srv/mirror/wheels > pytorch-wheels.lock
    python3 files/wheelhouse_lock.py /srv/mirror/wheels --out pytorch-wheels.lock

The pytorch role installs an offline wheelhouse (pytorch_wheelhouse_url)
only against such a file (pytorch_hashes_file), kept on the Ansible
controller: a wheel swapped on the mirror no longer matches its hash and pip
refuses it. Write the lock where the wheels were downloaded and reviewed, not
from the mirror the nodes install from.

Names and versions come from the wheel file names (PEP 427:
name-version[-build]-python-abi-platform.whl). Two versions of one project
in the directory are an error (pip would refuse the lock): keep one.
Exit status: 0 written, 2 bad directory or conflicting versions.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lock_lines(directory: Path) -> list[str]:
    """The lock's lines; ValueError naming the problem."""
    projects: dict[str, dict[str, list[str]]] = {}
    wheels = sorted(directory.glob("*.whl"))
    if not wheels:
        raise ValueError(f"{directory} holds no wheels (*.whl)")
    for wheel in wheels:
        match = WHEEL_NAME.match(wheel.name)
        if not match:
            raise ValueError(f"{wheel.name} is not a wheel file name (name-version-python-abi-platform.whl)")
        versions = projects.setdefault(canonical(match["name"]), {})
        versions.setdefault(match["version"], []).append(sha256(wheel))
    lines = []
    for name in sorted(projects):
        versions = projects[name]
        if len(versions) > 1:
            raise ValueError(f"{directory} holds {name} at {', '.join(sorted(versions))}: keep one version per project")
        ((version, digests),) = versions.items()
        hashes = " ".join(f"--hash=sha256:{d}" for d in sorted(set(digests)))
        lines.append(f"{name}=={version} {hashes}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("directory", type=Path, help="the wheelhouse directory")
    parser.add_argument("--out", type=Path, help="write here (atomically) instead of to stdout")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        print(f"wheelhouse_lock: {args.directory} is not a directory", file=sys.stderr)
        return 2
    try:
        lines = lock_lines(args.directory)
    except ValueError as error:
        print(f"wheelhouse_lock: {error}", file=sys.stderr)
        return 2
    text = (
        f"# pip hash lock of {args.directory.name}/ ({len(lines)} projects), by files/wheelhouse_lock.py\n"
        + "\n".join(lines)
        + "\n"
    )
    if args.out:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
