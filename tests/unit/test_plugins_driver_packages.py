"""The filters that read the Debian packages of a driver, called directly: apt_stanzas, debian_version_compare,
newest_build, fleet_release, package_branch, foreign_branches, signed_module_packages, signed_module_version,
module_version_matches and signed_module_mismatches."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from plugin_files import filters

# --- apt_stanzas ---------------------------------------------------------------
# Stanzas as apt-cache show / a Packages index prints them (Debian Policy 5.1, 5.6, 7.1). packages.ubuntu.com shows a
# binary's version, source, synopsis and the relations of each architecture; the stanzas below are those facts for
# amd64, written out in the Packages format (one per page cited above it).

# https://packages.ubuntu.com/noble/libs/libnvidia-extra-535-server (535.309.01-0ubuntu0.24.04.2, noble-security:
# "dep: libnvidia-extra-580-server [not arm64]", "dep: libc6 (>= 2.34) [arm64]").
NOBLE_EXTRA_535_TRANSITIONAL = """Package: libnvidia-extra-535-server
Architecture: amd64
Version: 535.309.01-0ubuntu0.24.04.2
Source: nvidia-graphics-drivers-535-server
Depends: libnvidia-extra-580-server
Description: Extra libraries for the NVIDIA Server Driver (transitional package)
"""
# https://packages.ubuntu.com/ca/noble-updates/libnvidia-extra-535-server (535.309.01-0ubuntu0.24.04.1, the build
# before: a real 535 library, "dep: libc6 (>= 2.34)").
NOBLE_EXTRA_535 = """Package: libnvidia-extra-535-server
Architecture: amd64
Version: 535.309.01-0ubuntu0.24.04.1
Source: nvidia-graphics-drivers-535-server
Depends: libc6 (>= 2.34)
Description: Extra libraries for the NVIDIA Server Driver
"""
# https://packages.ubuntu.com/cs/noble-updates/libnvidia-compute-535-server (535.309.01-0ubuntu0.24.04.1: "dep: libc6
# (>= 2.34)", "dep: libgcc-s1 (>= 4.2) [not i386]", "dep: libssl3t64 (>= 3.0.0) [amd64]").
NOBLE_COMPUTE_535 = """Package: libnvidia-compute-535-server
Architecture: amd64
Version: 535.309.01-0ubuntu0.24.04.1
Source: nvidia-graphics-drivers-535-server
Depends: libc6 (>= 2.34), libgcc-s1 (>= 4.2), libssl3t64 (>= 3.0.0)
Description: NVIDIA libcompute package
"""
# https://packages.ubuntu.com/jammy/cuda-drivers-fabricmanager-535 (535.309.01-0ubuntu0.22.04.1, jammy-security,
# source fabric-manager-535: "dep: nvidia-fabricmanager-535 (= 535.309.01-0ubuntu0.22.04.1)"). Since then jammy
# carries 535.309.01-0ubuntu0.22.04.2, "Meta-package for FM and Driver (transitional package)"
# (https://packages.ubuntu.com/search?lang=fr&arch=any&keywords=cuda-drivers-fabricmanager-535); the Depends of that
# build were not seen (not confirmed), so it is not written out here.
JAMMY_FM_535 = """Package: cuda-drivers-fabricmanager-535
Architecture: amd64
Version: 535.309.01-0ubuntu0.22.04.1
Source: fabric-manager-535
Depends: nvidia-fabricmanager-535 (= 535.309.01-0ubuntu0.22.04.1)
Description: Meta-package for FM and Driver
"""
# https://packages.ubuntu.com/ca/questing/cuda-drivers-fabricmanager-535 (535.261.03-0ubuntu2, questing:
# "dep: cuda-drivers-fabricmanager-580").
QUESTING_FM_535 = """Package: cuda-drivers-fabricmanager-535
Architecture: amd64
Version: 535.261.03-0ubuntu2
Source: fabric-manager-535
Depends: cuda-drivers-fabricmanager-580
Description: Meta-package for FM and Driver
"""
# https://packages.ubuntu.com/uk/questing/amd64/nvidia-kernel-common-535-server (535.261.03-0ubuntu2:
# "dep: nvidia-kernel-common-580-server").
QUESTING_KERNEL_COMMON_535 = """Package: nvidia-kernel-common-535-server
Architecture: amd64
Version: 535.261.03-0ubuntu2
Source: nvidia-graphics-drivers-535-server
Depends: nvidia-kernel-common-580-server
Description: Shared files used with the kernel module (transitional package)
"""
# https://packages.ubuntu.com/pl/plucky/nvidia-utils-580-server (580.95.05-0ubuntu0.25.04.1: "dep: libc6 (>= 2.34)",
# "dep: libnvidia-compute-580-server (>= 580.95.05)", "dep: nvidia-kernel-common-580-server
# (= 580.95.05-0ubuntu0.25.04.1)", "sug: nvidia-driver-580-server").
PLUCKY_UTILS_580 = """Package: nvidia-utils-580-server
Architecture: amd64
Version: 580.95.05-0ubuntu0.25.04.1
Source: nvidia-graphics-drivers-580-server
Depends: libc6 (>= 2.34), libnvidia-compute-580-server (>= 580.95.05),
 nvidia-kernel-common-580-server (= 580.95.05-0ubuntu0.25.04.1)
Suggests: nvidia-driver-580-server
Description: NVIDIA Server Driver support binaries
"""
# https://packages.ubuntu.com/uk/questing-updates/nvidia-utils-580-server (580.159.03-0ubuntu0.25.10.1: the kernel
# side as the virtual package "nvidia-kernel-common-580-server-580.159.03", "virtual package provided by
# nvidia-kernel-common-580-server").
QUESTING_UTILS_580 = """Package: nvidia-utils-580-server
Architecture: amd64
Version: 580.159.03-0ubuntu0.25.10.1
Source: nvidia-graphics-drivers-580-server
Depends: libc6 (>= 2.34), libnvidia-compute-580-server (>= 580.159.03), nvidia-kernel-common-580-server-580.159.03
Suggests: nvidia-driver-580-server
Description: NVIDIA Server Driver support binaries
"""
# Debian Policy 7.1's example (as quoted in Debian bug #892142, Policy 4.1.3): a relation with alternatives.
POLICY_MUTT = """Package: mutt
Version: 1.3.17-1
Depends: libc6 (>= 2.2.1), exim | mail-transport-agent
"""


def _rel(name, relation="", version=""):
    return {"name": name, "relation": relation, "version": version}


def test_apt_stanzas_reads_package_version_source_description_and_depends():
    [stanza] = filters.apt_stanzas(NOBLE_EXTRA_535_TRANSITIONAL)
    assert (stanza["Package"], stanza["Version"], stanza["Source"], stanza["Architecture"]) == (
        "libnvidia-extra-535-server",
        "535.309.01-0ubuntu0.24.04.2",
        "nvidia-graphics-drivers-535-server",
        "amd64",
    )
    assert stanza["Description"] == "Extra libraries for the NVIDIA Server Driver (transitional package)"
    assert stanza["Depends"] == [[_rel("libnvidia-extra-580-server")]]
    assert stanza["Pre-Depends"] == stanza["Recommends"] == stanza["Provides"] == []


def test_apt_stanzas_reads_versioned_relations_continuation_lines_and_alternatives():
    [utils] = filters.apt_stanzas(PLUCKY_UTILS_580)
    assert utils["Depends"] == [
        [_rel("libc6", ">=", "2.34")],
        [_rel("libnvidia-compute-580-server", ">=", "580.95.05")],
        [_rel("nvidia-kernel-common-580-server", "=", "580.95.05-0ubuntu0.25.04.1")],
    ]
    assert utils["Suggests"] == [[_rel("nvidia-driver-580-server")]]
    [mutt] = filters.apt_stanzas(POLICY_MUTT)
    assert mutt["Depends"] == [[_rel("libc6", ">=", "2.2.1")], [_rel("exim"), _rel("mail-transport-agent")]]
    # No Source field: the source package has the binary's name (Debian Policy 5.6.1).
    assert mutt["Source"] == "mutt" and mutt["Description"] == ""


def test_apt_stanzas_reads_several_stanzas_in_order_and_skips_other_lines():
    text = (
        "N: There are 2 additional records. Please use the '-a' switch to see them.\n\n"
        + NOBLE_EXTRA_535_TRANSITIONAL
        + "\n"
        + NOBLE_EXTRA_535.replace("\n", "\r\n")
        + "\n\n"
    )
    stanzas = filters.apt_stanzas(text)
    assert [s["Version"] for s in stanzas] == ["535.309.01-0ubuntu0.24.04.2", "535.309.01-0ubuntu0.24.04.1"]
    assert stanzas[1]["Depends"] == [[_rel("libc6", ">=", "2.34")]]
    assert filters.apt_stanzas("") == filters.apt_stanzas(None) == []


def test_apt_stanzas_keeps_the_synopsis_and_the_source_name_only():
    # Format features of Debian Policy 5.6.1 (Source: name (version)), 5.6.13 (Description: synopsis, then the
    # extended description on continuation lines) and 7.1 (arch qualifiers, [arch] restrictions); apt-cache show
    # prints Description-en where translated descriptions are shipped (Ubuntu).
    text = (
        "Package: libnvidia-extra-535-server\n"
        "Version: 535.309.01-0ubuntu0.24.04.2\n"
        "Source: nvidia-graphics-drivers-535-server (535.309.01-0ubuntu0.24.04.2)\n"
        "Depends: libc6:any (>= 2.34) [arm64],\n libnvidia-extra-580-server [!arm64]\n"
        "Description-en: Extra libraries for the NVIDIA Server Driver (transitional package)\n"
        " This is a transitional package.\n .\n Second paragraph.\n"
    )
    [stanza] = filters.apt_stanzas(text)
    assert stanza["Source"] == "nvidia-graphics-drivers-535-server"
    assert stanza["Description"] == "Extra libraries for the NVIDIA Server Driver (transitional package)"
    assert stanza["Description-en"].splitlines()[1:] == ["This is a transitional package.", ".", "Second paragraph."]
    assert stanza["Depends"] == [[_rel("libc6", ">=", "2.34")], [_rel("libnvidia-extra-580-server")]]


def test_apt_stanzas_refuses_a_relation_it_cannot_read():
    with pytest.raises(AnsibleFilterError, match="not a package relation"):
        filters.apt_stanzas("Package: x\nVersion: 1\nDepends: libc6 (>= 2.34\n")


# --- debian_version_compare / newest_build -------------------------------------


@pytest.mark.parametrize(
    "older, newer",
    [
        # Debian Policy 5.6.12: "~" sorts before anything, even the end of a part; the epoch counts first.
        ("1.0~rc1", "1.0"),
        ("1.0", "1.0+b1"),
        ("1.0-1", "1:0.9-1"),
        ("1.0-1~deb12u1", "1.0-1"),
        ("2.9", "2.10"),
        ("1.0a", "1.0+"),
        # Canonical's revision of a stable-release update: 0ubuntu0.22.04.2 replaces 0ubuntu0.22.04.1
        # (https://packages.ubuntu.com/source/jammy/libs/fabric-manager-535: 535.309.01-0ubuntu0.22.04.2 after
        # https://packages.ubuntu.com/jammy/cuda-drivers-fabricmanager-535: 535.309.01-0ubuntu0.22.04.1).
        ("535.309.01-0ubuntu0.22.04.1", "535.309.01-0ubuntu0.22.04.2"),
        # NVIDIA's revisions sort above Canonical's for one upstream version (issue 14 finding 3): its repository's
        # "-1" (cuda-drivers-fabricmanager 535.129.03-1, NVIDIA/apt-packaging-fabric-manager#3) and "-0ubuntu1"
        # (libnvidia-extra-535_535.261.03-0ubuntu1_amd64.deb of .../repos/ubuntu2204/x86_64, as an apt log quotes it).
        # Canonical's side has the form of its jammy builds above; these two exact jammy builds were not seen.
        ("535.129.03-0ubuntu0.22.04.1", "535.129.03-1"),
        ("535.261.03-0ubuntu0.22.04.1", "535.261.03-0ubuntu1"),
        ("535.261.03-0ubuntu1", "535.261.03-1"),
        # Debian's builds: trixie's libnvidia-tesla-535-cuda1 535.216.03-3 (https://packages.debian.org/trixie/libnvidia-tesla-535-cuda1)
        # and bookworm's libcuda1 535.261.03-1 (https://packages.debian.org/it/bookworm/libcuda1).
        ("535.216.03-3", "535.261.03-1"),
    ],
)
def test_debian_version_compare_orders_as_dpkg_does(older, newer):
    assert filters.debian_version_compare(older, newer) == -1
    assert filters.debian_version_compare(newer, older) == 1
    assert filters.debian_version_compare(newer, newer) == 0


def test_debian_version_compare_treats_a_missing_revision_and_epoch_as_zero():
    assert filters.debian_version_compare("0:1.0", "1.0") == 0
    assert filters.debian_version_compare("1.0", "1.0-0") == 0
    assert filters.debian_version_compare("1.00", "1.0") == 0


@pytest.mark.parametrize("version", ["", None, "x1.0", "1.0 2", "a:1.0"])
def test_debian_version_compare_refuses_what_is_not_a_version(version):
    with pytest.raises(AnsibleFilterError, match="not a Debian version"):
        filters.debian_version_compare(version, "1.0")


# `apt-cache policy cuda-drivers-fabricmanager` against NVIDIA's ubuntu2204/x86_64 repository, as posted in
# https://github.com/NVIDIA/apt-packaging-fabric-manager/issues/3: NVIDIA keeps every build of every branch.
NVIDIA_FM_VERSIONS = ["550.54.14-1", "545.23.08-1", "545.23.06-1", "535.161.07-1", "535.154.05-1", "535.129.03-1"]
# Builds Canonical published for jammy, one at a time (a pocket keeps the newest only): 535.247.01-0ubuntu0.22.04.1
# of nvidia-graphics-drivers-535-server (https://packages.ubuntu.com/en/jammy-updates/nvidia-kernel-common-535-server
# when it was current), 535.309.01-0ubuntu0.22.04.1 of fabric-manager-535 and 535.309.01-0ubuntu0.22.04.2 of both
# (pages cited above); a jammy 535.288.01 build was not seen (not confirmed), so it is not among them.
CANONICAL_JAMMY_535 = ["535.247.01-0ubuntu0.22.04.1", "535.309.01-0ubuntu0.22.04.2", "535.309.01-0ubuntu0.22.04.1"]


def test_newest_build_picks_the_newest_of_the_branch_in_nvidia_repository():
    assert filters.newest_build(NVIDIA_FM_VERSIONS, "535") == "535.161.07-1"
    assert filters.newest_build(NVIDIA_FM_VERSIONS, 545) == "545.23.08-1"
    assert filters.newest_build(NVIDIA_FM_VERSIONS, "580") == ""


def test_newest_build_picks_canonical_latest_revision():
    assert filters.newest_build(CANONICAL_JAMMY_535, "535") == "535.309.01-0ubuntu0.22.04.2"


def test_newest_build_reads_stanzas_too():
    stanzas = filters.apt_stanzas(NOBLE_EXTRA_535 + "\n" + NOBLE_EXTRA_535_TRANSITIONAL + "\n" + PLUCKY_UTILS_580)
    assert filters.newest_build(stanzas, "535") == "535.309.01-0ubuntu0.24.04.2"
    assert filters.newest_build(stanzas, "580") == "580.95.05-0ubuntu0.25.04.1"
    assert filters.newest_build([], "535") == filters.newest_build(None, "535") == ""


# --- fleet_release (nvidia_driver_version: latest) ------------------------------


def test_fleet_release_is_the_newest_release_every_host_offers():
    # A focal host: Canonical's focal builds have the form -0ubuntu0.20.04.N (this exact build is assumed, not seen);
    # the release, not the version string, is what the hosts share.
    jammy = CANONICAL_JAMMY_535
    focal = ["535.247.01-0ubuntu0.20.04.1"]
    assert filters.fleet_release([jammy, focal], "535") == "535.247.01"
    assert filters.fleet_release([jammy], "535") == "535.309.01"
    assert filters.fleet_release([NVIDIA_FM_VERSIONS, NVIDIA_FM_VERSIONS[1:]], 545) == "545.23.08"


def test_fleet_release_is_empty_without_a_common_release_of_the_branch():
    assert filters.fleet_release([CANONICAL_JAMMY_535, NVIDIA_FM_VERSIONS], "535") == ""
    assert filters.fleet_release([NVIDIA_FM_VERSIONS], "580") == ""
    assert filters.fleet_release([], "535") == filters.fleet_release(None, "535") == ""
    assert filters.fleet_release([[]], "535") == ""


def test_fleet_release_reads_stanzas_too():
    stanzas = filters.apt_stanzas(NOBLE_EXTRA_535 + "\n" + NOBLE_EXTRA_535_TRANSITIONAL)
    assert filters.fleet_release([stanzas], "535") == "535.309.01"


# --- package_branch / foreign_branches ------------------------------------------


@pytest.mark.parametrize(
    "name, branch",
    [
        ("libnvidia-extra-580-server", "580"),
        ("nvidia-utils-535-server", "535"),
        ("cuda-drivers-580", "580"),
        ("cuda-drivers-fabricmanager-535", "535"),
        ("nvidia-fabricmanager-535", "535"),
        ("libnvidia-nscq-535", "535"),
        ("libnvidia-cfg1-535", "535"),
        ("nvidia-headless-no-dkms-535-server", "535"),
        # Virtual package of the 580-server kernel side (packages.ubuntu.com, questing-updates nvidia-utils-580-server).
        ("nvidia-kernel-common-580-server-580.159.03", "580"),
        # Signed modules: per kernel, and flavour metapackages (packages.ubuntu.com, jammy linux-restricted-modules).
        ("linux-modules-nvidia-535-server-5.15.0-91-generic", "535"),
        ("linux-modules-nvidia-390-5.15.0-186-generic", "390"),
        ("linux-modules-nvidia-535-server-generic-hwe-22.04", "535"),
        ("linux-modules-nvidia-580-server-generic", "580"),
        ("nvidia-tesla-535-driver", "535"),
        # No branch: generic libraries, Debian's unversioned names, the kernel's ABI number, the meta cuda-drivers.
        ("libc6", ""),
        ("libgcc-s1", ""),
        ("libssl3t64", ""),
        ("nvidia-kernel-dkms", ""),
        ("nvidia-driver", ""),
        ("cuda-drivers", ""),
        ("linux-image-5.15.0-106-generic", ""),
        ("linux-signatures-nvidia-5.15.0-106-generic", ""),
        ("cuda-toolkit-12-1", ""),
        ("datacenter-gpu-manager", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_package_branch_reads_the_branch_a_name_carries(name, branch):
    assert filters.package_branch(name) == branch


def _foreign(package, version, depends_on, branch):
    return {"package": package, "version": version, "depends_on": depends_on, "branch": branch}


def test_foreign_branches_names_canonical_transitional_535_server_packages():
    # Canonical's 535-server packages after R535's end of life depend on 580-server ones (issue 14 finding 1).
    stanzas = filters.apt_stanzas(
        "\n".join([NOBLE_EXTRA_535_TRANSITIONAL, QUESTING_FM_535, QUESTING_KERNEL_COMMON_535])
    )
    assert filters.foreign_branches(stanzas, "535") == [
        _foreign("libnvidia-extra-535-server", "535.309.01-0ubuntu0.24.04.2", "libnvidia-extra-580-server", "580"),
        _foreign("cuda-drivers-fabricmanager-535", "535.261.03-0ubuntu2", "cuda-drivers-fabricmanager-580", "580"),
        _foreign("nvidia-kernel-common-535-server", "535.261.03-0ubuntu2", "nvidia-kernel-common-580-server", "580"),
    ]


def test_foreign_branches_passes_genuine_535_packages():
    # Depends on libc6, libgcc-s1, libssl3t64 and on 535 names only.
    text = "\n".join([NOBLE_EXTRA_535, NOBLE_COMPUTE_535, JAMMY_FM_535])
    assert filters.foreign_branches(text, "535") == []
    assert filters.foreign_branches(filters.apt_stanzas(text), 535) == []


def test_foreign_branches_reads_versioned_and_virtual_names_and_the_branch_asked_for():
    stanzas = filters.apt_stanzas(PLUCKY_UTILS_580 + "\n" + QUESTING_UTILS_580)
    assert filters.foreign_branches(stanzas, "580") == []
    # The same stanzas are foreign to 535: what a 535 candidate must not pull in. Suggests do not count.
    assert filters.foreign_branches(stanzas, "535") == [
        _foreign("nvidia-utils-580-server", "580.95.05-0ubuntu0.25.04.1", "libnvidia-compute-580-server", "580"),
        _foreign("nvidia-utils-580-server", "580.95.05-0ubuntu0.25.04.1", "nvidia-kernel-common-580-server", "580"),
        _foreign("nvidia-utils-580-server", "580.159.03-0ubuntu0.25.10.1", "libnvidia-compute-580-server", "580"),
        _foreign(
            "nvidia-utils-580-server",
            "580.159.03-0ubuntu0.25.10.1",
            "nvidia-kernel-common-580-server-580.159.03",
            "580",
        ),
    ]


def test_foreign_branches_names_a_535_package_built_from_580():
    # https://packages.ubuntu.com/ru/resolute/libnvidia-extra-535-server: 580.159.03-0ubuntu0.26.04.1, source
    # nvidia-graphics-drivers-580-server, "dep: libnvidia-extra-580-server", "(transitional package)".
    text = (
        "Package: libnvidia-extra-535-server\nVersion: 580.159.03-0ubuntu0.26.04.1\n"
        "Source: nvidia-graphics-drivers-580-server\nDepends: libnvidia-extra-580-server\n"
        "Description: Extra libraries for the NVIDIA Server Driver (transitional package)\n"
    )
    assert filters.foreign_branches(text, "535") == [
        _foreign("libnvidia-extra-535-server", "580.159.03-0ubuntu0.26.04.1", "", "580"),
        _foreign("libnvidia-extra-535-server", "580.159.03-0ubuntu0.26.04.1", "libnvidia-extra-580-server", "580"),
    ]


def test_foreign_branches_names_signed_module_metapackages_moved_to_580():
    # https://packages.ubuntu.com/questing/kernel/linux-modules-nvidia-535-server-generic-hwe-24.04-edge
    # (6.17.0-40.40, "dummy transitional package": "dep: linux-modules-nvidia-580-server-generic-hwe-24.04-edge").
    # Its own version is the kernel's, which is no branch.
    text = (
        "Package: linux-modules-nvidia-535-server-generic-hwe-24.04-edge\nVersion: 6.17.0-40.40\n"
        "Source: linux-restricted-modules\nDepends: linux-modules-nvidia-580-server-generic-hwe-24.04-edge\n"
    )
    assert filters.foreign_branches(text, "535") == [
        _foreign(
            "linux-modules-nvidia-535-server-generic-hwe-24.04-edge",
            "6.17.0-40.40",
            "linux-modules-nvidia-580-server-generic-hwe-24.04-edge",
            "580",
        )
    ]


def test_foreign_branches_does_not_judge_names_of_no_branch():
    # NVIDIA's Debian cuda-drivers-580 580.105.08-1 (its Depends as quoted in NVIDIA's developer forum,
    # https://forums.developer.nvidia.com/t/debian-cuda-drivers-580-package-580-105-08-1-improperly-pulls-in-v590-components/353805)
    # pulls 590 components through unbounded ">=" on names of no branch: not a case this filter can see.
    text = (
        "Package: cuda-drivers-580\nVersion: 580.105.08-1\n"
        "Depends: nvidia-driver (>= 580.65.06), nvidia-driver-cuda (>= 580.65.06), nvidia-kernel-dkms (>= 580.65.06),"
        " nvidia-settings (>= 580.65.06), nvidia-xconfig (>= 580.65.06)\n"
    )
    assert filters.foreign_branches(text, "580") == []
    # An entry that a package of the branch (or of no branch) also satisfies is not foreign.
    either = (
        "Package: x-nvidia-535\nVersion: 535.1-1\nDepends: libnvidia-gl-580 | libnvidia-gl-535, libfoo-580 | libgl1\n"
    )
    assert filters.foreign_branches(either, "535") == []


# --- signed_module_packages / signed_module_version / module_version_matches ----


def test_signed_module_packages_names_the_kernel_packages_and_the_flavour_metapackage():
    # Names of Canonical's linux-restricted-modules. Per kernel, linux-modules-nvidia-<branch>[-server]-<uname -r>:
    # https://packages.ubuntu.com/jammy/kernel/linux-modules-nvidia-550-5.15.0-106-generic lists
    # linux-modules-nvidia-470-server-5.15.0-106-generic and linux-modules-nvidia-535-5.15.0-106-generic (the 535-server
    # one of that kernel was not in the part of the list seen; the pattern was). The flavour metapackage
    # linux-modules-nvidia-535-server-generic: jammy's linux-modules-nvidia-510-server-generic depends on it on amd64
    # (https://packages.ubuntu.com/eu/jammy/linux-modules-nvidia-510-server-generic).
    assert filters.signed_module_packages(["5.15.0-106-generic"], "535") == [
        "linux-modules-nvidia-535-server-5.15.0-106-generic",
        "linux-modules-nvidia-535-server-generic",
    ]
    assert filters.signed_module_packages("5.15.0-106-generic", 535, server=False) == [
        "linux-modules-nvidia-535-5.15.0-106-generic",
        "linux-modules-nvidia-535-generic",
    ]


def test_signed_module_packages_takes_the_hwe_flavour_of_the_kernel_metapackage():
    # canonical/ubuntu-drivers-common: get_linux_modules_metapackage() (UbuntuDrivers/detect.py) names
    # linux-modules-nvidia-<driver>-<linux metapackage without "linux-">; its tests/test_ubuntu_drivers.py archive has
    # linux-modules-nvidia-535-server-generic-hwe-20.04 depending on linux-modules-nvidia-535-server-5.4.0-25-generic
    # and expects linux-modules-nvidia-535-generic-hwe-20.04 for linux-generic-hwe-20.04. On 22.04,
    # `ubuntu-drivers list` prints "nvidia-driver-535-server, (kernel modules provided by
    # linux-modules-nvidia-535-server-generic-hwe-22.04)" (as users posted it).
    assert filters.signed_module_packages(["5.4.0-25-generic"], "535", ["linux-generic-hwe-20.04"]) == [
        "linux-modules-nvidia-535-server-5.4.0-25-generic",
        "linux-modules-nvidia-535-server-generic-hwe-20.04",
    ]
    assert filters.signed_module_packages([], "535", "generic-hwe-22.04") == [
        "linux-modules-nvidia-535-server-generic-hwe-22.04"
    ]
    # Two kernels of one flavour (the running one and the one the next boot starts): one metapackage.
    assert filters.signed_module_packages(["5.15.0-106-generic", "5.15.0-174-generic"], "535") == [
        "linux-modules-nvidia-535-server-5.15.0-106-generic",
        "linux-modules-nvidia-535-server-5.15.0-174-generic",
        "linux-modules-nvidia-535-server-generic",
    ]


def test_signed_module_packages_needs_a_flavour():
    with pytest.raises(AnsibleFilterError, match="no Ubuntu kernel flavour"):
        filters.signed_module_packages(["5.15.0-106"], "535")


# https://packages.ubuntu.com/pl/resolute/kernel/linux-modules-nvidia-595-server-nvidia (7.0.0-1015.15+1, source
# linux-restricted-modules-nvidia: "dep: linux-modules-nvidia-595-server-7.0.0-1015-nvidia (= 7.0.0-1015.15+1)",
# "dep: nvidia-kernel-common-595-server (>= 595.71.05)"): the package has the kernel's version, the driver version
# is in its dependency on the branch's kernel-common package.
RESOLUTE_MODULES_595 = """Package: linux-modules-nvidia-595-server-nvidia
Architecture: amd64
Version: 7.0.0-1015.15+1
Source: linux-restricted-modules-nvidia
Depends: linux-modules-nvidia-595-server-7.0.0-1015-nvidia (= 7.0.0-1015.15+1),
 nvidia-kernel-common-595-server (>= 595.71.05)
Description: Extra drivers for nvidia-595-server for the nvidia flavour
"""
# https://packages.ubuntu.com/jammy/linux-modules-nvidia-390-generic-5.15 (5.15.0-186.196+1: "dep:
# linux-modules-nvidia-390-5.15.0-186-generic (= 5.15.0-186.196+1)", "dep: nvidia-kernel-common-390 (>= 390.157)").
JAMMY_MODULES_390 = """Package: linux-modules-nvidia-390-generic-5.15
Architecture: amd64
Version: 5.15.0-186.196+1
Source: linux-restricted-modules
Depends: linux-modules-nvidia-390-5.15.0-186-generic (= 5.15.0-186.196+1), nvidia-kernel-common-390 (>= 390.157)
Description: Extra drivers for nvidia-390 for the generic-5.15 flavour
"""


def test_signed_module_version_is_the_kernel_common_dependency_not_the_package_version():
    assert filters.signed_module_version(RESOLUTE_MODULES_595) == "595.71.05"
    assert filters.signed_module_version(filters.apt_stanzas(JAMMY_MODULES_390)[0]) == "390.157"
    assert filters.signed_module_version(NOBLE_EXTRA_535) == ""
    assert filters.signed_module_version("") == filters.signed_module_version(None) == ""


def test_module_version_matches_the_userspace_upstream_version():
    # Userspace of resolute: nvidia-utils-595-server 595.71.05-0ubuntu0.26.04.1
    # (https://packages.ubuntu.com/ru/resolute/nvidia-utils-595-server) and nvidia-utils-580-server
    # 580.159.03-0ubuntu0.26.04.1 (https://packages.ubuntu.com/pl/resolute-updates/nvidia-utils-580-server).
    assert filters.module_version_matches(RESOLUTE_MODULES_595, "595.71.05-0ubuntu0.26.04.1")
    assert filters.module_version_matches(filters.apt_stanzas(RESOLUTE_MODULES_595)[0], "595.71.05-0ubuntu0.26.04.1")
    assert not filters.module_version_matches(RESOLUTE_MODULES_595, "580.159.03-0ubuntu0.26.04.1")
    # A version given as such; jammy's 535.309.01 builds (Canonical's and NVIDIA's revisions) against 535.261.03.
    assert filters.module_version_matches("535.309.01", "535.309.01-0ubuntu0.22.04.2")
    assert not filters.module_version_matches("535.309.01-0ubuntu0.22.04.2", "535.261.03-1")
    # Unknown module version, or no userspace version: no match.
    assert not filters.module_version_matches(NOBLE_EXTRA_535, "535.309.01-0ubuntu0.24.04.1")
    assert not filters.module_version_matches("", "535.309.01") and not filters.module_version_matches("535.309.01", "")


def test_signed_module_mismatches_lists_the_packages_of_another_release():
    text = RESOLUTE_MODULES_595 + "\n" + JAMMY_MODULES_390 + "\n" + NOBLE_EXTRA_535
    assert filters.signed_module_mismatches(text, "595.71.05-0ubuntu0.26.04.1") == [
        {"package": "linux-modules-nvidia-390-generic-5.15 5.15.0-186.196+1", "module": "390.157"}
    ]
    # A package that names no release (NOBLE_EXTRA_535) is not judged; none given, none found.
    assert filters.signed_module_mismatches(NOBLE_EXTRA_535, "535.309.01") == []
    assert filters.signed_module_mismatches("", "535.309.01") == filters.signed_module_mismatches(None, "1") == []


def test_the_driver_build_filters_are_registered():
    registered = filters.FilterModule().filters()
    for name in (
        "apt_stanzas",
        "debian_version_compare",
        "newest_build",
        "package_branch",
        "foreign_branches",
        "signed_module_packages",
        "signed_module_version",
        "module_version_matches",
        "signed_module_mismatches",
        "apt_policy",
        "dkms_status",
        "per_message",
    ):
        assert callable(registered[name]), name
