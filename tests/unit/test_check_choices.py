"""The two argument specs that let a site skip checks (gpu_verify_skip_checks, slurm_health_check_skip) list the checks
literally, as argument_specs must: they stay the checks gpufleet_check runs (its CHECKS), less the training run,
which only --train starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "payload" / "files"))
from gpufleet_check import checks  # noqa: E402


def option(role: str, name: str) -> dict:
    specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"]["main"]["options"][name]


@pytest.mark.parametrize(
    ("role", "name"), [("gpu_verify", "gpu_verify_skip_checks"), ("slurm", "slurm_health_check_skip")]
)
def test_skip_choices_are_the_checks(role: str, name: str) -> None:
    assert option(role, name)["choices"] == [c for c in checks.CHECKS if c != "training"]
