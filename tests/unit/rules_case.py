"""The Python rules of a role (plugins/module_utils/rules/<role>.py) called directly, with plain values.

The role's defaults are the starting values (roles/<role>/defaults/main.yml), the Jinja-valued ones given as what
they resolve to in a plain inventory, so that the defaults themselves must pass every rule. The matrix reader is
the lookup gpufleet.fleet.stack's own resolution (plugins/lookup/stack.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
HOST = "gpu-a01"


def defaults(role: str, **resolved: Any) -> dict[str, Any]:
    """The role's defaults, each Jinja-valued one replaced by its value in ``resolved`` (every one must be given)."""
    values = yaml.safe_load((ROLES_DIR / role / "defaults" / "main.yml").read_text())
    templated = sorted(name for name, value in values.items() if isinstance(value, str) and "{{" in value)
    assert sorted(set(templated) - set(resolved)) == [], f"give the resolved values of {role}'s templated defaults"
    return {**values, **resolved}


def stack(**choices: Any) -> dict[str, Any]:
    """The compatibility matrix resolved for these choices, as the lookup gpufleet.fleet.stack returns it."""
    from ansible_collections.gpufleet.fleet.plugins.lookup.stack import load_matrix, resolve

    return resolve(load_matrix(), **choices)


def refusals(role: str, values: Mapping[str, Any], **overrides: Any) -> list[str]:
    """The messages of the rules of ``role`` that do not hold for ``values`` changed by ``overrides``."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import judge

    return judge(role, HOST, {**values, **overrides}, stack=stack).errors
