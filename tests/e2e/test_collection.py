"""The installed collection against the lab: `ansible-galaxy collection build` and
`install` into a scratch collections path, then `ansible-playbook gpufleet.fleet.check`
(the read-only plays of provision.yml) from outside the clone, as a user who installed
gpufleet.fleet runs it. Nothing on the nodes changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import LAB_INVENTORY, REPO, podman

BIN = Path(sys.executable).parent


def test_play_1_of_the_installed_collection_checks_the_lab(tmp_path, lab_hosts):
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    path = tmp_path / "collections"
    # Outside the clone: neither its ansible.cfg (make exports ANSIBLE_CONFIG) nor its link answers.
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(path),
        ANSIBLE_HOME=str(tmp_path / "home"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        ANSIBLE_HOST_KEY_CHECKING="true",
    )
    built = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    tarball = tmp_path / f"{galaxy['namespace']}-{galaxy['name']}-{galaxy['version']}.tar.gz"
    installed = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(path), "--no-deps", "--force"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    assert (path / "ansible_collections" / "gpufleet" / "fleet" / "MANIFEST.json").is_file(), installed.stdout

    before = {
        host: podman("exec", host, "sh", "-c", "md5sum /var/lib/dpkg/status; ls -la /etc/apt/sources.list.d").stdout
        for host in lab_hosts
    }
    played = subprocess.run(
        [str(BIN / "ansible-playbook"), "gpufleet.fleet.check", "-i", str(LAB_INVENTORY)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    out = played.stdout + played.stderr
    assert played.returncode == 0, out[-4000:]
    # Every role's spec and rules were judged, once, by the installed copy's action (the only gpufleet.fleet on that
    # path): play 0's on the controller, then play 1's for every host (issue 30).
    assert out.count("TASK [Judge the settings of every host (once, on the controller)]") == 1, out[-4000:]
    assert "Judge the playbook settings against the inventory" in out, out[-4000:]
    for host in lab_hosts:
        assert f"{host}" in out and "failed=0" in out
    after = {
        host: podman("exec", host, "sh", "-c", "md5sum /var/lib/dpkg/status; ls -la /etc/apt/sources.list.d").stdout
        for host in lab_hosts
    }
    assert after == before
