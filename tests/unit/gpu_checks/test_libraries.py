"""libraries and torch_cuda: torch's CUDA build, its own cuDNN and NCCL against the matrix's, the system's
libraries; torch absent."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpufleet_check import checks, cli, facts

from .fakes import FakeHost, fake_torch, probe, with_torch

# --------------------------------------------------------------------------- a CUDA build of torch without a GPU


def install_fake_torch(
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    cuda: str | None,
    cudnn_code: int | None = None,
    nccl: tuple[int, int, int] | None = None,
    importable: bool = True,
) -> None:
    """A torch package on sys.path as a wheel installs it (torch/version.py), whose import answers what
    torch.version.cuda, torch.backends.cudnn.version() and torch.cuda.nccl.version() answer without a GPU."""
    package = root / "site" / "torch"
    package.mkdir(parents=True)
    (package / "version.py").write_text(
        f"from typing import Optional\n\n__version__ = {version!r}\ncuda: Optional[str] = {cuda!r}\n"
    )
    body = (
        "raise ImportError('libtorch_cuda.so: cannot open shared object file')\n"
        if not importable
        else "from types import SimpleNamespace as _NS\nfrom . import version\n__version__ = version.__version__\n"
        f"backends = _NS(cudnn=_NS(is_available=lambda: {cudnn_code is not None}, version=lambda: {cudnn_code!r}))\n"
        f"_NCCL = {nccl!r}\n"
        "def _nccl():\n"
        "    if _NCCL is None:\n        raise RuntimeError('NCCL is not available')\n    return _NCCL\n"
        "cuda = _NS(is_available=lambda: False, device_count=lambda: 0, nccl=_NS(version=_nccl))\n"
    )
    (package / "__init__.py").write_text(body)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "torch.version", raising=False)
    monkeypatch.syspath_prepend(str(package.parent))


# PyPI's default Linux wheel of torch 2.3.1 is the CUDA 12.1 build, with cuDNN 8.9.2.26 and NCCL 2.20.5
# (its Requires-Dist, https://pypi.org/project/torch/2.3.1/): torch reports 8902 and (2, 20, 5), and calls
# itself 2.3.1+cu121 (the wheel's torch/version.py).
LAB_EXPECTATIONS = ("--expect-cuda", "12.1", "--expect-torch-cudnn", "8.9.2.26", "--expect-torch-nccl", "2.20.5")


def test_a_cuda_build_without_a_gpu_is_checked_not_skipped(
    driver_only: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: the lab's torch (PyPI's cu121 build of 2.3.1) on a node without a GPU: what torch was built
    with is read by importing it, which needs no GPU, and judged; only running CUDA says "no GPU"."""
    install_fake_torch(tmp_path, monkeypatch, "2.3.1+cu121", "12.1", 8902, (2, 20, 5))
    p = probe(driver_only, *LAB_EXPECTATIONS)
    result = checks.check_libraries(p)
    assert result["verdict"] == "pass", result
    assert result["detail"] == (
        "torch 2.3.1+cu121, CUDA 12.1, cuDNN 8.9.2, NCCL 2.20.5; torch's own cuDNN 8.9.2 "
        "(expected 8.9.2.26), NCCL 2.20.5 (expected 2.20.5); system cuDNN not installed, "
        "NCCL not installed; no GPU here to use them (see torch_cuda)"
    )
    versions = checks.report_versions(p)
    assert (versions["torch"], versions["cuda"], versions["cudnn"], versions["nccl"]) == (
        "2.3.1+cu121",
        "12.1",
        "8.9.2",
        "2.20.5",
    )
    assert checks.check_torch_cuda(p)["detail"] == "no GPU (torch 2.3.1+cu121, CUDA 12.1)"


@pytest.mark.parametrize(
    ("version", "cuda", "cudnn", "nccl", "reason"),
    [
        # PyPI's torch 2.5.1 is a CUDA 12.4 build (nvidia-cuda-runtime-cu12==12.4.127, https://pypi.org/project/torch/2.5.1/)
        ("2.5.1+cu124", "12.4", 90100, (2, 21, 5), "torch built for CUDA 12.4, expected 12.1"),
        ("2.3.1+cu121", "12.1", 8902, (2, 18, 1), "torch's own NCCL is 2.18.1, the matrix's bundled build is 2.20.5 ("),
        ("2.3.1+cpu", None, None, None, "torch is a CPU-only build, expected one for CUDA 12.1 (--expect-cuda); "),
    ],
    ids=["cu124-build", "nccl-swapped", "cpu-build"],
)
def test_a_wrong_build_fails_without_a_gpu(
    driver_only: FakeHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    cuda: str | None,
    cudnn: int | None,
    nccl: tuple[int, int, int] | None,
    reason: str,
) -> None:
    """Issue 16, item 1 and issue 15: --expect-cuda is never skipped; without a GPU it is judged on the build."""
    install_fake_torch(tmp_path, monkeypatch, version, cuda, cudnn, nccl)
    result = checks.check_libraries(probe(driver_only, *LAB_EXPECTATIONS))
    assert result["verdict"] == "fail", result
    assert result["detail"].startswith(reason), result["detail"]


def test_a_cuda_build_that_does_not_import_fails_without_a_gpu(
    driver_only: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch_cuda says "no GPU" from torch's files; the libraries check imports it, so a broken CUDA build fails
    there."""
    install_fake_torch(tmp_path, monkeypatch, "2.3.1+cu121", "12.1", importable=False)
    p = probe(driver_only)
    result = checks.check_libraries(p)
    assert result["verdict"] == "fail", result
    assert result["detail"] == "torch not importable: ImportError: libtorch_cuda.so: cannot open shared object file"
    assert checks.check_torch_cuda(p)["verdict"] == "skipped"


# --------------------------------------------------------------------------- library versions


@pytest.mark.parametrize(
    "code, version", [(8902, "8.9.2"), (8700, "8.7.0"), (90100, "9.1.0"), (90501, "9.5.1"), (None, None)]
)
def test_cudnn_version_decoding(code: int | None, version: str | None) -> None:
    assert checks.decode_cudnn_version(code) == version


def test_nccl_version_formatting() -> None:
    assert checks.format_nccl_version((2, 18, 1)) == "2.18.1"
    assert checks.format_nccl_version(2708) == "2.7.8"
    assert checks.format_nccl_version(21803) == "2.18.3"
    assert checks.format_nccl_version(None) is None


# --------------------------------------------------------------------------- torch absent


def test_torch_absent_fails_torch_cuda(healthy_h100: FakeHost) -> None:
    p = probe(healthy_h100)
    result = checks.check_torch_cuda(p)
    assert result["verdict"] == "fail" and result["detail"].startswith("torch not importable: ")
    for check in (
        checks.check_libraries,
        checks.check_gemm,
        checks.check_memory_bandwidth,
        checks.check_allreduce_busbw,
    ):
        result = check(p)
        assert result["verdict"] == "skipped" and result["detail"] == "torch not importable (see torch_cuda)"
    assert checks.check_training(p)["verdict"] == "fail"


def test_torch_absent_without_gpu(host: FakeHost) -> None:
    p = probe(host)
    assert checks.check_torch_cuda(p)["verdict"] == "fail"  # the venv must have torch, GPU or not
    assert checks.check_libraries(p)["detail"] == "no GPU (torch is not installed)"


# --------------------------------------------------------------------------- torch's own cuDNN / NCCL, the system's


# dpkg-query -W -f '${Package}\t${db:Status-Abbrev}\t${Version}\n': the status letters are dpkg-query(1)'s
# (desired action, package status, error flag; https://manpages.ubuntu.com/manpages/jammy/man1/dpkg-query.1.html);
# lines as Debian 12's dpkg-query prints them (the abbreviation ends with the error flag, a space when none).
DPKG_LINES = (
    "libcudnn8\tii \t8.9.2.26-1+cuda12.1\n"
    "libnccl2:amd64\thi \t2.18.1-1+cuda12.1\n"
    "libcudnn8-dev\trc \t8.9.2.26-1+cuda12.1\n"
    "libfoo\tun \t\n"
)


def test_dpkg_query_lines_give_the_installed_versions_only() -> None:
    assert facts.parse_dpkg_query(DPKG_LINES) == {"libcudnn8": "8.9.2.26-1+cuda12.1", "libnccl2": "2.18.1-1+cuda12.1"}
    assert facts.parse_dpkg_query("dpkg-query: no packages found matching libnccl2\n") == {}


def test_system_libraries_come_from_dpkg_query(host: FakeHost) -> None:
    """dpkg-query exits 1 when a name is unknown, after printing the others: those still count."""
    script = host.bin / "dpkg-query"
    script.write_text(
        "#!/bin/sh\nprintf 'libcudnn8\\tii \\t8.9.2.26-1+cuda12.1\\n'\n"
        "echo 'dpkg-query: no packages found matching libnccl2' >&2\nexit 1\n"
    )
    script.chmod(0o755)
    assert facts.system_library_versions() == {"cudnn": "8.9.2.26-1+cuda12.1", "nccl": None}
    script.unlink()  # no dpkg at all (not a Debian system)
    assert facts.system_library_versions() == {"cudnn": None, "nccl": None}


def cuda_torch(cudnn_code: int | None, nccl: tuple[int, int, int] | None, cuda: str | None = "12.1") -> SimpleNamespace:
    """torch as the libraries check reads it: torch.backends.cudnn.version() (90100 for 9.1.0, 8902 for
    8.9.2) and torch.cuda.nccl.version() ((2, 21, 5)); a CPU build has neither."""
    torch = fake_torch(8)
    torch.__version__ = "2.5.1+cu121" if cuda else "2.13.0+cpu"
    torch.version = SimpleNamespace(cuda=cuda)
    torch.backends = SimpleNamespace(
        cudnn=SimpleNamespace(is_available=lambda: cudnn_code is not None, version=lambda: cudnn_code)
    )

    def nccl_version() -> tuple[int, int, int]:
        if nccl is None:
            raise RuntimeError("NCCL is not available")
        return nccl

    torch.cuda.nccl = SimpleNamespace(version=nccl_version)
    return torch


def test_torch_own_libraries_match_the_bundled_builds(healthy_h100: FakeHost) -> None:
    p = with_torch(
        probe(
            healthy_h100, "--expect-cuda", "12.1", "--expect-torch-cudnn", "9.1.0.70", "--expect-torch-nccl", "2.21.5"
        ),
        cuda_torch(90100, (2, 21, 5)),
    )
    result = checks.check_libraries(p)
    assert result["verdict"] == "pass", result
    assert result["torch_libraries"] == {
        "cudnn": {"torch": "9.1.0", "expected": "9.1.0.70", "outcome": "match"},
        "nccl": {"torch": "2.21.5", "expected": "2.21.5", "outcome": "match"},
        "system": {"cudnn": None, "nccl": None},
    }
    assert result["detail"] == (
        "torch 2.5.1+cu121, CUDA 12.1, cuDNN 9.1.0, NCCL 2.21.5; torch's own cuDNN 9.1.0 "
        "(expected 9.1.0.70), NCCL 2.21.5 (expected 2.21.5); system cuDNN not installed, "
        "NCCL not installed"
    )


def test_torch_own_libraries_that_differ_fail_and_the_system_ones_are_listed_apart(healthy_h100: FakeHost) -> None:
    """torch 2.3.1+cu121 brings cuDNN 8.9.2.26 and NCCL 2.20.5; the system's packages are another build and
    are not compared."""
    script = healthy_h100.bin / "dpkg-query"
    script.write_text(
        "#!/bin/sh\nprintf 'libcudnn8\\tii \\t8.9.2.26-1+cuda12.1\\nlibnccl2\\tii \\t2.18.1-1+cuda12.1\\n'\n"
    )
    script.chmod(0o755)
    p = with_torch(
        probe(healthy_h100, "--expect-torch-cudnn", "8.9.2.26", "--expect-torch-nccl", "2.20.5"),
        cuda_torch(8902, (2, 18, 1)),
    )
    result = checks.check_libraries(p)
    assert result["verdict"] == "fail"
    assert result["torch_libraries"]["cudnn"]["outcome"] == "match"
    assert result["torch_libraries"]["nccl"] == {"torch": "2.18.1", "expected": "2.20.5", "outcome": "differs"}
    assert result["torch_libraries"]["system"] == {"cudnn": "8.9.2.26-1+cuda12.1", "nccl": "2.18.1-1+cuda12.1"}
    assert result["detail"].startswith("torch's own NCCL is 2.18.1, the matrix's bundled build is 2.20.5 (")
    assert result["detail"].endswith("; system cuDNN 8.9.2.26-1+cuda12.1, NCCL 2.18.1-1+cuda12.1")
    assert checks.report_versions(p)["system_nccl"] == "2.18.1-1+cuda12.1"
    assert checks.report_versions(p)["nccl"] == "2.18.1"


def test_no_expected_build_is_not_compared(healthy_h100: FakeHost) -> None:
    """A variant whose bundled builds the matrix does not record (the role passes nothing): reported, not judged."""
    result = checks.check_libraries(with_torch(probe(healthy_h100), cuda_torch(8700, (2, 21, 5))))
    assert result["verdict"] == "pass"
    assert result["torch_libraries"]["cudnn"] == {"torch": "8.7.0", "expected": None, "outcome": "not compared"}
    assert "torch's own cuDNN 8.7.0 (no expected build), NCCL 2.21.5 (no expected build)" in result["detail"]


def test_a_cpu_torch_says_it_has_no_cuda_instead_of_comparing(healthy_h100: FakeHost) -> None:
    """With GPUs the CPU-only build fails as before; the comparison itself only says there is no CUDA."""
    result = checks.check_libraries(
        with_torch(
            probe(healthy_h100, "--expect-torch-cudnn", "9.1.0.70", "--expect-torch-nccl", "2.21.5"),
            cuda_torch(None, None, cuda=None),
        )
    )
    assert result["torch_libraries"]["cudnn"]["outcome"] == result["torch_libraries"]["nccl"]["outcome"] == "no CUDA"
    assert result["detail"] == (
        "CPU-only torch build; cuDNN not available; NCCL not available; torch 2.13.0+cpu, "
        "CPU-only build; torch's own cuDNN/NCCL: none, the torch build has no CUDA; "
        "system cuDNN not installed, NCCL not installed"
    )


def test_a_cpu_torch_without_a_gpu_is_not_failed_by_the_comparison(
    driver_only: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU, a CPU-only torch (its version.py as the wheel installs it), no --expect-cuda: expected builds
    given or not, the check is skipped "no GPU" and says plainly that the build has no CUDA."""
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('imported')\n")
    (package / "version.py").write_text(
        "from typing import Optional\n\n__version__ = '2.13.0+cpu'\ndebug = False\n"
        "cuda: Optional[str] = None\nhip: Optional[str] = None\n"
    )
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(package.parent))
    for extra in ((), ("--expect-torch-cudnn", "9.1.0.70", "--expect-torch-nccl", "2.21.5")):
        result = checks.check_libraries(probe(driver_only, *extra))
        assert result["verdict"] == "skipped", result
        assert result["detail"] == (
            "no GPU (torch 2.13.0+cpu, CPU-only build; torch's own cuDNN/NCCL: none, the torch "
            "build has no CUDA; system cuDNN not installed, NCCL not installed)"
        )
        assert result["torch_libraries"]["nccl"]["outcome"] == "no CUDA"


@pytest.mark.parametrize("value", ["9.1", "2.21.5-1", "cu121", ""])
def test_expected_library_versions_are_major_minor_patch(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(["--expect-torch-nccl", value])
    assert exit_info.value.code == 2
    assert "expected MAJOR.MINOR.PATCH" in capsys.readouterr().err
