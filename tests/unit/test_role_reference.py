"""docs/roles.md: what tools/role_reference.py generates from today's argument specs, every option in it."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, ROLES_DIR, load_script

SCRIPT = REPO_ROOT / "tools" / "role_reference.py"
REFERENCE = REPO_ROOT / "docs" / "roles.md"


@pytest.fixture(scope="module")
def reference():
    return load_script(SCRIPT)


def _spec_options(spec_file: Path) -> dict[str, list[str]]:
    """Every option name of every entry point of a spec file, nested ones as parent.child / parent[].child."""

    def walk(options: dict, prefix: str = "") -> list[str]:
        names = []
        for name, attrs in (options or {}).items():
            attrs = attrs or {}
            names.append(prefix + name)
            if attrs.get("options"):
                names += walk(
                    attrs["options"], f"{prefix}{name}[]." if attrs.get("type") == "list" else f"{prefix}{name}."
                )
        return names

    specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
    return {entry: walk((spec or {}).get("options")) for entry, spec in specs.items()}


def _sections(markdown: str) -> dict[str, str]:
    """The text of each '## <role>' section."""
    parts = re.split(r"^## (\S+)$", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_docs_roles_md_is_current(reference):
    """docs/roles.md is exactly what the generator makes from today's specs (regenerate: make docs)."""
    assert REFERENCE.is_file(), "docs/roles.md is missing: run `python tools/role_reference.py`"
    assert REFERENCE.read_text(encoding="utf-8") == reference.render(ROLES_DIR), (
        "docs/roles.md is stale: run `python tools/role_reference.py` (make docs) and commit it"
    )


def test_every_option_of_every_spec_appears_in_its_role_section():
    """Each role with a spec has a section, and each option of each entry point is a table row there."""
    sections = _sections(REFERENCE.read_text(encoding="utf-8"))
    spec_files = sorted(ROLES_DIR.glob("*/meta/argument_specs.y*ml"))
    assert spec_files
    missing = []
    for spec_file in spec_files:
        role = spec_file.parent.parent.name
        assert role in sections, f"docs/roles.md has no section for {role}"
        for entry, names in _spec_options(spec_file).items():
            if entry != "main":
                assert f"### Entry point `{entry}`" in sections[role], f"{role}: entry point {entry} is not documented"
            missing += [f"{role}:{entry}:{name}" for name in names if f"| `{name}` |" not in sections[role]]
    assert missing == []


def test_index_links_every_role():
    text = REFERENCE.read_text(encoding="utf-8")
    for spec_file in ROLES_DIR.glob("*/meta/argument_specs.yml"):
        role = spec_file.parent.parent.name
        assert f"| [{role}](#{role}) |" in text


@pytest.fixture
def fake_roles(tmp_path: Path) -> Path:
    """Two roles: one with nested options, choices, a required option and a second entry point; one without options."""
    roles = tmp_path / "roles"
    (roles / "beta" / "meta").mkdir(parents=True)
    (roles / "beta" / "meta" / "argument_specs.yml").write_text(
        textwrap.dedent("""\
        ---
        argument_specs:
          upgrade:
            short_description: Upgrade it.
            options:
              beta_target:
                type: str
                required: true
                description: Version to move to.
          main:
            short_description: The beta role.
            description:
              - First paragraph.
              - Second | with a pipe.
            options:
              beta_mode:
                type: str
                choices: [fast, safe]
                default: safe
                description: How.
              beta_limits:
                type: dict
                default: {}
                description: Limits.
                options:
                  cpu:
                    type: int
                    description: Cores.
              beta_hosts:
                type: list
                elements: dict
                default: []
                description: Hosts.
                options:
                  name:
                    type: str
                    required: true
                    description: Host name.
              beta_jinja:
                type: str
                default: "{{ x | default('') }}"
                description: Follows x.
        """)
    )
    (roles / "alpha" / "meta").mkdir(parents=True)
    (roles / "alpha" / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: The alpha role.\n"
    )
    (roles / "gamma").mkdir()  # no spec: not documented
    return roles


def test_render_documents_nested_options_entry_points_and_escapes_pipes(reference, fake_roles):
    text = reference.render(fake_roles)
    sections = _sections(text)
    assert list(sections) == ["alpha", "beta"]
    assert "Takes no options." in sections["alpha"]
    beta = sections["beta"]
    assert '| `beta_mode` | str |  | `"safe"` | `"fast"`, `"safe"` | no | How. |' in beta
    assert "| `beta_limits.cpu` | int |" in beta
    assert "| `beta_hosts[].name` | str |  |  |  | yes | Host name. |" in beta
    assert "| `beta_hosts` | list | dict | `[]` |" in beta
    assert "`\"{{ x \\| default('') }}\"`" in beta
    assert "Second \\| with a pipe." not in beta and "Second | with a pipe." in beta  # prose, not a table cell
    # main first, then the other entry points
    assert beta.index("### Options") < beta.index("### Entry point `upgrade`") < beta.index("| `beta_target` |")
    assert "| [beta](#beta) | `main`, `upgrade` | 7 | The beta role. |" in text


def test_render_is_deterministic(reference, fake_roles):
    assert reference.render(fake_roles) == reference.render(fake_roles)


def test_check_names_the_stale_file_and_write_fixes_it(fake_roles, tmp_path):
    out = tmp_path / "roles.md"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--roles-dir", str(fake_roles), "--output", str(out), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    missing = run("--check")
    assert missing.returncode == 1 and str(out) in missing.stderr and "missing" in missing.stderr
    assert run().returncode == 0
    assert run("--check").returncode == 0
    out.write_text(out.read_text() + "hand edit\n")
    stale = run("--check")
    assert stale.returncode == 1 and f"{out} is stale" in stale.stderr
