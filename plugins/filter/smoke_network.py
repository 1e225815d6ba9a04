"""The smoke training's network verdict, for roles/smoke_training: the filter ``gpufleet.fleet.smoke_network``
(plugins/filter/smoke_network.yml, ``ansible-doc -t filter gpufleet.fleet.smoke_network``).

The rules are gpufleet_check's (``nccl.judge`` in roles/payload/files/gpufleet_check/nccl.py,
tested in tests/unit/test_nccl_log.py), imported from the collection: one place for them.
"""

from __future__ import annotations

import functools
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import gpufleet_check_module

judge = gpufleet_check_module("nccl").judge


@functools.wraps(judge)
def smoke_network(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """``nccl.judge`` itself, its signature included (functools.wraps: smoke_network.yml documents it), with its
    refusals of input (TypeError, ValueError) as Ansible's filter error."""
    try:
        return judge(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"smoke_network: {exc}") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"smoke_network": smoke_network}
