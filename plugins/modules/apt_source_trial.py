#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The documentation of the action plugin gpufleet.fleet.apt_source_trial (plugins/action/apt_source_trial.py), which
# derives the arguments of the module gpufleet.fleet.apt_trial on the controller and runs it; there is no module of
# its own to run on a host.

DOCUMENTATION = r"""
---
module: apt_source_trial
short_description: The internal role apt_source's entry point trial in one task, from the source given once
description:
  - The task of the role's C(trial) entry point (roles/apt_source/meta/argument_specs.yml documents the inputs and
    the fact). The source is given once (O(repository), the role's C(apt_source_repository)); the role's variables
    that read its parts, with their defaults (vars/main.yml), and the source file's path are read over that one
    value, on the controller.
  - The source and the pins are rendered from the role's own templates (as entry point main writes them, with the
    lookup P(gpufleet.fleet.role_template#lookup)), the role's trial scripts read from its C(files/), and the module's
    arguments derived in Python (plugins/module_utils/apt_source.py, C(trial_arguments)); then
    M(gpufleet.fleet.apt_trial) runs on the host, and its result is this task's.
  - Changes nothing on the host, in check mode or not.
options:
  repository:
    description: The source (C(apt_source_repository)).
    type: dict
    required: true
  package:
    description: The package whose offered versions are read (C(apt_source_package)).
    type: str
    required: true
  version:
    description: The version that must be offered (C(apt_source_version)); empty for none.
    type: str
    default: ""
  version_name:
    description: What the message calls the version (C(apt_source_version_name)).
    type: str
    default: ""
  url_name:
    description: Where the URL came from, in messages (C(apt_source_url_name)).
    type: str
    default: ""
  keyring_name:
    description: What the message calls a missing keyring (C(apt_source_keyring_name)).
    type: str
    default: ""
  setting_names:
    description: The caller's settings behind each part of the source (C(apt_source_setting_names)).
    type: dict
    default: {}
  show_packages:
    description: Packages whose stanzas are read (C(apt_source_show_packages)).
    type: list
    elements: str
    default: []
  simulate_packages:
    description: Packages whose installation is simulated (C(apt_source_simulate_packages)).
    type: list
    elements: str
    default: []
  simulate_release:
    description: Installed packages whose hold the simulation lifts (C(apt_source_simulate_release)).
    type: list
    elements: str
    default: []
  simulate_pins:
    description: The pins the simulation applies (C(apt_source_simulate_pins)).
    type: list
    elements: dict
    default: []
  claims:
    description: The run's claims so far (C(apt_source_trial.claims) of the host's last trial).
    type: list
    elements: dict
    default: []
notes:
  - Supports check mode (it reads only).
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Try the source (read-only)
  gpufleet.fleet.apt_source_trial:
    repository: "{{ apt_source_repository }}"
    package: "{{ apt_source_package }}"
    version: "{{ apt_source_version | default('') }}"
    claims: "{{ apt_source_trial.claims | default([]) }}"
  register: apt_source_trial
"""

RETURN = r"""
message:
  description: The message that stops the host, empty when the source is usable and offers the version; every other
    field is M(gpufleet.fleet.apt_trial)'s (the fact C(apt_source_trial)).
  returned: always
  type: str
claims:
  description: The run's claims with this source user's in them.
  returned: always
  type: list
  elements: dict
"""
