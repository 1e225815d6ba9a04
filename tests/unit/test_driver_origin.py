"""The driver's pin by origin as well as by version (issue 14, finding 3), read by apt itself.

Once the cuda role adds NVIDIA's CUDA repository, packages such as
nvidia-fabricmanager-535 and libnvidia-nscq-535 exist in two origins, and a
pin by version only (535.261.03-*) lets apt take the higher version string of
the two: NVIDIA's 535.261.03-1 sorts above Canonical's
535.261.03-0ubuntu0.22.04.1. The roles write, before the version records, one
record per other repository at priority -1: apt gives a version the first
record that matches it, so no build of the other repository can win. These
tests render the driver's pin (roles/apt_source/templates/pin.pref.j2 for
roles/nvidia_driver's inputs) and ask apt, in a scratch state with two local
repositories whose Release files carry the published Origin and Label, which
version it would install.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import role_run
from conftest import DRIVER, FAKE_FACTS, declare_driver, host_tool, preflight_report
from test_driver_rendering import parse_deb822, pin_text, trial_found, version_stanzas

from ansible_collections.gpufleet.fleet.plugins.filter import gpufleet_filters as filters

VERSION = "535.261.03"
# NVIDIA's own apt pin for its CUDA repository names the repository by its Release Label "NVIDIA CUDA"
# (developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/cuda-ubuntu2204.pin).
NVIDIA_RELEASE = {"Origin": "NVIDIA", "Label": "NVIDIA CUDA"}
# Canonical's archive: Release Origin and Label Ubuntu (archive.ubuntu.com/ubuntu/dists/jammy-updates/Release).
UBUNTU_RELEASE = {"Origin": "Ubuntu", "Label": "Ubuntu", "Suite": "jammy-updates"}
# NVIDIA's ubuntu2204 repository builds the driver's packages -0ubuntu1 and Fabric Manager, NSCQ and cuda-drivers
# -1 (its package index, as installs from it pin them: libnvidia-compute-535=535.183.01-0ubuntu1,
# cuda-drivers-535=535.183.01-1, nvidia-fabricmanager-535=535.183.01-1, libnvidia-nscq-535=535.183.01-1).
NVIDIA_PACKAGES = {
    "nvidia-headless-535": [f"{VERSION}-0ubuntu1", "535.274.02-0ubuntu1"],
    "nvidia-utils-535": [f"{VERSION}-0ubuntu1", "535.274.02-0ubuntu1"],
    "nvidia-fabricmanager-535": [f"{VERSION}-1", "535.274.02-1"],
    "libnvidia-nscq-535": [f"{VERSION}-1", "535.274.02-1"],
}
# Canonical's jammy builds -0ubuntu0.22.04.N, nvidia-fabricmanager-535 too (its own fabric-manager-535 source;
# e.g. nvidia-fabricmanager-535=535.129.03-0ubuntu0.22.04.1 from jammy-updates; packages.ubuntu.com).
UBUNTU_PACKAGES = {
    "nvidia-headless-535-server": [f"{VERSION}-0ubuntu0.22.04.1"],
    "nvidia-utils-535-server": [f"{VERSION}-0ubuntu0.22.04.1"],
    "nvidia-fabricmanager-535": [f"{VERSION}-0ubuntu0.22.04.1"],
    "libnvidia-nscq-535": [f"{VERSION}-0ubuntu0.22.04.1"],
    "nvidia-utils-535": [f"{VERSION}-0ubuntu0.22.04.1"],
}

# The build the trial found (a record of its exact version string first), or none (a converged host whose index
# no longer offers it: the version pattern alone).
CASES = [
    ("ubuntu2204", "ubuntu", f"{VERSION}-0ubuntu0.22.04.1"),
    ("ubuntu2204", "nvidia", f"{VERSION}-0ubuntu1"),
    ("ubuntu2204", "ubuntu", ""),
    ("ubuntu2204", "nvidia", ""),
]
CASE_IDS = [f"{source}-{'build' if build else 'pattern'}" for _fake_host, source, build in CASES]
for _host, _source, _build in CASES:
    declare_driver(_host, _source, preflight={"nvswitch_count": 4}, **(trial_found(_build) if _build else {}))
    declare_driver(_host, _source)
declare_driver("debian12", "debian_nonfree")
declare_driver("debian12", "nvidia")


def _repository(directory: Path, release: dict[str, str], packages: dict[str, list[str]]) -> None:
    """A flat repository: its Release file's fields and a Packages index of the given versions."""
    directory.mkdir()
    (directory / "Release").write_text(
        "".join(f"{key}: {value}\n" for key, value in release.items()) + "Architectures: amd64\n"
    )
    (directory / "Packages").write_text(
        "".join(
            f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nFilename: ./{name}_{version}_amd64.deb\nSize: "
            f"1\nDescription: {name}\n\n"
            for name, versions in packages.items()
            for version in versions
        )
    )


def apt_candidates(tmp_path: Path, preferences: str, packages: list[str]) -> dict[str, str]:
    """{package: apt's candidate} with Canonical's and NVIDIA's repositories (as above) and these preferences."""
    _repository(tmp_path / "ubuntu", UBUNTU_RELEASE, UBUNTU_PACKAGES)
    _repository(tmp_path / "nvidia", NVIDIA_RELEASE, NVIDIA_PACKAGES)
    (tmp_path / "sources.list").write_text(
        f"deb [trusted=yes] file:{tmp_path / 'ubuntu'} ./\ndeb [trusted=yes] file:{tmp_path / 'nvidia'} ./\n"
    )
    (tmp_path / "pref").write_text(preferences)
    for directory in ("empty", "lists/partial", "cache/archives/partial"):
        (tmp_path / directory).mkdir(parents=True)
    options = {
        "Dir::Etc::SourceList": tmp_path / "sources.list",
        "Dir::Etc::SourceParts": tmp_path / "empty",
        "Dir::Etc::Preferences": tmp_path / "pref",
        "Dir::Etc::PreferencesParts": tmp_path / "empty",
        "Dir::State::Lists": tmp_path / "lists",
        "Dir::State::status": "/dev/null",
        "Dir::Cache": tmp_path / "cache",
        "Debug::NoLocking": 1,
        "APT::Architecture": "amd64",
        "APT::Architectures": "amd64",
        "Acquire::Languages": "none",
        "APT::Sandbox::User": "",
    }
    args = [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]
    update = subprocess.run([host_tool("apt-get"), *args, "update"], capture_output=True, text=True, check=False)
    assert update.returncode == 0, update.stdout + update.stderr
    policy = subprocess.run(
        [host_tool("apt-cache"), *args, "policy", *packages], capture_output=True, text=True, check=False
    )
    assert policy.returncode == 0 and "E:" not in policy.stderr, policy.stderr
    candidates, package = {}, None
    for line in policy.stdout.splitlines():
        if not line.startswith(" "):
            package = line.rstrip(":")
        elif line.strip().startswith("Candidate:"):
            candidates[package] = line.split(":", 1)[1].strip()
    return candidates


@pytest.mark.parametrize(
    ("host", "source", "competitors"),
    [
        ("ubuntu2204", "ubuntu", ["release l=NVIDIA CUDA"]),
        ("ubuntu2204", "nvidia", ["release o=Ubuntu"]),
        ("debian12", "debian_nonfree", ["release l=NVIDIA CUDA"]),
        # NVIDIA's Debian driver depends on Debian's glx-alternative-nvidia and nvidia-installer-cleanup (contrib).
        ("debian12", "nvidia", []),
    ],
)
def test_the_other_repository_comes_first_at_priority_minus_one(driver, host, source, competitors):
    """One record per other repository, before the version records, with the same packages, at -1."""
    cfg = driver(host, source)
    stanzas = parse_deb822(pin_text(cfg))
    never = stanzas[: len(competitors)]
    assert [s["Pin"] for s in never] == competitors
    assert all(s["Pin-Priority"] == "-1" and s["Package"].split() == cfg["__nvidia_driver_pin_patterns"] for s in never)
    assert [s["Pin"] for s in version_stanzas(pin_text(cfg))] == [f"version {VERSION}-*"]


@pytest.mark.parametrize(("host", "source", "build"), CASES, ids=CASE_IDS)
def test_apt_installs_every_pinned_package_from_the_drivers_repository(driver, host, source, build, tmp_path):
    """With both repositories on the host, apt's candidate of each of the driver's packages is the driver source's
    build of 535.261.03, though the other repository offers the release too (and NVIDIA's -1 sorts above
    Canonical's -0ubuntu0.22.04.1)."""
    cfg = driver(host, source, preflight={"nvswitch_count": 4}, **(trial_found(build) if build else {}))
    assert cfg.failure is None
    packages = cfg["__nvidia_driver_packages"]
    candidates = apt_candidates(tmp_path, pin_text(cfg), packages)
    own = UBUNTU_PACKAGES if source == "ubuntu" else NVIDIA_PACKAGES
    assert candidates == {name: next(v for v in own[name] if v.startswith(VERSION)) for name in packages}


def test_a_pin_by_version_alone_lets_the_other_repository_win(driver, tmp_path):
    """The records the roles wrote before the origin pin (the version records alone) give Canonical's source
    NVIDIA's Fabric Manager where the version pattern decides: the fault the origin records remove."""
    cfg = driver("ubuntu2204", "ubuntu", preflight={"nvswitch_count": 4})
    version_only = "\n\n".join("\n".join(f"{k}: {v}" for k, v in s.items()) for s in version_stanzas(pin_text(cfg)))
    candidates = apt_candidates(tmp_path, version_only + "\n", ["nvidia-fabricmanager-535", "libnvidia-nscq-535"])
    assert candidates == {"nvidia-fabricmanager-535": f"{VERSION}-1", "libnvidia-nscq-535": f"{VERSION}-1"}


# --------------------------------------------------------------------------- an Ubuntu 22.04 host in --check mode

# conftest's driver run (validate.yml, preflight.yml, what repository.yml gives apt_source and what it renders),
# as `ansible-playbook --check` runs it.
CHECK = role_run.Batch(
    FAKE_FACTS,
    DRIVER._tasks,
    DRIVER._after + [role_run.capture({"check_mode": "{{ ansible_check_mode }}"})],
    check_mode=True,
)
CHECK.declare("ubuntu2204", preflight_report=preflight_report(FAKE_FACTS["ubuntu2204"], nvswitch_count=8))


def test_check_mode_on_ubuntu_2204_plans_nvidias_packages_pinned_by_origin():
    """The default run of an Ubuntu 22.04 NVSwitch host in --check mode plans NVIDIA's ubuntu2204 repository, its
    535 packages, and a pin that keeps Canonical's archive off them before it pins the release."""
    cfg = CHECK.get("ubuntu2204", preflight_report=preflight_report(FAKE_FACTS["ubuntu2204"], nvswitch_count=8))
    assert cfg.failure is None and cfg["check_mode"] is True
    assert cfg["__nvidia_driver_source"] == "nvidia"
    assert (
        cfg["main_inputs"]["apt_source_repository"]["url"]
        == "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64"
    )
    assert cfg["__nvidia_driver_packages"] == [
        "nvidia-headless-535",
        "nvidia-utils-535",
        "nvidia-fabricmanager-535",
        "libnvidia-nscq-535",
    ]
    (pin,) = cfg["main_pins"]
    never, version = parse_deb822(pin["text"])
    assert (never["Pin"], never["Pin-Priority"]) == ("release o=Ubuntu", "-1")
    assert (version["Pin"], version["Pin-Priority"]) == (f"version {VERSION}-*", "1001")
    assert never["Package"] == version["Package"] == "*nvidia*-535 *nvidia*-535-* cuda-drivers-535 cuda-drivers"


# --------------------------------------------------------------------------- nvidia_driver_version: latest


def _offered(*versions: str) -> dict:
    """apt_source_trial as the driver's trial publishes it when asked for no version (latest, not yet resolved)."""
    return {"apt_source_trial": {"name": "nvidia-driver", "build": "", "offered": list(versions)}}


# Two fleets, each a play of its own (run_once resolves over the play's hosts): NVIDIA's repositories keep every
# build (ubuntu2204 and ubuntu2004 directories; NVIDIA's -0ubuntu1 form, see NVIDIA_PACKAGES above), and one
# Ubuntu 20.04 host whose source lacks the newest release.
LATEST = {"nvidia_driver_version": "latest"}
FLEET = [
    ("ubuntu2204", _offered("535.274.02-0ubuntu1", "535.261.03-0ubuntu1", "580.95.05-0ubuntu1")),
    ("ubuntu2204", {**_offered("535.274.02-0ubuntu1", "535.261.03-0ubuntu1"), "preflight_report": "x"}),
    ("ubuntu2004", _offered("535.261.03-0ubuntu1", "535.247.01-0ubuntu1")),
]
LATEST_BATCH = role_run.Batch(
    FAKE_FACTS,
    DRIVER._tasks,
    DRIVER._after + [role_run.capture({"fact_file": role_run.template("nvidia_driver", "nvidia_driver.fact.j2")})],
)
SPLIT_BATCH = role_run.Batch(FAKE_FACTS, DRIVER._tasks, DRIVER._after)


def _fleet_case(index: int) -> tuple[str, dict]:
    host, settings = FLEET[index]
    settings = {**LATEST, **settings}
    if settings.get("preflight_report") == "x":
        settings["preflight_report"] = preflight_report(FAKE_FACTS[host], nvswitch_count=8)
    return host, settings


for _index in range(len(FLEET)):
    LATEST_BATCH.declare(_fleet_case(_index)[0], **_fleet_case(_index)[1])
SPLIT_BATCH.declare("ubuntu2204", **LATEST, **_offered("535.274.02-0ubuntu1"))
SPLIT_BATCH.declare("ubuntu2004", **LATEST, **_offered("535.261.03-0ubuntu1"), nvidia_driver_source="ubuntu")


def test_latest_resolves_one_release_for_the_whole_play():
    """latest is the newest 535 release every host of the play is offered: 535.261.03, though two hosts are offered
    535.274.02 (and one 580.95.05, another branch); each host pins it, with its own source's version string first."""
    outcomes = [LATEST_BATCH.get(host, **settings) for host, settings in map(_fleet_case, range(len(FLEET)))]
    for cfg in outcomes:
        assert cfg.failure is None
        assert (cfg["__nvidia_driver_latest"], cfg["__nvidia_driver_version"]) == (VERSION, VERSION)
        assert cfg["__nvidia_driver_latest_build"] == f"{VERSION}-0ubuntu1"
        (pin,) = cfg["main_inputs"]["apt_source_pins"]
        assert (pin["version"], pin["build"]) == (f"{VERSION}-*", f"{VERSION}-0ubuntu1")
        # The fact file records what was asked for and the release it became (the fleet report reads both).
        fact = json.loads(
            subprocess.run(["sh", "-c", cfg["fact_file"]], capture_output=True, text=True, check=True).stdout
        )
        assert (fact["requested_version"], fact["pinned_version"]) == ("latest", VERSION)
    assert outcomes[1]["__nvidia_driver_packages"][-2:] == ["nvidia-fabricmanager-535", "libnvidia-nscq-535"]


def test_latest_stops_the_play_when_the_hosts_share_no_release():
    """One host offered only 535.274.02, the other only 535.261.03: no release for the fleet, each host stopped,
    before any change, with what its source offers."""
    cfg = SPLIT_BATCH.get("ubuntu2204", **LATEST, **_offered("535.274.02-0ubuntu1"))
    assert "nvidia_driver_version latest: no release of branch 535 is offered" in cfg.failure
    assert "offered here at 535.274.02-0ubuntu1" in cfg.failure and "nothing has been changed" in cfg.failed_task


def test_an_exact_version_and_empty_are_as_before(driver):
    """An exact version is used as given and empty is the matrix's default release: neither resolves anything."""
    assert driver("ubuntu2204", "ubuntu", nvidia_driver_version="535.247.01")["__nvidia_driver_version"] == "535.247.01"
    cfg = driver("ubuntu2204")
    assert cfg["__nvidia_driver_version"] == VERSION and "__nvidia_driver_latest" not in cfg


CUDA_CHECK = role_run.Batch(FAKE_FACTS, [role_run.import_role("cuda", "validate")])
CUDA_CHECK.declare("ubuntu2204", **LATEST, nvidia_driver_branch="535")


def test_the_cuda_check_reads_latest_as_the_branchs_default_release():
    """Play 1's CUDA check runs before the release is resolved: it checks the branch's default release, named so."""
    cfg = CUDA_CHECK.get("ubuntu2204", **LATEST, nvidia_driver_branch="535")
    assert cfg.failure is None
    assert (cfg["__cuda_driver"], cfg["__cuda_driver_source"]) == (
        VERSION,
        "nvidia_driver_branch 535 (its default release)",
    )


# --------------------------------------------------------------------------- another branch in the build

# https://packages.ubuntu.com/noble-updates/libnvidia-extra-535-server: 535.309.01-0ubuntu0.24.04.2, the transitional
# build after R535's end of life ("dep: libnvidia-extra-580-server"; the stanza the filter tests in
# test_plugins_driver_packages.py carry). The jammy packages of nvidia-graphics-drivers-535-server have the same
# form (issue 14 finding 1).
TRANSITIONAL = {
    "Package": "libnvidia-extra-535-server",
    "Version": "535.309.01-0ubuntu0.24.04.2",
    "Depends": [[{"name": "libnvidia-extra-580-server", "relation": "", "version": ""}]],
}
# https://packages.ubuntu.com/ca/noble-updates/libnvidia-extra-535-server: 535.309.01-0ubuntu0.24.04.1, the build
# before it, a real 535 library ("dep: libc6 (>= 2.34)").
GENUINE = {
    "Package": "libnvidia-extra-535-server",
    "Version": "535.309.01-0ubuntu0.24.04.1",
    "Depends": [[{"name": "libc6", "relation": ">=", "version": "2.34"}]],
}
FULL_SERVER = {"nvidia_driver_headless": False, "nvidia_driver_version": "535.309.01"}


def _trial_with(*stanzas: dict) -> dict:
    return {
        "apt_source_trial": {
            "name": "nvidia-driver",
            "build": stanzas[0]["Version"],
            "offered": [],
            "stanzas": list(stanzas),
        }
    }


declare_driver("ubuntu2204", "ubuntu", **FULL_SERVER, **_trial_with(TRANSITIONAL))
declare_driver("ubuntu2204", "ubuntu", **FULL_SERVER, **_trial_with(GENUINE))
declare_driver("ubuntu2204", "ubuntu", nvidia_driver_headless=False, **_trial_with(TRANSITIONAL))


def test_play_1_refuses_a_build_that_depends_on_another_branch(driver):
    """Canonical's transitional 535-server build: refused before any change, naming the package and the branch.

    The trial publishes the stanzas of the named packages (here nvidia-driver-535-server); the stanza is the one
    published for the same source's library, which the filter tests carry: the refusal reads whatever stanza of the
    release the trial gives."""
    cfg = driver("ubuntu2204", "ubuntu", **FULL_SERVER, **_trial_with(TRANSITIONAL))
    assert "nothing has been changed" in cfg.failed_task
    assert (
        "libnvidia-extra-535-server 535.309.01-0ubuntu0.24.04.2 depends on libnvidia-extra-580-server of branch 580"
        in cfg.failure
    )
    assert "builds release 535.309.01 of branch 535 with packages of another branch" in cfg.failure


def test_one_filter_judges_the_release_s_stanzas_then_the_simulation():
    """gpufleet.fleet.driver_transaction_refusal (play 1's one stop, tasks/preflight.yml): another branch among the
    stanzas at the release to install stops the host before the simulation is read; the same stanza at another
    release, or no release, stops nothing."""
    refusal = filters.driver_transaction_refusal
    said = refusal("", host="n1", version="535.309.01", stanzas=[TRANSITIONAL], branch="535", repository="http://r")
    assert said == (
        "nvidia_driver on n1: http://r builds release 535.309.01 of branch 535 with packages of another branch:"
        " libnvidia-extra-535-server 535.309.01-0ubuntu0.24.04.2 depends on libnvidia-extra-580-server of branch 580."
        " apt would install that branch under branch 535's names. Choose a release or a source that builds branch 535"
        " itself (nvidia_driver_source=nvidia: NVIDIA's CUDA repository keeps every build)."
    )
    assert refusal("", host="n1", version="535.309.01", stanzas=[GENUINE], branch="535") == ""
    assert refusal("", host="n1", version="535.288.01", stanzas=[TRANSITIONAL], branch="535") == ""
    assert refusal("", host="n1", version="", stanzas=[TRANSITIONAL], branch="535") == ""


def test_a_genuine_build_and_another_release_pass(driver):
    """The build before (a real 535 library) passes; so does a run for another release (its stanzas are not read)."""
    assert driver("ubuntu2204", "ubuntu", **FULL_SERVER, **_trial_with(GENUINE)).failure is None
    assert driver("ubuntu2204", "ubuntu", nvidia_driver_headless=False, **_trial_with(TRANSITIONAL)).failure is None


def test_the_trial_reads_the_stanzas_of_the_drivers_named_packages(driver):
    """preflight.yml asks the trial for the stanzas of the packages that carry the driver version."""
    cfg = driver("ubuntu2204", "ubuntu", **FULL_SERVER, **_trial_with(GENUINE))
    assert cfg["trial_inputs"]["apt_source_show_packages"] == ["nvidia-driver-535-server"]


def test_the_trial_script_prints_the_stanzas_of_the_version_asked_for(tmp_path):
    """roles/apt_source/files/apt-repository-trial.sh against a local repository: the madison lines of the package,
    then, below "[stanzas]", the stanzas of the packages to show at the version asked for only, Depends included."""
    ftparchive = host_tool("apt-ftparchive")
    if not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0:
        pytest.skip("apt's scratch update runs as root (APT::Sandbox::User=root)")
    repo = tmp_path / "nvidia"
    _repository(repo, {}, {"nvidia-utils-535": [f"{VERSION}-0ubuntu1", "535.274.02-0ubuntu1"]})
    with (repo / "Packages").open("a") as packages:
        packages.write(
            f"Package: libnvidia-extra-535\nVersion: {VERSION}-0ubuntu1\nArchitecture: amd64\n"
            "Depends: libnvidia-extra-580\nFilename: ./e.deb\nSize: 1\nDescription: e\n\n"
        )
    release = subprocess.run(
        [ftparchive, "-o", "APT::FTPArchive::Release::Label=NVIDIA CUDA", "release", str(repo)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (repo / "Release").write_text(release)
    script = Path(__file__).resolve().parents[2] / "roles/apt_source/files/apt-repository-trial.sh"
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "TRIAL_SOURCES": f"Types: deb\nURIs: file:{repo}\nSuites: ./\nTrusted: yes\n",
        "TRIAL_PACKAGE": "nvidia-utils-535",
        "TRIAL_OWN_FILE": "/etc/apt/sources.list.d/gpufleet-test.sources",
        "TRIAL_SHOW": "nvidia-utils-535 libnvidia-extra-535",
        "TRIAL_SHOW_VERSION": VERSION,
    }
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    madison, _separator, shown = result.stdout.partition("[stanzas]\n")
    assert [line.split("|")[1].strip() for line in madison.splitlines()] == [
        "535.274.02-0ubuntu1",
        f"{VERSION}-0ubuntu1",
    ]
    stanzas = parse_deb822(shown)
    assert [(s["Package"], s["Version"]) for s in stanzas] == [
        ("nvidia-utils-535", f"{VERSION}-0ubuntu1"),
        ("libnvidia-extra-535", f"{VERSION}-0ubuntu1"),
    ]
    assert stanzas[1]["Depends"] == "libnvidia-extra-580"


# --------------------------------------------------------------------------- Secure Boot: Canonical's signed modules


def _signed(host: str, **settings) -> dict:
    report = preflight_report(
        FAKE_FACTS[host], secure_boot="enabled", driver_module_source="signed", kernel_release="5.15.0-91-generic"
    )
    return {"nvidia_driver_source": "ubuntu", "preflight_report": report, **settings}


declare_driver("ubuntu2204", **_signed("ubuntu2204"))
declare_driver("ubuntu2204", **_signed("ubuntu2204", nvidia_driver_signed_flavours=["generic-hwe-22.04"]))


def test_signed_modules_come_with_the_flavour_metapackage(driver):
    """The per-kernel package and the flavour metapackage (which brings the module of every later kernel of the
    flavour; names as test_plugins_driver_packages.py cites them from packages.ubuntu.com); the metapackage carries
    the kernel's version, so it is neither moved to the driver's version nor held nor kept from unattended-upgrades."""
    cfg = driver("ubuntu2204", **_signed("ubuntu2204"))
    assert cfg.failure is None
    assert cfg["__nvidia_driver_packages"] == [
        "nvidia-headless-no-dkms-535-server",
        "nvidia-utils-535-server",
        "linux-modules-nvidia-535-server-5.15.0-91-generic",
        "linux-modules-nvidia-535-server-generic",
    ]
    assert "linux-modules-nvidia-535-server-generic" not in cfg["__nvidia_driver_versioned_packages"]
    assert "linux-modules-nvidia-535-server-5.15.0-91-generic" in cfg["__nvidia_driver_versioned_packages"]
    blacklist = cfg["__nvidia_driver_upgrade_blacklist"]
    assert any(re.match(e, "linux-modules-nvidia-535-server-5.15.0-91-generic") for e in blacklist)
    assert not any(re.match(e, "linux-modules-nvidia-535-server-generic") for e in blacklist)
    hwe = driver("ubuntu2204", **_signed("ubuntu2204", nvidia_driver_signed_flavours=["generic-hwe-22.04"]))
    assert hwe["__nvidia_driver_packages"][-1] == "linux-modules-nvidia-535-server-generic-hwe-22.04"


# The check before a reboot, run as a copy of its task after the role's validate.yml and preflight.yml, with what
# the dpkg-query probe before it registered given as a host variable.
REBOOT_CHECK = role_run.Batch(
    FAKE_FACTS,
    DRIVER._tasks
    + [role_run.role_task("nvidia_driver", "reboot.yml", "Stop when the signed module is not the userspace release")],
)


def _module_stanza(version: str) -> str:
    # The form Canonical publishes for a flavour module package (test_plugins_driver_packages.py:
    # linux-modules-nvidia-595-server-nvidia, linux-modules-nvidia-390-generic-5.15): the kernel's version, the release
    # in Depends on nvidia-kernel-common.
    return (
        "Package: linux-modules-nvidia-535-server-generic\nVersion: 5.15.0-91.101+1\n"
        f"Depends: linux-modules-nvidia-535-server-5.15.0-91-generic (= 5.15.0-91.101+1), "
        f"nvidia-kernel-common-535-server (>= {version})\n\n"
        "Package: linux-modules-nvidia-535-server-5.15.0-91-generic\nVersion: 5.15.0-91.101+1\n"
        "Depends: debconf (>= 0.5) | debconf-2.0, linux-image-5.15.0-91-generic\n\n"
    )


@pytest.mark.parametrize(
    ("module", "installed", "stops"),
    [("535.309.01", "535.261.03", True), ("535.261.03", "535.261.03", False), ("", "535.261.03", False)],
    ids=["other-release", "same-release", "release-unknown"],
)
def test_a_signed_module_of_another_release_stops_before_the_reboot(module, installed, stops):
    stdout = _module_stanza(module) if module else _module_stanza("0").split("\n\n", 1)[1]
    settings = {
        **_signed("ubuntu2204"),
        "nvidia_driver_installed_version": installed,
        "__nvidia_driver_signed_module": {"rc": 0, "stdout": stdout},
    }
    cfg = REBOOT_CHECK.get("ubuntu2204", **settings)
    if not stops:
        assert cfg.failure is None
        return
    assert cfg.failed_task == "Stop when the signed module is not the userspace release (before any reboot)"
    assert (
        "the signed module of kernel 5.15.0-91-generic is NVIDIA 535.309.01 (linux-modules-nvidia-535-server-generic"
        " 5.15.0-91.101+1), but the userspace driver is 535.261.03"
    ) in cfg.failure


# --------------------------------------------------------------------------- a host installed from another source


# The driver fact a host keeps (templates/nvidia_driver.fact.j2); gpufleet 0.3's had no "source": it came from that
# release's default, Canonical's archive on Ubuntu.
OLD_FACT = {"nvidia_driver": {"branch": "535", "installed_version": "535.261.03", "loaded_version": "535.261.03"}}
SOURCE_CASES = {
    "0.3-fact-default-source": ("ubuntu2204", "", OLD_FACT, "ubuntu"),
    "0.3-fact-kept-with-ubuntu": ("ubuntu2204", "ubuntu", OLD_FACT, None),
    "0.3-fact-moved-to-nvidia": ("ubuntu2204", "nvidia", OLD_FACT, None),
    "fact-of-nvidia": ("ubuntu2204", "", {"nvidia_driver": {**OLD_FACT["nvidia_driver"], "source": "nvidia"}}, None),
    "nothing-installed": ("ubuntu2204", "", {"nvidia_driver": {"installed_version": "not installed"}}, None),
    "0.3-fact-on-debian": ("debian12", "", OLD_FACT, None),
}
for _host, _source, _local, _ in SOURCE_CASES.values():
    declare_driver(_host, _source, ansible_local=_local)


@pytest.mark.parametrize("case", list(SOURCE_CASES))
def test_a_driver_from_another_source_than_the_default_is_kept_until_the_inventory_says(driver, case):
    """NVIDIA's repository became Ubuntu's default: a host whose driver came from Canonical's archive (the default
    before) stops in play 1, naming both settings, instead of having its driver replaced by NVIDIA's packages."""
    host, source, local, installed_from = SOURCE_CASES[case]
    cfg = driver(host, source, ansible_local=local)
    if installed_from is None:
        assert cfg.failure is None, cfg.failure
        return
    assert cfg.failed_task == "Stop on wrong driver settings (nothing has been changed)"
    assert (
        f"the driver on this host (535.261.03) came from source '{installed_from}', and the default source is"
        f" 'nvidia', whose packages would replace it: set nvidia_driver_source: {installed_from} to keep it, or"
        " nvidia_driver_source: nvidia to move this host"
    ) in cfg.failure
