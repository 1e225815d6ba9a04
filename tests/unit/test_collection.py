"""gpufleet as the collection gpufleet.fleet: `ansible-galaxy collection build` makes a
tarball that installs into a scratch collections path, where ansible-doc shows every
role's settings and the example inventory stops `gpufleet.fleet.site` before any
connection. (tests/e2e/test_collection.py runs play 1 from the installed copy against
the lab.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ROLES = sorted(path.parent.parent.name for path in (REPO / "roles").glob("*/meta/argument_specs.yml"))


def run(argv: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The collection built from this clone and installed into a scratch path (no Galaxy)."""
    root = tmp_path_factory.mktemp("collection")
    path = root / "collections"
    # Outside the clone: its ansible.cfg (make exports ANSIBLE_CONFIG) and the link to the
    # clone must not be what answers, nor make ansible-galaxy think it is installed already.
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(path), ANSIBLE_LOCAL_TEMP=str(root / "tmp"), ANSIBLE_HOME=str(root / "home"))
    built = run([str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(root)], cwd=root, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    tarball = root / f"{galaxy['namespace']}-{galaxy['name']}-{galaxy['version']}.tar.gz"
    done = run([str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(path), "--no-deps", "--force"],
               cwd=root, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (path / "ansible_collections" / galaxy["namespace"] / galaxy["name"] / "MANIFEST.json").is_file(), done.stdout
    return {"root": root, "tarball": tarball, "path": path, "env": env,
            "dir": path / "ansible_collections" / galaxy["namespace"] / galaxy["name"]}


def test_the_tarball_holds_the_product_and_not_the_lab(installed):
    with tarfile.open(installed["tarball"]) as tar:
        top = {name.split("/")[0] for name in tar.getnames()}
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert {"roles", "playbooks", "plugins", "files", "meta", "inventory", "docs", "README.md"} <= top
    assert not top & {"tests", "tools", "molecule", ".venv", ".lab", ".ansible", "reports", "ansible.cfg", "Makefile"}
    assert manifest["collection_info"]["namespace"] == "gpufleet"
    assert manifest["collection_info"]["name"] == "fleet"


def test_no_role_reaches_outside_its_folder(installed):
    """What `grep -rn "role_path.*\\.\\./" roles` checks in the clone, on the installed copy."""
    offenders = [f"{path.relative_to(installed['dir'])}: {line.strip()}"
                 for path in (installed["dir"] / "roles").rglob("*.yml")
                 for line in path.read_text().splitlines() if "role_path" in line and "../" in line]
    assert offenders == []


def test_ansible_doc_lists_every_role_with_its_settings(installed):
    listed = run([str(BIN / "ansible-doc"), "-t", "role", "-l", "gpufleet.fleet", "--json"], cwd=installed["root"],
                 env=installed["env"])
    assert listed.returncode == 0, listed.stderr
    assert sorted(name.split(".")[-1] for name in json.loads(listed.stdout)) == ROLES
    for role in ("cuda", "nvidia_driver", "pytorch"):
        shown = run([str(BIN / "ansible-doc"), "-t", "role", f"gpufleet.fleet.{role}", "--json"], cwd=installed["root"],
                    env=installed["env"])
        assert shown.returncode == 0, shown.stderr
        options = json.loads(shown.stdout)[f"gpufleet.fleet.{role}"]["entry_points"]["main"]["options"]
        spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
        assert sorted(options) == sorted(spec["argument_specs"]["main"]["options"])


def test_the_installed_site_playbook_stops_on_the_example_inventory(installed):
    """`ansible-playbook gpufleet.fleet.site -i inventory` from the installed collection, its own example."""
    played = run([str(BIN / "ansible-playbook"), "gpufleet.fleet.site", "-i", str(installed["dir"] / "inventory")],
                 cwd=installed["root"], env=installed["env"])
    out = played.stdout + played.stderr
    assert played.returncode != 0
    assert "This is gpufleet's example inventory" in out, out
    assert "UNREACHABLE" not in out


# The keys an option of a plugin's DOCUMENTATION may carry (ansible-core's plugin docs schema, the ones gpufleet uses
# and their neighbours); a flow mapping with an unquoted comma in its description makes the rest of it a stray key.
OPTION_KEYS = {"description", "type", "default", "elements", "required", "choices", "aliases", "version_added",
               "ini", "env", "vars", "suboptions", "no_log", "keyword", "cli"}
PLUGINS = sorted((kind.name, path.stem) for kind in (REPO / "plugins").iterdir() if kind.name in {"lookup", "callback", "modules"}
                 for path in kind.glob("*.py") if "DOCUMENTATION" in path.read_text())


@pytest.mark.parametrize(("kind", "name"), PLUGINS, ids=[f"{k}/{n}" for k, n in PLUGINS])
def test_ansible_doc_shows_each_plugins_options_whole(installed, kind, name):
    """ansible-doc -t lookup gpufleet.fleet.stack (and each other documented plugin): its options, each with a
    description and no stray key (the stack lookup's three descriptions once ended at their first comma)."""
    doc_type = {"modules": "module"}.get(kind, kind)
    shown = run([str(BIN / "ansible-doc"), "-t", doc_type, f"gpufleet.fleet.{name}", "--json"], cwd=installed["root"],
                env=installed["env"])
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)[f"gpufleet.fleet.{name}"]["doc"]
    assert doc.get("short_description") and doc.get("author"), doc
    for option, spec in (doc.get("options") or {}).items():
        assert set(spec) <= OPTION_KEYS, (option, sorted(set(spec) - OPTION_KEYS))
        assert spec.get("description"), option
