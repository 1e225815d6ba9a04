"""roles/nvidia_driver/files/driver_stack.py: the driver stack the role holds (issue 16, item 19).

The dpkg-query lines below have the shape of a Debian 12 lab node with the
535.261.03 driver (nvidia-kernel-support depends on nvidia-modprobe, which
Debian builds on its own: 535.309.01, no 535.261.03 build), reached through
the virtual package nvidia-kernel-support--v1.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("driver_stack", REPO / "roles/nvidia_driver/files/driver_stack.py")
driver_stack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(driver_stack)

LISTING = "\n".join(
    [
        "nvidia-kernel-dkms\thi \tnvidia-kernel-support--v1-535.261.03, dkms (>= 2.1.0.0), libc6, \t",
        "nvidia-kernel-support\tii \tnvidia-alternative (= 535.261.03-1), nvidia-kernel-common (>= 20151021),"
        " nvidia-modprobe (>= 535), \tnvidia-kernel-support--v1, nvidia-kernel-support--v1-535.261.03",
        "nvidia-modprobe\tii \tlibc6 (>= 2.34), \t",
        "nvidia-kernel-common\tii \t, \t",
        "nvidia-alternative\tii \tglx-alternative-nvidia (>= 1.2), \t",
        "glx-alternative-nvidia\tii \tglx-alternative-mesa | glx-diversions, \t",
        "glx-alternative-mesa\tii \t, \t",
        "nvidia-smi\thi \tlibnvidia-ml1 (= 535.261.03-1), \t",
        "libnvidia-ml1\tii \tlibc6, \t",
        "dkms\tii \tkmod | kldutils, gcc | c-compiler, \t",
        "libc6\tii \t, \t",
        "nvidia-container-toolkit\tii \tlibnvidia-container-tools, \t",
        "libnvidia-container-tools\tii \t, \t",
        "nvidia-legacy-check\trc \t, \t",
    ]
)


def test_the_stack_follows_virtual_packages_and_keeps_the_drivers_names():
    stack = driver_stack.driver_stack(LISTING, ["nvidia-kernel-dkms", "nvidia-smi"], ["*nvidia*", "libcuda1"])
    assert stack == [
        "glx-alternative-nvidia",
        "libnvidia-ml1",
        "nvidia-alternative",
        "nvidia-kernel-common",
        "nvidia-kernel-dkms",
        "nvidia-kernel-support",
        "nvidia-modprobe",
        "nvidia-smi",
    ]


def test_other_roles_packages_and_removed_ones_are_not_the_drivers():
    stack = driver_stack.driver_stack(LISTING, ["nvidia-smi"], ["*nvidia*"])
    assert "nvidia-container-toolkit" not in stack and "nvidia-legacy-check" not in stack
    assert driver_stack.driver_stack(LISTING, ["not-installed"], ["*"]) == []
