"""The training image (roles/container/files/Containerfile.train), built for real with
podman and run on CPU.

The image is built from the lab's own node image (Debian 12 whose only apt
source is the lab mirror, trusted through the mirror's key) on the lab's
internal network, so nothing can come from outside: python3-venv from the
mirror's /debian, torch from its wheelhouse (--no-index --find-links; pip
ignores a plain-http wheelhouse unless its host is trusted, hence
--trusted-host). The ARGs are the lab's pytorch settings, as an air-gapped
site passes its own. Then the payload runs in the image without a network:
one process, a 2-process torchrun (gloo), the default command and the GPU
checks (which say "no GPU"); their JSON results are asserted. The image is
removed at the end.

What needs NVIDIA's servers or a GPU (the CUDA base image, the cu121 wheels,
the NVIDIA Container Toolkit, nvidia-ctk, CDI) is covered by
tests/unit/test_container_role.py on the rendered configuration.
"""

from __future__ import annotations

import json
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
        "TORCH_VARIANT": settings["pytorch_variant"],
        "PIP_EXTRA_ARGS": f"--no-index --find-links {wheelhouse} --trusted-host {MIRROR}",
    }
    argv = ["podman", "build", "--pull=never", "--layers=false", "--network", LAB_NETWORK,
            "--add-host", f"{MIRROR}:{mirror_address()}", "--file", CONTAINERFILE, "--tag", tag]
    argv += [f"--build-arg={key}={value}" for key, value in build_args.items()] + ["."]
    started = time.monotonic()
    build = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    print(f"podman build: {time.monotonic() - started:.0f} s")
    try:
        assert build.returncode == 0, f"podman build failed (exit {build.returncode}):\n{(build.stdout + build.stderr)[-4000:]}"
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)


def run_in_image(image: str, *command: str) -> subprocess.CompletedProcess:
    """Runs a command in the image without any network."""
    return subprocess.run(["podman", "run", "--rm", "--network", "none", image, *command],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


def payload_result(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


def test_image_metadata(training_image):
    """Labels name the torch build and the base image; the payload runs as uid 1000; the default command is the payload."""
    config = json.loads(podman("image", "inspect", training_image).stdout)[0]["Config"]
    settings = lab_settings()
    assert config["Labels"]["org.gpufleet.torch-version"] == settings["pytorch_release"]
    assert config["Labels"]["org.gpufleet.torch-variant"] == settings["pytorch_variant"]
    assert config["Labels"]["org.opencontainers.image.base.name"] == NODE_IMAGE
    assert config["User"] == "1000:1000"
    assert config["Cmd"] == ["python", "/opt/gpufleet/payload/train.py", "--json"]


def test_unprivileged_user_cannot_change_the_payload(training_image):
    run = run_in_image(training_image, "sh", "-c",
                       "id -un; id -u; command -v python; command -v torchrun; test -w /opt/gpufleet/payload/train.py && echo writable || echo read-only")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["gpufleet", "1000", "/opt/gpufleet/venv/bin/python", "/opt/gpufleet/venv/bin/torchrun", "read-only"]


def test_payload_single_process_on_cpu(training_image):
    """train.py as one process: verdict pass, world size 1, the lab's torch build."""
    result = payload_result(run_in_image(training_image, "python", "/opt/gpufleet/payload/train.py",
                                         "--json", "--steps", "8", "--device", "cpu"))
    settings = lab_settings()
    assert result["verdict"] == "pass", result["reasons"]
    assert result["world_size"] == 1 and result["device"] == "cpu" and result["final_step"] == 8
    assert result["torch_version"] == f"{settings['pytorch_release']}+{settings['pytorch_variant']}"
    assert result["cuda_version"] is None


def test_payload_torchrun_two_processes_on_cpu(training_image):
    """torchrun inside the container: 2 gloo ranks under DDP, both reporting, parameters in agreement."""
    result = payload_result(run_in_image(training_image, "torchrun", "--standalone", "--nproc-per-node=2",
                                         "/opt/gpufleet/payload/train.py", "--json", "--steps", "8", "--device", "cpu"))
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
    """gpufleet_check.pyz in the image: every GPU check says "no GPU" (never a pass), and a run in which
    nothing was checked (no driver, no GPU) is a failure, not a pass (issue 16, item 1)."""
    run = run_in_image(training_image, "python", "/opt/gpufleet/payload/gpufleet_check.pyz", "--json")
    report = json.loads(run.stdout)
    assert run.returncode == 1 and report["verdict"] == "fail", report["reasons"]
    assert report["reasons"] == ["nothing was checked: no GPU (7 checks skipped)"], report["reasons"]
    checks = {check["name"]: check for check in report["checks"]}
    for name in ("nvidia_smi", "torch_cuda", "gemm", "allreduce_busbw", "p2p_topology"):
        assert checks[name]["verdict"] == "skipped" and "no GPU" in checks[name]["detail"], name
    assert report["versions"]["torch"].startswith(lab_settings()["pytorch_release"])
