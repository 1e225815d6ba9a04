"""gpufleet's Jinja filters: shared rules of the roles, in one place.

Each filter's manual is its YAML file beside this one (plugins/filter/<name>.yml: what it takes, what it
returns, examples), which ``ansible-doc -t filter gpufleet.fleet.<name>`` prints;
``ansible-doc -t filter -l gpufleet.fleet`` lists them all. tests/unit/test_collection.py fails for a filter
registered here without one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.fleet.plugins.module_utils import apt_source as _apt_source
from ansible_collections.gpufleet.fleet.plugins.module_utils import driver_facts, host_facts
from ansible_collections.gpufleet.fleet.plugins.module_utils import driver_packages as _driver_packages
from ansible_collections.gpufleet.fleet.plugins.module_utils.command_answer import output_lines
from ansible_collections.gpufleet.fleet.plugins.module_utils.fleet_report import check_entry
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import (
    gpufleet_check_module,
    profile_overrides_problem,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import as_dict as settings_as_dict
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import as_list as settings_as_list
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import unknown_settings
from ansible_collections.gpufleet.fleet.plugins.module_utils.wheel_plan import wheel_plan

_SPACE = re.compile(r"\s+")
# One line of `dkms status`: "module/version" (dkms 2.8.6 on) or "module, version" (before), then ", kernel, arch"
# unless the module is only added, then ": state" and any remarks.
_DKMS_LINE = re.compile(
    r"^(?P<module>[^\s,/:]+)(?:/|,\s*)(?P<version>[^\s,:]+)"
    r"(?:,\s*(?P<kernel>[^\s,:]+),\s*(?P<arch>[^\s,:]+))?:\s*(?P<state>[^\s(]+)(?P<rest>.*)$"
)


def as_list(value: Any) -> list[Any]:
    """A list setting's value as a list (a string is split on commas, as the spec check does)."""
    try:
        return settings_as_list(value)
    except TypeError as error:
        raise AnsibleFilterError(f"as_list: {error}") from error


def as_dict(value: Any) -> dict[str, Any]:
    """A dict setting's value as a dict (``key=value`` pairs and JSON too, as the spec check accepts)."""
    try:
        return settings_as_dict(value)
    except TypeError as error:
        raise AnsibleFilterError(f"as_dict: {error}") from error


def failed_checks(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The messages of the ``{ok, msg}`` rules that do not hold."""
    failed = []
    for index, check in enumerate(checks or []):
        if not isinstance(check, Mapping) or "ok" not in check or "msg" not in check:
            raise AnsibleFilterError(f"failed_checks: rule {index + 1} is not a mapping with ok and msg: {check!r}")
        ok = check["ok"]
        if isinstance(ok, str):
            ok = ok.strip().lower() in ("true", "yes", "1", "on")
        if not ok:
            failed.append(_SPACE.sub(" ", str(check["msg"])).strip())
    return failed


def delegated_facts(results: Any) -> dict[str, dict[str, Any]]:
    """{host: facts} from the registered results of a looped, delegated ``setup`` (one item per host).

    The facts as hostvars would hold them: setup names them ``ansible_<fact>``,
    and Ansible stores them without the prefix. Items without facts (a host
    that did not answer) are left out.
    """
    found: dict[str, dict[str, Any]] = {}
    for result in as_list(results):
        facts = result.get("ansible_facts") if isinstance(result, Mapping) else None
        if isinstance(facts, Mapping) and "item" in result:
            found[str(result["item"])] = {
                (key[len("ansible_") :] if key.startswith("ansible_") else key): value for key, value in facts.items()
            }
    return found


def sections(output: Any) -> dict[str, list[str]]:
    """A probe's output split at its ``[name]`` lines: {name: [the lines below it]}.

    One remote command then answers several questions (preflight's probe), and
    each answer keeps the shape of its own command's stdout_lines (plugins/module_utils/driver_facts.py, which
    the module gpufleet.fleet.driver_facts splits its probe's output with).
    """
    try:
        return driver_facts.sections(output)
    except ValueError as error:
        raise AnsibleFilterError(str(error)) from error


# Words users reach for that a role calls otherwise (cuda_version: cuda_release).
# dcgm-exporter's tags: <DCGM version>-<exporter version>[-<platform>].
_EXPORTER_TAG = r"(?P<dcgm>(?P<major>[0-9]+)\.[0-9]+\.[0-9]+)-(?P<exporter>[0-9]+\.[0-9]+\.[0-9]+)"
_EXPORTER_SETTING = re.compile(rf"^{_EXPORTER_TAG}(-[a-z][a-z0-9.]*)?$")
_EXPORTER_IN_URL = re.compile(rf"(?<![0-9.]){_EXPORTER_TAG}(?![0-9])")


def dcgm_exporter_release(version: Any, url: Any = "") -> dict[str, Any]:
    """The release a version setting names, else the first one in the URL; {} when neither names one.

    A version that is set but not a release is {} too (the URL is not read
    then): the setting is wrong, and the role says so.
    """
    text = "" if version is None else str(version).strip()
    match = _EXPORTER_SETTING.match(text) if text else _EXPORTER_IN_URL.search("" if url is None else str(url))
    if not match:
        return {}
    return {"release": f"{match['dcgm']}-{match['exporter']}", "dcgm": match["dcgm"], "dcgm_major": int(match["major"])}


def rejection(messages: Sequence[str], role: str, host: str) -> str:
    """``<role> settings rejected on <host>: [1] first; [2] second``."""
    numbered = "; ".join(f"[{index}] {message}" for index, message in enumerate(messages, start=1))
    return f"{role} settings rejected on {host}: {numbered}"


def dkms_status(output: str | Sequence[str] | None) -> list[dict[str, Any]]:
    """The records of the lines of ``dkms status`` output, in the order printed."""
    records = []
    for line in output_lines(output):
        found = _DKMS_LINE.match(line.strip())
        if found is None:
            continue
        notes = [part.strip() for part in re.split(r"[()]", found["rest"]) if part.strip()]
        records.append(
            {
                "module": found["module"],
                "version": found["version"],
                "kernel": found["kernel"],
                "arch": found["arch"],
                "state": found["state"],
                "notes": list(dict.fromkeys(notes)),
            }
        )
    return records


def apt_policy(stdout: Any) -> dict[str, str]:
    """``{installed, candidate, version, release}`` of one package's ``apt-cache policy`` stanza (apt_policy.yml):
    module_utils/host_facts.py's reading, which gpufleet.fleet.host_facts runs on a Slurm node."""
    return host_facts.apt_policy(stdout)


def per_message(messages: Sequence[Any], hosts: Sequence[str], label: str = "WARNING") -> list[str]:
    """``<label> <hosts>: <message>`` per distinct non-empty message (``messages[i]`` is ``hosts[i]``'s)."""
    messages, hosts = list(messages or []), list(hosts or [])
    if len(messages) != len(hosts):
        raise AnsibleFilterError(f"per_message: {len(messages)} message(s) for {len(hosts)} host(s)")
    grouped: dict[str, list[str]] = {}
    for message, host in zip(messages, hosts, strict=True):
        text = _SPACE.sub(" ", str(message or "")).strip()
        if text:
            grouped.setdefault(text, []).append(str(host))
    lead = f"{label} " if label else ""
    return [f"{lead}{', '.join(names)}: {text}" for text, names in grouped.items()]


def _filter_errors(function: Any) -> Any:
    """``function`` (a rule of plugins/module_utils, shared with a module) as a filter raising filter errors."""

    @functools.wraps(function)
    def as_filter(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (TypeError, ValueError) as error:
            raise AnsibleFilterError(str(error)) from error

    return as_filter


# The rules of one apt source per repository and the package stanzas (plugins/module_utils/apt_source.py, which the
# module gpufleet.fleet.apt_trial runs on the host).
apt_relations = _filter_errors(_apt_source.apt_relations)
apt_stanzas = _filter_errors(_apt_source.apt_stanzas)
apt_source_files = _filter_errors(_apt_source.apt_source_files)
apt_source_plan = _filter_errors(_apt_source.apt_source_plan)
apt_source_conflict = _filter_errors(_apt_source.apt_source_conflict)
# A driver source's packages (plugins/module_utils/driver_packages.py, which the driver's rules resolve with).
driver_layout = _filter_errors(_driver_packages.driver_layout)
signed_module_packages = _filter_errors(_driver_packages.signed_module_packages)


# A Debian version (Debian Policy 5.6.12): [epoch:]upstream_version[-debian_revision].
_DEB_VERSION = re.compile(
    r"^(?:(?P<epoch>[0-9]+):)?(?P<upstream>[0-9][A-Za-z0-9.+~:-]*?)"
    r"(?:-(?P<revision>[A-Za-z0-9.+~]+))?$"
)


def _deb_version(version: Any) -> tuple[int, str, str]:
    """(epoch, upstream, revision) of a Debian version; a clear error for anything else."""
    found = _DEB_VERSION.match(str(version if version is not None else "").strip())
    if found is None:
        raise AnsibleFilterError(f"debian_version_compare: not a Debian version: {version!r}")
    return int(found["epoch"] or 0), found["upstream"], found["revision"] or ""


def _order(char: str) -> int:
    """dpkg's weight of one character of a non-digit run (lib/dpkg/version.c, order())."""
    if char == "~":
        return -1
    if not char or char.isdigit():
        return 0
    if char.isascii() and char.isalpha():
        return ord(char)
    return ord(char) + 256


def _verrevcmp(left: str, right: str) -> int:
    """dpkg's comparison of two upstream versions or two revisions (lib/dpkg/version.c, verrevcmp())."""
    i = j = 0
    while i < len(left) or j < len(right):
        while (i < len(left) and not left[i].isdigit()) or (j < len(right) and not right[j].isdigit()):
            a = _order(left[i]) if i < len(left) and not left[i].isdigit() else 0
            b = _order(right[j]) if j < len(right) and not right[j].isdigit() else 0
            if a != b:
                return a - b
            i, j = i + 1, j + 1
        start_i, start_j = i, j
        while i < len(left) and left[i].isdigit():
            i += 1
        while j < len(right) and right[j].isdigit():
            j += 1
        a_num, b_num = int(left[start_i:i] or 0), int(right[start_j:j] or 0)
        if a_num != b_num:
            return a_num - b_num
    return 0


def debian_version_compare(left: Any, right: Any) -> int:
    """-1, 0 or 1 as Debian version ``left`` sorts before, equal to or after ``right`` (dpkg --compare-versions)."""
    a, b = _deb_version(left), _deb_version(right)
    result = (a[0] - b[0]) or _verrevcmp(a[1], b[1]) or _verrevcmp(a[2], b[2])
    return (result > 0) - (result < 0)


def upstream_version(version: Any) -> str:
    """The upstream part of a Debian version, epoch and revision dropped (535.309.01 of 535.309.01-0ubuntu0.22.04.2)."""
    return _deb_version(version)[1]


def newest_build(versions: Any, branch: Any) -> str:
    """The newest of ``versions`` (strings or stanzas with a Version) of driver branch ``branch``; "" when none is."""
    newest = ""
    for item in versions or []:
        version = str(item.get("Version", "") if isinstance(item, Mapping) else item).strip()
        if not version or upstream_version(version).split(".")[0] != str(branch):
            continue
        if not newest or debian_version_compare(version, newest) > 0:
            newest = version
    return newest


def fleet_release(offered_per_host: Any, branch: Any) -> str:
    """The newest release of ``branch`` every host's offered versions have; "" when they share none."""
    common: set[str] | None = None
    for offered in offered_per_host or []:
        releases = set()
        for item in offered or []:
            version = str(item.get("Version", "") if isinstance(item, Mapping) else item).strip()
            if version and _branch_of_version(version) == str(branch):
                releases.add(upstream_version(version))
        common = releases if common is None else common & releases
    return newest_build(sorted(common or ()), branch)


_KERNEL_VERSION = re.compile(r"^[0-9]+\.[0-9]+(?:\.[0-9]+)*$")


def package_branch(name: Any) -> str:
    """The driver branch a package name carries ("580" of libnvidia-extra-580-server), "" for none."""
    text = str(name or "").strip()
    if "nvidia" not in text and not text.startswith("cuda-drivers"):
        return ""
    parts = text.split("-")
    for index, part in enumerate(parts):
        if re.fullmatch(r"[0-9]{3}", part) and not (index and _KERNEL_VERSION.match(parts[index - 1])):
            return part
    return ""


def _branch_of_version(version: Any) -> str:
    """The branch (first upstream component) of a version; "" when it is no Debian version."""
    try:
        return upstream_version(version).split(".")[0]
    except AnsibleFilterError:
        return ""


def foreign_branches(stanzas: Any, branch: Any) -> list[dict[str, str]]:
    """``{package, version, depends_on, branch}`` of what in the stanzas is another branch's (foreign_branches.yml)."""
    wanted = str(branch)
    records: list[dict[str, str]] = []
    for stanza in apt_stanzas(stanzas) if isinstance(stanzas, str) else list(stanzas or []):
        package, version = str(stanza.get("Package", "")), str(stanza.get("Version", ""))
        own = _branch_of_version(version)
        # The kernel's packages (linux-modules-nvidia-535-server-generic) carry the kernel's version.
        if package_branch(package) == wanted and own and own != wanted and not package.startswith("linux-"):
            records.append({"package": package, "version": version, "depends_on": "", "branch": own})
        for field in ("Pre-Depends", "Depends"):
            groups = stanza.get(field) or []
            for group in apt_relations(groups) if isinstance(groups, str) else groups:
                names = [str(alternative["name"]) for alternative in group]
                branches = [package_branch(name) for name in names]
                if all(other and other != wanted for other in branches):
                    records.extend(
                        {"package": package, "version": version, "depends_on": name, "branch": other}
                        for name, other in zip(names, branches, strict=True)
                    )
    return [dict(items) for items in dict.fromkeys(tuple(record.items()) for record in records)]


# uname -r of an Ubuntu kernel: <version>-<ABI>-<flavour> (5.15.0-91-generic, 6.8.0-1015-nvidia-64k).
_KERNEL_COMMON = re.compile(r"^nvidia-kernel-common-[0-9]{3}(?:-server)?$")


def signed_module_version(stanza: Any) -> str:
    """The NVIDIA version a linux-modules-nvidia-* stanza's Depends on nvidia-kernel-common-<branch> names, or ""."""
    if isinstance(stanza, str):
        stanzas = apt_stanzas(stanza)
        stanza = stanzas[0] if stanzas else {}
    groups = (stanza or {}).get("Depends") or []
    for group in apt_relations(groups) if isinstance(groups, str) else groups:
        for alternative in group:
            if _KERNEL_COMMON.match(str(alternative["name"])) and alternative["relation"] in ("=", ">="):
                return str(alternative["version"])
    return ""


def module_version_matches(module: Any, userspace_version: Any) -> bool:
    """Whether a signed module (a stanza, or its version) has the upstream version of ``userspace_version``."""
    stanza = not isinstance(module, str) or re.match(r"\s*Package:", module) is not None
    version = signed_module_version(module) if stanza else module.strip()
    if not version or not str(userspace_version or "").strip():
        return False
    return upstream_version(version) == upstream_version(userspace_version)


def signed_module_mismatches(stanzas: Any, userspace_version: Any) -> list[dict[str, str]]:
    """``{package, module}`` of each signed module package (stanzas, or their text) whose NVIDIA release is not the
    upstream version of ``userspace_version``; a package that names no release is not judged."""
    records = []
    for stanza in apt_stanzas(stanzas) if isinstance(stanzas, str) else list(stanzas or []):
        module = signed_module_version(stanza)
        if module and not module_version_matches(module, userspace_version):
            records.append({"package": f"{stanza.get('Package', '')} {stanza.get('Version', '')}", "module": module})
    return records


_SIMULATED_INSTALL = re.compile(r"^Inst (?P<package>\S+) (?:\[(?P<old>[^\]]+)\] )?\((?P<version>\S+)")
_SIMULATED_REMOVAL = re.compile(r"^Remv (?P<package>\S+)(?: \[(?P<version>[^\]]+)\])?")
_SIMULATION_EXIT = re.compile(r"^\[simulation exit (?P<code>[0-9]+)\]$")
_UNMET_ENTRY = re.compile(r"^ (?P<package>[^\s:]+)(?::[a-z0-9]+)? : ")


def apt_simulation(output: Any, held: Any = ()) -> dict[str, Any]:
    """What ``apt-get -s install`` says it would do (apt_simulation.yml)."""
    lines = output_lines(output)
    installs: dict[str, dict[str, str]] = {}
    removals: dict[str, dict[str, str]] = {}
    errors, unmet, exit_code, in_unmet = [], [], None, False
    for line in lines:
        found = _SIMULATED_INSTALL.match(line)
        if found:
            installs.setdefault(
                found["package"], {"package": found["package"], "version": found["version"], "old": found["old"] or ""}
            )
            continue
        found = _SIMULATED_REMOVAL.match(line)
        if found:
            removals.setdefault(found["package"], {"package": found["package"], "version": found["version"] or ""})
            continue
        found = _SIMULATION_EXIT.match(line.strip())
        if found:
            exit_code = int(found["code"])
            continue
        if line.startswith("E: "):
            errors.append(line[3:].strip())
        if line.startswith("The following packages have unmet dependencies"):
            in_unmet = True
            continue
        if in_unmet:
            entry = _UNMET_ENTRY.match(line)
            if entry:
                unmet.append(entry["package"])
            elif not line.startswith("  "):
                in_unmet = False
    held_names = set(as_list(list(held or [])))
    in_the_way = sorted(held_names & (set(unmet) | set(removals)))
    ran = exit_code is not None or bool(lines)
    return {
        "ran": ran,
        "ok": ran and exit_code == 0 and not errors,
        "exit": exit_code,
        "installs": list(installs.values()),
        "removals": list(removals.values()),
        "errors": errors,
        "unmet": list(dict.fromkeys(unmet)),
        "held_in_the_way": in_the_way,
        "kernels": sorted(name for name in installs if name.startswith("linux-image-")),
    }


def driver_transaction_refusal(
    output: Any,
    held: Any = (),
    host: str = "",
    version: str = "",
    packages: Any = (),
    replaced_branch: str = "",
    allow_kernel_install: bool = False,
    stanzas: Any = (),
    branch: Any = "",
    repository: str = "",
) -> str:
    """Why the driver's trial or simulated transaction stops the host, '' when it does not
    (driver_transaction_refusal.yml)."""
    # The stanzas of the driver's own packages at the release: another branch's build or dependency among them
    # (Canonical's transitional 535-server builds depend on 580-server) would install that branch under these names.
    at_release = re.compile(r"^([0-9]+:)?" + re.escape(str(version)) + "-")
    records = apt_stanzas(stanzas) if isinstance(stanzas, str) else list(stanzas or [])
    foreign = foreign_branches([r for r in records if at_release.match(str(r.get("Version", "")))], branch)
    if version and foreign:
        said = "; ".join(
            f"{r['package']} {r['version']} "
            + (f"depends on {r['depends_on']} of" if r["depends_on"] else "is itself a build of")
            + f" branch {r['branch']}"
            for r in foreign
        )
        return (
            f"nvidia_driver on {host}: {repository} builds release {version} of branch {branch} with packages of"
            f" another branch: {said}. apt would install that branch under branch {branch}'s names. Choose a release"
            f" or a source that builds branch {branch} itself (nvidia_driver_source=nvidia: NVIDIA's CUDA repository"
            " keeps every build)."
        )
    simulated = apt_simulation(output, held)
    replacing = f", replacing branch {replaced_branch}" if replaced_branch else ""
    if simulated["ran"] and not simulated["ok"]:
        said = " ".join(simulated["errors"]) or f"exit {simulated['exit']}"
        if simulated["held_in_the_way"]:
            said += (
                ". Held packages that are not gpufleet's driver stack stand in the way: "
                f"{', '.join(simulated['held_in_the_way'])}; gpufleet releases only the holds of the driver's own "
                "packages (and of the branch it replaces). Release them (apt-mark unhold) if they may change, or "
                "choose a release that leaves them alone"
            )
        elif simulated["unmet"]:
            said += f". apt names: {', '.join(simulated['unmet'])}"
        return (
            f"nvidia_driver on {host}: apt refuses to install driver {version} ({', '.join(as_list(packages))}"
            f"{replacing}): {said}. Nothing has been changed."
        )
    if simulated["kernels"] and not allow_kernel_install:
        return (
            f"nvidia_driver on {host}: installing the driver would also install {', '.join(simulated['kernels'])}. "
            "A new kernel changes what the module must be built for and needs its own reboot; install the kernel "
            "first on purpose, or set nvidia_driver_allow_kernel_install=true."
        )
    return ""


_DCGM_LEVELS = {"none": 0, "quick": 1, "r2": 2, "r3": 3}


def dcgm_level(tier: Any, timeout: Any = 0) -> dict[str, int]:
    """gpu_verify_dcgm_level as dcgmi diag's run level and its time limit (dcgm_level.yml)."""
    if str(tier) not in _DCGM_LEVELS:
        raise AnsibleFilterError(f"dcgm_level: {tier!r} is not one of {', '.join(_DCGM_LEVELS)}")
    level = _DCGM_LEVELS[str(tier)]
    try:
        seconds = int(timeout or 0)
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(f"dcgm_level: timeout {timeout!r} is not a number of seconds") from error
    if level == 0:
        return {"level": 0, "timeout": 0}
    return {
        "level": level,
        "timeout": seconds if seconds > 0 else int(gpufleet_check_module("dcgm").DEFAULT_TIMEOUT_S[level]),
    }


class FilterModule:
    """gpufleet.fleet filters."""

    def filters(self) -> dict[str, Any]:
        # Each filter is named as its function.
        return {
            function.__name__: function
            for function in (
                as_list,
                as_dict,
                apt_policy,
                apt_simulation,
                apt_source_files,
                apt_source_conflict,
                apt_source_plan,
                apt_stanzas,
                check_entry,
                dcgm_exporter_release,
                dcgm_level,
                debian_version_compare,
                driver_transaction_refusal,
                delegated_facts,
                dkms_status,
                driver_layout,
                failed_checks,
                fleet_release,
                foreign_branches,
                module_version_matches,
                newest_build,
                package_branch,
                per_message,
                profile_overrides_problem,
                rejection,
                sections,
                signed_module_packages,
                signed_module_version,
                signed_module_mismatches,
                unknown_settings,
                wheel_plan,
            )
        }
