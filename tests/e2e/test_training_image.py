"""The training image (roles/container/files/Containerfile.train), built for real with
podman and run on CPU.

The image is built from the lab's own node image (Debian 12 whose only apt
source is the lab mirror, trusted through the mirror's key) on the lab's
internal network, so nothing can come from outside: python3-venv from the
mirror's /debian, torch from its wheelhouse (--no-index --find-links; pip
ignores a plain-http wheelhouse unless its host is trusted, hence
--trusted-host): PyPI's CUDA 12.1 build of torch 2.3.1 with its
nvidia-*-cu12 wheels, installed with --require-hashes against the lab's hash
lock (the build secret torch-lock), as the nodes get them. The ARGs are the
lab's pytorch settings, as an air-gapped site passes its own. Then the payload runs in the image without a network:
one process, a 2-process torchrun (gloo), the default command and the GPU
checks (which read the CUDA build and say "no GPU" for the rest); their
JSON results are asserted. The image is
removed at the end.

What needs outside servers or a GPU (the default Ubuntu base, the NVIDIA Container Toolkit, nvidia-ctk, CDI) is covered
by tests/unit/test_container_role.py on the rendered configuration.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid

import pytest
import yaml
from conftest import LAB_INVENTORY, LAB_NETWORK, NODE_IMAGE, REPO, podman

CONTAINERFILE = "roles/container/files/Containerfile.train"
MIRROR = "gpufleet-mirror"
BUILD_TIMEOUT_S = 1200
RUN_TIMEOUT_S = 300


def lab_settings() -> dict:
    """The lab's pytorch settings (tests/lab/inventory/group_vars/all/main.yml): the image gets the same torch."""
    return yaml.safe_load((LAB_INVENTORY / "group_vars" / "all" / "main.yml").read_text())


def torch_variant_label() -> str:
    """The local version of the lab's wheels: none for PyPI's builds (pytorch_wheel_source pypi)."""
    settings = lab_settings()
    return "" if settings.get("pytorch_wheel_source") == "pypi" else settings["pytorch_variant"]


# The lab's hash lock, written by tests/lab/lab.yml on this controller (pytorch_hashes_file).
LAB_LOCK = REPO / ".lab" / "wheelhouse.lock"
# What the image's torch reports, as the matrix's row for PyPI's torch 2.3.1 gives it (files/compatibility.yml:
# CUDA 12.1, torch's own cuDNN 8.9.2.26, NCCL 2.20.5).
# PyPI's torch 2.3.1 calls itself 2.3.1+cu121 (its torch/version.py), though pip's metadata says 2.3.1.
TORCH_REPORTS = "2.3.1+cu121 12.1 8902 (2, 20, 5)"


def mirror_address() -> str:
    """The mirror's address on the lab network. podman build resolves names with the host's resolver, not the
    network's DNS, so the build container is told the mirror's address with --add-host."""
    inspect = podman("inspect", "--type", "container", MIRROR, check=False)
    if inspect.returncode != 0:
        pytest.fail(f"the lab is not built: no container {MIRROR} ({inspect.stderr.strip()}); run `make lab` first")
    networks = json.loads(inspect.stdout)[0]["NetworkSettings"]["Networks"]
    if LAB_NETWORK not in networks or not networks[LAB_NETWORK].get("IPAddress"):
        pytest.fail(f"the lab is not built: {MIRROR} has no address on {LAB_NETWORK}; run `make lab` first")
    return networks[LAB_NETWORK]["IPAddress"]


@pytest.fixture(scope="module")
def training_image():
    """Builds the image once for the module, yields its name, removes it."""
    if podman("image", "exists", NODE_IMAGE, check=False).returncode != 0:
        pytest.fail(f"the lab is not built: no image {NODE_IMAGE}; run `make lab` first")
    if podman("network", "exists", LAB_NETWORK, check=False).returncode != 0:
        pytest.fail(f"the lab is not built: no network {LAB_NETWORK}; run `make lab` first")
    settings = lab_settings()
    wheelhouse = f"http://{MIRROR}/wheels/"
    tag = f"localhost/gpufleet-train-e2e:{uuid.uuid4().hex[:10]}"
    build_args = {
        "BASE_IMAGE": NODE_IMAGE,
        "TORCH_VERSION": settings["pytorch_release"],
        "TORCH_VARIANT": torch_variant_label(),
        "PIP_EXTRA_ARGS": f"--no-index --find-links {wheelhouse} --trusted-host {MIRROR}",
    }
    if not LAB_LOCK.is_file():
        pytest.fail(f"the lab is not built: no hash lock {LAB_LOCK}; run `make lab` first")
    argv = [
        "podman",
        "build",
        "--pull=never",
        "--layers=false",
        "--network",
        LAB_NETWORK,
        "--secret",
        f"id=torch-lock,src={LAB_LOCK}",
        "--add-host",
        f"{MIRROR}:{mirror_address()}",
        "--file",
        CONTAINERFILE,
        "--tag",
        tag,
    ]
    argv += [f"--build-arg={key}={value}" for key, value in build_args.items()] + ["."]
    started = time.monotonic()
    build = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    print(f"podman build: {time.monotonic() - started:.0f} s")
    try:
        assert build.returncode == 0, (
            f"podman build failed (exit {build.returncode}):\n{(build.stdout + build.stderr)[-4000:]}"
        )
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)


def run_in_image(image: str, *command: str) -> subprocess.CompletedProcess:
    """Runs a command in the image without any network."""
    return subprocess.run(
        ["podman", "run", "--rm", "--network", "none", image, *command],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def payload_result(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


def test_image_metadata(training_image):
    """Labels name the torch build and the base image; the payload runs as uid 1000; the default command is the
    payload."""
    config = json.loads(podman("image", "inspect", training_image).stdout)[0]["Config"]
    settings = lab_settings()
    assert config["Labels"]["org.gpufleet.torch-version"] == settings["pytorch_release"]
    assert config["Labels"]["org.gpufleet.torch-variant"] == torch_variant_label()
    assert config["Labels"]["org.opencontainers.image.base.name"] == NODE_IMAGE
    assert config["User"] == "1000:1000"
    assert config["Cmd"] == ["python", "/opt/gpufleet/payload/train.py", "--json"]


def test_unprivileged_user_cannot_change_the_payload(training_image):
    run = run_in_image(
        training_image,
        "sh",
        "-c",
        "id -un; id -u; command -v python; command -v torchrun; test -w /opt/gpufleet/payload/train.py && echo "
        "writable || echo read-only",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        "gpufleet",
        "1000",
        "/opt/gpufleet/venv/bin/python",
        "/opt/gpufleet/venv/bin/torchrun",
        "read-only",
    ]


def test_payload_single_process_on_cpu(training_image):
    """train.py as one process: verdict pass, world size 1, the lab's torch build."""
    result = payload_result(
        run_in_image(
            training_image, "python", "/opt/gpufleet/payload/train.py", "--json", "--steps", "8", "--device", "cpu"
        )
    )
    settings = lab_settings()
    assert result["verdict"] == "pass", result["reasons"]
    assert result["world_size"] == 1 and result["device"] == "cpu" and result["final_step"] == 8
    assert result["torch_version"] == f"{settings['pytorch_release']}+cu121"
    # The CUDA build, run on the CPU: torch.version.cuda says what it was built for.
    assert result["cuda_version"] == "12.1" and result["device"] == "cpu"


def test_the_image_has_the_locked_cuda_build(training_image):
    """The image's torch is the lab's locked cu121 build (what the nodes get), and the lock itself stayed out of it."""
    run = run_in_image(
        training_image,
        "python",
        "-c",
        "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(),"
        " torch.cuda.nccl.version())",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == TORCH_REPORTS
    torch_hash = re.search(r"^torch==\S+ --hash=sha256:([0-9a-f]{64})", LAB_LOCK.read_text(), re.M)[1]
    leftover = run_in_image(
        training_image,
        "sh",
        "-c",
        f"ls -A /run/secrets 2>/dev/null; grep -rlF {torch_hash} /opt /tmp /root /home 2>/dev/null",
    )
    assert leftover.stdout.strip() == "", leftover.stdout


def test_payload_torchrun_two_processes_on_cpu(training_image):
    """torchrun inside the container: 2 gloo ranks under DDP, both reporting, parameters in agreement."""
    result = payload_result(
        run_in_image(
            training_image,
            "torchrun",
            "--standalone",
            "--nproc-per-node=2",
            "/opt/gpufleet/payload/train.py",
            "--json",
            "--steps",
            "8",
            "--device",
            "cpu",
        )
    )
    assert result["verdict"] == "pass", result["reasons"]
    assert result["world_size"] == 2
    assert result["backend"] == "gloo" and result["wrapper"] == "DistributedDataParallel"
    assert len(result["hosts"]) == 2
    assert result["param_max_abs_diff"] <= 1e-6


def test_default_command_trains(training_image):
    """`podman run <image>` alone runs the payload (40 steps) and prints its JSON verdict."""
    result = payload_result(run_in_image(training_image))
    assert result["verdict"] == "pass", result["reasons"]
    assert result["final_step"] == 40 and result["loss_drop"] > 0.1


def test_health_checks_run_in_the_image(training_image):
    """gpufleet_check.pyz in the image: what torch was built with is checked without a GPU (issue 15) and
    passes against the matrix's row; every check that runs on a GPU says "no GPU" (never a pass); with
    --require-gpus the run fails (issue 16, item 1)."""
    expectations = ["--expect-cuda", "12.1", "--expect-torch-cudnn", "8.9.2.26", "--expect-torch-nccl", "2.20.5"]
    run = run_in_image(training_image, "python", "/opt/gpufleet/payload/gpufleet_check.pyz", "--json", *expectations)
    report = json.loads(run.stdout)
    assert run.returncode == 0 and report["verdict"] == "pass", report["reasons"]
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["libraries"]["verdict"] == "pass", checks["libraries"]
    assert checks["libraries"]["detail"].startswith("torch 2.3.1+cu121, CUDA 12.1, cuDNN 8.9.2, NCCL 2.20.5; "), checks[
        "libraries"
    ]
    for name in (
        "nvidia_smi",
        "torch_cuda",
        "gemm",
        "memory_bandwidth",
        "allreduce_busbw",
        "p2p_topology",
        "gpu_errors",
        "pcie",
        "clocks",
        "nvlink",
        "xid",
        "interconnect",
        "dcgm",
    ):
        assert checks[name]["verdict"] == "skipped" and "no GPU" in checks[name]["detail"], name
    versions = report["versions"]
    assert (versions["torch"], versions["cuda"], versions["cudnn"], versions["nccl"]) == (
        "2.3.1+cu121",
        "12.1",
        "8.9.2",
        "2.20.5",
    )
    required = run_in_image(
        training_image, "python", "/opt/gpufleet/payload/gpufleet_check.pyz", "--json", "--require-gpus", *expectations
    )
    assert required.returncode == 1 and json.loads(required.stdout)["verdict"] == "fail"
