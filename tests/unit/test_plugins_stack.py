"""The lookup stack (plugins/lookup/stack.py), called directly: the compatibility matrix's resolution of a stack,
its reasons, where NVIDIA publishes a CUDA release, the builds torch bundles, the environment's Python.
Where the wheels come from: test_plugins_stack_wheels.py; the driver branches' lifecycle:
test_plugins_stack_lifecycle.py."""

from __future__ import annotations

import pytest
from plugin_files import MATRIX, stack

# --- stack -------------------------------------------------------------------


def test_defaults_resolve_to_one_complete_stack():
    resolved = stack.resolve(MATRIX, driver_branch="535", distribution="Ubuntu")
    assert resolved["errors"] == []
    driver = dict(resolved["driver"])
    assert driver.pop("lifecycle")["designation"] == "Long Term Support Branch"
    assert driver == {
        "branch": "535",
        "version": MATRIX["driver_branches"]["535"]["default_version"],
        "fabricmanager": True,
        "sources": ["ubuntu", "nvidia"],
    }
    assert resolved["cuda"]["release"] == MATRIX["defaults"]["cuda_release"] == "12.1"
    assert resolved["cuda"]["toolkit_package"] == "cuda-toolkit-12-1"
    assert resolved["cudnn"]["version"] == "8.9.2.26" and resolved["nccl"]["packages"] == ["libnccl2", "libnccl-dev"]
    assert resolved["pytorch"]["variant"] == "cu121" and resolved["pytorch"]["expected_cuda"] == "12.1"
    assert resolved["pytorch"]["label"] == "+cu121"


def test_every_wrong_choice_is_a_reason_and_its_part_is_empty():
    resolved = stack.resolve(MATRIX, driver_branch="999", cuda_release="12.4", pytorch_release="1.0")
    assert resolved["driver"] == {} and resolved["cuda"] == {} and resolved["pytorch"] == {}
    assert [reason.split(" ")[0] for reason in resolved["errors"]] == [
        "nvidia_driver_branch",
        "cuda_release",
        "pytorch_release",
    ]
    assert "lists 470, 525, 535, 580" in resolved["errors"][0]


def test_a_driver_version_outside_its_branch_is_a_reason():
    resolved = stack.resolve(MATRIX, driver_branch="535", driver_version="550.54.15")
    assert resolved["errors"] == [
        "nvidia_driver_version '550.54.15' is not a release of branch 535 "
        f"(expected the form 535.NNN.NN, for example {MATRIX['driver_branches']['535']['default_version']})"
    ]


# A CPU-only row (every real row has cu121 and cpu; this one is made up).
CPU_ONLY = {
    **MATRIX,
    "pytorch_releases": {
        **MATRIX["pytorch_releases"],
        "2.9.9": {"variants": ["cpu"], "torchvision": "", "torchaudio": ""},
    },
}


def test_a_variant_the_release_lacks_is_a_reason():
    resolved = stack.resolve(CPU_ONLY, pytorch_release="2.9.9")
    assert resolved["errors"] == [
        "torch 2.9.9 is published for cpu only, not cu121 (the variant of CUDA 12.1, pytorch_cuda_release; "
        "pytorch_release 2.9.9); files/compatibility.yml: cu121 wheels exist for torch 2.1.0 ... 2.5.1"
    ]
    assert resolved["pytorch"] == {}


def test_the_lab_only_cpu_release_is_gone_from_the_matrix():
    """2.13.0 was the lab's CPU wheel; the lab now installs PyPI's cu121 build of 2.3.1 (issue 15)."""
    assert list(MATRIX["pytorch_releases"]) == [
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


# The PyTorch part: every reason the pytorch and container roles stop on.
PYTORCH_REASONS = [
    (
        {"pytorch_release": "2.0.1"},
        [
            "pytorch_release '2.0.1' is not a PyTorch release gpufleet knows (files/compatibility.yml "
            "lists 2.1.0 ... 2.5.1; cu121 wheels exist for torch 2.1.0 ... 2.5.1)"
        ],
    ),
    # A release the matrix does not know is said to be unknown, not to lack a
    # variant whose span it lies in (issue 16, item 21).
    (
        {"pytorch_release": "2.6.0", "pytorch_variant": "cpu"},
        [
            "pytorch_release '2.6.0' is not a PyTorch release gpufleet knows (files/compatibility.yml lists 2.1.0 ... "
            "2.5.1; cpu wheels exist for torch 2.1.0 ... 2.5.1)"
        ],
    ),
    (
        {"pytorch_release": "2.1.0", "pytorch_variant": "cu124"},
        [
            "pytorch_variant cu124 does not match CUDA 12.1 (pytorch_cuda_release): files/compatibility.yml gives "
            "CUDA 12.1 the cu121 wheels; use cu121, or cpu for a CPU-only environment",
            "torch 2.1.0 is published for cu118, cu121, cpu only, not cu124 (pytorch_variant cu124; pytorch_release "
            "2.1.0); files/compatibility.yml: cu124 wheels exist for torch 2.4.0 ... 2.5.1",
        ],
    ),
    (
        {"pytorch_variant": "cuda121"},
        [
            "pytorch_variant 'cuda121' is not a wheel variant: cpu or cuXYZ "
            "(files/compatibility.yml knows cu118, cu121, cpu, cu124)"
        ],
    ),
    (
        {"pytorch_cuda_release": "12.4"},
        [
            "pytorch_cuda_release '12.4' is not a CUDA release gpufleet knows "
            "(files/compatibility.yml lists 12.1); set pytorch_variant=cpu for a CPU-only environment"
        ],
    ),
    # CUDA from the CUDA setting: its reason is given once, by that setting.
    (
        {"cuda_release": "12.4"},
        ["cuda_release '12.4' is not a CUDA release gpufleet knows (the compatibility matrix lists 12.1)"],
    ),
]


@pytest.mark.parametrize(("choices", "reasons"), PYTORCH_REASONS, ids=[str(i) for i in range(len(PYTORCH_REASONS))])
def test_pytorch_choices_outside_the_matrix_are_reasons(choices, reasons):
    resolved = stack.resolve(MATRIX, **choices)
    assert resolved["errors"] == reasons and resolved["pytorch"] == {}


def test_the_caller_names_its_own_settings():
    names = {
        "cuda_release": "container_image_cuda_release",
        "pytorch_release": "container_image_torch_release",
        "pytorch_cuda_release": "container_image_cuda_release",
        "pytorch_variant": "container_image_torch_variant",
    }
    assert stack.resolve(MATRIX, pytorch_release="2.0.1", names=names)["errors"][0].startswith(
        "container_image_torch_release '2.0.1' is not a PyTorch release"
    )
    assert stack.resolve(MATRIX, cuda_release="11.0", names=names)["errors"] == [
        "container_image_cuda_release '11.0' is not a CUDA release gpufleet knows (the compatibility matrix lists 12.1)"
    ]


def test_pins_carry_the_variant_and_follow_the_companion_switches():
    assert stack.resolve(MATRIX)["pytorch"]["pins"] == [
        "torch==2.5.1+cu121",
        "torchvision==0.20.1+cu121",
        "torchaudio==2.5.1+cu121",
    ]
    assert stack.resolve(MATRIX, pytorch_release="2.3.1", torchaudio=False)["pytorch"]["pins"] == [
        "torch==2.3.1+cu121",
        "torchvision==0.18.1+cu121",
    ]
    # A row without companions pins torch alone.
    assert stack.resolve(CPU_ONLY, pytorch_release="2.9.9", pytorch_variant="cpu")["pytorch"]["pins"] == [
        "torch==2.9.9+cpu"
    ]


def test_the_caller_names_the_wheel_source_setting():
    names = {"pytorch_wheel_source": "container_image_wheel_source"}
    assert stack.resolve(MATRIX, pytorch_wheel_source="conda", names=names)["errors"] == [
        "container_image_wheel_source 'conda' is not a wheel source gpufleet knows (files/compatibility.yml lists "
        "pytorch, pypi)"
    ]


# --- stack: where NVIDIA publishes a CUDA release ----------------------------


# NVIDIA's index of https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ starts its
# cuda-12-* packages at cuda-12-3_12.3.0-1_amd64.deb; .../debian11/x86_64/ and .../debian10/x86_64/ list
# cuda-12-1_12.1.0-1 and cuda-12-1_12.1.1-1. Ubuntu 22.04: NVIDIA's CUDA 12.1 download page offers the deb
# (network) install from .../ubuntu2204/x86_64 (developer.nvidia.com/cuda-12-1-0-download-archive?...
# target_version=22.04&target_type=deb_network, quoted in NVIDIA/cuda-samples#291); ubuntu2004: its arm64 index
# lists cuda-12-1_12.1.1-1 (the x86_64 index was not seen down to its cuda-12-* lines).
def test_cuda_12_1_is_published_for_ubuntu_and_old_debian_not_debian_12():
    assert MATRIX["cuda_releases"]["12.1"]["repositories"] == ["ubuntu2004", "ubuntu2204", "debian10", "debian11"]
    assert MATRIX["cuda_repositories"]["debian12"]["oldest_release"] == "12.3"


def test_the_repository_gap_names_the_directory_and_what_it_has():
    assert stack.resolve(MATRIX, repository_os="debian12")["cuda"]["repository_gap"] == (
        "NVIDIA publishes no CUDA 12.1 (cuda-toolkit-12-1) for debian12: its debian12 repository starts at CUDA 12.3 "
        "and has none of the releases the compatibility matrix lists (12.1); CUDA 12.1 is published for ubuntu2004, "
        "ubuntu2204, debian10, debian11"
    )
    for directory in ("ubuntu2004", "ubuntu2204", ""):
        assert stack.resolve(MATRIX, repository_os=directory)["cuda"]["repository_gap"] == ""


def test_the_repository_gap_lists_the_releases_a_directory_has():
    matrix = {
        **MATRIX,
        "cuda_releases": {
            **MATRIX["cuda_releases"],
            "12.4": {**MATRIX["cuda_releases"]["12.1"], "repositories": ["debian12"]},
        },
    }
    gap = stack.resolve(matrix, repository_os="debian12")["cuda"]["repository_gap"]
    assert "has CUDA 12.4 of the releases the compatibility matrix lists (12.1, 12.4)" in gap
    assert stack.resolve(matrix, cuda_release="12.4", repository_os="debian12")["cuda"]["repository_gap"] == ""


# The cuDNN / NCCL builds torch's cu121 wheels pin (Requires-Dist nvidia-cudnn-cu12==, nvidia-nccl-cu12==).
# 2.1.0-2.4.1: the wheels' metadata on PyPI (https://pypi.org/project/torch/<release>/, whose default Linux
# wheels are the cu121 builds; `pip install --dry-run --report - torch==<release>`);
# 2.5.x: PYTORCH_EXTRA_INSTALL_REQUIREMENTS["12.1"] in pytorch's .github/scripts/generate_binary_build_matrix.py
# (github.com/pytorch/pytorch, as of the 2.5 cycle: CUDA_ARCHES 11.8, 12.1, 12.4).
CU121_BUNDLED = {
    "2.1.0": ("8.9.2.26", "2.18.1"),
    "2.1.1": ("8.9.2.26", "2.18.1"),
    "2.1.2": ("8.9.2.26", "2.18.1"),
    "2.2.0": ("8.9.2.26", "2.19.3"),
    "2.2.1": ("8.9.2.26", "2.19.3"),
    "2.2.2": ("8.9.2.26", "2.19.3"),
    "2.3.0": ("8.9.2.26", "2.20.5"),
    "2.3.1": ("8.9.2.26", "2.20.5"),
    "2.4.0": ("9.1.0.70", "2.20.5"),
    "2.4.1": ("9.1.0.70", "2.20.5"),
    "2.5.0": ("9.1.0.70", "2.21.5"),
    "2.5.1": ("9.1.0.70", "2.21.5"),
}


@pytest.mark.parametrize("release", list(CU121_BUNDLED))
def test_the_cu121_wheels_bring_their_own_cudnn_and_nccl(release):
    cudnn, nccl = CU121_BUNDLED[release]
    resolved = stack.resolve(MATRIX, pytorch_release=release)
    assert resolved["errors"] == []
    assert resolved["pytorch"]["bundled"] == {"cudnn": cudnn, "nccl": nccl}


def test_every_cu121_release_of_the_matrix_records_its_bundled_builds():
    """A new cu121 row without its bundled builds would be reported as unknown: the table above names them all."""
    cu121 = [release for release, row in MATRIX["pytorch_releases"].items() if "cu121" in row["variants"]]
    assert cu121 == list(CU121_BUNDLED)


def test_bundled_builds_are_unknown_where_the_matrix_records_none_and_none_for_cpu():
    # cu118 wheels bundle other builds (cuDNN 8.7 before 2.4): not recorded, so not guessed from cu121.
    row = {"variants": ["cu118", "cu121"], "bundled": {"cu121": {"cudnn": "8.9.2.26", "nccl": "2.18.1"}}}
    assert stack.bundled_libraries(row, "cu118") == {"cudnn": "unknown", "nccl": "unknown"}
    assert stack.bundled_libraries({"bundled": {"cu121": {"cudnn": "8.9.2.26"}}}, "cu121") == {
        "cudnn": "8.9.2.26",
        "nccl": "unknown",
    }
    assert stack.bundled_libraries(row, "cpu") == {"cudnn": "none", "nccl": "none"}
    cpu = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_variant="cpu")
    assert cpu["pytorch"]["bundled"] == {"cudnn": "none", "nccl": "none"}


def test_no_driver_branch_resolves_no_driver():
    assert stack.resolve(MATRIX)["driver"] == {}


def test_a_damaged_matrix_is_a_clear_error(tmp_path):
    bad = tmp_path / "compatibility.yml"
    bad.write_text("just: text\n")
    with pytest.raises(Exception, match="is not gpufleet's compatibility matrix"):
        stack.load_matrix(bad)


# --- the environment's Python and the default PyTorch release ------------------
# os_pythons: python3 3.8.2-0ubuntu2 (https://packages.ubuntu.com/focal/python/python3), 3.10.6-1~22.04
# (https://packages.ubuntu.com/jammy/python3), 3.11.2-1+b1 (https://packages.debian.org/bookworm/python3);
# pytorch_pythons from PyPI's metadata (torch 2.5.x: cp39 ... cp313, no cp38).


@pytest.mark.parametrize(
    ("interpreter", "distribution", "version", "python"),
    [
        ("/usr/bin/python3", "Ubuntu", "20.04", "3.8"),
        ("", "Ubuntu", "22.04", "3.10"),
        ("/usr/bin/python3", "Debian", "12.5", "3.11"),
        ("/usr/bin/python3.9", "Ubuntu", "20.04", "3.9"),
        ("/opt/conda/bin/python", "Ubuntu", "20.04", ""),
        ("/usr/bin/python3", "Ubuntu", "24.04", ""),
    ],
)
def test_the_environment_python_is_the_os_python3_or_the_interpreters_own(interpreter, distribution, version, python):
    assert stack.environment_python(MATRIX, interpreter, distribution, version)["version"] == python


@pytest.mark.parametrize(
    ("python", "release"),
    [("3.8", "2.4.1"), ("3.10", "2.5.1"), ("3.11", "2.5.1"), ("3.13", "2.5.1"), ("", "2.5.1"), ("3.7", "")],
)
def test_the_default_release_is_the_newest_the_python_takes(python, release):
    assert stack.default_release(MATRIX, python) == release


def test_the_default_never_passes_the_matrix_default():
    """defaults.pytorch_release is the ceiling: with 2.4.1 as the default, Python 3.11 gets 2.4.1, not 2.5.1."""
    older = {**MATRIX, "defaults": {**MATRIX["defaults"], "pytorch_release": "2.4.1"}}
    assert stack.default_release(older, "3.11") == "2.4.1"


def test_a_release_the_python_cannot_take_is_a_reason_naming_those_it_can():
    resolved = stack.resolve(
        MATRIX, pytorch_release="2.5.0", distribution="Ubuntu", os_version="20.04", python="/usr/bin/python3"
    )
    assert resolved["pytorch"] == {}
    assert resolved["errors"] == [
        "pytorch_release 2.5.0: torch 2.5.0 has no wheels for Python 3.8 (/usr/bin/python3, the python3 of Ubuntu "
        "20.04), only for Python 3.9, 3.10, 3.11, 3.12, 3.13; choose a release whose wheels exist for Python 3.8: "
        "2.1.0 ... 2.4.1 (or leave pytorch_release empty for the newest of them, 2.4.1), or make the environment with "
        "an interpreter torch 2.5.0 has wheels for (pytorch_python, pytorch_python_packages)"
    ]
    ok = stack.resolve(MATRIX, distribution="Ubuntu", os_version="20.04", python="/usr/bin/python3")
    assert ok["errors"] == [] and ok["pytorch"]["release"] == "2.4.1" and ok["pytorch"]["default"] is True
