"""A connection that refuses everything: the unit tests' role runs never touch a host, this machine included."""

from __future__ import annotations

DOCUMENTATION = """
    name: gpufleet_no_host
    short_description: refuse every command, file transfer and connection
    description:
        - The connection of the fake hosts in tests/unit/role_run.py. Actions that run on the controller alone
          (set_fact, fail, assert, debug, include_vars, include_role, lookups) work; a task that would run a module
          or a command on the host (command, shell, stat, apt, template's copy, ...) fails instead of running on
          this machine.
    author: gpufleet
    options: {}
"""

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.connection import ConnectionBase


class Connection(ConnectionBase):
    """Refuses to connect: the fake hosts of the unit tests have no machine behind them."""

    transport = "gpufleet_no_host"
    has_pipelining = False

    def _refuse(self, what: str):
        raise AnsibleConnectionFailure(
            f"gpufleet unit test: {self._play_context.remote_addr or 'this fake host'} has no machine behind it; "
            f"the task tried to {what} (only controller-side tasks may run here)"
        )

    def _connect(self):
        self._refuse("connect")

    def exec_command(self, cmd, in_data=None, sudoable=True):
        self._refuse(f"run a command: {cmd[:200]}")

    def put_file(self, in_path, out_path):
        self._refuse(f"copy a file to {out_path}")

    def fetch_file(self, in_path, out_path):
        self._refuse(f"fetch {in_path}")

    def close(self):
        self._connected = False
