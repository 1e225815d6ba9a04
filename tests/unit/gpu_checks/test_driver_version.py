"""driver_version: the GPUs on the PCI bus and the loaded, installed and userspace driver versions."""

from __future__ import annotations

import pytest
from gpufleet_check import checks, facts

from .fakes import CHECK_KEYS, FakeHost, h100_listing, probe

# --------------------------------------------------------------------------- PCI bus and driver versions


def test_pci_gpus_counted_from_sysfs(host: FakeHost) -> None:
    host.pci_device("0000:18:00.0", pci_class="0x030200")  # 3D controller (data-centre GPU)
    host.pci_device("0000:01:00.0", pci_class="0x030000")  # VGA controller (workstation GPU)
    host.pci_device("0000:05:00.0", pci_class="0x068000")  # NVSwitch: a bridge, not a GPU
    host.pci_device("0000:00:02.0", vendor="0x8086", pci_class="0x030000")  # Intel graphics
    assert facts.count_pci_gpus(host.sysfs) == 2
    assert facts.count_pci_gpus(host.root / "missing") == 0


@pytest.mark.parametrize(
    "line, version",
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Feb 20 01:02:03 UTC 2024", "535.161.08"),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.261.03  Release Build  (dvs-builder@U16)",
            "535.261.03",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.54.15  Release Build", "550.54.15"),
        ("garbage", None),
    ],
)
def test_proc_driver_version_parsing(line: str, version: str | None) -> None:
    assert facts.parse_proc_driver_version(line + "\nGCC version:  gcc version 12.2.0\n") == version


def test_userspace_version_through_debian_alternatives(host: FakeHost) -> None:
    """libnvidia-ml.so.1 -> /etc/alternatives/... -> nvidia/current/libnvidia-ml.so.<version>."""
    current = host.root / "x86_64-linux-gnu" / "nvidia" / "current"
    current.mkdir(parents=True)
    (current / "libnvidia-ml.so.535.261.03").write_text("")
    (current / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.535.261.03")
    alternative = host.root / "etc-alternatives-nvidia--libnvidia-ml.so.1-x86_64-linux-gnu"
    alternative.symlink_to(current / "libnvidia-ml.so.1")
    lib_dir = host.root / "x86_64-linux-gnu"
    (lib_dir / "libnvidia-ml.so.1").symlink_to(alternative)
    version, path = facts.installed_driver_version([str(lib_dir)])
    assert version == "535.261.03"
    assert path == str((current / "libnvidia-ml.so.535.261.03").resolve())


def test_userspace_version_falls_back_to_libcuda(host: FakeHost) -> None:
    (host.libs / "libcuda.so.535.161.08").write_text("")
    (host.libs / "libcuda.so.1").symlink_to("libcuda.so.535.161.08")
    assert facts.installed_driver_version([str(host.libs)])[0] == "535.161.08"
    assert facts.installed_driver_version([str(host.root / "empty")]) == (None, None)


def test_ldconfig_output_parsing() -> None:
    text = (
        "1234 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibnvidia-ml.so.1 (libc6) => /lib/i386-linux-gnu/libnvidia-ml.so.1\n"
        "\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"
        "\tlibnvidia-ml.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so\n"
        "\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1\n"
    )
    assert facts.parse_ldconfig(text, "libnvidia-ml.so.1") == [
        "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/lib/i386-linux-gnu/libnvidia-ml.so.1",
    ]
    assert facts.parse_ldconfig(text, "libfoo.so.1") == []
    debian_path = "/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.261.03"
    assert facts.library_version(debian_path) == "535.261.03"
    assert facts.library_version("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") is None


def test_driver_versions_equal_pass(healthy_h100: FakeHost) -> None:
    result = checks.check_driver_version(probe(healthy_h100))
    assert CHECK_KEYS <= result.keys()
    assert (result["verdict"], result["value"], result["threshold"]) == ("pass", "535.161.08", "535.161.08")
    assert result["reboot_required"] is False


def test_upgrade_without_reboot_fails(host: FakeHost) -> None:
    host.pci_gpus(8)
    host.loaded_module("535.161.08")
    host.userspace_driver("535.261.03")
    result = checks.check_driver_version(probe(host))
    assert result["verdict"] == "fail" and result["reboot_required"] is True
    assert result["detail"] == (
        "loaded module 535.161.08, installed 535.261.03: driver/library mismatch, reboot required"
    )


def test_loaded_version_from_proc_when_sysfs_lacks_it(host: FakeHost) -> None:
    host.pci_gpus(1)
    host.proc_file.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Feb 20 2024\n")
    host.userspace_driver("535.161.08")
    result = checks.check_driver_version(probe(host))
    assert (result["verdict"], result["loaded_from"]) == ("pass", str(host.proc_file))


def test_loaded_version_from_nvidia_smi_as_last_resort(host: FakeHost) -> None:
    host.nvidia_smi(h100_listing())
    host.userspace_driver("535.261.03")
    result = checks.check_driver_version(probe(host))
    assert (result["verdict"], result["value"], result["loaded_from"]) == ("fail", "535.161.08", "nvidia-smi")


def test_module_not_loaded_with_gpus_fails(host: FakeHost) -> None:
    host.pci_gpus(2)
    host.userspace_driver("535.261.03")
    result = checks.check_driver_version(probe(host))
    assert result["verdict"] == "fail" and result["reboot_required"] is True
    assert "module not loaded" in result["detail"]


def test_no_gpu_no_driver_is_skipped(host: FakeHost) -> None:
    result = checks.check_driver_version(probe(host))
    assert result["verdict"] == "skipped" and result["detail"].startswith("no GPU")
    result = checks.check_driver_version(probe(host, "--require-gpus"))
    assert result["verdict"] == "fail" and result["detail"].startswith("no GPU")


def test_gpus_without_any_driver_fail(host: FakeHost) -> None:
    host.pci_gpus(4)
    result = checks.check_driver_version(probe(host))
    assert result["verdict"] == "fail" and "4 GPU(s) on the PCI bus but no NVIDIA driver" in result["detail"]
