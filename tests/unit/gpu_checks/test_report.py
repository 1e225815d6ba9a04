"""The report: a check that raises, numbers JSON cannot hold, the payload's arguments."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_check import checks, cli, common, launcher

from .fakes import FakeHost, by_name

# --------------------------------------------------------------------------- report


def test_check_that_raises_is_a_failure(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_probe: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setitem(checks.CHECKS, "gemm", broken)
    report = checks.build_report(cli.parse_args(host.argv("--skip", "torch_cuda")))
    gemm = by_name(report)["gemm"]
    assert gemm["verdict"] == "fail" and gemm["detail"] == "check raised RuntimeError: boom"
    assert "RuntimeError: boom" in gemm["traceback"]
    assert report["verdict"] == "fail" and report["reasons"] == ["gemm: check raised RuntimeError: boom"]
    assert by_name(report)["p2p_topology"]["verdict"] == "skipped"  # the checks after it still ran


def test_non_finite_numbers_become_null() -> None:
    value = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf"), "e": 2}}
    assert common.finite_or_none(value) == {"a": None, "b": [1.0, None], "c": {"d": None, "e": 2}}


def test_payload_batch_and_log_tail() -> None:
    assert launcher.default_payload_args(2)[-2:] == ["--batch-size", "64"]
    assert launcher.default_payload_args(3)[-2:] == ["--batch-size", "66"]  # 3 ranks x 2 micro-steps divide it
    assert launcher.default_payload_args(64)[-2:] == ["--batch-size", "128"]
    lines = ["starting", "{", '  "verdict": "pass",', '  "losses": [', "    1.0", "  ]", "}", "done"]
    assert launcher.drop_printed_result(lines) == ["starting", "done"]
