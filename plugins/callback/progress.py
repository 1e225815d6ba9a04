"""A line every so often while a task runs long: what runs, on which hosts, for how long.

A DKMS build, a large download or a wheel install can keep one task busy for
minutes, and Ansible prints nothing until it ends: a new user cannot tell work
from a hang. This notification callback watches the running task from a
timer thread and, once it has run ``interval`` seconds, prints one plain line
per interval until the last host answers::

    ... 1m00s: Install the NVIDIA driver packages still running on gpufleet-node-1, gpufleet-node-2

A run whose tasks are all quick (a re-run with changed=0) prints nothing, so
its output stays the same. Enable it in ansible.cfg (gpufleet's does)::

    [defaults]
    callbacks_enabled = gpufleet.fleet.progress
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: progress
type: notification
author: gpufleet maintainers (@gpufleet)
short_description: Print a progress line while a task runs longer than an interval
description:
  - >-
    Prints a line (elapsed time, the task, the hosts it still runs on) every O(interval) seconds while a task has
    hosts that have not answered, starting once the task has run that long. Quick tasks print nothing.
requirements:
  - enable in configuration (callbacks_enabled)
options:
  interval:
    description: Seconds between progress lines (and before the first).
    type: float
    default: 30
    env:
      - name: GPUFLEET_PROGRESS_INTERVAL
    ini:
      - section: callback_gpufleet_progress
        key: interval
  max_hosts:
    description: Hosts named in one line; the rest are counted.
    type: int
    default: 6
    env:
      - name: GPUFLEET_PROGRESS_MAX_HOSTS
    ini:
      - section: callback_gpufleet_progress
        key: max_hosts
"""

import threading
import time

from ansible.plugins.callback import CallbackBase


def elapsed_text(seconds: float) -> str:
    """75 -> 1m15s, 3600 -> 1h00m00s, 9 -> 9s."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_line(task: str, hosts: list[str], seconds: float, max_hosts: int = 6) -> str:
    named = sorted(hosts)
    shown = ", ".join(named[:max_hosts]) + (f" and {len(named) - max_hosts} more" if len(named) > max_hosts else "")
    return f"... {elapsed_text(seconds)}: {task} still running on {shown}"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "gpufleet.fleet.progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, clock=time.monotonic, **kwargs):
        super().__init__(*args, **kwargs)
        self._clock = clock
        self._lock = threading.Lock()
        self._task = ""
        self._started = 0.0
        self._next = 0.0
        self._pending: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the task being watched -------------------------------------------

    def _begin(self, name: str) -> None:
        with self._lock:
            self._task = name
            self._started = self._clock()
            self._next = self._started + float(self.get_option("interval"))
            self._pending = set()

    def _answered(self, host) -> None:
        with self._lock:
            self._pending.discard(host.get_name())

    def tick(self) -> str | None:
        """The line due now, if any (the timer thread calls this every second)."""
        with self._lock:
            now = self._clock()
            if not self._pending or now < self._next:
                return None
            interval = float(self.get_option("interval"))
            self._next = now + interval
            return progress_line(
                self._task, list(self._pending), now - self._started, int(self.get_option("max_hosts"))
            )

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            line = self.tick()
            if line:
                self._display.display(line)

    # --- Ansible's events -------------------------------------------------

    def v2_playbook_on_start(self, playbook):
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="gpufleet-progress", daemon=True)
            self._thread.start()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._begin(task.get_name().strip())

    def v2_playbook_on_handler_task_start(self, task):
        self._begin(task.get_name().strip())

    def v2_runner_on_start(self, host, task):
        with self._lock:
            self._pending.add(host.get_name())

    def v2_runner_on_ok(self, result):
        self._answered(result._host)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._answered(result._host)

    def v2_runner_on_skipped(self, result):
        self._answered(result._host)

    def v2_runner_on_unreachable(self, result):
        self._answered(result._host)

    def v2_playbook_on_stats(self, stats):
        self._stop.set()
        with self._lock:
            self._pending = set()
