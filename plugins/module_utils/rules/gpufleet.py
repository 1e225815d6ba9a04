"""The gpufleet role's rule, across the playbooks' settings and the inventory: GPU nodes to run on.

Run by roles/gpufleet/tasks/validate.yml (the action gpufleet.fleet.settings) in play 0 of playbooks/check.yml, on the
controller, before any host is contacted; each service's own host group is its role's rule
(slurm_controller_group, monitoring_server_group).
"""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import Judgement

READS = ("groups", "ansible_inventory_sources")


def judge(j: Judgement) -> None:
    """Refuse an inventory without a host in gpu_nodes (every play would match no host and do nothing)."""
    sources = ", ".join(str(source) for source in j.get("ansible_inventory_sources") or [])
    j.check(
        (j.get("groups") or {}).get("gpu_nodes"),
        f"the inventory ({sources}) has no host in the group gpu_nodes: every play would match no host and the"
        " run would do nothing (put the GPU servers under gpu_nodes in its hosts.yml)",
    )
