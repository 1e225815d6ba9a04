# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nvidia_driver role's reads of a host, judged: a driver gpufleet did not install, and the driver stack.

The module gpufleet.fleet.driver_facts runs this on the host (it is shipped with the module, so it keeps to
Python 3.8 and the standard library); the filter gpufleet.fleet.foreign_driver and its parsers
(plugins/filter/foreign_driver.py) are this module's functions on the controller.

* ``sections`` splits a probe's output at its ``[name]`` lines (the filter gpufleet.fleet.sections);
* ``foreign_driver`` is the judgement of what roles/nvidia_driver/files/foreign_driver_probe.sh found: gpufleet's
  own driver (its fact, written before it installs) told apart from the rest, with the stop or the notice;
* ``stack_facts`` is what the install reads of the driver stack (roles/nvidia_driver/files/driver_stack.py's
  listing) and of the holds: the held dependencies, the holds the install lifts and the packages it asks apt for.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.command_answer import output_lines

try:
    from collections.abc import Mapping
except ImportError:  # pragma: no cover - Python 2, which no target runs
    Mapping = dict

_SECTION = re.compile(r"^\[([a-z_]+)\]$")


def sections(output):
    """A probe's output split at its ``[name]`` lines: {name: [the lines below it]}.

    One remote command then answers several questions (preflight's probe), and
    each answer keeps the shape of its own command's stdout_lines.
    """
    found = {}
    current = None
    for line in output_lines(output):
        match = _SECTION.match(line.strip())
        if match:
            current = found.setdefault(match.group(1), [])
        elif current is not None:
            current.append(line)
        elif line.strip():
            raise ValueError("sections: a line before the first [name] line: {0!r}".format(line))
    return found


MODES = ("refuse", "adopt", "replace")
HOW_TO = 'docs/how-it-works.md, "A driver installed by other means"'
UNINSTALLER = "/usr/bin/nvidia-uninstall"
# NVIDIA's installer (github.com/NVIDIA/nvidia-installer @ 00aaa9f, 590.48.01): nvidia-installer.h
# DEFAULT_LOG_FILE_NAME; invoked as nvidia-uninstall it uninstalls (nvidia-installer.c, parse_commandline);
# --silent and --skip-module-unload apply to nvidia-uninstall (option_table.h; --skip-module-unload since 346.16).
INSTALLER_LOG = "/var/log/nvidia-installer.log"
UNINSTALL_ARGS = ("--silent", "--skip-module-unload")

# The names of the driver's packages, whatever their source: nvidia in the name (Canonical's nvidia-*-535[-server],
# libnvidia-*, linux-modules-nvidia-*; NVIDIA's repository, whose branch-less names since 590 keep it:
# libnvidia-compute; Debian's nvidia-*, libnvidia-*, firmware-nvidia-gsp), and the CUDA driver library and metapackages
# without it.
_DRIVER_NAME = re.compile(r"nvidia|^libcuda1$|^libcudadebugger1$|^cuda-drivers(-[0-9]+)?$")
# NVIDIA-named packages that are no part of the driver:
# - the NVIDIA Container Toolkit (roles/container/vars/main.yml: nvidia-container-toolkit, -base,
#   libnvidia-container-tools, libnvidia-container1) and its predecessor nvidia-docker2;
# - the distributions' CUDA toolkit (nvidia-cuda-toolkit, nvidia-cuda-dev, ...), which only uses the driver;
# - the EGL platform libraries the distributions build from free sources (libnvidia-egl-wayland1: Ubuntu's
#   archive installs it for the desktop, github.com/elementary/settings-system/issues/333);
# - the settings and PRIME tools.
NOT_DRIVER = (
    "*nvidia-container*",
    "nvidia-docker*",
    "nvidia-cuda-*",
    "libnvidia-egl-wayland*",
    "nvidia-settings",
    "nvidia-prime",
)

# dpkg -l: "ii  libnvidia-compute-535:amd64  535.86.05-0ubuntu0.20.04.2  amd64  NVIDIA libcompute package": the
# desired state, the package state and an error flag, then name, version, architecture, description.
_DPKG_LINE = re.compile(
    r"^(?P<status>[a-z][a-z][A-Z ]?)\s+(?P<name>[^\s:]+)(?::(?P<arch>\S+))?\s+(?P<version>\S+)"
    r"\s+(?P<architecture>\S+)(?:\s+(?P<description>.*))?$"
)
# The package states with the package's files on disk: installed, unpacked, half-configured, half-installed,
# triggers awaited or pending (dpkg-query(1), --list).
_ON_DISK = set("iufhwt")
# apt-cache policy <package>: "name:" (unindented), then the version table: " *** 1.2-3 500" (the installed one)
# or "     1.2-2 500", each followed by the package files that offer it, "        500 <index>".
_POLICY_PACKAGE = re.compile(r"^(?P<name>[^\s:]+)(?::\S+)?:$")
_POLICY_VERSION = re.compile(r"^ (?P<mark>\*\*\*| {3}) (?P<version>\S+) (?P<priority>-?[0-9]+)$")
_POLICY_SOURCE = re.compile(r"^ {6,}(?P<priority>-?[0-9]+) (?P<index>\S.*)$")
# apt-cache policy: "Package files:", each " 500 <index>" with "     release v=..,o=..,a=..,l=.." and
# "     origin <host>" below it; the local status file has "release a=now".
_FILES_INDEX = re.compile(r"^ {0,3}(?P<priority>-?[0-9]+) (?P<index>\S.*)$")
_FILES_RELEASE = re.compile(r"^\s+release (?P<fields>.*)$")
# dpkg -S: "pkg[:arch][, pkg...]: /path" for an owned path, "dpkg-query: no path found matching pattern /path"
# (stderr) for one no package owns; "diversion by ... from/to: /path" lines say nothing of the owner.
_OWNED = re.compile(r"^(?P<packages>.+?): (?P<path>/\S*)$")
_NOT_OWNED = re.compile(r"^dpkg-query: no path found matching pattern (?P<path>/\S*)$")
_LIB_VERSION = re.compile(r"/lib(?:nvidia-ml|cuda)\.so\.(?P<version>[0-9]{3}\.[0-9.]+)$")
_BRANCH_PART = re.compile(r"^[0-9]{3}$")
_KERNEL_VERSION = re.compile(r"^[0-9]+\.[0-9]+(?:\.[0-9]+)*$")


def _space(text):
    return " ".join(text.split())


def dpkg_list(output):
    """The package lines of ``dpkg -l`` as ``{package, name, arch, version, status, on_disk}`` (``package``
    without ``:arch``, ``name`` as dpkg prints it; the header and lines of another shape left out)."""
    records = []
    for line in output_lines(output):
        found = _DPKG_LINE.match(line)
        if found is None or found["status"].startswith(("||", "+")):
            continue
        records.append(
            {
                "package": found["name"],
                "arch": found["arch"] or found["architecture"],
                # As dpkg names it: with the architecture where it does (Multi-Arch: same packages).
                "name": f"{found['name']}:{found['arch']}" if found["arch"] else found["name"],
                "version": found["version"],
                "status": found["status"].strip(),
                "on_disk": found["status"][1] in _ON_DISK,
            }
        )
    return records


def apt_policy_installed(output):
    """``{package: {installed, indexes}}`` of ``apt-cache policy <package>...``: the installed version (the
    ``***`` line of the version table, "" without one) and the package files that offer it (their index lines,
    whitespace folded; the local status file among them)."""
    found = {}
    current = None
    in_installed = False
    for line in output_lines(output):
        package = _POLICY_PACKAGE.match(line)
        if package:
            current = found.setdefault(package["name"], {"installed": "", "indexes": []})
            in_installed = False
            continue
        if current is None:
            continue
        version = _POLICY_VERSION.match(line)
        if version:
            in_installed = version["mark"] == "***"
            if in_installed:
                current["installed"] = version["version"]
            continue
        source = _POLICY_SOURCE.match(line)
        if source and in_installed:
            current["indexes"].append(_space(source["index"]))
    return found


def apt_policy_files(output):
    """``{index: release fields}`` of ``apt-cache policy``'s package files (``{"o": "Ubuntu", "a":
    "focal-updates", "l": "Ubuntu", ...}``; the local status file has ``{"a": "now"}``)."""
    files = {}
    index = None
    for line in output_lines(output):
        release = _FILES_RELEASE.match(line)
        if release and index is not None:
            fields = {}
            for part in release["fields"].split(","):
                key, sep, value = part.partition("=")
                if sep:
                    fields[key.strip()] = value.strip()
            files[index] = fields
            continue
        entry = _FILES_INDEX.match(line)
        index = _space(entry["index"]) if entry else None
        if index is not None:
            files.setdefault(index, {})
    return files


def dpkg_owners(output):
    """``{path: [owning packages]}`` of ``dpkg -S <path>...`` (stderr too): ``[]`` for a path no package owns."""
    owners = {}
    for line in output_lines(output):
        line = line.strip()
        not_owned = _NOT_OWNED.match(line)
        if not_owned:
            owners.setdefault(not_owned["path"], [])
            continue
        owned = _OWNED.match(line)
        if owned and not line.startswith("diversion by "):
            packages = [name.strip().split(":")[0] for name in owned["packages"].split(",") if name.strip()]
            owners.setdefault(owned["path"], [])
            owners[owned["path"]] += [name for name in packages if name not in owners[owned["path"]]]
    return owners


def _pattern(pattern):
    """A layout's fnmatch pattern, ``{b}`` any branch, as a regular expression."""
    return re.compile(
        "^"
        + "[0-9]+".join(re.escape(part).replace(r"\*", ".*").replace(r"\?", ".") for part in pattern.split("{b}"))
        + "$"
    )


def _is_driver(name):
    return bool(_DRIVER_NAME.search(name)) and not any(fnmatch.fnmatchcase(name, p) for p in NOT_DRIVER)


def _branch(name, version):
    """The driver branch of a package: its name's three-digit part (not a kernel ABI after a kernel version),
    else its version's three-digit upstream major (Debian's branch-less names); "" for neither."""
    parts = name.split("-")
    for index, part in enumerate(parts):
        if _BRANCH_PART.match(part) and not (index and _KERNEL_VERSION.match(parts[index - 1])):
            return part
    major = re.sub(r"^[0-9]+:", "", version).split(".")[0]
    return major if _BRANCH_PART.match(major) else ""


def _origin_text(fields):
    words = [
        f"origin {fields['o']}" if fields.get("o") else "",
        f"label {fields['l']}" if fields.get("l") and fields.get("l") != fields.get("o") else "",
        f"suite {fields['a']}" if fields.get("a") else "",
    ]
    return ", ".join(word for word in words if word) or "a repository without a Release origin"


class _Judge(object):
    def __init__(
        self,
        sections,
        layouts,
        source,
        branch,
        repository_url,
        fact,
        mode,
        host,
    ):
        if mode not in MODES:
            raise ValueError(f"foreign_driver: mode {mode!r} is none of {', '.join(MODES)}")
        if source not in layouts:
            raise ValueError(f"foreign_driver: source {source!r} has no layout ({', '.join(layouts)})")
        self.sections, self.layouts, self.source, self.branch = sections, layouts, source, str(branch)
        self.mode, self.host, self.fact = mode, host, dict(fact or {})
        url = repository_url or str(layouts[source].get("repository_url", ""))
        self.repository_url = url.rstrip("/")
        self.patterns = {
            name: [_pattern(str(p)) for p in layout.get("pin_patterns", [])] for name, layout in layouts.items()
        }

    # ------------------------------------------------------------------ packages

    def packages(self):
        policy = apt_policy_installed(self.sections.get("policy"))
        files = apt_policy_files(self.sections.get("sources"))
        records = []
        for record in dpkg_list(self.sections.get("dpkg")):
            if not record["on_disk"] or not _is_driver(record["package"]):
                continue
            stanza = policy.get(record["package"], {})
            # The repositories that offer the installed version (not the local status file).
            indexes = [
                index
                for index in stanza.get("indexes", [])
                if files.get(index, {}).get("a") != "now"
                and index.split()[0].startswith(("http:", "https:", "file:", "ftp:", "cdrom:", "copy:"))
            ]
            origins = [
                {"index": index, "url": index.split()[0].rstrip("/"), "fields": files.get(index, {})}
                for index in indexes
            ]
            records.append({**record, "origins": origins, "branch": _branch(record["package"], record["version"])})
        for record in records:
            record["sources"] = [name for name in self.layouts if self._accepts(name, record)]
        return records

    def _accepts(self, source, record):
        """Whether ``source`` builds the package: a name of its layout, or a package of no branch (a dependency
        of its packages that carries the kernel's version or its own: linux-signatures-nvidia-<kernel>,
        glx-alternative-nvidia), from the source's repositories or from none any more."""
        if record["branch"] and not any(pattern.match(record["package"]) for pattern in self.patterns[source]):
            return False
        if not record["origins"]:
            return True
        specs = [str(spec).split("=", 1) for spec in self.layouts[source].get("origins", [])]
        for origin in record["origins"]:
            if any(origin["fields"].get(key) == value for key, value in specs):
                return True
            if source == self.source and self.repository_url and origin["url"] == self.repository_url:
                return True
        return False

    # ------------------------------------------------------------------ runfile

    def runfile(self):
        listed = [line.strip() for line in output_lines(self.sections.get("runfile")) if line.strip()]
        owners = dpkg_owners(self.sections.get("owners"))
        traces = [path for path in listed if path != INSTALLER_LOG and not owners.get(path)]
        versions = [found["version"] for found in map(_LIB_VERSION.search, traces) if found]
        return {
            "found": bool(traces),
            "files": traces,
            "version": versions[0] if versions else "",
            "uninstaller": UNINSTALLER if UNINSTALLER in traces else "",
            "log": INSTALLER_LOG if traces and INSTALLER_LOG in listed else "",
        }

    # ------------------------------------------------------------------ verdict

    def verdict(self):
        records = self.packages()
        own = [r for r in records if self.fact and r["sources"]]
        rest = [r for r in records if r not in own]
        adopted = [
            r for r in rest if self.mode == "adopt" and self.source in r["sources"] and r["branch"] in ("", self.branch)
        ]
        foreign = [r for r in rest if r not in adopted]
        runfile = self.runfile()
        result = {
            "foreign": bool(foreign) or runfile["found"],
            "packages": [
                dict({key: r[key] for key in ("package", "version", "status", "sources")}, origin=self._origin(r))
                for r in foreign
            ],
            "adopted": [r["package"] for r in adopted],
            "own": [r["package"] for r in own],
            "runfile": runfile,
            "remove": [],
            "uninstall": [],
            "stop": False,
            "message": "",
            "notice": "",
        }
        if not result["foreign"]:
            return result
        found = self._found(foreign, runfile)
        if self.mode == "replace" and (not runfile["found"] or runfile["uninstaller"]):
            result["remove"] = [r["name"] for r in foreign]
            result["uninstall"] = [runfile["uninstaller"], *UNINSTALL_ARGS] if runfile["found"] else []
            uninstall = (
                [f"runs {' '.join(result['uninstall'])} (NVIDIA's .run installer's own uninstaller)"]
                if result["uninstall"]
                else []
            )
            purge = (
                [f"purges {', '.join(result['remove'])} (apt also removes what depends on them)"]
                if result["remove"]
                else []
            )
            steps = uninstall + purge
            result["notice"] = (
                f"nvidia_driver on {self.host}: {found}. nvidia_driver_foreign_driver is replace: before it "
                f"installs source '{self.source}', play 2 {' and then '.join(steps)}; the loaded module "
                f"stays until the reboot the new driver needs."
            )
            return result
        result["stop"] = True
        result["message"] = self._message(found, foreign, runfile)
        return result

    def _origin(self, record):
        if not record["origins"]:
            return "offered by no repository of the host (installed from a file, or its repository dropped that build)"
        texts = list(
            dict.fromkeys(
                _origin_text(origin["fields"]) if origin["fields"] else origin["url"] for origin in record["origins"]
            )
        )
        return "; ".join(texts)

    def _found(self, foreign, runfile):
        parts = []
        if foreign:
            groups = {}
            for record in foreign:
                groups.setdefault((record["version"], self._origin(record)), []).append(record["package"])
            parts.append(
                "NVIDIA driver packages gpufleet did not install: "
                + "; ".join(f"{', '.join(names)} {version} ({origin})" for (version, origin), names in groups.items())
            )
        if runfile["found"]:
            version = f" {runfile['version']}" if runfile["version"] else ""
            log = f" (its log: {runfile['log']})" if runfile["log"] else ""
            parts.append(
                f"files of NVIDIA's .run installer{version} that no package owns: {', '.join(runfile['files'])}{log}"
            )
        return "; ".join(parts)

    def _message(self, found, foreign, runfile):
        harm = []
        if foreign:
            harm.append(
                "apt would have to replace those packages: it refuses where they are held, and dpkg stops "
                "mid-install where a package of another name ships the same files"
            )
        if runfile["found"]:
            harm.append(
                "dpkg would overwrite the .run driver's files without a word and leave the rest of it in place "
                "(the libraries and kernel modules of two drivers)"
            )
        how = (
            [f"{UNINSTALLER}" if runfile["uninstaller"] else "the .run installer's --uninstall"]
            if runfile["found"]
            else []
        ) + (["apt-get purge of those packages"] if foreign else [])
        moves = [f"remove it yourself ({' then '.join(how)}; {HOW_TO})"]
        if runfile["found"] and not runfile["uninstaller"]:
            moves.append(
                f"there is no {UNINSTALLER} to remove the .run driver with: run the same release's "
                "installer with --uninstall"
            )
        else:
            moves.append(
                "or set nvidia_driver_foreign_driver: replace (play 2 "
                + ("runs the .run installer's uninstaller, " if runfile["found"] else "")
                + ("purges these packages, " if foreign else "")
                + "then installs)"
            )
        adopt = self._adoption(foreign) if foreign and not runfile["found"] else ""
        if adopt:
            moves.append(adopt)
        mode = {
            "refuse": "",
            "adopt": f" (nvidia_driver_foreign_driver is adopt, which takes over only packages of source "
            f"'{self.source}' and branch {self.branch}, from that source)",
            "replace": f" (nvidia_driver_foreign_driver is replace, which cannot remove a .run driver without "
            f"{UNINSTALLER})",
        }[self.mode]
        return (
            f"nvidia_driver on {self.host}: {found}{mode}. Were source '{self.source}' installed over it, "
            f"{'; '.join(harm)}. Nothing has been changed. The moves: {'; '.join(moves)}."
        )

    def _adoption(self, foreign):
        """The setting that takes the packages over as they are, where one gpufleet source accepts them all."""
        accepting = [name for name in self.layouts if all(name in r["sources"] for r in foreign)]
        branches = sorted({r["branch"] for r in foreign if r["branch"]})
        if not accepting or len(branches) > 1:
            return ""
        # The configured source first; else the one whose own origin (its first) the most packages come from.

        def weight(name):
            first = str((self.layouts[name].get("origins") or ["="])[0]).split("=", 1)
            hits = sum(any(o["fields"].get(first[0]) == first[-1] for o in r["origins"]) for r in foreign)
            return (name == self.source, hits)

        chosen = max(accepting, key=weight)
        branch = branches[0] if branches else self.branch
        settings = ([] if chosen == self.source else [f"nvidia_driver_source: {chosen}"]) + (
            [] if branch == self.branch else [f'nvidia_driver_branch: "{branch}"']
        )
        return (
            f"or, as they are source '{chosen}''s packages of branch {branch}, take them over as they are: "
            + ", ".join(settings + ["nvidia_driver_foreign_driver: adopt"])
        )


def foreign_driver(
    sections,
    layouts,
    source,
    branch,
    repository_url="",
    fact=None,
    mode="refuse",
    host="",
):
    """The judgement of what the probe found (foreign_driver.yml)."""
    if not isinstance(sections, Mapping):
        raise ValueError("foreign_driver: expects the probe's sections (gpufleet.fleet.sections)")
    return _Judge(
        sections, layouts, str(source), str(branch), str(repository_url or ""), fact or {}, str(mode), str(host)
    ).verdict()


# --------------------------------------------------------------------------- the driver stack


def _common(first, second):
    """The members of ``first`` that are in ``second``, each once, in ``first``'s order (Ansible's intersect)."""
    return _unique(name for name in first if name in second)


def _unique(names):
    return list(dict.fromkeys(names))


def stack_facts(listing, held, packages, versioned_packages, support_packages, version):
    """The stack facts of roles/nvidia_driver/tasks/stack.yml, from driver_stack.py's listing (``{stack,
    replaced}``) and the held packages (``apt-mark showhold``):

    * ``held_dependencies``: the held packages of the stack the role does not name; they move with the driver
      (named wherever the version changes);
    * ``releasable``: the holds the install lifts (its own stack, the branch it replaces, the packages it names
      with the driver's version); every other hold stays, and the simulations keep it too;
    * ``transaction``: what the install asks apt for: the support packages, then the driver's packages and held
      dependencies at the release (``name=<release>-*``: the first build offered; without a release, apt's
      candidate), then the other named packages as they are (the signed modules' flavour metapackages).
    """
    stack, replaced = list(listing.get("stack", [])), list(listing.get("replaced", []))
    held = list(held)
    dependencies = [name for name in _common(stack, held) if name not in packages]
    suffix = "={0}-*".format(version) if version else ""
    return {
        "installed_stack": stack,
        "replaced_stack": replaced,
        "held": held,
        "held_dependencies": dependencies,
        "releasable": _common(stack + replaced + list(versioned_packages), held),
        "transaction": list(support_packages)
        + [name + suffix for name in list(versioned_packages) + dependencies]
        + _unique(name for name in packages if name not in versioned_packages),
    }
