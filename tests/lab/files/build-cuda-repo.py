#!/usr/bin/env python
"""Builds the lab's site CUDA apt repository: CUDA 12.1 for Debian 12, in the layout of NVIDIA's own.

NVIDIA serves CUDA as a *flat* apt repository per OS
(https://developer.download.nvidia.com/compute/cuda/repos/<os>/x86_64/:
Packages, Packages.gz, Release, InRelease, Release.gpg and the .deb files in
one directory; apt source ``deb [signed-by=...] <url>/ /``), but publishes no
CUDA 12.1 for Debian 12 (its debian12 directory starts at 12.3). So the lab
does what a site must: it serves its own repository, at a path of its own
(``site/cuda-<release>/debian12`` on the mirror, Release Origin
``gpufleet-lab-site``), which the lab inventory names as the site repository
(cuda_repository_url). It holds NVIDIA's package names, versions and file
layout, built from the binaries NVIDIA publishes as PyPI wheels:

  cuda-nvcc-12-1       ptxas, the crt headers, libnvvm  (nvidia-cuda-nvcc-cu12)
  cuda-cudart-12-1     libcudart.so.12                  (nvidia-cuda-runtime-cu12)
  cuda-cudart-dev-12-1 runtime headers, libcudart.so    (nvidia-cuda-runtime-cu12)
  cuda-nvrtc-12-1      libnvrtc, libnvrtc-builtins      (nvidia-cuda-nvrtc-cu12)
  cuda-nvrtc-dev-12-1  nvrtc.h, libnvrtc.so             (nvidia-cuda-nvrtc-cu12)
  cuda-toolkit-12-1    metapackage: the five above, at exact versions
  libcudnn8(-dev)      FIXTURE: the real headers and dispatcher library only
  libnccl2, libnccl-dev                                 (nvidia-nccl-cu12)
  cuda-keyring         FIXTURE: NVIDIA's layout, holding the lab's key

The wheel carries no `nvcc` driver (nor cicc, fatbinary, nvlink): nothing
stands in for it; a node compiles with NVRTC + ptxas.

Idempotent: a package whose .deb already exists with the same control data
is not rebuilt (its wheel is not even fetched), the index is rebuilt only
when the set of .deb files changed, and the repository is signed again only
when Packages changed or the signatures do not verify with --key.

Needs: python3 (stdlib), pip (only to fetch missing wheels), dpkg-deb,
apt-ftparchive, gpg.

Example (what tests/lab/lab.yml runs, versions from files/compatibility.yml):

  build-cuda-repo.py --cache .lab/cache/wheels --out .lab/mirror/site/cuda-12.1/debian12 \\
      --gnupg .lab/gnupg --key <fingerprint> --mirror-url http://gpufleet-mirror \\
      --cuda-toolkit-version 12.1.1-1 --cuda-component-version 12.1.105 \\
      --cudnn-version 8.9.2.26-1+cuda12.1 --nccl-version 2.18.1-1+cuda12.1
"""

from __future__ import annotations

import argparse
import base64
import csv
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MAINTAINER = "gpufleet lab <lab@gpufleet.invalid>"
# Where the site repository lives, relative to the mirror root: a path of
# its own, not NVIDIA's (compute/cuda/repos/debian12/x86_64 has no CUDA 12.1).
REPO_PATH = "site/cuda-{cuda}/debian12"
KEYRING_VERSION = "1.1-1"
KEYRING_FILE = "/usr/share/keyrings/cuda-archive-keyring.gpg"
# The name NVIDIA's cuda-keyring gives its list on Debian 12 (the cuda role
# replaces that file with its own source).
KEYRING_LIST = "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"
MULTIARCH_LIB = "/usr/lib/x86_64-linux-gnu"
# zstd (dpkg >= 1.21.18, so Debian 12 and Ubuntu 22.04 read it): the NCCL
# library alone takes about 100 s with xz on two cores and 2 s with zstd.
DPKG_DEB_COMPRESSION = ["-Zzstd"]
RELEASE_FIELDS = {
    "Origin": "gpufleet-lab-site",
    "Label": "gpufleet lab site CUDA for Debian 12",
    "Architectures": "amd64",
    "Description": "gpufleet lab site repository: CUDA for Debian 12 built from NVIDIA's PyPI wheels (not NVIDIA's)",
}


def repo_path(cuda: str) -> str:
    """The repository's path below the mirror root for a CUDA release: 12.1 -> site/cuda-12.1/debian12."""
    return REPO_PATH.format(cuda=cuda)


# Runtime libraries the wheels' ELF files need (readelf -d, NEEDED):
# glibc's (libc, libm, libdl, libpthread, librt) and, for some, libstdc++.
GLIBC = "libc6"
CXX_RUNTIME = ["libc6", "libgcc-s1", "libstdc++6"]


class BuildError(Exception):
    """A failure with a message meant for the person running the build."""


# --------------------------------------------------------------------------
# Versions


@dataclass(frozen=True)
class Versions:
    """The versions the repository holds, checked and broken into parts."""

    cuda: str  # "12.1"
    toolkit: str  # cuda-toolkit-12-1's package version, "12.1.1-1"
    component: str  # nvcc, cudart and nvrtc upstream version, "12.1.105"
    cudnn: str  # libcudnn8's package version, "8.9.2.26-1+cuda12.1"
    nccl: str  # libnccl2's package version, "2.18.1-1+cuda12.1"

    @property
    def cuda_major(self) -> str:
        return self.cuda.split(".")[0]

    @property
    def dashed(self) -> str:
        """The package name suffix: 12.1 -> 12-1."""
        return self.cuda.replace(".", "-")

    @property
    def component_package(self) -> str:
        """NVIDIA's package version of a toolkit component: 12.1.105 -> 12.1.105-1."""
        return f"{self.component}-1"

    @property
    def cudnn_upstream(self) -> str:
        return upstream_version(self.cudnn)

    @property
    def nccl_upstream(self) -> str:
        return upstream_version(self.nccl)


def upstream_version(package_version: str) -> str:
    """The upstream part of a Debian version: 8.9.2.26-1+cuda12.1 -> 8.9.2.26."""
    version = package_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def parse_versions(toolkit: str, component: str, cudnn: str, nccl: str) -> Versions:
    """Checks that the four versions belong to one CUDA release and returns them."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)-(\w[\w.+~]*)", toolkit)
    if not match:
        raise BuildError(f"--cuda-toolkit-version {toolkit!r} is not a cuda-toolkit package version like 12.1.1-1")
    cuda = f"{match[1]}.{match[2]}"
    if not re.fullmatch(re.escape(cuda) + r"\.\d+", component):
        raise BuildError(
            f"--cuda-component-version {component!r} is not a CUDA {cuda} component version like {cuda}.105"
        )
    for option, version, example in (("--cudnn-version", cudnn, "8.9.2.26"), ("--nccl-version", nccl, "2.18.1")):
        if not re.fullmatch(r"\d+(\.\d+){2,3}-\d+\+cuda" + re.escape(cuda), version):
            raise BuildError(
                f"{option} {version!r} is not a package version built for CUDA {cuda} like {example}-1+cuda{cuda}"
            )
    return Versions(cuda=cuda, toolkit=toolkit, component=component, cudnn=cudnn, nccl=nccl)


# --------------------------------------------------------------------------
# Debian control data


def render_control(fields: dict[str, str]) -> str:
    """A control paragraph. A multi-line value (Description) continues on lines
    that start with a space; an empty continuation line is written " ."."""
    lines = []
    for name, value in fields.items():
        first, *rest = value.split("\n")
        lines.append(f"{name}: {first}" if first else f"{name}:")
        lines.extend(f" {line}" if line.strip() else " ." for line in rest)
    return "\n".join(lines) + "\n"


def parse_control(text: str) -> dict[str, str]:
    """The first paragraph of control data as {field: value} (continuations joined with newlines)."""
    fields: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        if line[0] in " \t" and name:
            fields[name] += "\n" + ("" if line.strip() == "." else line[1:])
        else:
            name, _colon, value = line.partition(":")
            fields[name] = value.strip()
    return fields


def parse_paragraphs(text: str) -> list[dict[str, str]]:
    """Every paragraph of a Packages or Release file."""
    return [parse_control(block) for block in re.split(r"\n\s*\n", text) if block.strip()]


def deb_filename(package: str, version: str, architecture: str) -> str:
    """Debian's file name for a package: the version without its epoch."""
    return f"{package}_{version.split(':', 1)[-1]}_{architecture}.deb"


def installed_size_kib(root: Path) -> int:
    """Installed-Size as dpkg-gencontrol counts it: each regular file rounded up
    to whole KiB, one KiB for every directory and symlink; DEBIAN/ excluded."""
    total = 0
    for path in root.rglob("*"):
        if path.relative_to(root).parts[0] == "DEBIAN":
            continue
        if path.is_symlink() or path.is_dir():
            total += 1
        else:
            total += -(-path.stat().st_size // 1024)
    return total


# --------------------------------------------------------------------------
# What the repository holds


@dataclass(frozen=True)
class Wheel:
    """An NVIDIA wheel on PyPI."""

    project: str
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"

    @property
    def stem(self) -> str:
        """The wheel file name's distribution-version part."""
        return f"{re.sub(r'[-_.]+', '_', self.project).lower()}-{self.version}"

    @property
    def license_member(self) -> str:
        return f"{self.stem}.dist-info/License.txt"


@dataclass
class Install:
    """Files from the wheel: `src` a member, or a directory ending in "/" whose
    files all go below `dest` (a directory then). mode None: 0755 when the
    wheel marks the file executable, else 0644."""

    src: str
    dest: str
    mode: int | None = None


@dataclass
class Package:
    name: str
    version: str
    summary: str
    about: str
    section: str
    architecture: str = "amd64"
    wheel: Wheel | None = None
    depends: list[str] = field(default_factory=list)
    installs: list[Install] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # path -> target
    contents: dict[str, bytes] = field(default_factory=dict)  # path -> bytes (0644)
    conffiles: list[str] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)

    @property
    def filename(self) -> str:
        return deb_filename(self.name, self.version, self.architecture)

    def control_fields(self, installed_size: int | None = None) -> dict[str, str]:
        fields = {
            "Package": self.name,
            "Version": self.version,
            "Architecture": self.architecture,
            "Maintainer": MAINTAINER,
        }
        if installed_size is not None:
            fields["Installed-Size"] = str(installed_size)
        if self.depends:
            fields["Depends"] = ", ".join(self.depends)
        fields["Section"] = self.section
        fields["Priority"] = "optional"
        if self.wheel:
            fields["Homepage"] = f"https://pypi.org/project/{self.wheel.project}/{self.wheel.version}/"
        fields["Description"] = f"{self.summary}\n{self.about}"
        return fields


def built_from(wheel: Wheel, extra: str = "") -> str:
    text = f"Built for the gpufleet lab from NVIDIA's PyPI wheel {wheel.requirement}, in NVIDIA's package layout."
    return wrap(text + (" " + extra if extra else ""))


def wrap(text: str, width: int = 76) -> str:
    """Fills text into lines of at most `width` characters (a Description body)."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(lines + [line])


def exact(package: Package) -> str:
    return f"{package.name} (= {package.version})"


def repository_packages(v: Versions, keyring: bytes, key_fpr: str, repo_url: str) -> list[Package]:
    """Every package of the repository, in NVIDIA's names and layout."""
    home = f"/usr/local/cuda-{v.cuda}"
    target = f"{home}/targets/x86_64-linux"
    nvcc_wheel = Wheel(f"nvidia-cuda-nvcc-cu{v.cuda_major}", v.component)
    runtime_wheel = Wheel(f"nvidia-cuda-runtime-cu{v.cuda_major}", v.component)
    nvrtc_wheel = Wheel(f"nvidia-cuda-nvrtc-cu{v.cuda_major}", v.component)
    cudnn_wheel = Wheel(f"nvidia-cudnn-cu{v.cuda_major}", v.cudnn_upstream)
    nccl_wheel = Wheel(f"nvidia-nccl-cu{v.cuda_major}", v.nccl_upstream)
    component = v.component_package

    nvcc = Package(
        name=f"cuda-nvcc-{v.dashed}",
        version=component,
        section="devel",
        wheel=nvcc_wheel,
        summary="CUDA nvcc",
        about=built_from(
            nvcc_wheel,
            "It holds what the wheel ships: ptxas, the crt headers and libnvvm with"
            " libdevice. NVIDIA's nvcc driver, cicc, fatbinary and nvlink are not in the"
            " wheel and not in this package: compile with NVRTC and ptxas.",
        ),
        depends=[GLIBC],
        installs=[
            Install("nvidia/cuda_nvcc/bin/ptxas", f"{home}/bin/ptxas", 0o755),
            Install("nvidia/cuda_nvcc/include/", f"{target}/include"),
            Install("nvidia/cuda_nvcc/nvvm/include/", f"{home}/nvvm/include"),
            Install("nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so", f"{home}/nvvm/lib64/libnvvm.so.4.0.0"),
            Install("nvidia/cuda_nvcc/nvvm/libdevice/", f"{home}/nvvm/libdevice"),
        ],
        links={f"{home}/nvvm/lib64/libnvvm.so.4": "libnvvm.so.4.0.0", f"{home}/nvvm/lib64/libnvvm.so": "libnvvm.so.4"},
    )
    cudart = Package(
        name=f"cuda-cudart-{v.dashed}",
        version=component,
        section="libs",
        wheel=runtime_wheel,
        summary="CUDA Runtime native Libraries",
        about=built_from(runtime_wheel),
        depends=[GLIBC],
        installs=[Install("nvidia/cuda_runtime/lib/libcudart.so.12", f"{target}/lib/libcudart.so.{v.component}")],
        links={
            f"{target}/lib/libcudart.so.{v.cuda_major}": f"libcudart.so.{v.component}",
            f"{home}/lib64": "targets/x86_64-linux/lib",
        },
    )
    cudart_dev = Package(
        name=f"cuda-cudart-dev-{v.dashed}",
        version=component,
        section="libdevel",
        wheel=runtime_wheel,
        summary="CUDA Runtime native dev links, headers",
        about=built_from(runtime_wheel, "The wheel has no static libcudart."),
        depends=[exact(cudart)],
        installs=[Install("nvidia/cuda_runtime/include/", f"{target}/include")],
        links={
            f"{target}/lib/libcudart.so": f"libcudart.so.{v.cuda_major}",
            f"{home}/include": "targets/x86_64-linux/include",
        },
    )
    nvrtc = Package(
        name=f"cuda-nvrtc-{v.dashed}",
        version=component,
        section="libs",
        wheel=nvrtc_wheel,
        summary="NVRTC native runtime libraries",
        about=built_from(nvrtc_wheel),
        depends=CXX_RUNTIME,
        installs=[
            Install("nvidia/cuda_nvrtc/lib/libnvrtc.so.12", f"{target}/lib/libnvrtc.so.{v.component}"),
            Install(
                f"nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.{v.cuda}",
                f"{target}/lib/libnvrtc-builtins.so.{v.component}",
            ),
        ],
        links={
            f"{target}/lib/libnvrtc.so.{v.cuda_major}": f"libnvrtc.so.{v.component}",
            f"{target}/lib/libnvrtc-builtins.so.{v.cuda}": f"libnvrtc-builtins.so.{v.component}",
        },
    )
    nvrtc_dev = Package(
        name=f"cuda-nvrtc-dev-{v.dashed}",
        version=component,
        section="libdevel",
        wheel=nvrtc_wheel,
        summary="NVRTC native dev links, headers",
        about=built_from(nvrtc_wheel),
        depends=[exact(nvrtc)],
        installs=[Install("nvidia/cuda_nvrtc/include/nvrtc.h", f"{target}/include/nvrtc.h")],
        links={
            f"{target}/lib/libnvrtc.so": f"libnvrtc.so.{v.cuda_major}",
            f"{target}/lib/libnvrtc-builtins.so": f"libnvrtc-builtins.so.{v.cuda}",
        },
    )
    components = [nvcc, cudart, cudart_dev, nvrtc, nvrtc_dev]
    toolkit = Package(
        name=f"cuda-toolkit-{v.dashed}",
        version=v.toolkit,
        section="metapackages",
        summary=f"CUDA Toolkit {v.cuda} meta-package",
        about=wrap(
            f"gpufleet lab: the CUDA {v.cuda} components built from NVIDIA's PyPI wheels "
            + ", ".join(w.requirement for w in (nvcc_wheel, runtime_wheel, nvrtc_wheel))
            + f" for the gpufleet lab. NVIDIA's cuda-toolkit-{v.dashed} holds many more."
        ),
        depends=[exact(p) for p in components],
    )

    cudnn_major = v.cudnn_upstream.split(".")[0]
    cudnn_so = ".".join(v.cudnn_upstream.split(".")[:3])  # 8.9.2.26 -> 8.9.2
    libcudnn = Package(
        name=f"libcudnn{cudnn_major}",
        version=v.cudnn,
        section="libs",
        wheel=cudnn_wheel,
        summary="cuDNN runtime libraries",
        about=wrap(
            f"gpufleet lab fixture: only the real dispatcher library libcudnn.so.{cudnn_so} from NVIDIA's PyPI"
            f" wheel {cudnn_wheel.requirement}, built for the gpufleet lab; the sub-libraries it loads"
            " (libcudnn_ops_infer, libcudnn_cnn_infer, ...) are left out: the library loads, but any"
            " cuDNN call, even cudnnGetVersion, aborts the process."
        ),
        depends=CXX_RUNTIME,
        installs=[Install(f"nvidia/cudnn/lib/libcudnn.so.{cudnn_major}", f"{MULTIARCH_LIB}/libcudnn.so.{cudnn_so}")],
        links={f"{MULTIARCH_LIB}/libcudnn.so.{cudnn_major}": f"libcudnn.so.{cudnn_so}"},
        triggers=["activate-noawait ldconfig"],
    )
    libcudnn_dev = Package(
        name=f"libcudnn{cudnn_major}-dev",
        version=v.cudnn,
        section="libdevel",
        wheel=cudnn_wheel,
        summary="cuDNN development libraries and headers",
        about=wrap(
            f"gpufleet lab fixture: the real cuDNN headers (cudnn*.h, cudnn_version.h) from NVIDIA's PyPI"
            f" wheel {cudnn_wheel.requirement}, built for the gpufleet lab, in /usr/include (NVIDIA installs"
            " them in /usr/include/x86_64-linux-gnu with alternatives), and the libcudnn.so link."
        ),
        depends=[exact(libcudnn)],
        installs=[Install("nvidia/cudnn/include/", "/usr/include")],
        links={f"{MULTIARCH_LIB}/libcudnn.so": f"libcudnn.so.{cudnn_major}"},
    )

    nccl_major = v.nccl_upstream.split(".")[0]
    libnccl = Package(
        name=f"libnccl{nccl_major}",
        version=v.nccl,
        section="libs",
        wheel=nccl_wheel,
        summary="NVIDIA Collective Communication Library (NCCL) Runtime",
        about=built_from(nccl_wheel),
        depends=CXX_RUNTIME,
        installs=[Install(f"nvidia/nccl/lib/libnccl.so.{nccl_major}", f"{MULTIARCH_LIB}/libnccl.so.{v.nccl_upstream}")],
        links={f"{MULTIARCH_LIB}/libnccl.so.{nccl_major}": f"libnccl.so.{v.nccl_upstream}"},
        triggers=["activate-noawait ldconfig"],
    )
    libnccl_dev = Package(
        name="libnccl-dev",
        version=v.nccl,
        section="libdevel",
        wheel=nccl_wheel,
        summary="NVIDIA Collective Communication Library (NCCL) Development Files",
        about=built_from(nccl_wheel, "The wheel has no static libnccl."),
        depends=[exact(libnccl)],
        installs=[Install("nvidia/nccl/include/", "/usr/include")],
        links={f"{MULTIARCH_LIB}/libnccl.so": f"libnccl.so.{nccl_major}"},
    )

    keyring_package = Package(
        name="cuda-keyring",
        version=KEYRING_VERSION,
        architecture="all",
        section="misc",
        summary="GPG keyring for the CUDA repository",
        about=wrap(
            f"gpufleet lab fixture: NVIDIA's name and file layout, but {KEYRING_FILE} holds the gpufleet lab"
            f" mirror key {key_fpr} (not NVIDIA's) and {KEYRING_LIST} points apt at {repo_url}"
        ),
        contents={
            KEYRING_FILE: keyring,
            KEYRING_LIST: f"deb [signed-by={KEYRING_FILE}] {repo_url} /\n".encode(),
            "/usr/share/doc/cuda-keyring/copyright": (
                "gpufleet lab fixture of NVIDIA's cuda-keyring package.\n"
                f"The key in {KEYRING_FILE} is the gpufleet lab mirror key {key_fpr},\n"
                "generated by tests/lab/lab.yml; it is not NVIDIA's.\n"
            ).encode(),
        },
        conffiles=[KEYRING_LIST],
    )
    return components + [toolkit, libcudnn, libcudnn_dev, libnccl, libnccl_dev, keyring_package]


# --------------------------------------------------------------------------
# Wheels


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Runs a command; a failure becomes a BuildError carrying its output."""
    result = subprocess.run(argv, capture_output=True, check=False, **kwargs)
    if result.returncode != 0:
        output = (result.stderr or result.stdout or b"").decode(errors="replace").strip()
        raise BuildError(f"{' '.join(argv[:3])} ... failed (exit {result.returncode}): {output[-2000:]}")
    return result


def fetch_wheel(wheel: Wheel, cache: Path) -> Path:
    """The wheel from the cache, downloaded with pip when it is not there yet."""

    def cached() -> list[Path]:
        return sorted(p for p in cache.glob(f"{wheel.stem}-*.whl") if re.search(r"(x86_64|-any)\.whl$", p.name))

    if not cached():
        print(f"build-cuda-repo: downloading {wheel.requirement} into {cache}", flush=True)
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--implementation",
                "py",
                "--python-version",
                "3",
                "--platform",
                "manylinux1_x86_64",
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "manylinux_2_17_x86_64",
                "-d",
                str(cache),
                wheel.requirement,
            ]
        )
        if not cached():
            raise BuildError(f"pip downloaded no x86_64 wheel for {wheel.requirement} into {cache}")
    return cached()[-1]


class WheelReader:
    """Extracts members of a wheel, each checked against the wheel's RECORD."""

    def __init__(self, path: Path, wheel: Wheel):
        self.path = path
        self.zip = zipfile.ZipFile(path)
        record = self.zip.read(f"{wheel.stem}.dist-info/RECORD").decode()
        self.hashes = {row[0]: row[1] for row in csv.reader(io.StringIO(record)) if len(row) >= 2 and row[1]}
        self.names = [i.filename for i in self.zip.infolist() if not i.is_dir()]

    def under(self, directory: str) -> list[str]:
        """The files below a directory, without the wheel's empty __init__.py files."""
        return [n for n in self.names if n.startswith(directory) and not n.endswith("__init__.py")]

    def extract(self, member: str, dest: Path, mode: int | None) -> None:
        try:
            info = self.zip.getinfo(member)
        except KeyError:
            raise BuildError(f"{self.path.name} has no {member}") from None
        digest = hashlib.sha256()
        with self.zip.open(info) as src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        expected = self.hashes.get(member)
        actual = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
        if expected != actual:
            raise BuildError(f"{self.path.name}: {member} does not match the wheel's RECORD (a damaged download?)")
        if mode is None:
            mode = 0o755 if (info.external_attr >> 16) & 0o100 else 0o644
        os.chmod(dest, mode)
        os.utime(dest, (time.mktime(info.date_time + (0, 0, -1)),) * 2)


# --------------------------------------------------------------------------
# Building one package


def make_dirs(root: Path, path: str) -> Path:
    """root/path as a directory, every directory created 0755 whatever the umask."""
    current = root
    for part in Path(path.lstrip("/")).parts:
        current = current / part
        if not current.is_dir():
            current.mkdir()
            os.chmod(current, 0o755)
    return current


def stage(package: Package, wheel: WheelReader | None, root: Path) -> None:
    """Lays the package's files out under root, as they are installed."""
    for item in package.installs:
        if item.src.endswith("/"):
            members = wheel.under(item.src)
            if not members:
                raise BuildError(f"{wheel.path.name} has nothing under {item.src}")
            for member in members:
                dest = make_dirs(root, str(Path(item.dest) / Path(member[len(item.src) :]).parent))
                wheel.extract(member, dest / Path(member).name, item.mode)
        else:
            dest = make_dirs(root, str(Path(item.dest).parent)) / Path(item.dest).name
            wheel.extract(item.src, dest, item.mode)
    for path, target in package.links.items():
        make_dirs(root, str(Path(path).parent))
        os.symlink(target, root / path.lstrip("/"))
    for path, data in package.contents.items():
        dest = make_dirs(root, str(Path(path).parent)) / Path(path).name
        dest.write_bytes(data)
        os.chmod(dest, 0o644)
    if wheel:
        doc = make_dirs(root, f"/usr/share/doc/{package.name}") / "copyright"
        wheel.extract(package.wheel.license_member, doc, 0o644)


def build_deb(package: Package, wheel: WheelReader | None, work: Path, out: Path) -> int:
    """Builds the .deb into `out` (atomically) and returns its Installed-Size."""
    root = work / package.name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    os.chmod(root, 0o755)
    stage(package, wheel, root)
    size = installed_size_kib(root)
    control = make_dirs(root, "DEBIAN")
    meta = {"control": render_control(package.control_fields(size))}
    if package.conffiles:
        meta["conffiles"] = "".join(f"{path}\n" for path in package.conffiles)
    if package.triggers:
        meta["triggers"] = "".join(f"{line}\n" for line in package.triggers)
    for name, text in meta.items():
        (control / name).write_text(text)
        os.chmod(control / name, 0o644)
    partial = work / package.filename
    run(["dpkg-deb", "--root-owner-group", *DPKG_DEB_COMPRESSION, "--build", str(root), str(partial)])
    shutil.move(partial, out / package.filename)
    shutil.rmtree(root)
    return size


def existing_control(path: Path) -> dict[str, str] | None:
    """The control fields of an existing .deb; None when there is none or it is unreadable."""
    if not path.is_file():
        return None
    result = subprocess.run(["dpkg-deb", "--field", str(path)], capture_output=True, text=True, check=False)
    return parse_control(result.stdout) if result.returncode == 0 else None


def is_current(package: Package, deb: Path) -> bool:
    """True when the .deb exists and carries exactly this package's control data."""
    have = existing_control(deb)
    if have is None:
        return False
    have.pop("Installed-Size", None)
    want = parse_control(render_control(package.control_fields()))
    return have == want


# --------------------------------------------------------------------------
# Index and signatures


def sort_packages(text: str) -> str:
    """A Packages file with its paragraphs in a stable order (apt-ftparchive
    lists files in directory order)."""
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()]
    blocks.sort(key=lambda b: (parse_control(b).get("Package", ""), parse_control(b).get("Version", "")))
    return "".join(b + "\n\n" for b in blocks)


def index_matches(packages_text: str, out: Path) -> bool:
    """True when Packages lists exactly the .deb files in `out`, at their sizes."""
    listed = {p.get("Filename", ""): p.get("Size", "") for p in parse_paragraphs(packages_text)}
    present = {f"./{d.name}": str(d.stat().st_size) for d in out.glob("*.deb")}
    return listed == present


def release_hash_of(release_text: str, name: str) -> str | None:
    """The SHA256 a Release file gives for one of its files."""
    sha256 = parse_control(release_text).get("SHA256", "")
    for line in sha256.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return parts[0]
    return None


def signed_by(gnupg: Path, key: str, *files: Path) -> bool:
    """True when gpg verifies the signature (InRelease, or Release.gpg + Release) as made by key."""
    result = subprocess.run(
        ["gpg", "--homedir", str(gnupg), "--batch", "--status-fd", "1", "--verify", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    )
    sigs = [line.split()[2] for line in result.stdout.splitlines() if line.startswith("[GNUPG:] VALIDSIG ")]
    return result.returncode == 0 and any(fpr.upper().endswith(key.upper()) for fpr in sigs)


def signatures_current(out: Path, gnupg: Path, key: str) -> bool:
    """Release describes the current Packages, and InRelease and Release.gpg are key's signatures of it."""
    release, inrelease, detached = out / "Release", out / "InRelease", out / "Release.gpg"
    if not all(p.is_file() for p in (release, inrelease, detached, out / "Packages", out / "Packages.gz")):
        return False
    packages_hash = hashlib.sha256((out / "Packages").read_bytes()).hexdigest()
    if release_hash_of(release.read_text(), "Packages") != packages_hash:
        return False
    return signed_by(gnupg, key, inrelease) and signed_by(gnupg, key, detached, release)


def index_and_sign(out: Path, gnupg: Path, key: str, work: Path, debs_changed: bool) -> str:
    """Writes Packages, Packages.gz, Release, InRelease and Release.gpg when
    needed; returns what it did."""
    packages_file = out / "Packages"
    old = packages_file.read_text() if packages_file.is_file() else None
    if old is not None and not debs_changed and index_matches(old, out):
        new = old
    else:
        new = sort_packages(run(["apt-ftparchive", "packages", "."], cwd=out).stdout.decode())
    if new == old and signatures_current(out, gnupg, key):
        return "index unchanged, signatures valid"

    # Write the index and its signatures next to each other, then move them in.
    stage_dir = work / "index"
    stage_dir.mkdir()
    (stage_dir / "Packages").write_text(new)
    (stage_dir / "Packages.gz").write_bytes(gzip.compress(new.encode(), compresslevel=9, mtime=0))
    options = [
        arg for name, value in RELEASE_FIELDS.items() for arg in ("-o", f"APT::FTPArchive::Release::{name}={value}")
    ]
    release = run(["apt-ftparchive", *options, "release", "."], cwd=stage_dir).stdout
    (stage_dir / "Release").write_bytes(release)
    sign = ["gpg", "--homedir", str(gnupg), "--batch", "--yes", "--local-user", key]
    run(sign + ["--clearsign", "-o", str(stage_dir / "InRelease"), str(stage_dir / "Release")])
    run(sign + ["--armor", "--detach-sign", "-o", str(stage_dir / "Release.gpg"), str(stage_dir / "Release")])
    for name in ("Packages.gz", "Packages", "Release", "Release.gpg", "InRelease"):
        os.chmod(stage_dir / name, 0o644)
        shutil.move(stage_dir / name, out / name)
    return f"index {'rebuilt' if new != old else 'unchanged'}, signed by {key}"


# --------------------------------------------------------------------------


def human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{size} B"
        size /= 1024
    return str(size)


def build_repository(args: argparse.Namespace) -> int:
    started = time.monotonic()
    versions = parse_versions(
        args.cuda_toolkit_version, args.cuda_component_version, args.cudnn_version, args.nccl_version
    )
    cache, out, gnupg = Path(args.cache).resolve(), Path(args.out).resolve(), Path(args.gnupg).resolve()
    for directory in (cache, out):
        directory.mkdir(parents=True, exist_ok=True)
    repo_url = args.mirror_url.rstrip("/") + f"/{repo_path(versions.cuda)}/"
    keyring = run(["gpg", "--homedir", str(gnupg), "--batch", "--export", args.key]).stdout
    if not keyring:
        raise BuildError(f"gpg in {gnupg} has no public key {args.key}")

    packages = repository_packages(versions, keyring, args.key, repo_url)
    changed = False
    readers: dict[Wheel, WheelReader] = {}
    with tempfile.TemporaryDirectory(prefix=".build-cuda-repo-", dir=cache) as tmp:
        work = Path(tmp)
        for package in packages:
            deb = out / package.filename
            source = f", from {package.wheel.requirement}" if package.wheel else ""
            if not args.force and is_current(package, deb):
                print(
                    f"{package.name} {package.version} {package.architecture}: unchanged,"
                    f" {human(deb.stat().st_size)}{source}",
                    flush=True,
                )
                continue
            reader = None
            if package.wheel:
                if package.wheel not in readers:
                    readers[package.wheel] = WheelReader(fetch_wheel(package.wheel, cache), package.wheel)
                reader = readers[package.wheel]
            size = build_deb(package, reader, work, out)
            changed = True
            print(
                f"{package.name} {package.version} {package.architecture}: built, {human(deb.stat().st_size)},"
                f" Installed-Size {size} KiB{source}",
                flush=True,
            )

        wanted = {p.filename for p in packages}
        for stale in sorted(out.glob("*.deb")):
            if stale.name not in wanted:
                stale.unlink()
                changed = True
                print(f"{stale.name}: removed (not part of this repository)", flush=True)

        outcome = index_and_sign(out, gnupg, args.key, work, changed)
    total = sum(d.stat().st_size for d in out.glob("*.deb"))
    print(
        f"build-cuda-repo: {len(packages)} packages, {human(total)} in {out}; {outcome};"
        f" {time.monotonic() - started:.1f} s",
        flush=True,
    )
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Build the lab's flat CUDA apt repository (NVIDIA's names and layout) from NVIDIA's PyPI wheels."
    )
    parser.add_argument("--cache", required=True, help="wheel download cache (wheels already there are reused)")
    parser.add_argument(
        "--out", required=True, help=f"the flat repository directory (served as <mirror-url>/{repo_path('<release>')}/)"
    )
    parser.add_argument("--gnupg", required=True, help="GnuPG home holding the signing key")
    parser.add_argument("--key", required=True, help="fingerprint of the signing key")
    parser.add_argument(
        "--mirror-url",
        required=True,
        help=f"the mirror's root URL as nodes reach it;"
        f" cuda-keyring's source is <mirror-url>/{repo_path('<release>')}/",
    )
    parser.add_argument("--cuda-toolkit-version", required=True, help="cuda-toolkit-X-Y package version, e.g. 12.1.1-1")
    parser.add_argument("--cuda-component-version", required=True, help="nvcc/cudart/nvrtc version, e.g. 12.1.105")
    parser.add_argument("--cudnn-version", required=True, help="libcudnn package version, e.g. 8.9.2.26-1+cuda12.1")
    parser.add_argument("--nccl-version", required=True, help="libnccl package version, e.g. 2.18.1-1+cuda12.1")
    parser.add_argument("--force", action="store_true", help="rebuild every package")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return build_repository(args)
    except BuildError as error:
        print(f"build-cuda-repo: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
