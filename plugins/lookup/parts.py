"""The parts of a gpufleet run a host has switched on, and the roles each play judges and probes for it.

DOCUMENTATION is below. The switches (gpufleet_pytorch, _slurm, _monitoring,
_container) are the gpufleet role's settings, with their defaults in
roles/gpufleet/defaults/main.yml: this lookup reads them from the host's
variables over those defaults, so that no play restates a default.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: parts
author: gpufleet maintainers (@gpufleet)
short_description: The parts of a gpufleet run switched on for a host, and the roles its plays judge and probe
description:
  - Reads the switches gpufleet_pytorch, gpufleet_slurm, gpufleet_monitoring and gpufleet_container from the host's
    variables, over the gpufleet role's defaults (roles/gpufleet/defaults/main.yml), the one place of their defaults.
  - Without a term, returns the mapping of part (pytorch, slurm, monitoring, container) to true or false.
  - With the term C(judged), the roles whose settings play 1 judges for the host; with C(probed), the roles whose
    download sources play 1 tries (each role's entry point probe).
options:
  _terms:
    description: Nothing, C(judged) or C(probed).
    type: list
    elements: str
    required: false
"""

EXAMPLES = r"""
- name: Install PyTorch when it is switched on
  ansible.builtin.import_role:
    name: gpufleet.fleet.pytorch
  when: lookup('gpufleet.fleet.parts').pytorch
"""

RETURN = r"""
_raw:
  description: One mapping of part to bool, or one list of role names (a list of one element).
  type: list
  elements: raw
"""

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import judged_roles, parts, probed_roles

DEFAULTS = Path(__file__).resolve().parents[2] / "roles" / "gpufleet" / "defaults" / "main.yml"


class LookupModule(LookupBase):
    """lookup('gpufleet.fleet.parts'[, 'judged' | 'probed'])"""

    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[Any]:
        self.set_options(var_options=variables, direct=kwargs)
        defaults = self._loader.load_from_file(str(DEFAULTS), trusted_as_template=True) or {}
        values = {**defaults, **(variables or {})}
        switched = parts({name: self._templar.template(values[name]) for name in defaults if name in values})
        if not terms:
            return [switched]
        if terms == ["judged"]:
            return [judged_roles(switched)]
        if terms == ["probed"]:
            return [probed_roles(switched)]
        raise AnsibleLookupError(f"gpufleet.fleet.parts: unknown term {terms!r} (nothing, judged or probed)")
