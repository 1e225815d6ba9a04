"""plugins/module_utils/rules/gpu_verify.py called directly: each rule with a value it takes and one it refuses (the
exact message; tests/unit/test_gpu_verify_role.py runs the same rules through roles/gpu_verify/tasks/validate.yml)."""

from __future__ import annotations

import pytest
import rules_case

BASE = rules_case.defaults(
    "gpu_verify",
    gpu_verify_python="/opt/gpufleet/venv/bin/python",
    gpu_verify_expected_cuda="12.1",
    gpu_verify_module_version_file="/sys/module/nvidia/version",
    gpu_verify_metrics_file="",
)


def refusals(**overrides):
    return rules_case.refusals("gpu_verify", BASE, **overrides)


def test_the_defaults_pass():
    assert refusals() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpu_verify_expected_cuda": ""},
        {"gpu_verify_expected_gpus": "8"},
        {"gpu_verify_gemm_min_fraction": 1},
        {"gpu_verify_driver_fact_file": ""},
        {"gpu_verify_metrics_file": "/var/lib/prometheus/node-exporter/gpufleet.prom"},
        {"gpu_verify_history_keep": 0},
        {"gpu_verify_history_keep": 3, "gpu_verify_repeat_failures": 3},
        {"gpu_verify_xid_drain_codes": "48,79", "gpu_verify_xid_ignore_codes": [13, 43]},
        {"gpu_verify_kernel_log_file": "/var/log/kern.log"},
        {"gpu_verify_max_corrected_ecc_errors": 100},
        {"gpu_verify_profile_overrides": {"H200": {"nvlink_links": 18}}},
        {"gpu_verify_profile_overrides": ""},
    ],
)
def test_values_the_rules_take(overrides):
    assert refusals(**overrides) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"gpu_verify_expected_gpus": -1},
            "gpu_verify_expected_gpus '-1' is not a GPU count (0 or more; 0: no expectation)",
        ),
        (
            {"gpu_verify_expected_cuda": 12.4},
            "gpu_verify_expected_cuda '12.4' is not a CUDA release gpufleet knows"
            " (the compatibility matrix lists 12.1)",
        ),
        (
            {"gpu_verify_gemm_min_fraction": 0},
            "gpu_verify_gemm_min_fraction '0' is not a fraction of the achievable figure (above 0, at most 1)",
        ),
        (
            {"gpu_verify_busbw_min_nvlink_gbps": "-1.5"},
            "gpu_verify_busbw_min_nvlink_gbps '-1.5' is not a bandwidth in GB/s (0 or more)",
        ),
        (
            {"gpu_verify_busbw_min_pcie_gbps": -5},
            "gpu_verify_busbw_min_pcie_gbps '-5' is not a bandwidth in GB/s (0 or more)",
        ),
        ({"gpu_verify_max_ecc_errors": -1}, "gpu_verify_max_ecc_errors '-1' is not an error count (0 or more)"),
        (
            {"gpu_verify_module_version_file": ""},
            "gpu_verify_module_version_file '' is not an absolute path (the kernel's is /sys/module/nvidia/version)",
        ),
        (
            {"gpu_verify_driver_fact_file": "nvidia_driver.fact"},
            "gpu_verify_driver_fact_file 'nvidia_driver.fact' is not an absolute path (the nvidia_driver role's fact is"
            " /etc/ansible/facts.d/nvidia_driver.fact) or empty (not read)",
        ),
        ({"gpu_verify_python": "python3"}, "gpu_verify_python 'python3' is not an absolute path to an interpreter"),
        ({"gpu_verify_timeout": "ten"}, "gpu_verify_timeout 'ten' is not a number of seconds (above 0)"),
        (
            {"gpu_verify_metrics_file": "/var/lib/prometheus/node-exporter/gpufleet.txt"},
            "gpu_verify_metrics_file '/var/lib/prometheus/node-exporter/gpufleet.txt'"
            " is not an absolute path ending in .prom (node exporter's textfile collector reads only *.prom files;"
            " the monitoring role's is monitoring_textfile_dir/gpufleet.prom) or empty (no metrics)",
        ),
        (
            {"gpu_verify_metrics_file": "/var/lib/prometheus/.prom"},
            "gpu_verify_metrics_file '/var/lib/prometheus/.prom' is not an absolute path ending in .prom"
            " (node exporter's textfile collector reads only *.prom files; the monitoring role's is"
            " monitoring_textfile_dir/gpufleet.prom) or empty (no metrics)",
        ),
        (
            {"gpu_verify_report_dir": "  "},
            "gpu_verify_report_dir is empty: name the controller directory for the fleet report",
        ),
        (
            {"gpu_verify_history_keep": -1},
            "gpu_verify_history_keep '-1' / gpu_verify_repeat_runs '3' are not numbers of runs (0 or more / 1 or more)",
        ),
        (
            {"gpu_verify_repeat_failures": 4},
            "gpu_verify_repeat_failures '4' is not between 1 and gpu_verify_repeat_runs (3): a node cannot fail in more"
            " runs than"
            " are looked at",
        ),
        (
            {"gpu_verify_history_keep": 2},
            "gpu_verify_history_keep 2 keeps fewer runs than gpu_verify_repeat_runs (3)"
            " looks at: keep at least 3, or 0 for no history",
        ),
        (
            {"gpu_verify_outlier_fraction": 1},
            "gpu_verify_outlier_fraction '1' is not a fraction below the median (above 0, below 1; default 0.1)",
        ),
        (
            {"gpu_verify_xid_window_hours": -1},
            "gpu_verify_xid_window_hours '-1' is not a number of hours (0 or more; 0: the whole kernel log)",
        ),
        (
            {"gpu_verify_xid_ignore_codes": [13, -1]},
            "gpu_verify_xid_drain_codes / gpu_verify_xid_ignore_codes '[]' / '[13, -1]' are not Xid codes (0 or more)",
        ),
        (
            {"gpu_verify_xid_drain_codes": [79, 48, 8], "gpu_verify_xid_ignore_codes": "1,8,79"},
            "Xid 8, 79 is in both gpu_verify_xid_drain_codes and gpu_verify_xid_ignore_codes: keep it in one of them",
        ),
        (
            {"gpu_verify_kernel_log_file": "kern.log"},
            "gpu_verify_kernel_log_file 'kern.log' is not an absolute path (/var/log/kern.log, for one) or empty"
            " (journalctl -k,"
            " else dmesg)",
        ),
        (
            {"gpu_verify_max_corrected_ecc_errors": -2},
            "gpu_verify_max_corrected_ecc_errors '-2' is not an error count (0 or more; -1: not judged)",
        ),
        ({"gpu_verify_nvlink_max_errors": -1}, "gpu_verify_nvlink_max_errors '-1' is not an error count (0 or more)"),
        (
            {"gpu_verify_expected_ib_ports": -8},
            "gpu_verify_expected_ib_ports '-8' is not a port count (0 or more; 0: not expected)",
        ),
        ({"gpu_verify_ib_min_rate_gbps": -400}, "gpu_verify_ib_min_rate_gbps '-400' is not a rate in Gb/s (0 or more)"),
        (
            {"gpu_verify_dcgm_timeout": -1},
            "gpu_verify_dcgm_timeout '-1' is not a number of seconds (0 or more; 0: the level's own limit)",
        ),
    ],
)
def test_each_rule_refuses_with_its_message(overrides, message):
    assert refusals(**overrides) == [message]


def test_the_overrides_are_judged_by_gpufleet_checks_own_validator():
    """The rule's reason is the one profile_overrides_problem (the filter of the same name) gives."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import profile_overrides_problem

    overrides = {"H200": {"nvlink_links": 17.5}}
    problem = profile_overrides_problem(overrides)
    assert problem.startswith("profile overrides: 'H200': nvlink_links must be a whole number")
    assert refusals(gpu_verify_profile_overrides=overrides) == [
        f'gpu_verify_profile_overrides is refused by gpufleet_check: {problem} (docs/gpu.md, "Per-SKU figures",'
        f" lists the"
        " profiles and fields)"
    ]
