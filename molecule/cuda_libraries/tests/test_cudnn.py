"""Verify for the cuda_libraries scenario (cudnn): the matrix's cuDNN build for CUDA 12.1
(8.9.2.26-1+cuda12.1) is installed from the CUDA repository, pinned, held,
and its header says 8.9.2. (The lab's libcudnn8 is a fixture: real header
and dispatcher library, without the large sub-libraries; see README.)"""

import re

import pytest

testinfra_hosts = ["ansible://all"]

BUILD = "8.9.2.26-1+cuda12.1"


@pytest.mark.parametrize("name", ["libcudnn8", "libcudnn8-dev"])
def test_package_at_matrix_build_and_held(host, name):
    pkg = host.package(name)
    assert pkg.is_installed and pkg.version == BUILD
    assert name in host.check_output("apt-mark showhold").split()


def test_pin(host):
    pref = host.file("/etc/apt/preferences.d/gpufleet-cudnn.pref")
    assert pref.mode == 0o644
    assert f"Pin: version {BUILD}" in pref.content_string
    assert f"Candidate: {BUILD}" in host.check_output("apt-cache policy libcudnn8")


def test_header_version(host):
    header = host.check_output("cat $(dpkg -L libcudnn8-dev | grep '/cudnn_version.h$' | head -n1)")
    assert re.search(r"#define\s+CUDNN_MAJOR\s+8\b", header)
    assert re.search(r"#define\s+CUDNN_MINOR\s+9\b", header)
    assert re.search(r"#define\s+CUDNN_PATCHLEVEL\s+2\b", header)


def test_library_is_known_to_the_linker(host):
    assert "libcudnn.so.8" in host.check_output("ldconfig -p")


def test_toolkit_not_required(host):
    """cuDNN alone does not pull the CUDA toolkit in."""
    assert not host.package("cuda-toolkit-12-1").is_installed
