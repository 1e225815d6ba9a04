# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rules of one apt source per repository, and the reading of an apt source's trial.

Shared by the filters (plugins/filter/gpufleet_filters.py wraps each public function, a ValueError becoming the
filter's error) and the module gpufleet.fleet.apt_trial, which runs on the host (so this file keeps to Python 3.8
and the standard library):

* ``apt_source_files``: the one source file (and keyring) of a repository, named after its URL;
* ``apt_source_plan``: the files entry point main removes before it writes a source;
* ``apt_source_conflict``: why a role's claim on a repository cannot share its file with another role's;
* ``apt_stanzas``: package stanzas of ``apt-cache show`` text;
* ``trial_arguments``: the module's arguments for entry point trial, from the source and the entry point's inputs
  (the action gpufleet.fleet.apt_source_trial, on the controller);
* ``trial_fact``: the fact ``apt_source_trial`` from what the host answered (apt_source's entry point trial).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
from collections.abc import Mapping

from ansible_collections.gpufleet.fleet.plugins.module_utils.command_answer import output_lines

APT_SOURCES_DIR = "/etc/apt/sources.list.d"
APT_KEYRINGS_DIR = "/etc/apt/keyrings"
# Linux's NAME_MAX, less "gpufleet-" and ".sources".
_APT_NAME_MAX = 255 - len("gpufleet-") - len(".sources")
_APT_NAME_KEEP = re.compile(r"[A-Za-z0-9.]")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?://(?P<authority>[^/]*))?(?P<path>.*)$")
_SPACE = re.compile(r"\s+")


def _as_list(value):
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


# --------------------------------------------------------------------------- one apt source per repository


def apt_source_key(url):
    """The repository as apt tells repositories apart: no scheme, no user and password, no trailing slash."""
    match = _URL.match(str(url or "").strip())
    if not match:
        raise ValueError("apt_source_files: %r is not a URL (scheme://host/path)" % (url,))
    authority = (match.group("authority") or "").rpartition("@")[2]
    key = authority + match.group("path").rstrip("/")
    if not key.strip("/"):
        raise ValueError("apt_source_files: %r names no repository" % (url,))
    return key


def _apt_file_name(key):
    """``key`` in the characters of an apt file name, one to one: / as _, - as --, any other byte as -XX."""
    out = []
    for char in key:
        if _APT_NAME_KEEP.match(char):
            out.append(char)
        elif char == "/":
            out.append("_")
        elif char == "-":
            out.append("--")
        else:
            out.extend("-%02x" % byte for byte in bytearray(char.encode("utf-8")))
    return "".join(out)


def apt_source_files(url):
    """The files of the one apt source of the repository at ``url`` (plugins/filter/apt_source_files.yml)."""
    key = apt_source_key(url)
    name = _apt_file_name(key)
    if len(name) > _APT_NAME_MAX:
        raise ValueError(
            "apt_source_files: the repository URL %s is too long to name its apt source file "
            "(%d characters, at most %d): use a shorter URL (a mirror's)" % (url, len(name), _APT_NAME_MAX)
        )
    return {
        "key": key,
        "name": name,
        "sources_file": "%s/gpufleet-%s.sources" % (APT_SOURCES_DIR, name),
        "keyring_file": "%s/gpufleet-%s.asc" % (APT_KEYRINGS_DIR, name),
    }


def _same_repository(url, key):
    try:
        return apt_source_key(url) == key
    except ValueError:
        return False


def apt_source_plan(probe, name, url):
    """What entry point main removes before it writes the source of ``url`` for ``name`` (apt_source_plan.yml).

    ``probe`` is the output of the role's files/apt-source-files.sh (a string or its lines).
    """
    repository = apt_source_files(url)
    target, name = repository["sources_file"], str(name)
    records = {}
    sources = {}
    for line in output_lines(probe):
        kind, _tab, rest = line.partition("\t")
        first, _tab, second = rest.partition("\t")
        if kind == "record" and first:
            records[first] = second.strip()
        elif kind == "source" and first:
            # The URIs field: the first URI (gpufleet writes one).
            sources[first] = (second.split() or [""])[0]
    remove = set(path for path, uri in sources.items() if path != target and _same_repository(uri, repository["key"]))
    legacy = "%s/gpufleet-%s.sources" % (APT_SOURCES_DIR, name)
    previous = records.get(name) or (legacy if legacy in sources else "")
    others = set(path for user, path in records.items() if user != name)
    if previous and previous != target and previous not in others:
        remove.add(previous)
    return {"sources_file": target, "remove": sorted(remove)}


# The parts of a source that must be alike for two roles to share its one file: (field, how messages call it).
_APT_SOURCE_PARTS = (
    ("url", "URL"),
    ("suites", "Suites"),
    ("components", "Components"),
    ("architectures", "Architectures"),
    ("keyring", "Signed-By"),
    ("key_url", "key URL"),
)


def _apt_source_part(claim, field):
    value = claim.get(field)
    if field == "url":
        return str(value or "").strip().rstrip("/")
    if isinstance(value, (list, tuple)):
        return [str(item) for item in value]
    return "" if value is None else str(value)


def _apt_source_shown(value):
    if isinstance(value, list):
        return " ".join(value) or "none"
    return value or "none"


def _apt_source_setting(claim, field):
    """`` (<the settings behind the part>)``, or `` (not a setting)`` where the role fixes it."""
    named = str((claim.get("settings") or {}).get(field) or "")
    return " (%s)" % named if named else " (not a setting)"


def apt_source_conflict(claim, claims, host=""):
    """Why ``claim`` cannot share its repository's source file with another role's claim; "" when it can."""
    key = apt_source_files(claim.get("url"))["key"]
    for other in _as_list(claims):
        if not isinstance(other, Mapping) or other.get("name") == claim.get("name"):
            continue
        if not _same_repository(other.get("url"), key):
            continue
        differ = [
            (field, label)
            for field, label in _APT_SOURCE_PARTS
            if _apt_source_part(claim, field) != _apt_source_part(other, field)
        ]
        if not differ:
            continue
        mine, theirs = claim.get("caller", "?"), other.get("caller", "?")
        parts = "; ".join(
            "%s %s%s for %s, %s%s for %s"
            % (
                label,
                _apt_source_shown(_apt_source_part(claim, field)),
                _apt_source_setting(claim, field),
                mine,
                _apt_source_shown(_apt_source_part(other, field)),
                _apt_source_setting(other, field),
                theirs,
            )
            for field, label in differ
        )
        url, other_url = _apt_source_part(claim, "url"), _apt_source_part(other, "url")
        also = ", at %s" % other_url if other_url != url else ""
        at = " on %s" % host if host else ""
        return (
            "%s%s: %s %s is the repository of %s too (%s%s): apt reads one source per repository (%s, written for "
            "both), and the two roles give it differently: %s. Give both roles the same %s for this repository, or "
            "give each its own repository URL. Nothing has been changed."
            % (
                mine,
                at,
                claim.get("description", "its repository"),
                url,
                theirs,
                other.get("description", "its repository"),
                also,
                apt_source_files(url)["sources_file"],
                parts,
                ", ".join(label for _field, label in differ),
            )
        )
    return ""


def claimed(claim, claims):
    """The run's claims with ``claim`` in place of its user's earlier one (apt_source_trial.claims)."""
    return [other for other in _as_list(claims) if other.get("name") != claim.get("name")] + [claim]


# --------------------------------------------------------------------------- package stanzas

# deb822 control data (Debian Policy 5.1): "Field: value" lines, continuation lines start with a space or a tab.
_FIELD = re.compile(r"^(?P<field>[!-9;-~][!-9;-~]*):\s?(?P<value>.*)$")
RELATION_FIELDS = ("Depends", "Pre-Depends", "Recommends", "Suggests", "Provides", "Conflicts", "Breaks", "Replaces")
# One alternative of a relationship field (Debian Policy 7.1): name[:arch] [(op version)] [[archs]] [<profiles>].
_RELATION = re.compile(
    r"^(?P<name>[^\s:(\[<|,]+)(?::\S+?)?\s*"
    r"(?:\(\s*(?P<relation><<|<=|>=|>>|=|<|>)\s*(?P<version>[^\s)]+)\s*\))?\s*"
    r"(?:\[[^\]]*\]\s*)?(?:<[^>]*>\s*)*$"
)


def apt_relations(value):
    """A relationship field as alternative groups ``[[{name, relation, version}, ...], ...]``."""
    groups = []
    for entry in _SPACE.sub(" ", str(value or "")).split(","):
        alternatives = []
        for alternative in entry.split("|"):
            found = _RELATION.match(alternative.strip())
            if alternative.strip() and found is None:
                raise ValueError("apt_relations: not a package relation: %r" % (alternative.strip(),))
            if found is not None:
                alternatives.append(
                    {
                        "name": found.group("name"),
                        "relation": found.group("relation") or "",
                        "version": found.group("version") or "",
                    }
                )
        if alternatives:
            groups.append(alternatives)
    return groups


def apt_stanzas(text):
    """The package stanzas of ``apt-cache show`` / ``Packages`` text, fields parsed as apt_stanzas.yml says."""
    stanzas = []
    fields = {}
    last = None
    for line in str(text or "").replace("\r\n", "\n").split("\n") + [""]:
        if not line.strip():
            if fields.get("Package"):
                stanzas.append(_stanza(fields))
            fields, last = {}, None
        elif line[0] in " \t":
            if last is not None:
                fields[last] += "\n" + line.strip()
        else:
            found = _FIELD.match(line)
            # Other lines (apt's "N: ..." notes have a value too, but no stanza then has a Package) are skipped.
            last = found.group("field") if found else None
            if found:
                fields[last] = found.group("value").strip()
    return stanzas


def _stanza(fields):
    """One stanza's fields, with Description, Source and the relationship fields as apt_stanzas describes."""
    stanza = dict(fields)
    # apt-cache show prints "Description-en" where the archive ships translated descriptions (Ubuntu).
    stanza["Description"] = (fields.get("Description") or fields.get("Description-en", "")).split("\n", 1)[0]
    # "Source: name (version)" when the binary's version differs from the source's (Debian Policy 5.6.1).
    stanza["Source"] = (fields.get("Source") or fields["Package"]).split(" ", 1)[0]
    for field in RELATION_FIELDS:
        stanza[field] = apt_relations(fields.get(field, ""))
    return stanza


# --------------------------------------------------------------------------- the trial's fact

_SIMULATION = "[simulation]\n"
_STANZAS = "[stanzas]"


def _reason(asked, keyring):
    """Why the source is not usable (the keyring, the repository's or key's HTTP answer, apt's lines); "" if it is."""
    trial, repository, key = asked["trial"], asked["repository"], asked["key"]
    if not asked["keyring_exists"]:
        return "no file " + keyring
    for answer in (repository, key):
        if answer.get("status", 200) != 200:
            return ("HTTP %s %s" % (answer["status"], answer.get("msg", ""))).strip()
    if "rc" in trial and trial["rc"] != 0:
        apt_lines = " ".join(line for line in trial.get("stdout_lines", []) if re.match(r"^(E|W):", line))
        return apt_lines or "exit %s" % trial["rc"]
    return ""


def _problem(asked, source, reason):
    """The sentence that says why the source is not usable, with what to do."""
    url, description = source["url"], source["description"]
    url_name = " (%s)" % source["url_name"] if source["url_name"] else ""
    if not asked["keyring_exists"]:
        return "%s %s does not exist on the host: install the key that signs %s there, or give its URL instead" % (
            source["keyring_name"] or "the keyring",
            source["keyring"],
            url,
        )
    if asked["repository"].get("status", 200) != 200:
        return (
            "%s %s%s is not usable from this host: %s answered %s. Check the URL (the repository root: the directory "
            "above dists/, or the directory of a flat repository) and that this host can reach it."
            % (description, url, url_name, asked["repository"].get("url", url), reason)
        )
    if asked["key"].get("status", 200) != 200:
        return "the key %s that signs %s %s is not usable from this host: %s" % (
            source["key_url"],
            description,
            url,
            reason,
        )
    signer = source["key_url"] or source["keyring_deb_url"] or source["keyring"]
    return "apt rejects %s %s%s signed by %s: %s" % (description, url, url_name, signer, reason)


def trial_arguments(source, inputs, host):
    """The arguments of the module apt_trial for apt_source's entry point trial, but for the texts read from the
    role's files (sources_text, script, plan_script and the environment's TRIAL_PREFERENCES: the action
    gpufleet.fleet.apt_source_trial renders and reads those).

    ``source``: the source as the role's variables give it from apt_source_repository (caller, name, description,
    url, suites, components, architectures, keyring, key_url, keyring_deb_url, managed) and its paths
    (sources_file, records_dir, preferences_dir); ``inputs``: the entry point's other inputs (package, version,
    version_name, url_name, keyring_name, setting_names, show_packages, simulate_packages, simulate_release,
    simulate_pins); ``host``: the inventory name the messages give.
    """
    url = re.sub(r"/+$", "", source["url"])
    suites = source["suites"]
    if not suites:
        raise ValueError(
            'apt_source: %s gives the source %s no suites (apt_source_repository.suites); a flat repository has ["/"]'
            % (source["caller"], source["url"])
        )
    version = inputs["version"]
    return {
        "sources_file": source["sources_file"],
        "managed": source["managed"],
        "package": inputs["package"],
        # An offered version is the one asked for when it is equal to it, or when the version asked for is its
        # upstream part (535.261.03 is 535.261.03-1~deb12u1); an epoch is ignored.
        "version_regex": "^([0-9]+:)?%s(-[^-]*)?$" % re.escape(version) if version else "",
        "keyring": source["keyring"],
        # Signed by a key fetched or a keyring package unpacked, else by a keyring on the host.
        "look_for_keyring": not source["key_url"] and not source["keyring_deb_url"],
        # A flat repository (suites ["/"]) has its Release file at its root.
        "release_url": url + ("/Release" if suites == ["/"] else "/dists/%s/Release" % suites[0]),
        "key_url": source["key_url"],
        "records_dir": source["records_dir"],
        "show_packages": inputs["show_packages"],
        "source": {
            "name": source["name"],
            "caller": source["caller"],
            "description": source["description"],
            "url": source["url"],
            "url_name": inputs["url_name"],
            "keyring_name": inputs["keyring_name"],
            "keyring_deb_url": source["keyring_deb_url"],
            "version": version,
            "version_name": inputs["version_name"],
            "host": host,
        },
        # What another role must give alike to share the repository's one source file (apt_source_conflict).
        "claim": {
            "name": source["name"],
            "caller": source["caller"],
            "description": source["description"],
            "url": url,
            "suites": suites,
            "components": source["components"],
            "architectures": source["architectures"],
            "keyring": source["keyring"],
            "key_url": source["key_url"],
            "settings": inputs["setting_names"],
        },
        "environment": {
            "TRIAL_SHOW_VERSION": re.sub(r"^[0-9]+:", "", version),
            "TRIAL_SIMULATE": " ".join(inputs["simulate_packages"]),
            "TRIAL_RELEASE": " ".join(inputs["simulate_release"]),
            # The host's own files of the pins simulated, which TRIAL_PREFERENCES stands in for.
            "TRIAL_OWN_PREFERENCES": " ".join(
                "%s/gpufleet-%s.pref" % (source["preferences_dir"], pin["name"]) for pin in inputs["simulate_pins"]
            ),
        },
    }


def trial_fact(asked, source):
    """The fact apt_source_trial (roles/apt_source/meta/argument_specs.yml, entry point trial) from ``asked``.

    ``asked`` is what the host answered (the module's installed, converged, keyring_exists, repository, key, trial,
    madison and shown); ``source`` holds the source's inputs: name, url, caller, description, url_name, keyring,
    keyring_name, key_url, keyring_deb_url, package, version, version_name, version_regex (the versions that count
    as ``version``), show_packages, managed and host (for the message).
    """
    version, regex = source["version"], source["version_regex"]
    tried = "rc" in asked["trial"]
    reason = _reason(asked, source["keyring"])
    raw = (asked["trial"] if tried else asked["madison"]).get("stdout", "")
    text, _mark, simulation = raw.partition(_SIMULATION)
    output = text.splitlines()
    # The trial's madison lines, then (below "[stanzas]") the stanzas of the packages to show.
    madison = output[: output.index(_STANZAS)] if _STANZAS in output else output
    shown = text.split(_STANZAS, 1)[1] if _STANZAS in output else asked["shown"].get("stdout", "")
    show = source["show_packages"]
    stanzas = [
        stanza
        for stanza in apt_stanzas(shown)
        if stanza["Package"] in show and re.match(regex if version else "", stanza.get("Version", ""))
    ]
    # madison: "<package> | <version> | <URL> <suite/component> <arch> Packages". A source the role writes counts
    # only with its own URL (the host may have others); the host's own source (managed false) with any.
    own = r"^[^|]+\|[^|]+\|\s*" + re.escape(source["url"].rstrip("/")) + r"/?(\s|$)" if source["managed"] else r" \| "
    offered = []
    for line in madison:
        if re.search(r" \| ", line) and re.search(own, line):
            offer = line.split("|")[1].strip()
            if offer not in offered:
                offered.append(offer)
    matching = [offer for offer in offered if re.match(regex, offer)]
    installed = asked["installed"]
    if not version:
        build = ""
    elif matching:
        build = matching[0]
    else:
        build = installed if re.match(regex, installed) else ""
    # A converged host has the version installed: its package lists need not offer it any more.
    found = not version or asked["converged"] or bool(matching)
    if reason:
        message = "%s on %s: %s" % (source["caller"], source["host"], _problem(asked, source, reason))
    elif not found:
        message = "%s on %s: %s %s is not in %s; %s is offered at %s" % (
            source["caller"],
            source["host"],
            source["version_name"] or source["package"],
            version,
            source["url"],
            source["package"],
            ", ".join(offered) or "no version",
        )
    else:
        message = ""
    return {
        "name": source["name"],
        "url": source["url"],
        "tried": tried,
        "converged": asked["converged"],
        "ok": not reason,
        "reason": reason,
        "offered": offered,
        "version": version,
        "build": build,
        "found": found,
        "installed": installed,
        "stanzas": stanzas,
        # apt-get -s's output and "[simulation exit N]" (gpufleet.fleet.apt_simulation reads it); empty when none ran.
        "simulation": simulation,
        "message": message,
    }
