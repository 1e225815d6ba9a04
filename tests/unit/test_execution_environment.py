"""The execution environment (execution-environment.yml, docs/scale.md): `ansible-builder create`
writes its build context from a scratch copy of the definition and a collection tarball built from
this clone, and the context holds what gpufleet needs, at the controller's pins.

What the context is checked for:

* the Containerfile builds from the base image the definition names and installs ansible-core and
  ansible-runner as requirements/dev.txt pins them, with a Python that ansible-core supports;
* the galaxy requirements name every collection the roles, playbooks and ansible.cfg use by FQCN,
  at the version the `ansible` package of requirements/dev.txt carries, and gpufleet.fleet itself
  as the tarball of this clone, which the context holds where the requirements say;
* the Python requirements provide every package the controller side imports (plugins/,
  files/gpufleet_verify.py, the fleet report script), each pinned as requirements/dev.txt pins it;
* the system requirements name the ssh client.

No image is built or pulled. Skipped only where ansible-builder is not installed
(requirements/dev.txt pins it: `make venv`).
"""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EE = yaml.safe_load((REPO / "execution-environment.yml").read_text())
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
BUILDER = shutil.which("ansible-builder", path=os.pathsep.join([str(BIN), os.environ.get("PATH", "")]))

pytestmark = pytest.mark.skipif(
    BUILDER is None, reason="ansible-builder is not installed (requirements/dev.txt pins it: make venv)"
)

# Where the controller runs Python of gpufleet's own: the plugins (the fleet report's module_utils included)
# and the cron/CI entry point.
CONTROLLER_PYTHON = [*sorted((REPO / "plugins").rglob("*.py")), REPO / "files/gpufleet_verify.py"]
# The distribution that provides an imported top-level module.
PROVIDES = {"ansible": "ansible-core", "ansible_runner": "ansible-runner", "yaml": "pyyaml", "jinja2": "jinja2"}
# Where the roles and playbooks name modules and plugins: a task's module (a key), and in
# Jinja a lookup, a filter or a test.
FQCN_SOURCES = [
    REPO / "site.yml",
    *sorted((REPO / "playbooks").rglob("*.yml")),
    *sorted((REPO / "roles").rglob("*.yml")),
    *sorted((REPO / "roles").rglob("*.j2")),
]
_NAME = r"([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*"
_FQCN = [
    re.compile(rf"^[ \t]*(?:- )?{_NAME}:", re.M),
    re.compile(rf"(?:\b(?:lookup|query|q)\(\s*['\"]|\|\s*|\bis\s+(?:not\s+)?){_NAME}\b"),
]
TARBALL = "ee/gpufleet-fleet.tar.gz"
OWN_COLLECTION = f"ansible_collections.{GALAXY['namespace']}.{GALAXY['name']}."


def dev_pins() -> dict:
    """requirements/dev.txt as {canonical name: version}; every line there is name==version."""
    pins = {}
    for line in (REPO / "requirements/dev.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def run(argv: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def context(tmp_path_factory) -> Path:
    """`ansible-builder create` on a scratch copy of execution-environment.yml and ee/, with the
    collection tarball built there from this clone (what `make ee-context` does in the clone)."""
    root = tmp_path_factory.mktemp("ee")
    shutil.copy2(REPO / "execution-environment.yml", root / "execution-environment.yml")
    shutil.copytree(REPO / "ee", root / "ee", ignore=shutil.ignore_patterns("*.tar.gz"))
    # Outside the clone: its ansible.cfg (make exports ANSIBLE_CONFIG) is not what answers.
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_LOCAL_TEMP=str(root / "tmp"), ANSIBLE_HOME=str(root / "home"))
    built = run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(root / "collection")],
        cwd=root,
        env=env,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    shutil.copy2(
        root / "collection" / f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz", root / TARBALL
    )
    created = run(
        [BUILDER, "create", "--file", "execution-environment.yml", "--context", str(root / "context")],
        cwd=root,
        env=env,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    # ansible-builder only warns when a file of additional_build_files is missing.
    assert "No matches" not in created.stdout + created.stderr, created.stdout + created.stderr
    return root / "context"


def containerfile_args(context: Path) -> dict:
    return dict(re.findall(r'^ARG (\w+)="([^"]*)"$', (context / "Containerfile").read_text(), re.M))


def test_the_builder_version_is_the_pinned_one():
    version = run([BUILDER, "--version"], cwd=REPO).stdout.strip()
    assert version == dev_pins()["ansible-builder"]


def test_the_containerfile_builds_from_the_named_base_image(context):
    text = (context / "Containerfile").read_text()
    base = EE["images"]["base_image"]["name"]
    assert containerfile_args(context)["EE_BASE_IMAGE"] == base
    assert re.search(r"^FROM \$EE_BASE_IMAGE AS base$", text, re.M), text
    assert "LABEL ansible-execution-environment=true" in text


def test_ansible_core_and_runner_are_the_controller_pins(context):
    pins = dev_pins()
    expected = [f"ansible-core=={pins['ansible-core']}", f"ansible-runner=={pins['ansible-runner']}"]
    dependencies = EE["dependencies"]
    assert [dependencies["ansible_core"]["package_pip"], dependencies["ansible_runner"]["package_pip"]] == expected
    assert containerfile_args(context)["ANSIBLE_INSTALL_REFS"].split() == expected


def test_the_python_is_one_ansible_core_supports(context):
    interpreter = EE["dependencies"]["python_interpreter"]
    args = containerfile_args(context)
    assert (args["PYPKG"], args["PYCMD"]) == (interpreter["package_system"], interpreter["python_path"])
    version = re.fullmatch(r"/usr/bin/python(3\.\d+)", interpreter["python_path"]).group(1)
    installed = importlib.metadata.version("ansible-core")
    if installed != dev_pins()["ansible-core"]:
        pytest.skip(
            f"the venv's ansible-core is {installed}, requirements/dev.txt pins {dev_pins()['ansible-core']}: make venv"
        )
    requires = importlib.metadata.metadata("ansible-core")["Requires-Python"]
    assert SpecifierSet(requires).contains(version), (version, requires)


def _galaxy(context: Path) -> list:
    return yaml.safe_load((context / "_build/requirements.yml").read_text())["collections"]


def test_the_galaxy_requirements_hold_every_collection_the_plays_use(context):
    used = {name for path in FQCN_SOURCES for pattern in _FQCN for name in pattern.findall(path.read_text())}
    config = configparser.ConfigParser()
    config.read(REPO / "ansible.cfg")
    used |= {name.strip().rsplit(".", 1)[0] for name in config["defaults"]["callbacks_enabled"].split(",")}
    used -= {"ansible.builtin", f"{GALAXY['namespace']}.{GALAXY['name']}"}
    assert {"ansible.posix", "community.general"} <= used, used
    listed = {entry["name"] for entry in _galaxy(context) if entry.get("type", "galaxy") == "galaxy"}
    assert used <= listed, f"used by FQCN but not in ee/requirements.yml: {sorted(used - listed)}"
    for name, spec in GALAXY.get("dependencies", {}).items():
        (version,) = [entry["version"] for entry in _galaxy(context) if entry["name"] == name]
        assert SpecifierSet(spec).contains(version), (name, version, spec)


def test_the_collections_are_the_versions_the_pinned_ansible_package_carries(context):
    installed = importlib.metadata.version("ansible")
    if installed != dev_pins()["ansible"]:
        pytest.skip(f"the venv's ansible is {installed}, requirements/dev.txt pins {dev_pins()['ansible']}: make venv")
    # The `ansible` package's collections, read from its files (not imported: in a process that
    # ran ansible-core, its collection loader answers for ansible_collections).
    root = Path(importlib.metadata.distribution("ansible").locate_file("ansible_collections"))
    for entry in _galaxy(context):
        if entry.get("type", "galaxy") != "galaxy":
            continue
        namespace, name = entry["name"].split(".")
        manifest = json.loads((root / namespace / name / "MANIFEST.json").read_text())
        assert entry["version"] == manifest["collection_info"]["version"], entry["name"]


def test_gpufleet_fleet_is_the_tarball_of_this_clone_in_the_context(context):
    (entry,) = [entry for entry in _galaxy(context) if entry.get("type") == "file"]
    # The galaxy stage copies _build to /build (ansible-builder's layout), and
    # additional_build_files puts the tarball under its dest there.
    assert re.search(r"^COPY _build /build$", (context / "Containerfile").read_text(), re.M)
    (extra,) = EE["additional_build_files"]
    assert extra["src"] == TARBALL
    assert entry["name"] == f"/build/{extra['dest']}/{Path(TARBALL).name}"
    tarball = context / "_build" / extra["dest"] / Path(TARBALL).name
    with tarfile.open(tarball) as tar:
        info = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
        top = {name.split("/")[0] for name in tar.getnames()}
    assert (info["namespace"], info["name"], info["version"]) == (
        GALAXY["namespace"],
        GALAXY["name"],
        GALAXY["version"],
    )
    assert {"roles", "playbooks", "plugins", "files"} <= top
    assert not top & {"ee", "execution-environment.yml", "tests", "tools", ".venv"}


def _imported(path: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            if not node.module.startswith(OWN_COLLECTION):  # gpufleet's own module_utils: the collection itself
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names)


def test_the_python_requirements_provide_what_the_controller_imports_at_the_controller_pins(context):
    imported = set().union(*map(_imported, CONTROLLER_PYTHON))
    assert not imported - set(PROVIDES), (
        f"imported, with no distribution known here: {sorted(imported - set(PROVIDES))}"
    )
    requirements = [
        Requirement(line)
        for line in (context / "_build/requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    listed = {canonicalize_name(requirement.name): requirement for requirement in requirements}
    provided = set(listed) | {"ansible-core", "ansible-runner"}
    assert {PROVIDES[name] for name in imported} <= provided
    pins = dev_pins()
    for name, requirement in listed.items():
        assert str(requirement.specifier) == f"=={pins.get(name)}", (
            f"{requirement}: requirements/dev.txt pins {pins.get(name)}"
        )


def test_the_system_requirements_name_the_ssh_client(context):
    lines = [
        line.split()
        for line in (context / "_build/bindep.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ["openssh-clients", "[platform:rpm]"] in lines
