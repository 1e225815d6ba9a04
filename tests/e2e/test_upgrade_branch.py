"""playbooks/upgrade-driver.yml moves a node from driver branch 535 to branch 580, for real (apt, dpkg, DKMS).

NVIDIA's Ubuntu packages carry the branch in their names (nvidia-utils-535,
nvidia-utils-580): the new branch's packages conflict with the old one's
(nvidia-utils, libnvidia-compute, ... as virtual packages) and replace its
files, so apt must remove the old packages, which gpufleet holds. Before the
fix of issue 27 (finding 1) this move stopped at its first node: the held set
was computed from the 580 names, apt refused to remove the held 535 packages
("pkgProblemResolver::Resolve generated breaks, this may be caused by held
packages"), and play 1 never saw it because its simulation allowed held
changes.

The node is one of the lab's Debian 12 nodes with two fixtures (README,
"what is tested where"): an Ubuntu 22.04 identity (/etc/os-release), so that
the driver role takes its Ubuntu package layout, source nvidia (NVIDIA's CUDA
repository), and the lab mirror's repository of the two branches in that
layout (tests/lab/files/build-fixture-branches.py: the relations of the real
packages, files that overlap as theirs do, a DKMS module built for real for
the lab's kernel). The rest of the lab keeps Debian's real driver (source
debian_nonfree); this node gets none of it. The node is first given branch
535 (the same playbook), then moved to 580 with the reboot left pending (a
container is never rebooted), then restarted (the lab's boot fixture publishes
the module DKMS built as the loaded one) and the playbook run again: it
verifies and changes nothing.
"""

from __future__ import annotations

import json

import pytest
from conftest import (
    FreshNode,
    lab_vars,
    lone_inventory,
    podman,
    remove_lab_nodes,
    restart_node,
    run_playbook,
    start_lab_nodes,
)

# The slow tier (make test-slow; docs/testing.md): three runs of upgrade-driver.yml with a DKMS build, about
# 3 min; in make test it took the rehearsal of 2026-12-04 over its budget (46:49).
pytestmark = pytest.mark.slow

NODE = "gpufleet-e2e-branch"
OLD, NEW = "535.261.03", "580.95.05"
# FIXTURE: what /etc/os-release of an Ubuntu 22.04 server says (the fields Ansible reads for its distribution facts).
UBUNTU_2204 = [
    'PRETTY_NAME="Ubuntu 22.04.5 LTS"',
    'NAME="Ubuntu"',
    'VERSION_ID="22.04"',
    'VERSION="22.04.5 LTS (Jammy Jellyfish)"',
    "VERSION_CODENAME=jammy",
    "ID=ubuntu",
    "ID_LIKE=debian",
    "UBUNTU_CODENAME=jammy",
]
# The packages of one branch in NVIDIA's Ubuntu layout that nvidia-headless-B + nvidia-utils-B install.
STACK = [
    "libnvidia-cfg1-{b}",
    "libnvidia-compute-{b}",
    "nvidia-compute-utils-{b}",
    "nvidia-dkms-{b}",
    "nvidia-firmware-{b}-{v}",
    "nvidia-headless-{b}",
    "nvidia-headless-no-dkms-{b}",
    "nvidia-kernel-common-{b}",
    "nvidia-kernel-source-{b}",
    "nvidia-utils-{b}",
]


def stack(version: str) -> list:
    return sorted(name.format(b=version.split(".")[0], v=version) for name in STACK)


@pytest.fixture(scope="module")
def branch_node(tmp_path_factory, lab_hosts):
    mirror = lab_vars()["lab_mirror_url"]
    hosts = start_lab_nodes(
        [NODE],
        "e2e",
        host_vars={
            # A node without torch (the two checks that import it are left out) and without the cluster services.
            "gpu_verify_skip_checks": ["torch_cuda", "libraries"],
            "nvidia_driver_source": "nvidia",
            "nvidia_driver_repository_url": f"{mirror}/fixtures/nvidia-branches",
            # NVIDIA's flat layout and its cuda-keyring (the lab's fixture of it): the source's own defaults.
            "nvidia_driver_repository_suites": [],
            "nvidia_driver_repository_keyring": "",
        },
    )
    podman(
        "exec",
        NODE,
        "sh",
        "-c",
        "printf '%s\\n' " + " ".join(f"'{line}'" for line in UBUNTU_2204) + " > /etc/os-release",
    )
    node = FreshNode(name=NODE, inventory=lone_inventory(tmp_path_factory.mktemp("inv-branch"), hosts))
    yield node
    remove_lab_nodes([NODE])


def upgrade(tmp_path, node: FreshNode, version: str, name: str, **extra):
    return run_playbook(
        tmp_path,
        "playbooks/upgrade-driver.yml",
        node.inventory,
        extravars={"upgrade_driver_version": version, "upgrade_driver_report_dir": str(tmp_path / name), **extra},
    )


def installed(node: FreshNode) -> dict:
    listing = node.exec(
        "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' '*nvidia*' 2>/dev/null || true"
    )
    return {
        p: (v, s.strip())
        for p, v, s in (line.split(" ", 2) for line in listing.splitlines())
        if s.strip() in ("ii", "hi")
    }


def fact(node: FreshNode) -> dict:
    return json.loads(node.exec("/etc/ansible/facts.d/nvidia_driver.fact"))


def test_upgrade_moves_a_node_from_branch_535_to_580_and_a_second_run_changes_nothing(tmp_path, branch_node):
    node = branch_node
    first = upgrade(tmp_path, node, OLD, "to-535")
    assert first.status == "successful", first.failures()
    packages = installed(node)
    assert sorted(packages) == stack(OLD), packages
    assert node.exec("apt-mark showhold").split() == stack(OLD)
    assert f"nvidia/{OLD}, " in node.exec("dkms status")

    move = upgrade(tmp_path, node, NEW, "to-580", upgrade_driver_accept_reboot_pending=True)
    assert move.status == "successful", move.failures()
    packages = installed(node)
    # Every package of branch 535 went (the firmware too, which nothing replaced); 580's are installed and held.
    assert sorted(packages) == stack(NEW), packages
    assert {version for version, _status in packages.values()} == {f"{NEW}-0gpufleetlab1"}
    assert node.exec("apt-mark showhold").split() == stack(NEW)
    dkms = node.exec("dkms status")
    assert f"nvidia/{NEW}, " in dkms and OLD not in dkms, dkms
    pin = node.exec("cat /etc/apt/preferences.d/gpufleet-nvidia-driver.pref")
    assert f"Pin: version {NEW}-0gpufleetlab1" in pin and "*nvidia*-580" in pin and "535" not in pin, pin
    blacklist = node.exec("cat /etc/apt/apt.conf.d/51gpufleet-nvidia-driver-unattended-upgrades")
    assert "nvidia-" in blacklist, blacklist
    state = fact(node)
    assert (state["branch"], state["pinned_version"], state["installed_version"]) == ("580", NEW, NEW), state
    assert (state["loaded_version"], state["reboot_required"]) == (OLD, True), state
    report = json.loads((tmp_path / "to-580" / "fleet-report.json").read_text())
    [entry] = report["nodes"]
    assert (entry["driver"], entry["driver_loaded"], entry["reboot_required"]) == (NEW, OLD, True), entry

    restart_node(NODE)  # the reboot the move left pending: the module DKMS built for 580 is the loaded one
    again = upgrade(tmp_path, node, NEW, "again")
    assert again.status == "successful", again.failures()
    assert again.changed().get(NODE, 0) == 0, again.changed_tasks()
    report = json.loads((tmp_path / "again" / "fleet-report.json").read_text())
    [entry] = report["nodes"]
    assert (entry["verdict"], entry["driver"], entry["driver_loaded"]) == ("pass", NEW, NEW), entry
