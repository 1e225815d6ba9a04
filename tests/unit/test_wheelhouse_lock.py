"""files/wheelhouse_lock.py: the hash lock of a wheelhouse, as pip --require-hashes reads it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "files" / "wheelhouse_lock.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False)


def wheelhouse(tmp_path: Path, files: dict[str, bytes]) -> Path:
    house = tmp_path / "wheels"
    house.mkdir()
    for name, content in files.items():
        (house / name).write_bytes(content)
    return house


def test_one_pin_per_project_with_the_sha256_of_every_wheel(tmp_path):
    house = wheelhouse(
        tmp_path,
        {
            "torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl": b"t311",
            "torch-2.5.1+cu121-cp310-cp310-linux_x86_64.whl": b"t310",
            "typing_extensions-4.12.2-py3-none-any.whl": b"te",
            "MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": b"ms",
            "index.html": b"<html>",
        },
    )
    done = run(str(house))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    digest = {c: hashlib.sha256(c).hexdigest() for c in (b"t311", b"t310", b"te", b"ms")}
    assert lines == [
        f"markupsafe==2.1.5 --hash=sha256:{digest[b'ms']}",
        "torch==2.5.1+cu121 " + " ".join(sorted(f"--hash=sha256:{digest[c]}" for c in (b"t311", b"t310"))),
        f"typing-extensions==4.12.2 --hash=sha256:{digest[b'te']}",
    ]


def test_out_file_is_written_whole(tmp_path):
    house = wheelhouse(tmp_path, {"mpmath-1.3.0-py3-none-any.whl": b"m"})
    out = tmp_path / "lock.txt"
    assert run(str(house), "--out", str(out)).returncode == 0
    assert out.read_text().splitlines()[1] == f"mpmath==1.3.0 --hash=sha256:{hashlib.sha256(b'm').hexdigest()}"
    assert not out.with_name("lock.txt.tmp").exists()


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"torch-2.5.1-cp311-cp311-linux_x86_64.whl": b"a", "torch-2.4.1-cp311-cp311-linux_x86_64.whl": b"b"},
            "holds torch at 2.4.1, 2.5.1: keep one version per project",
        ),
        ({"README.txt": b""}, "holds no wheels"),
        ({"torch.whl": b""}, "torch.whl is not a wheel file name"),
    ],
)
def test_refuses_what_pip_would_refuse(tmp_path, files, message):
    done = run(str(wheelhouse(tmp_path, files)))
    assert done.returncode == 2
    assert message in done.stderr


def test_missing_directory(tmp_path):
    done = run(str(tmp_path / "absent"))
    assert done.returncode == 2 and "is not a directory" in done.stderr
