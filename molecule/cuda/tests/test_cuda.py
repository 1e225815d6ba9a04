"""Verify for the cuda scenario: CUDA 12.1 from the lab's site repository
(cuda_repository_url: NVIDIA publishes no CUDA 12.1 for Debian 12) is
installed, pinned, held, the default toolkit, on PATH and the linker path, and
compiles a CUDA C++ kernel for sm_80 and sm_90."""

import json
import re

import pytest

testinfra_hosts = ["ansible://all"]

HOME = "/usr/local/cuda-12.1"
# One apt source per repository URL, named after it (gpufleet_filters.apt_source_files) : the lab's site repository,
# cuda_repository_url {{ lab_mirror_url }}/site/cuda-12.1/debian12 with lab_mirror_url http://gpufleet-mirror
# (tests/lab/lab.yml's generated.yml).
SOURCE = "/etc/apt/sources.list.d/gpufleet-gpufleet--mirror_site_cuda--12.1_debian12.sources"


def test_toolkit_metapackage_pinned_and_held(host):
    pkg = host.package("cuda-toolkit-12-1")
    assert pkg.is_installed and pkg.version == "12.1.1-1"
    pref = host.file("/etc/apt/preferences.d/gpufleet-cuda.pref").content_string
    assert "Package: cuda-toolkit-12-1" in pref and "Pin: version 12.1.1-1" in pref
    held = host.check_output("apt-mark showhold").split()
    for name in ["cuda-toolkit-12-1", "cuda-nvcc-12-1", "cuda-cudart-12-1", "cuda-nvrtc-12-1"]:
        assert name in held


def test_never_the_cuda_metapackage_nor_a_driver(host):
    assert not host.package("cuda").is_installed
    assert host.run("dpkg-query -W 'nvidia-*' 'libcuda1'").rc != 0


def test_repository_signed_by_cuda_keyring(host):
    assert host.package("cuda-keyring").is_installed
    assert host.file("/usr/share/keyrings/cuda-archive-keyring.gpg").exists
    src = host.file(SOURCE).content_string
    assert "URIs: http://gpufleet-mirror/site/cuda-12.1/debian12/" in src
    assert "Suites: /" in src
    assert "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg" in src
    # cuda-keyring's own list (the fixture's, for the site repository) is replaced by the managed source, and so is
    # the file name of earlier releases.
    assert not host.file("/etc/apt/sources.list.d/cuda-debian12-x86_64.list").exists
    assert not host.file("/etc/apt/sources.list.d/gpufleet-cuda.sources").exists
    assert host.file("/var/lib/gpufleet/apt-sources/cuda").content_string == SOURCE + "\n"


def test_usr_local_cuda_is_the_12_1_alternative(host):
    link = host.file("/usr/local/cuda")
    assert link.is_symlink
    assert host.check_output("readlink -f /usr/local/cuda") == HOME
    assert "link currently points to /usr/local/cuda-12.1" in host.check_output("update-alternatives --display cuda")


def test_login_shell_path_and_linker_path(host):
    assert "/usr/local/cuda/bin" in host.check_output("bash -lc 'echo $PATH'")
    assert "release 12.1" in host.check_output("bash -lc 'ptxas --version'")
    assert "libcudart.so.12" in host.check_output("ldconfig -p")
    assert "libnvrtc.so.12" in host.check_output("ldconfig -p")


def test_runtime_header_is_12_1(host):
    header = host.file(f"{HOME}/include/cuda_runtime_api.h").content_string
    assert re.search(r"#define\s+CUDART_VERSION\s+12010\b", header)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_toolkit_compiles_a_kernel(host, arch):
    out = host.check_output(
        f"python3 /usr/local/lib/gpufleet/cuda-compile-check.py --json --cuda-home /usr/local/cuda --arch {arch}"
    )
    result = json.loads(out)
    assert result["ok"] is True
