"""The lab's fixture of a transitional driver build (tests/lab/files/build-fixture-transitional.sh):
built and signed here with a throwaway key, tried by the roles' own apt trial script, and judged by the
filter play 1 uses. The e2e test that play 1 refuses it on a lab node is tests/e2e/test_bad_input.py
(case release-of-another-branch)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import host_tool, load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "lab" / "files" / "build-fixture-transitional.sh"
TRIAL = REPO / "roles" / "apt_source" / "files" / "apt-repository-trial.sh"
SUITE = "gpufleet-fixture-transitional"
VERSION = "535.261.03-1+gpufleetlab1"

filters = load_script(REPO / "plugins" / "filter" / "gpufleet_filters.py")


@pytest.fixture(scope="module")
def fixture_repo(tmp_path_factory) -> tuple[Path, Path]:
    for tool in ("gpg", "dpkg-deb", "apt-ftparchive", "apt-get"):
        host_tool(tool)
    if os.geteuid() != 0:
        pytest.skip("apt's scratch update in the trial script runs as root")
    work = tmp_path_factory.mktemp("fixture")
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
    root = work / "transitional"
    subprocess.run(["sh", str(SCRIPT), str(root), str(home), fpr], check=True, capture_output=True)
    key = work / "key.asc"
    key.write_text(
        subprocess.run([*gpg, "--armor", "--export", fpr], check=True, capture_output=True, text=True).stdout
    )
    return root, key


def test_the_fixture_says_what_it_is(fixture_repo):
    """Its own suite and the lab's origin: it claims no Debian or NVIDIA release."""
    root, _key = fixture_repo
    release = (root / "dists" / SUITE / "Release").read_text()
    assert "Origin: gpufleet-lab" in release and f"Suite: {SUITE}" in release
    assert (root / "dists" / SUITE / "InRelease").exists()
    debs = sorted(p.name for p in root.rglob("*.deb"))
    assert debs == [f"nvidia-smi_{VERSION}_amd64.deb"]


def test_the_roles_trial_reads_it_and_play_1s_filter_refuses_it(fixture_repo):
    root, key = fixture_repo
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "TRIAL_SOURCES": f"Types: deb\nURIs: file:{root}\nSuites: {SUITE}\nComponents: non-free\nSigned-By: {key}\n",
        "TRIAL_PACKAGE": "nvidia-smi",
        "TRIAL_OWN_FILE": "/etc/apt/sources.list.d/gpufleet-fixture-test.sources",
        "TRIAL_SHOW": "nvidia-kernel-dkms nvidia-smi libcuda1 nvidia-persistenced",
        "TRIAL_SHOW_VERSION": "535.261.03",
    }
    result = subprocess.run(["bash", str(TRIAL)], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    madison, _separator, shown = result.stdout.partition("[stanzas]\n")
    assert [line.split("|")[1].strip() for line in madison.splitlines()] == [VERSION]
    assert filters.foreign_branches(shown, "535") == [
        {"package": "nvidia-smi", "version": VERSION, "depends_on": "libnvidia-compute-580", "branch": "580"}
    ]
