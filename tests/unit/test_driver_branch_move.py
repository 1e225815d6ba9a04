"""A driver move to another branch of branch-named packages (535 -> 580, NVIDIA's and Canonical's Ubuntu layout).

Issue 27, finding 1: the upgrade stopped at its first node. The held set was
computed from the new branch's names (not installed yet), so the old branch's
held packages stood in apt's way, and play 1's simulation allowed held changes,
so it never saw it. Now:

* nvidia_driver's preflight.yml knows the branch being replaced (the driver
  fact's branch and source, a layout that names the branch);
* files/driver_stack.py lists that branch's installed stack apart;
* the simulation (apt_source's trial in play 1, its simulate entry point before
  the install) lifts only the holds the install lifts, and transaction.yml
  refuses, before any change, what apt would refuse;
* the install releases the old branch's holds, installs, removes what is left
  of the old branch, and holds the new stack.

apt's outputs here are real: captured in the lab (tests/unit/data/apt/, each
file's header says how). The whole move runs for real in
tests/e2e/test_upgrade_branch.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import role_run
from conftest import FAKE_FACTS, REPO_ROOT, host_tool, load_script

DATA = Path(__file__).resolve().parent / "data" / "apt"
filters = load_script(REPO_ROOT / "plugins" / "filter" / "gpufleet_filters.py")
driver_stack = load_script(REPO_ROOT / "roles" / "nvidia_driver" / "files" / "driver_stack.py")
FIXTURE = REPO_ROOT / "tests" / "lab" / "files" / "build-fixture-branches.py"

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
OLD_STACK = sorted(name.format(b="535", v="535.261.03") for name in STACK)
NEW_STACK = sorted(name.format(b="580", v="580.95.05") for name in STACK)


def apt_output(name: str) -> str:
    """A captured output without its header (lines starting with '# ')."""
    return "\n".join(line for line in (DATA / name).read_text().splitlines() if not line.startswith("# "))


# --------------------------------------------------------------------------- apt_simulation, on apt's own words


def test_a_simulation_blocked_by_the_old_branchs_holds_names_them():
    result = filters.apt_simulation(apt_output("simulate-branch-held.txt"), OLD_STACK)
    assert (result["ran"], result["ok"], result["exit"]) == (True, False, 100)
    assert result["errors"] == [
        "Error, pkgProblemResolver::Resolve generated breaks, this may be caused by held packages."
    ]
    assert result["installs"] == [] and result["removals"] == []
    # apt lists both branches' conflicting packages under "unmet dependencies"; the held ones among them stand in
    # the way (not the firmware and the no-dkms metapackage, which conflict with nothing).
    assert "nvidia-utils-580" in result["unmet"] and "nvidia-utils-535" in result["unmet"]
    assert result["held_in_the_way"] == sorted(
        set(OLD_STACK) - {"nvidia-firmware-535-535.261.03", "nvidia-headless-no-dkms-535"}
    )


def test_the_same_move_with_the_old_branchs_holds_lifted_installs_580_and_removes_535():
    result = filters.apt_simulation(apt_output("simulate-branch-released.txt"), [])
    assert (result["ok"], result["exit"], result["errors"]) == (True, 0, [])
    assert sorted(i["package"] for i in result["installs"]) == NEW_STACK
    assert {i["version"] for i in result["installs"]} == {"580.95.05-0gpufleetlab1"}
    # apt prints each removal twice (its plan, then the order): read once each; the firmware nothing replaced stays.
    assert sorted(r["package"] for r in result["removals"]) == sorted(
        set(OLD_STACK) - {"nvidia-firmware-535-535.261.03"}
    )
    assert result["kernels"] == [] and result["held_in_the_way"] == []


def test_a_kernel_in_the_transaction_is_seen():
    """The released capture, edited in one field: the package of one Inst line is a kernel image."""
    text = apt_output("simulate-branch-released.txt").replace(
        "Inst nvidia-firmware-580-580.95.05 (", "Inst linux-image-6.1.0-51-amd64 (", 1
    )
    assert filters.apt_simulation(text)["kernels"] == ["linux-image-6.1.0-51-amd64"]


def test_no_simulation_is_no_verdict():
    assert filters.apt_simulation("")["ran"] is False
    assert filters.apt_simulation(None)["ok"] is False


# --------------------------------------------------------------------------- driver_layout


UBUNTU_NVIDIA = {
    "packages_headless": ["nvidia-headless-{b}", "nvidia-utils-{b}"],
    "packages_full": ["cuda-drivers-{b}"],
    "packages_signed": [],
    "packages_fabricmanager": ["nvidia-fabricmanager-{b}", "libnvidia-nscq-{b}"],
    "version_package": "nvidia-utils-{b}",
    "pin_patterns": ["*nvidia*-{b}", "*nvidia*-{b}-*", "cuda-drivers-{b}", "cuda-drivers"],
    "upgrade_blacklist": ["nvidia-", "libnvidia-"],
}


def test_the_layout_of_a_branch_fills_in_the_branch_and_says_it_names_it():
    layout = filters.driver_layout(UBUNTU_NVIDIA, "580", "5.15.0-91-generic", "dkms", True, True)
    assert layout["packages"] == [
        "nvidia-headless-580",
        "nvidia-utils-580",
        "nvidia-fabricmanager-580",
        "libnvidia-nscq-580",
    ]
    assert (
        layout["pin_patterns"][:2] == ["*nvidia*-580", "*nvidia*-580-*"]
        and layout["version_package"] == "nvidia-utils-580"
    )
    assert layout["branch_named"] is True
    assert filters.driver_layout(UBUNTU_NVIDIA, "535", headless=False)["packages"] == ["cuda-drivers-535"]


def test_debians_layout_does_not_name_the_branch():
    debian = {
        "packages_headless": ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1"],
        "packages_full": ["nvidia-driver"],
        "packages_signed": [],
        "packages_fabricmanager": [],
        "version_package": "nvidia-smi",
        "pin_patterns": ["*nvidia*", "libcuda1"],
        "upgrade_blacklist": [".*nvidia"],
    }
    assert filters.driver_layout(debian, "535")["branch_named"] is False


# --------------------------------------------------------------------------- driver_stack.py, the replaced branch


LISTING_535 = apt_output("dpkg-query-branch-535.txt")


def test_the_replaced_branch_is_listed_apart_from_the_new_one():
    new = driver_stack.driver_stack(
        LISTING_535, ["nvidia-headless-580", "nvidia-utils-580"], ["*nvidia*-580", "*nvidia*-580-*"]
    )
    old = driver_stack.driver_stack(
        LISTING_535, ["nvidia-headless-535", "nvidia-utils-535"], ["*nvidia*-535", "*nvidia*-535-*"]
    )
    assert new == [] and old == OLD_STACK


def test_the_script_prints_both_stacks(tmp_path):
    """Its main: dpkg-query on this machine (no NVIDIA package here: both empty), the JSON shape stack.yml reads."""
    host_tool("dpkg-query")
    out = subprocess.run(
        [
            "python3",
            str(REPO_ROOT / "roles/nvidia_driver/files/driver_stack.py"),
            '["nvidia-utils-580"]',
            '["*nvidia*-580"]',
            '["nvidia-utils-535"]',
            '["*nvidia*-535"]',
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert json.loads(out) == {"stack": [], "replaced": []}


# --------------------------------------------------------------------------- the role: the branch being replaced


MOVE = role_run.Batch(
    FAKE_FACTS,
    [
        role_run.import_role("nvidia_driver", "validate"),
        role_run.import_role("nvidia_driver", "preflight", skip_apt_source=True),
    ],
    after=[role_run.capture(role_run.names("__nvidia_driver_replaced", "__nvidia_driver_packages"))],
)

FACT_535 = {
    "nvidia_driver": {
        "branch": "535",
        "source": "nvidia",
        "installed_version": "535.261.03",
        "pinned_version": "535.261.03",
        "loaded_version": "535.261.03",
    }
}


def test_a_move_from_535_to_580_on_ubuntu_replaces_the_535_packages():
    cfg = MOVE.get(
        "ubuntu2204",
        nvidia_driver_source="nvidia",
        nvidia_driver_branch="580",
        nvidia_driver_version="580.95.05",
        ansible_local=FACT_535,
    )
    assert cfg["__nvidia_driver_packages"] == ["nvidia-headless-580", "nvidia-utils-580"]
    replaced = cfg["__nvidia_driver_replaced"]
    assert (replaced["branch"], replaced["packages"]) == ("535", ["nvidia-headless-535", "nvidia-utils-535"])
    assert "*nvidia*-535" in replaced["pin_patterns"]


@pytest.mark.parametrize(
    ("facts", "source", "branch", "local"),
    [
        ("ubuntu2204", "nvidia", "535", FACT_535),  # the same branch: an upgrade within it, the same names
        # installed from another source (Canonical's): not a branch move of this source's packages
        ("ubuntu2204", "nvidia", "580", {"nvidia_driver": {**FACT_535["nvidia_driver"], "source": "ubuntu"}}),
        ("ubuntu2204", "nvidia", "580", {}),  # nothing installed by gpufleet
    ],
    ids=["same-branch", "other-source", "no-fact"],
)
def test_nothing_is_replaced_otherwise(facts, source, branch, local):
    cfg = MOVE.get(facts, nvidia_driver_source=source, nvidia_driver_branch=branch, ansible_local=local)
    assert cfg["__nvidia_driver_replaced"] == {"branch": "", "packages": [], "pin_patterns": []}


# --------------------------------------------------------------------------- transaction.yml: the refusal


JUDGE = role_run.Batch(
    FAKE_FACTS,
    [
        role_run.import_role("nvidia_driver", "validate"),
        role_run.import_role("nvidia_driver", "preflight", skip_apt_source=True),
        # The holds as stack.yml's module would have read them (the case's judge_held and judge_releasable): task
        # variables over the role's, which read them from that module's registered result.
        role_run.import_role(
            "nvidia_driver",
            "transaction",
            vars={"__nvidia_driver_held": "{{ judge_held }}", "__nvidia_driver_releasable": "{{ judge_releasable }}"},
        ),
    ],
)


def _judge(text: str, held: list, releasable: list, **settings):
    return JUDGE.get(
        "ubuntu2204",
        nvidia_driver_source="nvidia",
        nvidia_driver_branch="580",
        nvidia_driver_version="580.95.05",
        ansible_local=FACT_535,
        __nvidia_driver_simulation_text=text,
        judge_held=held,
        judge_releasable=releasable,
        **settings,
    )


def test_play_1_refuses_the_move_that_apt_would_refuse_naming_the_held_packages():
    """Holds the install would keep (here: the whole old stack, as before the fix) stop the host, before any change."""
    outcome = _judge(apt_output("simulate-branch-held.txt"), OLD_STACK, [])
    message = outcome.failure
    assert message and "apt refuses to install driver 580.95.05" in message and "replacing branch 535" in message
    assert "Held packages that are not gpufleet's driver stack stand in the way: libnvidia-cfg1-535" in message
    assert "pkgProblemResolver::Resolve generated breaks" in message and "Nothing has been changed" in message


def test_the_move_passes_with_the_holds_the_install_lifts():
    outcome = _judge(apt_output("simulate-branch-released.txt"), OLD_STACK, OLD_STACK)
    assert outcome.failure is None
    assert filters.driver_transaction_refusal(apt_output("simulate-branch-released.txt"), []) == ""


def test_a_kernel_in_the_transaction_stops_the_host_unless_allowed():
    text = apt_output("simulate-branch-released.txt").replace(
        "Inst nvidia-firmware-580-580.95.05 (", "Inst linux-image-6.1.0-51-amd64 (", 1
    )
    message = _judge(text, OLD_STACK, OLD_STACK).failure
    assert message and "would also install linux-image-6.1.0-51-amd64" in message
    assert _judge(text, OLD_STACK, OLD_STACK, nvidia_driver_allow_kernel_install=True).failure is None


def test_the_refusal_names_what_apt_names_when_no_hold_is_in_the_way():
    """The held capture, judged without its holds: apt's own errors and the packages it names, no hold blamed."""
    message = filters.driver_transaction_refusal(
        apt_output("simulate-branch-held.txt"), [], host="n1", version="580.95.05", packages=["nvidia-driver-580"]
    )
    assert message.startswith("nvidia_driver on n1: apt refuses to install driver 580.95.05 (nvidia-driver-580): ")
    assert "stand in the way" not in message and ". apt names: " in message
    assert filters.driver_transaction_refusal("", OLD_STACK) == ""


# --------------------------------------------------------------------------- the lab's fixture of the two branches


@pytest.fixture(scope="module")
def branches(tmp_path_factory) -> Path:
    for tool in ("gpg", "dpkg-deb", "apt-ftparchive", "gcc"):
        host_tool(tool)
    work = tmp_path_factory.mktemp("branches")
    home = work / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch"]
    subprocess.run(
        [*gpg, "--passphrase", "", "--quick-gen-key", "gpufleet fixture test", "ed25519", "sign", "1d"],
        check=True,
        capture_output=True,
    )
    fpr = (
        subprocess.run([*gpg, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True)
        .stdout.split("fpr:::::::::")[1]
        .split(":")[0]
    )
    keyring = work / "cuda-keyring_1.1-1_all.deb"
    keyring.write_bytes(b"")  # copied as it is; its content is the site repository's business
    out = work / "nvidia-branches"
    subprocess.run(
        ["python3", str(FIXTURE), str(out), str(home), fpr, str(keyring)],
        check=True,
        capture_output=True,
        env={**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    return out


def _stanzas(repo: Path) -> dict:
    """Package -> its fields as the Packages index writes them (continuation lines joined)."""
    out = {}
    for paragraph in (repo / "Packages").read_text().strip().split("\n\n"):
        fields, last = {}, None
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t") and last:
                fields[last] += " " + line.strip()
            else:
                last, _colon, value = line.partition(":")
                fields[last] = value.strip()
        out[fields["Package"]] = fields
    return out


def test_the_fixture_says_what_it_is_and_claims_no_vendor_build(branches):
    release = (branches / "Release").read_text()
    assert "Origin: gpufleet-lab" in release and "Label: gpufleet-lab-fixture-nvidia-branches" in release
    assert (branches / "InRelease").exists() and (branches / "Release.gpg").exists()
    versions = {s["Version"] for s in _stanzas(branches).values()}
    assert versions == {"535.261.03-0gpufleetlab1", "580.95.05-0gpufleetlab1"}


def test_the_fixture_has_the_relations_of_the_published_packages(branches):
    """canonical/nvidia-graphics-drivers debian/control, branches 535-jammy (52ca25b) and 580-jammy (f2468bb)."""
    stanzas = _stanzas(branches)
    assert sorted(name for name in stanzas if name.endswith("-535") or "-535-" in name) == OLD_STACK
    for branch in ("535", "580"):
        utils = stanzas[f"nvidia-utils-{branch}"]
        assert utils["Provides"] == utils["Conflicts"] == utils["Replaces"] == "nvidia-utils, nvidia-smi"
        assert stanzas[f"nvidia-headless-{branch}"]["Conflicts"] == "nvidia-headless"
        assert stanzas[f"libnvidia-compute-{branch}"]["Conflicts"].startswith("libnvidia-compute, nvidia-opencl-icd")
    # 580's, not 535's: the versioned virtual package of nvidia-kernel-common, and libcuda up to 12.8.
    assert "nvidia-kernel-common-580-580.95.05" in stanzas["nvidia-kernel-common-580"]["Provides"]
    assert stanzas["nvidia-utils-580"]["Depends"] == "nvidia-kernel-common-580-580.95.05"
    assert "libcuda-12.8-1" in stanzas["libnvidia-compute-580"]["Provides"]
    assert "libcuda-12.8-1" not in stanzas["libnvidia-compute-535"]["Provides"]


def test_the_fixtures_branches_ship_the_same_files_as_the_real_ones_do(branches):
    def contents(deb: str) -> set:
        listing = subprocess.run(
            ["dpkg-deb", "-c", str(branches / deb)], check=True, capture_output=True, text=True
        ).stdout
        return {line.split()[5] for line in listing.splitlines()}

    for package, shared in [
        ("nvidia-utils", "./usr/bin/nvidia-smi"),
        ("libnvidia-compute", "./usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        ("nvidia-kernel-common", "./lib/udev/rules.d/71-nvidia.rules"),
    ]:
        assert shared in contents(f"{package}-535_535.261.03-0gpufleetlab1_amd64.deb")
        assert shared in contents(f"{package}-580_580.95.05-0gpufleetlab1_amd64.deb")
    source = contents("nvidia-kernel-source-580_580.95.05-0gpufleetlab1_amd64.deb")
    assert {"./usr/src/nvidia-580.95.05/dkms.conf", "./usr/src/nvidia-580.95.05/nvidia.c"} <= source
