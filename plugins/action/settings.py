"""Action gpufleet.fleet.settings: judge one role's settings on the controller, with the role's Python rules.

DOCUMENTATION is below. The rules are plugins/module_utils/rules/<role>.py
(plugins/module_utils/settings.py says how one is written); this action
templates, for the host it runs for, the variables the role's rules read (the
role's defaults and vars included when it runs inside the role), runs them,
and stops the host with one message naming the role, the host and every
failed rule. What the rules resolve comes back in ``resolved`` for the role's
next task to set (a fact of an action other than set_fact would go to the fact
cache, which outlives the run).
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: settings
author: gpufleet maintainers (@gpufleet)
short_description: Judge one gpufleet role's settings with its Python rules, on the controller
description:
  - Templates the variables that the role's rules module (plugins/module_utils/rules/<role>.py) reads, runs its
    rules, and fails the host with one message naming the role, the host and every rule that does not hold.
  - Changes nothing on any host, and runs in check mode too.
options:
  role:
    description: The role whose rules to run (a module of plugins/module_utils/rules).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Judge the CUDA settings
  gpufleet.fleet.settings:
    role: cuda
  register: __cuda_judged
"""

RETURN = r"""
resolved:
  description: The private facts of the role that its rules resolved (name to value), for the role's next task to set.
  returned: always
  type: dict
notes:
  description: Warnings about this host's settings that do not stop it (the role's tasks say them, once per run).
  returned: always
  type: list
  elements: str
errors:
  description: The messages of the rules that do not hold (the host fails when there is one).
  returned: always
  type: list
  elements: str
"""

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import judge, read_names, rules_of

ARGUMENT_SPEC = {"role": {"type": "str", "required": True}}


class ActionModule(ActionBase):
    """Judge one role's settings for one host (see the module docstring)."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        role = args["role"]
        try:
            rules = rules_of(role)
        except ValueError as error:
            raise AnsibleActionFail(f"gpufleet.fleet.settings: {error}") from error
        values = {name: self._templar.template(task_vars[name]) for name in read_names(rules.READS, list(task_vars))}
        host = str(task_vars.get("inventory_hostname", ""))
        judgement = judge(role, host, values, stack=self._stack(task_vars))
        result.update(changed=False, resolved=judgement.facts, notes=judgement.notes, errors=judgement.errors)
        if judgement.errors:
            result.update(failed=True, msg=judgement.message)
        return result

    def _stack(self, task_vars: dict[str, Any]) -> Any:
        """The lookup gpufleet.fleet.stack as a function of its options."""
        lookup = self._shared_loader_obj.lookup_loader.get("gpufleet.fleet.stack", loader=self._loader, templar=self._templar)

        def stack(**choices: Any) -> dict[str, Any]:
            return lookup.run([], variables=task_vars, **choices)[0]

        return stack
