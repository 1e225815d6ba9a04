#!/usr/bin/python
# The documentation of the action plugin gpufleet.fleet.settings (plugins/action/settings.py),
# which runs on the controller only; there is no module to run on a host (as with ansible.builtin.debug).

DOCUMENTATION = r"""
---
module: settings
short_description: Judge one gpufleet role's settings with its Python rules, on the controller
description:
  - Templates the variables that the role's rules module (plugins/module_utils/rules/<role>.py) reads, runs its
    rules, and fails the host with one message naming the role, the host and every rule that does not hold.
  - Changes nothing on any host, and runs in check mode too.
  - >-
    With O(hosts) instead of O(role), run once (C(run_once)) for a whole play; every host's settings of every role
    play 1 judges for it (the lookup gpufleet.fleet.parts, judged) are judged on the controller (the role's argument
    spec, then its rules), each distinct combination of a role's settings and facts once; a rejection shared by
    several hosts is said once, naming them.
options:
  role:
    description: The role whose rules to run for this host (a module of plugins/module_utils/rules).
    type: str
  hosts:
    description: The hosts to judge (the play's hosts).
    type: list
    elements: str
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Judge the CUDA settings
  gpufleet.fleet.settings:
    role: cuda
  register: __cuda_judged
"""

RETURN = r"""
rejected:
  description: With O(hosts), the hosts whose settings are rejected, each with the message that stops it.
  returned: with hosts
  type: dict
judged:
  description: With O(hosts), how many distinct combinations of a role's settings were judged.
  returned: with hosts
  type: int
resolved:
  description:
    - With O(role), the private facts of the role that its rules resolved (name to value), which the role's vars read
      from the registered result.
    - With O(hosts), the same for every host that is not rejected, by host, then by each role whose entry point probe
      play 1 runs (the lookup gpufleet.fleet.parts, probed). Play 1 registers it as C(gpufleet_judgement), and those
      roles' vars read it where the role has not judged its settings itself (its entry point probe).
  returned: always
  type: dict
notes:
  description: Warnings about this host's settings that do not stop it (the role's tasks say them, once per run).
  returned: with role
  type: list
  elements: str
errors:
  description: The messages of the rules that do not hold (the host fails when there is one).
  returned: with role
  type: list
  elements: str
"""
