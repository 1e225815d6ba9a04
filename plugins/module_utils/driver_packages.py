"""A driver source's packages: the layout of one branch and kernel, and Ubuntu's signed module packages.

Controller-side (the filters gpufleet.fleet.driver_layout and signed_module_packages wrap these, a ValueError
becoming the filter's error; the nvidia_driver role's rules, plugins/module_utils/rules/nvidia_driver.py, resolve
the host's package lists with them).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import as_dict, as_list, to_bool

# An Ubuntu kernel release: <version>-<ABI>-<flavour> (5.15.0-106-generic).
_UBUNTU_KERNEL = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+-[0-9]+-(?P<flavour>[a-z][a-z0-9.-]*)$")


def signed_module_packages(kernels: Any, branch: Any, flavours: Any = None, server: bool = True) -> list[str]:
    """Per-kernel ``linux-modules-nvidia-<branch>[-server]-<uname -r>`` packages, then the flavour metapackages."""
    prefix = f"linux-modules-nvidia-{branch}{'-server' if server else ''}-"
    releases = [kernels] if isinstance(kernels, str) else list(kernels or [])
    names = [prefix + str(release).strip() for release in releases]
    if flavours is None:
        found = [_UBUNTU_KERNEL.match(str(release).strip()) for release in releases]
        if not all(found):
            raise ValueError(f"signed_module_packages: no Ubuntu kernel flavour in {releases!r}")
        flavours = [match["flavour"] for match in found if match]
    for flavour in [flavours] if isinstance(flavours, str) else list(flavours):
        text = str(flavour).strip()
        names.append(prefix + (text[len("linux-") :] if text.startswith("linux-") else text))
    return list(dict.fromkeys(names))


def driver_layout(
    source: Any,
    branch: Any,
    kernel: Any = "",
    module_source: Any = "dkms",
    headless: Any = True,
    fabricmanager: Any = False,
) -> dict[str, Any]:
    """A driver source's package layout for one branch and kernel (driver_layout.yml)."""
    layout = as_dict(source)
    branch, kernel = str(branch), str(kernel)

    def fill(names: Any) -> list[str]:
        return [str(name).replace("{b}", branch).replace("{k}", kernel) for name in as_list(names or [])]

    if str(module_source) == "signed":
        packages = fill(layout.get("packages_signed"))
    else:
        packages = fill(layout.get("packages_headless" if to_bool(headless) else "packages_full"))
    if to_bool(fabricmanager):
        packages += fill(layout.get("packages_fabricmanager"))
    named = [
        str(name)
        for key in ("packages_headless", "packages_full", "packages_signed", "version_package")
        for name in as_list(layout.get(key) or [])
    ]
    return {
        "packages": packages,
        "pin_patterns": fill(layout.get("pin_patterns")),
        "upgrade_blacklist": fill(layout.get("upgrade_blacklist")),
        "version_package": fill([layout.get("version_package", "")])[0],
        "branch_named": any("{b}" in name for name in named),
    }
