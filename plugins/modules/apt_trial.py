#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: apt_trial
short_description: Try an apt source on a host in one round trip, changing nothing, and judge what it gives
description:
  - The internal role apt_source's entry point C(trial) in one module run instead of one task per question.
  - For a source the role writes (O(managed)), first refuses O(claim) when another role's claim in O(claims) gives the
    same repository otherwise (one source file per repository), and reads the files the source would replace
    (O(plan_script), read with the rules of P(gpufleet.fleet.apt_source_plan#filter)).
  - Reads the host's copy of the source file and the installed version of the package. A host that has exactly this
    source and the package at a version matching O(version_regex) is converged, and its own apt answers
    (C(apt-cache madison), C(apt-cache show)), asked again for up to 60 seconds while another apt of the host holds
    its lock or replaces the package cache; a re-run downloads nothing.
  - Otherwise looks for the keyring (O(look_for_keyring)), asks whether the repository's Release file and the signing
    key answer (HTTP HEAD, as M(ansible.builtin.uri) with its default status code), and, when both do, runs the
    trial script (O(script), the role's C(apt-repository-trial.sh)) with O(environment), which tries the source in a
    scratch apt state under /tmp.
  - Returns the fact C(apt_source_trial) as the role publishes it (its fields, RV(message) included; the role
    registers the result under that name), the run's claims with O(claim) in them (RV(claims)) and what the host
    answered (RV(answers)); fails with RV(message) when it is not empty (the source is not usable or lacks the
    version; RV(answers) then left empty), and with the conflict's message when O(claim) is refused.
  - Changes nothing on the host, in check mode or not.
options:
  sources_file:
    description: The path of the source's own file on the host.
    type: path
    required: true
  sources_text:
    description: The source as the role would write it; the host's file is compared with it.
    type: str
    required: true
  managed:
    description: Whether the role writes the source (false, the host's own source is asked with its own apt).
    type: bool
    default: true
  package:
    description: The package whose installed and offered versions are read.
    type: str
    required: true
  version_regex:
    description: The versions that count as the one asked for (a Python regular expression, matched at the start);
      empty for any.
    type: str
    default: ""
  keyring:
    description: The keyring that signs the source, looked for on the host when O(look_for_keyring).
    type: path
    default: ""
  look_for_keyring:
    description: Whether the keyring must already be on the host (no key URL, no keyring package).
    type: bool
    default: false
  release_url:
    description: The repository's Release file, asked with HTTP HEAD.
    type: str
    required: true
  key_url:
    description: The signing key's URL, asked with HTTP HEAD once the repository answers; empty for none.
    type: str
    default: ""
  script:
    description: The text of the trial script, run with bash.
    type: str
    required: true
  environment:
    description: The trial script's other C(TRIAL_*) inputs; C(TRIAL_SOURCES), C(TRIAL_KEY_URL), C(TRIAL_PACKAGE),
      C(TRIAL_OWN_FILE), C(TRIAL_SHOW), C(TRIAL_KEYRING_DEB_URL) and C(TRIAL_REPLACED) are O(sources_text), O(key_url),
      O(package), O(sources_file), O(show_packages), O(source.keyring_deb_url) (without O(key_url)) and the files
      the plan replaces.
    type: dict
    default: {}
  source:
    description: What the fact and its message name.
    type: dict
    required: true
    suboptions:
      name:
        description: The source user's name (C(apt_source_name)).
        type: str
        required: true
      caller:
        description: The role that uses the source, which begins the message.
        type: str
        required: true
      description:
        description: What the repository is, in the message.
        type: str
        required: true
      url:
        description: The repository URL as given.
        type: str
        required: true
      url_name:
        description: The setting behind the URL, named in the message; empty for none.
        type: str
        default: ""
      keyring_name:
        description: The setting behind the keyring, named in the message; empty for "the keyring".
        type: str
        default: ""
      keyring_deb_url:
        description: The keyring package that signs the source, when it has no O(key_url); empty for none.
        type: str
        default: ""
      version:
        description: The version asked for (the fact's C(version)); empty for none.
        type: str
        default: ""
      version_name:
        description: The setting behind the version, named in the message; empty for O(package).
        type: str
        default: ""
      host:
        description: The host's inventory name, in the message.
        type: str
        required: true
  claim:
    description: The source user's claim on the repository (C(name), C(caller), C(description), C(url), C(suites),
      C(components), C(architectures), C(keyring), C(key_url), C(settings)), for a source the role writes.
    type: dict
    default: {}
  claims:
    description: The claims of the run's other source users (C(apt_source_trial.claims) of the host's last trial).
    type: list
    elements: dict
    default: []
  plan_script:
    description: The text of the script that lists gpufleet's source files and the record of each user's last one
      (the role's C(apt-source-files.sh)), run with sh for a source the role writes; empty for none.
    type: str
    default: ""
  records_dir:
    description: The directory of those records, the script's argument.
    type: path
    default: /var/lib/gpufleet/apt-sources
  show_packages:
    description: Packages whose stanzas the host's own apt prints when the host is converged.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds each HTTP request may take.
    type: int
    default: 15
notes:
  - Supports check mode.
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Try the source (read-only)
  gpufleet.fleet.apt_trial:
    sources_file: /etc/apt/sources.list.d/gpufleet-cuda.sources
    sources_text: "{{ lookup('gpufleet.fleet.role_template', 'source.sources.j2') }}"
    package: cuda-toolkit-12-1
    version_regex: '^12\.1\.1-1$'
    release_url: https://mirror.example/cuda/Release
    script: "{{ lookup('ansible.builtin.file', 'apt-repository-trial.sh') }}"
    source:
      name: cuda
      caller: cuda
      description: NVIDIA's CUDA repository
      url: https://mirror.example/cuda
      version: 12.1.1
      host: "{{ inventory_hostname }}"
  register: apt_source_trial
"""

RETURN = r"""
name:
  description: The source's name (O(source.name)).
  returned: always
  type: str
url:
  description: The source's URL (O(source.url)).
  returned: always
  type: str
ok:
  description: Whether the source is usable.
  returned: always
  type: bool
reason:
  description: Why it is not (apt's C(E:) and C(W:) lines, else C(exit N), or what the repository or the key
    answered); empty when usable.
  returned: always
  type: str
offered:
  description: The versions of O(package) this source offers, newest first.
  returned: always
  type: list
  elements: str
version:
  description: The version asked for (O(source.version)).
  returned: always
  type: str
build:
  description: The offered version string that is the version asked for, else the installed one, else empty.
  returned: always
  type: str
found:
  description: Whether the version is offered (or installed on a converged host), or none was asked for.
  returned: always
  type: bool
installed:
  description: The installed version of O(package), empty when it is not installed.
  returned: always
  type: str
tried:
  description: Whether the scratch trial ran.
  returned: always
  type: bool
converged:
  description: Whether the host has exactly this source and the package at the version asked for.
  returned: always
  type: bool
stanzas:
  description: The C(apt-cache show) records of O(show_packages) at the version asked for (every version when none
    was), as this source offers them.
  returned: always
  type: list
  elements: dict
simulation:
  description: The simulated install's output, ending with C([simulation exit N]); empty when none ran.
  returned: always
  type: str
message:
  description: The message that stops the host (naming the calling role, the host and the URL); empty when the
    source is usable and offers the version. The module fails with it.
  returned: always
  type: str
claims:
  description: O(claims) with O(claim) in place of its user's earlier claim; O(claims) unchanged without O(claim).
  returned: always
  type: list
  elements: dict
answers:
  description: What the host answered, which the fields above judge.
  returned: always
  type: dict
  contains:
    keyring_exists:
      description: Whether the keyring is on the host (true when not looked for).
      type: bool
    repository:
      description: The repository's answer (status, msg and url as M(ansible.builtin.uri) gives them); empty when not
        asked.
      type: dict
    key:
      description: The signing key's answer (status and msg); empty when not asked.
      type: dict
    trial:
      description: The trial script's rc, stdout, stdout_lines and stderr; empty when it did not run.
      type: dict
    madison:
      description: The host's own C(apt-cache madison) of O(package) (stdout); empty unless converged or not managed.
      type: dict
    shown:
      description: The host's own C(apt-cache show) of O(show_packages) (stdout); empty unless asked.
      type: dict
    replaced:
      description: The files the source replaces (the plan's C(remove)), left out of the trial's look beside the
        host's sources; empty for a source the role does not write.
      type: list
      elements: str
"""

import hashlib
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.fleet.plugins.module_utils.apt_source import (
    apt_source_conflict,
    apt_source_plan,
    claimed,
    trial_fact,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.command_answer import command_answer, run_apt
from ansible_collections.gpufleet.fleet.plugins.module_utils.http_answer import http_answer


def sha1_of(path):
    """The file's SHA-1 as sha1sum prints it, or 'none' when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha1(handle.read()).hexdigest()
    except (IOError, OSError):
        return "none"


def replaced_files(module):
    """The files entry point main would remove before it writes this source (its plan), read from the host."""
    params = module.params
    if not params["plan_script"]:
        return []
    rc, out, err = module.run_command(["/bin/sh", "-c", params["plan_script"], "sh", params["records_dir"]])
    if rc != 0:
        module.fail_json(msg="apt_trial: the source files could not be read (exit %d): %s" % (rc, err.strip()))
    return apt_source_plan(out, params["source"]["name"], params["source"]["url"])["remove"]


def run_trial(module, replaced):
    params = module.params
    handle, path = tempfile.mkstemp(prefix="gpufleet-apt-trial.", suffix=".sh")
    try:
        with os.fdopen(handle, "w") as script:
            script.write(params["script"])
        environment = dict((str(k), "" if v is None else str(v)) for k, v in params["environment"].items())
        # The script's inputs this module has as options already.
        environment.update(
            TRIAL_SOURCES=params["sources_text"],
            TRIAL_KEY_URL=params["key_url"],
            TRIAL_PACKAGE=params["package"],
            TRIAL_OWN_FILE=params["sources_file"],
            TRIAL_SHOW=" ".join(params["show_packages"]),
            TRIAL_KEYRING_DEB_URL="" if params["key_url"] else params["source"]["keyring_deb_url"],
            TRIAL_REPLACED=" ".join(replaced),
        )
        rc, out, err = module.run_command(["/bin/bash", path], environ_update=environment)
    finally:
        os.unlink(path)
    return command_answer(rc, out, err)


def main():
    module = AnsibleModule(
        argument_spec={
            "sources_file": {"type": "path", "required": True},
            "sources_text": {"type": "str", "required": True},
            "managed": {"type": "bool", "default": True},
            "package": {"type": "str", "required": True},
            "version_regex": {"type": "str", "default": ""},
            "keyring": {"type": "path", "default": ""},
            "look_for_keyring": {"type": "bool", "default": False},
            "release_url": {"type": "str", "required": True},
            "key_url": {"type": "str", "default": "", "no_log": False},  # a public key's URL, not a secret
            "script": {"type": "str", "required": True},
            "environment": {"type": "dict", "default": {}},
            "show_packages": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "int", "default": 15},
            "source": {
                "type": "dict",
                "required": True,
                "options": {
                    "name": {"type": "str", "required": True},
                    "caller": {"type": "str", "required": True},
                    "description": {"type": "str", "required": True},
                    "url": {"type": "str", "required": True},
                    "url_name": {"type": "str", "default": ""},
                    "keyring_name": {"type": "str", "default": ""},
                    "keyring_deb_url": {"type": "str", "default": "", "no_log": False},  # a public package URL
                    "version": {"type": "str", "default": ""},
                    "version_name": {"type": "str", "default": ""},
                    "host": {"type": "str", "required": True},
                },
            },
            "claim": {"type": "dict", "default": {}},
            "claims": {"type": "list", "elements": "dict", "default": []},
            "plan_script": {"type": "str", "default": ""},
            "records_dir": {"type": "path", "default": "/var/lib/gpufleet/apt-sources"},
        },
        supports_check_mode=True,
    )
    params = module.params
    claims = params["claims"]
    if params["managed"] and params["claim"]:
        # Another role giving this repository otherwise stops the host before anything is asked.
        conflict = apt_source_conflict(params["claim"], claims, params["source"]["host"])
        if conflict:
            module.fail_json(msg=conflict)
        claims = claimed(params["claim"], claims)
    replaced = replaced_files(module) if params["managed"] else []
    rc, out, err = module.run_command(["dpkg-query", "-W", "-f=${Version}\n", params["package"]])
    installed = out.strip() if rc == 0 else ""
    own = hashlib.sha1(params["sources_text"].encode("utf-8")).hexdigest()
    converged = (
        params["managed"]
        and sha1_of(params["sources_file"]) == own
        and (not params["version_regex"] or re.match(params["version_regex"], installed) is not None)
    )
    answers = {
        "installed": installed,
        "converged": bool(converged),
        "keyring_exists": True,
        "repository": {},
        "key": {},
        "trial": {},
        "madison": {},
        "shown": {},
        "replaced": replaced,
    }
    if params["managed"] and not converged:
        if params["look_for_keyring"]:
            answers["keyring_exists"] = os.path.exists(params["keyring"])
        if answers["keyring_exists"]:
            answers["repository"] = http_answer(module, params["release_url"], "HEAD", params["timeout"])
        if params["key_url"] and answers["repository"].get("status") == 200:
            answers["key"] = http_answer(module, params["key_url"], "HEAD", params["timeout"])
        if answers["repository"].get("status") == 200 and answers["key"].get("status", 200) == 200:
            answers["trial"] = run_trial(module, replaced)
    else:
        # The host's own package cache, which another apt of the host may be rebuilding (command_answer.run_apt).
        rc, out, err = run_apt(module, ["apt-cache", "madison", params["package"]])
        answers["madison"] = {"rc": rc, "stdout": out}
        if params["show_packages"]:
            rc, out, err = run_apt(module, ["apt-cache", "show"] + params["show_packages"])
            answers["shown"] = {"rc": rc, "stdout": out}
    source = dict(params["source"])
    source.update(
        keyring=params["keyring"],
        key_url=params["key_url"],
        package=params["package"],
        version_regex=params["version_regex"],
        show_packages=params["show_packages"],
        managed=params["managed"],
    )
    # The result is the fact the role publishes (registered as apt_source_trial), the run's claims and the answers.
    result = dict(trial_fact(answers, source), changed=False, claims=claims, answers=answers)
    if result["message"]:
        # The fact without the host's answers, which would bury the message (the trial's output among them).
        result["answers"] = {}
        module.fail_json(msg=result["message"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
