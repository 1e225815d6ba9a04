# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a host is, read in one round trip, and preflight's judgement of it.

The module gpufleet.fleet.host_facts runs this on the host (it is shipped
with the module, so it keeps to Python 3.8 and the standard library):

* ``nvidia_devices`` is the one place, for the roles, where an NVIDIA GPU or
  NVSwitch is told apart on the PCI bus (preflight, slurm's gres.conf and
  monitoring's DCGM all ask the module);
* ``read_host`` reads the PCI bus, the free space, Secure Boot, nouveau, the
  kernel headers, the MOK certificate and the cgroup file system;
* ``slurm_cgroup`` is slurm's comparison of a node's cgroup mode with the
  Slurm release it has or would get (``apt_policy`` reads apt's answer);
* ``judge`` is preflight's requirements on what was read: every unmet one with
  what to do, the warnings, and the ``preflight_report`` later roles read.

The two readers that run on a node without Ansible keep their own loop over
the same sysfs files: the driver's local fact script (a shell script run at
every fact gathering) and gpufleet_check (the standalone check; a unit test
runs it and this module on the same sysfs tree).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

NVIDIA_PCI_VENDOR = "0x10de"
# PCI class codes (the class file's top 16 bits): VGA controller, 3D controller.
GPU_PCI_CLASSES = ("0x0300", "0x0302")
# NVSwitch enumerates as a bridge ("other bridge device").
NVSWITCH_PCI_CLASS = "0x0680"
SYSFS_PCI_DEVICES = "/sys/bus/pci/devices"
SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# ansible_facts' virtualization_type on a guest that is a container.
CONTAINER_TYPES = ("podman", "docker", "container", "containerd", "lxc", "systemd-nspawn", "openvz")
GIB = 1073741824

HEADERS_CANDIDATE = re.compile(r"Candidate: (?!\(none\))")
# One line of `apt-cache policy`'s stanza, and a version's upstream major.minor (epoch and revision dropped).
APT_POLICY_LINE = re.compile(r"^\s*(Installed|Candidate):\s*(\S+)\s*$", re.MULTILINE)
UPSTREAM_RELEASE = re.compile(r"^(?:[0-9]+:)?([0-9]+\.[0-9]+)")
CGROUP_ROOT = "/sys/fs/cgroup"
# A mount's type (/proc/self/mountinfo) as `stat --file-system --format=%T` names the file system (coreutils'
# human_fstype, by the superblock's magic): cgroup v2 is cgroup2fs, a v1 hierarchy cgroupfs; tmpfs (the v1 and hybrid
# layouts' /sys/fs/cgroup) and the others keep their names.
STAT_FS_NAMES = {"cgroup2": "cgroup2fs", "cgroup": "cgroupfs"}


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def read_pci(sysfs_dir=SYSFS_PCI_DEVICES):
    """Every PCI function as (vendor, class, device, address): ``('0x10de', '0x0302', '0x2330', '0000:18:00.0')``.

    The class is the top 16 bits of sysfs' 24-bit class (``0x030200`` -> ``0x0302``).
    """
    try:
        addresses = sorted(os.listdir(sysfs_dir))
    except OSError:
        return []
    devices = []
    for address in addresses:
        vendor = _read(os.path.join(sysfs_dir, address, "vendor"))
        if vendor is None:
            continue
        pci_class = (_read(os.path.join(sysfs_dir, address, "class")) or "")[:6]
        device = _read(os.path.join(sysfs_dir, address, "device")) or ""
        devices.append((vendor, pci_class, device, address))
    return devices


def nvidia_devices(pci):
    """The NVIDIA GPUs and NVSwitches among ``read_pci``'s devices, each ``{'address': ..., 'device_id': '0x2330'}``."""
    gpus, nvswitches = [], []
    for vendor, pci_class, device, address in pci:
        if vendor != NVIDIA_PCI_VENDOR:
            continue
        if pci_class in GPU_PCI_CLASSES:
            gpus.append({"address": address, "device_id": device})
        elif pci_class == NVSWITCH_PCI_CLASS:
            nvswitches.append({"address": address, "device_id": device})
    return {"gpus": gpus, "nvswitches": nvswitches}


def secure_boot_state(efi_dir="/sys/firmware/efi", efivar=SECURE_BOOT_EFIVAR):
    """``bios`` (no EFI), ``enabled`` or ``disabled``: the variable's 4 attribute bytes, then its value (1: on)."""
    if not os.path.isdir(efi_dir):
        return "bios"
    try:
        with open(efivar, "rb") as handle:
            data = handle.read(5)
    except (IOError, OSError):
        return "disabled"
    return "enabled" if len(data) == 5 and data[4] == 1 else "disabled"


def memtotal_mb(meminfo="/proc/meminfo"):
    """The RAM in MiB as Ansible's setup reads it (ansible_memtotal_mb): MemTotal of /proc/meminfo, kB // 1024; 0
    when it cannot be read."""
    for line in (_read(meminfo) or "").splitlines():
        fields = line.replace(":", " ").split()
        if len(fields) > 1 and fields[0] == "MemTotal":
            return int(fields[1]) // 1024
    return 0


def free_bytes(path):
    """The bytes an unprivileged user may still write under ``path`` (``df -P -B1``'s Available)."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def headers_installed(dpkg_status):
    """True when ``dpkg-query -W -f='${Status}'`` of the headers package says it is installed."""
    return "install ok installed" in (dpkg_status or "")


def headers_candidate(apt_cache_policy):
    """True when ``apt-cache policy`` of the headers package offers a version to install."""
    return HEADERS_CANDIDATE.search(apt_cache_policy or "") is not None


def apt_policy(stdout):
    """``{installed, candidate, version, release}`` of the first package stanza of ``LC_ALL=C apt-cache policy``.

    ``installed`` and ``candidate`` are apt's, ``""`` for its ``(none)`` or no stanza; ``version`` is the one that
    counts (the installed one, else the candidate: what apt state=present keeps or installs); ``release`` its
    upstream ``major.minor`` (``21.08`` of ``1:21.08.5-2ubuntu1``), ``""`` without a version.
    """
    found = {"Installed": "", "Candidate": ""}
    # The first stanza: up to the next package's unindented "name:" line.
    stanza = re.split(r"\n(?=\S)", str(stdout or "").lstrip("\n"), maxsplit=1)[0]
    for key, value in APT_POLICY_LINE.findall(stanza):
        if value != "(none)":
            found[key] = value
    version = found["Installed"] or found["Candidate"]
    release = UPSTREAM_RELEASE.match(version)
    return {
        "installed": found["Installed"],
        "candidate": found["Candidate"],
        "version": version,
        "release": release.group(1) if release else "",
    }


def _unescape_mount_point(field):
    """A mount point of /proc/self/mountinfo, whose space, tab, newline and backslash are octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def cgroup_filesystem(mountinfo="/proc/self/mountinfo", path=CGROUP_ROOT):
    """The file system of ``path`` as ``stat --file-system --format=%T`` names it: ``cgroup2fs`` (cgroup v2),
    ``tmpfs`` (the v1 and hybrid layouts), ...; ``""`` when the mount table cannot be read.

    The mount whose mount point is ``path`` or its nearest parent, the last of those at the same point (a later
    mount hides an earlier one).
    """
    try:
        with open(mountinfo) as handle:
            lines = handle.read().splitlines()
    except (IOError, OSError):
        return ""
    best, best_length = "", -1
    for line in lines:
        # "36 35 98:0 /root /mount/point rw,noatime master:1 - fstype source rw": the optional fields end at " - ".
        mount, separator, tail = line.partition(" - ")
        fields, types = mount.split(), tail.split()
        if not separator or len(fields) < 5 or not types:
            continue
        point = _unescape_mount_point(fields[4]).rstrip("/") or "/"
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if len(point) >= best_length:
                best, best_length = types[0], len(point)
    return STAT_FS_NAMES.get(best, best)


def _release_key(release):
    """``22.05`` as ``(22, 5)``, to compare releases as Ansible's version test does."""
    return tuple(int(number) for number in re.findall(r"[0-9]+", str(release)))


def slurm_cgroup(filesystem, policy, settings, facts, host=""):
    """Slurm's comparison of a node's cgroup mode with its Slurm release (roles/slurm/tasks/cgroup.yml).

    ``filesystem`` is ``cgroup_filesystem``'s, ``policy`` the ``apt-cache policy`` output of ``settings['package']``;
    ``settings``: ``package``, ``shipped_release`` (the release the distribution ships, which counts when apt knows
    no version of the package), ``cgroup_v2_release`` (the release that brought the cgroup/v2 plugin) and
    ``without_plugin`` (``refuse`` or ``no_confinement``); ``facts``: ``distribution`` and ``distribution_version``.

    Returns ``{filesystem, v2, release, version_from, plugin_missing, unconfined, message, warning}``: the release
    is the installed package's, else apt's candidate (a backport counts as what it is), else the one the distribution
    ships. ``message`` stops the node (``host``) when the plugin is missing and the setting refuses that, ``warning``
    says that the cluster runs without cgroups when it allows it; each '' otherwise.
    """
    read = apt_policy(policy)
    package = settings["package"]
    release = read["release"] or str(settings["shipped_release"])
    if read["installed"]:
        version_from = "installed {0} {1}".format(package, read["installed"])
    elif read["candidate"]:
        version_from = "apt candidate {0} {1}".format(package, read["candidate"])
    else:
        version_from = "the release {0} {1} ships".format(
            facts.get("distribution", ""), facts.get("distribution_version", "")
        )
    v2 = filesystem == "cgroup2fs"
    missing = v2 and _release_key(release) < _release_key(settings["cgroup_v2_release"])
    # Only where the setting allows it: a refused node stops.
    unconfined = missing and settings["without_plugin"] == "no_confinement"
    message = warning = ""
    if missing and settings["without_plugin"] == "refuse":
        message = (
            "slurm on {0}: this node boots with cgroup v2 (/sys/fs/cgroup is {1}) and its Slurm is {2} ({3}), which "
            "has no cgroup/v2 plugin (it came with Slurm {4}): slurmd would not start with cgroup confinement. Boot "
            "the node with cgroup v1: add systemd.unified_cgroup_hierarchy=0 to GRUB_CMDLINE_LINUX in "
            "/etc/default/grub, run update-grub and reboot. Or set slurm_cgroup_v2_without_plugin: no_confinement to "
            "run Slurm without cgroups: jobs are then not confined to their GPUs, cores and memory."
        ).format(host, filesystem, release, version_from, settings["cgroup_v2_release"])
    elif unconfined:
        warning = (
            "slurm on {0}: cgroup v2 and Slurm {1} ({2}), no cgroup/v2 plugin; slurm_cgroup_v2_without_plugin is "
            "no_confinement: the cluster runs without cgroups (proctrack/linuxproc, no task/cgroup), so a job is not "
            "confined to the GPUs, cores and memory it was given. Boot the node with "
            "systemd.unified_cgroup_hierarchy=0 to confine jobs again."
        ).format(host, release, version_from)
    return {
        "filesystem": filesystem,
        "v2": v2,
        "release": release,
        "version_from": version_from,
        "plugin_missing": missing,
        "unconfined": unconfined,
        "message": message,
        "warning": warning,
    }


def _number(value):
    """A setting as the operator wrote it (20, not 20.0)."""
    return str(int(value)) if float(value) == int(float(value)) else str(value)


def os_name(facts):
    """``Ubuntu 22.04`` (Ubuntu's full version), ``Debian 12`` (the others' major version)."""
    distribution = facts.get("distribution", "")
    if distribution == "Ubuntu":
        return distribution, str(facts.get("distribution_version", ""))
    return distribution, str(facts.get("distribution_major_version", ""))


def _secure_boot_problem(found, facts, requirements):
    policy = requirements["secure_boot_policy"]
    if found["secure_boot"] != "enabled":
        return None
    distribution = facts.get("distribution", "")
    if not (
        policy == "fail"
        or (policy == "signed_modules" and distribution != "Ubuntu")
        or (policy == "mok" and not found.get("mok_enrolled"))
    ):
        return None
    certificate = requirements.get("mok_certificate") or ""
    enrol = (
        "`mokutil --import " + certificate + "`"
        if certificate
        else "`mokutil --import` the certificate DKMS signs with, named in preflight_mok_certificate"
    )
    why = (": " + distribution + " ships no signed NVIDIA modules") if policy == "signed_modules" else ""
    return (
        "UEFI Secure Boot is enabled and the policy is '{0}' (preflight_secure_boot_policy){1}. An unsigned DKMS "
        "module will not load. Either enrol a Machine Owner Key ({2}, reboot, confirm the enrolment in the MOK manager "
        "at the console) and set preflight_secure_boot_policy=mok, or turn Secure Boot off in the firmware setup"
    ).format(policy, why, enrol)


def judge(host, found, facts, requirements):
    """Preflight's verdict on a host: ``{'failures': [...], 'warnings': [...], 'report': {...}, 'summary': '...'}``.

    ``found`` is ``read_host``'s answer, ``facts`` the host's Ansible facts
    (distribution and versions, architecture, memtotal_mb, virtualization),
    ``requirements`` the role's settings without their prefix.
    """
    distribution, version = os_name(facts)
    this_os = (distribution + " " + version).strip()
    free_gb = round(found["free_bytes"] / float(GIB), 1)
    kernel = requirements["kernel_release"]
    devices = found["nvidia"]
    supported = requirements["supported_os"]
    architectures = requirements["supported_architectures"]
    failures = []
    if not any(
        str(entry.get("distribution")) == distribution and str(entry.get("version")) == version for entry in supported
    ):
        failures.append(
            "unsupported operating system {0}: gpufleet supports {1}; reinstall the host or extend "
            "preflight_supported_os at your own risk".format(
                this_os, ", ".join("{0} {1}".format(e.get("distribution"), e.get("version")) for e in supported)
            )
        )
    if facts.get("architecture") not in architectures:
        failures.append(
            "unsupported CPU architecture {0}: the NVIDIA packages and cu121 wheels gpufleet installs exist for "
            "{1}".format(facts.get("architecture"), ", ".join(architectures))
        )
    if free_gb < float(requirements["min_free_disk_gb"]):
        failures.append(
            "only {0} GB free under {1}, {2} GB needed (preflight_min_free_disk_gb): free space before installing "
            "the driver and CUDA".format(free_gb, requirements["disk_path"], _number(requirements["min_free_disk_gb"]))
        )
    if requirements["require_kernel_headers"] and not (found["headers_installed"] or found["headers_candidate"]):
        failures.append(
            "no kernel headers for kernel {0}: linux-headers-{0} is neither installed nor available from the "
            "configured apt sources; add the distribution's updates repository to the host or boot a kernel whose "
            "headers your mirror carries".format(kernel)
        )
    if requirements["require_gpus"] and not devices["gpus"]:
        failures.append(
            "no NVIDIA GPU on the PCI bus (vendor {0}): check that the cards are seated and powered and visible in "
            "`lspci -d 10de:`, or set preflight_require_gpus=false for a host without GPUs".format(NVIDIA_PCI_VENDOR)
        )
    secure_boot = _secure_boot_problem(found, facts, requirements)
    if secure_boot:
        failures.append(secure_boot)
    if found["nouveau_loaded"] and requirements["nouveau_policy"] == "fail":
        failures.append(
            "the nouveau driver is loaded and preflight_nouveau_policy is 'fail': blacklist it (the nvidia_driver "
            "role does) and reboot before installing"
        )

    warnings = []
    ram_gb = round(float(facts.get("memtotal_mb", 0)) / 1024, 1)
    if ram_gb < float(requirements["warn_ram_below_gb"]):
        warnings.append(
            "WARNING {0}: {1} GB RAM, below the {2} GB recommended for multi-GPU training (data loaders and pinned "
            "memory)".format(host, ram_gb, _number(requirements["warn_ram_below_gb"]))
        )
    if found["nouveau_loaded"]:
        warnings.append("WARNING {0}: nouveau is loaded; the NVIDIA driver will only load after a reboot".format(host))

    in_container = (
        facts.get("virtualization_role", "") == "guest" and facts.get("virtualization_type", "") in CONTAINER_TYPES
    )
    signed = found["secure_boot"] == "enabled" and requirements["secure_boot_policy"] == "signed_modules"
    report = {
        "passed": not failures,
        "os": this_os,
        "gpu_pci_addresses": [gpu["address"] for gpu in devices["gpus"]],
        "gpu_device_ids": [gpu["device_id"] for gpu in devices["gpus"]],
        "gpu_count": len(devices["gpus"]),
        "nvswitch_count": len(devices["nvswitches"]),
        "secure_boot": found["secure_boot"],
        "driver_module_source": "signed" if signed else "dkms",
        "nouveau_loaded": found["nouveau_loaded"],
        "in_container": in_container,
        "kernel_release": kernel,
        "free_disk_gb": free_gb,
    }
    summary = (
        "{host}: {os} {arch}, kernel target {kernel}, {gpus} NVIDIA GPU(s), {switches} NVSwitch(es), Secure Boot "
        "{sb}, nouveau {nouveau}, {free} GB free under {path}{container}"
    ).format(
        host=host,
        os=this_os,
        arch=facts.get("architecture"),
        kernel=kernel,
        gpus=report["gpu_count"],
        switches=report["nvswitch_count"],
        sb=found["secure_boot"],
        nouveau="loaded" if found["nouveau_loaded"] else "not loaded",
        free=free_gb,
        path=requirements["disk_path"],
        container=", in a container" if in_container else "",
    )
    message = ""
    if failures:
        message = "gpufleet preflight failed on {0} ({1} problem(s), nothing was changed): {2}".format(
            host, len(failures), "; ".join("[{0}] {1}".format(i, m) for i, m in enumerate(failures, 1))
        )
    return {"failures": failures, "message": message, "warnings": warnings, "report": report, "summary": summary}
