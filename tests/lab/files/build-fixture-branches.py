#!/usr/bin/env python
"""LAB FIXTURE: two NVIDIA driver branches (535 and 580) in the package layout of NVIDIA's Ubuntu repository.

The lab's nodes run Debian 12, whose driver (Debian non-free, 535.261.03) is
what the rest of the lab tests. NVIDIA's Ubuntu packages name the branch in
every package (nvidia-headless-535, nvidia-utils-535, libnvidia-compute-535,
...), and moving a host from one branch to the next replaces every one of them:
the 580 packages conflict with the 535 ones through shared virtual packages
(nvidia-utils, libnvidia-compute, nvidia-kernel-common, ...) and ship the same
files (/usr/bin/nvidia-smi, libnvidia-ml.so.1, ...). Neither Canonical's
archive nor NVIDIA's repository can be reached from the lab, so this script
builds the packages that matter to that move, for one release of each branch,
with the relations of the real ones and files that overlap as theirs do:

  nvidia-headless-B, nvidia-headless-no-dkms-B   metapackages (no files)
  nvidia-utils-B          /usr/bin/nvidia-smi (a script that fails as the real one does without a driver: exit 9)
  libnvidia-compute-B     libnvidia-ml.so.<release>, libcuda.so.<release> (tiny real ELF libraries, so that
                          ldconfig and gpufleet_check read the release from the names) and their .so.1 links
  libnvidia-cfg1-B        libnvidia-cfg.so.<release> and .so.1
  nvidia-compute-utils-B  nvidia-persistenced and its systemd unit (the daemon exits 1: no GPU)
  nvidia-kernel-common-B  /lib/udev/rules.d/71-nvidia.rules
  nvidia-firmware-B-<release>  /lib/firmware/nvidia/<release>/README
  nvidia-kernel-source-B  /usr/src/nvidia-<release>: a DKMS tree of a module named nvidia, version <release>, that
                          loads nothing (it is built for real against the lab's kernel headers, as NVIDIA's is)
  nvidia-dkms-B           registers, builds and installs that tree with dkms (postinst), removes it (prerm)

The relations (Depends, Conflicts, Replaces, Provides, Breaks) are those of
Canonical's packaging, from which NVIDIA's Ubuntu repository builds the same
package names (roles/nvidia_driver/vars/Ubuntu.yml, source nvidia):
canonical/nvidia-graphics-drivers, debian/control of branch 535-jammy
(52ca25bc9a9a252fb681296340d97bc723427120, 535.288.01-0ubuntu0.22.04.1) and
of branch 580-jammy (f2468bbad4e419dd2018825fe4d0cbb9ec5f9d41,
580.142-0ubuntu0.22.04.1), with the upstream release in them replaced by the
fixture's and ${shlibs:Depends}/${misc:Depends} left out (the fixture's files
need no library). The releases are NVIDIA's (535.261.03, 580.95.05); the
version strings are the lab's own (<release>-0gpufleetlab1), never one NVIDIA
or Canonical published, and the repository says what it is: its own path on the
mirror (/fixtures/nvidia-branches), flat like NVIDIA's, Release Origin
gpufleet-lab and Label gpufleet-lab-fixture-nvidia-branches, signed by the
lab's key. It also carries the lab's cuda-keyring fixture (NVIDIA's layout,
the lab's key: the one the site CUDA repository serves), as NVIDIA's
repository carries cuda-keyring.

  build-fixture-branches.py <out> <gnupg-home> <key-id> <cuda-keyring.deb>

Needs: python3, gcc, dpkg-deb, apt-ftparchive, gpg (build-apt-repo.sh).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RELEASES = {"535": "535.261.03", "580": "580.95.05"}
REVISION = "0gpufleetlab1"
LABEL = "gpufleet-lab-fixture-nvidia-branches"
LIBDIR = "usr/lib/x86_64-linux-gnu"
MAINTAINER = "gpufleet lab <lab@gpufleet.invalid>"

# libcuda-X.Y-1: the CUDA releases libnvidia-compute-B provides (and conflicts with): 5.0 ... 11.7 in 535-jammy,
# 5.0 ... 12.8 in 580-jammy.
LIBCUDA_5_TO_11_7 = [
    "5.0",
    "5.5",
    "6.0",
    "6.5",
    "7.0",
    "7.5",
    "8.0",
    "9.0",
    "9.1",
    "9.2",
    "10.0",
    "10.1",
    "10.2",
    "11.0",
    "11.1",
    "11.2",
    "11.3",
    "11.4",
    "11.5",
    "11.6",
    "11.7",
]
LIBCUDA_TO_12_8 = LIBCUDA_5_TO_11_7 + ["11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7", "12.8"]


def relations(branch: str, release: str, version: str) -> dict[str, dict[str, str]]:
    """Package -> its relation fields, as debian/control of the branch writes them (see the module's docstring)."""
    b, r = branch, release
    common, source, firmware = f"nvidia-kernel-common-{b}", f"nvidia-kernel-source-{b}", f"nvidia-firmware-{b}-{r}"

    def window(name: str) -> str:
        """The control file's version window."""
        return f"{name} (<= {r}-1), {name} (>= {r})"

    if b == "535":
        libcuda = [f"libcuda-{v}-1" for v in LIBCUDA_5_TO_11_7]
        return {
            source: {
                "Conflicts": "nvidia-kernel-source",
                "Replaces": "nvidia-kernel-source, nvidia-384 (<< 390.25), nvidia-390 (<< 390.25-0ubuntu1)",
                "Provides": "nvidia-kernel-source",
            },
            f"nvidia-dkms-{b}": {
                "Conflicts": "nvidia-dkms-kernel",
                "Breaks": f"nvidia-kernel-source-{b} (<< 390.25-0ubuntu2~)",
                "Replaces": f"nvidia-dkms-kernel, nvidia-kernel-source-{b} (<< 390.25-0ubuntu2~), "
                "nvidia-384 (<< 390.25)",
                "Provides": "nvidia-dkms-kernel",
                "Depends": f"dkms, {window(source)}, {window(common)}, {firmware}",
            },
            f"nvidia-utils-{b}": {
                "Suggests": f"nvidia-driver-{b}",
                "Provides": "nvidia-utils, nvidia-smi",
                "Conflicts": "nvidia-utils, nvidia-smi",
                "Replaces": "nvidia-utils, nvidia-smi",
            },
            f"libnvidia-compute-{b}": {
                "Provides": ", ".join(
                    [
                        "libnvidia-compute",
                        "nvidia-opencl-icd",
                        "opencl-icd",
                        f"libnvidia-ml.so.1 (= {version})",
                        *libcuda,
                        f"libcuda.so.1 (= {version})",
                    ]
                ),
                "Conflicts": ", ".join(["libnvidia-compute", "nvidia-opencl-icd", *libcuda]),
                "Replaces": ", ".join(
                    ["libnvidia-compute", "nvidia-opencl-icd", f"libnvidia-compute-{b} (<< 390.25-0ubuntu2~)", *libcuda]
                ),
            },
            f"nvidia-compute-utils-{b}": {
                "Depends": f"libnvidia-compute-{b}, adduser",
                "Provides": "nvidia-compute-utils, nvidia-persistenced",
                "Conflicts": "nvidia-compute-utils, nvidia-persistenced",
                "Replaces": "nvidia-compute-utils, nvidia-persistenced",
            },
            f"nvidia-headless-no-dkms-{b}": {
                "Conflicts": "nvidia-384 (<< 390.25), nvidia-390 (<< 390.25-0ubuntu1)",
                "Provides": "nvidia-384",
                "Replaces": "nvidia-384 (<< 390.25), nvidia-390 (<< 390.25-0ubuntu1)",
                "Depends": f"{window(common)}, {source} (= {version}), libnvidia-compute-{b} (= {version}), "
                f"nvidia-compute-utils-{b} (= {version}), libnvidia-cfg1-{b} (= {version})",
            },
            f"nvidia-headless-{b}": {
                "Conflicts": "nvidia-headless",
                "Provides": "nvidia-headless",
                "Replaces": "nvidia-headless",
                "Depends": f"nvidia-headless-no-dkms-{b}, nvidia-dkms-{b}",
            },
            common: {
                "Conflicts": "nvidia-kernel-common",
                "Provides": "nvidia-kernel-common",
                "Depends": firmware,
                "Replaces": f"nvidia-dkms-{b} (<< 390.48-0ubuntu3~), nvidia-kernel-common",
            },
            firmware: {"Breaks": f"nvidia-firmware-{b}-server-{r}", "Replaces": f"nvidia-firmware-{b}-server-{r}"},
            f"libnvidia-cfg1-{b}": {
                "Provides": "libnvidia-cfg1-any",
                "Conflicts": "libnvidia-cfg1-any",
                "Replaces": "libnvidia-cfg1-any",
            },
        }
    libcuda = [f"libcuda-{v}-1" for v in LIBCUDA_TO_12_8]
    versioned_common = f"nvidia-kernel-common-{b}-{r}"
    return {
        source: {"Conflicts": "nvidia-kernel-source", "Provides": "nvidia-kernel-source"},
        f"nvidia-dkms-{b}": {
            "Conflicts": "nvidia-dkms-kernel",
            "Replaces": "nvidia-dkms-kernel",
            "Provides": "nvidia-dkms-kernel",
            "Depends": f"dkms, {window(source)}, {window(common)}, {firmware}",
        },
        f"nvidia-utils-{b}": {
            "Depends": versioned_common,
            "Suggests": f"nvidia-driver-{b}",
            "Provides": "nvidia-utils, nvidia-smi",
            "Conflicts": "nvidia-utils, nvidia-smi",
            "Replaces": "nvidia-utils, nvidia-smi",
        },
        f"libnvidia-compute-{b}": {
            "Depends": versioned_common,
            "Provides": ", ".join(
                [
                    "libnvidia-compute",
                    "nvidia-opencl-icd",
                    "opencl-icd",
                    f"libnvidia-ml.so.1 (= {version})",
                    f"libnvidia-ml1 (= {version})",
                    *libcuda,
                    f"libcuda.so.1 (= {version})",
                    f"libcuda1 (= {version})",
                ]
            ),
            "Conflicts": ", ".join(["libnvidia-compute", "nvidia-opencl-icd", *libcuda]),
            "Replaces": ", ".join(["libnvidia-compute", "nvidia-opencl-icd", *libcuda]),
        },
        f"nvidia-compute-utils-{b}": {
            "Depends": f"libnvidia-compute-{b}, adduser",
            "Provides": "nvidia-compute-utils, nvidia-persistenced",
            "Conflicts": "nvidia-compute-utils, nvidia-persistenced",
            "Replaces": "nvidia-compute-utils, nvidia-persistenced",
        },
        f"nvidia-headless-no-dkms-{b}": {
            "Depends": f"{window(common)}, {source} (= {version}), libnvidia-compute-{b} (= {version}), "
            f"nvidia-compute-utils-{b} (= {version}), libnvidia-cfg1-{b} (= {version})"
        },
        f"nvidia-headless-{b}": {
            "Conflicts": "nvidia-headless",
            "Provides": "nvidia-headless",
            "Replaces": "nvidia-headless",
            "Depends": f"nvidia-headless-no-dkms-{b}, nvidia-dkms-{b}",
        },
        common: {
            "Conflicts": "nvidia-kernel-common",
            "Provides": f"nvidia-kernel-common, {versioned_common}",
            "Depends": firmware,
            "Replaces": "nvidia-kernel-common",
        },
        firmware: {"Breaks": f"nvidia-firmware-{b}-server-{r}", "Replaces": f"nvidia-firmware-{b}-server-{r}"},
        f"libnvidia-cfg1-{b}": {
            "Depends": versioned_common,
            "Provides": "libnvidia-cfg1-any",
            "Conflicts": "libnvidia-cfg1-any",
            "Replaces": "libnvidia-cfg1-any",
        },
    }


NVIDIA_SMI = """#!/bin/sh
# gpufleet lab fixture (tests/lab/files/build-fixture-branches.py): nvidia-smi of driver {release} on a host
# without its kernel module, as the real one answers there.
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." \\
  "Make sure that the latest NVIDIA driver is installed and running."
exit 9
"""
PERSISTENCED = """#!/bin/sh
# gpufleet lab fixture (tests/lab/files/build-fixture-branches.py): nvidia-persistenced of driver {release}.
echo "nvidia-persistenced: failed to open /dev/nvidiactl: no NVIDIA GPU (gpufleet lab fixture)" >&2
exit 1
"""
PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (gpufleet lab fixture, driver {release})
Wants=syslog.target

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""
MODULE_C = """// gpufleet lab fixture (tests/lab/files/build-fixture-branches.py): stands for NVIDIA's kernel module of
// driver {release}: DKMS builds and installs it for real; it does nothing and is never loaded in the lab.
#include <linux/module.h>
MODULE_LICENSE("GPL");
MODULE_VERSION("{release}");
MODULE_DESCRIPTION("gpufleet lab fixture standing for the NVIDIA driver module {release}");
static int __init fixture_init(void) {{ return 0; }}
static void __exit fixture_exit(void) {{ }}
module_init(fixture_init);
module_exit(fixture_exit);
"""
DKMS_CONF = """PACKAGE_NAME="nvidia"
PACKAGE_VERSION="{release}"
BUILT_MODULE_NAME[0]="nvidia"
DEST_MODULE_LOCATION[0]="/updates/dkms"
MAKE[0]="make -C ${{kernel_source_dir}} M=${{dkms_tree}}/${{PACKAGE_NAME}}/${{PACKAGE_VERSION}}/build modules"
CLEAN="true"
AUTOINSTALL="yes"
"""
# As dh_dkms's postinst/prerm do for the real nvidia-dkms-B: register the tree, build and install it for every
# kernel whose headers are installed; remove it from all kernels before the package goes.
DKMS_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
  dkms status -m nvidia -v {release} | grep -q . || dkms add -m nvidia -v {release}
  for build in /lib/modules/*/build; do
    [ -e "$build/Makefile" ] || continue
    kernel=${{build%/build}}; kernel=${{kernel##*/}}
    dkms install -m nvidia -v {release} -k "$kernel"
  done
fi
"""
DKMS_PRERM = """#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = upgrade ] || [ "$1" = deconfigure ]; then
  if dkms status -m nvidia -v {release} | grep -q .; then dkms remove -m nvidia -v {release} --all; fi
fi
"""


def library(path: Path, soname: str, work: Path) -> None:
    """A real, empty ELF shared library with this soname (ldconfig links and reads it as the real one)."""
    source = work / "empty.c"
    source.write_text("/* gpufleet lab fixture: an empty library standing for one of NVIDIA's */\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(source)], check=True)


def files(package: str, branch: str, release: str, root: Path, work: Path) -> None:
    """The package's files under root (the relative DEBIAN/ scripts included)."""
    debian = root / "DEBIAN"
    lib = root / LIBDIR

    def write(relative: str, text: str, mode: int = 0o644) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(release=release))
        path.chmod(mode)

    def shared(stem: str) -> None:
        lib.mkdir(parents=True, exist_ok=True)
        library(lib / f"{stem}.so.{release}", f"{stem}.so.1", work)
        (lib / f"{stem}.so.1").symlink_to(f"{stem}.so.{release}")
        (debian / "triggers").write_text("activate-noawait ldconfig\n")

    debian.mkdir(parents=True, exist_ok=True)
    if package == f"nvidia-utils-{branch}":
        write("usr/bin/nvidia-smi", NVIDIA_SMI, 0o755)
    elif package == f"libnvidia-compute-{branch}":
        shared("libnvidia-ml")
        shared("libcuda")
    elif package == f"libnvidia-cfg1-{branch}":
        shared("libnvidia-cfg")
    elif package == f"nvidia-compute-utils-{branch}":
        write("usr/bin/nvidia-persistenced", PERSISTENCED, 0o755)
        write("lib/systemd/system/nvidia-persistenced.service", PERSISTENCED_UNIT)
    elif package == f"nvidia-kernel-common-{branch}":
        write("lib/udev/rules.d/71-nvidia.rules", "# gpufleet lab fixture: NVIDIA driver {release}'s udev rules\n")
    elif package == f"nvidia-firmware-{branch}-{release}":
        write(f"lib/firmware/nvidia/{release}/README", "gpufleet lab fixture: NVIDIA driver {release}'s GSP firmware\n")
    elif package == f"nvidia-kernel-source-{branch}":
        write(f"usr/src/nvidia-{release}/nvidia.c", MODULE_C)
        write(f"usr/src/nvidia-{release}/Kbuild", "obj-m := nvidia.o\n")
        write(f"usr/src/nvidia-{release}/dkms.conf", DKMS_CONF)
    elif package == f"nvidia-dkms-{branch}":
        write("DEBIAN/postinst", DKMS_POSTINST, 0o755)
        write("DEBIAN/prerm", DKMS_PRERM, 0o755)


def control(package: str, version: str, fields: dict[str, str], branch: str, release: str) -> str:
    lines = [
        f"Package: {package}",
        f"Version: {version}",
        "Architecture: amd64",
        f"Maintainer: {MAINTAINER}",
        "Section: non-free/libs",
        "Priority: optional",
        *(f"{name}: {value}" for name, value in fields.items()),
        f"Description: gpufleet lab fixture: {package} of NVIDIA driver {release}",
        f" Built by tests/lab/files/build-fixture-branches.py with the relations of branch {branch}'s",
        " package of this name (canonical/nvidia-graphics-drivers). Not an NVIDIA or Canonical package.",
    ]
    return "\n".join(lines) + "\n"


def build(out: Path, gnupg: str, key: str, keyring_deb: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="gpufleet-branches-") as temporary:
        work = Path(temporary)
        staged = work / "repo"
        staged.mkdir()
        for branch, release in RELEASES.items():
            version = f"{release}-{REVISION}"
            for package, fields in relations(branch, release, version).items():
                root = work / package
                files(package, branch, release, root, work)
                (root / "DEBIAN" / "control").write_text(control(package, version, fields, branch, release))
                subprocess.run(
                    [
                        "dpkg-deb",
                        "--root-owner-group",
                        "-Zgzip",
                        "--build",
                        str(root),
                        str(staged / f"{package}_{version}_amd64.deb"),
                    ],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
        shutil.copyfile(keyring_deb, staged / keyring_deb.name)
        subprocess.run(["sh", str(HERE / "build-apt-repo.sh"), str(staged), "/", gnupg, key, LABEL], check=True)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staged, out, symlinks=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__.split("\n\n")[-2])
    build(Path(sys.argv[1]).resolve(), str(Path(sys.argv[2]).resolve()), sys.argv[3], Path(sys.argv[4]).resolve())
