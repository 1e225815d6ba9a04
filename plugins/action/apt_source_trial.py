"""Action gpufleet.fleet.apt_source_trial: the internal role apt_source's entry point trial in one task a host
(documentation: plugins/modules/apt_source_trial.py).

The task gives the source once (apt_source_repository, rendered once into O(repository)). The role's variables
that read it (vars/main.yml: its parts with their defaults, the source file's path) are then read over that one
value, and the role's templates (the source and the pins, which the install writes with the same files) rendered
over those values (the lookup gpufleet.fleet.role_template). The module's arguments follow in Python
(plugins/module_utils/apt_source.py, trial_arguments) and the module gpufleet.fleet.apt_trial runs on the host.

Before, the task's arguments were Jinja in trial.yml: every reference to a part of the source rendered the
caller's dict of the source again, and each of its values the caller's judged settings (about 180 renders a trial,
an eighth of play 1's controller CPU; issue 30, docs/scale.md).
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.fleet.plugins.module_utils.apt_source import trial_arguments
from ansible_collections.gpufleet.fleet.plugins.module_utils.controller_action import HostAction

ARGUMENT_SPEC = {
    "repository": {"type": "dict", "required": True},
    "package": {"type": "str", "required": True},
    "version": {"type": "str", "default": ""},
    "version_name": {"type": "str", "default": ""},
    "url_name": {"type": "str", "default": ""},
    "keyring_name": {"type": "str", "default": ""},
    "setting_names": {"type": "dict", "default": {}},
    "show_packages": {"type": "list", "elements": "str", "default": []},
    "simulate_packages": {"type": "list", "elements": "str", "default": []},
    "simulate_release": {"type": "list", "elements": "str", "default": []},
    "simulate_pins": {"type": "list", "elements": "dict", "default": []},
    "claims": {"type": "list", "elements": "dict", "default": []},
}

# The parts of the source, as the role's variables name them (apt_source_<part>), and its paths on the host.
PARTS = (
    "caller",
    "name",
    "description",
    "url",
    "suites",
    "components",
    "architectures",
    "keyring",
    "key_url",
    "keyring_deb_url",
    "managed",
)
PATHS = {
    "sources_file": "__apt_source_sources_file",
    "records_dir": "__apt_source_records_dir",
    "preferences_dir": "__apt_source_preferences_dir",
}


def read_source(read: Callable[[str], Any]) -> dict[str, Any]:
    """The source as trial_arguments takes it: its parts and paths read by the role's variable names (``read``: a
    name to its value, in PARTS' then PATHS' order, so that the paths see the parts), ``managed`` as a bool."""
    source = {part: read(f"apt_source_{part}") for part in PARTS}
    source.update((key, read(name)) for key, name in PATHS.items())
    source["managed"] = boolean(source["managed"], strict=False)
    return source


class ActionModule(HostAction, ActionBase):
    """Derive the trial's arguments on the controller and run the module apt_trial (see the module docstring)."""

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result, task_vars, args = self.begin(tmp, task_vars, ARGUMENT_SPEC)
        # The role's variables over the source as given: each reads apt_source_repository, rendered once here.
        layer: dict[str, Any] = {"apt_source_repository": args["repository"]}
        variables = collections.ChainMap(layer, task_vars)
        templar = self._templar.copy_with_new_env(available_variables=variables)

        def read(name: str) -> Any:
            # Kept in the layer: the next variables and the templates read it as a value, not rendered again.
            layer[name] = templar.resolve_variable_expression(name)
            return layer[name]

        source = read_source(read)
        try:
            module_args = trial_arguments(source, args, str(task_vars.get("inventory_hostname", "")))
        except ValueError as error:
            return {**result, "failed": True, "changed": False, "msg": str(error)}
        # The source and the pins as entry point main writes them (its own templates), for the host's copy and the
        # simulation.
        module_args["sources_text"] = self._role_template(variables, "source.sources.j2", {})
        # One preferences file's text: its stanzas apart by an empty line, as apt reads them.
        module_args["environment"]["TRIAL_PREFERENCES"] = "".join(
            self._role_template(variables, "pin.pref.j2", {"__apt_source_pin": pin}).rstrip("\n") + "\n\n"
            for pin in args["simulate_pins"]
        )
        module_args["script"] = self._role_file("apt-repository-trial.sh")
        module_args["plan_script"] = self._role_file("apt-source-files.sh") if source["managed"] else ""
        module_args["claims"] = args["claims"]
        result.update(
            self._execute_module(module_name="gpufleet.fleet.apt_trial", module_args=module_args, task_vars=task_vars)
        )
        return result

    def _role_template(self, variables: Any, name: str, extra: dict[str, Any]) -> str:
        """The role's template ``name`` rendered as gpufleet.fleet.role_template renders it."""
        lookup = self._shared_loader_obj.lookup_loader.get(
            "gpufleet.fleet.role_template", loader=self._loader, templar=self._templar
        )
        return lookup.run([name], variables=variables, template_vars=extra)[0]

    def _role_file(self, name: str) -> str:
        """The text of the role's file ``name`` (its files/)."""
        with open(self._find_needle("files", name), encoding="utf-8") as handle:
            return handle.read()
