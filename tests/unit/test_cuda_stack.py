"""The CUDA rows of files/compatibility.yml and what roles/cuda renders from
them, checked without a host: versions belong together, NVIDIA's repository
URLs follow its real layout, and the role's driver check refuses an
impossible stack.

The role runs for real (tests/unit/role_run.py): its read-only entry point
``probe`` (validate.yml, then source.yml's pins with the trial only; the
trial's include of roles/apt_source, which runs apt on the host, is skipped)
on fake hosts, then, in the same play, what source.yml gives apt_source and
the source and pins apt_source renders from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import role_run
import yaml
from conftest import CUDA, CUDA_FACTS, cuda_config

REPO_ROOT = Path(__file__).resolve().parents[2]
MATRIX = yaml.safe_load((REPO_ROOT / "files" / "compatibility.yml").read_text())
CUDA_ROLE = REPO_ROOT / "roles" / "cuda"
CUDA_RELEASES = MATRIX["cuda_releases"]

FACTS = CUDA_FACTS


def cuda(host: str, **settings) -> role_run.Outcome:
    """What roles/cuda resolved on fake host ``host`` (or the message it stopped with); ``settings``: inventory
    variables."""
    return cuda_config(host, **settings)


# NVIDIA publishes no CUDA 12.1 for Debian 12 (its debian12 directory starts
# at 12.3): there the role needs a site repository that carries it.
SITE_URL = "https://mirror.example.com/site/cuda-12.1/debian12"
SITE = {"cuda_repository_url": SITE_URL}


def usable(host: str) -> dict:
    """The settings with which the role can install CUDA 12.1 on ``host``: a site repository on Debian 12."""
    return dict(SITE) if host == "debian12" else {}


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@pytest.mark.parametrize("release", list(CUDA_RELEASES))
def test_cuda_row_is_consistent(release):
    """A CUDA row's toolkit, components, cuDNN, NCCL and wheel variant all name the same release."""
    row = CUDA_RELEASES[release]
    major, minor = release.split(".")
    assert re.fullmatch(r"\d{3}\.\d+\.\d+", row["min_driver"])
    assert row["toolkit_version"].startswith(f"{release}.") and row["toolkit_version"].endswith("-1")
    assert row["component_version"].startswith(f"{release}.")
    for library in ("cudnn", "nccl"):
        lib = row[library]
        assert lib["package_version"] == f"{lib['version']}-1+cuda{release}"
        assert lib["packages"] and all(re.fullmatch(r"lib[a-z0-9-]+", p) for p in lib["packages"])
    assert row["pytorch_variant"] == f"cu{major}{minor}"


def test_cuda_12_1_needs_driver_530_30_02():
    """NVIDIA's CUDA 12.1 release notes: Linux driver >= 530.30.02."""
    assert CUDA_RELEASES["12.1"]["min_driver"] == "530.30.02"


@pytest.mark.parametrize("branch", list(MATRIX["driver_branches"]))
def test_each_branch_default_runs_cuda_12_1_exactly_when_new_enough(branch):
    """The rows the e2e test uses: 470 and 525 are too old for CUDA 12.1, 535 runs it."""
    default = MATRIX["driver_branches"][branch]["default_version"]
    runs = version_tuple(default) >= version_tuple(CUDA_RELEASES["12.1"]["min_driver"])
    assert runs == (int(branch) >= 530)


def test_every_cu_variant_in_pytorch_rows_is_a_cuda_release_or_known():
    """cu121 in a PyTorch row means CUDA 12.1 is a row of cuda_releases."""
    variants = {v for row in MATRIX["pytorch_releases"].values() for v in row["variants"]}
    assert "cu121" in variants
    assert {row["pytorch_variant"] for row in CUDA_RELEASES.values()} <= variants


def test_matrix_defaults_exist():
    assert MATRIX["defaults"]["cuda_release"] in CUDA_RELEASES
    assert MATRIX["defaults"]["pytorch_release"] in MATRIX["pytorch_releases"]
    assert "cu121" in MATRIX["pytorch_releases"][MATRIX["defaults"]["pytorch_release"]]["variants"]


@pytest.mark.parametrize(
    "host, directory", [("ubuntu2004", "ubuntu2004"), ("ubuntu2204", "ubuntu2204"), ("debian12", "debian12")]
)
def test_nvidia_repository_url_follows_nvidia_layout(host, directory):
    """https://developer.download.nvidia.com/compute/cuda/repos/<os>/x86_64, as cuda-keyring's own list has it."""
    cfg = cuda(host, **usable(host))
    assert cfg.failure is None
    assert (
        cfg["__cuda_public_repository_url"]
        == f"https://developer.download.nvidia.com/compute/cuda/repos/{directory}/x86_64"
    )
    assert cfg["__cuda_repo_os"] in cfg["__cuda_supported_os"]


def cuda_inputs(host: str, entry_point: str = "main", **settings) -> dict:
    """What source.yml gives roles/apt_source's entry point for this host and these settings."""
    cfg = cuda(host, **settings)
    assert cfg.failure is None, cfg.failure
    return cfg[f"{entry_point}_inputs"]


def render_pins(host: str, **settings) -> dict[str, str]:
    """{file name: text} of the preferences files apt_source's main writes from source.yml's inputs."""
    return {f"gpufleet-{pin['name']}.pref": pin["text"] for pin in cuda(host, **settings)["main_pins"]}


@pytest.mark.parametrize("host", list(FACTS))
def test_sources_file_is_flat_and_signed(host):
    """The deb822 source: the flat repository ("Suites: /", no Components), Signed-By cuda-keyring's keyring;
    NVIDIA's own on Ubuntu, the site repository on Debian 12."""
    url = SITE_URL if host == "debian12" else cuda(host)["__cuda_public_repository_url"]
    text = cuda(host, **usable(host))["main_source"]
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert f"URIs: {url}/" in lines
    assert "Suites: /" in lines
    assert not any(line.startswith("Components:") for line in lines)
    assert "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg" in lines
    assert "trusted" not in text


KEYED = {
    "cuda_repository_url": "https://mirror.example.com/cuda",
    "cuda_repository_key_url": "https://mirror.example.com/k.asc",
}
BAKED = {"cuda_repository_keyring": "/usr/share/keyrings/mirror.gpg"}
KEYED_KEYRING = "/etc/apt/keyrings/gpufleet-mirror.example.com_cuda.asc"
PREVIOUS_KEYRING = "/etc/apt/keyrings/gpufleet-cuda.asc"


@pytest.mark.parametrize("host", list(FACTS))
def test_the_keyring_package_signs_unless_a_key_or_keyring_is_given(host):
    url = SITE_URL if host == "debian12" else cuda(host)["__cuda_public_repository_url"]
    inputs = cuda_inputs(host, **usable(host))
    assert inputs["apt_source_repository"]["keyring_deb_url"] == f"{url}/cuda-keyring_1.1-1_all.deb"
    # cuda-keyring's own list for the repository, and where earlier releases fetched a key URL's key.
    assert inputs["apt_source_replaces"] == [f"/etc/apt/sources.list.d/cuda-{host}-x86_64.list", PREVIOUS_KEYRING]
    # A key URL's key goes to the repository's keyring file (one per repository, whichever role fetches it).
    keyed = cuda_inputs(host, **KEYED)["apt_source_repository"]
    assert (keyed["keyring_deb_url"], keyed["keyring"]) == ("", KEYED_KEYRING)
    baked = cuda_inputs(host, **BAKED, **usable(host))["apt_source_repository"]
    assert (baked["keyring_deb_url"], baked["keyring"]) == ("", "/usr/share/keyrings/mirror.gpg")


ROW = CUDA_RELEASES["12.1"]
TOOLKIT_PIN = {"name": "cuda", "packages": ["cuda-toolkit-12-1"], "version": ROW["toolkit_version"], "present": True}
LIBRARY_PINS = {
    lib: {"name": lib, "packages": ROW[lib]["packages"], "version": ROW[lib]["package_version"], "present": True}
    for lib in ("cudnn", "nccl")
}


@pytest.mark.parametrize(
    ("settings", "pins"),
    [
        ({}, [TOOLKIT_PIN, LIBRARY_PINS["cudnn"], LIBRARY_PINS["nccl"]]),
        ({"cuda_libraries": []}, [TOOLKIT_PIN]),
        ({"cuda_libraries": "nccl"}, [TOOLKIT_PIN, LIBRARY_PINS["nccl"]]),
        ({"cuda_toolkit": False}, [LIBRARY_PINS["cudnn"], LIBRARY_PINS["nccl"]]),
        (
            {"cuda_pin": False},
            [
                {**TOOLKIT_PIN, "present": False},
                {**LIBRARY_PINS["cudnn"], "present": False},
                {**LIBRARY_PINS["nccl"], "present": False},
            ],
        ),
    ],
    ids=["default", "no-libraries", "nccl-from-the-command-line", "libraries-only", "no-pins"],
)
def test_one_pin_for_the_toolkit_and_each_library_at_the_matrix_builds(settings, pins):
    assert cuda_inputs("debian12", **SITE, **settings)["apt_source_pins"] == pins


def test_the_library_pins_name_both_packages_at_the_build():
    """What molecule/cuda_libraries checks on the node: gpufleet-cudnn.pref, gpufleet-nccl.pref."""
    pins = render_pins("debian12", **SITE)
    assert sorted(pins) == ["gpufleet-cuda.pref", "gpufleet-cudnn.pref", "gpufleet-nccl.pref"]
    assert (
        "Package: libcudnn8 libcudnn8-dev\nPin: version 8.9.2.26-1+cuda12.1\nPin-Priority: 1001\n"
        in pins["gpufleet-cudnn.pref"]
    )
    assert (
        "Package: libnccl2 libnccl-dev\nPin: version 2.18.1-1+cuda12.1\nPin-Priority: 1001\n"
        in pins["gpufleet-nccl.pref"]
    )
    assert "Package: cuda-toolkit-12-1\nPin: version 12.1.1-1\n" in pins["gpufleet-cuda.pref"]


@pytest.mark.parametrize(
    ("settings", "version"), [({}, "12.1.1-1"), ({"cuda_toolkit": False}, "")], ids=["toolkit", "libraries-only"]
)
def test_the_trial_looks_for_the_toolkit_build(settings, version):
    trial, main = cuda_inputs("ubuntu2204", "trial", **settings), cuda_inputs("ubuntu2204", **settings)
    assert {k: v for k, v in trial.items() if k in main} == {k: v for k, v in main.items() if k in trial}
    assert (trial["apt_source_package"], trial["apt_source_version"]) == ("cuda-toolkit-12-1", version)
    assert trial["apt_source_repository"]["description"] == "NVIDIA's CUDA repository"


def test_toolkit_package_is_never_the_cuda_metapackage():
    """cuda-toolkit-12-1, not `cuda` (which pulls a driver) nor `cuda-12-1` (the rules resolve it,
    plugins/module_utils/rules/cuda.py)."""
    facts = cuda("ubuntu2204")
    assert (facts["__cuda_toolkit_package"], facts["__cuda_home"]) == ("cuda-toolkit-12-1", "/usr/local/cuda-12.1")


def test_driver_check_refuses_470_for_cuda_12_1():
    """validate.yml's driver check: 470.256.02 < 530.30.02 is refused, naming the setting; 535.261.03 passes."""
    refused = cuda("debian12", cuda_driver_version="470.256.02", **SITE)
    assert refused.failure is not None
    assert (
        f"CUDA 12.1 needs NVIDIA driver {CUDA_RELEASES['12.1']['min_driver']} or newer, but cuda_driver_version is "
        "driver 470.256.02"
    ) in " ".join(refused.failure.split())
    assert cuda("debian12", cuda_driver_version="535.261.03", **SITE).failure is None


# NVIDIA's index of https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ lists
# cuda-12-3_12.3.0-1_amd64.deb as its oldest cuda-12-*; those of .../debian11/x86_64/ and
# .../debian10/x86_64/ list cuda-12-1_12.1.1-1_amd64.deb.
DEBIAN12_REFUSAL = (
    "cuda settings rejected on {host}: [1] NVIDIA publishes no CUDA 12.1 (cuda-toolkit-12-1) for debian12: its "
    "debian12 repository starts at CUDA 12.3 and has none of the releases the compatibility matrix lists (12.1); CUDA "
    "12.1 is published for ubuntu2004, ubuntu2204, debian10, debian11. Set cuda_repository_url to a site repository "
    "that carries cuda-toolkit-12-1 12.1.1-1 and the builds of cuda_libraries for debian12 (flat, like NVIDIA's), or "
    "choose a CUDA release NVIDIA publishes for it (cuda_release)"
)


@pytest.mark.parametrize("settings", [{}, {"cuda_toolkit": False}], ids=["toolkit", "libraries-only"])
def test_debian_12_without_a_site_repository_is_refused_naming_the_setting(settings):
    """Debian 12 and CUDA 12.1 from NVIDIA's own repository: refused in play 1, with the host, the directory, what it
    has and the setting for a site repository."""
    refused = cuda("debian12", **settings)
    assert " ".join(refused.failure.split()) == DEBIAN12_REFUSAL.format(host=refused.host)


def test_debian_12_with_a_site_repository_or_nothing_to_install_passes():
    assert cuda("debian12", **SITE).failure is None
    assert cuda("debian12", cuda_toolkit=False, cuda_libraries=[]).failure is None
    # Ubuntu's directories carry CUDA 12.1: no site repository needed.
    assert cuda("ubuntu2204").failure is None and cuda("ubuntu2004").failure is None


# --------------------------------------------------------------------------- the cases, known up front: one run

for _host in FACTS:
    for _settings in ({}, KEYED, {**BAKED, **usable(_host)}, usable(_host)):
        CUDA.declare(_host, **_settings)
for _settings in (
    {"cuda_libraries": []},
    {"cuda_libraries": "nccl"},
    {"cuda_toolkit": False},
    {"cuda_pin": False},
    {"cuda_driver_version": "470.256.02"},
    {"cuda_driver_version": "535.261.03"},
    {},
):
    CUDA.declare("debian12", **SITE, **_settings)
CUDA.declare("debian12", cuda_toolkit=False)
CUDA.declare("debian12", cuda_toolkit=False, cuda_libraries=[])
CUDA.declare("ubuntu2204", cuda_toolkit=False)
