#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: host_facts
short_description: Read what a GPU host is in one round trip, and judge it against preflight's requirements
description:
  - Reads the NVIDIA GPUs and NVSwitches on the PCI bus (with their PCI device IDs), the free space under a path,
    the UEFI Secure Boot state, whether nouveau is loaded, whether the headers of a kernel are installed or
    installable, whether a MOK certificate exists and the file system of C(/sys/fs/cgroup) (the cgroup mode); one
    module run, one round trip.
  - With O(slurm), also compares the cgroup mode with the Slurm release the node has or would get (its package's
    C(apt-cache policy)), as the slurm role does before any change; a node on cgroup v2 whose release has no
    cgroup/v2 plugin fails the module with what to do (O(slurm.without_plugin=refuse)), or gets a warning that the
    cluster runs without cgroups (O(slurm.without_plugin=no_confinement)).
  - This is where the roles tell an NVIDIA GPU apart on the PCI bus (vendor 0x10de, class 0x0300 or 0x0302; an
    NVSwitch is class 0x0680).
  - With O(requirements), also judges the host as the preflight role does and returns every unmet requirement with
    what to do, the warnings and the report later roles read (its fields at the top level of the result, so that the
    registered result is the report, which preflight registers as C(preflight_report)); with an unmet requirement the
    module fails with RV(message), which names them all, returning only it and RV(failures) (the host stops before
    anything changes).
  - Changes nothing on the host. Refreshing apt's package index (when the headers are not installed) updates a cache,
    as C(apt-get update) does, and is done in check mode too.
options:
  disk_path:
    description: The path whose file system's free space to read.
    type: path
    default: /usr
  kernel_release:
    description: The kernel whose headers to look for (C(linux-headers-<release>)); empty to not look.
    type: str
    default: ""
  refresh_index:
    description:
      - Refresh apt's package index before asking for installable headers, when they are not installed.
      - Retried three times, 5 seconds apart, while a source does not answer, and for up to 60 seconds while
        another apt holds its lock (as M(ansible.builtin.apt)'s C(lock_timeout)) or replaces the package cache at
        the same moment.
    type: bool
    default: true
  mok_certificate:
    description: A Machine Owner Key certificate to look for; empty to not look.
    type: str
    default: ""
  host:
    description: The host's name in the messages (the inventory name).
    type: str
    default: ""
  facts:
    description:
      - The host's Ansible facts the requirements read (distribution, distribution_version,
        distribution_major_version, architecture, memtotal_mb, virtualization_role, virtualization_type).
      - With O(requirements), memtotal_mb and the virtualization pair are read on the host when they are missing or
        empty (a play that gathered only some facts), from C(/proc/meminfo) and by Ansible's own virtualization
        collector.
      - O(slurm) names the distribution and its distribution_version when the release counted is the one it ships.
    type: dict
    default: {}
  slurm:
    description:
      - The slurm role's settings for the comparison of the cgroup mode with the Slurm release; omitted, no
        comparison. The release is the installed O(slurm.package)'s, else apt's candidate (a backport counts as what
        it is), else O(slurm.shipped_release).
    type: dict
    suboptions:
      package:
        description: The package whose version is the node's Slurm release (C(slurmd)).
        type: str
        required: true
      shipped_release:
        description: The Slurm release the distribution ships (C(21.08)), counted when apt knows no version.
        type: str
        required: true
      cgroup_v2_release:
        description: The first Slurm release with the cgroup/v2 plugin (C(22.05)).
        type: str
        required: true
      without_plugin:
        description: The role's C(slurm_cgroup_v2_without_plugin); C(no_confinement) makes a node without the plugin
          unconfined.
        type: str
        required: true
        choices: [refuse, no_confinement]
  requirements:
    description:
      - The preflight role's settings, without the C(preflight_) prefix (see C(ansible-doc -t role
        gpufleet.fleet.preflight)); omitted, the host is read but not judged. The free space is judged under
        O(disk_path), and the MOK certificate named is O(mok_certificate).
    type: dict
    suboptions:
      supported_os:
        description: The supported distribution/version pairs (Ubuntu's full version, the others' major version).
        type: list
        elements: dict
        required: true
      supported_architectures:
        description: The CPU architectures the NVIDIA packages and cu121 wheels exist for.
        type: list
        elements: str
        required: true
      require_gpus:
        description: Whether a host without an NVIDIA GPU on the PCI bus fails.
        type: bool
        required: true
      min_free_disk_gb:
        description: The free space (GB) needed under O(disk_path).
        type: raw
        required: true
      warn_ram_below_gb:
        description: Below this much RAM (GB), a warning.
        type: raw
        required: true
      kernel_release:
        description: The kernel the driver module is built for, named in the headers message.
        type: str
        required: true
      require_kernel_headers:
        description: Whether missing headers of O(requirements.kernel_release) fail.
        type: bool
        required: true
      secure_boot_policy:
        description: What Secure Boot on allows.
        type: str
        required: true
        choices: [signed_modules, mok, fail]
      nouveau_policy:
        description: Whether a loaded nouveau warns or fails.
        type: str
        required: true
        choices: [warn, fail]
notes:
  - Supports check mode.
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Find the NVIDIA GPUs on the PCI bus
  gpufleet.fleet.host_facts:
  register: __slurm_host

- name: Count them
  ansible.builtin.debug:
    msg: "{{ __slurm_host.found.nvidia.gpus | length }} GPU(s)"

- name: Compare the node's cgroup mode with its Slurm release
  gpufleet.fleet.host_facts:
    facts:
      distribution: "{{ ansible_facts['distribution'] }}"
      distribution_version: "{{ ansible_facts['distribution_version'] }}"
    slurm:
      package: slurmd
      shipped_release: "21.08"
      cgroup_v2_release: "22.05"
      without_plugin: refuse
    host: "{{ inventory_hostname }}"
  register: __slurm_host
"""

RETURN = r"""
found:
  description: What the host is.
  returned: always
  type: dict
  contains:
    nvidia:
      description: The NVIDIA GPUs and NVSwitches on the PCI bus, each C({address, device_id}).
      type: dict
      sample: {gpus: [{address: "0000:18:00.0", device_id: "0x2330"}], nvswitches: []}
    free_bytes:
      description: The free bytes under O(disk_path) (C(df -P -B1)'s Available).
      type: int
    secure_boot:
      description: C(bios) (no EFI), C(enabled) or C(disabled).
      type: str
    nouveau_loaded:
      description: Whether the nouveau module is loaded.
      type: bool
    headers_installed:
      description: Whether the headers of O(kernel_release) are installed (false when not asked).
      type: bool
    headers_candidate:
      description: Whether apt offers the headers of O(kernel_release) to install (false when not asked).
      type: bool
    mok_enrolled:
      description: Whether O(mok_certificate) exists (false when not asked).
      type: bool
    cgroup_filesystem:
      description:
        - The file system of C(/sys/fs/cgroup) as C(stat --file-system --format=%T) names it, from the mount table
          (C(/proc/self/mountinfo)); empty when that cannot be read.
        - C(cgroup2fs) on a node booted with cgroup v2, C(tmpfs) with the v1 or hybrid layout.
      type: str
      sample: cgroup2fs
slurm_cgroup:
  description: With O(slurm), the cgroup mode against the Slurm release.
  returned: with slurm
  type: dict
  contains:
    filesystem:
      description: RV(found.cgroup_filesystem).
      type: str
    v2:
      description: Whether the node boots with cgroup v2.
      type: bool
    release:
      description: The Slurm release counted (C(major.minor)).
      type: str
    version_from:
      description: Where the release comes from, for the messages.
      type: str
      sample: apt candidate slurmd 21.08.5-2ubuntu1
    plugin_missing:
      description: Whether the node boots with cgroup v2 and the release predates O(slurm.cgroup_v2_release).
      type: bool
    unconfined:
      description: Whether the plugin is missing and O(slurm.without_plugin) is C(no_confinement).
      type: bool
    message:
      description: What stops the node (the plugin missing, O(slurm.without_plugin=refuse)), with what to do; empty
        otherwise. The module fails with it.
      type: str
    warning:
      description: That the cluster runs without cgroups (the plugin missing, O(slurm.without_plugin=no_confinement));
        empty otherwise. The module warns with it.
      type: str
failures:
  description: With O(requirements), every requirement the host does not meet, with what to do.
  returned: with requirements
  type: list
  elements: str
message:
  description: With O(requirements), the one message that stops the host (empty when it passes); the module fails
    with it.
  returned: with requirements
  type: str
warnings_found:
  description: With O(requirements), what the host should know but that does not stop it (RAM, nouveau).
  returned: with requirements
  type: list
  elements: str
passed:
  description: With O(requirements), whether the host meets them; this and the fields below are the report the later
    roles read (preflight registers the result as C(preflight_report)).
  returned: with requirements
  type: bool
os:
  description: With O(requirements), the distribution and version, as RV(summary) names them.
  returned: with requirements
  type: str
  sample: Ubuntu 22.04
gpu_pci_addresses:
  description: With O(requirements), the PCI addresses of the NVIDIA GPUs.
  returned: with requirements
  type: list
  elements: str
gpu_device_ids:
  description: With O(requirements), their PCI device IDs, in the same order.
  returned: with requirements
  type: list
  elements: str
  sample: ["0x2330"]
gpu_count:
  description: With O(requirements), the number of NVIDIA GPUs.
  returned: with requirements
  type: int
nvswitch_count:
  description: With O(requirements), the number of NVSwitches.
  returned: with requirements
  type: int
secure_boot:
  description: With O(requirements), RV(found.secure_boot).
  returned: with requirements
  type: str
driver_module_source:
  description: With O(requirements), C(signed) (Secure Boot on, signed modules required) or C(dkms).
  returned: with requirements
  type: str
nouveau_loaded:
  description: With O(requirements), RV(found.nouveau_loaded).
  returned: with requirements
  type: bool
in_container:
  description: With O(requirements), whether the host is a container guest (the virtualization facts).
  returned: with requirements
  type: bool
kernel_release:
  description: With O(requirements), the kernel the driver module is built for.
  returned: with requirements
  type: str
free_disk_gb:
  description: With O(requirements), the free space under O(disk_path), in GB.
  returned: with requirements
  type: float
summary:
  description: With O(requirements), one line describing the host.
  returned: with requirements
  type: str
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.facts.virtual.linux import LinuxVirtual

from ansible_collections.gpufleet.fleet.plugins.module_utils import fetch, host_facts
from ansible_collections.gpufleet.fleet.plugins.module_utils.command_answer import run_apt

REQUIREMENTS = {
    "supported_os": {"type": "list", "elements": "dict", "required": True},
    "supported_architectures": {"type": "list", "elements": "str", "required": True},
    "require_gpus": {"type": "bool", "required": True},
    "min_free_disk_gb": {"type": "raw", "required": True},
    "warn_ram_below_gb": {"type": "raw", "required": True},
    "kernel_release": {"type": "str", "required": True},
    "require_kernel_headers": {"type": "bool", "required": True},
    "secure_boot_policy": {"type": "str", "required": True, "choices": ["signed_modules", "mok", "fail"]},
    "nouveau_policy": {"type": "str", "required": True, "choices": ["warn", "fail"]},
}
SLURM = {
    "package": {"type": "str", "required": True},
    "shipped_release": {"type": "str", "required": True},
    "cgroup_v2_release": {"type": "str", "required": True},
    "without_plugin": {"type": "str", "required": True, "choices": ["refuse", "no_confinement"]},
}


def refresh_index(module):
    """apt-get update, as the apt module's update_cache does: again while another apt is at work on the host (up to
    a minute, as its lock_timeout: command_answer.run_apt), and while a source does not answer (3 tries, 5 s apart);
    a failure otherwise fails the module with apt's words."""
    tries = 0
    while True:
        rc, out, err = run_apt(module, ["apt-get", "update", "-q"], environ_update={"LC_ALL": "C"})
        if rc == 0:
            return
        text = out + err
        tries += 1
        if tries < 3 and fetch.fetch_failure(text):
            time.sleep(5)
            continue
        module.fail_json(
            msg="apt-get update failed (the package index tells whether the kernel headers are installable): "
            + " ".join(line for line in text.splitlines() if line.startswith(("E:", "W:", "Err")))[:2000],
            rc=rc,
            stdout=out,
            stderr=err,
        )


def free_bytes(module, path):
    try:
        return host_facts.free_bytes(path)
    except OSError as error:
        module.fail_json(msg="cannot read the free space under {0} on the host: {1}".format(path, error.strerror))


def read_host(module):
    params = module.params
    found = {
        "nvidia": host_facts.nvidia_devices(host_facts.read_pci()),
        "free_bytes": free_bytes(module, params["disk_path"]),
        "secure_boot": host_facts.secure_boot_state(),
        "nouveau_loaded": os.path.exists("/sys/module/nouveau"),
        "headers_installed": False,
        "headers_candidate": False,
        "mok_enrolled": bool(params["mok_certificate"]) and os.path.exists(params["mok_certificate"]),
        "cgroup_filesystem": host_facts.cgroup_filesystem(),
    }
    package = "linux-headers-" + params["kernel_release"]
    if params["kernel_release"] and module.get_bin_path("dpkg-query"):
        rc, out, err = module.run_command(["dpkg-query", "-W", "-f=${Status}", package])
        found["headers_installed"] = host_facts.headers_installed(out)
        if not found["headers_installed"] and module.get_bin_path("apt-cache"):
            if params["refresh_index"]:
                refresh_index(module)
            rc, out, err = run_apt(module, ["apt-cache", "policy", package], environ_update={"LC_ALL": "C"})
            found["headers_candidate"] = host_facts.headers_candidate(out)
    return found


def completed_facts(module, facts):
    """The facts given, with memtotal_mb and the virtualization pair read on the host where the play did not gather
    them (missing or empty): as Ansible's setup reads them, MemTotal of /proc/meminfo and its own collector."""
    facts = dict(facts)
    if facts.get("memtotal_mb") in (None, ""):
        facts["memtotal_mb"] = host_facts.memtotal_mb()
    if facts.get("virtualization_type") in (None, "") and facts.get("virtualization_role") in (None, ""):
        virtual = LinuxVirtual(module).get_virtual_facts()
        facts.update({name: virtual.get(name, "") for name in ("virtualization_type", "virtualization_role")})
    return facts


def compare_slurm(module, found):
    """The cgroup mode against the Slurm release: apt's versions of the package, else the distribution's release."""
    slurm = module.params["slurm"]
    policy = ""
    if module.get_bin_path("apt-cache"):
        rc, policy, err = run_apt(module, ["apt-cache", "policy", slurm["package"]], environ_update={"LC_ALL": "C"})
        if rc != 0:
            module.fail_json(msg="apt-cache policy {0} failed: {1}".format(slurm["package"], err.strip()), rc=rc)
    return host_facts.slurm_cgroup(
        found["cgroup_filesystem"], policy, slurm, module.params["facts"], module.params["host"]
    )


def main():
    module = AnsibleModule(
        argument_spec={
            "disk_path": {"type": "path", "default": "/usr"},
            "kernel_release": {"type": "str", "default": ""},
            "refresh_index": {"type": "bool", "default": True},
            "mok_certificate": {"type": "str", "default": ""},
            "host": {"type": "str", "default": ""},
            "facts": {"type": "dict", "default": {}},
            "requirements": {"type": "dict", "options": REQUIREMENTS},
            "slurm": {"type": "dict", "options": SLURM},
        },
        supports_check_mode=True,
    )
    found = read_host(module)
    result = {"changed": False, "found": found}
    requirements = module.params["requirements"]
    if requirements is not None:
        # The path read and the certificate looked for are the ones the messages name.
        requirements = dict(
            requirements, disk_path=module.params["disk_path"], mok_certificate=module.params["mok_certificate"]
        )
        facts = completed_facts(module, module.params["facts"])
        verdict = host_facts.judge(module.params["host"], found, facts, requirements)
        result.update(
            verdict["report"],
            failures=verdict["failures"],
            message=verdict["message"],
            warnings_found=verdict["warnings"],
            summary=verdict["summary"],
        )
    if module.params["slurm"] is not None:
        result["slurm_cgroup"] = compare_slurm(module, found)
        if result["slurm_cgroup"]["warning"]:
            module.warn(result["slurm_cgroup"]["warning"])
    # The host stops here, with every reason, before anything changes.
    stops = [text for text in (result.get("message"), result.get("slurm_cgroup", {}).get("message")) if text]
    if stops:
        # The message and its reasons: what was read would bury them.
        module.fail_json(msg=" ".join(stops), failures=result.get("failures", []))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
