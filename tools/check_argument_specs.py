#!/usr/bin/env python
"""Check that every role's meta/argument_specs.yml matches its defaults/main.yml.

For each roles/<role>/ directory, with the argument spec of entry point
``main``:

* every variable in defaults/main.yml has an option in the spec;
* every option with a ``default`` is a variable in defaults/main.yml;
* the two defaults are equal as YAML values, types included: ``20`` and
  ``"20"``, ``1`` and ``true``, ``1`` and ``1.0`` all differ; Jinja
  defaults must be the same string;
* every option has a non-empty ``description`` and a ``type``.

Usage: check_argument_specs.py [ROLES_DIR]   (default: <repo>/roles)
Exit status 0 and "argument specs: N roles in sync", or 1 and the problems.
Importable: ``main(argv)`` returns the exit status, ``check_roles(path)``
returns ``(role_count, problems)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROLES_DIR = REPO_ROOT / "roles"
ENTRY_POINT = "main"
YAML_EXTENSIONS = (".yml", ".yaml")


def _yaml_file(directory: Path, stem: str) -> Path | None:
    """``directory/stem.yml`` or ``.yaml``, whichever exists (as Ansible looks them up)."""
    for ext in YAML_EXTENSIONS:
        path = directory / f"{stem}{ext}"
        if path.is_file():
            return path
    return None


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_defaults(role_dir: Path) -> dict[str, Any]:
    """The role's default variables: defaults/main.yml, or the files of a defaults/main/ directory merged."""
    defaults_dir = role_dir / "defaults"
    path = _yaml_file(defaults_dir, "main")
    if path is not None:
        return _load(path) or {}
    merged: dict[str, Any] = {}
    if (defaults_dir / "main").is_dir():
        for part in sorted(p for p in (defaults_dir / "main").iterdir() if p.suffix in YAML_EXTENSIONS):
            merged.update(_load(part) or {})
    return merged


def load_argument_spec(role_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """The ``main`` entry point's spec and where it came from.

    Like ansible-core: meta/argument_specs.yml wins; else the
    ``argument_specs`` key of meta/main.yml. Returns (None, reason) when
    there is no spec for the entry point.
    """
    meta = role_dir / "meta"
    path = _yaml_file(meta, "argument_specs")
    if path is None:
        path = _yaml_file(meta, "main")
        if path is None or "argument_specs" not in (_load(path) or {}):
            return None, "has no meta/argument_specs.yml"
    specs = (_load(path) or {}).get("argument_specs") or {}
    where = path.relative_to(role_dir).as_posix()
    if ENTRY_POINT not in specs:
        return None, f"{where} has no '{ENTRY_POINT}' entry point"
    return specs[ENTRY_POINT] or {}, where


def same_value(a: Any, b: Any) -> bool:
    """Equality of YAML values that also requires equal types (bool is not int, int is not str)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check_role(role_dir: Path) -> list[str]:
    """Every way the role's argument spec and defaults disagree, as messages."""
    name = f"roles/{role_dir.name}"
    defaults = load_defaults(role_dir)
    spec, where = load_argument_spec(role_dir)
    if spec is None:
        return [f"{name}: {where} but defaults/main.yml sets {len(defaults)} variable(s)"] if defaults else []

    options = spec.get("options") or {}
    problems: list[str] = []
    for var in defaults:
        if var not in options:
            problems.append(f"{name}: {var} is in defaults/main.yml but has no option in {where}")
    for opt, attrs in options.items():
        attrs = attrs or {}
        if not attrs.get("description"):
            problems.append(f"{name}: option {opt} has no description")
        if not attrs.get("type"):
            problems.append(f"{name}: option {opt} has no type")
        if "default" in attrs and opt not in defaults:
            problems.append(f"{name}: option {opt} has a default but is not in defaults/main.yml")
        if opt in defaults:
            if "default" not in attrs:
                problems.append(f"{name}: option {opt} has no default; defaults/main.yml sets {defaults[opt]!r}")
            elif not same_value(attrs["default"], defaults[opt]):
                problems.append(
                    f"{name}: option {opt} defaults to {attrs['default']!r} ({type(attrs['default']).__name__}) in "
                    f"{where} but to {defaults[opt]!r} ({type(defaults[opt]).__name__}) in defaults/main.yml"
                )
    return problems


def check_roles(roles_dir: Path) -> tuple[int, list[str]]:
    """Check every role directory under ``roles_dir``: (number of roles, problems)."""
    roles = sorted(p for p in roles_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    problems = [problem for role in roles for problem in check_role(role)]
    return len(roles), problems


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "roles_dir", nargs="?", type=Path, default=DEFAULT_ROLES_DIR, help="directory of roles (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if not args.roles_dir.is_dir():
        print(f"argument specs: {args.roles_dir} is not a directory", file=sys.stderr)
        return 1
    count, problems = check_roles(args.roles_dir)
    if problems:
        print(f"argument specs: {len(problems)} problem(s) in {args.roles_dir}:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(f"argument specs: {count} roles in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
