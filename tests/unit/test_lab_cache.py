"""tests/lab/files/lab_cache.py: the lab's download cache outside the clone, keyed by
content and checked (sha256) when reused."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "lab" / "files" / "lab_cache.py"


def run(cache: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--cache", str(cache), *args], capture_output=True, text=True, check=False
    )


def tree(root: Path, files: dict) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


def test_store_then_restore_gives_the_same_files_with_a_manifest(tmp_path):
    src = tree(
        tmp_path / "src",
        {
            "pool/main/a.deb": b"A",
            "pool/non-free/b.deb": b"BB",
            "kernel-release": b"6.1\n",
            "dists/bookworm/InRelease": b"signed",
            ".fetched-x": b"",
        },
    )
    cache = tmp_path / "cache"
    stored = run(cache, "store", "--key", "debs-abc", "--from", str(src), "--exclude", "dists/*", "--exclude", ".*")
    assert stored.returncode == 0, stored.stderr
    manifest = (cache / "debs-abc" / "SHA256SUMS").read_text().splitlines()
    kernel = hashlib.sha256(b"6.1\n").hexdigest()
    assert manifest == [
        f"{kernel}  kernel-release",
        f"{hashlib.sha256(b'A').hexdigest()}  pool/main/a.deb",
        f"{hashlib.sha256(b'BB').hexdigest()}  pool/non-free/b.deb",
    ]
    dest = tmp_path / "dest"
    restored = run(cache, "restore", "--key", "debs-abc", "--into", str(dest))
    assert restored.returncode == 0, restored.stderr
    assert "3 file(s) of debs-abc checked (sha256)" in restored.stdout
    assert (dest / "pool/non-free/b.deb").read_bytes() == b"BB"
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "kernel-release",
        "pool/main/a.deb",
        "pool/non-free/b.deb",
    ]


def test_an_absent_entry_is_a_miss_and_changes_nothing(tmp_path):
    dest = tree(tmp_path / "dest", {"keep": b"k"})
    result = run(tmp_path / "cache", "restore", "--key", "wheels-1", "--into", str(dest))
    assert result.returncode == 3
    assert "no entry wheels-1" in result.stdout
    assert [p.name for p in dest.iterdir()] == ["keep"]


@pytest.mark.parametrize("damage", ["changed", "missing", "manifest"])
def test_a_damaged_entry_is_dropped_and_nothing_is_restored(tmp_path, damage):
    cache = tmp_path / "cache"
    run(cache, "store", "--key", "base-x", "--from", str(tree(tmp_path / "src", {"rootfs.tar": b"tar", "b": b"b"})))
    entry = cache / "base-x"
    if damage == "changed":
        (entry / "rootfs.tar").write_bytes(b"tampered")
    elif damage == "missing":
        (entry / "b").unlink()
    else:
        (entry / "SHA256SUMS").write_text("not a manifest line\n")
    dest = tmp_path / "dest"
    result = run(cache, "restore", "--key", "base-x", "--into", str(dest))
    assert result.returncode == 3
    assert "is not usable" in result.stdout and "removing it" in result.stdout
    assert not entry.exists()
    assert not dest.exists()


def test_store_replaces_the_entry_whole_and_prune_drops_older_inputs(tmp_path):
    cache = tmp_path / "cache"
    run(cache, "store", "--key", "wheels-old", "--from", str(tree(tmp_path / "a", {"x.whl": b"1"})))
    run(cache, "store", "--key", "wheels-new", "--from", str(tree(tmp_path / "b", {"y.whl": b"2"})))
    run(cache, "store", "--key", "debs-1", "--from", str(tree(tmp_path / "c", {"z.deb": b"3"})))
    run(cache, "store", "--key", "wheels-new", "--from", str(tree(tmp_path / "d", {"w.whl": b"4"})))
    assert sorted(p.name for p in (cache / "wheels-new").iterdir()) == ["SHA256SUMS", "w.whl"]
    pruned = run(cache, "prune", "--keep-prefix", "wheels-", "--keep", "wheels-new")
    assert pruned.returncode == 0 and "removed wheels-old" in pruned.stdout
    assert sorted(p.name for p in cache.iterdir()) == ["debs-1", "wheels-new"]  # no temporary entry left


@pytest.mark.parametrize("key", ["../etc", "a/b", "", "-x"])
def test_a_key_that_is_not_a_name_is_refused(tmp_path, key):
    result = run(tmp_path / "cache", "restore", f"--key={key}", "--into", str(tmp_path / "d"))
    assert result.returncode == 2
    assert "is not a cache key" in result.stderr


def test_storing_an_empty_directory_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run(tmp_path / "cache", "store", "--key", "k", "--from", str(tmp_path / "empty"))
    assert result.returncode == 2 and "nothing to store" in result.stderr
    assert not (tmp_path / "cache" / "k").exists()
