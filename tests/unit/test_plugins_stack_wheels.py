"""The lookup stack (plugins/lookup/stack.py), called directly: where the wheels come from (pytorch_wheel_source,
issue 15)."""

from __future__ import annotations

import pytest
from plugin_files import MATRIX, stack

# --- stack: where the wheels come from (pytorch_wheel_source, issue 15) -------
# PyPI's default Linux x86_64 torch wheels are CUDA builds without a local version label. Their variant is
# what their Requires-Dist pins (pip install --dry-run --no-deps --ignore-installed --report r.json
# --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.11 --implementation cp torch==X,
# which reads only the metadata):
#   https://pypi.org/project/torch/2.1.0/  nvidia-cuda-runtime-cu12==12.1.105, nvidia-cudnn-cu12==8.9.2.26,
#                                          nvidia-nccl-cu12==2.18.1: cu121
#   https://pypi.org/project/torch/2.3.1/  nvidia-cuda-runtime-cu12==12.1.105, nvidia-cudnn-cu12==8.9.2.26,
#                                          nvidia-nccl-cu12==2.20.5: cu121
#   https://pypi.org/project/torch/2.4.1/  nvidia-cuda-runtime-cu12==12.1.105, nvidia-cudnn-cu12==9.1.0.70,
#                                          nvidia-nccl-cu12==2.20.5: cu121
#   https://pypi.org/project/torch/2.5.0/  nvidia-cuda-runtime-cu12==12.4.127: cu124
#   https://pypi.org/project/torch/2.5.1/  nvidia-cuda-runtime-cu12==12.4.127, nvidia-cudnn-cu12==9.1.0.70,
#                                          nvidia-nccl-cu12==2.21.5: cu124
# (2.1.1 ... 2.4.0 between them: cu121, Requires-Dist nvidia-cuda-runtime-cu12==12.1.105.) PyPI has no CPU-only
# Linux torch wheel; https://download.pytorch.org/whl/cu121 has torch 2.1.0+cu121 ... 2.5.1+cu121.
PYPI_VARIANTS = {
    "2.1.0": "cu121",
    "2.1.1": "cu121",
    "2.1.2": "cu121",
    "2.2.0": "cu121",
    "2.2.1": "cu121",
    "2.2.2": "cu121",
    "2.3.0": "cu121",
    "2.3.1": "cu121",
    "2.4.0": "cu121",
    "2.4.1": "cu121",
    "2.5.0": "cu124",
    "2.5.1": "cu124",
}


def test_every_release_records_the_variant_of_its_pypi_build():
    assert {release: row.get("pypi") for release, row in MATRIX["pytorch_releases"].items()} == PYPI_VARIANTS


def test_the_two_wheel_sources_and_their_indexes():
    assert MATRIX["pytorch_wheel_sources"] == {
        "pytorch": {"index_url": "https://download.pytorch.org/whl/{variant}", "local_version": True},
        "pypi": {"index_url": "https://pypi.org/simple", "local_version": False},
    }


@pytest.mark.parametrize(
    ("source", "index_url", "pins"),
    [
        (
            "",
            "https://download.pytorch.org/whl/cu121",
            ["torch==2.3.1+cu121", "torchvision==0.18.1+cu121", "torchaudio==2.3.1+cu121"],
        ),
        (
            "pytorch",
            "https://download.pytorch.org/whl/cu121",
            ["torch==2.3.1+cu121", "torchvision==0.18.1+cu121", "torchaudio==2.3.1+cu121"],
        ),
        # https://pypi.org/project/torch/2.3.1/: the cu121 build, published as plain 2.3.1.
        ("pypi", "https://pypi.org/simple", ["torch==2.3.1", "torchvision==0.18.1", "torchaudio==2.3.1"]),
    ],
)
def test_the_source_gives_the_index_and_the_form_of_the_pins(source, index_url, pins):
    resolved = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_wheel_source=source)
    assert resolved["errors"] == []
    assert resolved["pytorch"]["source"] == (source or "pytorch")
    assert resolved["pytorch"]["index_url"] == index_url and resolved["pytorch"]["pins"] == pins
    assert resolved["pytorch"]["label"] == ("" if source == "pypi" else "+cu121")
    # The build is the same: CUDA 12.1, the same bundled cuDNN and NCCL.
    assert resolved["pytorch"]["expected_cuda"] == "12.1"
    assert resolved["pytorch"]["bundled"] == {"cudnn": "8.9.2.26", "nccl": "2.20.5"}


def test_the_cpu_index_of_the_pytorch_source():
    resolved = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_variant="cpu", pytorch_wheel_source="pytorch")
    assert resolved["pytorch"]["index_url"] == "https://download.pytorch.org/whl/cpu"
    assert resolved["pytorch"]["pins"][0] == "torch==2.3.1+cpu"


@pytest.mark.parametrize("release", [release for release, variant in PYPI_VARIANTS.items() if variant == "cu121"])
def test_pypi_gives_the_cu121_build_of_2_1_to_2_4_unlabelled(release):
    # https://pypi.org/project/torch/<release>/ (table above).
    resolved = stack.resolve(MATRIX, pytorch_release=release, pytorch_wheel_source="pypi")
    assert resolved["errors"] == []
    assert resolved["pytorch"]["pins"][0] == f"torch=={release}" and resolved["pytorch"]["expected_cuda"] == "12.1"


def test_pypi_refuses_2_5_1_whose_pypi_build_is_cu124():
    # https://pypi.org/project/torch/2.5.1/: Requires-Dist nvidia-cuda-runtime-cu12==12.4.127, the cu124 build.
    resolved = stack.resolve(MATRIX, pytorch_release="2.5.1", pytorch_wheel_source="pypi")
    assert resolved["errors"] == [
        "torch 2.5.1 on PyPI (pytorch_wheel_source pypi) is the cu124 build, not cu121 (the variant of CUDA 12.1, "
        "pytorch_cuda_release): use pytorch_wheel_source pytorch (https://download.pytorch.org/whl/cu121), or a "
        "release PyPI publishes as cu121: 2.1.0 ... 2.4.1"
    ]
    assert resolved["pytorch"] == {}


def test_pypi_refuses_the_default_release_2_5_1_too():
    assert stack.resolve(MATRIX, pytorch_wheel_source="pypi")["errors"][0].startswith(
        "torch 2.5.1 on PyPI (pytorch_wheel_source pypi) is the cu124 build, not cu121"
    )


def test_pypi_has_no_cpu_build():
    # https://pypi.org/project/torch/2.3.1/: its Linux x86_64 wheel is the cu121 build; PyPI has no CPU-only one.
    resolved = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_variant="cpu", pytorch_wheel_source="pypi")
    assert resolved["errors"] == [
        "torch 2.3.1 on PyPI (pytorch_wheel_source pypi) has no CPU-only build: PyPI's Linux x86_64 torch wheels are "
        "CUDA builds (cu121 for 2.3.1); use pytorch_wheel_source pytorch (https://download.pytorch.org/whl/cpu) for "
        "the cpu wheels"
    ]


def test_an_unknown_wheel_source_lists_the_known_ones():
    resolved = stack.resolve(MATRIX, pytorch_release="2.3.1", pytorch_wheel_source="artifactory")
    assert resolved["errors"] == [
        "pytorch_wheel_source 'artifactory' is not a wheel source gpufleet knows (files/compatibility.yml lists "
        "pytorch, pypi)"
    ]
    assert resolved["pytorch"] == {}


def test_a_row_without_a_pypi_build_is_refused_for_pypi():
    matrix = {
        **MATRIX,
        "pytorch_releases": {
            **MATRIX["pytorch_releases"],
            "2.9.9": {"variants": ["cu121", "cpu"], "torchvision": "", "torchaudio": ""},
        },
    }
    assert stack.resolve(matrix, pytorch_release="2.9.9", pytorch_wheel_source="pypi")["errors"] == [
        "torch 2.9.9 on PyPI (pytorch_wheel_source pypi) is not recorded as a cu121 build (the variant of CUDA 12.1, "
        "pytorch_cuda_release): use pytorch_wheel_source pytorch (https://download.pytorch.org/whl/cu121), or a "
        "release PyPI publishes as cu121: 2.1.0 ... 2.4.1"
    ]


def test_the_cpu_variant_expects_no_cuda():
    resolved = stack.resolve(MATRIX, pytorch_release="2.5.1", pytorch_variant="cpu")
    assert resolved["pytorch"]["expected_cuda"] == "" and resolved["errors"] == []
