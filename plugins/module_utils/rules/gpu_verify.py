"""The gpu_verify role's rules: the expected CUDA release, the floors and limits, the paths, the history, the Xid codes
and the per-SKU overrides (refused by gpufleet_check's own validator).

Run by roles/gpu_verify/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet_check import profile_overrides_problem
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import (
    Judgement,
    as_dict,
    as_list,
    matches,
    text,
    to_float,
    to_int,
)

READS = ("gpu_verify_*",)


def at_least(j: Judgement, name: str, floor: int, what: str, number=to_int) -> None:
    """The setting ``name`` as a number (``| int``, or ``| float``) is ``floor`` or more; ``what``: what it is not."""
    j.check(number(j[name]) >= floor, f"{name} '{j[name]}' is not {what}")


def absolute(j: Judgement, name: str, what: str, empty: bool = False) -> None:
    """The setting ``name`` is an absolute path (or empty, where ``empty``); ``what`` ends the message."""
    j.check((empty and text(j[name]) == "") or matches("^/", j[name]), f"{name} '{j[name]}' is not {what}")


def judge(j: Judgement) -> None:
    """Refuse counts, fractions, bandwidths and paths out of range, a history shorter than its window, Xid codes in both
    lists, per-SKU overrides gpufleet_check would refuse, and an expected CUDA release the matrix does not know."""
    cuda_errors = [
        error
        for error in j.stack(cuda_release=text(j["gpu_verify_expected_cuda"])).get("errors", [])
        if error.startswith("cuda_release")
    ]
    profile_problem = profile_overrides_problem(as_dict(j["gpu_verify_profile_overrides"]))
    drain = [to_int(code) for code in as_list(j["gpu_verify_xid_drain_codes"])]
    ignore = [to_int(code) for code in as_list(j["gpu_verify_xid_ignore_codes"])]
    # Ansible's intersect of the YAML rule: a set's order (for numbers, the same in every run).
    both = list(set(drain) & set(ignore))
    runs = to_int(j["gpu_verify_repeat_runs"])
    keep = to_int(j["gpu_verify_history_keep"])
    at_least(j, "gpu_verify_expected_gpus", 0, "a GPU count (0 or more; 0: no expectation)")
    j.check(not cuda_errors, "; ".join(cuda_errors).replace("cuda_release", "gpu_verify_expected_cuda"))
    j.check(
        0 < to_float(j["gpu_verify_gemm_min_fraction"]) <= 1,
        f"gpu_verify_gemm_min_fraction '{j['gpu_verify_gemm_min_fraction']}' is not a fraction of the achievable"
        " figure (above 0, at most 1)",
    )
    at_least(j, "gpu_verify_busbw_min_nvlink_gbps", 0, "a bandwidth in GB/s (0 or more)", to_float)
    at_least(j, "gpu_verify_busbw_min_pcie_gbps", 0, "a bandwidth in GB/s (0 or more)", to_float)
    at_least(j, "gpu_verify_max_ecc_errors", 0, "an error count (0 or more)")
    absolute(j, "gpu_verify_module_version_file", "an absolute path (the kernel's is /sys/module/nvidia/version)")
    absolute(
        j,
        "gpu_verify_driver_fact_file",
        "an absolute path (the nvidia_driver role's fact is"
        " /etc/ansible/facts.d/nvidia_driver.fact) or empty (not read)",
        empty=True,
    )
    absolute(j, "gpu_verify_python", "an absolute path to an interpreter")
    j.check(
        to_int(j["gpu_verify_timeout"]) > 0,
        f"gpu_verify_timeout '{j['gpu_verify_timeout']}' is not a number of seconds (above 0)",
    )
    metrics = text(j["gpu_verify_metrics_file"])
    j.check(
        metrics == "" or (matches("^/", metrics) and matches(".+[.]prom$", os.path.basename(metrics))),
        f"gpu_verify_metrics_file '{j['gpu_verify_metrics_file']}' is not an absolute path ending in .prom (node"
        " exporter's textfile collector reads only *.prom files; the monitoring role's is"
        " monitoring_textfile_dir/gpufleet.prom) or empty (no metrics)",
    )
    j.check(
        text(j["gpu_verify_report_dir"]).strip(),
        "gpu_verify_report_dir is empty: name the controller directory for the fleet report",
    )
    j.check(
        keep >= 0 and runs >= 1,
        f"gpu_verify_history_keep '{j['gpu_verify_history_keep']}' / gpu_verify_repeat_runs"
        f" '{j['gpu_verify_repeat_runs']}' are not numbers of runs (0 or more / 1 or more)",
    )
    j.check(
        1 <= to_int(j["gpu_verify_repeat_failures"]) <= runs,
        f"gpu_verify_repeat_failures '{j['gpu_verify_repeat_failures']}' is not between 1 and"
        f" gpu_verify_repeat_runs ({j['gpu_verify_repeat_runs']}): a node cannot fail in more runs than are"
        " looked at",
    )
    j.check(
        keep <= 0 or keep >= runs,
        f"gpu_verify_history_keep {j['gpu_verify_history_keep']} keeps fewer runs than gpu_verify_repeat_runs"
        f" ({j['gpu_verify_repeat_runs']}) looks at: keep at least {j['gpu_verify_repeat_runs']}, or 0 for no"
        " history",
    )
    j.check(
        0 < to_float(j["gpu_verify_outlier_fraction"]) < 1,
        f"gpu_verify_outlier_fraction '{j['gpu_verify_outlier_fraction']}' is not a fraction below the median"
        " (above 0, below 1; default 0.1)",
    )
    at_least(j, "gpu_verify_xid_window_hours", 0, "a number of hours (0 or more; 0: the whole kernel log)", to_float)
    j.check(
        all(code >= 0 for code in drain + ignore),
        f"gpu_verify_xid_drain_codes / gpu_verify_xid_ignore_codes '{j['gpu_verify_xid_drain_codes']}' /"
        f" '{j['gpu_verify_xid_ignore_codes']}' are not Xid codes (0 or more)",
    )
    j.check(
        not both,
        f"Xid {', '.join(map(str, both))} is in both gpu_verify_xid_drain_codes and"
        " gpu_verify_xid_ignore_codes: keep it in one of them",
    )
    absolute(
        j,
        "gpu_verify_kernel_log_file",
        "an absolute path (/var/log/kern.log, for one) or empty (journalctl -k, else dmesg)",
        empty=True,
    )
    at_least(j, "gpu_verify_max_corrected_ecc_errors", -1, "an error count (0 or more; -1: not judged)")
    at_least(j, "gpu_verify_nvlink_max_errors", 0, "an error count (0 or more)")
    at_least(j, "gpu_verify_expected_ib_ports", 0, "a port count (0 or more; 0: not expected)")
    at_least(j, "gpu_verify_ib_min_rate_gbps", 0, "a rate in Gb/s (0 or more)", to_float)
    at_least(j, "gpu_verify_dcgm_timeout", 0, "a number of seconds (0 or more; 0: the level's own limit)")
    j.check(
        not profile_problem,
        f'gpu_verify_profile_overrides is refused by gpufleet_check: {profile_problem} (docs/gpu.md, "Per-SKU'
        ' figures", lists the profiles and fields)',
    )
