# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A command's run on a host as ansible.builtin.command reports it (rc, stdout, stdout_lines, stderr), for the
modules that report the commands they ran: apt_trial, venv_facts; a command's output read as its lines, for the
parsers that take either its stdout or its stdout_lines (apt_source, driver_facts, the filters); and an apt command
run again while another apt is at work on the host (host_facts' index refresh, apt_trial's questions to the host's
own apt)."""

from __future__ import absolute_import, division, print_function

import re
import time

__metaclass__ = type

# apt while another apt holds its lock: "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 509
# (apt-get)" (apt 2.6, Debian 12), "E: Could not get lock /var/lib/dpkg/lock-frontend - open (11: Resource
# temporarily unavailable)" (older apt).
# Another apt at work on the same host: it holds the lock, or it replaced the package cache (/var/cache/apt/*.bin,
# which apt rebuilds without a lock) while this one was writing or reading it. Both pass: wait, then try again.
APT_BUSY = re.compile(r"Could not get lock |Unable to lock directory |Problem renaming the file /var/cache/apt/")
# How long an apt command waits for another apt, as ansible.builtin.apt's lock_timeout (its default).
APT_BUSY_TIMEOUT_S = 60


def command_answer(rc, out, err):
    """The result of ``module.run_command``: ``command_answer(*module.run_command(argv))``."""
    return {"rc": rc, "stdout": out, "stdout_lines": out.splitlines(), "stderr": err}


def output_lines(output):
    """A command's output as its lines: stdout (a string) split into lines, stdout_lines (a list) as strings; none
    for None."""
    if output is None:
        return []
    if isinstance(output, str):
        return output.splitlines()
    return [str(line) for line in output]


def apt_busy(text):
    """True when apt's words say that another apt holds the lock it needs, or rebuilt the package cache at the same
    moment (wait, then try again)."""
    return APT_BUSY.search(text or "") is not None


def run_apt(module, argv, environ_update=None, timeout_s=APT_BUSY_TIMEOUT_S, sleep=time.sleep):
    """``module.run_command(argv)`` for an apt command, run again, a second apart, while another apt is at work on
    the host (apt_busy), for up to ``timeout_s``; its last (rc, stdout, stderr)."""
    deadline = time.time() + timeout_s
    while True:
        rc, out, err = module.run_command(argv, environ_update=environ_update)
        if rc == 0 or not apt_busy(out + err) or time.time() >= deadline:
            return rc, out, err
        sleep(1)
