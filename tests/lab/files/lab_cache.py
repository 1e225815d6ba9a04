#!/usr/bin/env python
"""The lab's download cache, outside the clone, keyed by content, checked on reuse.

Everything `make lab` downloads (the base image's root file system, the
mirror's .deb files, the wheelhouse, NVIDIA's CUDA wheels) is stored under
one directory (default /var/cache/gpufleet-lab, GPUFLEET_LAB_CACHE in the
Makefile) as entries named by a key that the lab computes from the inputs of
the download (package lists, versions, the script that fetches them). Each
entry holds the files and a SHA256SUMS manifest; it appears whole or not at
all (written under a temporary name, then renamed). A fresh clone, or a lab
removed with `make lab-clean`, takes its downloads from here; a changed
input is another key and downloads again.

  lab_cache.py --cache DIR restore --key KEY --into DEST
      exit 0: every file of the entry matched its sha256 and is now in DEST
      (hard links where DEST is on the same file system, copies elsewhere);
      exit 3: no usable entry (absent, or a file missing or changed, in which
      case the entry is removed and the reason printed); nothing in DEST changed.
  lab_cache.py --cache DIR store --key KEY --from SRC [--exclude GLOB ...]
      copies the regular files under SRC into the entry KEY, replacing it.
  lab_cache.py --cache DIR prune --keep-prefix PREFIX --keep KEY
      removes the other entries whose key starts with PREFIX (older inputs).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

MANIFEST = "SHA256SUMS"
MISS = 3
KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class CacheError(Exception):
    pass


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def entry_dir(cache: Path, key: str) -> Path:
    if not KEY_RE.match(key):
        raise CacheError(f"lab cache: {key!r} is not a cache key (letters, digits, '.', '_', '-')")
    return cache / key


def read_manifest(entry: Path) -> dict:
    """relative path -> sha256, from the entry's manifest."""
    files = {}
    for number, line in enumerate((entry / MANIFEST).read_text().splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if (
            not sep
            or not re.fullmatch(r"[0-9a-f]{64}", digest)
            or not name
            or name.startswith("/")
            or ".." in Path(name).parts
        ):
            raise CacheError(f"line {number} of {entry / MANIFEST} is not '<sha256>  <relative path>'")
        files[name] = digest
    return files


def check(entry: Path) -> tuple[dict, str]:
    """(manifest, "") when every file matches, else ({}, the reason)."""
    if not (entry / MANIFEST).is_file():
        return {}, "absent"
    try:
        files = read_manifest(entry)
    except CacheError as exc:
        return {}, str(exc)
    for name, digest in files.items():
        path = entry / name
        if not path.is_file():
            return {}, f"{name} is missing"
        if sha256(path) != digest:
            return {}, f"{name} does not match its sha256"
    return files, ""


def place(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        dest.unlink()
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def restore(cache: Path, key: str, into: Path) -> int:
    entry = entry_dir(cache, key)
    files, problem = check(entry)
    if problem:
        if problem != "absent":
            print(f"lab cache: entry {key} is not usable ({problem}); removing it, the lab downloads again")
            shutil.rmtree(entry, ignore_errors=True)
        else:
            print(f"lab cache: no entry {key}; the lab downloads")
        return MISS
    for name in files:
        place(entry / name, into / name)
    print(f"lab cache: {len(files)} file(s) of {key} checked (sha256) and reused from {cache}")
    return 0


def store(cache: Path, key: str, source: Path, excludes: list) -> int:
    entry = entry_dir(cache, key)
    if not source.is_dir():
        raise CacheError(f"lab cache: {source} is not a directory")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache))
    try:
        lines = []
        for path in sorted(p for p in source.rglob("*") if p.is_file() and not p.is_symlink()):
            name = path.relative_to(source).as_posix()
            if any(fnmatch.fnmatch(name, pattern) for pattern in excludes):
                continue
            place(path, tmp / name)
            lines.append(f"{sha256(tmp / name)}  {name}")
        if not lines:
            raise CacheError(f"lab cache: nothing to store under {source}")
        (tmp / MANIFEST).write_text("\n".join(lines) + "\n")
        os.chmod(tmp, 0o755)
        if entry.exists():
            shutil.rmtree(entry)
        tmp.rename(entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"lab cache: stored {len(lines)} file(s) as {key} in {cache}")
    return 0


def prune(cache: Path, prefix: str, keep: str) -> int:
    entry_dir(cache, keep)
    if not cache.is_dir():
        return 0
    for entry in sorted(cache.iterdir()):
        if entry.is_dir() and entry.name.startswith(prefix) and entry.name != keep:
            shutil.rmtree(entry)
            print(f"lab cache: removed {entry.name} (inputs changed since)")
    return 0


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--cache", required=True, type=Path, help="the cache directory")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("restore", "store", "prune"):
        p = sub.add_parser(name)
        if name == "prune":
            p.add_argument("--keep-prefix", required=True)
            p.add_argument("--keep", required=True)
        else:
            p.add_argument("--key", required=True)
    sub.choices["restore"].add_argument("--into", required=True, type=Path)
    sub.choices["store"].add_argument("--from", dest="source", required=True, type=Path)
    sub.choices["store"].add_argument("--exclude", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        if args.command == "restore":
            return restore(args.cache, args.key, args.into)
        if args.command == "store":
            return store(args.cache, args.key, args.source, args.exclude)
        return prune(args.cache, args.keep_prefix, args.keep)
    except CacheError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
