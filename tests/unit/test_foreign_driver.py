"""A driver installed by other means (issue 27, item 6): the driver role's probe and its judgement.

The probe (roles/nvidia_driver/files/foreign_driver_probe.sh) reads, in one remote command, the installed
packages with nvidia in the name (dpkg -l), the repositories that offer their installed versions (apt-cache
policy) with those repositories' Release fields, and the files NVIDIA's .run installer writes with their owners
(dpkg -S). plugins/filter/foreign_driver.py judges them against the configured source and gpufleet's fact.

Where the outputs come from, in this module:

* verbatim outputs published by others (each constant names its source): dpkg -l listings, apt-cache policy
  stanzas, apt-cache policy's list of package files;
* the probe itself, run for real on this Debian build machine by its real dpkg and apt (ScratchHost), against
  a dpkg database (DPKG_ADMINDIR), apt lists (APT_CONFIG) and a file tree of its own, filled with the packages,
  versions and Release fields of the published listings cited at each case (the package stanzas carry those
  names, versions and architectures; their other fields are the minimum dpkg and apt need). The outputs are
  then dpkg's and apt's own, as a host with those packages prints them; the tree's root is taken out of the
  paths the probe prints. Nothing else of an output is written by hand.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import role_run
import yaml
from conftest import FAKE_FACTS, host_tool, load_script

from ansible_collections.gpufleet.fleet.plugins.module_utils import driver_facts

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "nvidia_driver"
PROBE = ROLE / "files" / "foreign_driver_probe.sh"
fd = load_script(REPO / "plugins" / "filter" / "foreign_driver.py", "gpufleet_foreign_driver")
filters = load_script(REPO / "plugins" / "filter" / "gpufleet_filters.py", "gpufleet_filters_for_foreign")


def layouts(distribution: str, repo_os: str) -> dict[str, Any]:
    """The role's package layouts of an OS (vars/<OS>.yml), their two templated values filled in as the role does."""
    text = (ROLE / "vars" / f"{distribution}.yml").read_text()
    text = text.replace("{{ __nvidia_driver_nvidia_repo_os }}", repo_os)
    return yaml.safe_load(text)["__nvidia_driver_sources"]


UBUNTU = layouts("Ubuntu", "ubuntu2204")
UBUNTU_FOCAL = layouts("Ubuntu", "ubuntu2004")
DEBIAN = layouts("Debian", "debian12")


# --------------------------------------------------------------------------- published outputs

# github.com/morrownr/rtl8852bu/issues/7, comment by p7x404 of 2023-08-12, Ubuntu 20.04: "base nvidia pkg is
# nvidia-driver-535 / => nvidia-driver-535 535.86.05-0ubuntu0.20.04.2 amd64 NVIDIA driver metapackage / It is
# downloaded from the ubuntu/focal-updates / ubuntu/focal-security repositories (in restricted)", then these
# lines of its dpkg -l (verbatim; the comment's list goes on).
FOCAL_CANONICAL_DPKG = """\
ii  libnvidia-cfg1-535:amd64                                    535.86.05-0ubuntu0.20.04.2                  amd64      \
  NVIDIA binary OpenGL/GLX configuration library
ii  libnvidia-common-535                                        535.86.05-0ubuntu0.20.04.2                  all        \
  Shared files used by the NVIDIA libraries
ii  libnvidia-compute-535:amd64                                 535.86.05-0ubuntu0.20.04.2                  amd64      \
  NVIDIA libcompute package
ii  libnvidia-decode-535:amd64                                  535.86.05-0ubuntu0.20.04.2                  amd64      \
  NVIDIA Video Decoding runtime libraries
ii  libnvidia-encode-535:amd64                                  535.86.05-0ubuntu0.20.04.2                  amd64      \
  NVENC Video Encoding runtime library
ii  libnvidia-extra-535:amd64                                   535.86.05-0ubuntu0.20.04.2                  amd64      \
  Extra libraries for the NVIDIA driver
"""
# github.com/NVIDIA/gpu-driver-container/pull/186, description of 2025-01-11 (Ubuntu 24.04, Canonical's
# 550-server packages and signed modules): the first lines of its `dpkg -l | grep -i nvidia`, verbatim.
NOBLE_SERVER_DPKG = """\
ii  libnvidia-cfg1-550-server:amd64                  550.127.08-0ubuntu0.24.04.1       amd64      \
  NVIDIA binary OpenGL/GLX configuration library
ii  libnvidia-compute-550-server:amd64               550.127.08-0ubuntu0.24.04.1       amd64      \
  NVIDIA libcompute package
ii  linux-modules-nvidia-550-server-6.8.0-51-generic 6.8.0-51.52+1                     amd64      \
  Linux kernel nvidia modules for version 6.8.0-51
ii  linux-objects-nvidia-550-server-6.8.0-51-generic 6.8.0-51.52+1                     amd64      \
  Linux kernel nvidia modules for version 6.8.0-51 (objects)
ii  linux-signatures-nvidia-6.8.0-51-generic         6.8.0-51.52+1                     amd64        Linux kernel\
 signatures for nvidia modules for version 6.8.0-51-generic
ii  nvidia-compute-utils-550-server                  550.127.08-0ubuntu0.24.04.1       amd64      \
  NVIDIA compute utilities
ii  nvidia-firmware-550-server-550.127.08            550.127.08-0ubuntu0.24.04.1       amd64      \
  Firmware files used by the kernel module
"""
# github.com/NVIDIA/nvidia-container-toolkit/issues/188 (the issue template's `dpkg -l '*nvidia*'`): the header
# and first lines, verbatim: "un" (known, never installed) and "rc" (removed, configuration kept) are no driver.
PATTERN_DPKG = """\
Desired=Unknown/Install/Remove/Purge/Hold
| Status=Not/Inst/Conf-files/Unpacked/halF-conf/Half-inst/trig-aWait/Trig-pend
|/ Err?=(none)/Reinst-required (Status,Err: uppercase=bad)
||/ Name                             Version            Architecture Description
+++-================================-==================-============-=========================================================
un  libgldispatch0-nvidia            <none>             <none>       (no description available)
ii  libnvidia-cfg1-510:amd64         510.47.03-0ubuntu1 amd64        NVIDIA binary OpenGL/GLX configuration library
un  libnvidia-cfg1-any               <none>             <none>       (no description available)
un  libnvidia-common                 <none>             <none>       (no description available)
ii  libnvidia-common-495             495.29.05-0ubuntu1 all          Shared files used by the NVIDIA libraries
ii  libnvidia-common-510             510.47.03-0ubuntu1 all          Shared files used by the NVIDIA libraries
rc  libnvidia-compute-495:amd64      495.29.05-0ubuntu1 amd64        NVIDIA libcompute package
"""
# github.com/elFarto/nvidia-vaapi-driver/issues/312, comment by TheBigK02 of 2024-08-20 (Debian 12 with NVIDIA's
# debian12 repository, German locale): `apt-cache policy nvidia-driver`, its first lines, verbatim. The parser
# reads no label, so the installed version is the "***" line whatever the language.
DEBIAN_NVIDIA_POLICY_DE = """\
nvidia-driver:
  Installiert:           555.42.06-1
  Installationskandidat: 555.42.06-1
  Versionstabelle:
     560.28.03-1 500
        500 https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages
 *** 555.42.06-1 1001
        500 https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages
        100 /var/lib/dpkg/status
     555.42.02-1 1001
        500 https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages
"""
# github.com/NVIDIA/apt-packaging-fabric-manager/issues/3 (sumanth1989): `apt-cache policy
# cuda-drivers-fabricmanager`, its first lines, verbatim: nothing installed (no "***"), versions pinned at -1.
FABRICMANAGER_POLICY = """\
cuda-drivers-fabricmanager:
  Version table:
     550.54.14-1 -1
        580 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64  Packages
        580 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64  Packages
     545.23.08-1 -1
        580 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64  Packages
        580 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64  Packages
"""
# github.com/pop-os/upgrade/issues/139 (the-black-wolf, Pop!_OS 20.04): lines of its `apt-cache policy`, verbatim:
# a priority of four digits has no leading space.
POP_POLICY_FILES = """\
 500 http://apt.pop-os.org/proprietary focal/main amd64 Packages
     release v=20.04,o=system76,a=focal,n=focal,l=System76,c=main,b=amd64
     origin apt.pop-os.org
1001 http://ppa.launchpad.net/system76/pop/ubuntu focal/main amd64 Packages
     release v=20.04,o=LP-PPA-system76-pop,a=focal,n=focal,l=Pop!_OS PPA,c=main,b=amd64
     origin ppa.launchpad.net
 100 http://us.archive.ubuntu.com/ubuntu focal-backports/universe amd64 Packages
     release v=20.04,o=Ubuntu,a=focal-backports,n=focal,l=Ubuntu,c=universe,b=amd64
     origin us.archive.ubuntu.com
"""

# Release fields, as the repositories publish them:
# Canonical's focal-updates (the shape of pop-os/upgrade#139's lines for focal-backports and focal-security:
# v=20.04,o=Ubuntu,a=focal-...,n=focal,l=Ubuntu).
FOCAL_UPDATES = {
    "Origin": "Ubuntu",
    "Label": "Ubuntu",
    "Suite": "focal-updates",
    "Codename": "focal",
    "Version": "20.04",
}
NOBLE_UPDATES = {
    "Origin": "Ubuntu",
    "Label": "Ubuntu",
    "Suite": "noble-updates",
    "Codename": "noble",
    "Version": "24.04",
}
# NVIDIA's CUDA repository: its Release file "Origin: NVIDIA / Label: NVIDIA CUDA" (github.com/NVIDIA/nvidia-docker
# issues/22, the ubuntu1504 directory's); no Suite (a flat repository).
NVIDIA_CUDA = {"Origin": "NVIDIA", "Label": "NVIDIA CUDA"}
# The lab's mirror (tests/lab/files/build-apt-repo.sh): an enterprise mirror with an Origin of its own.
LAB_MIRROR = {"Origin": "gpufleet-lab", "Label": "gpufleet-lab", "Suite": "bookworm", "Codename": "bookworm"}
# Pop!_OS's proprietary repository (pop-os/upgrade#139 above: o=system76, l=System76), which builds NVIDIA drivers
# of its own (github.com/pop-os/repo-release/pull/78: nvidia-graphics-drivers 510.60.02-1pop0~1649099333~22.04~aedf526).
POP = {"Origin": "system76", "Label": "System76", "Suite": "jammy", "Codename": "jammy"}

# The focal host's packages (FOCAL_CANONICAL_DPKG and the metapackage the comment names).
FOCAL_CANONICAL = [
    (line.split()[1], line.split()[2], line.split()[3]) for line in FOCAL_CANONICAL_DPKG.splitlines()
] + [("nvidia-driver-535", "535.86.05-0ubuntu0.20.04.2", "amd64")]
NOBLE_SERVER = [(line.split()[1], line.split()[2], line.split()[3]) for line in NOBLE_SERVER_DPKG.splitlines()]
# github.com/cudagrad/cudagrad/issues/2 (usevector, Ubuntu 22.04, CUDA 12.2 from NVIDIA's repository): "Unpacking
# libnvidia-common-535 (535.104.12-0ubuntu1)", "libnvidia-compute-535:amd64 (535.104.12-0ubuntu1)",
# "libnvidia-decode-535:amd64", "libnvidia-encode-535:amd64", the same version (NVIDIA's -0ubuntu1 builds).
JAMMY_NVIDIA_BY_HAND = [
    ("libnvidia-common-535", "535.104.12-0ubuntu1", "all"),
    ("libnvidia-compute-535:amd64", "535.104.12-0ubuntu1", "amd64"),
    ("libnvidia-decode-535:amd64", "535.104.12-0ubuntu1", "amd64"),
    ("libnvidia-encode-535:amd64", "535.104.12-0ubuntu1", "amd64"),
]
# NVIDIA's .run installer of 535.104.05 (a release of the branch: github.com/NVIDIA/nvidia-installer, commit e44a009
# "535.104.05"), on Ubuntu 22.04's kernel 5.15.0-91-generic: the files it installs where the installer's source puts
# them (see the probe's header): nvidia-uninstall, its backup log, libnvidia-ml.so.<version> and libcuda.so.<version>
# in the x86_64 triplet directory, the modules in kernel/drivers/video, its log.
RUN_VERSION = "535.104.05"
RUNFILE = [
    "/usr/bin/nvidia-uninstall",
    "/var/lib/nvidia/log",
    "/var/log/nvidia-installer.log",
    f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{RUN_VERSION}",
    f"/usr/lib/x86_64-linux-gnu/libcuda.so.{RUN_VERSION}",
    "/lib/modules/5.15.0-91-generic/kernel/drivers/video/nvidia.ko",
    "/lib/modules/5.15.0-91-generic/kernel/drivers/video/nvidia-uvm.ko",
]
# gpufleet's own hosts. Debian 12 (the lab): the debian_nonfree compute packages of tests/unit/test_driver_rendering.py
# at Debian's build of the default release (535.261.03-1~deb12u1, the build test_driver_rendering pins), and
# Debian's contrib glx-alternative-nvidia, which they depend on (roles/nvidia_driver/vars/Debian.yml).
DEBIAN_VERSION = "535.261.03-1~deb12u1"
DEBIAN_OWN = [
    (name, DEBIAN_VERSION, "amd64")
    for name in (
        "nvidia-kernel-dkms",
        "nvidia-kernel-support",
        "nvidia-smi",
        "libcuda1",
        "libnvidia-ml1",
        "libnvidia-cfg1",
        "nvidia-alternative",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
        "nvidia-modprobe",
    )
] + [("glx-alternative-nvidia", "1.2.2", "amd64")]
LAB_MIRROR_URL = "http://gpufleet-mirror/debian"
# Ubuntu 22.04 after `upgrade-driver.yml` moved it from 535 to 580 (NVIDIA's repository; its -0ubuntu1 builds, as
# tests/unit/test_driver_origin.py cites them): the 580 packages, and a 535 library left of the old branch whose
# build the repository no longer lists.
UPGRADED_580 = [
    ("nvidia-headless-580", "580.95.05-0ubuntu1", "amd64"),
    ("nvidia-utils-580", "580.95.05-0ubuntu1", "amd64"),
    ("libnvidia-compute-580:amd64", "580.95.05-0ubuntu1", "amd64"),
]
LEFT_535 = [("libnvidia-compute-535:amd64", "535.261.03-0ubuntu1", "amd64")]
FACT_UBUNTU_580 = {"branch": "580", "source": "nvidia", "installed_version": "580.95.05", "pinned_version": "580.95.05"}
FACT_DEBIAN = {
    "branch": "535",
    "source": "debian_nonfree",
    "installed_version": "535.261.03",
    "pinned_version": "535.261.03",
}


# --------------------------------------------------------------------------- a scratch host, real dpkg and apt


class ScratchHost:
    """A dpkg database, apt lists and a file tree under ``root``, read by this machine's dpkg and apt."""

    def __init__(self, root: Path) -> None:
        host_tool("dpkg")
        host_tool("apt-get")
        self.root = root
        self.admin = root / "dpkg"
        (self.admin / "info").mkdir(parents=True)
        (self.admin / "updates").mkdir()
        (self.admin / "available").write_text("")
        self.stanzas: list[str] = []
        self.sources: list[str] = []
        self.tree = root / "tree"
        for directory in ("apt/lists/partial", "apt/cache/archives/partial", "apt/empty", "tree"):
            (root / directory).mkdir(parents=True)
        self.apt_config = root / "apt.conf"
        options = {
            "Dir::Etc::SourceList": root / "apt" / "sources.list",
            "Dir::Etc::SourceParts": root / "apt" / "empty",
            "Dir::Etc::Preferences": root / "apt" / "empty" / "none",
            "Dir::Etc::PreferencesParts": root / "apt" / "empty",
            "Dir::State::Lists": root / "apt" / "lists",
            "Dir::State::status": self.admin / "status",
            "Dir::Cache": root / "apt" / "cache",
            "Debug::NoLocking": "1",
            "APT::Architecture": "amd64",
            "APT::Architectures": "amd64",
            "Acquire::Languages": "none",
            "APT::Sandbox::User": "",
        }
        self.apt_config.write_text("".join(f'{key} "{value}";\n' for key, value in options.items()))

    @staticmethod
    def _stanza(name: str, version: str, arch: str) -> str:
        package = name.split(":")[0]
        multiarch = "Multi-Arch: same\n" if ":" in name else ""
        return (
            f"Package: {package}\nArchitecture: {arch}\n{multiarch}Version: {version}\n"
            f"Maintainer: gpufleet unit test <test@gpufleet.invalid>\nDescription: {package}\n"
        )

    def install(
        self,
        packages: list[tuple[str, str, str]],
        files: dict[str, list[str]] | None = None,
        status: str = "install ok installed",
    ) -> None:
        for name, version, arch in packages:
            self.stanzas.append(f"{self._stanza(name, version, arch)}Status: {status}\n")
            # The package's files where the probe looks for them: in the tree.
            paths = [f"{self.tree}{path}" for path in (files or {}).get(name.split(":")[0], [])]
            (self.admin / "info" / f"{name.split(':')[0]}.list").write_text("".join(f"{path}\n" for path in paths))
        (self.admin / "status").write_text("\n".join(self.stanzas) + "\n")

    def repository(self, name: str, release: dict[str, str], packages: list[tuple[str, str, str]]) -> str:
        """A flat repository with this Release and these packages (the stanzas the database has for them); its URL."""
        directory = self.root / "repos" / name
        directory.mkdir(parents=True)
        (directory / "Release").write_text(
            "".join(f"{k}: {v}\n" for k, v in release.items()) + "Architectures: amd64\n"
        )
        (directory / "Packages").write_text(
            "".join(
                f"{self._stanza(n, v, a)}Filename: ./{n.split(':')[0]}_{v}_{a}.deb\nSize: 1\n\n" for n, v, a in packages
            )
        )
        self.sources.append(f"deb [trusted=yes] file:{directory} ./\n")
        return f"file:{directory}"

    def files(self, paths: list[str]) -> None:
        for path in paths:
            target = self.tree / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("")

    def probe(self) -> str:
        """The probe's output: the role's script, its absolute file paths moved into the tree, run by /bin/sh."""
        (self.root / "apt" / "sources.list").write_text("".join(self.sources))
        env = {**os.environ, "APT_CONFIG": str(self.apt_config), "DPKG_ADMINDIR": str(self.admin)}
        update = subprocess.run([host_tool("apt-get"), "update"], capture_output=True, text=True, env=env, check=False)
        assert update.returncode == 0, update.stdout + update.stderr
        script = PROBE.read_text()
        for top in ("/usr/bin/", "/usr/lib/x86_64-linux-gnu/", "/var/lib/nvidia/", "/var/log/", "/lib/modules/"):
            script = script.replace(f" {top}", f" {self.tree}{top}").replace(f"= {top}", f"= {self.tree}{top}")
        done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.replace(str(self.tree), "")


def judge(output: str, layouts_: dict[str, Any], source: str, branch: str = "535", **keywords: Any) -> dict[str, Any]:
    return fd.foreign_driver(filters.sections(output), layouts_, source, branch, host="gpu01", **keywords)


# --------------------------------------------------------------------------- the parsers, on published outputs


def test_dpkg_list_reads_published_listings():
    focal = fd.dpkg_list(FOCAL_CANONICAL_DPKG)
    assert [(r["package"], r["name"], r["version"], r["arch"], r["on_disk"]) for r in focal[:2]] == [
        ("libnvidia-cfg1-535", "libnvidia-cfg1-535:amd64", "535.86.05-0ubuntu0.20.04.2", "amd64", True),
        ("libnvidia-common-535", "libnvidia-common-535", "535.86.05-0ubuntu0.20.04.2", "all", True),
    ]
    assert len(focal) == 6
    noble = fd.dpkg_list(NOBLE_SERVER_DPKG)
    assert (
        noble[2]["package"] == "linux-modules-nvidia-550-server-6.8.0-51-generic"
        and noble[2]["version"] == "6.8.0-51.52+1"
    )
    listing = fd.dpkg_list(PATTERN_DPKG)
    # The header is no package; "un" and "rc" are packages with no files on disk.
    assert [(r["package"], r["status"], r["on_disk"]) for r in listing] == [
        ("libgldispatch0-nvidia", "un", False),
        ("libnvidia-cfg1-510", "ii", True),
        ("libnvidia-cfg1-any", "un", False),
        ("libnvidia-common", "un", False),
        ("libnvidia-common-495", "ii", True),
        ("libnvidia-common-510", "ii", True),
        ("libnvidia-compute-495", "rc", False),
    ]


def test_apt_policy_reads_the_installed_build_and_its_repositories_in_any_language():
    german = fd.apt_policy_installed(DEBIAN_NVIDIA_POLICY_DE)
    assert german == {
        "nvidia-driver": {
            "installed": "555.42.06-1",
            "indexes": [
                "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64 Packages",
                "/var/lib/dpkg/status",
            ],
        }
    }
    assert fd.apt_policy_installed(FABRICMANAGER_POLICY) == {
        "cuda-drivers-fabricmanager": {"installed": "", "indexes": []}
    }


def test_apt_policy_files_reads_each_repositorys_release_fields():
    files = fd.apt_policy_files(POP_POLICY_FILES)
    assert files["http://apt.pop-os.org/proprietary focal/main amd64 Packages"]["o"] == "system76"
    assert files["http://ppa.launchpad.net/system76/pop/ubuntu focal/main amd64 Packages"] == {
        "v": "20.04",
        "o": "LP-PPA-system76-pop",
        "a": "focal",
        "n": "focal",
        "l": "Pop!_OS PPA",
        "c": "main",
        "b": "amd64",
    }
    assert (
        files["http://us.archive.ubuntu.com/ubuntu focal-backports/universe amd64 Packages"]["a"] == "focal-backports"
    )


def test_dpkg_owners_reads_dpkg_s_as_this_machines_dpkg_prints_it(tmp_path):
    host = ScratchHost(tmp_path)
    lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.86.05"
    host.install(
        [("libnvidia-compute-535:amd64", "535.86.05-0ubuntu0.20.04.2", "amd64")], files={"libnvidia-compute-535": [lib]}
    )
    lib = f"{host.tree}{lib}"
    done = subprocess.run(
        ["dpkg", "-S", lib, "/usr/bin/nvidia-uninstall"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "DPKG_ADMINDIR": str(host.admin), "LC_ALL": "C"},
    )
    assert f"libnvidia-compute-535:amd64: {lib}" in done.stdout
    assert "dpkg-query: no path found matching pattern /usr/bin/nvidia-uninstall" in done.stderr
    assert fd.dpkg_owners(done.stdout + done.stderr) == {
        lib: ["libnvidia-compute-535"],
        "/usr/bin/nvidia-uninstall": [],
    }


def test_the_probe_on_this_machine_finds_no_driver():
    """This build machine has no NVIDIA driver: the probe, run here as it is, finds nothing, in its five sections."""
    done = subprocess.run(["/bin/sh", str(PROBE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert list(filters.sections(done.stdout)) == ["dpkg", "policy", "sources", "runfile", "owners"]
    verdict = judge(done.stdout, DEBIAN, "debian_nonfree")
    assert verdict["foreign"] is False and verdict["stop"] is False and verdict["message"] == ""


# --------------------------------------------------------------------------- a foreign driver, per kind


def test_canonicals_driver_is_foreign_on_a_default_ubuntu_host(tmp_path):
    """Ubuntu 20.04 with Canonical's nvidia-driver-535 (morrownr/rtl8852bu#7), gpufleet's default source (NVIDIA's
    repository), no gpufleet fact: every package is foreign, named with its build and origin; Canonical's desktop
    names are no layout of gpufleet's, so there is nothing to adopt: remove, or replace."""
    host = ScratchHost(tmp_path)
    host.install(FOCAL_CANONICAL)
    host.repository("focal-updates", FOCAL_UPDATES, FOCAL_CANONICAL)
    verdict = judge(host.probe(), UBUNTU_FOCAL, "nvidia")
    assert verdict["foreign"] and verdict["stop"]
    assert sorted(p["package"] for p in verdict["packages"]) == sorted(
        name.split(":")[0] for name, _version, _arch in FOCAL_CANONICAL
    )
    assert {p["origin"] for p in verdict["packages"]} == {"origin Ubuntu, suite focal-updates"}
    message = verdict["message"]
    assert message.startswith("nvidia_driver on gpu01: NVIDIA driver packages gpufleet did not install: ")
    assert "nvidia-driver-535 535.86.05-0ubuntu0.20.04.2 (origin Ubuntu, suite focal-updates)" in message
    assert "Nothing has been changed" in message and driver_facts.HOW_TO in message
    assert "nvidia_driver_foreign_driver: replace" in message and "adopt" not in message
    assert verdict["runfile"]["found"] is False

    replace = judge(host.probe(), UBUNTU_FOCAL, "nvidia", mode="replace")
    assert replace["stop"] is False and replace["uninstall"] == []
    # As dpkg names them (the architecture of Multi-Arch: same packages kept): apt takes those names.
    assert sorted(replace["remove"]) == sorted(name for name, _version, _arch in FOCAL_CANONICAL)
    assert "play 2 purges libnvidia-cfg1-535:amd64" in replace["notice"]


def test_canonicals_server_packages_can_be_adopted_with_source_ubuntu(tmp_path):
    """Canonical's 550-server packages and signed modules (NVIDIA/gpu-driver-container#186): the layout of source
    ubuntu, its signatures package (no branch) included; the message names the settings that take them over, and
    those settings do."""
    host = ScratchHost(tmp_path)
    host.install(NOBLE_SERVER)
    host.repository("noble-updates", NOBLE_UPDATES, NOBLE_SERVER)
    output = host.probe()
    verdict = judge(output, UBUNTU, "nvidia")
    assert verdict["stop"] and all(p["sources"] == ["ubuntu"] for p in verdict["packages"]), verdict["packages"]
    assert (
        'take them over as they are: nvidia_driver_source: ubuntu, nvidia_driver_branch: "550", '
        "nvidia_driver_foreign_driver: adopt"
    ) in verdict["message"]
    adopted = judge(output, UBUNTU, "ubuntu", branch="550", mode="adopt")
    assert adopted["foreign"] is False and adopted["stop"] is False
    assert sorted(adopted["adopted"]) == sorted(name.split(":")[0] for name, _version, _arch in NOBLE_SERVER)
    # adopt takes over only the configured branch.
    other_branch = judge(output, UBUNTU, "ubuntu", branch="535", mode="adopt")
    assert (
        other_branch["stop"]
        and "adopt, which takes over only packages of source 'ubuntu' and branch 535" in other_branch["message"]
    )


def test_nvidias_packages_installed_by_hand(tmp_path):
    """NVIDIA's 535 packages from its repository, installed by hand (cudagrad/cudagrad#2): foreign to a host set to
    Canonical's archive (the message names source nvidia to adopt them), and to the default source without a
    gpufleet fact; adopt takes them over there."""
    host = ScratchHost(tmp_path)
    host.install(JAMMY_NVIDIA_BY_HAND)
    host.repository("cuda", NVIDIA_CUDA, JAMMY_NVIDIA_BY_HAND)
    output = host.probe()
    canonical = judge(output, UBUNTU, "ubuntu")
    assert canonical["stop"] and {p["origin"] for p in canonical["packages"]} == {"origin NVIDIA, label NVIDIA CUDA"}
    assert "nvidia_driver_source: nvidia, nvidia_driver_foreign_driver: adopt" in canonical["message"]
    default = judge(output, UBUNTU, "nvidia")
    assert default["stop"] and "take them over as they are: nvidia_driver_foreign_driver: adopt" in default["message"]
    adopted = judge(output, UBUNTU, "nvidia", mode="adopt")
    assert adopted["foreign"] is False and len(adopted["adopted"]) == 4


def test_nvidias_run_installer_is_foreign_and_replace_runs_its_uninstaller(tmp_path):
    """NVIDIA's .run installer's files, owned by no package: foreign (dpkg would overwrite some of them without a
    word); replace runs its own uninstaller; without the uninstaller, replace cannot, and says so."""
    host = ScratchHost(tmp_path)
    host.files(RUNFILE)
    output = host.probe()
    verdict = judge(output, UBUNTU, "nvidia")
    runfile = verdict["runfile"]
    assert (
        runfile["found"] and runfile["version"] == RUN_VERSION and runfile["uninstaller"] == "/usr/bin/nvidia-uninstall"
    )
    assert sorted(runfile["files"]) == sorted(path for path in RUNFILE if path != "/var/log/nvidia-installer.log")
    assert runfile["log"] == "/var/log/nvidia-installer.log"
    assert verdict["stop"] and verdict["packages"] == []
    assert f"files of NVIDIA's .run installer {RUN_VERSION} that no package owns: " in verdict["message"]
    assert "dpkg would overwrite the .run driver's files without a word" in verdict["message"]
    assert "runs the .run installer's uninstaller" in verdict["message"] and "adopt" not in verdict["message"]

    replace = judge(output, UBUNTU, "nvidia", mode="replace")
    assert replace["stop"] is False and replace["remove"] == []
    assert replace["uninstall"] == ["/usr/bin/nvidia-uninstall", "--silent", "--skip-module-unload"]

    (host.tree / "usr" / "bin" / "nvidia-uninstall").unlink()
    stuck = judge(host.probe(), UBUNTU, "nvidia", mode="replace")
    assert stuck["stop"] and stuck["uninstall"] == []
    assert "replace, which cannot remove a .run driver without /usr/bin/nvidia-uninstall" in stuck["message"]


def test_a_driver_of_another_repository_on_a_gpufleet_host_is_foreign(tmp_path):
    """A gpufleet host (its fact) where a driver build of another repository was installed (Pop!_OS's, whose names
    are those of NVIDIA's repository): foreign, as its origin is none of gpufleet's sources."""
    build = [("nvidia-driver-510", "510.60.02-1pop0~1649099333~22.04~aedf526", "amd64")]
    host = ScratchHost(tmp_path)
    host.install(build)
    host.repository("pop", POP, build)
    verdict = judge(host.probe(), UBUNTU, "nvidia", fact=FACT_UBUNTU_580)
    assert verdict["stop"] and [p["package"] for p in verdict["packages"]] == ["nvidia-driver-510"]
    assert "origin system76, label System76, suite jammy" in verdict["message"]


# --------------------------------------------------------------------------- gpufleet's own hosts


def test_a_lab_node_gpufleet_installed_is_not_foreign(tmp_path):
    """A Debian 12 node with gpufleet's fact and the driver from the site mirror (the lab's: a Release origin of its
    own): gpufleet's. Without the fact, the same packages are foreign, and adopt takes them over (the configured
    mirror's URL is the source's)."""
    host = ScratchHost(tmp_path)
    host.install(DEBIAN_OWN, status="hold ok installed")
    url = host.repository("mirror", LAB_MIRROR, DEBIAN_OWN)
    output = host.probe()
    own = judge(output, DEBIAN, "debian_nonfree", repository_url=url, fact=FACT_DEBIAN)
    assert own["foreign"] is False and own["stop"] is False and len(own["own"]) == len(DEBIAN_OWN)
    assert own["runfile"]["found"] is False
    unknown = judge(output, DEBIAN, "debian_nonfree", repository_url=url)
    assert unknown["stop"] and "take them over as they are: nvidia_driver_foreign_driver: adopt" in unknown["message"]
    assert judge(output, DEBIAN, "debian_nonfree", repository_url=url, mode="adopt")["foreign"] is False
    # Another mirror URL with that origin: the packages are no source's, nothing to adopt.
    elsewhere = judge(output, DEBIAN, "debian_nonfree", repository_url=LAB_MIRROR_URL, mode="adopt")
    assert elsewhere["stop"] and "gpufleet-lab" in elsewhere["message"]


def test_a_branch_upgrade_from_the_same_source_is_not_foreign(tmp_path):
    """Ubuntu 22.04 that gpufleet moved from 535 to 580 (NVIDIA's repository): the 580 packages and a 535 library
    whose build the repository no longer lists are gpufleet's."""
    host = ScratchHost(tmp_path)
    host.install(UPGRADED_580 + LEFT_535)
    host.repository("cuda", NVIDIA_CUDA, UPGRADED_580)
    verdict = judge(host.probe(), UBUNTU, "nvidia", branch="580", fact=FACT_UBUNTU_580)
    assert verdict["foreign"] is False, verdict["message"]
    assert sorted(verdict["own"]) == [
        "libnvidia-compute-535",
        "libnvidia-compute-580",
        "nvidia-headless-580",
        "nvidia-utils-580",
    ]


def test_packaged_driver_files_and_a_leftover_log_are_no_runfile_trace(tmp_path):
    """A library file of a package (Canonical's libnvidia-compute-535 ships libnvidia-ml.so.<version>), the .so.1 link
    a distribution's alternatives make, and the log an uninstalled .run driver leaves are no .run driver."""
    lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.86.05"
    host = ScratchHost(tmp_path)
    host.install(FOCAL_CANONICAL, files={"libnvidia-compute-535": [lib]})
    host.repository("focal-updates", FOCAL_UPDATES, FOCAL_CANONICAL)
    host.files([lib, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/var/log/nvidia-installer.log"])
    output = host.probe()
    assert filters.sections(output)["runfile"] == ["/var/log/nvidia-installer.log", lib]
    verdict = judge(output, UBUNTU_FOCAL, "nvidia")
    assert verdict["runfile"] == {"found": False, "files": [], "version": "", "uninstaller": "", "log": ""}


def test_nvidia_named_packages_that_are_no_driver_are_left_alone():
    """The Container Toolkit (roles/container's packages) and the distributions' CUDA toolkit are no driver."""
    for name in (
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
        "nvidia-cuda-toolkit",
        "nvidia-cuda-dev",
        "libnvidia-egl-wayland1",
    ):
        assert not driver_facts._is_driver(name), name
    for name in (
        "nvidia-kernel-dkms",
        "libcuda1",
        "cuda-drivers",
        "cuda-drivers-535",
        "libnvidia-compute",
        "linux-signatures-nvidia-6.8.0-51-generic",
        "firmware-nvidia-gsp",
    ):
        assert driver_facts._is_driver(name), name
    assert not driver_facts._is_driver("cuda-drivers-fabricmanager-535") and not driver_facts._is_driver("libcudart12")


def test_a_wrong_mode_or_source_is_an_error():
    with pytest.raises(Exception, match="mode 'keep' is none of refuse, adopt, replace"):
        fd.foreign_driver({}, UBUNTU, "nvidia", "535", mode="keep")
    with pytest.raises(Exception, match="source 'debian_nonfree' has no layout"):
        fd.foreign_driver({}, UBUNTU, "debian_nonfree", "535")


# --------------------------------------------------------------------------- in the role (tests/unit/role_run.py)

# tasks/foreign.yml in the role's order, after validate.yml. Its read (the module gpufleet.fleet.driver_facts) cannot
# run on a fake host: its judgement (plugins/module_utils/driver_facts.py) runs here as the filter
# gpufleet.fleet.foreign_driver, which is that judgement on the controller, with the read task's own arguments
# (templated in the play, as the module gets them) on the probe's output (a ScratchHost's, given as a host variable),
# registered under the read task's name; then copies of the tasks after it. Then what install.yml's two removal tasks
# would run (their arguments and conditions, templated in the same play).
READ = role_run.role_task("nvidia_driver", "foreign.yml", "Read the installed NVIDIA driver packages")
JUDGEMENT = [
    {
        "name": "Judge as the read's module does",
        "ansible.builtin.set_fact": {
            READ["register"]: "{{ __nvidia_driver_foreign_probe.stdout | gpufleet.fleet.sections"
            " | gpufleet.fleet.foreign_driver(**__arguments) }}"
        },
        "vars": {
            "__arguments": {k: v for k, v in READ["gpufleet.fleet.driver_facts"]["foreign"].items() if k != "script"}
        },
    },
]
UNINSTALL = role_run.role_task("nvidia_driver", "install.yml", "Run the .run installer's uninstaller")
PURGE = role_run.role_task("nvidia_driver", "install.yml", "Purge the driver packages gpufleet did not install")
IN_ROLE = role_run.Batch(
    FAKE_FACTS,
    [role_run.import_role("nvidia_driver", "validate"), *JUDGEMENT],
    after=[
        role_run.capture(
            {
                "uninstall": UNINSTALL["ansible.builtin.command"],
                "uninstall_runs": role_run.condition(UNINSTALL),
                "purge": PURGE["ansible.builtin.apt"],
                "purge_runs": role_run.condition(PURGE),
                "verdict": "{{ __nvidia_driver_foreign }}",
            }
        )
    ],
)
# Debian's own archive, as this build machine's `apt-cache policy` prints its Release fields
# ("release v=12.15,o=Debian,a=oldstable,n=bookworm,l=Debian,c=main,b=amd64", deb.debian.org bookworm/main).
BOOKWORM = {"Origin": "Debian", "Label": "Debian", "Suite": "oldstable", "Codename": "bookworm", "Version": "12.15"}


@pytest.fixture(scope="module")
def in_role(tmp_path_factory) -> dict[str, role_run.Outcome]:
    def output(name: str, build: Any) -> str:
        host = ScratchHost(tmp_path_factory.mktemp(name))
        build(host)
        return host.probe()

    probes = {
        "by-hand": output(
            "by-hand",
            lambda h: (h.install(JAMMY_NVIDIA_BY_HAND), h.repository("cuda", NVIDIA_CUDA, JAMMY_NVIDIA_BY_HAND)),
        ),
        "canonical": output(
            "canonical", lambda h: (h.install(FOCAL_CANONICAL), h.repository("u", FOCAL_UPDATES, FOCAL_CANONICAL))
        ),
        "runfile": output("runfile", lambda h: h.files(RUNFILE)),
        "debian": output("debian", lambda h: (h.install(DEBIAN_OWN), h.repository("bookworm", BOOKWORM, DEBIAN_OWN))),
    }
    cases = {
        "by-hand, source ubuntu": ("ubuntu2204", "by-hand", {"nvidia_driver_source": "ubuntu"}),
        "canonical, replace": ("ubuntu2004", "canonical", {"nvidia_driver_foreign_driver": "replace"}),
        "runfile, replace": ("ubuntu2204", "runfile", {"nvidia_driver_foreign_driver": "replace"}),
        "debian, gpufleet's": ("debian12", "debian", {"ansible_local": {"nvidia_driver": FACT_DEBIAN}}),
        "debian, no fact": ("debian12", "debian", {}),
    }
    settings = {
        name: (facts, {"__nvidia_driver_foreign_probe": {"stdout": probes[probe], "rc": 0}, **extra})
        for name, (facts, probe, extra) in cases.items()
    }
    for facts, variables in settings.values():
        IN_ROLE.declare(facts, **variables)
    return {name: IN_ROLE.get(facts, **variables) for name, (facts, variables) in settings.items()}


def test_play_1_stops_a_foreign_driver_naming_it_and_the_move(in_role):
    cfg = in_role["by-hand, source ubuntu"]
    # The module fails with the verdict's message where it stops (test_driver_facts.py runs it).
    verdict = cfg["verdict"]
    assert verdict["stop"] is True and verdict["message"].startswith("nvidia_driver on ubuntu2204-")
    assert (
        "libnvidia-compute-535 535.104.12-0ubuntu1" in verdict["message"]
        or "libnvidia-encode-535 535.104.12-0ubuntu1" in verdict["message"]
    )
    assert "(origin NVIDIA, label NVIDIA CUDA)" in verdict["message"]
    assert "nvidia_driver_source: nvidia, nvidia_driver_foreign_driver: adopt" in verdict["message"]
    no_fact = in_role["debian, no fact"]
    assert no_fact["verdict"]["stop"] is True
    assert "take them over as they are: nvidia_driver_foreign_driver: adopt" in no_fact["verdict"]["message"]


def test_a_host_gpufleet_installed_goes_on_and_removes_nothing(in_role):
    cfg = in_role["debian, gpufleet's"]
    assert cfg.failure is None
    assert cfg["verdict"]["foreign"] is False and len(cfg["verdict"]["own"]) == len(DEBIAN_OWN)
    assert cfg["uninstall_runs"] is False and cfg["purge_runs"] is False


def test_replace_purges_the_packages_in_play_2(in_role):
    cfg = in_role["canonical, replace"]
    assert cfg.failure is None and cfg["uninstall_runs"] is False and cfg["purge_runs"] is True
    assert cfg["purge"] == {
        "name": [name for name, _version, _arch in FOCAL_CANONICAL],
        "state": "absent",
        "purge": True,
        "allow_change_held_packages": True,
    }


def test_replace_runs_the_run_installers_uninstaller_in_play_2(in_role):
    cfg = in_role["runfile, replace"]
    assert cfg.failure is None and cfg["uninstall_runs"] is True and cfg["purge_runs"] is False
    assert cfg["uninstall"] == {"argv": ["/usr/bin/nvidia-uninstall", "--silent", "--skip-module-unload"]}


def _names(path: Path) -> list[str]:
    return [str(task.get("name", "")) for task in role_run.tasks_of(yaml.safe_load(path.read_text()))]


def test_the_look_runs_before_the_repository_trial_and_the_removal_before_the_install():
    """Play 1 (probe.yml) and play 2 (main.yml) look for a foreign driver before the trial of the repository; in
    play 2 the removal comes before anything reads the driver's packages, and gpufleet's fact is written after
    the removal and before the first package is installed (a run interrupted mid-install finds its own)."""
    for entry, look, trial in (
        (
            "probe.yml",
            "Look for a driver gpufleet did not install, and list the installed stack and the holds (read-only)",
            "Check the host, try the driver repository and simulate the install (read-only)",
        ),
        ("main.yml", "Look for a driver gpufleet did not install", "Check the driver can be installed on this host"),
    ):
        names = _names(ROLE / "tasks" / entry)
        assert names.index(look) < names.index(trial), entry
    install = _names(ROLE / "tasks" / "install.yml")
    order = [
        "Run the .run installer's uninstaller of the driver gpufleet did not install",
        "Purge the driver packages gpufleet did not install",
        "List the installed driver stack and the held packages before the change",
        "Simulate the driver transaction",
        "Install the driver state fact",
        "Install the kernel headers and build tools",
        "Install the NVIDIA driver packages",
    ]
    assert [install.index(name) for name in order] == sorted(install.index(name) for name in order)
    assert "Install the driver state fact" not in _names(ROLE / "tasks" / "facts.yml")
    probe = role_run.role_task("nvidia_driver", "foreign.yml", "Read the installed NVIDIA driver packages")
    assert probe["gpufleet.fleet.driver_facts"]["foreign"]["script"] == (
        "{{ lookup('ansible.builtin.file', 'foreign_driver_probe.sh') }}"
    )
    assert probe["changed_when"] is False and probe["check_mode"] is False
