#!/usr/bin/python3
"""LAB DIFFERENCE (Containerfile.node): the result cache of NVIDIA's kernel
feature probes, beside ccache.

Before it builds the module, the NVIDIA driver's conftest.sh compiles a few
hundred small C files against the kernel headers (``$CC $CFLAGS -c
conftest<pid>.c``) and reads from each whether it compiled: about three in
four of the compiler runs of a DKMS build on the lab's 2 cores. ccache cannot
keep them: a failed compile is never cached, and the process id is in the
file name and in ``-DKBUILD_BASENAME``. This keeps what each probe gave (exit
code, output, object file) under a key of everything that decides it: the
compiler (path, size, time), the arguments with the process id taken out,
the working directory, the probe's source, the ``conftest/headers.h`` the
source includes, and the exact files of the installed kernel headers (the
md5sums dpkg keeps of each ``linux-headers-*`` and ``linux-kbuild-*``
package). A probe seen before is answered from the cache; any other compile,
and every compile of the module itself, goes to ccache as before.

    conftest-cache.py <compiler> <arguments...>    (called by lab-cc)
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

CACHE = os.environ.get("GPUFLEET_LAB_CONFTEST_CACHE", "/var/cache/gpufleet-lab-ccache/conftest")
DPKG_INFO = os.environ.get("GPUFLEET_LAB_DPKG_INFO", "/var/lib/dpkg/info")
CCACHE = os.environ.get("GPUFLEET_LAB_CCACHE", "/usr/bin/ccache")
PID = re.compile(r"conftest[0-9]+")
SOURCE = re.compile(r"^conftest[0-9]+\.c$")


def headers_identity() -> bytes:
    h = hashlib.sha256()
    for pattern in ("linux-headers-*.md5sums", "linux-kbuild-*.md5sums"):
        for path in sorted(glob.glob(os.path.join(DPKG_INFO, pattern))):
            with open(path, "rb") as f:
                h.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    return h.digest()


def cache_key(compiler: str, args: list, source: str) -> str:
    h = hashlib.sha256()
    st = os.stat(compiler)
    h.update(f"{os.path.realpath(compiler)}\0{st.st_size}\0{st.st_mtime_ns}\0{os.getcwd()}\0".encode())
    for arg in args:
        h.update(PID.sub("conftest#", arg).encode() + b"\0")
    with open(source, "rb") as f:
        h.update(f.read() + b"\0")
    try:
        with open("conftest/headers.h", "rb") as f:
            h.update(f.read())
    except FileNotFoundError:
        h.update(b"-")
    h.update(b"\0" + headers_identity())
    return h.hexdigest()


def replay(entry: str, obj: str) -> int:
    with open(os.path.join(entry, "out"), "rb") as f:
        sys.stdout.buffer.write(f.read())
    with open(os.path.join(entry, "err"), "rb") as f:
        sys.stderr.buffer.write(f.read())
    if os.path.exists(os.path.join(entry, "obj")):
        shutil.copyfile(os.path.join(entry, "obj"), obj)
    with open(os.path.join(entry, "rc")) as f:
        return int(f.read())


def main(argv: list) -> int:
    compiler, args = argv[0], argv[1:]
    sources = [a for a in args if SOURCE.match(a)]
    real = [CCACHE, compiler, *args] if CCACHE else [compiler, *args]
    if len(sources) != 1 or "-c" not in args or "-o" in args or not os.path.isfile(sources[0]):
        os.execv(real[0], real)
    obj = sources[0][:-2] + ".o"
    key = cache_key(compiler, args, sources[0])
    entry = os.path.join(CACHE, key[:2], key)
    if os.path.isdir(entry):
        return replay(entry, obj)
    done = subprocess.run(real, capture_output=True, check=False)
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(entry), prefix=".tmp-")
    for name, data in (("out", done.stdout), ("err", done.stderr), ("rc", str(done.returncode).encode())):
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(data)
    if os.path.exists(obj):
        shutil.copyfile(obj, os.path.join(tmp, "obj"))
    os.chmod(tmp, 0o755)
    try:
        os.rename(tmp, entry)
    except OSError:  # another node stored the same probe first
        shutil.rmtree(tmp, ignore_errors=True)
    sys.stdout.buffer.write(done.stdout)
    sys.stderr.buffer.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
