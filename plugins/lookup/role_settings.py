"""The settings every gpufleet role declares in its argument specs.

``lookup('gpufleet.fleet.role_settings')`` returns ``{role: [option, ...]}``
for every role of this collection (the options of all its entry points), read
from ``roles/<role>/meta/argument_specs.yml``: the one place that defines a
role's settings. Play 1 compares the inventory's variables with it
(``gpufleet.fleet.unknown_settings``).

``lookup('gpufleet.fleet.role_settings', role='cuda')`` returns that role's
``main`` argument spec, which play 1 applies with
``ansible.builtin.validate_argument_spec`` before any role runs. Its defaults
are left out: play 1 checks the values the inventory gives, and a role's
default (often a template over facts) is the role's own, from its
defaults/main.yml, once the role runs.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: role_settings
author: gpufleet maintainers (@gpufleet)
short_description: The settings of every role of this collection, from their argument specs
description:
  - Returns one mapping of role name to the sorted option names of all the role's entry points.
  - With O(role), returns the options of that role's main entry point instead.
options:
  role:
    description: A role whose main argument spec to return; empty for the settings of every role.
    type: str
    default: ""
"""

RETURN = r"""
_raw:
  description: One mapping (a list of one element).
  type: list
  elements: dict
"""

from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import entry_points, without_defaults

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"


def role_spec(role: str, roles_dir: Path = ROLES_DIR) -> dict[str, Any]:
    """The options of ``role``'s main entry point."""
    spec_file = roles_dir / role / "meta" / "argument_specs.yml"
    try:
        specs = entry_points(spec_file)
    except (OSError, yaml.YAMLError) as error:
        raise AnsibleLookupError(
            f"gpufleet.fleet.role_settings: no argument spec for role {role!r}: {error}"
        ) from error
    if "main" not in specs:
        raise AnsibleLookupError(f"gpufleet.fleet.role_settings: {spec_file} has no main entry point")
    return without_defaults(specs["main"].get("options") or {})


def role_settings(roles_dir: Path = ROLES_DIR) -> dict[str, list[str]]:
    """{role: sorted option names} from every roles/*/meta/argument_specs.yml."""
    settings: dict[str, list[str]] = {}
    for spec_file in sorted(roles_dir.glob("*/meta/argument_specs.yml")):
        try:
            specs = entry_points(spec_file)
        except (OSError, yaml.YAMLError) as error:
            raise AnsibleLookupError(f"gpufleet.fleet.role_settings: cannot read {spec_file}: {error}") from error
        names: set[str] = set()
        for entry in specs.values():
            names.update((entry or {}).get("options") or {})
        settings[spec_file.parent.parent.name] = sorted(names)
    return settings


class LookupModule(LookupBase):
    """lookup('gpufleet.fleet.role_settings')"""

    def run(
        self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[dict[str, list[str]]]:
        self.set_options(var_options=variables, direct=kwargs)
        role = self.get_option("role")
        return [role_spec(role) if role else role_settings()]
