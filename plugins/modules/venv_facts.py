#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: venv_facts
short_description: Read, in one round trip, what a Python virtual environment holds and what installing into it needs
description:
  - The host's side of the pytorch role's checks before any change, in one module run instead of one task per
    question.
  - Looks for the environment's interpreter and, when it is there, runs O(installed_script) in it (the role's
    C(pytorch_installed.py)) with O(requirements), which prints, last, a JSON object (C(pip), C(installed),
    C(unsatisfied)).
  - Only when something must be installed (no environment, an environment without a working pip, or a requirement
    not met), reads the interpreter the environment would be created with (its version and machine), the free space
    of the file system the environment goes on (C(df -Pk) of its nearest existing directory) and the wheel source's
    listings (O(pages), HTTP GET, answered as M(ansible.builtin.uri) reports them).
  - Changes nothing on the host, in check mode or not.
options:
  venv:
    description: The virtual environment's directory.
    type: path
    required: true
  installed_script:
    description: The Python program run in the environment to read the installed versions.
    type: str
    required: true
  requirements:
    description: The requirements (pip's C(name==version) lines), handed to O(installed_script) as JSON.
    type: list
    elements: str
    required: true
  python:
    description: The interpreter the environment is created with.
    type: str
    required: true
  pages:
    description: The wheel source's listings to read when something must be installed.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds each listing may take.
    type: int
    default: 30
  refuse:
    description:
      - The pytorch role's checks before any change; omitted, none. Where something must be installed, the module
        fails with one message (RV(message)) when the environment's file system has less than
        O(refuse.min_free_disk_gb) free, and when a listing of the wheel source does not answer or, all of them
        answering, lacks a pinned wheel for the interpreter's CPython and machine.
    type: dict
    suboptions:
      host:
        description: The host's name in the message.
        type: str
        required: true
      min_free_disk_gb:
        description: The free space (GiB) the environment's file system needs.
        type: int
        required: true
      source:
        description: The wheel source's URL, as the message names it.
        type: str
        required: true
      source_setting:
        description: The setting behind the source, as the message names it.
        type: str
        required: true
      pins:
        description: The pinned wheels (C(name==version)) the source must offer.
        type: list
        elements: str
        required: true
      packages:
        description: The names of the pinned packages.
        type: list
        elements: str
        required: true
      architecture:
        description: The host's machine, when the interpreter does not say it.
        type: str
        default: x86_64
      python_name:
        description: The interpreter's setting, named when it does not run.
        type: str
        required: true
notes:
  - Supports check mode.
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Read the environment, the interpreter, the free space and the wheel source
  gpufleet.fleet.venv_facts:
    venv: /opt/gpufleet/venv
    installed_script: "{{ lookup('ansible.builtin.file', 'pytorch_installed.py') }}"
    requirements: [torch==2.3.1]
    python: /usr/bin/python3
    pages: [https://download.pytorch.org/whl/cu121/torch/]
  register: __pytorch_host
"""

RETURN = r"""
venv_exists:
  description: Whether the environment's interpreter exists.
  returned: always
  type: bool
installed:
  description: The run of O(installed_script) (rc, stdout, stdout_lines); C(skipped) when there is no environment.
  returned: always
  type: dict
venv_state:
  description:
    - C(missing) (no environment), C(broken) (its interpreter does not run, the system Python it was made from being
      gone, or it has no pip) or C(ok).
  returned: always
  type: str
  sample: ok
unsatisfied:
  description: The requirements the environment does not satisfy (all of them when it is not usable).
  returned: always
  type: list
  elements: str
installed_versions:
  description: Each requirement's installed version (null when not installed), as O(installed_script) read them.
  returned: always
  type: dict
needed:
  description: Whether something must be installed (the reads below were made).
  returned: always
  type: bool
python:
  description: The run of O(python) printing its version and machine (rc, stdout_lines); C(skipped) when not needed.
  returned: always
  type: dict
df:
  description: C(df -Pk) of the environment's nearest existing directory (stdout_lines); C(skipped) when nothing
    must be installed.
  returned: always
  type: dict
source:
  description: The listings' answers (C(results), each item, status, msg, url and content); C(skipped) when nothing
    must be installed.
  returned: always
  type: dict
message:
  description: With O(refuse), why the host stops (the module fails with it, returning only it); empty when it does
    not.
  returned: with refuse
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.fleet.plugins.module_utils import venv_facts
from ansible_collections.gpufleet.fleet.plugins.module_utils.command_answer import command_answer
from ansible_collections.gpufleet.fleet.plugins.module_utils.http_answer import http_answer

SKIPPED = {"skipped": True, "changed": False}
PYTHON_PROBE = "import platform, sys; print('%d.%d' % sys.version_info[:2]); print(platform.machine())"


def main():
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "installed_script": {"type": "str", "required": True},
            "requirements": {"type": "list", "elements": "str", "required": True},
            "python": {"type": "str", "required": True},
            "pages": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "int", "default": 30},
            "refuse": {
                "type": "dict",
                "options": {
                    "host": {"type": "str", "required": True},
                    "min_free_disk_gb": {"type": "int", "required": True},
                    "source": {"type": "str", "required": True},
                    "source_setting": {"type": "str", "required": True},
                    "pins": {"type": "list", "elements": "str", "required": True},
                    "packages": {"type": "list", "elements": "str", "required": True},
                    "architecture": {"type": "str", "default": "x86_64"},
                    "python_name": {"type": "str", "required": True},
                },
            },
        },
        supports_check_mode=True,
    )
    params = module.params
    interpreter = os.path.join(params["venv"], "bin", "python")
    result = {"changed": False, "venv_exists": os.path.exists(interpreter), "installed": dict(SKIPPED)}
    if result["venv_exists"]:
        argv = [interpreter, "-I", "-c", params["installed_script"], json.dumps(params["requirements"])]
        result["installed"] = command_answer(*module.run_command(argv))
    answer = venv_facts.installed_answer(result["installed"])
    result.update(venv_facts.decide(result["venv_exists"], answer, params["requirements"]))
    result["python"] = dict(SKIPPED)
    result["df"] = dict(SKIPPED)
    result["source"] = dict(SKIPPED)
    if result["needed"]:
        result["python"] = command_answer(*module.run_command([params["python"], "-I", "-c", PYTHON_PROBE]))
    if result["unsatisfied"]:
        directory = params["venv"]
        while not os.path.isdir(directory) and directory not in ("", os.sep):
            directory = os.path.dirname(directory)
        rc, out, err = module.run_command(["df", "-Pk", directory or os.sep])
        if rc != 0:
            module.fail_json(msg="df -Pk {0} failed: {1}".format(directory, err.strip()), rc=rc)
        result["df"] = command_answer(rc, out, err)
        result["source"] = {
            "results": [http_answer(module, page, "GET", params["timeout"], content=True) for page in params["pages"]]
        }
    if params["refuse"] is not None:
        # The host stops here, with every reason, before anything changes.
        result["message"] = venv_facts.refusal(result, params["venv"], params["refuse"])
        if result["message"]:
            # Only the message: the answers it judged (listings included) would bury it.
            module.fail_json(msg=result["message"], message=result["message"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
