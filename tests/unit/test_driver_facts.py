"""gpufleet.fleet.driver_facts (plugins/modules/driver_facts.py, its logic in plugins/module_utils/driver_facts.py):
the nvidia_driver role's reads of a host in one module run, run for real as Ansible runs a module (its arguments in a
JSON file) with the role's own scripts (files/foreign_driver_probe.sh, files/driver_stack.py):

* on this build machine as it is (no NVIDIA driver), its real dpkg and apt;
* on a scratch dpkg database and apt state read by this machine's dpkg and apt (test_foreign_driver.ScratchHost, and
  the dpkg database of the lab node captured verbatim in tests/unit/data/apt/dpkg-query-branch-535.txt, branch 535
  of the lab's fixture installed and held).

The judgement of a foreign driver on published outputs is tested in test_foreign_driver.py (the filter
gpufleet.fleet.foreign_driver is the same judgement on the controller), the listing in test_driver_stack.py and
test_driver_branch_move.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import conftest
import pytest
from conftest import REPO_ROOT, host_tool
from test_driver_branch_move import OLD_STACK
from test_foreign_driver import DEBIAN, FOCAL_CANONICAL, FOCAL_UPDATES, PROBE, UBUNTU_FOCAL, ScratchHost, judge

from ansible_collections.gpufleet.fleet.plugins.module_utils import driver_facts

STACK_SCRIPT = (REPO_ROOT / "roles" / "nvidia_driver" / "files" / "driver_stack.py").read_text()
CAPTURE = REPO_ROOT / "tests" / "unit" / "data" / "apt" / "dpkg-query-branch-535.txt"
NVIDIA_580 = ["nvidia-headless-580", "nvidia-utils-580"]
NVIDIA_535 = ["nvidia-headless-535", "nvidia-utils-535"]
SUPPORT = ["dkms", "linux-headers-6.1.0-40-amd64"]


def run_module(tmp_path: Path, env: dict[str, str] | None = None, **arguments: Any) -> dict[str, Any]:
    return conftest.run_module(tmp_path, "driver_facts", env, **arguments)


def foreign(layouts: dict[str, Any], source: str, **options: Any) -> dict[str, Any]:
    return {
        "script": PROBE.read_text(),
        "layouts": layouts,
        "source": source,
        "branch": "535",
        "host": "gpu01",
        **options,
    }


def stack(named: list[str], branch: str, version: str, **options: Any) -> dict[str, Any]:
    return {
        "script": STACK_SCRIPT,
        "packages": named,
        "versioned_packages": named,
        "pin_patterns": [f"*nvidia*-{branch}", f"*nvidia*-{branch}-*"],
        "support_packages": SUPPORT,
        "version": version,
        **options,
    }


def test_this_machine_has_no_foreign_driver_and_no_driver_stack(tmp_path):
    """Both reads in one run on this build machine: no driver, and the holds apt-mark prints here."""
    host_tool("dpkg-query")
    held = subprocess.run([host_tool("apt-mark"), "showhold"], capture_output=True, text=True, check=True).stdout
    result = run_module(
        tmp_path,
        foreign=foreign(DEBIAN, "debian_nonfree"),
        stack=stack(NVIDIA_535, "535", "535.261.03", packages=[*NVIDIA_535, "linux-modules-nvidia-535-generic"]),
    )
    assert result["changed"] is False and not result.get("failed"), result
    assert result["foreign"] is False and result["stop"] is False and result["message"] == result["notice"] == ""
    assert result["packages"] == result["remove"] == result["uninstall"] == []
    assert result["stack"] == {
        "installed_stack": [],
        "replaced_stack": [],
        "held": held.splitlines(),
        "held_dependencies": [],
        "releasable": [],
        "transaction": [
            *SUPPORT,
            "nvidia-headless-535=535.261.03-*",
            "nvidia-utils-535=535.261.03-*",
            "linux-modules-nvidia-535-generic",
        ],
    }


def test_a_foreign_driver_is_judged_on_the_host_as_the_filter_judges_it(tmp_path):
    """Canonical's nvidia-driver-535 on Ubuntu 20.04 (test_foreign_driver's case), read by the module from a scratch
    dpkg database and apt state: the judgement is the filter's on the probe's output, and it stops the host."""
    host = ScratchHost(tmp_path / "host")
    host.install(FOCAL_CANONICAL)
    host.repository("focal-updates", FOCAL_UPDATES, FOCAL_CANONICAL)
    expected = judge(host.probe(), UBUNTU_FOCAL, "nvidia")
    env = {"APT_CONFIG": str(host.apt_config), "DPKG_ADMINDIR": str(host.admin)}
    result = run_module(tmp_path, env, foreign=foreign(UBUNTU_FOCAL, "nvidia"))
    assert {key: result[key] for key in expected} == expected
    # The stop fails the module with its message, before the stack would be read.
    assert result["failed"] is True and result["msg"] == result["message"]
    assert result["stop"] is True and "origin Ubuntu, suite focal-updates" in result["message"]
    assert "stack" not in result


def lab_node(root: Path) -> dict[str, str]:
    """The lab node's dpkg database (the verbatim capture: names, status, Depends and Pre-Depends, Provides) as a
    scratch dpkg status file, read by this machine's dpkg-query and apt-mark; the environment that points them at it."""
    stanzas = []
    for line in CAPTURE.read_text().splitlines():
        if line.startswith("# "):
            continue
        name, status, depends, provides = line.split("\t")
        state = {"ii": "install ok installed", "hi": "hold ok installed"}[status.strip()]
        depends = ", ".join(part.strip() for part in depends.split(",") if part.strip())
        stanzas.append(
            f"Package: {name}\nStatus: {state}\nVersion: 1\nArchitecture: amd64\n"
            "Maintainer: lab <lab@gpufleet.invalid>\n"
            + (f"Depends: {depends}\n" if depends else "")
            + (f"Provides: {provides}\n" if provides else "")
            + f"Description: {name}\n"
        )
    admin = root / "dpkg"
    for directory in ("info", "updates", "lists", "empty"):
        (admin / directory).mkdir(parents=True)
    (admin / "status").write_text("\n".join(stanzas))
    (admin / "available").write_text("")
    apt_config = root / "apt.conf"
    apt_config.write_text(
        f'Dir::State::status "{admin / "status"}";\nDir::State::Lists "{admin / "lists"}";\n'
        f'Dir::Etc::SourceList "{admin / "empty" / "none"}";\nDir::Etc::SourceParts "{admin / "empty"}";\n'
        f'Dir::Etc::PreferencesParts "{admin / "empty"}";\nDir::Cache "{root}";\nDir::Cache::pkgcache "";\n'
        'Dir::Cache::srcpkgcache "";\nDebug::NoLocking "1";\nAPT::Architecture "amd64";\n'
    )
    return {"APT_CONFIG": str(apt_config), "DPKG_ADMINDIR": str(admin)}


@pytest.fixture
def lab(tmp_path):
    host_tool("dpkg-query")
    host_tool("apt-mark")
    return lab_node(tmp_path / "node")


def test_the_move_from_535_to_580_lifts_the_holds_of_the_535_stack(tmp_path, lab):
    """The lab node with branch 535 held, moving to 580: the 535 stack is the one replaced, its holds the install
    lifts; 580 is not installed yet, and apt is asked for 580's packages at the release."""
    result = run_module(
        tmp_path,
        lab,
        stack=stack(
            NVIDIA_580,
            "580",
            "580.95.05",
            replaced_packages=NVIDIA_535,
            replaced_pin_patterns=["*nvidia*-535", "*nvidia*-535-*"],
        ),
    )
    assert result["stack"] == {
        "installed_stack": [],
        "replaced_stack": OLD_STACK,
        "held": OLD_STACK,
        "held_dependencies": [],
        "releasable": OLD_STACK,
        "transaction": [*SUPPORT, "nvidia-headless-580=580.95.05-*", "nvidia-utils-580=580.95.05-*"],
    }


def test_the_held_dependencies_of_the_same_branch_move_with_the_driver(tmp_path, lab):
    """The same node staying on 535 (a new release): its whole stack is installed and held; the held packages the
    role does not name are named in the transaction at the release, and every hold of the stack is lifted."""
    result = run_module(tmp_path, lab, stack=stack(NVIDIA_535, "535", "535.274.02"))
    dependencies = [name for name in OLD_STACK if name not in NVIDIA_535]
    assert result["stack"]["installed_stack"] == OLD_STACK and result["stack"]["replaced_stack"] == []
    assert result["stack"]["held_dependencies"] == dependencies
    assert result["stack"]["releasable"] == OLD_STACK
    assert result["stack"]["transaction"] == SUPPORT + [f"{name}=535.274.02-*" for name in NVIDIA_535 + dependencies]


def test_nothing_is_read_where_the_host_cannot_be_asked(tmp_path):
    """query false (check mode before the repository is configured): no command runs (there is none on this PATH),
    the stacks and holds are empty, and without a release apt is asked for the named packages as they are."""
    result = run_module(tmp_path, {"PATH": str(tmp_path)}, stack=stack(NVIDIA_535, "535", "", query=False))
    assert result["stack"] == {
        "installed_stack": [],
        "replaced_stack": [],
        "held": [],
        "held_dependencies": [],
        "releasable": [],
        "transaction": [*SUPPORT, *NVIDIA_535],
    }


def test_a_source_without_a_layout_fails_the_module_with_the_judgements_message(tmp_path):
    result = run_module(tmp_path, foreign=foreign(DEBIAN, "nvidia_by_hand"))
    assert result["failed"] is True and "source 'nvidia_by_hand' has no layout" in result["msg"]


def test_the_stack_facts_keep_the_order_of_the_stack_and_the_named_packages():
    """Ansible's intersect and difference, which the role's expressions used, give no order; these keep the
    stack's (sorted) and the named packages' order."""
    facts = driver_facts.stack_facts(
        {"stack": ["libnvidia-compute-535", "nvidia-kernel-common-535", "nvidia-utils-535"], "replaced": []},
        ["zzz-other", "nvidia-utils-535", "nvidia-kernel-common-535", "libnvidia-compute-535"],
        ["nvidia-utils-535", "linux-modules-nvidia-535-generic"],
        ["nvidia-utils-535"],
        [],
        "535.274.02",
    )
    assert facts["held_dependencies"] == ["libnvidia-compute-535", "nvidia-kernel-common-535"]
    assert facts["releasable"] == ["libnvidia-compute-535", "nvidia-kernel-common-535", "nvidia-utils-535"]
    assert facts["transaction"] == [
        "nvidia-utils-535=535.274.02-*",
        "libnvidia-compute-535=535.274.02-*",
        "nvidia-kernel-common-535=535.274.02-*",
        "linux-modules-nvidia-535-generic",
    ]
