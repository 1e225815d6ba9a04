"""tests/lab/files/conftest-cache.py, the lab nodes' result cache of NVIDIA's conftest.sh probes (a lab
difference: Containerfile.node), with a fake compiler that counts its runs: a probe seen before is answered from
the cache as the compiler answered it (exit code, output, object file), and anything that decides a probe's
result makes it run again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "lab" / "files" / "conftest-cache.py"
FAKE_CC = """#!/bin/sh
echo run >> "$RUNS"
for a; do case $a in *.c) src=$a;; esac; done
echo "probe of $src" >&2
grep -q good "$src" || exit 1
printf 'object of %s' "$(cat "$src")" > "${src%.c}.o"
"""


@pytest.fixture
def probe(tmp_path):
    cc = tmp_path / "fake-cc"
    cc.write_text(FAKE_CC)
    cc.chmod(0o755)
    info = tmp_path / "dpkg-info"
    info.mkdir()
    (info / "linux-headers-6.1.0-50-amd64.md5sums").write_text("aaa  usr/src/linux-headers-6.1.0-50-amd64/Makefile\n")
    work = tmp_path / "build"
    (work / "conftest").mkdir(parents=True)
    (work / "conftest" / "headers.h").write_text("#define NV_LINUX_KCONFIG_H_PRESENT\n")
    env = {
        **os.environ,
        "RUNS": str(tmp_path / "runs"),
        "GPUFLEET_LAB_CCACHE": "",
        "GPUFLEET_LAB_CONFTEST_CACHE": str(tmp_path / "cache"),
        "GPUFLEET_LAB_DPKG_INFO": str(info),
    }

    def run(pid: int, code: str, *extra: str) -> subprocess.CompletedProcess:
        source = work / f"conftest{pid}.c"
        source.write_text(code)
        (work / f"conftest{pid}.o").unlink(missing_ok=True)
        args = ["-O2", f'-DKBUILD_BASENAME="#conftest{pid}"', *extra, "-c", source.name]
        result = subprocess.run(
            [sys.executable, str(SCRIPT), str(cc), *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        result.object = (work / f"conftest{pid}.o").read_text() if (work / f"conftest{pid}.o").exists() else None
        return result

    def runs() -> int:
        return len((tmp_path / "runs").read_text().splitlines()) if (tmp_path / "runs").exists() else 0

    return run, runs, work, info


def test_a_probe_seen_before_is_answered_as_the_compiler_answered_it(probe):
    run, runs, _work, _info = probe
    first = run(101, "int good;")
    again = run(202, "int good;")  # another process id: the same probe
    assert runs() == 1
    assert (again.returncode, again.object) == (first.returncode, first.object) == (0, "object of int good;")
    assert again.stderr == first.stderr == "probe of conftest101.c\n"
    failed, failed_again = run(303, "int bad;"), run(404, "int bad;")
    assert runs() == 2 and failed.returncode == failed_again.returncode == 1
    assert failed_again.object is None


def test_what_decides_a_probe_makes_it_run_again(probe):
    run, runs, work, info = probe
    run(1, "int good;")
    run(2, "int good; /* another source */")
    assert runs() == 2
    run(3, "int good;", "-DCONFIG_OTHER")
    assert runs() == 3
    (work / "conftest" / "headers.h").write_text("#undef NV_LINUX_KCONFIG_H_PRESENT\n")
    run(4, "int good;")
    assert runs() == 4
    (info / "linux-headers-6.1.0-50-amd64.md5sums").write_text("bbb  usr/src/linux-headers-6.1.0-50-amd64/Makefile\n")
    run(5, "int good;")
    assert runs() == 5
    run(6, "int good;")
    assert runs() == 5


def test_any_other_compile_goes_to_the_compiler_each_time(probe, tmp_path):
    _run, runs, work, _info = probe
    (work / "module.c").write_text("int good;")
    env = {**os.environ, "RUNS": str(tmp_path / "runs"), "GPUFLEET_LAB_CCACHE": ""}
    for _run in range(2):
        subprocess.run(
            [sys.executable, str(SCRIPT), str(tmp_path / "fake-cc"), "-c", "module.c"],
            cwd=work,
            env=env,
            check=True,
            capture_output=True,
        )
    assert runs() == 2
