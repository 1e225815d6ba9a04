#!/usr/bin/env python
"""Build roles/payload/files/gpufleet_check.pyz, the one file a node receives, from
the package roles/payload/files/gpufleet_check/.

The archive is a zipapp (``python3 gpufleet_check.pyz --json``) that is also
importable (``sys.path.insert(0, ".../gpufleet_check.pyz")``, then
``from gpufleet_check import count_pci_gpus``). It is byte-identical on every
build of the same sources, so that the committed copy can be checked against
them: the shebang ``#!/usr/bin/env python3``, then a zip of the package's
``*.py`` files (no __pycache__, nothing else) and a top-level __main__.py, in
sorted order, stored uncompressed (no dependence on the zlib at hand), each
entry dated 1980-01-01 00:00:00 with mode 0644.

    python3 tools/build_pyz.py            # write roles/payload/files/gpufleet_check.pyz
    python3 tools/build_pyz.py --check    # exit 1 when the committed one is not a fresh build
    python3 tools/build_pyz.py --output /tmp/x.pyz

Standard library only. ``make payload-build`` runs it.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAYLOAD_FILES = REPO / "roles" / "payload" / "files"
PACKAGE = "gpufleet_check"
SOURCE_DIR = PAYLOAD_FILES / PACKAGE
TARGET = PAYLOAD_FILES / f"{PACKAGE}.pyz"
SHEBANG = b"#!/usr/bin/env python3\n"
DATE_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can carry
ENTRY_MODE = 0o100644  # a regular file, rw-r--r--
ARCHIVE_MODE = 0o755  # the .pyz itself: executable through its shebang
REBUILD = "run `make payload-build` (python3 tools/build_pyz.py) and commit the .pyz with its sources"
MAIN = b'''\
"""python3 gpufleet_check.pyz: gpufleet_check.cli.main (written by tools/build_pyz.py)."""

import sys

from gpufleet_check.cli import main

sys.exit(main())
'''


def sources(source_dir: Path = SOURCE_DIR) -> list[tuple[str, bytes]]:
    """(name in the archive, content) of every module of the package, sorted by name."""
    modules = sorted(p for p in source_dir.glob("*.py") if p.is_file())
    if not any(p.name == "__init__.py" for p in modules):
        raise SystemExit(f"build_pyz: {source_dir} is not a package (no __init__.py)")
    return [(f"{PACKAGE}/{p.name}", p.read_bytes()) for p in modules]


def build(source_dir: Path = SOURCE_DIR) -> bytes:
    """The archive's bytes: the same for the same sources, whatever the clock, umask or file order."""
    entries = sorted([("__main__.py", MAIN), *sources(source_dir)])
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=DATE_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # Unix, so that external_attr holds the mode (the default on Windows is 0)
            info.external_attr = ENTRY_MODE << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def write(path: Path, data: bytes) -> None:
    """Replace path with data (a temporary file beside it, then a rename), mode 0755."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, ARCHIVE_MODE)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build gpufleet_check.pyz from roles/payload/files/gpufleet_check/.")
    parser.add_argument(
        "--check",
        action="store_true",
        help="build in memory and exit 1 when the archive differs from this build (writes nothing)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=TARGET,
        metavar="PATH",
        help=f"the archive to write or check (default {TARGET.relative_to(REPO)})",
    )
    args = parser.parse_args(argv)
    data = build()
    if args.check:
        try:
            current = args.output.read_bytes()
        except OSError as exc:
            print(f"build_pyz: {args.output} cannot be read ({exc.strerror}): {REBUILD}", file=sys.stderr)
            return 1
        if current != data:
            print(f"build_pyz: {args.output} is not a build of {SOURCE_DIR}/ as it is now: {REBUILD}", file=sys.stderr)
            return 1
        print(f"build_pyz: {args.output} is current ({len(data)} bytes)")
        return 0
    write(args.output, data)
    print(f"build_pyz: wrote {args.output} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
