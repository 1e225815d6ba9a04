"""xid: Xid and SXid events in the kernel log, their catalog, window and classes."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from gpufleet_check import xid

from .saved_outputs import CAT, DATA, data, fake_tool, run_cli

# --------------------------------------------------------------------------- xid


NOV_16 = datetime(2024, 11, 16, tzinfo=timezone.utc)


def test_dmesg_iso_xid_lines() -> None:
    events = xid.parse_kernel_log(data("xid", "dmesg-iso-h100-xid48-63-94.log"))
    assert [e["code"] for e in events] == [48, 63] + [94] * 9
    first = events[0]
    assert (first["device"], first["pid"], first["process"]) == ("0000:19:00", "<unknown>", "<unknown>")
    assert first["time"] == datetime(2024, 11, 15, 12, 2, 3, 470068, tzinfo=timezone.utc)
    assert first["text"].startswith("An uncorrectable double bit error (DBE)")
    assert events[3]["process"] == "python3.10" and events[3]["pid"] == "1248209"


def test_catalog_classes_the_h100_ecc_event() -> None:
    """Xid 48 drains (WORKFLOW_XID_48), 94 is watched (RESTART_APP), 63 on an Ampere+ GPU is ignored
    (the pending remap is gpu_errors' to judge)."""
    events = xid.parse_kernel_log(data("xid", "dmesg-iso-h100-xid48-63-94.log"))
    judged = xid.judge_events(events, NOV_16, 24)
    by_code = {f["code"]: f for f in judged["findings"] + judged["ignored"]}
    assert (by_code[48]["verdict"], by_code[48]["action"]) == ("fail", "drain: WORKFLOW_XID_48")
    assert (by_code[94]["verdict"], by_code[94]["count"]) == ("warn", 9)
    assert by_code[63]["verdict"] == "pass" and by_code[63] in judged["ignored"]
    assert judged["in_window"] == 11 and judged["outside_window"] == 0


def test_the_window_keeps_recent_events_only() -> None:
    events = xid.parse_kernel_log(data("xid", "dmesg-iso-h100-xid48-63-94.log"))
    judged = xid.judge_events(events, NOV_16, 1)
    assert (judged["findings"], judged["in_window"], judged["outside_window"]) == ([], 0, 11)
    assert len(xid.judge_events(events, datetime(2030, 1, 1, tzinfo=timezone.utc), 0)["findings"]) == 2  # 0: all


def test_pre_ampere_xid_63_is_a_retired_page_that_needs_a_reboot() -> None:
    events = xid.parse_kernel_log(data("xid", "dmesg-iso-h100-xid48-63-94.log"))
    judged = xid.judge_events(events, NOV_16, 24, architectures={(0, 0x19, 0): "Turing"})
    (page,) = [f for f in judged["findings"] if f["code"] == 63]
    assert page["verdict"] == "fail" and "Dynamic Page Retirement" in page["evidence"]


def test_site_codes_override_the_catalog() -> None:
    events = xid.parse_kernel_log(data("xid", "dmesg-iso-h100-xid48-63-94.log"))
    judged = xid.judge_events(events, NOV_16, 24, drain_codes=[94], ignore_codes=[48])
    by_code = {f["code"]: f["verdict"] for f in judged["findings"] + judged["ignored"]}
    assert by_code == {48: "pass", 94: "fail", 63: "pass"}


def test_dmesg_decode_application_errors_are_watched_or_ignored() -> None:
    events = xid.parse_kernel_log(data("xid", "dmesg-decode-iso-xid13-43.log"))
    assert {e["code"] for e in events} == {13, 43} and len(events) == 636
    judged = xid.judge_events(events, datetime(2025, 1, 22, tzinfo=timezone.utc), 48)
    assert [(f["code"], f["verdict"]) for f in judged["findings"]] == [(13, "warn")]
    assert [(f["code"], f["verdict"]) for f in judged["ignored"]] == [(43, "pass")]


def test_dmesg_ctime_gsp_timeouts_drain(utc: None) -> None:
    events = xid.parse_kernel_log(data("xid", "dmesg-ctime-xid119.log"))
    assert [e["code"] for e in events] == [119] * 5
    assert events[0]["time"] == datetime(2025, 2, 23, 16, 24, 18, tzinfo=timezone.utc)
    assert (events[0]["pid"], events[0]["process"]) == ("2024380", "nvidia-smi")
    (found,) = xid.judge_events(events, datetime(2025, 2, 24, tzinfo=timezone.utc), 24)["findings"]
    assert (found["verdict"], found["action"], found["count"]) == ("fail", "drain: RESET_GPU", 5)


def test_fallen_off_the_bus_and_fatal_sxids_drain() -> None:
    """gpud's README incident: Xid 79 and SXid 20034 Fatal on three NVSwitches; seconds-since-boot
    timestamps, so every event counts (undated). A Severity / Data line takes its switch's Fatal."""
    events = xid.parse_kernel_log(data("xid", "kmsg-xid79-sxid20034-gpud-readme.log"))
    assert [(e["kind"], e["code"]) for e in events][:2] == [("xid", 79), ("sxid", 20034)]
    assert {e["time"] for e in events} == {None}
    sxids = [e for e in events if e["kind"] == "sxid"]
    assert len(sxids) == 8 and sxids[0]["severity_word"] == "Fatal" and sxids[2]["severity_word"] is None
    judged = xid.judge_events(events, NOV_16, 24)
    found = {(f["kind"], f["gpu"]): (f["verdict"], f["action"]) for f in judged["findings"]}
    assert found == {
        ("xid", "PCI:0000:91:00"): ("fail", "drain: RESTART_BM"),
        ("sxid", "nvidia-nvswitch1 (PCI:0000:06:00.0)"): ("fail", "drain: RESET_FABRIC"),
        ("sxid", "nvidia-nvswitch0 (PCI:0000:05:00.0)"): ("fail", "drain: RESET_FABRIC"),
        ("sxid", "nvidia-nvswitch2 (PCI:0000:07:00.0)"): ("fail", "drain: RESET_FABRIC"),
    }
    assert judged["undated"] == 9


def test_non_fatal_sxid_is_watched() -> None:
    events = xid.parse_kernel_log(data("xid", "kmsg-xid79-sxid20034-nvswitch1-nonfatal.log"))
    judged = xid.judge_events(events, NOV_16, 24)
    (switch1,) = [f for f in judged["findings"] if f["gpu"].startswith("nvidia-nvswitch1")]
    assert (switch1["verdict"], switch1["action"]) == ("warn", "watch")


def test_recovery_action_xid_154_drains_by_its_own_words(utc: None) -> None:
    now = datetime(2026, 3, 30, tzinfo=timezone.utc)
    events = xid.parse_kernel_log(data("xid", "syslog-xid120-154-rtx-pro-6000.log"), now)
    assert [e["code"] for e in events] == [120, 154]
    assert events[0]["time"] == datetime(2026, 3, 29, 15, 38, 59, tzinfo=timezone.utc)  # the year is now's
    found = {f["code"]: (f["verdict"], f["action"]) for f in xid.judge_events(events, now, 24)["findings"]}
    assert found == {120: ("fail", "drain: RESET_GPU"), 154: ("fail", "drain: GPU Reset Required")}
    january = datetime(2027, 1, 2, tzinfo=timezone.utc)  # a March line read the next January: last year
    assert xid.parse_kernel_log(data("xid", "syslog-xid120-154-rtx-pro-6000.log"), january)[0]["time"].year == 2026


def test_journalctl_short_iso_times() -> None:
    line = data("xid", "journalctl-short-iso-a800.log").splitlines()[0]
    assert line.startswith("2025-01-02T15:20:12+0800 ")
    assert xid.line_time(line, NOV_16) == datetime(2025, 1, 2, 7, 20, 12, tzinfo=timezone.utc)
    assert xid.parse_kernel_log(data("xid", "journalctl-short-iso-a800.log")) == []


@pytest.mark.parametrize(
    "code, bucket",
    [
        # NVIDIA's catalog, first rows as the docs page shows them (docs.nvidia.com/deploy/xid-errors/
        # analyzing-xid-catalog.html: 8 RESTART_APP, 11 RESTART_APP) and the pinned export
        # (gpud catalog_generated.go @ b9842de2, NVSentinel xiderrorsmapping.csv @ 6f8b0fcf agree)
        (8, "RESTART_APP"),
        (11, "RESTART_APP"),
        (13, "RESTART_APP"),
        (31, "RESTART_APP"),
        (43, "IGNORE"),
        (46, "RESET_GPU"),
        (48, "WORKFLOW_XID_48"),
        (63, "IGNORE"),
        (64, "RESET_GPU"),
        (74, "WORKFLOW_NVLINK_ERR"),
        (79, "RESTART_BM"),
        (92, "IGNORE"),
        (94, "RESTART_APP"),
        (95, "RESET_GPU"),
        (119, "RESET_GPU"),
        (120, "RESET_GPU"),
        (140, "RESET_GPU"),
        (149, "WORKFLOW_NVLINK5_ERR"),
    ],
)
def test_catalog_buckets(code: int, bucket: str) -> None:
    assert xid.XID_CATALOG[code][1] == bucket


def test_catalog_severities() -> None:
    def severity(code: int) -> str:
        return xid.classify({"kind": "xid", "code": code, "text": ""})["severity"]

    assert [severity(c) for c in (48, 79, 95, 119, 74)] == ["drain"] * 5
    assert [severity(c) for c in (13, 31, 45, 94)] == ["watch"] * 4
    assert [severity(c) for c in (43, 63, 92)] == ["ignore"] * 3
    assert severity(57) == "drain"  # listed unused in the catalog: not expected at all
    assert severity(14) == "ignore"  # unused, but its bucket is IGNORE
    assert severity(9999) == "watch"  # not in the catalog


def test_xid_without_a_readable_kernel_log_warns(gpu_host: Path) -> None:
    _proc, checks = run_cli(gpu_host)
    assert checks["xid"]["verdict"] == "warn" and checks["xid"]["detail"].startswith("kernel log not readable")
    fake_tool(
        gpu_host / "bin",
        "journalctl",
        'echo "Hint: You are currently not seeing messages from other users and the system." >&2\nexit 0\n',
    )
    log = DATA / "xid" / "dmesg-iso-h100-xid48-63-94.log"
    fake_tool(gpu_host / "bin", "dmesg", f'[ "$*" = "--time-format iso" ] || exit 9\n"{CAT}" "{log}"\n')
    _proc, checks = run_cli(gpu_host, "--xid-window-hours", "0")
    assert checks["xid"]["verdict"] == "fail" and checks["xid"]["source"] == "dmesg --time-format iso"
