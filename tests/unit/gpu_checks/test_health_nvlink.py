"""nvlink: Fabric Manager's state, the links' status and error counters, on real outputs."""

from __future__ import annotations

from pathlib import Path

from gpufleet_check import health, profiles

from .saved_outputs import data, run_cli, smi

# --------------------------------------------------------------------------- fabric manager


def test_fabric_completed_passes_and_not_applicable_is_not_judged() -> None:
    assert health.judge_fabric(smi("h100-8gpu-535.161.08-power-brake.txt")) == []
    assert health.judge_fabric(smi("a100-sxm4-80gb-mig-535.54.03.xml")) == []  # N/A on A100


def test_fabric_in_progress_fails() -> None:
    (found,) = health.judge_fabric(smi("h100-8gpu-535.183.01-gpu0-fabric-in-progress.txt"))
    assert found["gpu"] == "GPU 0 (00000000:53:00.0)" and found["verdict"] == "fail"
    assert "'In Progress'" in found["evidence"] and "fabricmanager" in found["action"]


# --------------------------------------------------------------------------- nvlink


def test_nvlink_status_a100() -> None:
    status = health.parse_nvlink_status(data("nvlink", "a100-8gpu-status.txt"))
    assert len(status) == 8 and status[0]["name"] == "NVIDIA A100-SXM4-80GB"
    assert status[0]["uuid"] == "GPU-5269b708-678a-b1a8-60f0-c90406537486"
    assert status[0]["links"] == {n: 25.0 for n in range(12)}
    assert health.judge_nvlink(status) == []  # the A100-SXM4-80GB profile: 12 x 25 GB/s


def test_inactive_nvlink_fails() -> None:
    status = health.parse_nvlink_status(data("nvlink", "a100-8gpu-status-gpu2-link5-inactive.txt"))
    assert status[2]["links"][5] is None
    (found,) = health.judge_nvlink(status)
    assert found["gpu"] == "GPU 2" and found["verdict"] == "fail"
    assert found["evidence"] == "NVLink 5 inactive (11 of 12 up)"


def test_v100_inactive_links_as_reported() -> None:
    status = health.parse_nvlink_status(data("nvlink", "v100-status-azhpc-issue73.txt"))
    assert [(g["index"], g["links"]) for g in status] == [
        (3, {0: 25.781, 1: 25.781, 2: 25.781, 3: None, 4: 25.781, 5: None})
    ]
    (found,) = health.judge_nvlink(status)
    assert found["evidence"] == "NVLink 3, 5 inactive (4 of 6 up)"


def test_h100_links_at_the_profiles_speed_pass_and_fewer_or_slower_fail() -> None:
    status = health.parse_nvlink_status(data("nvlink", "h100-status-bottlerocket-gpu0-1.txt"))
    assert [len(g["links"]) for g in status] == [18, 18]
    assert health.judge_nvlink(status) == []
    site = profiles.merge_overrides({"H100 80GB HBM3": {"nvlink_link_gbps": 50.0, "nvlink_links": 20}})
    found = health.judge_nvlink(status, table=site)
    assert {f["evidence"] for f in found} == {
        "18 NVLinks listed, the H100 80GB HBM3 has 20",
        f"NVLink {', '.join(map(str, range(18)))} at 26.562 GB/s, the H100 80GB HBM3 runs 50",
    }


def test_gpu_without_nvlink_lists_none() -> None:
    assert health.parse_nvlink_status(data("nvlink", "a10-status.txt")) == []


def test_nvlink_error_counters() -> None:
    counters = health.parse_nvlink_errors(data("nvlink", "h100-errors-abridged.txt"))
    assert sorted(counters[0]) == [0, 1, 17]
    assert counters[0][1] == {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
    assert health.judge_nvlink([], counters) == []
    raised = health.parse_nvlink_errors(data("nvlink", "h100-errors-abridged-link1-replay.txt"))
    (found,) = health.judge_nvlink([], raised)
    assert (found["verdict"], found["evidence"]) == ("warn", "NVLink error counters above 0: link 1 Replay Errors 37")
    assert health.judge_nvlink([], raised, max_errors=37) == []


def test_all_links_inactive_message() -> None:
    """The driver's own sentence (NVIDIA/open-gpu-kernel-modules issue 1150's title; Azure's
    check_nvlink_status looks for "all links are inactive")."""
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\nNVML: Unable to retrieve NVLink information as all links are "
        "inActive\n"
    )
    (found,) = health.judge_nvlink(health.parse_nvlink_status(text))
    assert (found["verdict"], found["evidence"]) == ("fail", "all NVLinks inactive")


def test_nvlink_of_a_gpu_without_links_is_skipped(gpu_host: Path) -> None:
    _proc, checks = run_cli(gpu_host)
    assert checks["nvlink"]["verdict"] == "skipped"
    assert checks["nvlink"]["detail"].startswith("one GPU (1 x NVIDIA A100-SXM4-80GB (profile A100-SXM4-80GB)): ")
