"""For which kernels roles/nvidia_driver runs `dkms install` (tasks/configure.yml), from what `dkms status` printed.

The role's validate.yml and preflight.yml run for real on fake hosts (they
resolve the DKMS module name and the driver version); the task "Build the
driver module for every kernel with headers" cannot run here (it runs dkms on
the host), so a copy of its ``loop`` and ``when`` is templated in the same
play, with its own ``vars``, the results of the two probes before it
(the kernels with headers, ``dkms status -m MODULE -v VERSION``) given as host
variables as they are registered.

dkms printed "module, version, kernel, arch: state" before 2.8.6 (Ubuntu
20.04) and "module/version, kernel, arch: state" since (dell/dkms commit
f83b758, first in tag v2.8.6; added modules from 2.8.7 on, commit 65f01a0;
Ubuntu 22.04 and Debian 12).
"""

from __future__ import annotations

from typing import Any

import pytest
import role_run
from conftest import FAKE_FACTS

VERSION = "535.261.03"  # the 535 branch's default release in files/compatibility.yml
BUILD = role_run.role_task("nvidia_driver", "configure.yml", "Build the driver module for every kernel with headers")
RUNS = role_run.Batch(
    FAKE_FACTS,
    [
        role_run.import_role("nvidia_driver", "validate"),
        role_run.import_role("nvidia_driver", "preflight", skip_apt_source=True),
    ],
    after=[
        role_run.capture(
            {
                "kernels": BUILD["loop"],
                "runs": role_run.condition(BUILD),
                **role_run.names("__nvidia_driver_dkms_module", "__nvidia_driver_version"),
            },
            vars=BUILD.get("vars"),
        )
    ],
)

# Ubuntu 20.04's kernels: the release kernel and the HWE kernel, both with headers.
FOCAL_KERNELS = ["5.4.0-169-generic", "5.15.0-91-generic"]
JAMMY_KERNELS = ["5.15.0-91-generic", "6.5.0-35-generic"]
BOOKWORM_KERNELS = ["6.1.0-18-amd64"]


def _probes(kernels: list[str], status: list[str]) -> dict[str, Any]:
    """The registered results of the two probes before the build task, and install.yml's fact it reads."""
    return {
        "__nvidia_driver_kernels": {"stdout_lines": kernels, "changed": False},
        "__nvidia_driver_dkms": {"rc": 0, "stdout_lines": status, "changed": False},
        "__nvidia_driver_can_query": True,
    }


CASES = {
    # The finding: dkms 2.8.1's format, the module installed for every kernel: nothing to build. The old
    # parsing took the version for the kernel and rebuilt both kernels on every run.
    "focal, installed everywhere": (
        "ubuntu2004",
        "ubuntu",
        FOCAL_KERNELS,
        [
            f"nvidia, {VERSION}, 5.4.0-169-generic, x86_64: installed",
            f"nvidia, {VERSION}, 5.15.0-91-generic, x86_64: installed",
        ],
        [],
    ),
    "focal, built but not installed for one kernel": (
        "ubuntu2004",
        "ubuntu",
        FOCAL_KERNELS,
        [
            f"nvidia, {VERSION}, 5.4.0-169-generic, x86_64: installed (original_module exists)",
            f"nvidia, {VERSION}, 5.15.0-91-generic, x86_64: built",
        ],
        ["5.15.0-91-generic"],
    ),
    "focal, only added": ("ubuntu2004", "ubuntu", FOCAL_KERNELS, [f"nvidia, {VERSION}: added"], FOCAL_KERNELS),
    "jammy, installed for one kernel": (
        "ubuntu2204",
        "nvidia",
        JAMMY_KERNELS,
        [f"nvidia/{VERSION}, 5.15.0-91-generic, x86_64: installed"],
        ["6.5.0-35-generic"],
    ),
    "bookworm, installed with a warning": (
        "debian12",
        "debian_nonfree",
        BOOKWORM_KERNELS,
        [
            f"nvidia-current/{VERSION}, 6.1.0-18-amd64, x86_64: installed (WARNING! Diff between built and installed "
            "module!)"
        ],
        [],
    ),
    "bookworm, another module's line": (
        "debian12",
        "debian_nonfree",
        BOOKWORM_KERNELS,
        ["nvidia/535.183.01, 6.1.0-18-amd64, x86_64: installed"],
        BOOKWORM_KERNELS,
    ),
}


def _case(name: str) -> tuple[str, dict[str, Any]]:
    host, source, kernels, status, _to_build = CASES[name]
    return host, {"nvidia_driver_source": source, **_probes(kernels, status)}


for _name in CASES:
    _host, _settings = _case(_name)
    RUNS.declare(_host, **_settings)


@pytest.mark.parametrize("name", list(CASES))
def test_dkms_install_runs_for_the_kernels_without_the_installed_module(name):
    host, settings = _case(name)
    outcome = RUNS.get(host, **settings)
    assert outcome.failure is None
    assert outcome["__nvidia_driver_version"] == VERSION
    assert sorted(outcome["kernels"]) == sorted(CASES[name][4])  # the difference filter keeps no order
    assert outcome["runs"] is True


@pytest.mark.parametrize(
    "name, module",
    [("focal, installed everywhere", "nvidia"), ("bookworm, installed with a warning", "nvidia-current")],
)
def test_the_records_are_those_of_the_sources_module(name, module):
    """The lines are selected by the module the source's package registers (Debian's: nvidia-current)."""
    host, settings = _case(name)
    assert RUNS.get(host, **settings)["__nvidia_driver_dkms_module"] == module
