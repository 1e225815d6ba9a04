"""Every boolean setting is read through ``| bool`` (issue 16, item 15).

Play 1 checks each setting against its role's argument spec, and the spec
accepts the strings "no", "false", "0" for a bool. But
``validate_argument_spec`` does not convert the variable: the role still sees
the string. ``when: preflight_require_kernel_headers`` with ``-e
preflight_require_kernel_headers=no`` then fails with "Conditional result
(True) was derived from value of type 'str'" (which names no variable), and in
a Jinja ``and``/``not`` the non-empty string "no" is true. So every read of a
bool setting in a condition or an expression must go through ``| bool``.

This scans every expression in roles/ and playbooks/ (``when``,
``failed_when``, ``changed_when``, ``until`` and every ``{{ }}``/``{% %}``)
for a bool setting of any spec (the roles' and the playbooks' own, in
roles/gpufleet) that is not followed by ``| bool``. String literals inside
expressions (messages) are left out. The behaviour for "no" is checked by the
real runs in tests/e2e/test_bad_input.py::test_string_booleans_behave_as_false.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONDITION_KEYS = {"when", "failed_when", "changed_when", "until"}


def bool_settings() -> set[str]:
    names = set()
    for spec_file in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        for entry in (yaml.safe_load(spec_file.read_text())["argument_specs"] or {}).values():
            names |= {name for name, option in (entry.get("options") or {}).items() if option.get("type") == "bool"}
    return names


BOOLS = bool_settings()


def _expressions(node, key: str | None = None):
    """Every expression of a parsed task file: conditions whole, and the {{ }}/{% %} inside other strings."""
    if isinstance(node, dict):
        for k, value in node.items():
            yield from _expressions(value, k)
    elif isinstance(node, list):
        for item in node:
            yield from _expressions(item, key)
    elif isinstance(node, str):
        if key in CONDITION_KEYS:
            yield node
        yield from re.findall(r"{{(.*?)}}|{%(.*?)%}", node, re.S) and [
            a or b for a, b in re.findall(r"{{(.*?)}}|{%(.*?)%}", node, re.S)
        ]


def _unconverted(expression: str) -> list[str]:
    code = re.sub(r"'[^']*'|\"[^\"]*\"", "''", expression)
    found = []
    for name in BOOLS:
        for match in re.finditer(rf"(?<![\w.\[']){name}\b", code):
            rest = code[match.end() :]
            if code[: match.start()].endswith("default("):
                rest = rest[1:] if rest.startswith(")") else rest  # the fallback of a default(): its filter follows
            # hostvars[h].name | default(name) | bool: the last filter is bool
            rest = re.sub(r"^\s*\|\s*default\([^)]*\)", "", rest)
            if not re.match(r"\s*\|\s*bool\b", rest):
                found.append(name)
    return found


def _files():
    for path in sorted([*(REPO / "roles").rglob("*.yml"), *(REPO / "playbooks").rglob("*.yml"), REPO / "site.yml"]):
        if "meta" in path.parts or "defaults" in path.parts or "molecule" in path.parts:
            continue
        yield path
    yield from sorted((REPO / "roles").rglob("*.j2"))


def test_the_scan_knows_the_bool_settings():
    assert {"preflight_require_kernel_headers", "pytorch_require_gpu", "gpufleet_slurm", "cuda_pin"} <= BOOLS


def test_the_scan_catches_a_bare_read():
    assert _unconverted(" preflight_require_kernel_headers ") == ["preflight_require_kernel_headers"]
    assert _unconverted("not preflight_require_gpus and x") == ["preflight_require_gpus"]
    assert _unconverted("preflight_require_gpus | bool and 'preflight_require_gpus' in x") == []
    assert _unconverted("hostvars[h].monitoring_dcgm | default(monitoring_dcgm) | bool") == []


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: str(p.relative_to(REPO)))
def test_every_read_of_a_bool_setting_goes_through_bool(path):
    text = path.read_text()
    if path.suffix == ".j2":
        expressions = [a or b for a, b in re.findall(r"{{(.*?)}}|{%(.*?)%}", text, re.S)]
    else:
        expressions = list(_expressions(yaml.safe_load(text)))
    bare = sorted({(name, expression.strip()[:100]) for expression in expressions for name in _unconverted(expression)})
    assert not bare, f"{path.relative_to(REPO)} reads bool settings without | bool: {bare}"
