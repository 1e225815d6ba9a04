"""What roles/nvidia_driver configures on Ubuntu 20.04, Ubuntu 22.04 and Debian 12, checked against the real archives.

No host is involved: the ``driver`` fixture (conftest.py) runs the role's
validate.yml and preflight.yml for real on fake hosts (ansible-core's
executor, fake facts, the settings as inventory variables) and renders its
templates, and those of roles/apt_source for the inputs the role gives it,
in the same play. The expected values are the layouts that
Canonical, Debian and NVIDIA actually publish for the 535 branch
(535.261.03): repository URLs and keyrings, package names and version
strings. Where apt is installed (any Debian/Ubuntu controller), the rendered
files are also parsed by apt itself, isolated from the controller's own
configuration.
"""

from __future__ import annotations

import re
import subprocess
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from conftest import FAKE_FACTS, declare_driver, host_tool

VERSION = "535.261.03"
CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
CUDA_KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
# Where releases before one apt source per repository fetched a key URL's key: replaced.
PREVIOUS_KEYRING = "/etc/apt/keyrings/gpufleet-nvidia-driver.asc"


def cuda_sources_file(host: str) -> str:
    """The one source file of NVIDIA's CUDA repository for ``host`` (gpufleet_filters.apt_source_files: the URL without
    its scheme, / as _, - as --, any other character as -XX; x86_64 is x86-5f64)."""
    return f"/etc/apt/sources.list.d/gpufleet-developer.download.nvidia.com_compute_cuda_repos_{host}_x86-5f64.sources"


UBUNTU_RELEASES = {"ubuntu2004": "focal", "ubuntu2204": "jammy"}

# Every (fake host, nvidia_driver_source) combination files/compatibility.yml supports.
SCENARIOS = [
    ("ubuntu2004", "ubuntu"),
    ("ubuntu2004", "nvidia"),
    ("ubuntu2204", "ubuntu"),
    ("ubuntu2204", "nvidia"),
    ("debian12", "debian_nonfree"),
    ("debian12", "nvidia"),
]
SCENARIO_IDS = [f"{host}-{source}" for host, source in SCENARIOS]
# The same, plus each with Fabric Manager (NVSwitch found) where the source
# ships it, with the full desktop driver, and, on Canonical's archive, with
# Secure Boot's signed modules.
NVSWITCH = {"preflight": {"nvswitch_count": 4}}
SECURE_BOOT = {"preflight": {"secure_boot": "enabled", "driver_module_source": "signed"}}
FULL_DRIVER = {"nvidia_driver_headless": False}
_VARIANTS = (
    [(host, source, "", {}) for host, source in SCENARIOS]
    + [(host, source, "-nvswitch", NVSWITCH) for host, source in SCENARIOS if source != "debian_nonfree"]
    + [(host, "ubuntu", "-secureboot", SECURE_BOOT) for host in UBUNTU_RELEASES]
    + [(host, source, "-full", FULL_DRIVER) for host, source in SCENARIOS]
)
VARIANTS = [(host, source, overrides) for host, source, _label, overrides in _VARIANTS]
VARIANT_IDS = [f"{host}-{source}{label}" for host, source, label, _overrides in _VARIANTS]


def _family(host: str, source: str) -> str:
    """Which archive's package names apply: ubuntu, nvidia-ubuntu, debian_nonfree or nvidia-debian."""
    if source == "nvidia":
        return "nvidia-ubuntu" if host.startswith("ubuntu") else "nvidia-debian"
    return source


# Packages a compute (headless, signed-module or Fabric Manager) install brings
# in that carry the driver version, by their names in each archive: Canonical's
# restricted pool (-server branch), NVIDIA's CUDA repositories, Debian non-free.
_DEBIAN_COMPUTE = [
    "nvidia-kernel-dkms",
    "nvidia-kernel-support",
    "nvidia-smi",
    "libcuda1",
    "libnvidia-ml1",
    "libnvidia-cfg1",
    "libnvidia-ptxjitcompiler1",
    "libnvidia-pkcs11-openssl3",
    "nvidia-alternative",
    "nvidia-legacy-check",
    "firmware-nvidia-gsp",
]
COMPUTE_PACKAGES = {
    "ubuntu": [
        "nvidia-headless-535-server",
        "nvidia-headless-no-dkms-535-server",
        "nvidia-utils-535-server",
        "nvidia-compute-utils-535-server",
        "nvidia-dkms-535-server",
        "nvidia-kernel-common-535-server",
        "nvidia-kernel-source-535-server",
        "nvidia-firmware-535-server-535.261.03",
        "libnvidia-compute-535-server",
        "libnvidia-cfg1-535-server",
        "nvidia-fabricmanager-535",
        "libnvidia-nscq-535",
    ],
    "nvidia-ubuntu": [
        "nvidia-headless-535",
        "nvidia-headless-no-dkms-535",
        "nvidia-utils-535",
        "nvidia-compute-utils-535",
        "nvidia-dkms-535",
        "nvidia-kernel-common-535",
        "nvidia-kernel-source-535",
        "nvidia-firmware-535-535.261.03",
        "libnvidia-compute-535",
        "libnvidia-cfg1-535",
        "nvidia-fabricmanager-535",
        "libnvidia-nscq-535",
    ],
    "debian_nonfree": _DEBIAN_COMPUTE,
    "nvidia-debian": _DEBIAN_COMPUTE + ["nvidia-fabricmanager-535", "libnvidia-nscq-535"],
}
# What the full desktop driver (nvidia_driver_headless=false) adds.
_DEBIAN_DESKTOP = [
    "nvidia-driver",
    "nvidia-driver-bin",
    "nvidia-driver-libs",
    "nvidia-vdpau-driver",
    "xserver-xorg-video-nvidia",
    "libnvidia-glcore",
    "libnvidia-eglcore",
    "libglx-nvidia0",
    "libegl-nvidia0",
    "libgl1-nvidia-glvnd-glx",
    "libgles-nvidia1",
    "libgles-nvidia2",
]
DESKTOP_PACKAGES = {
    "ubuntu": [
        "nvidia-driver-535-server",
        "libnvidia-gl-535-server",
        "libnvidia-decode-535-server",
        "libnvidia-encode-535-server",
        "libnvidia-extra-535-server",
        "libnvidia-fbc1-535-server",
        "xserver-xorg-video-nvidia-535-server",
    ],
    "nvidia-ubuntu": [
        "cuda-drivers-535",
        "cuda-drivers",
        "nvidia-driver-535",
        "libnvidia-gl-535",
        "libnvidia-decode-535",
        "libnvidia-encode-535",
        "libnvidia-extra-535",
        "libnvidia-fbc1-535",
        "xserver-xorg-video-nvidia-535",
    ],
    "debian_nonfree": _DEBIAN_DESKTOP,
    "nvidia-debian": ["cuda-drivers-535", "cuda-drivers"] + _DEBIAN_DESKTOP,
}
# Packages no driver pin or blacklist may catch: kernels, build tools, other branches.
NOT_DRIVER_PACKAGES = [
    "linux-image-5.15.0-91-generic",
    "linux-headers-5.15.0-91-generic",
    "linux-image-6.1.0-18-amd64",
    "dkms",
    "libc6",
    "cuda-toolkit-12-2",
    "cuda-keyring",
]
# Packages of other branches, with their versions. Ubuntu's names carry the
# branch, so the globs must not even match them; Debian's names mostly do not
# ("nvidia-*" matches nvidia-fabricmanager-550), so there the version keeps
# the pin off them.
OTHER_BRANCH_PACKAGES = {
    "ubuntu": [
        ("nvidia-utils-550-server", "550.127.05-0ubuntu0.22.04.1"),
        ("libnvidia-compute-550-server", "550.127.05-0ubuntu0.22.04.1"),
        ("nvidia-fabricmanager-550", "550.127.05-0ubuntu0.22.04.1"),
        ("nvidia-utils-535", "535.261.03-0ubuntu1"),  # NVIDIA's name, in Canonical's pin
    ],
    "nvidia-ubuntu": [
        ("nvidia-utils-550", "550.127.05-0ubuntu1"),
        ("libnvidia-compute-550", "550.127.05-0ubuntu1"),
        ("nvidia-fabricmanager-550", "550.127.05-1"),
        ("cuda-drivers-550", "550.127.05-1"),
    ],
    "debian_nonfree": [("nvidia-tesla-470-driver", "470.256.02-1~deb12u1")],
    "nvidia-debian": [
        ("nvidia-fabricmanager-550", "550.127.05-1"),
        ("libnvidia-nscq-550", "550.127.05-1"),
        ("cuda-drivers-550", "550.127.05-1"),
    ],
}
BRANCH_IN_NAMES = {"ubuntu", "nvidia-ubuntu"}
# Version strings 535.261.03 has in each archive, and ones it must not be mistaken for.
PINNED_VERSIONS = {
    "ubuntu": ["535.261.03-0ubuntu0.22.04.1", "535.261.03-0ubuntu0.20.04.1"],
    "nvidia-ubuntu": ["535.261.03-0ubuntu1", "535.261.03-1"],
    "debian_nonfree": ["535.261.03-1", "535.261.03-1~deb12u1"],
    "nvidia-debian": ["535.261.03-1"],
}
# /etc/apt/sources.list as the Debian 12 installer writes it.
DEBIAN_INSTALLER_SOURCES_LIST = (
    "deb http://deb.debian.org/debian/ bookworm main non-free-firmware\n"
    "deb http://security.debian.org/debian-security bookworm-security main non-free-firmware\n"
    "deb http://deb.debian.org/debian/ bookworm-updates main non-free-firmware\n"
)
OTHER_VERSIONS = ["535.274.02-0ubuntu0.22.04.1", "535.247.01-1~deb12u1", "550.127.05-0ubuntu0.22.04.1", "535.261.031-1"]


# --------------------------------------------------------------------------- apt itself


def _isolated_apt_options(
    tmp_path: Path, sources_dir: Path | None = None, sources_list: Path | None = None, preferences: Path | None = None
) -> list[str]:
    """apt -o options that read only the given files: no system sources, lists, status, cache or preferences."""
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    options = {
        "Dir::Etc::SourceList": str(sources_list or "/dev/null"),
        "Dir::Etc::SourceParts": str(sources_dir or empty),
        "Dir::Etc::Preferences": str(preferences or "/dev/null"),
        "Dir::Etc::PreferencesParts": str(empty),
        "Dir::State::Lists": str(empty),
        "Dir::State::status": "/dev/null",
        "Dir::Cache::pkgcache": "",
        "Dir::Cache::srcpkgcache": "",
    }
    return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]


def apt_index_urls(tmp_path: Path, sources: dict[str, str], sources_list: str = "") -> list[str]:
    """The Packages index URLs apt derives from sources.list.d files ({file name: text}) and a sources.list."""
    sources_dir = tmp_path / "sources.list.d"
    sources_dir.mkdir()
    for name, text in sources.items():
        (sources_dir / name).write_text(text)
    (tmp_path / "sources.list").write_text(sources_list)
    result = subprocess.run(
        [
            host_tool("apt-get"),
            "indextargets",
            "--no-release-info",
            "--format",
            "$(URI)",
            *_isolated_apt_options(tmp_path, sources_dir=sources_dir, sources_list=tmp_path / "sources.list"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"apt rejects the sources: {result.stderr}"
    return sorted(line for line in result.stdout.splitlines() if line.endswith("/Packages"))


# --------------------------------------------------------------------------- helpers


def parse_deb822(text: str) -> list[dict[str, str]]:
    """Parse deb822 stanzas (apt .sources, apt preferences): comments dropped, one dict per stanza."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last_key = None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last_key = {}, None
            continue
        if line[0] in " \t":
            assert last_key is not None, f"continuation line without a field: {line!r}"
            current[last_key] += "\n" + line.strip()
            continue
        key, sep, value = line.partition(":")
        assert sep, f"not a deb822 field: {line!r}"
        assert key not in current, f"field {key} repeated in one stanza"
        current[key] = value.strip()
        last_key = key
    if current:
        stanzas.append(current)
    return stanzas


def driver_inputs(cfg, entry_point: str = "main") -> dict:
    """What the role gives roles/apt_source's entry point (repository.yml's include of main, preflight.yml's of the
    trial), templated on the host."""
    return cfg[f"{entry_point}_inputs"]


def source_text(cfg) -> str:
    """The driver's source as roles/apt_source writes it for the inputs repository.yml gives."""
    return cfg["main_source"]


def pin_text(cfg) -> str:
    """The driver's pin as roles/apt_source writes it (with the build of apt_source_trial, when the case gives one)."""
    (pin,) = cfg["main_pins"]
    assert pin["name"] == "nvidia-driver"
    return pin["text"]


def trial_found(build: str) -> dict:
    """apt_source_trial as the driver's trial publishes it when the repository builds the release as ``build``."""
    return {"apt_source_trial": {"name": "nvidia-driver", "build": build}}


def sources_stanza(cfg) -> dict[str, str]:
    """The one deb822 stanza of the driver's rendered source."""
    stanzas = parse_deb822(source_text(cfg))
    assert len(stanzas) == 1
    return stanzas[0]


def version_stanzas(text: str) -> list[dict[str, str]]:
    """The records of a rendered pin that pin versions (those after the other origins' priority -1 records)."""
    stanzas = parse_deb822(text)
    never = [s for s in stanzas if s["Pin-Priority"] == "-1"]
    assert stanzas[: len(never)] == never, "the other origins' records come first (apt: the first match wins)"
    return stanzas[len(never) :]


def pin_stanza(cfg) -> dict[str, str]:
    """The one version stanza of the driver's rendered pin (no trial ran: no build known, the version pattern alone)."""
    assert driver_inputs(cfg)["apt_source_pins"][0]["build"] == ""
    stanzas = version_stanzas(pin_text(cfg))
    assert len(stanzas) == 1
    return stanzas[0]


def blacklist_entries(text: str) -> list[str]:
    """The entries of a rendered unattended-upgrades.j2, checking it is exactly one apt.conf list.

    apt.conf syntax: ``Name { "value"; "value"; };`` with ``//`` comments.
    """
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")).strip()
    match = re.fullmatch(r'Unattended-Upgrade::Package-Blacklist\s*\{(?P<items>(?:\s*"[^"\\]*";)*)\s*\};', body)
    assert match, f"not a single apt.conf list:\n{text}"
    return re.findall(r'"([^"\\]*)";', match["items"])


def blacklisted(package: str, entries: list[str]) -> bool:
    """unattended-upgrades' test: re.match (anchored at the start only) of any entry."""
    return any(re.match(entry, package) for entry in entries)


def pinned(package: str, patterns: list[str]) -> bool:
    """apt's test for a preferences Package: field of globs (fnmatch)."""
    return any(fnmatchcase(package, pattern) for pattern in patterns)


# --------------------------------------------------------------------------- validation and defaults


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_supported_combination_passes_validation(driver, host, source):
    """Every OS/source pair compatibility.yml lists passes validate.yml and resolves to the branch's default release."""
    cfg = driver(host, source)
    assert cfg.failure is None
    assert cfg["__nvidia_driver_invalid"] == []
    assert cfg["__nvidia_driver_source"] == source
    assert cfg["__nvidia_driver_version"] == VERSION


@pytest.mark.parametrize(
    ("host", "expected"), [("ubuntu2004", "nvidia"), ("ubuntu2204", "nvidia"), ("debian12", "debian_nonfree")]
)
def test_default_source_keeps_every_build(driver, host, expected):
    """With nvidia_driver_source empty, Ubuntu uses NVIDIA's CUDA repository, which keeps every build of every branch
    (Canonical keeps only the newest build in a pocket: jammy-updates offers only 535.309.01-0ubuntu0.22.04.2 of
    nvidia-utils-535-server, issue 14 finding 1), and Debian its non-free component."""
    cfg = driver(host)
    assert cfg.failure is None
    assert cfg["__nvidia_driver_source"] == expected


def test_source_of_another_os_is_rejected_before_any_change(driver):
    """nvidia_driver_source=ubuntu on Debian stops in validate.yml with a message that names the valid sources."""
    cfg = driver("debian12", "ubuntu")
    assert cfg.failure is not None
    assert "nothing has been changed" in cfg.failed_task
    assert (
        "nvidia_driver_source 'ubuntu' does not exist on Debian (choose one of debian_nonfree, nvidia)" in cfg.failure
    )


def test_version_of_another_branch_is_rejected(driver):
    """nvidia_driver_version must be a release of nvidia_driver_branch."""
    cfg = driver("ubuntu2204", "ubuntu", nvidia_driver_version="550.127.05")
    assert cfg.failure is not None
    assert "nvidia_driver_version '550.127.05' is not a release of branch 535" in cfg.failure


def test_explicit_version_is_used(driver):
    """An explicit nvidia_driver_version replaces the compatibility matrix's default everywhere, the pin included."""
    cfg = driver("ubuntu2204", "ubuntu", nvidia_driver_version="535.247.01")
    assert cfg.failure is None
    assert pin_stanza(cfg)["Pin"] == "version 535.247.01-*"


# --------------------------------------------------------------------------- NVIDIA's CUDA repository


@pytest.mark.parametrize("host", ["ubuntu2004", "ubuntu2204", "debian12"])
def test_nvidia_repository_layout(driver, host):
    """Source nvidia uses NVIDIA's flat per-OS repository, signed by cuda-keyring's keyring, fetched from that
    repository."""
    cfg = driver(host, "nvidia")
    url = f"{CUDA_REPOS}/{host}/x86_64"
    assert cfg["__nvidia_driver_repo_url"] == url
    assert cfg["__nvidia_driver_repo_suites"] == ["/"]
    assert cfg["__nvidia_driver_repo_components"] == []
    assert cfg["__nvidia_driver_keyring"] == CUDA_KEYRING == cfg["__nvidia_driver_cuda_keyring"]
    assert cfg["__nvidia_driver_cuda_keyring_deb"] == "cuda-keyring_1.1-1_all.deb"
    assert cfg["__nvidia_driver_repo_managed"] is True
    # What repository.yml has apt_source download and which of cuda-keyring's files it replaces.
    inputs = driver_inputs(cfg)
    repository = inputs["apt_source_repository"]
    assert repository["keyring_deb_url"] == f"{url}/cuda-keyring_1.1-1_all.deb"
    # cuda-keyring's own list, and where earlier releases fetched a key URL's key (now the repository's keyring file).
    assert inputs["apt_source_replaces"] == [f"/etc/apt/sources.list.d/cuda-{host}-x86_64.list", PREVIOUS_KEYRING]
    assert repository["key_url"] == "" and repository["keyring"] == CUDA_KEYRING
    # One source per repository, named after it: the file the cuda role writes for the same URL.
    assert cfg["main_sources_file"] == cuda_sources_file(host)


@pytest.mark.parametrize("host", ["ubuntu2004", "ubuntu2204", "debian12"])
def test_nvidia_sources_file_is_a_flat_repository(driver, host):
    """The rendered .sources names NVIDIA's repository as a flat one: URI with a trailing slash, Suites "/", no
    Components."""
    cfg = driver(host, "nvidia")
    text = source_text(cfg)
    assert f"\nURIs: {CUDA_REPOS}/{host}/x86_64/\n" in text
    assert "\nSuites: /\n" in text
    assert "Components" not in text
    assert f"\nSigned-By: {CUDA_KEYRING}\n" in text
    assert sources_stanza(cfg) == {
        "Types": "deb",
        "URIs": f"{CUDA_REPOS}/{host}/x86_64/",
        "Suites": "/",
        "Architectures": "amd64",
        "Signed-By": CUDA_KEYRING,
    }


@pytest.mark.parametrize("host", ["ubuntu2004", "ubuntu2204", "debian12"])
def test_nvidia_sources_file_reads_as_the_real_index_url(driver, host, tmp_path):
    """apt derives from the rendered file the one index NVIDIA really publishes, e.g. .../ubuntu2204/x86_64/Packages."""
    cfg = driver(host, "nvidia")
    urls = apt_index_urls(tmp_path, {Path(cfg["main_sources_file"]).name: source_text(cfg)})
    assert urls == [f"{CUDA_REPOS}/{host}/x86_64/Packages"]


@pytest.mark.parametrize("host", list(UBUNTU_RELEASES))
def test_nvidia_packages_on_ubuntu(driver, host):
    """NVIDIA's repository names the 535 packages without -server; full driver is cuda-drivers-535; Fabric Manager on
    NVSwitch."""
    assert driver(host, "nvidia")["__nvidia_driver_packages"] == ["nvidia-headless-535", "nvidia-utils-535"]
    assert driver(host, "nvidia", nvidia_driver_headless=False)["__nvidia_driver_packages"] == ["cuda-drivers-535"]
    assert driver(host, "nvidia", **NVSWITCH)["__nvidia_driver_packages"] == [
        "nvidia-headless-535",
        "nvidia-utils-535",
        "nvidia-fabricmanager-535",
        "libnvidia-nscq-535",
    ]
    cfg = driver(host, "nvidia")
    assert cfg["__nvidia_driver_version_package"] == "nvidia-utils-535"
    assert cfg["__nvidia_driver_dkms_module"] == "nvidia"


# --------------------------------------------------------------------------- Canonical's archive


@pytest.mark.parametrize(("host", "release"), list(UBUNTU_RELEASES.items()))
def test_canonical_repository_layout(driver, host, release):
    """Source ubuntu is archive.ubuntu.com's restricted component in the release, -updates and -security pockets."""
    cfg = driver(host, "ubuntu")
    assert cfg["__nvidia_driver_repo_url"] == "http://archive.ubuntu.com/ubuntu"
    assert cfg["__nvidia_driver_repo_suites"] == [release, f"{release}-updates", f"{release}-security"]
    assert cfg["__nvidia_driver_repo_components"] == ["restricted"]
    assert cfg["__nvidia_driver_keyring"] == "/usr/share/keyrings/ubuntu-archive-keyring.gpg"
    # A standard Ubuntu host has the archive already: no second source for it.
    assert cfg["__nvidia_driver_repo_managed"] is False


@pytest.mark.parametrize("host", list(UBUNTU_RELEASES))
def test_canonical_packages(driver, host):
    """Canonical's -server packages: headless + utils, or nvidia-driver-535-server; the DKMS module is 'nvidia'."""
    cfg = driver(host, "ubuntu")
    assert cfg["__nvidia_driver_packages"] == ["nvidia-headless-535-server", "nvidia-utils-535-server"]
    assert cfg["__nvidia_driver_support_packages"] == [
        "dkms",
        f"linux-headers-{FAKE_FACTS[host]['kernel']}",
        "initramfs-tools",
        "kmod",
    ]
    assert cfg["__nvidia_driver_version_package"] == "nvidia-utils-535-server"
    assert cfg["__nvidia_driver_dkms_module"] == "nvidia"
    assert driver(host, "ubuntu", nvidia_driver_headless=False)["__nvidia_driver_packages"] == [
        "nvidia-driver-535-server"
    ]


@pytest.mark.parametrize("host", list(UBUNTU_RELEASES))
def test_canonical_signed_modules_for_the_target_kernel(driver, host):
    """Under Secure Boot: Canonical's signed modules for the kernel preflight checked (5.15.0-91-generic, HWE on
    focal), no DKMS."""
    cfg = driver(host, "ubuntu", preflight={**SECURE_BOOT["preflight"], "kernel_release": "5.15.0-91-generic"})
    assert cfg["nvidia_driver_module_source"] == "signed"
    assert cfg["nvidia_driver_kernel_release"] == "5.15.0-91-generic"
    packages = cfg["__nvidia_driver_packages"]
    assert "linux-modules-nvidia-535-server-5.15.0-91-generic" in packages
    assert "nvidia-headless-no-dkms-535-server" in packages
    assert "nvidia-utils-535-server" in packages
    assert not any("dkms" == p or p.startswith("linux-headers-") for p in cfg["__nvidia_driver_support_packages"])
    assert cfg.failure is None  # the rules' "Secure Boot calls for signed prebuilt modules" did not stop it


@pytest.mark.parametrize(
    ("nvswitch_count", "expected"), [(None, False), (0, False), ("0", False), (4, True), ("6", True)]
)
def test_fabricmanager_follows_the_nvswitch_count(driver, nvswitch_count, expected):
    """nvidia_driver_fabricmanager's default turns Fabric Manager on exactly when preflight counted NVSwitches.

    None: preflight_report is absent (the role's fallback is no Fabric Manager).
    """
    preflight = None if nvswitch_count is None else {"nvswitch_count": nvswitch_count}
    cfg = driver("ubuntu2204", "ubuntu", preflight=preflight)
    assert cfg["nvidia_driver_fabricmanager"] is expected
    fabric = ["nvidia-fabricmanager-535", "libnvidia-nscq-535"]
    assert (cfg["__nvidia_driver_packages"][-2:] == fabric) is expected
    assert cfg.failure is None  # the rules' "NVSwitch(es) need nvidia-fabricmanager" did not stop it


def test_canonical_mirror_gets_a_managed_source(driver):
    """An internal mirror of Canonical's archive is written as a source (trailing slash dropped), with the usual
    keyring."""
    cfg = driver("ubuntu2204", "ubuntu", nvidia_driver_repository_url="http://mirror.example.com/ubuntu/")
    assert cfg.failure is None
    assert cfg["__nvidia_driver_repo_managed"] is True
    assert sources_stanza(cfg) == {
        "Types": "deb",
        "URIs": "http://mirror.example.com/ubuntu",
        "Suites": "jammy jammy-updates jammy-security",
        "Components": "restricted",
        "Architectures": "amd64",
        "Signed-By": "/usr/share/keyrings/ubuntu-archive-keyring.gpg",
    }


@pytest.mark.parametrize(
    ("overrides", "keyring"),
    [
        (
            {"nvidia_driver_repository_key_url": "https://mirror.example.com/gpg.asc"},
            "/etc/apt/keyrings/gpufleet-mirror.example.com_debian.asc",
        ),
        (
            {"nvidia_driver_repository_keyring": "/usr/share/keyrings/corp-archive-keyring.gpg"},
            "/usr/share/keyrings/corp-archive-keyring.gpg",
        ),
    ],
    ids=["key-url", "baked-keyring"],
)
def test_mirror_key_settings_choose_signed_by(driver, overrides, keyring):
    """A mirror key URL is fetched into /etc/apt/keyrings, to the mirror repository's keyring file (one per repository,
    whichever role fetches it); a keyring already on the host is used as it is."""
    cfg = driver(
        "debian12", "debian_nonfree", nvidia_driver_repository_url="https://mirror.example.com/debian", **overrides
    )
    assert cfg.failure is None
    assert sources_stanza(cfg)["Signed-By"] == keyring


def test_mirror_key_without_mirror_url_is_rejected(driver):
    """A key URL for the public repository makes no sense and stops validation."""
    cfg = driver("ubuntu2204", "ubuntu", nvidia_driver_repository_key_url="https://mirror.example.com/gpg.asc")
    assert cfg.failure is not None
    assert "nvidia_driver_repository_key_url is set but nvidia_driver_repository_url is empty" in cfg.failure


def test_canonical_mirror_reads_as_the_real_index_urls(driver, tmp_path):
    """apt derives restricted/binary-amd64 indexes of all three pockets from the rendered mirror source."""
    cfg = driver("ubuntu2204", "ubuntu", nvidia_driver_repository_url="http://mirror.example.com/ubuntu/")
    urls = apt_index_urls(tmp_path, {Path(cfg["main_sources_file"]).name: source_text(cfg)})
    assert [u for u in urls if "binary-amd64" in u] == sorted(
        f"http://mirror.example.com/ubuntu/dists/{suite}/restricted/binary-amd64/Packages"
        for suite in ("jammy", "jammy-updates", "jammy-security")
    )


# --------------------------------------------------------------------------- Debian


def test_debian_nonfree_layout(driver):
    """Debian 12: deb.debian.org's contrib, non-free and non-free-firmware; Debian's package names; DKMS module
    nvidia-current."""
    cfg = driver("debian12", "debian_nonfree")
    assert cfg["__nvidia_driver_repo_url"] == "http://deb.debian.org/debian"
    assert cfg["__nvidia_driver_repo_suites"] == ["bookworm", "bookworm-updates"]
    assert cfg["__nvidia_driver_repo_components"] == ["contrib", "non-free", "non-free-firmware"]
    assert cfg["__nvidia_driver_keyring"] == "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert cfg["__nvidia_driver_repo_managed"] is True
    assert cfg["__nvidia_driver_packages"] == ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-persistenced"]
    assert cfg["__nvidia_driver_version_package"] == "nvidia-smi"
    assert cfg["__nvidia_driver_dkms_module"] == "nvidia-current"
    assert sources_stanza(cfg) == {
        "Types": "deb",
        "URIs": "http://deb.debian.org/debian",
        "Suites": "bookworm bookworm-updates",
        "Components": "contrib non-free non-free-firmware",
        "Architectures": "amd64",
        "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg",
    }


def test_dkms_targets_the_kernel_preflight_checked(driver):
    """Headers and the DKMS build follow preflight_report.kernel_release (the lab's mirrored kernel), not the running
    one."""
    cfg = driver("debian12", "debian_nonfree", preflight={"kernel_release": "6.1.0-50-amd64"})
    assert cfg["nvidia_driver_kernel_release"] == "6.1.0-50-amd64"
    assert "linux-headers-6.1.0-50-amd64" in cfg["__nvidia_driver_support_packages"]


def test_debian_nvidia_source(driver):
    """Debian 12 from NVIDIA's repository: Debian-style names, module nvidia-current, Fabric Manager available."""
    cfg = driver("debian12", "nvidia", **NVSWITCH)
    assert cfg["__nvidia_driver_dkms_module"] == "nvidia-current"
    assert cfg["__nvidia_driver_packages"][-2:] == ["nvidia-fabricmanager-535", "libnvidia-nscq-535"]
    assert cfg.failure is None  # the rules' "NVSwitch(es) need nvidia-fabricmanager" did not stop it


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (NVSWITCH, "4 NVSwitch(es) need nvidia-fabricmanager-535, which source 'debian_nonfree' does not ship"),
        (
            SECURE_BOOT,
            "Secure Boot calls for signed prebuilt modules (nvidia_driver_module_source=signed) but Debian source "
            "'debian_nonfree' has none",
        ),
    ],
    ids=["nvswitch", "secure-boot"],
)
def test_debian_nonfree_stops_where_debian_ships_nothing(driver, overrides, message):
    """Debian packages neither Fabric Manager nor signed modules: the rules refuse the source rather than install
    half a driver (in play 1's run-once judgement, before any host is probed)."""
    cfg = driver("debian12", "debian_nonfree", **overrides)
    assert cfg.failed_task == "Stop on wrong driver settings (nothing has been changed)"
    assert cfg.failure.startswith(f"nvidia_driver settings rejected on {cfg.host}: [1] ") and message in cfg.failure


# --------------------------------------------------------------------------- apt preferences (the pin)


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_pin_file(driver, host, source):
    """One preferences record: the source's package globs, 'Pin: version 535.261.03-*', priority 1001 (above 1000: also
    downgrades)."""
    cfg = driver(host, source)
    stanza = pin_stanza(cfg)
    assert stanza["Pin"] == f"version {VERSION}-*"
    assert stanza["Pin-Priority"] == "1001"
    assert stanza["Package"].split() == cfg["__nvidia_driver_pin_patterns"]
    assert stanza["Explanation"]


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_apt_accepts_the_pin_file(driver, host, source, tmp_path):
    """apt's own preferences parser reads the rendered file without error."""
    cfg = driver(host, source, **trial_found(PINNED_VERSIONS[_family(host, source)][0]))
    pref = tmp_path / "gpufleet-nvidia-driver.pref"
    pref.write_text(pin_text(cfg))
    result = subprocess.run(
        [host_tool("apt-cache"), "policy", *_isolated_apt_options(tmp_path, preferences=pref)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and "E:" not in result.stderr, result.stderr


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_pin_covers_every_compute_package(driver, host, source):
    """Every package of a compute install that carries the driver version matches one of the pin's globs."""
    patterns = pin_stanza(driver(host, source))["Package"].split()
    missing = [p for p in COMPUTE_PACKAGES[_family(host, source)] if not pinned(p, patterns)]
    assert missing == []


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_pin_leaves_other_packages_alone(driver, host, source):
    """The pin applies to no kernel, build tool or package of another driver branch."""
    stanza = pin_stanza(driver(host, source))
    patterns, pin_version = stanza["Package"].split(), stanza["Pin"].removeprefix("version ")
    family = _family(host, source)
    assert [p for p in NOT_DRIVER_PACKAGES if pinned(p, patterns)] == []
    others = OTHER_BRANCH_PACKAGES[family]
    assert [p for p, v in others if pinned(p, patterns) and fnmatchcase(v, pin_version)] == []
    if family in BRANCH_IN_NAMES:
        assert [p for p, _version in others if pinned(p, patterns)] == []


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_pin_version_matches_the_release_only(driver, host, source):
    """'535.261.03-*' matches the archive's version strings of 535.261.03 and no other release."""
    pin_version = pin_stanza(driver(host, source))["Pin"].removeprefix("version ")
    for version in PINNED_VERSIONS[_family(host, source)]:
        assert fnmatchcase(version, pin_version), version
    for version in OTHER_VERSIONS:
        assert not fnmatchcase(version, pin_version), version


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_pin_with_the_repositorys_build_puts_it_first(driver, host, source):
    """Once the trial found the repository's own version string for the release, it is the 1001 record; any other
    origin's build of 535.261.03 (the pattern) comes second, at 1000."""
    build = PINNED_VERSIONS[_family(host, source)][0]
    first, second = version_stanzas(pin_text(driver(host, source, **trial_found(build))))
    assert (first["Pin"], first["Pin-Priority"]) == (f"version {build}", "1001")
    assert (second["Pin"], second["Pin-Priority"]) == (f"version {VERSION}-*", "1000")
    assert first["Package"] == second["Package"]


def test_the_pin_takes_the_build_the_trial_found(driver):
    """repository.yml passes apt_source_trial.build of the driver's own trial, and nothing of another source's trial."""
    cfg = driver("debian12", "debian_nonfree", **trial_found(f"{VERSION}-1~deb12u1"))
    (pin,) = driver_inputs(cfg)["apt_source_pins"]
    assert pin == {
        "name": "nvidia-driver",
        "packages": cfg["__nvidia_driver_pin_patterns"],
        "version": f"{VERSION}-*",
        "build": f"{VERSION}-1~deb12u1",
        "competitors": ["release l=NVIDIA CUDA"],
        "present": True,
    }
    other = driver("debian12", "debian_nonfree", apt_source_trial={"name": "cuda", "build": f"{VERSION}-1~deb12u1"})
    (pin,) = driver_inputs(other)["apt_source_pins"]
    assert pin["build"] == ""


@pytest.mark.parametrize(
    ("host", "source", "overrides"),
    [(h, s, o) for h, s in SCENARIOS for o in ({}, {"nvidia_driver_repository_url": "http://mirror.example.com/repo"})],
    ids=[f"{h}-{s}-{label}" for h, s in SCENARIOS for label in ("public", "mirror")],
)
def test_the_trial_tries_the_source_repository_yml_writes(driver, host, source, overrides):
    """preflight.yml's trial and repository.yml's configuration pass the one source, __nvidia_driver_apt_source
    (conftest's capture, role_run.apt_source_capture, refuses includes that give them an input differently); the trial
    asks for the driver version in the version package, naming nvidia_driver_version."""
    cfg = driver(host, source, **overrides)
    trial = driver_inputs(cfg, "trial")
    repository = trial["apt_source_repository"]
    assert trial["apt_source_package"] == cfg["__nvidia_driver_version_package"]
    assert (trial["apt_source_version"], trial["apt_source_version_name"]) == (VERSION, "nvidia_driver_version")
    assert repository["description"] == "the driver repository"  # "apt rejects the driver repository <URL>"
    assert trial["apt_source_url_name"] == (
        "nvidia_driver_repository_url" if overrides else f"the public default for source {source}"
    )
    assert repository["managed"] is cfg["__nvidia_driver_repo_managed"]


# --------------------------------------------------------------------------- versioned packages (hold, upgrade)


@pytest.mark.parametrize(("host", "source", "overrides"), VARIANTS, ids=VARIANT_IDS)
def test_versioned_packages_are_the_pinned_driver_packages(driver, host, source, overrides):
    """preflight.yml's regex (built from the pin globs) selects exactly the installed packages the pin matches.

    These are the packages held with dpkg and moved to the pinned release, so
    the selection must agree with apt's glob semantics and include every
    installed package that carries the driver version.
    """
    cfg = driver(host, source, **overrides)
    packages = cfg["__nvidia_driver_packages"]
    selected = cfg["__nvidia_driver_versioned_packages"]
    # Secure Boot's flavour metapackage (linux-modules-nvidia-535-server-generic) carries the kernel's version.
    flavours = (
        cfg["__nvidia_driver_signed_flavour_packages"] if "__nvidia_driver_signed_flavour_packages" in cfg else []
    )
    assert selected == [p for p in packages if pinned(p, cfg["__nvidia_driver_pin_patterns"]) and p not in flavours]
    carrying = COMPUTE_PACKAGES[_family(host, source)] + DESKTOP_PACKAGES[_family(host, source)]
    assert [p for p in packages if p in carrying and p not in selected] == []
    assert cfg["__nvidia_driver_version_package"] in selected or cfg["__nvidia_driver_version_package"] not in packages


def test_versioned_packages_canonical_example(driver):
    """The concrete list on an HGX host with Ubuntu 22.04: driver, utils and Fabric Manager, nothing else."""
    cfg = driver("ubuntu2204", "ubuntu", **NVSWITCH)
    assert cfg["__nvidia_driver_versioned_packages"] == [
        "nvidia-headless-535-server",
        "nvidia-utils-535-server",
        "nvidia-fabricmanager-535",
        "libnvidia-nscq-535",
    ]


# --------------------------------------------------------------------------- unattended-upgrades


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_unattended_upgrades_blacklist_is_an_apt_conf_list(driver, host, source):
    """The rendered file is one apt.conf list whose entries are the source's blacklist, each a valid regex."""
    cfg = driver(host, source)
    entries = blacklist_entries(cfg["unattended-upgrades.j2"])
    assert entries == cfg["__nvidia_driver_upgrade_blacklist"]
    for entry in entries:
        re.compile(entry)


@pytest.mark.parametrize(("host", "source"), SCENARIOS, ids=SCENARIO_IDS)
def test_apt_reads_the_unattended_upgrades_blacklist(driver, host, source, tmp_path):
    """apt-config, reading only the rendered file, finds exactly the same list entries."""
    cfg = driver(host, source)
    text = cfg["unattended-upgrades.j2"]
    conf = tmp_path / "51gpufleet"
    conf.write_text(text)
    isolate = tmp_path / "isolate.conf"
    (tmp_path / "empty").mkdir()
    isolate.write_text(f'Dir::Etc::Parts "{tmp_path / "empty"}";\nDir::Etc::Main "/dev/null";\n')
    result = subprocess.run(
        [host_tool("apt-config"), "-c", str(conf), "dump", "Unattended-Upgrade::Package-Blacklist"],
        capture_output=True,
        text=True,
        check=True,
        env={"APT_CONFIG": str(isolate)},
    )
    assert re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', result.stdout, re.M) == blacklist_entries(
        text
    )


@pytest.mark.parametrize(("host", "source", "overrides"), VARIANTS, ids=VARIANT_IDS)
def test_unattended_upgrades_blacklist_covers_the_driver(driver, host, source, overrides):
    """Every installed driver package and every compute package it brings in is blacklisted, and nothing unrelated."""
    cfg = driver(host, source, **overrides)
    entries = blacklist_entries(cfg["unattended-upgrades.j2"])
    family = _family(host, source)
    # Not Secure Boot's flavour metapackage, which must move with the kernel (test_driver_origin.py).
    flavours = (
        cfg["__nvidia_driver_signed_flavour_packages"] if "__nvidia_driver_signed_flavour_packages" in cfg else []
    )
    packages = [p for p in cfg["__nvidia_driver_packages"] if p not in flavours]
    assert [p for p in packages + COMPUTE_PACKAGES[family] if not blacklisted(p, entries)] == []
    assert [p for p in NOT_DRIVER_PACKAGES if blacklisted(p, entries)] == []


# --------------------------------------------------------------------------- sources: always signed


MIRROR = {"nvidia_driver_repository_url": "http://mirror.example.com/repo"}
MIRROR_WITH_KEY = {
    "nvidia_driver_repository_url": "https://mirror.example.com/repo",
    "nvidia_driver_repository_key_url": "https://mirror.example.com/key.asc",
}


@pytest.mark.parametrize(
    ("host", "source", "overrides"),
    [(h, s, o) for h, s in SCENARIOS for o in ({}, MIRROR, MIRROR_WITH_KEY)],
    ids=[f"{h}-{s}-{label}" for h, s in SCENARIOS for label in ("public", "mirror", "mirror-key")],
)
def test_sources_are_never_trusted_blindly(driver, host, source, overrides):
    """No rendered source disables signature checks (trusted=yes); each names an absolute Signed-By keyring."""
    text = source_text(driver(host, source, **overrides))
    assert "trusted" not in text.lower()
    assert "allow-insecure" not in text.lower()
    signed_by = parse_deb822(text)[0]["Signed-By"]
    assert signed_by.startswith("/") and signed_by.endswith((".gpg", ".asc"))


# --------------------------------------------------------------------------- known problems in the role


def test_headless_false_from_the_command_line_installs_the_full_driver(driver):
    """``ansible-playbook -e nvidia_driver_headless=false`` passes the string "false"; the role must read it as false.

    The argument spec accepts the string (it converts for validation only),
    and nvidia_driver_fabricmanager is read with ``| bool`` for this reason.
    """
    assert driver("ubuntu2204", "ubuntu", nvidia_driver_headless="false")["__nvidia_driver_packages"] == [
        "nvidia-driver-535-server"
    ]


def test_debian_source_beside_the_installer_sources_list(driver, tmp_path):
    """On a stock Debian 12 host (the installer's sources.list, no signed-by) apt still reads every source.

    apt only warns that non-free-firmware is now configured twice.
    """
    cfg = driver("debian12", "debian_nonfree")
    urls = apt_index_urls(
        tmp_path, {Path(cfg["main_sources_file"]).name: source_text(cfg)}, sources_list=DEBIAN_INSTALLER_SOURCES_LIST
    )
    assert "http://deb.debian.org/debian/dists/bookworm/non-free/binary-amd64/Packages" in urls


# --------------------------------------------------------------------------- the cases, known up front: one run


def _declare_cases() -> None:
    for host, source, overrides in VARIANTS:
        declare_driver(host, source, **overrides)
    for host, source in SCENARIOS:
        declare_driver(host, source, **trial_found(PINNED_VERSIONS[_family(host, source)][0]))
        for overrides in (MIRROR, MIRROR_WITH_KEY):
            declare_driver(host, source, **overrides)
    for host in ("ubuntu2004", "ubuntu2204", "debian12"):
        declare_driver(host)
    for host in UBUNTU_RELEASES:
        declare_driver(host, "ubuntu", preflight={**SECURE_BOOT["preflight"], "kernel_release": "5.15.0-91-generic"})
    for count in (0, "0", "6"):
        declare_driver("ubuntu2204", "ubuntu", preflight={"nvswitch_count": count})
    declare_driver("debian12", "ubuntu")
    for version in ("550.127.05", "535.247.01"):
        declare_driver("ubuntu2204", "ubuntu", nvidia_driver_version=version)
    declare_driver("ubuntu2204", "ubuntu", nvidia_driver_repository_url="http://mirror.example.com/ubuntu/")
    for overrides in (
        {"nvidia_driver_repository_key_url": "https://mirror.example.com/gpg.asc"},
        {"nvidia_driver_repository_keyring": "/usr/share/keyrings/corp-archive-keyring.gpg"},
    ):
        declare_driver(
            "debian12", "debian_nonfree", nvidia_driver_repository_url="https://mirror.example.com/debian", **overrides
        )
    declare_driver("ubuntu2204", "ubuntu", nvidia_driver_repository_key_url="https://mirror.example.com/gpg.asc")
    declare_driver("debian12", "debian_nonfree", preflight={"kernel_release": "6.1.0-50-amd64"})
    declare_driver("debian12", "debian_nonfree", **NVSWITCH)
    declare_driver("debian12", "debian_nonfree", **SECURE_BOOT)
    declare_driver("debian12", "debian_nonfree", **trial_found(f"{VERSION}-1~deb12u1"))
    declare_driver("debian12", "debian_nonfree", apt_source_trial={"name": "cuda", "build": f"{VERSION}-1~deb12u1"})
    declare_driver("ubuntu2204", "ubuntu", nvidia_driver_headless="false")


_declare_cases()
