"""The path of the running role's OS vars file (settings.os_vars_file: the first of <distribution>-<major>.yml,
<distribution>.yml and <os_family>.yml in its vars/), for the roles' include_vars; DOCUMENTATION is below."""

from __future__ import annotations

DOCUMENTATION = r"""
name: os_vars
author: gpufleet maintainers (@gpufleet)
short_description: The path of the running role's vars file for the host's OS
description:
  - Returns the first of C(<distribution>-<major>.yml), C(<distribution>.yml) and C(<os_family>.yml) that exists in
    the running role's C(vars/) (C(role_path)), from the host's facts; an empty string where none does.
  - The one place of that order, shared with the run-once judgement (gpufleet.fleet.settings), which loads the same
    file for each host on the controller.
options: {}
"""

EXAMPLES = r"""
- name: Load the package layout for this OS
  ansible.builtin.include_vars:
    file: "{{ lookup('gpufleet.fleet.os_vars') }}"
  when: lookup('gpufleet.fleet.os_vars') | length > 0
"""

RETURN = r"""
_raw:
  description: One path, or an empty string (a list of one element).
  type: list
  elements: str
"""

import os
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import os_vars_file


class LookupModule(LookupBase):
    """lookup('gpufleet.fleet.os_vars')"""

    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[Any]:
        variables = variables or {}
        if terms or "role_path" not in variables:
            raise AnsibleLookupError("gpufleet.fleet.os_vars takes no term and runs in a role (role_path)")
        facts = self._templar.template(variables.get("ansible_facts")) or {}
        return [os_vars_file(os.path.join(str(self._templar.template(variables["role_path"])), "vars"), facts)]
