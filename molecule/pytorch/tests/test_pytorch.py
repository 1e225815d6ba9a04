"""Verify for the pytorch scenario: PyPI's CUDA 12.1 build of torch 2.3.1
(with torchvision 0.18.1, torchaudio 2.3.1 and its nvidia-*-cu12 wheels) from
the lab mirror's hash-locked wheelhouse is installed in /opt/gpufleet/venv
(never in the system Python), imports, computes on the CPU, and reports the
CUDA, cuDNN and NCCL it was built with; the node has no GPU, and the report
says so."""

import json
import shlex
from pathlib import Path

import pytest

testinfra_hosts = ["ansible://all"]

VENV = "/opt/gpufleet/venv"
PYTHON = f"{VENV}/bin/python"
TORCH = "2.3.1"
# What torch itself says: PyPI's wheel carries torch/version.py __version__ = '2.3.1+cu121' while pip's
# metadata says 2.3.1.
TORCH_REPORTED = "2.3.1+cu121"
# PyPI's torch 2.3.1 requires nvidia-cudnn-cu12==8.9.2.26 and nvidia-nccl-cu12==2.20.5
# (https://pypi.org/project/torch/2.3.1/); torch reports them as 8902 and (2, 20, 5).
REQUIREMENTS = [f"torch=={TORCH}", "torchvision==0.18.1", "torchaudio==2.3.1", "numpy==1.26.4"]
REPORT = "/var/lib/gpufleet/pytorch.json"
ROLE_FILES = Path(__file__).resolve().parents[3] / "roles" / "pytorch" / "files"


def _run_script(host, name, *args):
    """Run one of the role's scripts with the environment's Python, as the role does."""
    script = (ROLE_FILES / name).read_text()
    cmd = " ".join(shlex.quote(part) for part in [PYTHON, "-I", "-c", script, *args])
    return json.loads(host.check_output(cmd).splitlines()[-1])


@pytest.fixture(scope="module")
def report(host):
    return json.loads(host.file(REPORT).content_string)


def test_python3_venv_installed_from_the_mirror(host):
    assert host.package("python3-venv").is_installed


def test_venv_exists_and_belongs_to_root(host):
    venv = host.file(VENV)
    assert venv.is_directory and venv.user == "root" and venv.mode == 0o755
    cfg = host.file(f"{VENV}/pyvenv.cfg").content_string
    assert "include-system-site-packages = false" in cfg
    assert host.file(PYTHON).exists
    # Made by the system Python's venv module, not by virtualenv.
    assert (
        host.check_output(f"{PYTHON} -c 'import sys; print(sys.prefix != sys.base_prefix, sys.base_prefix)'")
        == "True /usr"
    )


def test_torch_imports_with_the_pinned_cuda_build(host):
    out = host.check_output(
        f"{PYTHON} -c 'import torch; print(torch.__version__, torch.version.cuda,"
        " torch.backends.cudnn.version(), torch.cuda.nccl.version(), torch.backends.cuda.is_built())'"
    )
    assert out == f"{TORCH_REPORTED} 12.1 8902 (2, 20, 5) True"


def test_torch_computes(host):
    out = host.check_output(
        f"{PYTHON} -c 'import torch; print((torch.arange(6.).reshape(2, 3) @ torch.ones(3)).tolist())'"
    )
    assert out == "[3.0, 12.0]"


def test_pip_in_the_venv_reports_exact_versions(host):
    listed = json.loads(host.check_output(f"{PYTHON} -m pip list --format json --disable-pip-version-check"))
    pkgs = {p["name"].lower().replace("_", "-"): p["version"] for p in listed}
    assert pkgs["torch"] == TORCH
    assert (pkgs["torchvision"], pkgs["torchaudio"], pkgs["numpy"]) == ("0.18.1", "2.3.1", "1.26.4")
    # torch's dependencies came from the wheelhouse with it: the CUDA 12.1 libraries at the versions its
    # metadata pins, and triton.
    assert (pkgs["nvidia-cuda-runtime-cu12"], pkgs["nvidia-cudnn-cu12"], pkgs["nvidia-nccl-cu12"], pkgs["triton"]) == (
        "12.1.105",
        "8.9.2.26",
        "2.20.5",
        "2.3.1",
    )
    for dep in ("filelock", "sympy", "networkx", "jinja2", "fsspec", "typing-extensions"):
        assert dep in pkgs, dep
    show = host.check_output(f"{PYTHON} -m pip show torch --disable-pip-version-check")
    assert f"Version: {TORCH}" in show
    assert f"Location: {VENV}/lib/python3.11/site-packages" in show
    assert host.run(f"{PYTHON} -m pip check --disable-pip-version-check").rc == 0


def test_venv_is_readable_by_every_user(host):
    """Training jobs run as users: root's files in the environment are world-readable."""
    out = host.check_output(f"su nobody -s /bin/sh -c \"{PYTHON} -c 'import torch; print(torch.__version__)'\"")
    assert out == TORCH_REPORTED


def test_system_python_has_no_torch(host):
    assert host.run("python3 -c 'import torch'").rc != 0
    assert host.run("python3 -m pip --version").rc != 0, "the role must not install a system pip"
    assert not host.file("/usr/local/lib/python3.11/dist-packages/torch").exists
    assert not host.file("/usr/lib/python3/dist-packages/torch").exists


def test_report_file(host, report):
    f = host.file(REPORT)
    assert f.user == "root" and f.mode == 0o644
    assert host.file("/var/lib/gpufleet").mode == 0o755
    assert report["torch_version"] == TORCH_REPORTED
    assert report["cuda_version"] == "12.1"
    assert report["cudnn_version"] == "8.9.2"
    assert report["nccl_version"] == "2.20.5"
    # A CUDA build on a node without a GPU.
    assert report["cuda_available"] is False
    assert report["device_count"] == 0
    assert report["devices"] == []
    assert report["variant_installed"] == "cu121"
    assert report["cpu_only"] is False
    assert report["torchvision_version"] == "0.18.1+cu121" and report["torchaudio_version"] == "2.3.1+cu121"
    assert report["python_version"].startswith("3.11.")
    assert report["release"] == "2.3.1" and report["variant"] == "cu121"
    assert report["venv"] == VENV and report["python"] == PYTHON
    assert report["requirements"] == REQUIREMENTS
    assert report["source"] == "http://gpufleet-mirror/wheels/"


def test_second_import_check_reports_the_same(host, report):
    """The role's import check, run again now, gives exactly what the report holds."""
    again = _run_script(host, "pytorch_report.py")
    assert again == {key: report[key] for key in again}


def test_installed_probe_finds_nothing_to_do(host):
    """The check the role makes before calling pip: the pins are satisfied, so a re-run installs nothing."""
    probe = _run_script(host, "pytorch_installed.py", json.dumps(REQUIREMENTS))
    assert probe["unsatisfied"] == []
    assert probe["installed"] == {"torch": TORCH, "torchvision": "0.18.1", "torchaudio": "2.3.1", "numpy": "1.26.4"}
    # The same release from PyTorch's index carries the local version: another build.
    assert _run_script(host, "pytorch_installed.py", json.dumps(["torch==2.3.1+cu121"]))["unsatisfied"] == [
        "torch==2.3.1+cu121"
    ]


def test_pip_left_no_cache(host):
    assert not host.file("/root/.cache/pip").exists
