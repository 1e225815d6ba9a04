"""The suite's time is a budgeted property: the last rehearsal of
`CI=true bash .ci/run` on a fresh clone (docs/ci-rehearsal.json, written by
`tools/stages.py --record`) must have passed within the budget, and must
cover every stage the suite has today, so that a new molecule scenario or e2e
module is rehearsed before it lands. The table itself is tested here too."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("stages", REPO / "tools" / "stages.py")
stages = importlib.util.module_from_spec(spec)
sys.modules["stages"] = stages
spec.loader.exec_module(stages)


@pytest.fixture(scope="module")
def record() -> dict:
    path = stages.RECORD
    if not path.exists():  # only before the first rehearsal was ever recorded
        pytest.skip(f"{path} is missing: rehearse `STAGES_RECORD=1 CI=true bash .ci/run` on a fresh clone")
    return json.loads(path.read_text())


def test_budget_is_45_minutes_and_70_without_the_download_cache():
    assert stages.BUDGET_S == 45 * 60
    assert stages.COLD_BUDGET_S == 70 * 60


def test_download_cache_state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_LAB_CACHE", str(tmp_path / "absent"))
    assert stages.download_cache_state() == "cold"
    (tmp_path / "absent" / ".tmp-debs-1-x").mkdir(parents=True)  # a store cut off: not an entry
    assert stages.download_cache_state() == "cold"
    (tmp_path / "absent" / "debs-1").mkdir()
    assert stages.download_cache_state() == "warm"


def test_last_rehearsal_passed_within_the_budget(record):
    assert record["status"] == "passed", record["status"]
    assert record["ci"] is True, "record a rehearsal run as CI runs it (CI=true bash .ci/run)"
    assert not record["only"], "a rehearsal runs every stage"
    assert record["download_cache"] == "warm", "record the rehearsal of a machine that has built the lab before"
    assert record["total_s"] <= stages.BUDGET_S, (
        f"the last rehearsal took {record['total_s'] / 60:.1f} min, over the budget of {stages.BUDGET_S / 60:.0f} min:"
        " make the suite faster or move a test to the slow tier (docs/testing.md)"
    )


def test_last_rehearsal_covers_every_stage_of_today(record):
    if os.environ.get("STAGES_RECORD") == "1":
        # The rehearsal that records the stages of today (STAGES_RECORD=1 CI=true bash .ci/run): its own record,
        # written when it has passed, is what this test then reads; the one committed before it cannot know them.
        pytest.skip("this run is the rehearsal that records today's stages")
    assert [s["name"] for s in record["stages"]] == [s.name for s in stages.plan()], (
        "the stages changed since the last rehearsal: rehearse again and record it"
    )
    modules = {m for s in record["stages"] if s["name"].startswith("e2e") for m, _secs, _tests in s["detail"]}
    assert modules == {m.removesuffix(".py") for m in stages.suite_modules()}, (
        "the e2e modules changed since the last rehearsal: rehearse again and record it"
    )
    assert all(s["status"] == "passed" and s["seconds"] is not None for s in record["stages"])
    ran = {
        f"{m}::{t.split('[')[0]}" for s in record["stages"] for m, _secs, tests in s["detail"] for t, *_fields in tests
    }
    assert not ran & set(stages.slow_tests()), "a slow test ran in the suite: the rehearsal is of another tree"


@pytest.fixture(scope="module")
def slow_record() -> dict:
    path = stages.SLOW_RECORD
    assert path.exists(), f"{path} is missing: run `STAGES_RECORD=1 make test-slow` and commit it"
    return json.loads(path.read_text())


def test_last_slow_tier_run_passed_and_ran_every_slow_test_of_today(slow_record):
    """The tests taken out of make test still run: the last recorded slow tier passed, ran every test that
    is marked slow today, and nothing else than the converge before them."""
    assert slow_record["tier"] == "slow" and slow_record["status"] == "passed" and not slow_record["only"]
    assert [s["name"] for s in slow_record["stages"]] == [s.name for s in stages.plan("slow")]
    slow = next(s for s in slow_record["stages"] if s["name"] == "e2e slow")
    ran = {f"{m}::{t.split('[')[0]}": outcome for m, _secs, tests in slow["detail"] for t, _s, outcome in tests}
    assert set(ran) == set(stages.slow_tests()), (
        "the slow tests changed since the last slow-tier run: run `STAGES_RECORD=1 make test-slow` again"
    )
    assert set(ran.values()) == {"passed"}, ran


def test_the_slow_tier_is_listed_in_the_testing_docs():
    """docs/testing.md names every slow test, so that nothing leaves make test silently."""
    text = (REPO / "docs" / "testing.md").read_text()
    missing = [t for t in stages.slow_tests() if t.split("::")[1] not in text]
    assert stages.slow_tests() and not missing, missing


def test_slow_marks_are_read_from_the_source(tmp_path, monkeypatch):
    e2e = tmp_path / "tests" / "e2e"
    e2e.mkdir(parents=True)
    (e2e / "test_a.py").write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_long(): pass\n\n"
        "@pytest.mark.parametrize('x', [1])\ndef test_short(x): pass\n"
    )
    (e2e / "test_b.py").write_text("import pytest\npytestmark = [pytest.mark.slow]\n\ndef test_one(): pass\n")
    (e2e / "test_c.py").write_text("def test_plain(): pass\ndef helper(): pass\n")
    monkeypatch.setattr(stages, "REPO", tmp_path)
    assert stages.slow_tests() == ["test_a::test_long", "test_b::test_one"]
    assert stages.suite_modules() == ["test_a.py", "test_c.py"]
    suite, slow = stages.plan("suite"), stages.plan("slow")
    assert suite[-1].argv[-4:] == ["-m", "not slow", "tests/e2e/test_a.py", "tests/e2e/test_c.py"]
    assert [s.name for s in slow] == ["lab", "e2e converge", "e2e slow"]
    assert slow[-1].argv[-4:] == ["-m", "slow", "tests/e2e/test_a.py", "tests/e2e/test_b.py"]


def run_of(total: float, detail=None) -> dict:
    return {
        "started": "2026-11-30T00:00:00Z",
        "host": "h",
        "cores": 2,
        "ci": True,
        "budget_s": 2700,
        "download_cache": "warm",
        "total_s": total,
        "status": "passed",
        "only": "",
        "stages": [
            {"name": "lint", "seconds": 50.0, "status": "passed", "detail": []},
            {
                "name": "e2e modules",
                "seconds": 600.0,
                "status": "passed",
                "detail": detail or [["test_verify", 70.0, [["test_a", 65.0, "passed"]]]],
            },
        ],
    }


def test_table_shows_stages_modules_tests_and_the_comparison():
    md = stages.table(run_of(2000.0), previous=run_of(2100.0), record={})
    assert "| lint | passed | 50 s | 50 s | - |" in md
    assert "| &nbsp;&nbsp;test_verify | | 1:10 | 1:10 | - |" in md
    assert "test_a | passed | 1:05 |" in md
    assert "| **total** | passed | **33:20** | 35:00 | - |" in md
    assert "within the budget of 45:00" in md
    slow = {**run_of(4000.0), "tier": "slow"}
    assert "the slow tier: outside the suite's budget" in stages.table(slow, previous={}, record={})


def test_table_says_over_budget():
    assert "OVER the budget of 45:00" in stages.table(run_of(2701.0), previous={}, record={})


def test_junit_detail_groups_tests_by_module(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="test_bad_input" name="test_x[a]" time="10.5"/>'
        '<testcase classname="test_bad_input" name="test_x[b]" time="4.5"><failure/></testcase>'
        '<testcase classname="test_verify" name="test_v" time="3"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    assert stages.junit_detail(xml) == [
        ["test_bad_input", 15.0, [["test_x[a]", 10.5, "passed"], ["test_x[b]", 4.5, "failed"]]],
        ["test_verify", 3.0, [["test_v", 3.0, "skipped"]]],
    ]


def test_stages_of_two_lanes_run_at_once_and_the_first_failure_stops_the_rest(tmp_path, monkeypatch, capsys):
    """A lane's stage that waits for a file another lane's stage writes passes only if the two run at once; a
    failure lets no later stage start, in its lane, the other lane or after them."""
    monkeypatch.setattr(stages, "REPO", tmp_path)
    monkeypatch.setattr(stages, "LOGS", tmp_path / "logs")
    wait = ["sh", "-c", "for i in $(seq 100); do [ -e flag ] && echo seen && exit 0; sleep 0.1; done; exit 1"]
    plan = [
        stages.Stage("waits", wait, lane=1),
        stages.Stage("writes", ["touch", "flag"], lane=2),
        stages.Stage("after", ["true"]),
    ]
    assert stages.run_stages(plan) == 0
    assert [s.status for s in plan] == ["passed"] * 3
    out = capsys.readouterr().out
    assert "===== stage: waits =====\nseen\n===== stage: waits passed" in out

    # The failure comes once the other lane's stage has started (it writes a file first): a started stage runs to
    # its end, nothing starts after the failure. (A failure at once raced the other lane's start on a loaded
    # machine: the rehearsal of 2026-12-04 23:52.)
    fail_once_started = ["sh", "-c", "for i in $(seq 300); do [ -e started ] && exit 1; sleep 0.1; done; exit 2"]
    plan = [
        stages.Stage("fails", fail_once_started, lane=1),
        stages.Stage("next-in-lane", ["true"], lane=1),
        stages.Stage("slow-beside", ["sh", "-c", "touch started; sleep 1"], lane=2),
        stages.Stage("next-beside", ["true"], lane=2),
        stages.Stage("after", ["true"]),
    ]
    assert stages.run_stages(plan) == 1
    assert [s.status for s in plan] == ["failed", "not run", "passed", "not run", "not run"]


def test_the_suite_runs_the_controller_stages_and_the_dkms_scenario_beside_the_lab_and_the_others():
    plan = stages.plan()
    lanes = {s.name: s.lane for s in plan}
    assert [n for n, lane in lanes.items() if lane == 1] == ["lint", "unit", "payload", "molecule nvidia_driver"]
    assert [n for n, lane in lanes.items() if lane == 2][0] == "lab"
    assert lanes["e2e converge"] == 0 and lanes["e2e modules"] == 0
    # every molecule scenario runs after the lab: in the lab's lane, or waiting for it
    # and the scale test last in the lab's lane (light nodes: the lab's network and mirror, not its converge)
    lane_2 = [n for n, lane in lanes.items() if lane == 2]
    assert all(n.startswith("molecule ") for n in lane_2[1:-1]) and lane_2[-1] == "e2e scale"
    assert {s.name: s.after for s in plan if s.after} == {"molecule nvidia_driver": "lab"}
    # the scale test runs in its own stage, not again among the other e2e modules
    assert next(s for s in plan if s.name == "e2e scale").argv[-1] == stages.E2E_SCALE
    assert stages.E2E_SCALE not in next(s for s in plan if s.name == "e2e modules").argv
    assert "test_scale.py" in stages.suite_modules()


def test_a_stage_waits_for_the_stage_of_another_lane_it_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "REPO", tmp_path)
    monkeypatch.setattr(stages, "LOGS", tmp_path / "logs")
    plan = [
        stages.Stage("needs", ["test", "-e", "made"], lane=1, after="makes"),
        stages.Stage("makes", ["sh", "-c", "sleep 1 && touch made"], lane=2),
    ]
    assert stages.run_stages(plan) == 0
    plan = [stages.Stage("needs", ["true"], lane=1, after="fails"), stages.Stage("fails", ["false"], lane=2)]
    assert stages.run_stages(plan) == 1
    assert [s.status for s in plan] == ["not run", "failed"]
