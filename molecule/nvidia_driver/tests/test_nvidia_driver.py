"""Verify for the nvidia_driver scenario: the real Debian 535.261.03 driver
from the lab mirror is installed, pinned, held, built by DKMS for the
mirrored Debian kernel, and reports the module the lab's first-install
fixture publishes (the reboot a GPU server makes after its first install)."""

import json

import pytest

testinfra_hosts = ["ansible://all"]

VERSION = "535.261.03"
DRIVER_PACKAGES = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1"]


@pytest.fixture(scope="module")
def kernel(host):
    """The Debian kernel the lab mirror carries headers for."""
    return host.check_output("ls /usr/src | sed -n 's/^linux-headers-\\(.*-amd64\\)$/\\1/p'")


@pytest.mark.parametrize("name", DRIVER_PACKAGES)
def test_driver_package_installed_at_pinned_version(host, name):
    pkg = host.package(name)
    assert pkg.is_installed
    assert pkg.version.startswith(VERSION + "-")


def test_driver_packages_are_held(host):
    held = host.check_output("apt-mark showhold").split()
    for name in DRIVER_PACKAGES:
        assert name in held


def test_the_whole_driver_stack_is_held(host):
    """Every installed package of the driver's names is held, also the dependencies the role does not name
    (libnvidia-ml1, firmware-nvidia-gsp, nvidia-modprobe, which Debian versions on its own): issue 16, item 19."""
    held = set(host.check_output("apt-mark showhold").split())
    listing = host.check_output("dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' '*nvidia*' libcuda1")
    # Installed: "ii", or "hi" once held.
    installed = {line.split()[0] for line in listing.splitlines() if line.split()[-1][1:2] == "i"}
    assert {"libnvidia-ml1", "nvidia-smi"} <= installed
    assert installed <= held, sorted(installed - held)


def test_pin_file_pins_exact_version(host):
    pref = host.file("/etc/apt/preferences.d/gpufleet-nvidia-driver.pref")
    assert pref.mode == 0o644
    assert f"Pin: version {VERSION}-*" in pref.content_string
    assert "Pin-Priority: 1001" in pref.content_string
    policy = host.check_output("apt-cache policy nvidia-smi")
    assert f"Candidate: {VERSION}-" in policy


def test_unattended_upgrades_blacklist(host):
    conf = host.file("/etc/apt/apt.conf.d/51gpufleet-nvidia-driver-unattended-upgrades")
    assert "Unattended-Upgrade::Package-Blacklist" in conf.content_string
    assert '".*nvidia";' in conf.content_string
    # apt itself must accept the file and see the list.
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    assert 'Unattended-Upgrade::Package-Blacklist:: "libcuda1";' in dump


# One apt source per repository URL, named after it (gpufleet_filters.apt_source_files:
# http://mirror.gpufleet.lab/debian), and the key URL's key in the repository's keyring file.
SOURCE = "/etc/apt/sources.list.d/gpufleet-mirror.gpufleet.lab_debian.sources"
KEYRING = "/etc/apt/keyrings/gpufleet-mirror.gpufleet.lab_debian.asc"


def test_repository_is_signed_by_fetched_key(host):
    src = host.file(SOURCE).content_string
    assert "URIs: http://mirror.gpufleet.lab/debian" in src
    assert "Components: contrib non-free non-free-firmware" in src
    assert f"Signed-By: {KEYRING}" in src
    assert "trusted" not in src
    key = host.file(KEYRING)
    assert key.user == "root" and key.mode == 0o644
    assert "BEGIN PGP PUBLIC KEY BLOCK" in key.content_string
    # The names of earlier releases are gone, and the record says which file the driver wrote.
    assert not host.file("/etc/apt/sources.list.d/gpufleet-nvidia-driver.sources").exists
    assert not host.file("/etc/apt/keyrings/gpufleet-nvidia-driver.asc").exists
    assert host.file("/var/lib/gpufleet/apt-sources/nvidia-driver").content_string == SOURCE + "\n"


def test_nouveau_blacklisted(host):
    conf = host.file("/etc/modprobe.d/gpufleet-blacklist-nouveau.conf").content_string
    assert "blacklist nouveau" in conf
    assert "options nouveau modeset=0" in conf


def test_dkms_built_the_module_for_the_mirrored_kernel(host, kernel):
    assert kernel.startswith("6.1.0-")
    status = host.check_output("dkms status -m nvidia-current")
    assert f"nvidia-current/{VERSION}, {kernel}, x86_64: installed" in status
    modules = host.check_output(f"ls /lib/modules/{kernel}/updates/dkms/")
    assert "nvidia-current.ko" in modules


def test_no_kernel_image_was_installed(host):
    assert host.run("dpkg-query -W 'linux-image-*'").rc != 0


def test_persistenced_enabled(host):
    assert host.service("nvidia-persistenced").is_enabled


def test_nvidia_smi_installed_and_honest_without_gpu(host):
    assert host.exists("nvidia-smi")
    run = host.run("nvidia-smi")
    assert run.rc == 9
    assert "couldn't communicate with the NVIDIA driver" in run.stdout + run.stderr


def test_driver_fact_reports_the_loaded_module(host):
    """The lab's fixture of the reboot after a first install publishes the module DKMS built (docs/lab.md)."""
    fact = host.file("/etc/ansible/facts.d/nvidia_driver.fact")
    assert fact.mode == 0o755
    state = json.loads(host.check_output("/etc/ansible/facts.d/nvidia_driver.fact"))
    assert state["installed_version"] == VERSION
    assert state["pinned_version"] == VERSION
    assert state["loaded_version"] == VERSION
    assert state["reboot_required"] is False
    assert state["gpus"] == 0
