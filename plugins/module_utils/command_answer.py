# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A command's run on a host as ansible.builtin.command reports it (rc, stdout, stdout_lines, stderr), for the
modules that report the commands they ran: apt_trial, venv_facts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def command_answer(rc, out, err):
    """The result of ``module.run_command``: ``command_answer(*module.run_command(argv))``."""
    return {"rc": rc, "stdout": out, "stdout_lines": out.splitlines(), "stderr": err}
