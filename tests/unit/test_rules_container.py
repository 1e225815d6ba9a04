"""The container role's rules (plugins/module_utils/rules/container.py), judged directly on plain values.

Each rule: the role's defaults pass it, one wrong value fails it with its exact message (the one rule that fails).
What validate.yml makes of them on a fake host (the action, the facts it keeps) is test_container_role.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpufleet.fleet.plugins.lookup.stack import load_matrix, resolve
from ansible_collections.gpufleet.fleet.plugins.module_utils.rules import container
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import Judgement

ROLE = Path(__file__).resolve().parents[2] / "roles" / "container"
MATRIX = load_matrix()
FACTS = {
    "ubuntu2204": {"distribution": "Ubuntu", "distribution_version": "22.04", "architecture": "x86_64"},
    "debian12": {"distribution": "Debian", "distribution_version": "12", "architecture": "aarch64"},
    "rocky9": {"distribution": "Rocky", "distribution_version": "9.3", "architecture": "x86_64"},
}
OS_VARS = {"ubuntu2204": "Ubuntu.yml", "debian12": "Debian.yml"}
# The defaults that follow other roles' settings, as they template where those are not set.
FOLLOWED = {
    "container_image_torch_release": "",
    "container_image_torch_variant": "",
    "container_image_cuda_release": "",
    "container_image_wheel_source": "pytorch",
    "container_image_wheelhouse_url": "",
}


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def values(host: str = "ubuntu2204", **settings: Any) -> dict[str, Any]:
    """What the action gives the rules on ``host``: the role's defaults and vars (its OS's too), facts, settings."""
    found = {**_load(ROLE / "defaults" / "main.yml"), **FOLLOWED, **_load(ROLE / "vars" / "main.yml")}
    if host in OS_VARS:
        found.update(_load(ROLE / "vars" / OS_VARS[host]))
    return {**found, "ansible_facts": FACTS[host], **settings}


def judged(host: str = "ubuntu2204", **settings: Any) -> Judgement:
    judgement = Judgement(
        "container", host, values(host, **settings), stack=lambda **choices: resolve(MATRIX, **choices)
    )
    container.judge(judgement)
    return judgement


# --------------------------------------------------------------------------- resolution


def test_the_defaults_resolve_nvidia_s_repository_and_the_engine() -> None:
    j = judged()
    assert j.errors == []
    assert j.facts["__container_engine_spec"] == {"packages": ["docker.io"], "service": "docker"}
    assert j.facts["__container_nvidia_runtimes"] == ["docker"]
    assert j.facts["__container_deb_arch"] == "amd64"
    assert j.facts["__container_repo_url"] == "https://nvidia.github.io/libnvidia-container/stable/deb/amd64"
    assert j.facts["__container_key_url"] == "https://nvidia.github.io/libnvidia-container/gpgkey"


def test_podman_on_debian_uses_cdi_and_a_given_keyring_needs_no_key() -> None:
    j = judged(
        "debian12",
        container_engine="podman",
        container_nvidia_toolkit_repository_url="http://mirror/deb//",
        container_nvidia_toolkit_repository_keyring="/usr/share/keyrings/mirror.gpg",
    )
    assert j.errors == []
    assert j.facts["__container_engine_spec"] == {"packages": ["podman"], "service": ""}
    assert j.facts["__container_nvidia_runtimes"] == []
    assert j.facts["__container_deb_arch"] == "arm64"
    assert j.facts["__container_repo_url"] == "http://mirror/deb"
    assert j.facts["__container_key_url"] == ""


def test_the_runtimes_setting_wins_over_the_engine_s() -> None:
    j = judged(container_nvidia_runtimes="containerd,crio")
    assert j.facts["__container_nvidia_runtimes"] == ["containerd", "crio"]


def test_the_default_image_follows_the_matrix() -> None:
    j = judged(container_build_image=True)
    assert j.errors == []
    assert (
        j.facts["__container_image_torch_release"],
        j.facts["__container_image_cuda_release"],
        j.facts["__container_image_variant"],
        j.facts["__container_image_label"],
    ) == ("2.5.1", "12.1", "cu121", "cu121")
    assert j.facts["__container_image_stack"]["pytorch"]["pins"][0] == "torch==2.5.1+cu121"
    assert j.facts["__container_image_base"] == "docker.io/library/ubuntu:22.04"
    assert j.facts["__container_image_ref"] == "gpufleet-train:2.5.1-cu121"
    assert j.facts["__container_image_index_url"] == "https://download.pytorch.org/whl/cu121"
    assert j.facts["__container_image_pip_args"] == []
    assert j.facts["__container_image_build_args"] == {
        "BASE_IMAGE": "docker.io/library/ubuntu:22.04",
        "TORCH_VERSION": "2.5.1",
        "TORCH_VARIANT": "cu121",
        "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cu121",
        "PIP_EXTRA_ARGS": "",
    }


def test_a_wheelhouse_a_mirror_and_a_tag() -> None:
    j = judged(
        container_build_image=True,
        container_image_tag="site-1",
        container_image_base="registry:5000/base:1",
        container_image_index_url="https://mirror/torch/{variant}/",
        container_image_wheelhouse_url="http://mirror:8080/wheels/",
        container_image_pip_extra_args=["--proxy", "http://proxy:3128"],
    )
    assert j.errors == []
    assert j.facts["__container_image_ref"] == "gpufleet-train:site-1"
    assert j.facts["__container_image_base"] == "registry:5000/base:1"
    assert j.facts["__container_image_index_url"] == "https://mirror/torch/cu121"
    assert j.facts["__container_image_pip_args"] == [
        "--no-index",
        "--find-links",
        "http://mirror:8080/wheels/",
        "--trusted-host=mirror:8080",
        "--proxy",
        "http://proxy:3128",
    ]
    assert j.facts["__container_image_build_args"]["PIP_EXTRA_ARGS"] == (
        "--no-index --find-links http://mirror:8080/wheels/ --trusted-host=mirror:8080 --proxy http://proxy:3128"
    )


def test_pypi_wheels_carry_no_variant_label() -> None:
    j = judged(container_image_wheel_source="pypi", container_image_torch_release="2.4.1")
    assert j.facts["__container_image_label"] == ""
    assert j.facts["__container_image_index_url"] == "https://pypi.org/simple"


# --------------------------------------------------------------------------- rules

HOST = "the container role has no package layout for Rocky 9.3 (roles/container/vars has Ubuntu and Debian)"
RULES = [
    ("rocky9", {}, HOST),
    (
        "ubuntu2204",
        {"container_engine": "podman"},
        (
            "container_engine 'podman' is not an engine gpufleet installs on Ubuntu 22.04: Ubuntu 20.04 has no podman"
            " package, and Ubuntu 22.04's podman 3.4 cannot inject GPUs through CDI (podman supports CDI from 4.1 on)"
            " (choose docker)"
        ),
    ),
    (
        "debian12",
        {"container_engine": "lxc"},
        "container_engine 'lxc' is not an engine gpufleet installs on Debian 12 (choose docker or podman)",
    ),
    (
        "ubuntu2204",
        {"container_nvidia_toolkit_version": "1.19.1"},
        (
            "container_nvidia_toolkit_version '1.19.1' is not a package version of the NVIDIA Container Toolkit"
            " (the form X.Y.Z-N, for example 1.19.1-1)"
        ),
    ),
    (
        "ubuntu2204",
        {"ansible_facts": {**FACTS["ubuntu2204"], "architecture": "ppc64le"}},
        "NVIDIA publishes no Container Toolkit repository for the architecture ppc64le (it does for x86_64, aarch64)",
    ),
    (
        "ubuntu2204",
        {"container_nvidia_toolkit_repository_url": "ftp://mirror/deb"},
        (
            "container_nvidia_toolkit_repository_url 'ftp://mirror/deb' is not an http(s) URL"
            " (for example http://mirror.example.com/libnvidia-container/stable/deb/amd64)"
        ),
    ),
    (
        "ubuntu2204",
        {"container_nvidia_toolkit_repository_key_url": "mirror/gpgkey"},
        "container_nvidia_toolkit_repository_key_url 'mirror/gpgkey' is not an http(s) URL",
    ),
    (
        "ubuntu2204",
        {"container_nvidia_toolkit_repository_key_url": ""},
        (
            "container_nvidia_toolkit_repository_key_url and container_nvidia_toolkit_repository_keyring"
            " are both empty: the toolkit repository must be Signed-By a key"
            " (NVIDIA's is https://nvidia.github.io/libnvidia-container/gpgkey)"
        ),
    ),
    (
        "ubuntu2204",
        {"container_nvidia_toolkit_repository_keyring": "mirror.gpg"},
        (
            "container_nvidia_toolkit_repository_keyring 'mirror.gpg' is not an absolute path of a keyring on the host"
            " (for example /usr/share/keyrings/mirror-archive-keyring.gpg)"
        ),
    ),
    (
        "ubuntu2204",
        {"container_nvidia_runtimes": ["docker", "lxc", "runc"]},
        (
            "container_nvidia_runtimes names lxc, runc, which nvidia-ctk cannot configure"
            " (choose from docker, containerd, crio; empty for the engine's own)"
        ),
    ),
    (
        "ubuntu2204",
        {"container_cdi_spec_file": "/etc/cdi/nvidia.txt"},
        (
            "container_cdi_spec_file '/etc/cdi/nvidia.txt' must be an absolute path ending in .yaml or .json"
            " (for example /etc/cdi/nvidia.yaml)"
        ),
    ),
]
IMAGE_RULES = [
    (
        {"container_image_name": "GPUfleet train"},
        (
            "container_image_name 'GPUfleet train' is not an image name (lower case, for example gpufleet-train"
            " or registry.example.com:5000/ml/gpufleet-train)"
        ),
    ),
    (
        {"container_image_tag": "-latest"},
        "container_image_tag '-latest' is not an image tag (letters, digits, '_', '.', '-'; at most 128 characters)",
    ),
    ({"container_image_base": "ubuntu 22.04"}, "container_image_base 'ubuntu 22.04' is not an image reference"),
    (
        {"container_image_index_url": "mirror/{variant}"},
        (
            "container_image_index_url 'mirror/{variant}' is not an http(s) URL"
            " (rendered: 'mirror/cu121'; PyTorch's own is https://download.pytorch.org/whl/{variant},"
            " {variant} being the only placeholder, PyPI's https://pypi.org/simple;"
            " empty for the index of container_image_wheel_source)"
        ),
    ),
    (
        {"container_image_wheelhouse_url": "http://mirror/wheels"},
        (
            "container_image_wheelhouse_url 'http://mirror/wheels' is not the http(s) URL of a directory listing"
            " ending in '/' (for example http://mirror.example.com/wheels/)"
        ),
    ),
    (
        {"container_image_pip_extra_args": ["--proxy http://proxy:3128"]},
        (
            "container_image_pip_extra_args must be a list of options without spaces inside them"
            ' (for example ["--proxy", "http://proxy:3128"]), got [\'--proxy http://proxy:3128\']'
        ),
    ),
    (
        {"container_image_build_dir": "/opt/gpufleet/"},
        (
            "container_image_build_dir '/opt/gpufleet/' must be an absolute path of its own,"
            " not / or a system directory (for example /opt/gpufleet/container-build)"
        ),
    ),
    (
        {"container_image_build_dir": "opt/build"},
        (
            "container_image_build_dir 'opt/build' must be an absolute path of its own, not / or a system directory"
            " (for example /opt/gpufleet/container-build)"
        ),
    ),
]


@pytest.mark.parametrize("host", ["ubuntu2204", "debian12"])
def test_the_defaults_pass_every_rule(host: str) -> None:
    assert judged(host, container_build_image=True).errors == []


@pytest.mark.parametrize(("host", "settings", "message"), RULES, ids=[m[:40] for _h, _s, m in RULES])
def test_each_rule_refuses_with_its_message(host: str, settings: dict[str, Any], message: str) -> None:
    assert judged(host, **settings).errors == [message]


@pytest.mark.parametrize(("settings", "message"), IMAGE_RULES, ids=[m[:40] for _s, m in IMAGE_RULES])
def test_each_image_rule_refuses_with_its_message_when_the_image_is_built(
    settings: dict[str, Any], message: str
) -> None:
    assert judged(container_build_image=True, **settings).errors == [message]
    assert judged(container_build_image=False, **settings).errors == []


def test_the_matrix_refuses_a_release_it_has_no_wheels_for() -> None:
    """Its reason first; with no wheels, the image has no index either (the index rule says so too)."""
    j = judged(container_build_image=True, container_image_torch_release="2.0.1")
    assert j.errors[0] == (
        "container_image_torch_release '2.0.1' is not a PyTorch release gpufleet knows"
        " (files/compatibility.yml lists 2.1.0 ... 2.5.1; cu121 wheels exist for torch"
        " 2.1.0 ... 2.5.1)"
    )
    assert [error.split(" ")[0] for error in j.errors[1:]] == ["container_image_index_url"]
    assert judged(container_build_image=False, container_image_torch_release="2.0.1").errors == []


def test_a_cpu_image_needs_no_cuda_release() -> None:
    cuda = (
        "container_image_cuda_release '11.0' is not a CUDA release gpufleet knows (the compatibility matrix lists 12.1)"
    )
    assert judged(container_build_image=True, container_image_cuda_release="11.0").errors[0] == cuda
    cpu = judged(container_build_image=True, container_image_cuda_release="11.0", container_image_torch_variant="cpu")
    assert cpu.errors == []
    assert cpu.facts["__container_image_ref"] == "gpufleet-train:2.5.1-cpu"


def test_the_matrix_s_reasons_come_first_and_every_reason_is_said() -> None:
    j = judged(
        container_build_image=True,
        container_image_torch_release="2.0.1",
        container_cdi_spec_file="nvidia",
        container_image_name="Bad",
    )
    assert [error.split(" ")[0] for error in j.errors] == [
        "container_image_torch_release",
        "container_cdi_spec_file",
        "container_image_name",
        "container_image_index_url",
    ]
    assert j.message.startswith("container settings rejected on ubuntu2204: [1] container_image_torch_release '2.0.1' ")
