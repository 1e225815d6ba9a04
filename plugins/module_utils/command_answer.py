# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A command's run on a host as ansible.builtin.command reports it (rc, stdout, stdout_lines, stderr), for the
modules that report the commands they ran: apt_trial, venv_facts; and a command's output read as its lines, for
the parsers that take either its stdout or its stdout_lines (apt_source, driver_facts, the filters)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


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
