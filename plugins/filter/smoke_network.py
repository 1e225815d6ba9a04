"""The smoke training's network verdict, for roles/smoke_training: the filter ``gpufleet.fleet.smoke_network``
(plugins/filter/smoke_network.yml, ``ansible-doc -t filter gpufleet.fleet.smoke_network``).

The rules are gpufleet_check's (``nccl.judge`` in roles/payload/files/gpufleet_check/nccl.py,
tested in tests/unit/test_nccl_log.py), imported from the collection: one place for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import gpufleet_check_module


def smoke_network(
    network: Mapping[str, Any] | None,
    nodes: Sequence[Mapping[str, Any]],
    floors: Mapping[str, Any],
    expect_transport: str = "any",
    expect_gdr: Any = "any",
) -> dict[str, Any]:
    if network is not None and not isinstance(network, Mapping):
        raise AnsibleFilterError(f"smoke_network: the payload's network figures must be a mapping, got {network!r}")
    try:
        return gpufleet_check_module("nccl").judge(
            dict(network) if network else None,
            [dict(n) for n in nodes or []],
            dict(floors or {}),
            expect_transport,
            expect_gdr,
        )
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"smoke_network: {exc}") from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"smoke_network": smoke_network}
