"""The end of a run says how it went: the verdict per play, the failed hosts with their reason, the reports.

After thousands of lines of task output, a platform engineer needs three
things: which plays went through, which hosts stopped and why (one line
each, the first line of the message that stopped them), and where the run's
reports are. This notification callback prints them last, as plain text, so
that a terminal and a CI log read the same::

    GPUFLEET SUMMARY
    Check hosts and settings (read-only): 3 ok
    Install the driver, the CUDA stack and PyTorch: 2 ok, 1 failed
    Verify the GPU nodes (read-only): not run (no host left)
    failed: gpufleet-node-3 (Install the NVIDIA driver packages): the package source http://... did not answer
    report verify: /srv/gpufleet/reports/verify/fleet-report.md (verdict: pass)

Reports are announced by the roles that write them, with ``set_stats``
(``gpufleet_reports: {verify: <path of the Markdown report>}``); the verdict
is read from the JSON beside it. A play that never started says so, so that a
report from an earlier run is never taken for this run's.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: summary
type: notification
author: gpufleet maintainers (@gpufleet)
short_description: A plain summary at the end of a gpufleet run (plays, failed hosts, reports)
description:
  - Prints, after the recap, one line per play of the playbook (hosts ok and failed, or that it did not run),
    one line per host that stopped (the task and the first line of its message) and the reports the run wrote.
requirements:
  - enable in configuration (callbacks_enabled)
"""

import json
from pathlib import Path

from ansible.plugins.callback import CallbackBase

# The JSON beside each announced report, whose "verdict" the summary shows.
VERDICT_FILES = {"verify": "fleet-report.json", "smoke": None}


def first_line(text: str, width: int = 220) -> str:
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def verdict_of(kind: str, path: str) -> str:
    """The verdict in the report's JSON (the report itself for smoke-result.json), or ''."""
    report = Path(path)
    name = VERDICT_FILES.get(kind)
    source = report.with_name(name) if name else report
    try:
        return str(json.loads(source.read_text()).get("verdict", ""))
    except (OSError, ValueError, AttributeError):
        return ""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "gpufleet.fleet.summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plays: list[str] = []  # every play of the playbook, in order
        self.started: list[str] = []
        self.hosts: dict[str, set[str]] = {}  # play -> hosts with a result
        self.stopped: dict[str, dict[str, tuple[str, str, str]]] = {}  # play -> host -> (kind, task, message)
        self.rescued: dict[str, dict[str, list[str]]] = {}  # play -> host -> messages of failures it went on from
        self._play = ""

    # --- events -------------------------------------------------------------

    def v2_playbook_on_start(self, playbook):
        self.plays += [play.get_name().strip() for play in playbook.get_plays()]

    def v2_playbook_on_play_start(self, play):
        self._play = play.get_name().strip()
        self.started.append(self._play)
        self.hosts.setdefault(self._play, set())
        self.stopped.setdefault(self._play, {})

    def _seen(self, result) -> str:
        host = result._host.get_name()
        self.hosts.setdefault(self._play, set()).add(host)
        return host

    def _ran(self, result, *args, **kwargs):
        # A host that goes on after a failure was rescued: the failure is a
        # reason, shown if the host stops later in the play (play 1 rescues
        # each role's rejection and then stops the host once).
        host = self._seen(result)
        stopped = self.stopped.get(self._play, {}).pop(host, None)
        if stopped:
            self.rescued.setdefault(self._play, {}).setdefault(host, []).append(stopped[2])

    v2_runner_on_ok = _ran
    v2_runner_on_skipped = _ran

    def v2_runner_on_failed(self, result, ignore_errors=False):
        host = self._seen(result)
        if not ignore_errors:
            message = result._result.get("msg") or result._result.get("stderr") or "failed"
            self.stopped.setdefault(self._play, {})[host] = (
                "failed",
                result._task.get_name().strip(),
                first_line(message),
            )

    def v2_runner_on_unreachable(self, result):
        host = self._seen(result)
        if getattr(result._task, "ignore_unreachable", False):
            return  # the task goes on without that answer (a delegated probe of another host)
        message = result._result.get("msg") or "no answer"
        self.stopped.setdefault(self._play, {})[host] = (
            "unreachable",
            result._task.get_name().strip(),
            first_line(message),
        )

    def v2_playbook_on_stats(self, stats):
        for line in self.summary_lines(stats.custom.get("_run", {}) if hasattr(stats, "custom") else {}):
            self._display.display(line)

    # --- the summary --------------------------------------------------------

    def summary_lines(self, custom: dict) -> list[str]:
        lines = ["", "GPUFLEET SUMMARY"]
        for play in dict.fromkeys(self.plays or self.started):
            if play not in self.started:
                lines.append(f"{play}: not run (no host left, or the run stopped before it)")
                continue
            hosts = self.hosts.get(play, set())
            stopped = self.stopped.get(play, {})
            kinds = [kind for kind, _task, _message in stopped.values()]
            parts = [f"{len(hosts) - len(stopped)} ok"]
            parts += [f"{kinds.count(kind)} {kind}" for kind in ("failed", "unreachable") if kinds.count(kind)]
            lines.append(f"{play}: " + (", ".join(parts) if hosts else "no host matched"))
        reported = set()
        for play in self.started:
            for host, (kind, task, message) in sorted(self.stopped.get(play, {}).items()):
                if (host, message) not in reported:
                    reported.add((host, message))
                    lines.append(f"{kind}: {host} ({task}): {message}")
                    lines += [f"  because: {reason}" for reason in self.rescued.get(play, {}).get(host, [])]
        for kind, path in sorted((custom.get("gpufleet_reports") or {}).items()):
            verdict = verdict_of(kind, path)
            lines.append(f"report {kind}: {path}" + (f" (verdict: {verdict})" if verdict else ""))
        return lines
