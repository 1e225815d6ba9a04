"""roles/gpu_verify without a host: the health checks' settings as the role passes them, and what it refuses.

The role runs for real (tests/unit/role_run.py): its validate.yml on one fake
host per case, then, in the same play, the command line of tasks/check.yml's
"Run the health checks" and its time limit templated with the role's defaults
and vars. The command line is parsed back with gpufleet_check's own argument
parser, so a setting the checks would refuse fails here.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import role_run
import yaml
from conftest import FAKE_FACTS

REPO_ROOT = Path(__file__).resolve().parents[2]
PAYLOAD_DIR = REPO_ROOT / "roles" / "payload" / "files"
if str(PAYLOAD_DIR) not in sys.path:
    sys.path.insert(0, str(PAYLOAD_DIR))

from gpufleet_check import cli, dcgm  # noqa: E402  (after the sys.path entry)

_CHECKS = role_run.role_task("gpu_verify", "check.yml", "Run the health checks")
RUNS = role_run.Batch(
    FAKE_FACTS,
    [role_run.import_role("gpu_verify")],
    after=[
        role_run.capture(
            {
                "checks_cmd": _CHECKS["ansible.builtin.command"]["cmd"],
                "checks_timeout": _CHECKS["timeout"],
                **role_run.names("__gpu_verify_dcgm"),
            },
            vars=_CHECKS.get("vars"),
            name="Template the health checks' command line and time limit",
        )
    ],
)
LOCATED = {"payload_files": {"check": "/x/gpufleet_check.pyz"}}


def verify(**settings: Any) -> role_run.Outcome:
    return RUNS.get("ubuntu2204", **LOCATED, **settings)


def checks_args(**settings: Any) -> Any:
    """The options the role gives gpufleet_check, parsed by gpufleet_check's own parser."""
    cfg = verify(**settings)
    assert cfg.failure is None, cfg.failure
    words = shlex.split(str(cfg["checks_cmd"]))
    assert words[:2] == ["sh", "-c"] and words[3] == "gpufleet-check"
    return cli.parse_args(words[6:])


# --------------------------------------------------------------------------- the settings reach the checks

DEFAULTS = yaml.safe_load((REPO_ROOT / "roles" / "gpu_verify" / "defaults" / "main.yml").read_text())


def test_the_defaults_are_the_checks_defaults_but_for_dcgm_and_the_driver_fact():
    args, defaults = checks_args(), cli.parse_args([])
    for option in (
        "xid_window_hours",
        "xid_drain",
        "xid_ignore",
        "max_corrected_ecc",
        "expect_mig",
        "pcie_gen_policy",
        "nvlink_max_errors",
        "expect_ib_ports",
        "ib_min_rate",
        "ib_link_layer",
        "expect_peermem",
        "profile_overrides",
        "profile_overrides_json",
        "dcgm_level",
    ):
        assert getattr(args, option) == getattr(defaults, option), option
    assert (args.dcgm_level, args.dcgm_timeout) == (1, dcgm.DEFAULT_TIMEOUT_S[1])  # quick: r1, with its own limit
    assert DEFAULTS["gpu_verify_xid_window_hours"] == defaults.xid_window_hours == 24


def test_the_health_settings_become_the_checks_options():
    args = checks_args(
        gpu_verify_xid_window_hours=6,
        gpu_verify_xid_drain_codes=[13, 31],
        gpu_verify_xid_ignore_codes="92,119",
        gpu_verify_max_corrected_ecc_errors=10000,
        gpu_verify_expected_mig="disabled",
        gpu_verify_pcie_gen_policy="fail",
        gpu_verify_nvlink_max_errors=5,
        gpu_verify_expected_ib_ports=8,
        gpu_verify_ib_min_rate_gbps=400,
        gpu_verify_ib_link_layer="InfiniBand",
        gpu_verify_expect_peermem=True,
        gpu_verify_skip_checks=["dcgm", "interconnect"],
    )
    assert (args.xid_window_hours, args.xid_drain, args.xid_ignore) == (6.0, "13,31", "92,119")
    assert (args.max_corrected_ecc, args.expect_mig, args.pcie_gen_policy, args.nvlink_max_errors) == (
        10000,
        "disabled",
        "fail",
        5,
    )
    assert (args.expect_ib_ports, args.ib_min_rate, args.ib_link_layer, args.expect_peermem) == (
        8,
        400.0,
        "InfiniBand",
        True,
    )
    assert args.skip == ["dcgm", "interconnect"]
    assert checks_args().kernel_log_file is None
    assert checks_args(gpu_verify_kernel_log_file="/var/log/kern log").kernel_log_file == "/var/log/kern log"


@pytest.mark.parametrize(
    "level, expected", [("none", (0, None)), ("quick", (1, 300)), ("r2", (2, 900)), ("r3", (3, 2700))]
)
def test_the_dcgm_level_and_its_limit(level: str, expected: tuple[int, int | None]):
    """dcgmi diag -r 1/2/3 under gpufleet_check's own limits (dcgm.DEFAULT_TIMEOUT_S), added to the node's."""
    args = checks_args(gpu_verify_dcgm_level=level)
    assert (args.dcgm_level, args.dcgm_timeout) == expected
    assert int(verify(gpu_verify_dcgm_level=level)["checks_timeout"]) == 600 + (expected[1] or 0)


def test_a_dcgm_limit_of_the_site_replaces_the_levels():
    args = checks_args(gpu_verify_dcgm_level="r3", gpu_verify_dcgm_timeout=3600, gpu_verify_timeout=900)
    assert (args.dcgm_level, args.dcgm_timeout) == (3, 3600)
    assert (
        int(verify(gpu_verify_dcgm_level="r3", gpu_verify_dcgm_timeout=3600, gpu_verify_timeout=900)["checks_timeout"])
        == 4500
    )


def test_profile_overrides_travel_as_json_on_the_command_line():
    overrides = {"H200": {"allreduce_8gpu_busbw_gbps": 440}, "GB200": {"device_ids": ["2941"], "nvlink_links": 18}}
    args = checks_args(gpu_verify_profile_overrides=overrides)
    assert yaml.safe_load(args.profile_overrides_json) == overrides
    assert checks_args().profile_overrides_json is None


def test_the_upgrade_verifies_with_dcgm_level_r2():
    """playbooks/upgrade-driver.yml's batch play passes r2 to the role (-e can still ask for r3)."""
    plays = yaml.safe_load((REPO_ROOT / "playbooks" / "upgrade-driver.yml").read_text())
    batch = next(
        play for play in plays if any(role.get("role") == "gpufleet.fleet.gpu_verify" for role in play.get("roles", []))
    )
    assert batch["vars"]["gpu_verify_dcgm_level"] == "r2"
    verify_play = yaml.safe_load((REPO_ROOT / "playbooks" / "verify.yml").read_text())[0]
    assert "gpu_verify_dcgm_level" not in (verify_play.get("vars") or {})  # every verify: the role's default, quick


# --------------------------------------------------------------------------- what play 1 refuses, before any change

WRONG = [
    ({"gpu_verify_xid_window_hours": -1}, "[1] gpu_verify_xid_window_hours '-1' is not a number of hours"),
    ({"gpu_verify_xid_drain_codes": [48, -3]}, "are not Xid codes (0 or more)"),
    (
        {"gpu_verify_xid_drain_codes": [48, 79], "gpu_verify_xid_ignore_codes": "79"},
        "[1] Xid 79 is in both gpu_verify_xid_drain_codes and gpu_verify_xid_ignore_codes: keep it in one of them",
    ),
    ({"gpu_verify_max_corrected_ecc_errors": -2}, "[1] gpu_verify_max_corrected_ecc_errors '-2' is not an error count"),
    ({"gpu_verify_nvlink_max_errors": -1}, "[1] gpu_verify_nvlink_max_errors '-1' is not an error count"),
    ({"gpu_verify_expected_ib_ports": -8}, "[1] gpu_verify_expected_ib_ports '-8' is not a port count"),
    ({"gpu_verify_ib_min_rate_gbps": -400}, "[1] gpu_verify_ib_min_rate_gbps '-400' is not a rate in Gb/s"),
    ({"gpu_verify_dcgm_timeout": -1}, "[1] gpu_verify_dcgm_timeout '-1' is not a number of seconds"),
    # the fleet report's history and outlier rule (issue 29)
    (
        {"gpu_verify_repeat_failures": 4},
        "[1] gpu_verify_repeat_failures '4' is not between 1 and gpu_verify_repeat_runs (3)",
    ),
    (
        {"gpu_verify_repeat_failures": 0},
        "[1] gpu_verify_repeat_failures '0' is not between 1 and gpu_verify_repeat_runs (3)",
    ),
    (
        {"gpu_verify_history_keep": 2},
        "[1] gpu_verify_history_keep 2 keeps fewer runs than gpu_verify_repeat_runs (3) looks at: "
        "keep at least 3, or 0 for no history",
    ),
    (
        {"gpu_verify_history_keep": -1},
        "[1] gpu_verify_history_keep '-1' / gpu_verify_repeat_runs '3' are not numbers of runs",
    ),
    ({"gpu_verify_outlier_fraction": 1.5}, "[1] gpu_verify_outlier_fraction '1.5' is not a fraction below the median"),
    ({"gpu_verify_outlier_fraction": 0}, "[1] gpu_verify_outlier_fraction '0' is not a fraction below the median"),
    ({"gpu_verify_kernel_log_file": "kern.log"}, "[1] gpu_verify_kernel_log_file 'kern.log' is not an absolute path"),
    (
        {"gpu_verify_profile_overrides": {"H200": {"allreduce_8gpu_busbw_gbpss": 440}}},
        "[1] gpu_verify_profile_overrides is refused by gpufleet_check: profile overrides: 'H200': unknown field(s) "
        "allreduce_8gpu_busbw_gbpss; known: nvlink_links",
    ),
    (
        {"gpu_verify_profile_overrides": {"B300": {"h2d_gbps": 50}}},
        "[1] gpu_verify_profile_overrides is refused by gpufleet_check: profile overrides: 'B300' is not a known "
        "profile",
    ),
    (
        {"gpu_verify_profile_overrides": {"H200": {"nvlink_links": 17.5}}},
        "[1] gpu_verify_profile_overrides is refused by gpufleet_check: profile overrides: 'H200': nvlink_links must "
        "be a whole number, got 17.5",
    ),
]
for _settings, _ in WRONG:
    RUNS.declare("ubuntu2204", **LOCATED, **_settings)


@pytest.mark.parametrize("settings, message", WRONG)
def test_wrong_health_settings_are_named(settings: dict[str, Any], message: str):
    cfg = verify(**settings)
    assert cfg.failure is not None and cfg.failure.startswith(f"gpu_verify settings rejected on {cfg.host}: [1] ")
    assert message in " ".join(cfg.failure.split()), cfg.failure
    assert "[2]" not in cfg.failure, cfg.failure


for _settings in [
    {},
    {"gpu_verify_kernel_log_file": "/var/log/kern log"},
    {"gpu_verify_dcgm_level": "none"},
    {"gpu_verify_dcgm_level": "r2"},
    {"gpu_verify_dcgm_level": "r3"},
    {"gpu_verify_dcgm_level": "r3", "gpu_verify_dcgm_timeout": 3600, "gpu_verify_timeout": 900},
    {
        "gpu_verify_profile_overrides": {
            "H200": {"allreduce_8gpu_busbw_gbps": 440},
            "GB200": {"device_ids": ["2941"], "nvlink_links": 18},
        }
    },
    {
        "gpu_verify_xid_window_hours": 6,
        "gpu_verify_xid_drain_codes": [13, 31],
        "gpu_verify_xid_ignore_codes": "92,119",
        "gpu_verify_max_corrected_ecc_errors": 10000,
        "gpu_verify_expected_mig": "disabled",
        "gpu_verify_pcie_gen_policy": "fail",
        "gpu_verify_nvlink_max_errors": 5,
        "gpu_verify_expected_ib_ports": 8,
        "gpu_verify_ib_min_rate_gbps": 400,
        "gpu_verify_ib_link_layer": "InfiniBand",
        "gpu_verify_expect_peermem": True,
        "gpu_verify_skip_checks": ["dcgm", "interconnect"],
    },
]:
    RUNS.declare("ubuntu2204", **LOCATED, **_settings)
