"""Verify for the cuda_libraries scenario (nccl): the matrix's NCCL build for CUDA 12.1
(2.18.1-1+cuda12.1) from the CUDA repository, pinned, held, with the real
NCCL library and header from NVIDIA's wheel."""

import re

import pytest

testinfra_hosts = ["ansible://all"]

BUILD = "2.18.1-1+cuda12.1"


@pytest.mark.parametrize("name", ["libnccl2", "libnccl-dev"])
def test_package_at_matrix_build_and_held(host, name):
    pkg = host.package(name)
    assert pkg.is_installed and pkg.version == BUILD
    assert name in host.check_output("apt-mark showhold").split()


def test_pin(host):
    pref = host.file("/etc/apt/preferences.d/gpufleet-nccl.pref").content_string
    assert f"Pin: version {BUILD}" in pref
    assert "Package: libnccl2 libnccl-dev" in pref


def test_header_version(host):
    header = host.check_output("cat $(dpkg -L libnccl-dev | grep '/nccl.h$' | head -n1)")
    assert re.search(r"#define\s+NCCL_MAJOR\s+2\b", header)
    assert re.search(r"#define\s+NCCL_MINOR\s+18\b", header)
    assert re.search(r"#define\s+NCCL_PATCH\s+1\b", header)


def test_library_loads_and_reports_its_version(host):
    """The real libnccl.so.2 loads without a GPU and reports 2.18.1."""
    out = host.check_output(
        "python3 -c \"import ctypes; lib = ctypes.CDLL('libnccl.so.2'); v = ctypes.c_int();"
        " assert lib.ncclGetVersion(ctypes.byref(v)) == 0; print(v.value)\""
    )
    assert out.strip() == "21801"
