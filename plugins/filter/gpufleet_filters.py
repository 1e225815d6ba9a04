"""gpufleet's Jinja filters: shared rules of the roles, in one place.

Each filter's manual is its YAML file beside this one (plugins/filter/<name>.yml: what it takes, what it
returns, examples), which ``ansible-doc -t filter gpufleet.fleet.<name>`` prints;
``ansible-doc -t filter -l gpufleet.fleet`` lists them all. tests/unit/test_collection.py fails for a filter
registered here without one.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.fleet.plugins.module_utils import apt_source as _apt_source
from ansible_collections.gpufleet.fleet.plugins.module_utils import driver_facts, host_facts
from ansible_collections.gpufleet.fleet.plugins.module_utils import driver_packages as _driver_packages
from ansible_collections.gpufleet.fleet.plugins.module_utils.fleet_report import check_entry
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import (
    gpufleet_check_module,
    profile_overrides_problem,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import as_dict as settings_as_dict
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import as_list as settings_as_list
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import unknown_settings

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
    if output is None:
        return []
    lines = output.splitlines() if isinstance(output, str) else list(output)
    records = []
    for line in lines:
        found = _DKMS_LINE.match(str(line).strip())
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


def per_message(messages: Sequence[Any], hosts: Sequence[str]) -> list[str]:
    """``WARNING <hosts>: <message>`` per distinct non-empty message (``messages[i]`` is ``hosts[i]``'s)."""
    messages, hosts = list(messages or []), list(hosts or [])
    if len(messages) != len(hosts):
        raise AnsibleFilterError(f"per_message: {len(messages)} message(s) for {len(hosts)} host(s)")
    grouped: dict[str, list[str]] = {}
    for message, host in zip(messages, hosts, strict=True):
        text = _SPACE.sub(" ", str(message or "")).strip()
        if text:
            grouped.setdefault(text, []).append(str(host))
    return [f"WARNING {', '.join(names)}: {text}" for text, names in grouped.items()]


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
    lines = (
        [] if output is None else (output.splitlines() if isinstance(output, str) else [str(line) for line in output])
    )
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


# --- play 1's wheel plan (roles/pytorch/files/pytorch_wheel_plan.py) -------------------------------------------
# pip's messages, as pip 25.3 prints them (read off real runs against a wheel source on 127.0.0.1,
# tests/unit/test_wheel_plan.py): a pin the source does not offer, a host that does not answer (urllib3's
# MaxRetryError inside pip's OSError), and a file that answers an HTTP error.
_PIP_NO_MATCH = re.compile(
    r"^ERROR: Could not find a version that satisfies the requirement (?P<req>\S+)"
    r"(?: \(from (?P<parent>[^()]*)\))? \(from versions: (?P<versions>[^()]*)\)"
)
_PIP_POOL = re.compile(
    r"(?P<scheme>HTTPS?)ConnectionPool\(host='(?P<host>[^']+)', port=(?P<port>\d+)\): "
    r"Max retries exceeded with url: (?P<path>\S+) \(Caused by (?P<cause>.*)\)"
)
_PIP_HTTP = re.compile(r"^ERROR: (?P<code>\d{3}) (?:Client|Server) Error: (?P<reason>.*?) for url: (?P<url>\S+)")
_PIP_COLLECTING = re.compile(r"^Collecting (?P<req>\S+)(?: \(from (?P<chain>.*)\))?$")
_PIP_IGNORED_PYTHON = re.compile(
    r"^ERROR: Ignored the following versions that require a different python version: "
    r"(?P<which>.*)$"
)
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
# What makes a host not answer, in the words of urllib3 (pip) and urllib (the HEAD requests), first match wins.
_UNREACHABLE = [
    (re.compile(r"Connection refused"), "connection refused"),
    (
        re.compile(
            r"NameResolutionError|Name or service not known|Temporary failure in name resolution|nodename nor servname|"
            r"No address associated with hostname|getaddrinfo failed"
        ),
        "its name does not resolve",
    ),
    (re.compile(r"ProxyError|Tunnel connection failed"), "the proxy refused to connect to it"),
    (
        re.compile(r"SSLError|SSL: |CERTIFICATE_VERIFY_FAILED|certificate verify failed"),
        "TLS failed (its certificate is not trusted: pytorch_pip_extra_args --cert?)",
    ),
    (re.compile(r"[Tt]imed? ?out|ConnectTimeoutError|ReadTimeoutError"), "timed out"),
    (re.compile(r"No route to host"), "no route to host"),
    (re.compile(r"Network is unreachable"), "network unreachable"),
    (re.compile(r"Connection reset|RemoteDisconnected|closed connection"), "it closed the connection"),
]


def _why_unreachable(text: str) -> str:
    for pattern, reason in _UNREACHABLE:
        if pattern.search(text):
            return reason
    return _SPACE.sub(" ", text).strip()[:160] or "no answer"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _netloc(url: str) -> str:
    match = re.match(r"^[a-z][a-z0-9+.-]*://([^/?#]+)", url or "", re.IGNORECASE)
    return match[1].rsplit("@", 1)[-1] if match else ""


def _file_name(url: str) -> str:
    name = url.split("#", 1)[0].split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return name[: -len(".metadata")] if name.endswith(".metadata") else name


def _lock_pins(lines: Sequence[str]) -> dict[str, str]:
    """{canonical name: version} of the requirement lines of a hash lock (name==version ...)."""
    pins = {}
    for line in lines:
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if match:
            pins[_canonical(match[1])] = match[2]
    return pins


class _Plan:
    """What one node's wheel plan says, judged against the role's settings (``context``)."""

    def __init__(self, out: Mapping[str, Any], context: Mapping[str, Any]) -> None:
        self.out, self.ctx = out, context
        self.items = [dict(item) for item in out.get("install") or []]
        self.by_name = {_canonical(item["name"]): item for item in self.items}
        # child -> the items whose Requires-Dist names it (the requirements that need it).
        self.parents: dict[str, list[str]] = {}
        for item in self.items:
            for requirement in item.get("requires_dist") or []:
                match = _REQ_NAME.match(requirement)
                child = _canonical(match[1]) if match else ""
                if child in self.by_name and child != _canonical(item["name"]):
                    self.parents.setdefault(child, []).append(f"{item['name']}=={item['version']}")
        self.problems: list[str] = []
        self.warnings: list[str] = []
        # The index and find-links URLs that did not answer: pip's "no version" after them says nothing more.
        self.unread: list[str] = []

    # -- wording ------------------------------------------------------------------------------------------------
    @property
    def source(self) -> str:
        return f"{self.ctx.get('source', '')} ({self.ctx.get('source_setting', 'the wheel source')})"

    def _top(self, name: str, seen: frozenset[str] = frozenset()) -> str:
        """The requested requirement that ``name`` is installed for (itself when requested)."""
        parents = self.parents.get(name, [])
        if not parents or name in seen:
            return name
        return self._top(_canonical(parents[0].split("==", 1)[0]), seen | {name})

    def pin_setting(self, top: str) -> str:
        if self.ctx.get("hashes_file"):
            return "pytorch_hashes_file"
        return (
            "pytorch_release"
            if top in {_canonical(n) for n in self.ctx.get("matrix_packages") or []}
            else "pytorch_extra_packages"
        )

    def needed_by(self, name: str, chain: Sequence[str] = ()) -> str:
        parents = self.parents.get(name) or list(chain[:1])
        if parents:
            return f" (needed by {', '.join(parents)})"
        return f" (pinned by pytorch_hashes_file {self.ctx['hashes_file']})" if self.ctx.get("hashes_file") else ""

    def change_pin(self, name: str, chain: Sequence[str] = ()) -> str:
        top = _canonical(_REQ_NAME.match(chain[-1])[1]) if chain and _REQ_NAME.match(chain[-1]) else self._top(name)
        return f"change the pin ({self.pin_setting(top)})"

    def mirror(self, first: bool = False) -> str:
        return f"{'M' if first else 'm'}irror the file into {self.source}"

    # -- judging ------------------------------------------------------------------------------------------------
    def fetched(self) -> None:
        """The HEAD of each file: every host must answer (one problem per host that does not, naming its files),
        every file must be there (one problem per missing file)."""
        answers = {entry.get("url"): entry for entry in self.out.get("fetch") or []}
        refusing: dict[tuple[str, str, str], list[str]] = {}
        for item in self.items:
            entry = answers.get(item["url"])
            if entry is None:
                continue
            name = _canonical(item["name"])
            pin, file = f"{item['name']}=={item['version']}", _file_name(item["url"])
            status, host = int(entry.get("status") or 0), _netloc(entry.get("final_url") or item["url"])
            redirected = f" (redirected from {_netloc(item['url'])})" if host != _netloc(item["url"]) else ""
            if status in (404, 410):
                self.problems.append(
                    f"{entry.get('final_url') or item['url']} answers HTTP {status}: {file}, the wheel of "
                    f"{pin}{self.needed_by(name)}, is listed but gone. {self.mirror(True)}, or {self.change_pin(name)}"
                )
            elif status == 0 or status >= 400:
                why = (
                    f"does not answer ({_why_unreachable(entry.get('error', ''))})"
                    if status == 0
                    else f"answers HTTP {status} {entry.get('error', '')}".rstrip()
                )
                refusing.setdefault((host + redirected, why, host), []).append(
                    f"{file}, the wheel of {pin}{self.needed_by(name)}"
                )
        for (where, why, host), files in refusing.items():
            served = (
                f"it serves {files[0]}"
                if len(files) == 1
                else f"it serves {len(files)} wheels of the install: {'; '.join(files)}"
            )
            self.problems.append(
                f"{where} {why}: {served}. Allow {host} through the site's firewall or proxy"
                f"{' (and its credentials)' if 'HTTP 40' in why else ''}, or {self.mirror()}"
            )

    def sources(self) -> None:
        for entry in self.out.get("sources") or []:
            if int(entry.get("status") or 0) == 0:
                host = _netloc(entry.get("url", ""))
                self.unread.append(entry.get("url", ""))
                self.problems.append(
                    f"{host} does not answer ({_why_unreachable(entry.get('error', ''))}): pip cannot read the listing "
                    f"{entry.get('url')}, so it finds none of the wheels there. Allow {host} through the site's "
                    f"firewall or proxy, or correct {self.ctx.get('source_setting', 'the wheel source')}"
                )

    def pip_failed(self, pip: Mapping[str, Any]) -> None:
        stderr = [line for line in pip.get("stderr") or [] if line.strip()]
        chains = {}
        last: tuple[str, list[str]] = ("", [])
        for line in pip.get("collecting") or []:
            match = _PIP_COLLECTING.match(line)
            if match:
                chain = [
                    part.strip()
                    for part in (match["chain"] or "").split("->")
                    if part.strip() and not part.strip().startswith("-r ")
                ]
                chains[_canonical(_REQ_NAME.match(match["req"])[1])] = chain
                last = (match["req"], chain)
        ignored = next((m["which"] for m in map(_PIP_IGNORED_PYTHON.match, stderr) if m), "")
        found = False
        for line in stderr:
            no_match, pool, http = _PIP_NO_MATCH.match(line), _PIP_POOL.search(line), _PIP_HTTP.match(line)
            if no_match:
                found = True
                if self.unread:
                    continue
                requirement = no_match["req"]
                name = _canonical(_REQ_NAME.match(requirement)[1])
                chain = chains.get(name) or ([no_match["parent"]] if no_match["parent"] else [])
                versions = no_match["versions"].strip()
                python = self.out.get("python", "")
                self.problems.append(
                    f"{self.source} offers no wheel of {requirement}{self.needed_by(name, chain)} for CPython "
                    f"{'.'.join(python.split('.')[:2])} on {self.out.get('machine', '')} (it offers "
                    f"{('versions ' + versions) if versions and versions != 'none' else 'no version of it'}"
                    f"{'; for other Pythons: ' + ignored if ignored else ''}). {self.mirror(True)}, or "
                    f"{self.change_pin(name, chain)}"
                )
            elif pool:
                found = True
                host = (
                    pool["host"]
                    if (pool["scheme"] == "HTTPS" and pool["port"] == "443")
                    or (pool["scheme"] == "HTTP" and pool["port"] == "80")
                    else f"{pool['host']}:{pool['port']}"
                )
                requirement, chain = last
                name = _canonical(_REQ_NAME.match(requirement)[1]) if requirement else ""
                url = f"{pool['scheme'].lower()}://{host}{pool['path']}"
                self.problems.append(
                    f"{host} does not answer ({_why_unreachable(pool['cause'])}): pip fetches "
                    f"{_file_name(pool['path'])} from it "
                    f"({url}){' for ' + requirement if requirement else ''}{self.needed_by(name, chain)}. Allow {host} "
                    f"through the site's firewall or proxy, or {self.mirror()}"
                )
            elif http:
                found = True
                requirement, chain = last
                name = _canonical(_REQ_NAME.match(requirement)[1]) if requirement else ""
                of = f", the wheel of {requirement}" if requirement else ""
                what = f"{_file_name(http['url'])}{of}{self.needed_by(name, chain)}"
                if http["code"] in ("404", "410"):
                    self.problems.append(
                        f"{http['url']} answers HTTP {http['code']} ({http['reason']}): {what}, is listed but gone. "
                        f"{self.mirror(True)}, or {self.change_pin(name, chain)}"
                    )
                else:
                    host = _netloc(http["url"])
                    self.problems.append(
                        f"{host} answers HTTP {http['code']} ({http['reason']}) for {what}. Allow {host} through the "
                        f"site's firewall or proxy (and its credentials), or {self.mirror()}"
                    )
        if not found and any(line.startswith("ERROR: ResolutionImpossible") for line in stderr):
            # pip's account of the conflict is on stdout: "The conflict is caused by:" and one line per cause.
            stdout = [line.strip() for line in pip.get("stdout") or []]
            start = (
                stdout.index("The conflict is caused by:") + 1
                if "The conflict is caused by:" in stdout
                else len(stdout)
            )
            causes = stdout[start : stdout.index("", start) if "" in stdout[start:] else len(stdout)]
            pins = "pytorch_hashes_file" if self.ctx.get("hashes_file") else "pytorch_release, pytorch_extra_packages"
            self.problems.append(
                f"pip cannot install the pins together: {'; '.join(causes) or 'ResolutionImpossible'}. Change the pins "
                f"({pins})"
            )
        elif not found:
            # Not a verdict on the source: the install may well work (or fail the same way); play 1 says so and goes on.
            errors = [line for line in stderr if line.startswith("ERROR:")] or stderr[-3:]
            self.warnings.append(
                f"pip could not resolve the wheel set on this host (rc {pip.get('rc')}: "
                f"{_SPACE.sub(' ', ' '.join(errors))[:400]}); the wheels' hosts were not checked"
            )

    def lock(self) -> None:
        lines = self.ctx.get("requirements") or []
        if not self.ctx.get("hashes_file"):
            return
        pins = _lock_pins(lines)
        for item in self.items:
            name = _canonical(item["name"])
            if pins.get(name) != item["version"]:
                locked = f" (it pins {name}=={pins[name]})" if name in pins else ""
                self.problems.append(
                    f"pytorch_hashes_file {self.ctx['hashes_file']} does not pin "
                    f"{item['name']}=={item['version']}{self.needed_by(name) or ''}{locked}: pip --require-hashes "
                    "refuses the install. Write the lock again with its wheel in it"
                )

    def summary(self) -> str:
        counts: dict[str, int] = {}
        moved: dict[str, set[str]] = {}
        answers = {entry.get("url"): entry for entry in self.out.get("fetch") or []}
        for item in self.items:
            host = _netloc(item["url"])
            counts[host] = counts.get(host, 0) + 1
            final = _netloc((answers.get(item["url"]) or {}).get("final_url") or item["url"])
            if final != host:
                moved.setdefault(host, set()).add(final)
        hosts = ", ".join(
            f"{h} ({n}{', redirected to ' + ', '.join(sorted(moved[h])) if h in moved else ''})"
            for h, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        return (
            f"{len(self.items)} wheels for CPython {self.out.get('python', '')} on {self.out.get('machine', '')}, from "
            f"{hosts}"
        )


def wheel_plan(result: Any, context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Judge a node's wheel plan: the registered result of pytorch_wheel_plan.py (wheel_plan.yml)."""
    context = context or {}
    plan: dict[str, Any] = {"problems": [], "warnings": [], "files": [], "hosts": [], "summary": ""}
    result = result if isinstance(result, Mapping) else {}
    lines = [line for line in str(result.get("stdout") or "").splitlines() if line.strip()]
    try:
        out = json.loads(lines[-1]) if lines else None
    except ValueError:
        out = None
    if result.get("rc") != 0 or not isinstance(out, Mapping):
        tail = (str(result.get("stderr") or "").strip().splitlines() or [str(result.get("msg") or "no output")])[-1]
        plan["warnings"].append(
            f"the wheel plan did not run (rc {result.get('rc')}: {tail[:300]}); the hosts of the wheels were not "
            "checked"
        )
        return plan
    if out.get("skipped"):
        plan["warnings"].append(
            f"the wheel set was not resolved: {out['skipped']}; the hosts of the wheels were not checked"
        )
        return plan
    judged = _Plan(out, context)
    pip = out.get("pip") or {}
    judged.sources()
    if pip.get("stopped_download"):
        judged.warnings.append(
            f"{context.get('source', 'the wheel source')} serves neither PEP 658 metadata nor byte ranges for "
            f"{_file_name(pip['stopped_download'])}: pip would download the whole wheel to read its dependencies, "
            "which play 1 does not do; the wheels after it and their hosts were not checked"
        )
    elif pip.get("rc") != 0:
        judged.pip_failed(pip)
    elif str(out.get("report_version")) != "1":
        judged.warnings.append(
            f"pip's report is of version {out.get('report_version')!r}, not 1: the wheel set was not read"
        )
    else:
        judged.fetched()
        judged.lock()
        plan["summary"] = judged.summary()
    plan["problems"], plan["warnings"] = judged.problems, judged.warnings
    answers = {entry.get("url"): entry for entry in out.get("fetch") or []}
    plan["files"] = [
        {
            "name": item["name"],
            "version": item["version"],
            "url": item["url"],
            "host": _netloc(item["url"]),
            "final_host": _netloc((answers.get(item["url"]) or {}).get("final_url") or item["url"]),
            "status": (answers.get(item["url"]) or {}).get("status", 0),
            "needed_by": judged.parents.get(_canonical(item["name"]), []),
        }
        for item in judged.items
    ]
    plan["hosts"] = sorted({f["host"] for f in plan["files"]} | {f["final_host"] for f in plan["files"]})
    return plan


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
