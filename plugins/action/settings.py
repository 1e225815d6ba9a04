"""Action gpufleet.fleet.settings: judge one role's settings on the controller, with the role's Python rules.

Its documentation is plugins/modules/settings.py (an action without a module,
as ansible.builtin.debug). The rules are plugins/module_utils/rules/<role>.py
(plugins/module_utils/settings.py says how one is written); this action
templates, for the host it runs for, the variables the role's rules read (the
role's defaults and vars included when it runs inside the role), runs them,
and stops the host with one message naming the role, the host and every
failed rule. What the rules resolve comes back in ``resolved``: the role
registers the judgement and its vars/main.yml reads each name from it (a fact
of an action other than set_fact would go to the fact cache, which outlives
the run, and a set_fact would cost a task a host).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.template import Templar

from ansible_collections.gpufleet.fleet.plugins.module_utils.controller_action import ControllerAction, lookup_value
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import (
    INSTALL_PLAY,
    PARTS,
    judge,
    judged_roles,
    narrowed,
    os_vars_file,
    parts,
    probed_roles,
    read_names,
    rejection_of_hosts,
    rules_of,
    spec_options,
    unknown_settings,
)

ARGUMENT_SPEC = {
    "role": {"type": "str"},
    "hosts": {"type": "list", "elements": "str"},
}
ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"


class ActionModule(ControllerAction, ActionBase):
    """Judge one role's settings for one host (see the module docstring)."""

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result, task_vars, args = self.begin(
            tmp, task_vars, ARGUMENT_SPEC, mutually_exclusive=[("role", "hosts")], required_one_of=[("role", "hosts")]
        )
        if args["hosts"] is not None:
            return {**result, **self._judge_hosts(args["hosts"], task_vars)}
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
        lookup = self._shared_loader_obj.lookup_loader.get(
            "gpufleet.fleet.stack", loader=self._loader, templar=self._templar
        )

        def stack(**choices: Any) -> dict[str, Any]:
            return lookup.run([], variables=task_vars, **choices)[0]

        return stack

    def _judge_hosts(self, hosts: list[str], task_vars: dict[str, Any]) -> dict[str, Any]:
        """Every host's settings of every role it runs, each distinct combination judged once (see DOCUMENTATION)."""
        hostvars = task_vars["hostvars"]
        stack = self._stack(task_vars)
        settings = lookup_value(self, "gpufleet.fleet.role_settings", task_vars)
        warned: dict[str, list[str]] = {}
        modules: dict[str, Any] = {}
        # (role, the values its rules read) -> (first host, its hosts, the reasons, what the rules resolved)
        groups: dict[tuple[str, str], tuple[str, list[str], list[str], dict[str, Any]]] = {}
        messages: dict[str, list[tuple[str, str]]] = {host: [] for host in hosts}
        # What the rules resolved for each host, of each role whose entry point probe play 1 runs (the probes read it
        # instead of judging again, host by host); one object for the hosts of one combination.
        resolved: dict[str, dict[str, dict[str, Any]]] = {host: {} for host in hosts}
        for host in hosts:
            raw = hostvars.raw_get(host)
            switches = self._role_variables("gpufleet", raw)
            switched = parts(
                {
                    name: Templar(loader=self._loader, variables=switches).template(switches[name])
                    for name in PARTS.values()
                    if name in switches
                }
            )
            # Every variable with a role's prefix must be a setting of that role (a misspelled one would be
            # ignored and the default used); gpufleet_unknown_settings: warn only warns.
            unknown = unknown_settings(self._given_names(hostvars, host, raw), settings)
            if unknown:
                mode = Templar(loader=self._loader, variables=switches).template(switches["gpufleet_unknown_settings"])
                key = ("inventory", json.dumps(unknown))
                if mode == "warn":
                    warned.setdefault(key[1], []).append(host)
                else:
                    groups.setdefault(key, (host, [], unknown, {}))[1].append(host)
                    messages[host].append(key)
            probed = probed_roles(switched)
            for role in judged_roles(switched):
                if role not in modules:
                    try:
                        modules[role] = rules_of(role)
                    except ValueError as error:
                        raise AnsibleActionFail(f"gpufleet.fleet.settings: {error}") from error
                variables = self._role_variables(role, raw)
                templar = Templar(loader=self._loader, variables=variables)
                given = {name: templar.template(raw[name]) for name in spec_options(role, ROLES_DIR) if name in raw}
                errors = (
                    ArgumentSpecValidator(spec_options(role, ROLES_DIR))
                    .validate(given, validate_role_argument_spec=True)
                    .error_messages
                )
                if errors:
                    messages[host].append(
                        (role, f"{role} settings rejected on {host} (argument spec): {'; '.join(errors)}")
                    )
                    continue
                names = read_names(modules[role].READS, list(variables))
                values = narrowed(modules[role].READS, {name: templar.template(variables[name]) for name in names})
                key = (role, json.dumps(values, sort_keys=True, default=str))
                if key not in groups:
                    judgement = judge(role, host, values, stack=stack)
                    groups[key] = (host, [], judgement.errors, judgement.facts)
                _first, members, reasons, facts = groups[key]
                members.append(host)
                if reasons:
                    messages[host].append((role, key[1]))
                elif role in probed:
                    resolved[host][role] = facts
        rejected = {}
        for host, found in messages.items():
            if not found:
                continue
            said = []
            for role, entry in found:
                if entry.startswith(f"{role} settings rejected on"):
                    said.append(entry)
                    continue
                first, members, reasons, _facts = groups[(role, entry)]
                said.append(rejection_of_hosts(reasons, role, host, first, members))
            rejected[host] = " | ".join(said)
        warnings = [
            f"{', '.join(members)}: {'; '.join(json.loads(names))} (ignored)" for names, members in warned.items()
        ]
        return {
            "changed": False,
            "rejected": rejected,
            "judged": len(groups),
            "warnings": warnings,
            "resolved": {host: roles for host, roles in resolved.items() if host not in rejected},
        }

    def _given_names(self, hostvars: Any, host: str, raw: dict[str, Any]) -> list[str]:
        """The names of the host's variables that the inventory or the command line gave: not its facts, nor
        what a task of this run set (set_fact, register: preflight_report, say)."""
        manager = getattr(hostvars, "_variable_manager", None)
        set_by_tasks = set(getattr(manager, "_nonpersistent_fact_cache", {}).get(host, {}))
        facts = set(raw.get("ansible_facts") or {})
        return [name for name in raw if name not in set_by_tasks and name not in facts]

    def _role_variables(self, role: str, host_vars: dict[str, Any]) -> dict[str, Any]:
        """What the role's tasks would see of its variables on this host: its defaults (over those of the roles its
        play imports with it: INSTALL_PLAY), under the host's variables, under its vars and the vars file of the
        host's OS (settings.os_vars_file, which the roles' include_vars find through the lookup
        gpufleet.fleet.os_vars)."""
        variables: dict[str, Any] = {}
        for other in INSTALL_PLAY if role in INSTALL_PLAY else ():
            variables.update(self._load(ROLES_DIR / other / "defaults" / "main.yml"))
        variables.update(self._load(ROLES_DIR / role / "defaults" / "main.yml"))
        variables.update(host_vars)
        variables.update(self._load(ROLES_DIR / role / "vars" / "main.yml"))
        path = os_vars_file(str(ROLES_DIR / role / "vars"), host_vars.get("ansible_facts") or {})
        if path:
            variables.update(self._load(Path(path)))
        return variables

    def _load(self, path: Path) -> dict[str, Any]:
        """A role's variables file as Ansible reads it (its templates trusted), {} when it does not exist."""
        if not path.is_file():
            return {}
        return dict(self._loader.load_from_file(str(path), trusted_as_template=True) or {})
