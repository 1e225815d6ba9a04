"""Verify for the cuda_libraries scenario (the cuda role with cuda_libraries
[cudnn, nccl] and cuda_toolkit false): the matrix's cuDNN and NCCL builds
for CUDA 12.1 are installed from the CUDA repository, pinned (both packages
of each, mode 0644), held, their headers give the version, and neither
pulls the CUDA toolkit in. (The lab's libcudnn8 is a fixture: real header
and dispatcher library, without the large sub-libraries; libnccl2 is NVIDIA's
real library; see README.)"""

import re

import pytest

testinfra_hosts = ["ansible://all"]

# library -> (build, packages, header, the header's version macros)
LIBRARIES = {
    "cudnn": (
        "8.9.2.26-1+cuda12.1",
        ["libcudnn8", "libcudnn8-dev"],
        "cudnn_version.h",
        {"CUDNN_MAJOR": 8, "CUDNN_MINOR": 9, "CUDNN_PATCHLEVEL": 2},
    ),
    "nccl": (
        "2.18.1-1+cuda12.1",
        ["libnccl2", "libnccl-dev"],
        "nccl.h",
        {"NCCL_MAJOR": 2, "NCCL_MINOR": 18, "NCCL_PATCH": 1},
    ),
}
PACKAGES = [(library, name) for library, (_b, names, _h, _v) in LIBRARIES.items() for name in names]


@pytest.mark.parametrize("library, name", PACKAGES)
def test_package_at_matrix_build_and_held(host, library, name):
    pkg = host.package(name)
    assert pkg.is_installed and pkg.version == LIBRARIES[library][0]
    assert name in host.check_output("apt-mark showhold").split()


@pytest.mark.parametrize("library", LIBRARIES)
def test_pin(host, library):
    build, packages, _header, _version = LIBRARIES[library]
    pref = host.file(f"/etc/apt/preferences.d/gpufleet-{library}.pref")
    assert pref.mode == 0o644
    assert f"Pin: version {build}" in pref.content_string
    assert f"Package: {' '.join(packages)}" in pref.content_string
    assert f"Candidate: {build}" in host.check_output(f"apt-cache policy {packages[0]}")


@pytest.mark.parametrize("library", LIBRARIES)
def test_header_version(host, library):
    _build, packages, header_name, version = LIBRARIES[library]
    header = host.check_output(f"cat $(dpkg -L {packages[1]} | grep '/{header_name}$' | head -n1)")
    for macro, value in version.items():
        assert re.search(rf"#define\s+{macro}\s+{value}\b", header), macro


def test_cudnn_is_known_to_the_linker(host):
    assert "libcudnn.so.8" in host.check_output("ldconfig -p")


def test_nccl_loads_and_reports_its_version(host):
    """The real libnccl.so.2 loads without a GPU and reports 2.18.1."""
    out = host.check_output(
        "python3 -c \"import ctypes; lib = ctypes.CDLL('libnccl.so.2'); v = ctypes.c_int();"
        ' assert lib.ncclGetVersion(ctypes.byref(v)) == 0; print(v.value)"'
    )
    assert out.strip() == "21801"


def test_toolkit_not_required(host):
    """Neither library pulls the CUDA toolkit in."""
    assert not host.package("cuda-toolkit-12-1").is_installed
