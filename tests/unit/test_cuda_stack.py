"""The CUDA rows of files/compatibility.yml and what roles/cuda renders from
them, checked without a host: versions belong together, NVIDIA's repository
URLs follow its real layout, and the role's driver check refuses an
impossible stack."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from conftest import load_trusted
from test_apt_source import apt_source_inputs, render_pins
from test_apt_source import render as render_apt_source

REPO_ROOT = Path(__file__).resolve().parents[2]
MATRIX = yaml.safe_load((REPO_ROOT / "files" / "compatibility.yml").read_text())
CUDA_ROLE = REPO_ROOT / "roles" / "cuda"
CUDA_RELEASES = MATRIX["cuda_releases"]

FACTS = {
    "ubuntu2004": {"distribution": "Ubuntu", "distribution_version": "20.04", "distribution_major_version": "20"},
    "ubuntu2204": {"distribution": "Ubuntu", "distribution_version": "22.04", "distribution_major_version": "22"},
    "debian12": {"distribution": "Debian", "distribution_version": "12.7", "distribution_major_version": "12"},
}


def _trusted(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    return value


def render(expression: str, host: str, **extra) -> str:
    """Template ``expression`` with roles/cuda's vars and defaults and the host's facts."""
    variables = {}
    for part in ("defaults/main.yml", "vars/main.yml"):
        variables.update(yaml.safe_load((CUDA_ROLE / part).read_text()))
    variables.update(role_path=str(CUDA_ROLE), ansible_facts=FACTS[host], ansible_managed="test", **extra)
    templar = Templar(loader=DataLoader(), variables=_trusted(variables))
    return templar.template(trust_as_template(expression))


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


@pytest.mark.parametrize("host, directory", [("ubuntu2004", "ubuntu2004"), ("ubuntu2204", "ubuntu2204"),
                                             ("debian12", "debian12")])
def test_nvidia_repository_url_follows_nvidia_layout(host, directory):
    """https://developer.download.nvidia.com/compute/cuda/repos/<os>/x86_64, as cuda-keyring's own list has it."""
    assert render("{{ __cuda_public_repository_url }}", host) == (
        f"https://developer.download.nvidia.com/compute/cuda/repos/{directory}/x86_64"
    )
    assert render("{{ __cuda_repo_os in __cuda_supported_os }}", host) in (True, "True")


def cuda_variables(host: str, **settings) -> dict:
    """roles/cuda's variables after validate.yml (its facts for CUDA 12.1, given here) and source.yml's set_facts."""
    variables = {}
    for part in ("defaults/main.yml", "vars/main.yml"):
        variables.update(load_trusted(CUDA_ROLE / part))
    variables.update(role_path=str(CUDA_ROLE), ansible_facts=FACTS[host], ansible_managed="test", inventory_hostname="gpu-test")
    variables.update(_trusted(settings))
    templar = Templar(loader=DataLoader(), variables=variables)
    variables.update(
        __cuda_release="12.1", __cuda_spec=CUDA_RELEASES["12.1"], __cuda_toolkit_package="cuda-toolkit-12-1",
        __cuda_repo_url=(templar.template(trust_as_template("{{ cuda_repository_url or __cuda_public_repository_url }}"))),
        __cuda_keyring=templar.template(trust_as_template(
            "{{ (__cuda_keyring_dir ~ '/gpufleet-cuda.asc') if cuda_repository_key_url | length > 0 else "
            "(cuda_repository_keyring if cuda_repository_keyring | length > 0 else __cuda_keyring_package_keyring) }}")),
    )
    # source.yml's set_fact tasks, in order (a loop task once per item).
    for task in load_trusted(CUDA_ROLE / "tasks" / "source.yml"):
        facts = task.get("ansible.builtin.set_fact")
        if facts is None or "apt_source_configured" in str(facts):
            continue
        items = Templar(loader=DataLoader(), variables=variables).template(task["loop"]) if "loop" in task else [None]
        for item in items:
            templar = Templar(loader=DataLoader(), variables={**variables, "item": item})
            variables.update({key: templar.template(value) for key, value in facts.items()})
    return variables


def cuda_inputs(host: str, entry_point: str = "main", **settings) -> dict:
    """What source.yml gives roles/apt_source's entry point for this host and these settings."""
    return apt_source_inputs("cuda", "source.yml", entry_point, cuda_variables(host, **settings))


@pytest.mark.parametrize("host", list(FACTS))
def test_sources_file_is_flat_and_signed(host):
    """The deb822 source: the flat repository ("Suites: /", no Components), Signed-By cuda-keyring's keyring."""
    url = render("{{ __cuda_public_repository_url }}", host)
    text = render_apt_source("source.sources.j2", cuda_inputs(host))
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert f"URIs: {url}/" in lines
    assert "Suites: /" in lines
    assert not any(line.startswith("Components:") for line in lines)
    assert "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg" in lines
    assert "trusted" not in text


@pytest.mark.parametrize("host", list(FACTS))
def test_the_keyring_package_signs_unless_a_key_or_keyring_is_given(host):
    url = render("{{ __cuda_public_repository_url }}", host)
    inputs = cuda_inputs(host)
    assert inputs["apt_source_keyring_deb_url"] == f"{url}/cuda-keyring_1.1-1_all.deb"
    assert inputs["apt_source_replaces"] == [f"/etc/apt/sources.list.d/cuda-{host}-x86_64.list"]
    keyed = cuda_inputs(host, cuda_repository_url="https://mirror.example.com/cuda", cuda_repository_key_url="https://mirror.example.com/k.asc")
    assert (keyed["apt_source_keyring_deb_url"], keyed["apt_source_keyring"]) == ("", "/etc/apt/keyrings/gpufleet-cuda.asc")
    baked = cuda_inputs(host, cuda_repository_keyring="/usr/share/keyrings/mirror.gpg")
    assert (baked["apt_source_keyring_deb_url"], baked["apt_source_keyring"]) == ("", "/usr/share/keyrings/mirror.gpg")


ROW = CUDA_RELEASES["12.1"]
TOOLKIT_PIN = {"name": "cuda", "packages": ["cuda-toolkit-12-1"], "version": ROW["toolkit_version"], "present": True}
LIBRARY_PINS = {lib: {"name": lib, "packages": ROW[lib]["packages"], "version": ROW[lib]["package_version"], "present": True}
                for lib in ("cudnn", "nccl")}


@pytest.mark.parametrize(("settings", "pins"), [
    ({}, [TOOLKIT_PIN, LIBRARY_PINS["cudnn"], LIBRARY_PINS["nccl"]]),
    ({"cuda_libraries": []}, [TOOLKIT_PIN]),
    ({"cuda_libraries": "nccl"}, [TOOLKIT_PIN, LIBRARY_PINS["nccl"]]),
    ({"cuda_toolkit": False}, [LIBRARY_PINS["cudnn"], LIBRARY_PINS["nccl"]]),
    ({"cuda_pin": False}, [{**TOOLKIT_PIN, "present": False}, {**LIBRARY_PINS["cudnn"], "present": False},
                           {**LIBRARY_PINS["nccl"], "present": False}]),
], ids=["default", "no-libraries", "nccl-from-the-command-line", "libraries-only", "no-pins"])
def test_one_pin_for_the_toolkit_and_each_library_at_the_matrix_builds(settings, pins):
    assert cuda_inputs("debian12", **settings)["apt_source_pins"] == pins


def test_the_library_pins_name_both_packages_at_the_build():
    """What molecule/cuda_libraries checks on the node: gpufleet-cudnn.pref, gpufleet-nccl.pref."""
    pins = render_pins(cuda_inputs("debian12"))
    assert sorted(pins) == ["gpufleet-cuda.pref", "gpufleet-cudnn.pref", "gpufleet-nccl.pref"]
    assert "Package: libcudnn8 libcudnn8-dev\nPin: version 8.9.2.26-1+cuda12.1\nPin-Priority: 1001\n" in pins["gpufleet-cudnn.pref"]
    assert "Package: libnccl2 libnccl-dev\nPin: version 2.18.1-1+cuda12.1\nPin-Priority: 1001\n" in pins["gpufleet-nccl.pref"]
    assert "Package: cuda-toolkit-12-1\nPin: version 12.1.1-1\n" in pins["gpufleet-cuda.pref"]


@pytest.mark.parametrize(("settings", "version"), [({}, "12.1.1-1"), ({"cuda_toolkit": False}, "")], ids=["toolkit", "libraries-only"])
def test_the_trial_looks_for_the_toolkit_build(settings, version):
    trial, main = cuda_inputs("ubuntu2204", "trial", **settings), cuda_inputs("ubuntu2204", **settings)
    assert {k: v for k, v in trial.items() if k in main} == {k: v for k, v in main.items() if k in trial}
    assert (trial["apt_source_package"], trial["apt_source_version"]) == ("cuda-toolkit-12-1", version)
    assert trial["apt_source_description"] == "NVIDIA's CUDA repository"


def test_toolkit_package_is_never_the_cuda_metapackage():
    """cuda-toolkit-12-1, not `cuda` (which pulls a driver) nor `cuda-12-1`."""
    validate = (CUDA_ROLE / "tasks" / "validate.yml").read_text()
    assert "__cuda_toolkit_package: \"cuda-toolkit-{{ __cuda_release | replace('.', '-') }}\"" in validate


def test_driver_check_expression_refuses_470_for_cuda_12_1():
    """The validate expression itself: 470.256.02 < 530.30.02 is refused, 535.261.03 passes."""
    spec = CUDA_RELEASES["12.1"]
    expression = "{{ __cuda_driver is version(__cuda_spec.min_driver, '>=') }}"
    assert render(expression, "debian12", __cuda_driver="470.256.02", __cuda_spec=spec) in (False, "False")
    assert render(expression, "debian12", __cuda_driver="535.261.03", __cuda_spec=spec) in (True, "True")
