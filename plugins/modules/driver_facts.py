#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: driver_facts
short_description: Read the NVIDIA driver on a host and judge it, in one round trip
description:
  - The nvidia_driver role's reads of a host, each judged on the host, in one module run.
  - With O(foreign), runs the role's probe (C(roles/nvidia_driver/files/foreign_driver_probe.sh)) for the installed
    NVIDIA driver packages, the repositories that offer their installed versions and the files of NVIDIA's .run
    installer, and judges what it found against the configured driver source as the filter
    P(gpufleet.fleet.foreign_driver#filter) does (see its documentation for the judgement). The judgement's keys are
    the result's own, so that the registered result is the judgement. Fails with RV(message) where the host stops
    (before O(stack) is read), and warns with RV(notice).
  - With O(stack), runs the role's listing of the installed driver stack (C(roles/nvidia_driver/files/driver_stack.py),
    with the Python that runs this module) and C(apt-mark showhold), and returns RV(stack), the stack and the holds
    as the install reads them.
  - Changes nothing on the host, in check mode or not.
options:
  foreign:
    description: Look for a driver gpufleet did not install; omitted, no look.
    type: dict
    suboptions:
      script:
        description: The probe, a POSIX shell script printing the sections the judgement reads.
        type: str
        required: true
      layouts:
        description: The driver sources' package layouts of the host's OS (the role's C(__nvidia_driver_sources)).
        type: dict
        required: true
      source:
        description: The configured driver source, a key of O(foreign.layouts).
        type: str
        required: true
      branch:
        description: The configured driver branch.
        type: str
        required: true
      repository_url:
        description: The configured repository URL; empty for the source's default.
        type: str
        default: ""
      fact:
        description: gpufleet's driver fact on the host (C(ansible_local.nvidia_driver)); empty where there is none.
        type: dict
        default: {}
      mode:
        description: What to do with a driver gpufleet did not install (C(nvidia_driver_foreign_driver)).
        type: str
        default: refuse
        choices: [refuse, adopt, replace]
      host:
        description: The host's name in the messages (the inventory name).
        type: str
        default: ""
  stack:
    description: List the installed driver stack and the held packages; omitted, no listing.
    type: dict
    suboptions:
      script:
        description: The listing, a Python script (C(driver_stack.py)) run with the module's Python.
        type: str
        required: true
      packages:
        description: Every package the role installs for the driver.
        type: list
        elements: str
        required: true
      versioned_packages:
        description: Those of O(stack.packages) that carry the driver's version.
        type: list
        elements: str
        required: true
      pin_patterns:
        description: The fnmatch patterns of the driver's package names.
        type: list
        elements: str
        required: true
      replaced_packages:
        description: The packages of the branch the install replaces; empty when it replaces none.
        type: list
        elements: str
        default: []
      replaced_pin_patterns:
        description: The name patterns of the branch the install replaces.
        type: list
        elements: str
        default: []
      support_packages:
        description: The packages the install asks for first (kernel headers, DKMS, initramfs tools).
        type: list
        elements: str
        default: []
      version:
        description: The driver release the install moves to; empty to leave the version to apt.
        type: str
        default: ""
      query:
        description:
          - Whether the host's package database can be asked; when false, nothing is read and the stacks and holds
            are empty (check mode on a host whose repository is not configured yet).
        type: bool
        default: true
author:
  - gpufleet maintainers (@gpufleet)
notes:
  - Runs on Debian and Ubuntu hosts (dpkg, apt).
"""

EXAMPLES = r"""
- name: Read the installed NVIDIA driver packages, their origins and the .run installer's traces, and judge them
  gpufleet.fleet.driver_facts:
    foreign:
      script: "{{ lookup('ansible.builtin.file', 'foreign_driver_probe.sh') }}"
      layouts: "{{ __nvidia_driver_sources }}"
      source: nvidia
      branch: "535"
      fact: "{{ ansible_local.nvidia_driver | default({}) }}"
      host: "{{ inventory_hostname }}"
  register: driver_look
  changed_when: false
  check_mode: false

- name: List the installed driver stack and the held packages
  gpufleet.fleet.driver_facts:
    stack:
      script: "{{ lookup('ansible.builtin.file', 'driver_stack.py') }}"
      packages: [nvidia-headless-535, nvidia-utils-535]
      versioned_packages: [nvidia-headless-535, nvidia-utils-535]
      pin_patterns: ["*nvidia*-535", "*nvidia*-535-*"]
      version: 535.261.03
  register: driver_stack
  changed_when: false
  check_mode: false
"""

RETURN = r"""
foreign:
  description: Whether a driver gpufleet did not install is on the host (packages or .run installer files).
  returned: when O(foreign) is given
  type: bool
packages:
  description: The driver packages gpufleet did not install (package, version, status, sources, origin).
  returned: when O(foreign) is given
  type: list
  elements: dict
adopted:
  description: The packages O(foreign.mode=adopt) takes over.
  returned: when O(foreign) is given
  type: list
  elements: str
own:
  description: The driver packages gpufleet installed (its fact is on the host).
  returned: when O(foreign) is given
  type: list
  elements: str
runfile:
  description: The .run installer's traces (found, files, version, uninstaller, log).
  returned: when O(foreign) is given
  type: dict
remove:
  description: The packages O(foreign.mode=replace) purges before the install.
  returned: when O(foreign) is given
  type: list
  elements: str
uninstall:
  description: The .run installer's uninstaller and its arguments, which O(foreign.mode=replace) runs first.
  returned: when O(foreign) is given
  type: list
  elements: str
stop:
  description: Whether the host stops (nothing has been changed); the module then fails with RV(message).
  returned: when O(foreign) is given
  type: bool
message:
  description: The stop's message, naming what was found and the moves; empty without a stop.
  returned: when O(foreign) is given
  type: str
notice:
  description: What O(foreign.mode=replace) removes before the install, which the module warns with; empty
    otherwise.
  returned: when O(foreign) is given
  type: str
stack:
  description: The driver stack and the holds, as the install reads them.
  returned: when O(stack) is given
  type: dict
  contains:
    installed_stack:
      description: The named packages and their installed dependencies of the driver's names, sorted.
      type: list
      elements: str
    replaced_stack:
      description: The stack of the branch being replaced, without the packages of the new one.
      type: list
      elements: str
    held:
      description: The held packages (C(apt-mark showhold)).
      type: list
      elements: str
    held_dependencies:
      description: The held packages of the stack that O(stack.packages) does not name; they move with the driver.
      type: list
      elements: str
    releasable:
      description: The holds the install lifts (its stack, the replaced branch's, the versioned packages).
      type: list
      elements: str
    transaction:
      description:
        - What the install asks apt for, the support packages first, then the versioned packages and the held
          dependencies at C(<version>-*), then the other named packages as they are.
      type: list
      elements: str
"""

import json
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.fleet.plugins.module_utils import driver_facts

FOREIGN = {
    "script": {"type": "str", "required": True},
    "layouts": {"type": "dict", "required": True},
    "source": {"type": "str", "required": True},
    "branch": {"type": "str", "required": True},
    "repository_url": {"type": "str", "default": ""},
    "fact": {"type": "dict", "default": {}},
    "mode": {"type": "str", "default": "refuse", "choices": list(driver_facts.MODES)},
    "host": {"type": "str", "default": ""},
}
STACK = {
    "script": {"type": "str", "required": True},
    "packages": {"type": "list", "elements": "str", "required": True},
    "versioned_packages": {"type": "list", "elements": "str", "required": True},
    "pin_patterns": {"type": "list", "elements": "str", "required": True},
    "replaced_packages": {"type": "list", "elements": "str", "default": []},
    "replaced_pin_patterns": {"type": "list", "elements": "str", "default": []},
    "support_packages": {"type": "list", "elements": "str", "default": []},
    "version": {"type": "str", "default": ""},
    "query": {"type": "bool", "default": True},
}


def run(module, argv, what):
    """stdout of argv; the module fails, naming ``what``, where it fails."""
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg="{0} failed (rc {1}): {2}".format(what, rc, err.strip()[-2000:]), rc=rc, stderr=err)
    return out


def look_for_foreign(module, options):
    output = run(module, ["/bin/sh", "-c", options["script"]], "the look for a driver gpufleet did not install")
    try:
        return driver_facts.foreign_driver(
            driver_facts.sections(output),
            options["layouts"],
            options["source"],
            options["branch"],
            options["repository_url"],
            options["fact"],
            options["mode"],
            options["host"],
        )
    except ValueError as error:
        module.fail_json(msg=str(error))


def read_stack(module, options):
    listing, held = {}, []
    if options["query"]:
        arguments = ("versioned_packages", "pin_patterns", "replaced_packages", "replaced_pin_patterns")
        argv = [sys.executable, "-I", "-c", options["script"]] + [json.dumps(options[name]) for name in arguments]
        out = run(module, argv, "the listing of the installed driver stack")
        if out.strip():
            listing = json.loads(out)
        held = run(module, ["apt-mark", "showhold"], "apt-mark showhold").splitlines()
    return driver_facts.stack_facts(
        listing,
        held,
        options["packages"],
        options["versioned_packages"],
        options["support_packages"],
        options["version"],
    )


def main():
    module = AnsibleModule(
        argument_spec={
            "foreign": {"type": "dict", "options": FOREIGN},
            "stack": {"type": "dict", "options": STACK},
        },
        required_one_of=[("foreign", "stack")],
        supports_check_mode=True,
    )
    result = {"changed": False}
    if module.params["foreign"] is not None:
        result.update(look_for_foreign(module, module.params["foreign"]))
        if result["stop"]:
            # The host stops here, before anything changes (the verdict's message names what and the moves).
            module.fail_json(msg=result["message"], **result)
        if result["notice"]:
            module.warn(result["notice"])
    if module.params["stack"] is not None:
        result["stack"] = read_stack(module, module.params["stack"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
