"""The GPU profiles: by device ID and name, their floors and sources, a site's overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_check import profiles

from .saved_outputs import DATA, run_cli

# --------------------------------------------------------------------------- profiles


def test_profiles_by_device_id_and_name() -> None:
    assert profiles.find_profile("NVIDIA H100 80GB HBM3", "0x233010DE")[0] == "H100 80GB HBM3"
    assert profiles.find_profile("anything", "233510DE")[0] == "H200"
    assert profiles.find_profile("NVIDIA H200 NVL", None)[0] == "H200 NVL"
    assert profiles.find_profile("Tesla T4", None)[0] == "T4"
    assert profiles.find_profile("NVIDIA L40S", None)[0] == "L40S"
    assert profiles.find_profile("NVIDIA L4", None)[0] == "L4"
    assert profiles.find_profile("NVIDIA GeForce RTX 4090", "268410DE") == (profiles.DEFAULT_PROFILE, {})


def test_allreduce_floors_are_azures() -> None:
    """Azure/azurehpc-health-checks conf/nd96amsr_a100_v4.conf (228.0), nd96isr_h100_v5.conf (460.0),
    nd96isr_h200_v5.conf (431.0): check_nccl_allreduce, for 8-GPU nodes."""
    for key, floor, conf in (
        ("A100-SXM4-80GB", 228.0, "nd96amsr_a100_v4"),
        ("H100 80GB HBM3", 460.0, "nd96isr_h100_v5"),
        ("H200", 431.0, "nd96isr_h200_v5"),
    ):
        value, source = profiles.allreduce_floor(profiles.figures(profiles.PROFILES[key]), 8)
        assert value == floor and f"conf/{conf}.conf" in source
        assert profiles.allreduce_floor(profiles.figures(profiles.PROFILES[key]), 4) is None


def test_every_figure_has_a_source_and_a_known_field() -> None:
    for key, profile in profiles.PROFILES.items():
        assert profile["device_ids"], key
        for field, entry in profiles.figures(profile).items():
            assert field in profiles.FIELDS, (key, field)
            value, source = entry
            assert isinstance(value, profiles.FIELDS[field]) or (
                profiles.FIELDS[field] is float and isinstance(value, float)
            )
            assert len(source) > 20, (key, field)


def test_site_overrides_merge_and_are_validated(tmp_path: Path) -> None:
    merged = profiles.merge_overrides(
        {"H200": {"allreduce_8gpu_busbw_gbps": 440}, "GB200": {"device_ids": ["2941"], "nvlink_links": 18}}
    )
    assert merged["H200"]["allreduce_8gpu_busbw_gbps"] == (440.0, "site override")
    assert merged["H200"]["nvlink_links"] == profiles.PROFILES["H200"]["nvlink_links"]
    assert profiles.find_profile("NVIDIA GB200", "294110DE", merged)[0] == "GB200"
    assert profiles.PROFILES["H200"]["allreduce_8gpu_busbw_gbps"][0] == 431.0  # the table is untouched
    for site, message in (
        ({"H200": {"allreduce": 1}}, "unknown field"),
        ({"B300": {"h2d_gbps": 50}}, "not a known profile"),
        ({"H200": {"nvlink_links": 17.5}}, "whole number"),
        ({"H200": {"h2d_gbps": -1}}, "above 0"),
        ({"H200": {"nvswitch_fabric": "yes"}}, "true or false"),
        ([1], "JSON object"),
        ({"X": {"device_ids": ["23"]}}, "4-hex-digit"),
    ):
        with pytest.raises(ValueError, match=message):
            profiles.merge_overrides(site)
    path = tmp_path / "site.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="site.json: not JSON"):
        profiles.load_overrides(str(path))


def test_profile_overrides_on_the_command_line(tmp_path: Path) -> None:
    proc, checks = run_cli(tmp_path, "--profile-overrides-json", '{"H200": {"allreduce_8gpu_busbw_gbpss": 440}}')
    assert proc.returncode == 2 and checks == {}
    assert "--profile-overrides-json" in proc.stderr and "unknown field(s) allreduce_8gpu_busbw_gbpss" in proc.stderr
    proc, _checks = run_cli(tmp_path, "--profile-overrides-json", "{not json")
    assert proc.returncode == 2 and "not JSON" in proc.stderr
    proc, checks = run_cli(
        tmp_path,
        "--profile-overrides-json",
        '{"H100 80GB HBM3": {"pcie_min_width": 32}}',
        "--smi-query-file",
        str(DATA / "smi-text" / "h100-8gpu-535.183.01.txt"),
    )
    assert checks["pcie"]["verdict"] == "fail" and "below the H100 80GB HBM3 floor x32" in checks["pcie"]["detail"]
    site = tmp_path / "site.json"
    site.write_text("{}")
    proc, _checks = run_cli(tmp_path, "--profile-overrides", str(site), "--profile-overrides-json", "{}")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


def test_allreduce_floors_carry_the_message_size_they_hold_at() -> None:
    """Azure/azurehpc-health-checks @ 0e0a1ac2: check_nccl_allreduce <GB/s> 1 16G on ND H100 v5, ND H200 v5, ND A100
    v4 (80GB); 8G on ND A100 v4 40GB (nd96asr_v4) and ND V100 v2 (nd40rs_v2); nccl-tests reads G as GiB."""
    sizes = {
        key: profiles.allreduce_size_mib(profiles.figures(profile), 8)
        for key, profile in profiles.PROFILES.items()
        if "allreduce_8gpu_busbw_gbps" in profile
    }
    assert {key: size[0] for key, size in sizes.items()} == {
        "H100 80GB HBM3": 16384,
        "H200": 16384,
        "A100-SXM4-80GB": 16384,
        "A100-SXM4-40GB": 8192,
        "V100 SXM2 32GB": 8192,
    }
    assert all("check_nccl_allreduce" in size[1] for size in sizes.values())
    assert profiles.allreduce_size_mib(profiles.figures(profiles.PROFILES["H200"]), 4) is None
