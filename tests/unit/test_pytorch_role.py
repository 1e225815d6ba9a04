"""roles/pytorch without a host: what it resolves from files/compatibility.yml, what it rejects, what its scripts
report.

The role runs for real (tests/unit/role_run.py): ansible-core's executor runs
``include_role: gpufleet.fleet.pytorch tasks_from: validate`` on fake hosts
(one per case, the settings as inventory variables, fake facts), in one run
for the cases this module knows up front; the results are the facts its
set_fact tasks left and the message of the fail task that stopped a host.
The checks of tasks/preflight.yml that read host probes (free space, the
wheel source's listings) run as copies of the role's own tasks after
validate.yml, the probes' registered results given as host variables.
Expected values are PyTorch's real layout: the index
https://download.pytorch.org/whl/<variant> (PEP 503: one page per project,
https://download.pytorch.org/whl/cu121/torch/), wheels whose local version
is the variant (torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl), and the
torchvision/torchaudio releases published with each torch release.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import role_run
import yaml
from conftest import FAKE_FACTS, load_script, load_trusted

from ansible_collections.gpufleet.fleet.plugins.module_utils import venv_facts, wheel_plan

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLE = REPO_ROOT / "roles" / "pytorch"
COMPATIBILITY_FILE = REPO_ROOT / "files" / "compatibility.yml"
LAB_VARS = REPO_ROOT / "tests" / "lab" / "inventory" / "group_vars" / "all" / "main.yml"
LAB_PLAYBOOK_VARS = REPO_ROOT / "tests" / "lab" / "vars" / "lab.yml"

MATRIX = yaml.safe_load(COMPATIBILITY_FILE.read_text())
RELEASES = MATRIX["pytorch_releases"]
INDEX = "https://download.pytorch.org/whl"
# The torch releases download.pytorch.org/whl/cu121 carries (2.1.0, the first
# built for CUDA 12.1, to 2.5.1, the last; 2.6 moved to cu124/cu126).
CU121_RELEASES = [
    "2.1.0",
    "2.1.1",
    "2.1.2",
    "2.2.0",
    "2.2.1",
    "2.2.2",
    "2.3.0",
    "2.3.1",
    "2.4.0",
    "2.4.1",
    "2.5.0",
    "2.5.1",
]


def _version_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


# validate.yml on each case's host.
VALIDATE = role_run.Batch(FAKE_FACTS, [role_run.import_role("pytorch")])
# ... and the arguments of install.yml's pip task, templated on the host afterwards.
INSTALL_TASK = role_run.role_task("pytorch", "install.yml", "Install {{ __pytorch_requirements")
WITH_INSTALL = role_run.Batch(
    FAKE_FACTS,
    [role_run.import_role("pytorch")],
    after=[
        role_run.capture(
            {
                "argv": INSTALL_TASK["ansible.builtin.command"]["argv"],
                "stdin": INSTALL_TASK["ansible.builtin.command"]["stdin"],
            },
            vars=INSTALL_TASK.get("vars"),
            name="Template the pip task's arguments",
        )
    ],
)


def pytorch_config(host: str = "ubuntu2204", **overrides: Any) -> role_run.Outcome:
    """What roles/pytorch/tasks/validate.yml resolved (or the message it stopped with) on fake host ``host``.

    ``overrides`` are inventory variables of the host.
    """
    return VALIDATE.get(host, **overrides)


# --- the compatibility matrix ----------------------------------------------


def test_matrix_releases_are_ordered_strings():
    """Release keys are quoted X.Y.Z strings in ascending order (validate.yml's 'first ... last' reads that order)."""
    assert RELEASES
    for release in RELEASES:
        assert isinstance(release, str) and re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", release), release
    assert list(RELEASES) == sorted(RELEASES, key=_version_key)


@pytest.mark.parametrize("release", list(RELEASES))
def test_every_release_row_is_well_formed(release):
    """Each row: a non-empty list of variants (cpu or cuXYZ), torchvision and torchaudio as strings, optionally the
    bundled cuDNN/NCCL builds of some of its CUDA variants (version strings), nothing else."""
    row = RELEASES[release]
    assert set(row) - {"bundled"} == {"variants", "pypi", "torchvision", "torchaudio"}
    # The variant of its default Linux x86_64 wheel on PyPI: a CUDA variant PyTorch publishes too (no CPU build there).
    assert row["pypi"] in row["variants"] and row["pypi"] != "cpu", f"{release}: pypi {row['pypi']}"
    for variant, builds in (row.get("bundled") or {}).items():
        assert variant in row["variants"] and variant != "cpu", f"{release}: bundled builds of {variant}"
        assert set(builds) == {"cudnn", "nccl"}, f"{release} {variant}: {builds}"
        assert all(isinstance(v, str) and re.fullmatch(r"[0-9]+(\.[0-9]+){2,3}", v) for v in builds.values()), builds
    assert isinstance(row["variants"], list) and row["variants"], f"{release} has no variants"
    assert len(set(row["variants"])) == len(row["variants"])
    for variant in row["variants"]:
        assert re.fullmatch(r"cpu|cu[0-9]{3}", variant), variant
    assert "cpu" in row["variants"], "PyTorch publishes a CPU build of every release"
    assert isinstance(row["torchvision"], str) and isinstance(row["torchaudio"], str)


def test_cu121_builds_are_exactly_torch_2_1_0_to_2_5_1():
    """download.pytorch.org/whl/cu121 has torch 2.1.0 ... 2.5.1, and the matrix says so."""
    assert [r for r, row in RELEASES.items() if "cu121" in row["variants"]] == CU121_RELEASES


@pytest.mark.parametrize("release", [r for r, row in RELEASES.items() if row["torchvision"] or row["torchaudio"]])
def test_torchvision_and_torchaudio_follow_the_release(release):
    """torch 2.Y.Z ships with torchvision 0.(Y+15).Z and torchaudio 2.Y.Z (2.1.0: 0.16.0, 2.5.1: 0.20.1)."""
    major, minor, patch = _version_key(release)
    assert major == 2
    assert RELEASES[release]["torchvision"] == f"0.{minor + 15}.{patch}"
    assert RELEASES[release]["torchaudio"] == release


def test_matrix_default_release_has_the_default_cuda_variant():
    """The defaults are consistent: defaults.pytorch_release has a build for defaults.cuda_release's variant."""
    defaults = MATRIX["defaults"]
    variant = MATRIX["cuda_releases"][defaults["cuda_release"]]["pytorch_variant"]
    assert variant == "cu121"
    assert variant in RELEASES[defaults["pytorch_release"]]["variants"]


@pytest.mark.parametrize("cuda", list(MATRIX["cuda_releases"]))
def test_cuda_release_variant_is_its_version(cuda):
    """CUDA X.Y takes the cuXY wheels (12.1: cu121), the index suffix PyTorch uses."""
    assert MATRIX["cuda_releases"][cuda]["pytorch_variant"] == "cu" + cuda.replace(".", "")


# --- what the role resolves --------------------------------------------------


# The default release per OS: the newest whose wheels exist for the OS's python3 (matrix pytorch_pythons, from
# PyPI's metadata: torch 2.5.0/2.5.1 have no cp38 wheel, 2.4.1 has; os_pythons: python3 3.8.2-0ubuntu2 on focal,
# https://packages.ubuntu.com/focal/python/python3; 3.10.6-1~22.04 on jammy, https://packages.ubuntu.com/jammy/python3;
# 3.11.2-1+b1 on bookworm, https://packages.debian.org/bookworm/python3).
DEFAULT_RELEASE = {
    "ubuntu2004": ("2.4.1", "0.19.1"),
    "ubuntu2204": ("2.5.1", "0.20.1"),
    "debian12": ("2.5.1", "0.20.1"),
}


@pytest.mark.parametrize("host", list(FAKE_FACTS))
def test_defaults_install_the_newest_cu121_torch_of_the_os_python_from_pytorch_index(host):
    """No settings: the newest torch for CUDA 12.1 the OS's Python takes (2.4.1 on Ubuntu 20.04's Python 3.8, 2.5.1
    elsewhere) with its torchvision and torchaudio, from PyTorch's own cu121 index."""
    cfg = pytorch_config(host)
    assert cfg.failure is None
    torch, vision = DEFAULT_RELEASE[host]
    assert cfg["__pytorch_release"] == torch
    assert cfg["__pytorch_cuda_release"] == "12.1"
    assert cfg["__pytorch_variant"] == "cu121"
    assert cfg["__pytorch_index_url"] == f"{INDEX}/cu121"
    assert cfg["__pytorch_matrix_pins"] == [
        f"torch=={torch}+cu121",
        f"torchvision=={vision}+cu121",
        f"torchaudio=={torch}+cu121",
    ]
    assert cfg["__pytorch_requirements"] == cfg["__pytorch_matrix_pins"]
    # PyTorch's index mirrors torch's dependencies: no second index, no trusted host.
    assert cfg["__pytorch_pip_source_args"] == ["--index-url", f"{INDEX}/cu121"]
    assert cfg["__pytorch_source_pages"] == [
        f"{INDEX}/cu121/torch/",
        f"{INDEX}/cu121/torchvision/",
        f"{INDEX}/cu121/torchaudio/",
    ]
    assert cfg["__pytorch_expected_cuda"] == "12.1"
    assert cfg["__pytorch_venv"] == "/opt/gpufleet/venv"


@pytest.mark.parametrize("release", list(RELEASES))
def test_cpu_build_of_every_release_comes_from_the_cpu_index(release):
    """pytorch_variant=cpu works for every release, from https://download.pytorch.org/whl/cpu, pinned +cpu."""
    cfg = pytorch_config(pytorch_release=release, pytorch_variant="cpu")
    assert cfg.failure is None
    row = RELEASES[release]
    assert cfg["__pytorch_index_url"] == f"{INDEX}/cpu"
    expected = [f"torch=={release}+cpu"]
    expected += [f"torchvision=={row['torchvision']}+cpu"] if row["torchvision"] else []
    expected += [f"torchaudio=={row['torchaudio']}+cpu"] if row["torchaudio"] else []
    assert cfg["__pytorch_matrix_pins"] == expected
    assert cfg["__pytorch_expected_cuda"] == ""


@pytest.mark.parametrize("release", CU121_RELEASES)
def test_cu121_release_pins(release):
    """Every cu121 release resolves to the cu121 index and +cu121 local versions."""
    cfg = pytorch_config(pytorch_release=release)
    assert cfg.failure is None
    assert cfg["__pytorch_index_url"] == f"{INDEX}/cu121"
    assert all(pin.endswith("+cu121") for pin in cfg["__pytorch_matrix_pins"])
    assert cfg["__pytorch_matrix_pins"][0] == f"torch=={release}+cu121"


def test_cuda_release_follows_the_cuda_role():
    """pytorch_cuda_release defaults to cuda_release (the cuda role's setting)."""
    cfg = pytorch_config(cuda_release="12.1")
    assert cfg.failure is None and cfg["__pytorch_cuda_release"] == "12.1"
    cfg = pytorch_config(cuda_release="11.8")
    # Said as the pytorch role's view of the cuda role's setting: the cuda role says "cuda_release '11.8' ..."
    # itself, and play 1 gives each message once (an e2e bad-input case counts it).
    assert cfg.failure is not None
    assert "pytorch_cuda_release (following cuda_release) '11.8' is not a CUDA release gpufleet knows" in cfg.failure
    assert "cuda_release '11.8'" not in cfg.failure
    cfg = pytorch_config(cuda_release="12.1", pytorch_cuda_release="11.8")  # set apart: its own name
    assert cfg.failure is not None and "pytorch_cuda_release '11.8' is not a CUDA release gpufleet knows" in cfg.failure


# --- the environment's Python ------------------------------------------------

# Ubuntu 20.04's python3 is 3.8 (python3 3.8.2-0ubuntu2, https://packages.ubuntu.com/focal/python/python3), and
# torch 2.5.0/2.5.1 publish no cp38 wheel (PyPI's metadata, as files/compatibility.yml pytorch_pythons records:
# pip install --dry-run --python-version 3.8 ... torch==2.5.1 finds none; torch-2.4.1-cp38-cp38-manylinux1_x86_64.whl
# exists).
FOCAL_CP38 = ["2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.1", "2.2.2", "2.3.0", "2.3.1", "2.4.0", "2.4.1"]


def test_the_matrix_records_the_pythons_of_every_release_and_os():
    assert list(MATRIX["pytorch_pythons"]) == list(RELEASES)
    assert [r for r, pythons in MATRIX["pytorch_pythons"].items() if "3.8" in pythons] == FOCAL_CP38
    assert MATRIX["os_pythons"] == {"Ubuntu 20.04": "3.8", "Ubuntu 22.04": "3.10", "Debian 12": "3.11"}
    # Every supported OS of the preflight role has its Python recorded.
    supported = load_trusted(REPO_ROOT / "roles" / "preflight" / "defaults" / "main.yml")["preflight_supported_os"]
    assert {f"{o['distribution']} {o['version']}" for o in supported} == set(MATRIX["os_pythons"])


def test_ubuntu_20_04_defaults_to_torch_2_4_1_for_its_python_3_8():
    """Ubuntu 20.04's default run: the newest release with cp38 wheels, not the matrix's 2.5.1 (which has none)."""
    cfg = pytorch_config("ubuntu2004")
    assert cfg.failure is None
    assert cfg["__pytorch_release"] == "2.4.1" == FOCAL_CP38[-1]
    assert cfg["__pytorch_matrix_pins"] == [
        "torch==2.4.1+cu121",
        "torchvision==0.19.1+cu121",
        "torchaudio==2.4.1+cu121",
    ]
    # The bundled builds follow the release: 2.4.1's cu121 wheels pin nvidia-nccl-cu12==2.20.5 (not 2.5.1's 2.21.5).
    assert cfg["__pytorch_stack"]["bundled"] == {"cudnn": "9.1.0.70", "nccl": "2.20.5"}
    assert cfg["__pytorch_stack"]["python"]["version"] == "3.8"


def test_ubuntu_20_04_refuses_torch_2_5_1_naming_the_releases_its_python_takes():
    cfg = pytorch_config("ubuntu2004", pytorch_release="2.5.1")
    assert cfg.failure is not None
    assert cfg.failure.startswith(
        f"pytorch settings rejected on {cfg.host}: [1] pytorch_release 2.5.1: torch 2.5.1 has "
        "no wheels for Python 3.8 (/usr/bin/python3, the python3 of Ubuntu 20.04), only for "
        "Python 3.9, 3.10, 3.11, 3.12, 3.13; choose a release whose wheels exist for Python 3.8: "
        "2.1.0 ... 2.4.1 (or leave pytorch_release empty for the newest of them, 2.4.1)"
    )
    assert "pytorch_python, pytorch_python_packages" in cfg.failure
    # Every release the matrix gives Python 3.8 is accepted there.
    assert pytorch_config("ubuntu2004", pytorch_release="2.4.1").failure is None


def test_another_interpreter_takes_its_own_python():
    """/usr/bin/python3.9 on Ubuntu 20.04 (the defaults' own example) takes 2.5.1; an interpreter whose version its
    path does not say gets the matrix's default, judged by the host's probe (preflight.yml)."""
    cfg = pytorch_config("ubuntu2004", pytorch_python="/usr/bin/python3.9", pytorch_python_packages=["python3.9-venv"])
    assert cfg.failure is None and cfg["__pytorch_release"] == "2.5.1"
    cfg = pytorch_config("ubuntu2004", **OWN_PYTHON)
    assert cfg.failure is None and cfg["__pytorch_release"] == MATRIX["defaults"]["pytorch_release"]


def write_lock(directory: Path, wheels: dict[str, bytes]) -> Path:
    """A wheelhouse of fake wheels and its lock, as files/wheelhouse_lock.py writes it."""
    house = directory / "wheels"
    house.mkdir()
    for name, content in wheels.items():
        (house / name).write_bytes(content)
    lock = directory / "wheels.lock"
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "files" / "wheelhouse_lock.py"), str(house), "--out", str(lock)], check=True
    )
    return lock


# The lab's wheelhouse as PyPI names the wheels (https://pypi.org/project/torch/2.3.1/#files: the cu121 build,
# torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl, no local version; its Requires-Dist nvidia-*-cu12 and triton).
LAB_WHEELS = {
    "torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl": b"torch",
    "torchvision-0.18.1-cp311-cp311-manylinux1_x86_64.whl": b"torchvision",
    "torchaudio-2.3.1-cp311-cp311-manylinux1_x86_64.whl": b"torchaudio",
    "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": b"numpy",
    "nvidia_cudnn_cu12-8.9.2.26-py3-none-manylinux1_x86_64.whl": b"cudnn",
    "nvidia_nccl_cu12-2.20.5-py3-none-manylinux2014_x86_64.whl": b"nccl",
    "triton-2.3.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": b"triton",
}
LAB_SETTINGS = {
    "pytorch_release": "2.3.1",
    "pytorch_wheel_source": "pypi",
    "pytorch_wheelhouse_url": "{{ lab_mirror_url }}/wheels/",
    "pytorch_extra_packages": ["numpy==1.26.4"],
    "pytorch_hashes_file": "{{ lab_wheelhouse_lock }}",
}


def test_lab_settings(locked):
    """The lab: PyPI's cu121 build of torch 2.3.1 (https://pypi.org/project/torch/2.3.1/: Requires-Dist
    nvidia-cuda-runtime-cu12==12.1.105, nvidia-cudnn-cu12==8.9.2.26, nvidia-nccl-cu12==2.20.5), unlabelled, with
    torchvision, torchaudio and NumPy 1.x from the mirror's wheelhouse, over http, hash-checked against the lock
    tests/lab/lab.yml writes on the controller (the case "lab" of the fixture: the lab's pytorch_* settings,
    lab_mirror_url and lab_wheelhouse_lock as the lab's inventory sets them)."""
    lab = {k: v for k, v in yaml.safe_load(LAB_VARS.read_text()).items() if k.startswith("pytorch_")}
    assert lab == LAB_SETTINGS
    cfg, _lock = locked["lab"]
    assert cfg.failure is None
    assert [line.split()[0] for line in cfg["__pytorch_hash_lines"]] == [
        "numpy==1.26.4",
        "nvidia-cudnn-cu12==8.9.2.26",
        "nvidia-nccl-cu12==2.20.5",
        "torch==2.3.1",
        "torchaudio==2.3.1",
        "torchvision==0.18.1",
        "triton==2.3.1",
    ]
    assert cfg["__pytorch_variant"] == "cu121" and cfg["__pytorch_expected_cuda"] == "12.1"
    assert cfg["__pytorch_matrix_pins"] == ["torch==2.3.1", "torchvision==0.18.1", "torchaudio==2.3.1"]
    assert cfg["__pytorch_requirements"] == [
        "torch==2.3.1",
        "torchvision==0.18.1",
        "torchaudio==2.3.1",
        "numpy==1.26.4",
    ]
    assert cfg["__pytorch_pip_source_args"] == [
        "--no-index",
        "--find-links",
        "http://gpufleet-mirror/wheels/",
        "--trusted-host=gpufleet-mirror",
    ]
    assert cfg["__pytorch_source_pages"] == ["http://gpufleet-mirror/wheels/"]


def test_lab_wheelhouse_downloads_what_the_lab_settings_pin(locked):
    """tests/lab/vars/lab.yml lab_wheelhouse_requirements (what the lab downloads from PyPI) is the stack lookup's pins
    for the lab inventory's settings plus its pytorch_extra_packages: a drift between the two fails here, not in the
    lab."""
    cfg, _lock = locked["lab"]
    assert yaml.safe_load(LAB_PLAYBOOK_VARS.read_text())["lab_wheelhouse_requirements"] == cfg["__pytorch_requirements"]
    assert cfg["__pytorch_requirements"] == cfg["__pytorch_matrix_pins"] + LAB_SETTINGS["pytorch_extra_packages"]


def test_lab_wheelhouse_download_accepts_pypi_manylinux1_wheels():
    """https://pypi.org/project/torch/2.3.1/#files: torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl (its nvidia-*-cu12
    wheels are manylinux1 too). pip download --platform expands only the legacy tag manylinux2014 to
    manylinux2010/manylinux1, not manylinux_2_17: without it pip finds no torch 2.3.1 for the nodes (checked with pip
    23.2 --dry-run --report)."""
    download = next(
        task
        for play in yaml.safe_load((REPO_ROOT / "tests" / "lab" / "lab.yml").read_text())
        for task in play.get("tasks", [])
        if task.get("name", "").startswith("Fill the pip wheelhouse")
    )
    assert "--platform manylinux2014_x86_64" in download["ansible.builtin.shell"]


def test_lab_stack_is_cuda_12_1_with_the_bundled_builds():
    """The lab's release from PyPI is the CUDA 12.1 build: torch must report CUDA 12.1 and its own cuDNN 8.9.2.26 /
    NCCL 2.20.5 (https://pypi.org/project/torch/2.3.1/, Requires-Dist nvidia-cudnn-cu12==8.9.2.26,
    nvidia-nccl-cu12==2.20.5)."""
    stack = load_script(REPO_ROOT / "plugins" / "lookup" / "stack.py", "gpufleet_stack")
    resolved = stack.resolve(stack.load_matrix(), pytorch_release="2.3.1", pytorch_wheel_source="pypi")
    assert resolved["errors"] == []
    assert resolved["pytorch"]["pins"] == ["torch==2.3.1", "torchvision==0.18.1", "torchaudio==2.3.1"]
    assert resolved["pytorch"]["expected_cuda"] == "12.1"
    assert resolved["pytorch"]["bundled"] == {"cudnn": "8.9.2.26", "nccl": "2.20.5"}


def test_lab_mirror_carries_python3_venv():
    """The lab nodes get python3-venv from the mirror (the role installs it before python3 -m venv)."""
    assert "python3-venv" in yaml.safe_load(LAB_PLAYBOOK_VARS.read_text())["lab_mirror_packages"]
    assert load_trusted(ROLE / "defaults" / "main.yml")["pytorch_python_packages"] == ["python3-venv"]


INTERNAL_MIRROR = {
    "pytorch_index_url": "http://pypi.corp.example:8081/repository/pytorch-{variant}/simple/",
    "pytorch_extra_index_url": "http://pypi.corp.example:8081/repository/pypi/simple",
    "pytorch_extra_packages": ["numpy==1.26.4", "ray[default]==2.9.3"],
}


def test_internal_mirror_and_extra_packages():
    """An internal http mirror of the index (variant placeholder), a second index and extra pins: pip trusts both http
    hosts."""
    cfg = pytorch_config(**INTERNAL_MIRROR)
    assert cfg.failure is None
    assert cfg["__pytorch_index_url"] == "http://pypi.corp.example:8081/repository/pytorch-cu121/simple"
    assert cfg["__pytorch_pip_source_args"] == [
        "--index-url",
        "http://pypi.corp.example:8081/repository/pytorch-cu121/simple",
        "--extra-index-url",
        "http://pypi.corp.example:8081/repository/pypi/simple",
        "--trusted-host=pypi.corp.example:8081",
    ]
    assert cfg["__pytorch_requirements"][-2:] == ["numpy==1.26.4", "ray[default]==2.9.3"]
    assert cfg["__pytorch_source_pages"][0] == "http://pypi.corp.example:8081/repository/pytorch-cu121/simple/torch/"


# PyPI or a mirror of it (pytorch_wheel_source pypi): https://pypi.org/project/torch/2.4.1/ is the cu121 build
# (Requires-Dist nvidia-cuda-runtime-cu12==12.1.105), published unlabelled; PyPI's simple index has one page per
# project, https://pypi.org/simple/torch/.
PYPI = {"pytorch_release": "2.4.1", "pytorch_wheel_source": "pypi"}
PYPI_MIRROR = {**PYPI, "pytorch_index_url": "http://nexus.corp.example:8081/repository/pypi/simple/"}


def test_pypi_source_pins_without_label_from_pypi():
    cfg = pytorch_config(**PYPI)
    assert cfg.failure is None
    assert cfg["__pytorch_variant"] == "cu121" and cfg["__pytorch_expected_cuda"] == "12.1"
    assert cfg["__pytorch_matrix_pins"] == ["torch==2.4.1", "torchvision==0.19.1", "torchaudio==2.4.1"]
    assert cfg["__pytorch_index_url"] == "https://pypi.org/simple"
    assert cfg["__pytorch_pip_source_args"] == ["--index-url", "https://pypi.org/simple"]
    assert cfg["__pytorch_source_pages"] == [
        "https://pypi.org/simple/torch/",
        "https://pypi.org/simple/torchvision/",
        "https://pypi.org/simple/torchaudio/",
    ]


def test_an_explicit_index_wins_over_the_source_index():
    """An enterprise's PyPI mirror (Nexus here) is the pypi source at another address."""
    cfg = pytorch_config(**PYPI_MIRROR)
    assert cfg.failure is None
    assert cfg["__pytorch_index_url"] == "http://nexus.corp.example:8081/repository/pypi/simple"
    assert cfg["__pytorch_matrix_pins"][0] == "torch==2.4.1"
    assert cfg["__pytorch_pip_source_args"] == [
        "--index-url",
        "http://nexus.corp.example:8081/repository/pypi/simple",
        "--trusted-host=nexus.corp.example:8081",
    ]


def test_the_default_source_is_pytorch_index():
    assert load_trusted(ROLE / "defaults" / "main.yml")["pytorch_wheel_source"] == "pytorch"
    assert load_trusted(ROLE / "defaults" / "main.yml")["pytorch_index_url"] == ""
    cfg = pytorch_config(pytorch_wheel_source="pytorch", pytorch_release="2.4.1")
    assert cfg["__pytorch_index_url"] == f"{INDEX}/cu121" and cfg["__pytorch_matrix_pins"][0] == "torch==2.4.1+cu121"


def test_argument_spec_declares_the_wheel_source_and_its_choices():
    """meta/argument_specs.yml is the one place for the setting's type and choices (the matrix's
    pytorch_wheel_sources)."""
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    option = spec["main"]["options"]["pytorch_wheel_source"]
    assert option["type"] == "str" and option["default"] == "pytorch"
    assert option["choices"] == list(MATRIX["pytorch_wheel_sources"]) == ["pytorch", "pypi"]
    assert spec["main"]["options"]["pytorch_index_url"]["default"] == ""
    assert spec["probe"]["options"]["pytorch_wheel_source"] == option


def test_torchvision_and_torchaudio_can_be_left_out():
    cfg = pytorch_config(**TORCH_ONLY)
    assert cfg["__pytorch_matrix_pins"] == ["torch==2.5.1+cu121"]


# --- what the role rejects, before any change ---------------------------------

# The matrix's own reasons are the stack lookup's (tests/unit/test_plugins_stack.py);
# these two show that the role passes its settings and stops on them.
BAD_INPUT = [
    ({"pytorch_release": "2.0.1"}, "pytorch_release '2.0.1' is not a PyTorch release gpufleet knows"),
    (
        {"pytorch_cuda_release": "12.4", "pytorch_torchvision": False},
        "pytorch_cuda_release '12.4' is not a CUDA release gpufleet knows (files/compatibility.yml lists 12.1)",
    ),
    (
        {"pytorch_index_url": "ftp://mirror/whl/{variant}"},
        "pytorch_index_url 'ftp://mirror/whl/{variant}' is not an http(s) URL",
    ),
    (
        {"pytorch_index_url": "https://mirror/whl/{cuda}"},
        "is not an http(s) URL (rendered: 'https://mirror/whl/{cuda}'",
    ),
    ({"pytorch_extra_index_url": "pypi.org/simple"}, "pytorch_extra_index_url 'pypi.org/simple' is not an http(s) URL"),
    (
        {"pytorch_wheelhouse_url": "http://mirror/wheels"},
        "pytorch_wheelhouse_url 'http://mirror/wheels' must end with '/'",
    ),
    (
        {"pytorch_wheelhouse_url": "file:///srv/wheels/"},
        "pytorch_wheelhouse_url 'file:///srv/wheels/' is not an http(s) URL",
    ),
    (
        {"pytorch_wheelhouse_url": "http://mirror/wheels/", "pytorch_extra_index_url": "https://pypi.org/simple"},
        "pytorch_extra_index_url is set but pytorch_wheelhouse_url makes pip use no index at all",
    ),
    (
        {"pytorch_extra_packages": ["numpy>=1.26"]},
        "pytorch_extra_packages must be exact pins name==version (as every host must get the same build): numpy>=1.26",
    ),
    (
        {"pytorch_extra_packages": ["Torch==2.5.1"]},
        "pytorch_extra_packages pins torch, whose versions come from pytorch_release",
    ),
    ({"pytorch_venv": "/opt"}, "pytorch_venv '/opt' must be an absolute path of its own"),
    ({"pytorch_venv": "/usr/"}, "pytorch_venv '/usr/' must be an absolute path of its own"),
    ({"pytorch_venv": "venv"}, "pytorch_venv 'venv' must be an absolute path of its own"),
    ({"pytorch_python": "python3"}, "pytorch_python 'python3' must be the absolute path of an interpreter"),
    ({"pytorch_pip_timeout": 0}, "pytorch_pip_timeout must be a whole number of seconds above 0"),
    (
        {"pytorch_wheelhouse_url": "http://mirror/wheels/"},
        "pytorch_wheelhouse_url is an offline install, which gpufleet checks wheel by wheel",
    ),
    (
        {"pytorch_hashes_file": "/nonexistent/wheels.lock"},
        "pytorch_hashes_file /nonexistent/wheels.lock does not exist on the controller",
    ),
    # https://pypi.org/project/torch/2.5.1/: the cu124 build (Requires-Dist nvidia-cuda-runtime-cu12==12.4.127).
    (
        {"pytorch_wheel_source": "pypi"},
        "torch 2.5.1 on PyPI (pytorch_wheel_source pypi) is the cu124 build, not cu121 (the variant of CUDA 12.1, "
        "pytorch_cuda_release): use pytorch_wheel_source pytorch (https://download.pytorch.org/whl/cu121), or a "
        "release PyPI publishes as cu121: 2.1.0 ... 2.4.1",
    ),
    (
        {"pytorch_wheel_source": "pypi", "pytorch_release": "2.3.1", "pytorch_variant": "cpu"},
        "torch 2.3.1 on PyPI (pytorch_wheel_source pypi) has no CPU-only build",
    ),
    (
        {"pytorch_wheel_source": "devpi"},
        "pytorch_wheel_source 'devpi' is not a wheel source gpufleet knows (files/compatibility.yml lists pytorch, "
        "pypi)",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUT, ids=[str(i) for i in range(len(BAD_INPUT))])
def test_bad_input_is_rejected_with_a_clear_message(overrides, message):
    cfg = pytorch_config(**overrides)
    assert cfg.failure is not None, "accepted"
    assert cfg.failure.startswith(f"pytorch settings rejected on {cfg.host}: [1] ")
    assert message in cfg.failure


EVERY_PROBLEM = {
    "pytorch_release": "2.0.1",
    "pytorch_wheelhouse_url": "http://mirror/wheels",
    "pytorch_venv": "/usr",
    "pytorch_pip_timeout": -1,
}


def test_every_problem_comes_in_one_message():
    """Several wrong settings: one failure, numbered, naming the host and each variable."""
    cfg = pytorch_config(**EVERY_PROBLEM)
    assert cfg.failure is not None
    assert cfg.failure.startswith(f"pytorch settings rejected on {cfg.host}: ")
    for n, name in enumerate(
        ["pytorch_release", "pytorch_wheelhouse_url", "pytorch_venv", "pytorch_hashes_file", "pytorch_pip_timeout"],
        start=1,
    ):
        assert re.search(rf"\[{n}\] [^\[]*{name}", cfg.failure), (name, cfg.failure)


def test_a_cpu_build_ignores_an_unknown_cuda_release():
    """cpu needs no CUDA: a CUDA release the matrix lacks does not matter for it."""
    assert pytorch_config(pytorch_variant="cpu", pytorch_cuda_release="11.8").failure is None


# --- the wheel source check (tasks/preflight.yml) ------------------------------

# download.pytorch.org/whl/cu121/torch/ as PyTorch serves it (excerpt): the
# href carries the local version as %2B, the anchor text as "+".
PYTORCH_TORCH_PAGE = (
    "\n".join(
        f'<a href="/whl/cu121/torch-2.5.1%2Bcu121-cp{py}-cp{py}-linux_x86_64.whl#sha256={py * 4}">'
        f"torch-2.5.1+cu121-cp{py}-cp{py}-linux_x86_64.whl</a><br/>"
        for py in ("39", "310", "311", "312")
    )
    + '\n<a href="/whl/cu121/torch-2.4.1%2Bcu121-cp38-cp38-linux_x86_64.whl#sha256=00">'
    "torch-2.4.1+cu121-cp38-cp38-linux_x86_64.whl</a><br/>"
)
TORCHVISION_PAGE = (
    '<a href="/whl/cu121/torchvision-0.20.1%2Bcu121-cp311-cp311-linux_x86_64.whl#sha256=aa">'
    "torchvision-0.20.1+cu121-cp311-cp311-linux_x86_64.whl</a>"
)
TORCHAUDIO_PAGE = (
    '<a href="/whl/cu121/torchaudio-2.5.1%2Bcu121-cp311-cp311-linux_x86_64.whl#sha256=bb">'
    "torchaudio-2.5.1+cu121-cp311-cp311-linux_x86_64.whl</a>"
)
# The lab mirror's nginx autoindex: the anchor text is cut short, the href is whole (PyPI's wheel names).
LAB_WHEELHOUSE_PAGE = (
    '<a href="torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl">'
    "torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl</a> 29-Nov-2026 19:32 779098464\n"
    '<a href="torchaudio-2.3.1-cp311-cp311-manylinux1_x86_64.whl">'
    "torchaudio-2.3.1-cp311-cp311-manylinux1_x86_64.whl</a> 29-Nov-2026 19:32 3392917\n"
    '<a href="torchvision-0.18.1-cp311-cp311-manylinux1_x86_64.whl">'
    "torchvision-0.18.1-cp311-cp311-manylinux1_x86_64.whl</a> 29-Nov-2026 19:32 7017423\n"
    '<a href="triton-2.3.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl">'
    "triton-2.3.1-cp311-cp311-manylinux_2_17_x86_64.m..&gt;</a> 29-Nov-2026 19:32 168072328\n"
    '<a href="sympy-1.14.0-py3-none-any.whl">sympy-1.14.0-py3-none-any.whl</a> 29-Nov-2026 19:32 6299353'
)


def no_venv(python: dict | None = None, df: dict | None = None, source: dict | None = None) -> dict:
    """gpufleet.fleet.venv_facts' registered result on a host without the environment (plugins/modules/venv_facts.py:
    nothing installed to read, so every requirement is unsatisfied and the rest is read): the interpreter's run, the
    df and the listings' answers as given. Its decision is the module's own (module_utils/venv_facts.py), for the
    role's requirements (vars/main.yml's __pytorch_requirements, templated when the role reads it)."""
    skipped = {"skipped": True, "changed": False}
    requirements = "{{ __pytorch_requirements }}"
    decided = venv_facts.decide(False, venv_facts.installed_answer(skipped), [requirements])
    assert (decided["venv_state"], decided["unsatisfied"], decided["needed"]) == ("missing", [requirements], True)
    return {
        "__pytorch_host": {
            "changed": False,
            "venv_exists": False,
            "installed": skipped,
            **decided,
            # The role's requirements list itself (one template, not a list of one).
            "unsatisfied": requirements,
            "python": python or skipped,
            "df": df or skipped,
            "source": source or skipped,
        }
    }


DF = "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/sda2 102400000 98000000 {free} 96% /"
ROOMY_KB = 52428800
# The checks preflight.yml's probe makes (its argument refuse, judged by module_utils/venv_facts.py refusal, as the
# module does on the host): validate.yml, then the probe's result (given as a host variable) and the arguments its
# task passes, templated in the play; the judgement in Python on them.
PROBE = role_run.role_task("pytorch", "preflight.yml", "Read the environment")["gpufleet.fleet.venv_facts"]
PREFLIGHT = role_run.Batch(
    FAKE_FACTS,
    [role_run.import_role("pytorch")],
    after=[
        role_run.capture(
            {"result": "{{ __pytorch_host }}", "venv": PROBE["venv"], "refuse": PROBE["refuse"]},
            name="Capture the probe's result and what its checks are given",
        )
    ],
)


@dataclasses.dataclass
class Checked:
    """A preflight() case: its host, and the message that stops it (None: none)."""

    host: str
    failure: str | None


LAB_SOURCE = {
    "lab_mirror_url": "http://gpufleet-mirror",
    "pytorch_release": "2.3.1",
    "pytorch_wheel_source": "pypi",
    "pytorch_wheelhouse_url": "{{ lab_mirror_url }}/wheels/",
    "pytorch_require_hashes_offline": False,
}


def _preflight_host(
    host: str = "ubuntu2204",
    python: str = "3.11",
    pages: list[str] | None = None,
    source: list[dict] | None = None,
    free_kb: int = ROOMY_KB,
    **settings: Any,
) -> tuple[str, dict]:
    """(facts, inventory variables) of a preflight() case: the settings and the probes' registered results."""
    urls = pytorch_config(host, **settings)["__pytorch_source_pages"]
    probe = (
        source
        if source is not None
        else [{"item": url, "status": 200, "content": page} for url, page in zip(urls, pages, strict=True)]
    )
    return host, {
        **settings,
        **no_venv(
            python={"rc": 0, "stdout_lines": [python, "x86_64"]},
            df={"stdout_lines": DF.format(free=free_kb).splitlines()},
            source={"results": probe},
        ),
    }


def preflight(*args: Any, **kwargs: Any) -> Checked:
    """preflight.yml's checks on a host without the environment: its Python is ``python``, its file system has
    ``free_kb`` free, each listing of the wheel source answers 200 with the page of ``pages`` (or as ``source`` says).

    The first call runs every case of PREFLIGHT_CASES with it (one run).
    """
    if not _preflight_declared:
        _preflight_declared.append(True)
        for case in PREFLIGHT_CASES:
            case_host, case_settings = _preflight_host(**case)
            PREFLIGHT.declare(case_host, **case_settings)
    host, settings = _preflight_host(*args, **kwargs)
    outcome = PREFLIGHT.get(host, **settings)
    assert outcome.failure is None, outcome.failure
    message = venv_facts.refusal(outcome["result"], outcome["venv"], outcome["refuse"])
    return Checked(outcome.host, message or None)


_preflight_declared: list[bool] = []


def _source_check(host: str, python: str, pages: list[str], **settings: Any) -> tuple[bool, str]:
    """(the wheel check stopped the host, its message)."""
    cfg = preflight(host, python, pages, **settings)
    stopped = cfg.failure is not None and " has no wheel of " in cfg.failure
    assert cfg.failure is None or stopped, cfg.failure
    return stopped, cfg.failure or ""


PYTORCH_PAGES = [PYTORCH_TORCH_PAGE, TORCHVISION_PAGE, TORCHAUDIO_PAGE]
CPU_ONLY_PAGES = [PYTORCH_TORCH_PAGE.replace("cu121", "cpu"), TORCHVISION_PAGE, TORCHAUDIO_PAGE]


def test_source_check_passes_on_pytorch_index_for_python_3_11():
    fired, _failure = _source_check("ubuntu2204", "3.11", PYTORCH_PAGES)
    assert not fired


# An interpreter whose Python validate.yml cannot know from its path (not /usr/bin/python3, not pythonX.Y): the
# default release is then the matrix's defaults.pytorch_release, and the host's probe of it judges the wheels.
OWN_PYTHON = {"pytorch_python": "/opt/python/bin/python"}


def test_source_check_stops_python_3_8_for_torch_2_5():
    """An own interpreter that turns out to be Python 3.8: torch 2.5.1 has no cp38 wheel; the message says which
    Pythons it has."""
    fired, msg = _source_check("ubuntu2004", "3.8", PYTORCH_PAGES, **OWN_PYTHON)
    assert fired
    host = preflight("ubuntu2004", "3.8", PYTORCH_PAGES, **OWN_PYTHON).host
    assert msg.startswith(
        f"pytorch on {host}: {INDEX}/cu121 has no wheel of torch==2.5.1+cu121, torchvision==0.20.1+cu121"
    )
    assert "for CPython 3.8 on x86_64" in msg
    assert "torch==2.5.1+cu121 is offered for cp39, cp310, cp311, cp312" in msg
    assert "pytorch_python" in msg


def test_source_check_stops_a_source_without_the_variant():
    """A cpu wheel where the cu121 build is pinned does not count."""
    fired, msg = _source_check("ubuntu2204", "3.11", CPU_ONLY_PAGES)
    assert fired and "has no wheel of torch==2.5.1+cu121 for CPython 3.11" in msg


def test_source_check_reads_the_lab_wheelhouse():
    assert not _source_check("debian12", "3.11", [LAB_WHEELHOUSE_PAGE], **LAB_SOURCE)[0]
    fired, msg = _source_check("debian12", "3.12", [LAB_WHEELHOUSE_PAGE], **LAB_SOURCE)
    assert (
        fired
        and (
            "http://gpufleet-mirror/wheels/ has no wheel of torch==2.3.1, torchvision==0.18.1, torchaudio==2.3.1 "
            "for CPython 3.12"
        )
        in msg
    )
    assert "offered for cp311" in msg


UNREACHABLE = [
    {
        "item": f"{INDEX}/cu121/torch/",
        "status": -1,
        "msg": "Request failed: <urlopen error [Errno -3] Temporary failure in name resolution>",
    },
    {"item": f"{INDEX}/cu121/torchvision/", "status": 200},
    {"item": f"{INDEX}/cu121/torchaudio/", "status": 200},
]


def test_source_unreachable_is_reported_with_the_url():
    cfg = preflight(source=UNREACHABLE)
    assert cfg.failure is not None and "the wheel source is not usable from this host" in cfg.failure
    assert f"{INDEX}/cu121/torch/ answered HTTP -1 Request failed" in cfg.failure
    assert "pytorch_index_url, for variant cu121" in cfg.failure


def test_disk_check():
    """The stop names the path, its free space, what is needed and the shortfall."""
    cfg = preflight(pages=PYTORCH_PAGES, free_kb=4194304)
    assert cfg.failure is not None and " GB short. " in cfg.failure
    assert cfg.failure.startswith(
        f"pytorch on {cfg.host}: / (the file system of /opt/gpufleet/venv) has 4.0 GB free, needs 10 GB: 6.0 GB short."
    )
    assert "pytorch_min_free_disk_gb=10" in cfg.failure
    assert preflight(pages=PYTORCH_PAGES, free_kb=ROOMY_KB).failure is None


def test_disk_check_shortfall_adds_up_to_what_is_needed():
    # 3355443 KiB = 3.2 GiB (df -Pk's 1024-blocks; the role's GB are GiB).
    cfg = preflight(pages=PYTORCH_PAGES, free_kb=3355443)
    assert "has 3.2 GB free, needs 10 GB: 6.8 GB short." in cfg.failure


# --- the scripts the role runs in the environment ------------------------------


def _load_script(name: str):
    return load_script(ROLE / "files" / name)


@pytest.mark.parametrize(
    ("code", "text"), [(None, None), (8902, "8.9.2"), (8700, "8.7.0"), (90100, "9.1.0"), (90501, "9.5.1")]
)
def test_cudnn_version_text(code, text):
    """torch.backends.cudnn.version() codes of cuDNN 8 (torch 2.1: 8902) and 9 (torch 2.5.1+cu121: 90100)."""
    assert _load_script("pytorch_report.py").cudnn_version_string(code) == text


@pytest.mark.parametrize(
    ("version", "text"), [((2, 21, 5), "2.21.5"), ((2, 18, 1), "2.18.1"), (21805, "2.18.5"), (2708, "2.7.8")]
)
def test_nccl_version_text(version, text):
    assert _load_script("pytorch_report.py").nccl_version_string(version) == text


@pytest.mark.parametrize(
    ("torch_version", "cuda", "variant"),
    # PyPI's torch 2.3.1 is unlabelled: its variant is that of the CUDA it reports.
    [
        ("2.5.1+cu121", "12.1", "cu121"),
        ("2.3.1+cpu", None, "cpu"),
        ("2.5.1", "12.4", "cu124"),
        ("2.5.1", None, "cpu"),
        ("2.3.1", "12.1", "cu121"),
    ],
)
def test_installed_variant(torch_version, cuda, variant):
    assert _load_script("pytorch_report.py").local_variant(torch_version, cuda) == variant


def _installed_probe(pins: list[str]) -> dict:
    script = (ROLE / "files" / "pytorch_installed.py").read_text()
    out = subprocess.run(
        [sys.executable, "-I", "-c", script, json.dumps(pins)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_installed_probe_on_the_controller_venv():
    """The probe the role runs before pip: exact pins, PEP 440 equality, missing packages (run against this venv)."""
    from importlib.metadata import version

    yaml_version = version("PyYAML")
    result = _installed_probe([f"PyYAML=={yaml_version}", "PyYAML==0.0.1", "no-such-package-gpufleet==1.0"])
    assert result["pip"] == version("pip")
    assert result["installed"] == {"PyYAML": yaml_version, "no-such-package-gpufleet": None}
    assert result["unsatisfied"] == ["PyYAML==0.0.1", "no-such-package-gpufleet==1.0"]


def test_installed_probe_local_versions():
    """torch==2.5.1+cu121 is satisfied by 2.5.1+cu121 only: a +cpu build of the same release is reinstalled."""
    module = _load_script("pytorch_installed.py")
    assert module.satisfied("torch==2.5.1+cu121", "2.5.1+cu121")
    assert not module.satisfied("torch==2.5.1+cu121", "2.5.1+cpu")
    assert not module.satisfied("torch==2.5.1+cu121", "2.5.1")
    assert not module.satisfied("torch==2.5.1+cu121", None)
    assert module.satisfied("numpy==1.26", "1.26.0")
    assert module.satisfied("ray[default]==2.9.3", "2.9.3")


# --- hash-checked installs (pytorch_hashes_file) --------------------------------


def install_argv(cfg: role_run.Outcome) -> tuple[list, Any]:
    """The pip command line and stdin of install.yml's pip task as templated on the host of ``cfg`` (a WITH_INSTALL
    case; stdin None: omitted)."""
    assert cfg.failure is None, cfg.failure
    return cfg["argv"], cfg.captured.get("stdin")


OFFLINE_WHEELS = {
    "torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl": b"cu121 torch",
    "torchvision-0.20.1+cu121-cp311-cp311-linux_x86_64.whl": b"tv",
    "torchaudio-2.5.1+cu121-cp311-cp311-linux_x86_64.whl": b"ta",
    "nvidia_cudnn_cu12-9.1.0.70-py3-none-manylinux2014_x86_64.whl": b"cudnn",
}
BAD_LOCK_LINES = [
    "torch>=2.5.1 --hash=sha256:" + "a" * 64,
    "torch==2.5.1+cu121",
    "torch==2.5.1+cu121 --hash=sha256:abc",
    "torch==2.5.1+cu121 --hash=md5:" + "a" * 32,
]
COMPILED_LOCK = (
    "#\n# pip-compile --generate-hashes\n#\ntorch==2.5.1+cu121 \\\n    --hash=sha256:"
    + "b" * 64
    + " \\\n    --hash=sha256:"
    + "c" * 64
    + "\n    # via -r requirements.in\n"
)
TORCH_ONLY = {"pytorch_torchvision": False, "pytorch_torchaudio": False}


@pytest.fixture(scope="module")
def locked(tmp_path_factory) -> dict[str, tuple[role_run.Outcome, Path]]:
    """The cases with a hash lock, the locks written first, in one run per kind: {case: (outcome, lock)}."""
    root = tmp_path_factory.mktemp("locks")

    def house(name: str, wheels: dict[str, bytes]) -> Path:
        (root / name).mkdir()
        return write_lock(root / name, wheels)

    def text(name: str, content: str) -> Path:
        (root / name).write_text(content)
        return root / name

    lab = {k: v for k, v in yaml.safe_load(LAB_VARS.read_text()).items() if k.startswith("pytorch_")}
    cases = {
        "lab": (
            VALIDATE,
            "debian12",
            house("lab", LAB_WHEELS),
            lambda lock: dict(lab, lab_mirror_url="http://gpufleet-mirror", lab_wheelhouse_lock=str(lock)),
        ),
        "offline": (
            WITH_INSTALL,
            "ubuntu2204",
            house("offline", OFFLINE_WHEELS),
            lambda lock: dict(pytorch_wheelhouse_url="http://mirror.corp/wheels/", pytorch_hashes_file=str(lock)),
        ),
        "other-release": (
            VALIDATE,
            "ubuntu2204",
            house("old", {"torch-2.4.1+cu121-cp311-cp311-linux_x86_64.whl": b"old"}),
            lambda lock: dict(
                TORCH_ONLY, pytorch_wheelhouse_url="http://mirror/wheels/", pytorch_hashes_file=str(lock)
            ),
        ),
        "compiled": (
            VALIDATE,
            "ubuntu2204",
            text("compiled.txt", COMPILED_LOCK),
            lambda lock: dict(TORCH_ONLY, pytorch_hashes_file=str(lock)),
        ),
        **{
            line: (
                VALIDATE,
                "ubuntu2204",
                text(f"bad-{n}.lock", f"# a comment\n{line}\n"),
                lambda lock: dict(TORCH_ONLY, pytorch_hashes_file=str(lock)),
            )
            for n, line in enumerate(BAD_LOCK_LINES)
        },
    }
    for batch, host, lock, settings in cases.values():
        batch.declare(host, **settings(lock))
    return {name: (batch.get(host, **settings(lock)), lock) for name, (batch, host, lock, settings) in cases.items()}


def test_offline_install_is_hash_checked_through_stdin(locked):
    """A lock makes pip install exactly it with --require-hashes; it travels on stdin, nothing is written on the
    node."""
    cfg, _lock = locked["offline"]
    assert cfg.failure is None
    argv, stdin = install_argv(cfg)
    assert argv[argv.index("--require-hashes") : argv.index("--require-hashes") + 3] == [
        "--require-hashes",
        "-r",
        "/dev/stdin",
    ]
    assert not any(a.startswith("torch==") for a in argv)
    assert "--no-index" in argv and "http://mirror.corp/wheels/" in argv
    assert stdin.splitlines() == cfg["__pytorch_hash_lines"]
    assert all("--hash=sha256:" in line for line in stdin.splitlines())


def test_without_a_lock_pip_gets_the_pins():
    argv, stdin = install_argv(WITH_INSTALL.get("ubuntu2204"))
    assert "--require-hashes" not in argv and argv[-3:] == [
        "torch==2.5.1+cu121",
        "torchvision==0.20.1+cu121",
        "torchaudio==2.5.1+cu121",
    ]
    assert stdin is None  # omit: the command gets no stdin


def test_offline_install_without_hashes_only_when_switched_off():
    assert (
        pytorch_config(pytorch_wheelhouse_url="http://mirror/wheels/", pytorch_require_hashes_offline=False).failure
        is None
    )


def test_a_lock_of_another_release_is_rejected(locked):
    cfg, lock = locked["other-release"]
    assert cfg.failure is not None
    assert (
        "pytorch_hashes_file " + str(lock) + " does not pin torch==2.5.1+cu121 (it pins torch==2.4.1+cu121)"
        in cfg.failure
    )


@pytest.mark.parametrize("line", BAD_LOCK_LINES)
def test_a_lock_line_without_pin_and_sha256_is_rejected(locked, line):
    cfg, lock = locked[line]
    assert cfg.failure is not None
    assert f"pytorch_hashes_file {lock} has lines that are not an exact pin with --hash=sha256" in cfg.failure


def test_pip_compile_style_continuations_and_comments_are_read(locked):
    cfg, _lock = locked["compiled"]
    assert cfg.failure is None
    assert [" ".join(line.split()) for line in cfg["__pytorch_hash_lines"]] == [
        "torch==2.5.1+cu121 --hash=sha256:" + "b" * 64 + " --hash=sha256:" + "c" * 64
    ]


# --- play 1's wheel plan (preflight.yml, files/pytorch_wheel_plan.py; its parts: tests/unit/test_wheel_plan.py) ---


def test_the_wheel_plan_gives_pip_the_install_source_and_options():
    """pip resolves what the install would install, from where: the same source and extra options (a proxy, a CA), its
    timeout, at most one retry (a probe), the pins."""
    cfg = pytorch_config()
    assert cfg["__pytorch_plan_requirements"] == cfg["__pytorch_requirements"]
    assert cfg["__pytorch_plan_pip_args"] == ["--index-url", f"{INDEX}/cu121", "--timeout", "60", "--retries", "1"]
    assert cfg["__pytorch_plan_context"] == {
        "source": f"{INDEX}/cu121",
        "source_setting": "pytorch_index_url",
        "hashes_file": "",
        "matrix_packages": ["torch", "torchvision", "torchaudio"],
    }
    cfg = pytorch_config(**PLAN_MIRROR)
    assert cfg["__pytorch_plan_pip_args"] == cfg["__pytorch_pip_source_args"] + [
        "--cert",
        "/etc/ssl/certs/corp-ca.pem",
        "--timeout",
        "20",
        "--retries",
        "0",
    ]


def test_the_wheel_plan_of_a_locked_wheelhouse_resolves_the_lock_without_its_hashes(locked):
    """pip reads only metadata when no hash is required (pip 25.3 prepare.py: "Metadata-only fetching is not used as
    hash checking is required"): the lock's pins go without their hashes, every pin a requirement, so that a dependency
    the lock lacks shows in the plan."""
    cfg, lock = locked["offline"]
    assert cfg["__pytorch_plan_requirements"] == [line.split()[0] for line in cfg["__pytorch_hash_lines"]]
    assert cfg["__pytorch_plan_pip_args"][:3] == ["--no-index", "--find-links", "http://mirror.corp/wheels/"]
    assert cfg["__pytorch_plan_context"]["source_setting"] == "pytorch_wheelhouse_url"
    assert cfg["__pytorch_plan_context"]["hashes_file"] == str(lock)


WHEEL_PLAN_RECORDED = json.loads((REPO_ROOT / "tests" / "unit" / "data" / "wheel_plan.json").read_text())["cases"]
# The collection of preflight.yml (a copy), after validate.yml, on a host without the environment, behind a
# stand-in for the action gpufleet.fleet.wheel_plan (a fake host runs nothing): its judgement (the filter
# gpufleet.fleet.wheel_plan is the action's) of a recorded output, registered as the action's. The action itself
# runs live in test_wheel_plan.py.
PLAN_CHECK = role_run.Batch(
    FAKE_FACTS,
    [
        role_run.import_role("pytorch"),
        {
            "name": "Stand in for the action gpufleet.fleet.wheel_plan",
            "ansible.builtin.set_fact": {
                "__pytorch_wheel_plan_judged": (
                    "{{ {'skipped': true} if not pytorch_wheel_plan | bool else {'plan': __pytorch_plan"
                    " | gpufleet.fleet.wheel_plan(__pytorch_plan_context"
                    " | combine({'requirements': __pytorch_plan_requirements}))} }}"
                )
            },
        },
    ]
    + [role_run.role_task("pytorch", "preflight.yml", "Collect the wheel sets")],
)
PLAN_MIRROR = {
    **INTERNAL_MIRROR,
    "pytorch_pip_extra_args": ["--cert", "/etc/ssl/certs/corp-ca.pem"],
    "pytorch_pip_timeout": 20,
    "pytorch_pip_retries": 0,
}


def _plan_case(recorded: str) -> dict:
    """The host variables of a wheel-plan case: the probes' results and the plan's recorded output."""
    return {
        **no_venv(python={"rc": 0, "stdout_lines": ["3.11", "x86_64"]}),
        "__pytorch_plan": WHEEL_PLAN_RECORDED[recorded]["result"],
    }


PLAN_CASES = {
    "second-host": _plan_case("second-host-closed"),
    "happy": _plan_case("happy"),
    "switched-off": {**_plan_case("second-host-closed"), "pytorch_wheel_plan": False},
}


def _named(line: str) -> list[str]:
    """The hosts a line of the once-per-run report names (gpufleet.fleet.per_message, with or without its label)."""
    return line.split(": ", 1)[0].removeprefix("WARNING ").split(", ")


def test_play_1_stops_a_host_that_cannot_fetch_a_wheel_naming_the_host_the_file_and_the_requirement():
    """The recorded plan of a dependency on a second host that does not answer (pip 25.3, test_wheel_plan.py)."""
    cfg = PLAN_CHECK.get(**PLAN_CASES["second-host"])
    # The action fails the host with the plan's refusal (module_utils/wheel_plan.py), as test_wheel_plan.py runs it.
    failure = wheel_plan.refusal(cfg["__pytorch_wheel_plan_judged"]["plan"], cfg.host)
    assert re.match(
        rf"pytorch on {cfg.host}: pip resolved the pinned wheel set on this host, and the install cannot fetch all of "
        r"it "
        r"\(nothing has been changed\): \[1\] 127\.0\.0\.1:\d+ does not answer \(connection refused\): pip fetches "
        r"gpufleet_demo_pinned-2\.0-py3-none-any\.whl from it",
        failure,
    ), failure
    assert "for gpufleet-demo-pinned==2.0 (needed by gpufleet-demo-top==1.0)" in failure
    assert f"or mirror the file into {INDEX}/cu121 (pytorch_index_url)" in failure


def test_pytorch_wheel_plan_false_leaves_the_plan_out():
    cfg = PLAN_CHECK.get(**PLAN_CASES["switched-off"])
    assert cfg.failure is None and "plan" not in cfg["__pytorch_wheel_plan_judged"]
    assert all(cfg.host not in _named(line) for line in cfg["__pytorch_wheel_plan_reports"])
    assert load_trusted(ROLE / "defaults" / "main.yml")["pytorch_wheel_plan"] is True


def test_a_fetchable_wheel_set_passes_and_says_where_it_comes_from():
    cfg = PLAN_CHECK.get(**PLAN_CASES["happy"])
    plan = cfg["__pytorch_wheel_plan_judged"]["plan"]
    assert cfg.failure is None and wheel_plan.refusal(plan, cfg.host) == ""
    assert plan["problems"] == [] and plan["warnings"] == []
    assert re.fullmatch(r"3 wheels for CPython 3\.\d+\.\d+ on x86_64, from 127\.0\.0\.1:\d+ \(3\)", plan["summary"])
    # Said once for the play (the cases' hosts are one play), the line naming this host among those it applies to.
    (line,) = [line for line in cfg["__pytorch_wheel_plan_reports"] if cfg.host in _named(line)]
    assert line.endswith(f": pip would install {plan['summary']}; every file answers"), line


# --- the cases known up front: one run for validate.yml, one for preflight.yml's checks ----------------------------

for _host in FAKE_FACTS:
    VALIDATE.declare(_host)
for _release in RELEASES:
    VALIDATE.declare(pytorch_release=_release, pytorch_variant="cpu")
for _release in CU121_RELEASES:
    VALIDATE.declare(pytorch_release=_release)
for _settings in [
    {"cuda_release": "12.1"},
    {"cuda_release": "11.8"},
    INTERNAL_MIRROR,
    TORCH_ONLY,
    EVERY_PROBLEM,
    PYPI,
    PYPI_MIRROR,
    {"pytorch_wheel_source": "pytorch", "pytorch_release": "2.4.1"},
    {"pytorch_variant": "cpu", "pytorch_cuda_release": "11.8"},
    {"pytorch_wheelhouse_url": "http://mirror/wheels/", "pytorch_require_hashes_offline": False},
    *(overrides for overrides, _message in BAD_INPUT),
]:
    VALIDATE.declare(**_settings)
VALIDATE.declare("debian12", **LAB_SOURCE)
WITH_INSTALL.declare("ubuntu2204")
VALIDATE.declare(**PLAN_MIRROR)
for _case in PLAN_CASES.values():
    PLAN_CHECK.declare(**_case)
PREFLIGHT_CASES = [
    {"host": "ubuntu2204", "python": "3.11", "pages": PYTORCH_PAGES},
    {"host": "ubuntu2004", "python": "3.8", "pages": PYTORCH_PAGES, **OWN_PYTHON},
    {"host": "ubuntu2204", "python": "3.11", "pages": CPU_ONLY_PAGES},
    {"host": "debian12", "python": "3.11", "pages": [LAB_WHEELHOUSE_PAGE], **LAB_SOURCE},
    {"host": "debian12", "python": "3.12", "pages": [LAB_WHEELHOUSE_PAGE], **LAB_SOURCE},
    {"source": UNREACHABLE},
    {"pages": PYTORCH_PAGES, "free_kb": 4194304},
    {"pages": PYTORCH_PAGES, "free_kb": 3355443},
]


# --------------------------------------------------------------------------- the imported build


# The check after the import (facts.yml), given what pytorch_report.py published.
BUILD_CHECK = role_run.Batch(
    FAKE_FACTS, [role_run.import_role("pytorch"), role_run.role_task("pytorch", "facts.yml", "is not the pinned build")]
)
PYPI_LAB = {"pytorch_release": "2.3.1", "pytorch_wheel_source": "pypi"}


@pytest.mark.parametrize(
    ("settings", "imported", "stopped"),
    [
        # PyPI's torch 2.3.1: pip's metadata says 2.3.1 (pinned torch==2.3.1), its torch/version.py 2.3.1+cu121
        # (read from torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl, https://pypi.org/project/torch/2.3.1/).
        (PYPI_LAB, ("2.3.1+cu121", "12.1", "cu121"), None),
        ({"pytorch_release": "2.3.1"}, ("2.3.1+cu121", "12.1", "cu121"), None),
        # PyPI's 2.5.1 is the cu124 build: installed where 2.3.1 of cu121 was pinned.
        (
            PYPI_LAB,
            ("2.5.1", "12.4", "cu124"),
            "imports torch 2.5.1 (cu124, CUDA 12.4), not torch 2.3.1 of the cu121 build for CUDA 12.1",
        ),
        (
            PYPI_LAB,
            ("2.3.1+cpu", None, "cpu"),
            "imports torch 2.3.1+cpu (cpu, CUDA none), not torch 2.3.1 of the cu121 build",
        ),
    ],
    ids=["pypi-local-tag", "pytorch-index", "pypi-2.5.1-cu124", "cpu-build"],
)
def test_the_imported_build_is_judged_by_release_and_variant(settings, imported, stopped):
    version, cuda, variant = imported
    facts = {
        "__pytorch_import": {"rc": 0, "stdout_lines": ["{}"]},
        "pytorch_torch_version": version,
        "pytorch_cuda_version": cuda,
        "pytorch_variant_installed": variant,
    }
    outcome = BUILD_CHECK.get("ubuntu2204", **settings, **facts)
    if stopped is None:
        assert outcome.failure is None, outcome.failure
    else:
        assert outcome.failure is not None and stopped in outcome.failure, outcome.failure
