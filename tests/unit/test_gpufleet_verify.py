"""files/gpufleet_verify.py: exit status, cross-check with the run's stats and arguments, with ansible-runner faked."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
from conftest import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "files" / "gpufleet_verify.py"


def load_verify():
    return load_script(SCRIPT)


verify = load_verify()


def check_result(verdict: str = "pass", reasons: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "schema": "gpufleet-check/1",
        "verdict": verdict,
        "reasons": list(reasons),
        "reboot_required": False,
        "versions": {"driver_installed": "535.261.03", "cuda": "12.1", "torch": "2.5.1+cu121"},
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "checks": [
            {
                "name": "gemm",
                "verdict": verdict,
                "value": 701.3,
                "unit": "TFLOP/s",
                "threshold": 494.5,
                "detail": "GPU 0",
            }
        ],
    }


PASS = {"result": check_result(), "error": None}
FAIL = {"result": check_result("fail", ("gemm: GPU 0 at 201.3 TFLOP/s, below 494.5",)), "error": None}
UNREACHABLE = {"result": None, "error": "unreachable: ssh: connect to host 10.0.0.3 port 22: No route to host"}


def recap(hosts: dict[str, Any], dark: tuple[str, ...] = ()) -> dict[str, dict[str, int]]:
    """ansible-runner's stats for a run over ``hosts``, with ``dark`` unreachable."""
    return {
        "ok": {host: 10 for host in hosts if host not in dark},
        "dark": {host: 1 for host in dark},
        "failures": {},
        "skipped": {},
        "ignored": {},
        "rescued": {},
        "changed": {},
        "processed": {host: 1 for host in hosts},
    }


class FakeRunner:
    """Stands in for run_playbook: writes the fleet report the play would write, answers with canned stats."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.hosts: dict[str, Any] | None = {}
        self.stats: dict[str, dict[str, int]] | None = None
        self.status, self.rc = "successful", 0

    def __call__(self, run: Any) -> Any:
        self.calls.append(run)
        if self.hosts is not None:
            doc = {
                "generated": "2026-11-29T22:40:00Z",
                "inventory": str(run.inventory),
                "playbook": "verify",
                "hosts": self.hosts,
            }
            # What the play's action does (roles/gpu_verify/tasks/report.yml), with the settings the options gave.
            settings = {
                option: run.extravars[variable]
                for option, variable in verify.REPORT_OPTIONS.items()
                if variable in run.extravars
            }
            verify.fleet_report.write_run_report(doc, Path(run.extravars["gpu_verify_report_dir"]), **settings)
        stats = recap(self.hosts or {}) if self.stats is None else self.stats
        return verify.RunOutcome(status=self.status, rc=self.rc, stats=stats)


@pytest.fixture(name="runner")
def fixture_runner(monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    fake = FakeRunner()
    monkeypatch.setattr(verify, "run_playbook", fake)
    return fake


@pytest.fixture(name="inventory")
def fixture_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory" / "hosts.yml"
    path.parent.mkdir()
    path.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        node-1:\n")
    return path


@pytest.fixture(name="main")
def fixture_main(inventory: Path, tmp_path: Path) -> Callable[..., int]:
    """main() with the fixture inventory and a report directory in tmp_path."""

    def run_main(*args: str) -> int:
        return verify.main(["-i", str(inventory), "--report-dir", str(tmp_path / "reports"), *args])

    return run_main


# --- exit status ---------------------------------------------------------------------------------


def test_every_node_passed_exits_0_and_prints_the_table(runner, main, capsys):
    runner.hosts = {"node-1": PASS, "node-2": PASS}
    assert main() == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[:2] == ["PASS: 2 nodes: 2 passed, 0 failed, 0 unreachable", ""]
    assert lines[2].startswith("| Node ")
    assert [line.split("|")[1].strip() for line in lines[4:]] == ["node-1", "node-2"]
    assert err == ""


def test_failed_and_unreachable_nodes_exit_1_named_on_stderr(runner, main, capsys, tmp_path):
    runner.hosts = {"node-1": PASS, "node-2": FAIL, "node-3": UNREACHABLE}
    runner.status, runner.rc = "failed", 2  # verify.yml fails the nodes that did not pass
    assert main() == 1
    out, err = capsys.readouterr()
    # The verdict, the failed nodes grouped by cause, then the table (header, rule, 3 nodes).
    assert out.splitlines()[:4] == [
        "FAIL: 3 nodes: 1 passed, 1 failed, 1 unreachable",
        "  1 node: failed gemm (node-2)",
        "  1 node: unreachable (node-3)",
        "",
    ]
    assert len(out.splitlines()) == 9
    assert err.splitlines() == [
        f"gpufleet_verify: 2 nodes did not pass (report: {tmp_path / 'reports' / 'fleet-report.md'}):",
        "  node-2: FAIL: gemm: GPU 0 at 201.3 TFLOP/s, below 494.5",
        "  node-3: UNREACHABLE: unreachable: ssh: connect to host 10.0.0.3 port 22: No route to host",
    ]


def test_no_report_exits_2_with_the_runner_status_and_rc(runner, main, capsys, tmp_path):
    runner.hosts, runner.stats = None, {}
    runner.status, runner.rc = "failed", 4
    assert main() == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"gpufleet_verify: no fleet report: playbooks/verify.yml did not write "
        f"{tmp_path / 'reports' / 'fleet-report.json'} (ansible-runner status failed, rc 4)\n"
    )


def test_a_report_left_from_an_earlier_run_is_no_report(runner, main, capsys):
    runner.hosts = {"node-1": PASS}
    assert main() == 0
    runner.hosts, runner.status, runner.rc = None, "failed", 1
    assert main() == 2
    assert "(the file there is from an earlier run) (ansible-runner status failed, rc 1)" in capsys.readouterr().err


def test_a_report_without_nodes_exits_2(runner, main, capsys):
    runner.hosts = {}
    assert main("--limit", "no-such-host") == 2
    assert "lists no nodes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not JSON"),
        (json.dumps({"schema": "gpufleet-check/1", "nodes": []}), "is not a gpufleet-fleet-report/1 report"),
    ],
)
def test_an_unreadable_report_exits_2(monkeypatch, main, capsys, content, message):
    def write_garbage(run: Any) -> Any:
        report_dir = Path(run.extravars["gpu_verify_report_dir"])
        report_dir.mkdir()
        (report_dir / "fleet-report.json").write_text(content)
        return verify.RunOutcome(status="successful", rc=0, stats={})

    monkeypatch.setattr(verify, "run_playbook", write_garbage)
    assert main() == 2
    assert message in capsys.readouterr().err


# --- cross-check with the run's stats ------------------------------------------------------------


def test_dark_host_reported_unreachable_is_consistent(runner, main, capsys):
    runner.hosts = {"node-1": PASS, "node-2": UNREACHABLE}
    runner.stats = recap(runner.hosts, dark=("node-2",))
    assert main() == 1
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  node-2: UNREACHABLE: unreachable: ssh: connect to host 10.0.0.3 port 22: No route to host"
    ]


@pytest.mark.parametrize(("entry", "verdict"), [(PASS, "PASS"), (FAIL, "FAIL")])
def test_dark_host_not_reported_unreachable_is_a_problem(runner, main, capsys, entry, verdict):
    runner.hosts = {"node-1": PASS, "node-2": entry}
    runner.stats = recap(runner.hosts, dark=("node-2",))
    assert main() == 1
    problem = capsys.readouterr().err.splitlines()[1]
    assert problem.startswith(f"  node-2: unreachable in the playbook run, but {verdict} in the report: ")


def test_host_absent_from_the_report_is_a_problem(runner, main, capsys):
    runner.hosts = {"node-1": PASS}
    runner.stats = recap({"node-1": PASS, "node-2": PASS, "node-3": PASS}, dark=("node-3",))
    assert main() == 1
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  node-2: ran in the playbook run, but absent from the report",
        "  node-3: unreachable in the playbook run, but absent from the report",
    ]


def test_run_without_stats_trusts_the_report(runner, main):
    runner.hosts, runner.stats = {"node-1": PASS}, {}
    assert main() == 0


# --- arguments -----------------------------------------------------------------------------------


def test_arguments_reach_the_playbook_run(runner, main, tmp_path, inventory):
    runner.hosts = {"node-1": PASS}
    assert (
        main(
            "--limit",
            "node-1:node-2",
            "--check",
            "--quiet",
            "-e",
            "gpu_verify_quick=true",
            "--extra-var",
            "gpu_verify_skip_checks=allreduce_busbw",
            "-e",
            "note=a=b",
        )
        == 0
    )
    assert runner.calls == [
        verify.PlaybookRun(
            inventory=inventory,
            limit="node-1:node-2",
            extravars={
                "gpu_verify_quick": "true",
                "gpu_verify_skip_checks": "allreduce_busbw",
                "note": "a=b",
                "gpu_verify_report_dir": str(tmp_path / "reports"),
            },
            check_mode=True,
            quiet=True,
        )
    ]


def test_defaults_resolve_against_the_working_directory(runner, inventory, monkeypatch, tmp_path):
    monkeypatch.chdir(inventory.parent)
    runner.hosts = {"node-1": PASS}
    assert verify.main(["-i", "hosts.yml"]) == 0
    run = runner.calls[0]
    assert (run.inventory, run.limit, run.check_mode, run.quiet) == (inventory, None, False, False)
    assert run.extravars == {"gpu_verify_report_dir": str(inventory.parent / "reports" / "verify")}
    assert (inventory.parent / "reports" / "verify" / "fleet-report.xml").exists()


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["-i"],
        ["-i", "{inventory}", "-e", "novalue"],
        ["-i", "{inventory}", "-e", "not a name=1"],
        ["-i", "{inventory}", "-e", "gpu_verify_report_dir=/tmp/elsewhere"],
        ["-i", "{inventory}", "--unknown"],
        ["-i", "{tmp_path}/missing/hosts.yml"],
        ["-i", "{inventory}", "-e", "gpu_verify_history_keep=5"],
        ["-i", "{inventory}", "--repeat-failures", "4"],
        ["-i", "{inventory}", "--history-keep", "2"],
        ["-i", "{inventory}", "--repeat-runs", "-1"],
        ["-i", "{inventory}", "--outlier-fraction", "1"],
    ],
)
def test_bad_arguments_exit_2_without_running(runner, inventory, tmp_path, capsys, args):
    assert verify.main([arg.format(inventory=inventory, tmp_path=tmp_path) for arg in args]) == 2
    assert runner.calls == []
    assert capsys.readouterr().err


def test_history_options_reach_the_play_and_the_repeat_offenders_are_printed(runner, main, capsys, tmp_path):
    """Three runs into one report directory, node-2 failing in the first and the third: the third prints it as a
    repeat offender with both runs' reasons (the options are the role's variables, typed)."""
    runner.hosts = {"node-1": PASS, "node-2": FAIL}
    assert main("--history-keep", "5", "--repeat-failures", "2", "--repeat-runs", "3", "--outlier-fraction", "0.2") == 1
    assert {key: value for key, value in runner.calls[0].extravars.items() if key != "gpu_verify_report_dir"} == {
        "gpu_verify_history_keep": 5,
        "gpu_verify_repeat_failures": 2,
        "gpu_verify_repeat_runs": 3,
        "gpu_verify_outlier_fraction": 0.2,
    }
    runner.hosts = {"node-1": PASS, "node-2": PASS}
    assert main("--history-keep", "5") == 0
    runner.hosts = {"node-1": PASS, "node-2": FAIL}
    capsys.readouterr()
    assert main("--history-keep", "5") == 1
    out = capsys.readouterr().out.splitlines()
    assert "  1 repeat offender: node-2" in out
    start = out.index("Repeat offenders (failed in 2 or more of their last 3 runs, history: 3 runs):")
    assert out[start + 1] == "  node-2: failed 2 of its last 3 runs → investigate (drain and investigate)"
    assert out[start + 2].endswith("FAIL: gemm: GPU 0") and out[start + 3].endswith("FAIL: gemm: GPU 0")
    history = (tmp_path / "reports" / "history" / "fleet-history.jsonl").read_text().splitlines()
    assert len(history) == 3


def test_report_dir_is_set_with_its_option_only(inventory, capsys):
    assert verify.main(["-i", str(inventory), "-e", "gpu_verify_report_dir=x"]) == 2
    assert "set gpu_verify_report_dir with --report-dir, not -e" in capsys.readouterr().err


def test_help_exits_0(runner, capsys):
    assert verify.main(["--help"]) == 0
    assert "-i INVENTORY" in capsys.readouterr().out
    assert runner.calls == []


# --- the ansible-runner call ---------------------------------------------------------------------


def test_run_playbook_calls_ansible_runner(monkeypatch, tmp_path):
    seen: dict[str, Any] = {}
    stats = {"dark": {"node-2": 1}, "processed": {"node-1": 1, "node-2": 1}}

    def fake_run(**kwargs: Any) -> Any:
        seen.update(kwargs, private_data_dir_existed=Path(kwargs["private_data_dir"]).is_dir())
        return SimpleNamespace(status="failed", rc=2, stats=stats)

    monkeypatch.setitem(sys.modules, "ansible_runner", SimpleNamespace(run=fake_run))
    run = verify.PlaybookRun(
        inventory=tmp_path / "hosts.yml",
        limit="node-*",
        extravars={"gpu_verify_report_dir": "/r"},
        check_mode=True,
        quiet=True,
    )
    outcome = verify.run_playbook(run)
    assert outcome == verify.RunOutcome(status="failed", rc=2, stats=stats)
    assert seen["private_data_dir_existed"] and not Path(seen["private_data_dir"]).exists()
    passed = ("project_dir", "playbook", "inventory", "limit", "extravars", "cmdline", "quiet")
    assert {key: seen[key] for key in passed} == {
        "project_dir": str(REPO_ROOT),
        "playbook": str(REPO_ROOT / "playbooks" / "verify.yml"),
        "inventory": str(tmp_path / "hosts.yml"),
        "limit": "node-*",
        "extravars": {"gpu_verify_report_dir": "/r"},
        "cmdline": "--check",
        "quiet": True,
    }
    assert seen["envvars"]["ANSIBLE_CONFIG"] == str(REPO_ROOT / "ansible.cfg")
    assert seen["envvars"]["PATH"].startswith(f"{Path(sys.executable).parent}:")


def test_run_playbook_without_check_mode_and_without_recap(monkeypatch, tmp_path):
    seen: dict[str, Any] = {}

    def fake_run(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return SimpleNamespace(status="failed", rc=4, stats=None)  # the playbook ended before its recap

    monkeypatch.setitem(sys.modules, "ansible_runner", SimpleNamespace(run=fake_run))
    run = verify.PlaybookRun(inventory=tmp_path, limit=None, extravars={}, check_mode=False, quiet=False)
    outcome = verify.run_playbook(run)
    assert (outcome.stats, seen["cmdline"], seen["limit"]) == ({}, None, None)


def test_missing_ansible_runner_exits_2(monkeypatch, main, capsys):
    monkeypatch.setitem(sys.modules, "ansible_runner", None)  # makes `import ansible_runner` raise ImportError
    assert main() == 2
    assert "the Python of the virtual environment that holds ansible-runner" in capsys.readouterr().err


def test_the_playbook_and_config_it_runs_exist():
    assert verify.PLAYBOOK.is_file() and verify.ANSIBLE_CONFIG.is_file()


def test_the_report_module_is_the_collections_one():
    """The report's code is plugins/module_utils/fleet_report.py, imported through the collection gpufleet.fleet
    (the checkout's .ansible/collections link, as ansible.cfg's collections_path has it), the action plugin's."""
    assert verify.fleet_report.__name__ == verify.FLEET_REPORT_MODULE
    assert Path(verify.fleet_report.__file__).resolve() == REPO_ROOT / "plugins" / "module_utils" / "fleet_report.py"
    assert verify.collection_root() == REPO_ROOT / ".ansible" / "collections"


def test_an_installed_collection_is_found_as_its_own_root(tmp_path):
    """Installed (ansible-galaxy collection install): <path>/ansible_collections/gpufleet/fleet is the root's."""
    installed = tmp_path / "collections" / "ansible_collections" / "gpufleet" / "fleet"
    installed.mkdir(parents=True)
    assert verify.collection_root(installed) == tmp_path / "collections"
    assert verify.collection_root(tmp_path / "clone-without-link") is None


def test_a_checkout_without_the_link_loads_the_module_by_path(tmp_path):
    clone = tmp_path / "clone"
    (clone / "plugins" / "module_utils").mkdir(parents=True)
    (clone / "plugins" / "module_utils" / "fleet_report.py").write_text(
        (REPO_ROOT / "plugins" / "module_utils" / "fleet_report.py").read_text()
    )
    module = verify.load_fleet_report(clone)
    assert module.REPORT_SCHEMA == "gpufleet-fleet-report/1" and module.__file__ == str(
        clone / "plugins" / "module_utils" / "fleet_report.py"
    )
