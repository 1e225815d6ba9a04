"""The lookup stack (plugins/lookup/stack.py), called directly: each driver branch's lifecycle and play 1's
warning about a branch past its end of life."""

from __future__ import annotations

import pytest
from plugin_files import MATRIX, stack

# --- stack: driver branch lifecycle ------------------------------------------

# NVIDIA's "Supported Drivers and CUDA Toolkit Versions" table
# (https://docs.nvidia.com/datacenter/tesla/drivers/615/supported-drivers-and-cuda-toolkit-versions.html):
# R535 Long Term Support Branch, end of life June 2026; R580 Long Term Support Branch, June 2028 (the 620
# edition of the table says the same for R580). 470 and 525: https://endoflife.date/nvidia (endoflife-date/
# endoflife.date, products/nvidia-driver.md, from NVIDIA's releases.json): R470 LTSB until 2024-07, R525
# Production Branch until 2023-12.
LIFECYCLES = {
    "470": ("Long Term Support Branch", "2024-07"),
    "525": ("Production Branch", "2023-12"),
    "535": ("Long Term Support Branch", "2026-06"),
    "580": ("Long Term Support Branch", "2028-06"),
}


def test_every_branch_has_its_published_lifecycle():
    for branch, (designation, end_of_life) in LIFECYCLES.items():
        life = MATRIX["driver_branches"][branch]["lifecycle"]
        assert (life["designation"], life["end_of_life"]) == (designation, end_of_life), branch
        assert life["published"].startswith("https://"), branch
    assert set(MATRIX["driver_branches"]) == set(LIFECYCLES)


@pytest.mark.parametrize(
    ("end_of_life", "today", "past"),
    [
        ("2026-06", "2026-06-30", False),
        ("2026-06", "2026-07-01", True),
        ("2026-06", "2026-12-01", True),
        ("2028-06", "2026-12-01", False),
        ("2024-07", "2025-01-01", True),
        ("", "2030-01-01", False),
        ("June 2026", "2030-01-01", False),
    ],
)
def test_a_branch_is_past_its_end_of_life_once_that_month_is_over(end_of_life, today, past):
    assert stack.past_end_of_life(end_of_life, stack.datetime.date.fromisoformat(today)) is past


# The warning of play 1 on 2026-12-01, the day this was written: R535 is past its end of life; R580, the
# LTSB until June 2028, runs CUDA 12.1 (580.95.05 >= 530.30.02, CUDA 12.1's minimum driver).
WARNING_535 = (
    "NVIDIA driver branch 535 (Long Term Support Branch) is past its end of life (2026-06, "
    "https://docs.nvidia.com/datacenter/tesla/drivers/615/supported-drivers-and-cuda-toolkit-versions.html): branch "
    "580, the Long Term Support Branch supported until 2028-06 "
    "(https://docs.nvidia.com/datacenter/tesla/drivers/620/supported-drivers-and-cuda-toolkit-versions.html), runs "
    "CUDA 12.1 too"
)


def test_535_past_its_end_of_life_names_580_which_runs_cuda_12_1():
    life = stack.resolve(MATRIX, driver_branch="535", distribution="Ubuntu", today="2026-12-01")["driver"]["lifecycle"]
    assert life["past_end_of_life"] is True
    assert life["successor"] == {
        "branch": "580",
        "version": "580.95.05",
        "end_of_life": "2028-06",
        "sources": ["nvidia"],
        "published": "https://docs.nvidia.com/datacenter/tesla/drivers/620/supported-drivers-and-cuda-toolkit-versions.html",
    }
    assert life["warning"] == WARNING_535 + (
        ", on Ubuntu from source nvidia (nvidia_driver_source); move to it with playbooks/upgrade-driver.yml "
        "-e upgrade_driver_version=580.95.05"
    )


def test_on_debian_the_warning_says_no_source_offers_580():
    """Debian has no 580 build (bookworm-backports: 535.216.03, trixie: 550.163.01;
    https://neurite.github.io/debian-setup/0302-nvidia.html lists Debian's nvidia-driver per release)."""
    life = stack.resolve(MATRIX, driver_branch="535", distribution="Debian", today="2026-12-01")["driver"]["lifecycle"]
    assert life["warning"] == WARNING_535 + ", but no source gpufleet knows offers it on Debian"
    assert "Debian" not in MATRIX["driver_branches"]["580"]["sources"]


def test_a_supported_branch_gives_no_warning():
    before = stack.resolve(MATRIX, driver_branch="535", distribution="Ubuntu", today="2026-06-15")["driver"][
        "lifecycle"
    ]
    assert (before["past_end_of_life"], before["successor"], before["warning"]) == (False, {}, "")
    life = stack.resolve(MATRIX, driver_branch="580", distribution="Ubuntu", today="2026-12-01")["driver"]["lifecycle"]
    assert (life["past_end_of_life"], life["warning"]) == (False, "")


def test_no_successor_when_every_ltsb_is_past_or_too_old():
    """After June 2028 the matrix has no supported LTSB left: the warning says so instead of naming one."""
    life = stack.resolve(MATRIX, driver_branch="535", today="2028-07-01")["driver"]["lifecycle"]
    assert life["successor"] == {}
    assert life["warning"].endswith(
        ": the compatibility matrix has no supported Long Term Support Branch that runs CUDA 12.1"
    )


def test_a_malformed_today_is_a_clear_error():
    with pytest.raises(Exception, match="today '2026-13-01' is not a date"):
        stack.resolve(MATRIX, driver_branch="535", today="2026-13-01")
