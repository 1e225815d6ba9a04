#!/usr/bin/env python
"""Write docs/roles.md, the role reference, from every role's meta/argument_specs.yml.

The argument specs are the one place a role's settings are documented (the
roles validate every value against them, and tools/check_argument_specs.py
keeps them equal to defaults/main.yml). This script turns them into
Markdown: an index of the roles, then per role its short description, its
description and a table of its options (name, type, elements, default,
choices, required, description), options of dict types nested under their
parent (``parent.child``, ``parent[].child`` for a list of dicts). Entry
points other than ``main`` are documented after it. Roles come in name
order, options in the order of their spec: the same specs give the same
bytes.

Usage:
  tools/role_reference.py            write docs/roles.md (``make docs``)
  tools/role_reference.py --check    exit 1 and name the file when it differs from a fresh generation
  --roles-dir DIR, --output FILE     other places (the unit tests use them)

Importable: ``render(roles_dir)`` returns the Markdown, ``main(argv)`` the exit status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterator

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROLES_DIR = REPO_ROOT / "roles"
DEFAULT_OUTPUT = REPO_ROOT / "docs" / "roles.md"
MAIN = "main"
SPEC_FILES = ("argument_specs.yml", "argument_specs.yaml")
COLUMNS = ("option", "type", "elements", "default", "choices", "required", "description")


def spec_files(roles_dir: Path) -> list[tuple[str, Path]]:
    """(role name, its meta/argument_specs file) for every role that has one, by role name."""
    found = []
    for role_dir in sorted(p for p in roles_dir.iterdir() if p.is_dir()):
        for name in SPEC_FILES:
            if (role_dir / "meta" / name).is_file():
                found.append((role_dir.name, role_dir / "meta" / name))
                break
    return found


def load_entry_points(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(entry point, spec) of a spec file: ``main`` first, then the others by name."""
    specs = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("argument_specs") or {}
    order = sorted(specs, key=lambda name: (name != MAIN, name))
    return [(name, specs[name] or {}) for name in order]


def _text(value: Any) -> str:
    """A description (a string or a list of paragraphs) as one line of Markdown."""
    if value is None:
        return ""
    parts = value if isinstance(value, list) else [value]
    return " ".join(" ".join(str(part).split()) for part in parts)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|")


def _yaml_value(value: Any) -> str:
    """A value as one would write it in an inventory: strings quoted, lists and dicts in flow style."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 30).strip()
    return str(value)


def _code(text: str) -> str:
    """``text`` as inline code, with a fence long enough for any backticks inside."""
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def option_rows(options: dict[str, Any], prefix: str = "") -> Iterator[list[str]]:
    """One row of cells per option, the options of dict-typed options after their parent."""
    for name, attrs in (options or {}).items():
        attrs = attrs or {}
        full = f"{prefix}{name}"
        choices = attrs.get("choices")
        yield [
            _code(full),
            str(attrs.get("type", "str")),
            str(attrs.get("elements", "")),
            _code(_yaml_value(attrs["default"])) if "default" in attrs else "",
            ", ".join(_code(_yaml_value(choice)) for choice in choices) if choices else "",
            "yes" if attrs.get("required") else "no",
            _text(attrs.get("description")),
        ]
        if attrs.get("options"):
            nested = f"{full}[]." if attrs.get("type") == "list" else f"{full}."
            yield from option_rows(attrs["options"], nested)


def option_table(options: dict[str, Any]) -> list[str]:
    """The Markdown table of an entry point's options (or a line saying it takes none)."""
    if not options:
        return ["Takes no options."]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in option_rows(options):
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    return lines


def count_options(options: dict[str, Any]) -> int:
    """Options of an entry point, nested ones included."""
    return sum(1 + count_options((attrs or {}).get("options") or {}) for attrs in (options or {}).values())


def render(roles_dir: Path = DEFAULT_ROLES_DIR) -> str:
    """The whole of docs/roles.md for the roles under ``roles_dir``."""
    roles = [(role, path, load_entry_points(path)) for role, path in spec_files(roles_dir)]
    out = [
        "# Role reference",
        "",
        "Every setting of every gpufleet role, generated from `roles/*/meta/argument_specs.yml` by",
        "`tools/role_reference.py` (`make docs`): edit the specs, not this file.",
        "`tests/unit/test_role_reference.py` fails when this file is not what the specs generate.",
        "The roles validate each value against these specs before they change anything; set them in",
        "your inventory (`inventory/group_vars/all.yml`, per group or per host).",
        "",
        "| role | entry points | options | what it does |",
        "|---|---|---|---|",
    ]
    for role, _path, entry_points in roles:
        main = dict(entry_points).get(MAIN, entry_points[0][1] if entry_points else {})
        names = ", ".join(_code(name) for name, _spec in entry_points)
        total = sum(count_options(spec.get("options")) for _name, spec in entry_points)
        out.append(f"| [{role}](#{role}) | {names} | {total} | {_cell(_text(main.get('short_description')))} |")
    for role, path, entry_points in roles:
        out += ["", f"## {role}", "", f"Spec: `{path.relative_to(roles_dir.parent).as_posix()}`."]
        for name, spec in entry_points:
            if name != MAIN:
                out += ["", f"### Entry point `{name}`"]
            if spec.get("short_description"):
                out += ["", f"**{_text(spec['short_description'])}**"]
            description = spec.get("description")
            for paragraph in description if isinstance(description, list) else [description] if description else []:
                out += ["", _text(paragraph)]
            title = "Options" if name == MAIN else f"Options of `{name}`"
            out += ["", f"#### {title}" if name != MAIN else f"### {title}", ""]
            out += option_table(spec.get("options") or {})
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs from a fresh generation")
    parser.add_argument("--roles-dir", type=Path, default=DEFAULT_ROLES_DIR)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    fresh = render(args.roles_dir)
    try:
        shown = args.output.relative_to(REPO_ROOT)
    except ValueError:
        shown = args.output
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else None
        if current != fresh:
            why = "is missing" if current is None else "is stale"
            print(f"{shown} {why}: regenerate it with `python tools/role_reference.py` (make docs)", file=sys.stderr)
            return 1
        print(f"{shown} is current")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(fresh, encoding="utf-8")
    print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
