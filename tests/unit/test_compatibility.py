"""files/compatibility.yml: every row is well formed and names only sources the driver role can install from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPATIBILITY_FILE = REPO_ROOT / "files" / "compatibility.yml"
DRIVER_VARS = REPO_ROOT / "roles" / "nvidia_driver" / "vars"

MATRIX = yaml.safe_load(COMPATIBILITY_FILE.read_text())
BRANCHES = MATRIX["driver_branches"]
# (branch, OS, source) for every source a branch row names.
BRANCH_SOURCES = [
    (branch, os_name, source)
    for branch, row in BRANCHES.items()
    for os_name, sources in (row.get("sources") or {}).items()
    for source in sources
]


def _os_sources(os_name: str) -> dict:
    path = DRIVER_VARS / f"{os_name}.yml"
    assert path.is_file(), (
        f"compatibility.yml names OS {os_name} but roles/nvidia_driver/vars/{os_name}.yml does not exist"
    )
    return yaml.safe_load(path.read_text())["__nvidia_driver_sources"]


def test_matrix_lists_branches():
    """The matrix is a non-empty mapping under driver_branches."""
    assert isinstance(BRANCHES, dict) and BRANCHES


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_branch_key_is_a_three_digit_string(branch):
    """Branch keys are quoted 3-digit strings ("535"): the role looks them up with nvidia_driver_branch | string."""
    assert isinstance(branch, str), f"branch {branch!r} is a {type(branch).__name__}: quote it"
    assert re.fullmatch(r"[0-9]{3}", branch)


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_default_version_belongs_to_the_branch(branch):
    """default_version is a string release of its own branch, in the form validate.yml accepts."""
    version = BRANCHES[branch]["default_version"]
    assert isinstance(version, str)
    assert version.startswith(f"{branch}.")
    # The pattern tasks/validate.yml checks nvidia_driver_version against.
    assert re.match(rf"^{branch}\.[0-9]+(\.[0-9]+)?$", version)


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_branch_row_has_only_known_keys(branch):
    """A typo in a row (say 'default_verison') would silently fall back to nothing."""
    row = BRANCHES[branch]
    assert set(row) <= {"default_version", "fabricmanager", "sources", "lifecycle"}
    assert set(row.get("lifecycle") or {}) == {"designation", "end_of_life", "published"}
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}", row["lifecycle"]["end_of_life"])
    assert isinstance(row.get("fabricmanager", False), bool)
    assert row.get("sources"), f"branch {branch} names no sources"


@pytest.mark.parametrize(
    ("branch", "os_name", "source"), BRANCH_SOURCES, ids=[f"{b}-{o}-{s}" for b, o, s in BRANCH_SOURCES]
)
def test_named_source_exists_for_the_os(branch, os_name, source):
    """Every source a branch names for an OS is a package layout in roles/nvidia_driver/vars/<OS>.yml."""
    layouts = _os_sources(os_name)
    assert source in layouts, f"branch {branch}: source {source!r} is not in vars/{os_name}.yml (has {sorted(layouts)})"


@pytest.mark.parametrize("branch", [b for b in BRANCHES if BRANCHES[b].get("fabricmanager")])
def test_fabricmanager_branch_has_a_source_with_fabricmanager(branch):
    """A branch marked fabricmanager: true can get Fabric Manager from at least one of its sources on each OS."""
    for os_name, sources in BRANCHES[branch]["sources"].items():
        layouts = _os_sources(os_name)
        assert any(layouts[s]["packages_fabricmanager"] for s in sources), (
            f"no source on {os_name} ships Fabric Manager"
        )
