"""A template of the running role rendered as ansible.builtin.template's lookup renders it, without copying every
variable of the task first; DOCUMENTATION is below."""

from __future__ import annotations

DOCUMENTATION = r"""
name: role_template
author: gpufleet maintainers (@gpufleet)
short_description: Render a template of the running role, as the template lookup does, for many hosts cheaply
description:
  - Renders each term, a file of the running role's C(templates/) (found as M(ansible.builtin.template) finds it),
    with the task's variables, O(template_vars) over them, and C(ansible_managed) as the template action sets it
    (where no variable sets it);
    the same text as P(ansible.builtin.template#lookup) with C(trim_blocks) on.
  - Unlike that lookup, which deep-copies every variable of the task (facts, inventory, every role's defaults) for
    each term and host, the variables are read through a mapping over the task's own; in play 1 of a few hundred
    hosts that copy was a tenth of the controller's CPU (issue 30, docs/scale.md).
  - The templates the roles write with M(ansible.builtin.template) are rendered with this lookup where a read-only
    task compares the host's file with the text the install would write, so the text has one source.
options:
  _terms:
    description: The template files, relative to the role's C(templates/).
    required: true
  template_vars:
    description: Variables over the task's, for this lookup only.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Compare the host's source file with the one the install would write
  ansible.builtin.debug:
    msg: "{{ lookup('gpufleet.fleet.role_template', 'source.sources.j2') }}"
"""

RETURN = r"""
_raw:
  description: The rendered text of each term.
  type: list
  elements: str
"""

import collections
import os
import pwd
import time
from typing import Any

from ansible import constants as C
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible.template import trust_as_template


def ansible_managed(path: str) -> str:
    """``ansible_managed`` as the template action sets it for the file ``path``: the configured DEFAULT_MANAGED_STR,
    its {file}, {host} and {uid} filled in and its strftime fields read at the file's modification time."""
    stat = os.stat(path)
    try:
        uid: Any = pwd.getpwuid(stat.st_uid).pw_name
    except KeyError:
        uid = stat.st_uid
    text = str(C.config.get_config_value("DEFAULT_MANAGED_STR"))
    text = text.format(host=os.uname()[1], uid=uid, file=path.replace("%", "%%"))
    return time.strftime(text, time.localtime(stat.st_mtime))


class LookupModule(LookupBase):
    """lookup('gpufleet.fleet.role_template', name, template_vars={...})"""

    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[Any]:
        variables = variables or {}
        self.set_options(var_options=variables, direct=kwargs)
        extra = self.get_option("template_vars")
        rendered = []
        for term in terms:
            path = self.find_file_in_search_path(variables, "templates", term)
            if not path:
                raise AnsibleLookupError(f"the role has no template {term}")
            text = trust_as_template(self._loader.get_text_file_contents(path))
            # As the template action: a variable ansible_managed the inventory sets is kept.
            layer = {} if "ansible_managed" in variables else {"ansible_managed": ansible_managed(path)}
            layer.update(extra)
            templar = self._templar.copy_with_new_env(
                available_variables=collections.ChainMap(layer, variables), searchpath=[os.path.dirname(path)]
            )
            rendered.append(templar.template(text, escape_backslashes=False, overrides={"trim_blocks": True}))
        return rendered
