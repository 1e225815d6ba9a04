"""plugins/module_utils/rules/gpufleet.py, the rule across the playbooks' settings and the inventory: called directly,
and through roles/gpufleet/tasks/validate.yml (play 0 of playbooks/check.yml) on a fake controller host."""

from __future__ import annotations

import role_run
import rules_case

NO_GPU_NODES = (
    "the inventory (inventory/lab, inventory/extra.yml) has no host in the group gpu_nodes: every play"
    " would match no host and the run would do nothing (put the GPU servers under gpu_nodes in its"
    " hosts.yml)"
)


def refusals(**values):
    sources = ["inventory/lab", "inventory/extra.yml"]
    return rules_case.refusals("gpufleet", {"ansible_inventory_sources": sources, **values})


def test_an_inventory_with_gpu_nodes_passes():
    assert refusals(groups={"all": ["gpu-a01"], "gpu_nodes": ["gpu-a01"]}) == []


def test_an_inventory_without_gpu_nodes_is_refused():
    assert refusals(groups={"all": ["head-01"], "gpu_nodes": []}) == [NO_GPU_NODES]
    assert refusals(groups={"all": ["head-01"], "slurm_controller": ["head-01"]}) == [NO_GPU_NODES]


def _validated(groups: tuple[str, ...]) -> role_run.Outcome:
    hosts = [role_run.Host("controller", {}, groups=groups)]
    (outcome,) = role_run.run(hosts, [role_run.import_role("gpufleet")]).values()
    return outcome


def test_the_role_judges_the_inventory_with_the_action():
    assert _validated(("gpu_nodes",)).failure is None
    failure = " ".join(_validated(("slurm_controller",)).failure.split())
    assert failure.startswith("gpufleet settings rejected on controller: [1] the inventory ("), failure
    assert failure.endswith(NO_GPU_NODES.split(")", 1)[1]), failure
