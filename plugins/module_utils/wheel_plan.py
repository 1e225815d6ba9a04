"""Play 1's wheel plan judged: the output of roles/pytorch/files/pytorch_wheel_plan.py (pip --dry-run on the node,
then a HEAD per file), worded as problems and warnings that name the host, the file, the requirement that needs it
and the fix.

Controller-side: the action gpufleet.fleet.wheel_plan judges with ``wheel_plan`` after it ran the script on the
node; the filter of the same name (plugins/filter/gpufleet_filters.py) is this function.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_SPACE = re.compile(r"\s+")

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


def script_output(result: Any) -> Mapping[str, Any] | None:
    """The plan script's JSON line from its registered result (ansible.builtin.command's), None where it did not run
    to its end (rc, no JSON)."""
    result = result if isinstance(result, Mapping) else {}
    lines = [line for line in str(result.get("stdout") or "").splitlines() if line.strip()]
    try:
        out = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return out if result.get("rc") == 0 and isinstance(out, Mapping) else None


def wheel_plan(result: Any, context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Judge a node's wheel plan: the registered result of pytorch_wheel_plan.py (wheel_plan.yml)."""
    context = context or {}
    plan: dict[str, Any] = {"problems": [], "warnings": [], "files": [], "hosts": [], "summary": ""}
    # The host whose pip resolved the set, where another host of the same interpreter and platform did (the action
    # gpufleet.fleet.wheel_plan resolves once per such group); '' where this host did.
    plan["resolved_on"] = str(context.get("resolved_on") or "")
    result = result if isinstance(result, Mapping) else {}
    out = script_output(result)
    if out is None:
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


def refusal(plan: Mapping[str, Any], host: str) -> str:
    """The message that stops ``host`` when the install cannot fetch every wheel of ``plan`` (its problems, each
    numbered), '' when it can."""
    if not plan["problems"]:
        return ""
    where = (
        f"on {plan['resolved_on']} (a host of the same interpreter and platform)"
        if plan.get("resolved_on")
        else "on this host"
    )
    return (
        f"pytorch on {host}: pip resolved the pinned wheel set {where}, and the install cannot fetch all of it "
        "(nothing has been changed): "
        + "; ".join(f"[{number}] {problem}" for number, problem in enumerate(plan["problems"], 1))
    )
