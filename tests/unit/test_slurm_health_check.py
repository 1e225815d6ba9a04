"""roles/slurm/files/gpufleet_slurm_health.py, Slurm's HealthCheckProgram: its decision table, run for real.

The checks are the committed gpufleet_check.pyz, run for real under coreutils' timeout on a fake host (no GPU,
a loaded-module version file and a userspace driver library of the lab's driver, torch's two checks skipped, as
the lab's health check runs): the driver/library mismatch the e2e tests forge (module 535.1.0, library
535.261.03) is a real failing report. Only Slurm is simulated: sinfo and scontrol are answered by a fake that
records what the program asked, and sinfo's %E is a node's reason as Slurm prints it.

Slurm's semantics (slurm.conf(5) and sinfo(1) of Slurm 19.05.5, 21.08.5 and 22.05.8, the releases of Ubuntu
20.04, 22.04 and Debian 12; https://github.com/SchedMD/slurm/blob/slurm-22-05-8-1/doc/man/man5/slurm.conf.5):
HealthCheckProgram "will be killed if it does not terminate normally within 60 seconds" and is run with no
argument (src/slurmd/slurmd/slurmd.c run_script_health_check: cmd_argv = {program, NULL}; from 21.08 with
SLURMD_NODENAME, in 19.05 with an empty environment); sinfo --states "DRAIN (for node in DRAINING or DRAINED
states)", %E "The reason a node is unavailable (down, drained, or draining states)", printed whole without a
field width (src/sinfo/print.c _print_str) and as "none" when the node has none (_print_reason)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import ROLES_DIR

PROGRAM = ROLES_DIR / "slurm" / "files" / "gpufleet_slurm_health.py"
ZIPAPP = ROLES_DIR / "payload" / "files" / "gpufleet_check.pyz"
LAB_DRIVER = "535.261.03"
NODE = "gpufleet-node-1"
# Reasons other than gpufleet's, as Slurm prints them: an administrator's (the e2e test's), Slurm's own
# ("Kill task failed": sinfo -R of https://github.com/awslabs/awsome-distributed-ai/issues/185), and
# playbooks/upgrade-driver.yml's rollout drain, which has no "gpufleet: " marker.
ADMIN = "admin: maintenance"
SLURM_OWN = "Kill task failed"
ROLLOUT = "gpufleet driver upgrade to 535.309.01"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpufleet_slurm_health", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


health = load()


class FakeSlurm:
    """sinfo and scontrol for one node; every other command runs for real (timeout, python, the zipapp)."""

    def __init__(self, drain_reason: str | None = None, fail: str = "") -> None:
        self.drain_reason, self.fail = drain_reason, fail
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        if argv[0] in ("sinfo", "scontrol"):
            self.calls.append(argv)
            if self.fail == argv[0]:
                return subprocess.CompletedProcess(
                    argv, 1, "", "slurm_load_node error: Unable to contact slurm controller"
                )
            if argv[0] == "scontrol":
                state = next(a for a in argv if a.startswith("State="))
                self.drain_reason = (
                    next(a for a in argv if a.startswith("Reason="))[7:] if state == "State=DRAIN" else None
                )
                return subprocess.CompletedProcess(argv, 0, "", "")
            assert argv[1:] == ["--noheader", "--Node", f"--nodes={NODE}", "--states=DRAIN", "--format=%E"], argv
            return subprocess.CompletedProcess(
                argv, 0, "" if self.drain_reason is None else self.drain_reason + "\n", ""
            )
        return subprocess.run(argv, check=False, **kwargs)  # the health check reads the return codes

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "scontrol"]


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    """A node without GPUs with the lab driver installed, its module version file, and a textfile directory."""
    for name in ("sysfs", "libs", "textfile"):
        (tmp_path / name).mkdir()
    (tmp_path / "libs" / f"libnvidia-ml.so.{LAB_DRIVER}").write_text("")
    module = tmp_path / "nvidia-module-version"
    module.write_text(LAB_DRIVER + "\n")
    checks = [
        "--quick",
        "--dcgm-level",
        "0",
        "--skip=torch_cuda",
        "--skip=libraries",
        "--sysfs-pci-dir",
        str(tmp_path / "sysfs"),
        "--module-version-file",
        str(module),
        "--driver-proc-file",
        str(tmp_path / "none"),
        "--driver-lib-dir",
        str(tmp_path / "libs"),
    ]
    return {"root": tmp_path, "module": module, "checks": checks, "textfile": tmp_path / "textfile"}


def run(host: dict[str, Any], slurm: FakeSlurm, zipapp: Path = ZIPAPP, timeout: int = 40, *extra: str) -> int:
    argv = [
        "--zipapp",
        str(zipapp),
        "--python",
        sys.executable,
        "--timeout",
        str(timeout),
        "--textfile-dir",
        str(host["textfile"]),
        *extra,
        "--",
        *host["checks"],
    ]
    env = {"SLURMD_NODENAME": NODE, "PATH": os.environ["PATH"]}
    return health.main(argv, run=slurm, environ=env, clock=lambda: 1_700_000_000.0)


def metrics(host: dict[str, Any]) -> dict[str, str]:
    lines = (host["textfile"] / health.METRICS_FILE).read_text().splitlines()
    return dict(line.rsplit(" ", 1) for line in lines if not line.startswith("#"))


def mismatch(host: dict[str, Any]) -> None:
    host["module"].write_text("535.1.0\n")  # the upgrade without reboot the e2e tests forge


# --------------------------------------------------------------------------- the decision table, run for real


def test_a_failure_drains_the_node_naming_the_check_and_its_action_class(host):
    mismatch(host)
    slurm = FakeSlurm()
    assert run(host, slurm) == 0
    (update,) = slurm.updates()
    assert update[:4] == ["scontrol", "update", f"NodeName={NODE}", "State=DRAIN"]
    reason = update[4][len("Reason=") :]
    assert reason.startswith("gpufleet: driver_version [reboot]: "), reason
    assert "535.1.0" in reason and LAB_DRIVER in reason and len(reason) < 200, reason
    assert metrics(host) == {
        f'gpufleet_slurm_drained{{reason="{reason}"}}': "1",
        "gpufleet_slurm_health_check_passed": "0",
        "gpufleet_slurm_health_check_timestamp_seconds": "1700000000.000",
    }


def test_a_pass_resumes_a_node_gpufleet_drained_and_a_failure_drains_it_once(host):
    mismatch(host)
    slurm = FakeSlurm()
    run(host, slurm)
    drained = slurm.drain_reason
    run(host, slurm)  # still failing for the same reason: no second update
    assert len(slurm.updates()) == 1 and slurm.drain_reason == drained
    host["module"].write_text(LAB_DRIVER + "\n")  # the fault removed
    assert run(host, slurm) == 0
    assert slurm.updates()[-1] == ["scontrol", "update", f"NodeName={NODE}", "State=RESUME"]
    assert slurm.drain_reason is None
    assert metrics(host)['gpufleet_slurm_drained{reason=""}'] == "0"
    assert metrics(host)["gpufleet_slurm_health_check_passed"] == "1"


@pytest.mark.parametrize("reason", [ADMIN, SLURM_OWN, ROLLOUT])
def test_a_node_drained_by_anyone_else_is_never_touched(host, reason):
    slurm = FakeSlurm(reason)
    assert run(host, slurm) == 0  # passes: not resumed
    mismatch(host)
    assert run(host, slurm) == 0  # fails: the administrator's reason stays
    assert slurm.updates() == [] and slurm.drain_reason == reason
    assert metrics(host)['gpufleet_slurm_drained{reason=""}'] == "0"


def test_a_healthy_node_that_is_not_drained_is_left_alone(host):
    slurm = FakeSlurm()
    assert run(host, slurm) == 0
    assert slurm.updates() == [] and len(slurm.calls) == 1


def test_a_new_failure_replaces_gpufleet_s_own_older_reason(host):
    slurm = FakeSlurm("gpufleet: xid [drain]: Xid 48 on GPU 0")
    mismatch(host)
    run(host, slurm)
    assert slurm.drain_reason.startswith("gpufleet: driver_version [reboot]: ")


def test_a_check_that_hangs_is_stopped_within_the_budget_with_its_children_and_drains(host):
    """A check hung in a child (nvidia-smi that does not answer): timeout(1) stops its whole process group."""
    hang = host["root"] / "hang.py"
    pid_file = host["root"] / "child.pid"
    hang.write_text(
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen(['sleep', '60'])\nopen({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "child.wait()\n"
    )
    slurm = FakeSlurm()
    began = time.monotonic()
    assert run(host, slurm, hang, 1) == 0
    assert time.monotonic() - began < 10
    assert slurm.drain_reason == "gpufleet: health check timed out after 1 s"
    status = Path(f"/proc/{pid_file.read_text()}/status")
    deadline = time.monotonic() + 5
    while status.exists() and "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not status.exists() or "State:\tZ" in status.read_text(), "the hung child outlived the budget"


def test_a_check_that_crashes_drains_with_its_last_error_line(host):
    crash = host["root"] / "crash.py"
    crash.write_text("raise SystemExit('gpufleet_check: cannot import json')\n")
    slurm = FakeSlurm()
    run(host, slurm, crash)
    assert slurm.drain_reason == "gpufleet: health check could not run: gpufleet_check: cannot import json"


@pytest.mark.parametrize(
    "stdout", ["not json", '{"verdict": "maybe", "checks": []}', '["pass"]', '{"verdict": "pass"}']
)
def test_a_malformed_report_drains(host, stdout):
    bad = host["root"] / "bad.py"
    bad.write_text(f"print({stdout!r})\n")
    slurm = FakeSlurm()
    run(host, slurm, bad)
    assert slurm.drain_reason.startswith("gpufleet: health check could not run: "), slurm.drain_reason


def test_a_missing_zipapp_drains(host):
    slurm = FakeSlurm()
    run(host, slurm, host["root"] / "gone.pyz")
    assert slurm.drain_reason == f"gpufleet: health check could not run: {host['root'] / 'gone.pyz'} is missing"


def test_slurm_that_does_not_answer_is_an_error_and_leaves_the_node_unjudged_in_the_metrics(host, capsys):
    mismatch(host)
    assert run(host, FakeSlurm(fail="sinfo")) == 1
    assert "Unable to contact slurm controller" in capsys.readouterr().err
    assert metrics(host) == {
        "gpufleet_slurm_health_check_passed": "0",
        "gpufleet_slurm_health_check_timestamp_seconds": "1700000000.000",
    }


def test_no_textfile_directory_no_metrics_and_the_node_name_falls_back_to_the_short_host_name(host, monkeypatch):
    monkeypatch.setattr(health.socket, "gethostname", lambda: f"{NODE}.cluster.example")
    slurm = FakeSlurm()
    argv = [
        "--zipapp",
        str(ZIPAPP),
        "--python",
        "/nonexistent/python",
        "--fallback-python",
        sys.executable,
        "--textfile-dir",
        str(host["root"] / "absent"),
        "--",
        *host["checks"],
    ]
    assert health.main(argv, run=slurm, environ={}) == 0  # slurmd 19.05: an empty environment
    assert slurm.calls[0][3] == f"--nodes={NODE}"
    assert not (host["root"] / "absent").exists()


@pytest.mark.parametrize("timeout", ["0", "46", "x"])
def test_a_timeout_slurm_would_cut_short_is_a_usage_error(timeout, capsys):
    assert health.main(["--zipapp", "z", "--python", "p", "--timeout", timeout], run=FakeSlurm(), environ={}) == 2


# --------------------------------------------------------------------------- the pieces


def test_reason_names_the_first_failed_check_its_class_and_how_many_more():
    report = {
        "verdict": "fail",
        "checks": [
            {"name": "driver_version", "verdict": "pass", "detail": "ok"},
            {
                "name": "gpu_errors",
                "verdict": "fail",
                "detail": "GPU 0: row remap pending " + "x" * 300,
                "findings": [{"verdict": "warn", "action_class": None}, {"verdict": "fail", "action_class": "reboot"}],
            },
            {
                "name": "xid",
                "verdict": "fail",
                "detail": "Xid 79",
                "findings": [{"verdict": "fail", "action_class": "replace"}],
            },
        ],
    }
    outcome = health.judge_report(report)
    assert not outcome.healthy
    assert outcome.reason.startswith("gpufleet: gpu_errors [reboot]: GPU 0: row remap pending x")
    assert outcome.reason.endswith("... (+1 more failed)") and len(outcome.reason) < 200
    nothing = health.judge_report(
        {"verdict": "fail", "checks": [], "reasons": ["nothing was checked: no GPU (14 checks skipped)"]}
    )
    assert nothing.reason == "gpufleet: nothing was checked: no GPU (14 checks skipped)"


def test_action_classes_are_gpufleet_check_s():
    sys.path.insert(0, str(ROLES_DIR / "payload" / "files"))
    try:
        from gpufleet_check import health as check_health
    finally:
        sys.path.pop(0)
    assert health.ACTION_CLASSES == check_health.ACTION_CLASSES


@pytest.mark.parametrize(
    "stdout, reason",
    [
        ("", None),
        ("admin: maintenance\n", ADMIN),
        (
            "gpufleet: xid [drain]: Xid 48\ngpufleet: xid [drain]: Xid 48\n",
            "gpufleet: xid [drain]: Xid 48",
        ),  # a node in two partitions
        ("none\n", ""),
    ],
)
def test_sinfo_drain_reason(stdout, reason):
    assert health.drain_reason_from_sinfo(stdout) == reason


def test_metric_labels_are_escaped():
    text = health.metrics_text(False, 'gpufleet: x: say "no" \\ here', 1.0)
    assert 'gpufleet_slurm_drained{reason="gpufleet: x: say \\"no\\" \\\\ here"} 1' in text.splitlines()


def test_the_program_runs_on_python_3_8_syntax():
    """Ubuntu 20.04's /usr/bin/python3 is 3.8: no syntax newer than that (ast with feature_version)."""
    import ast

    ast.parse(PROGRAM.read_text(), feature_version=(3, 8))
    assert PROGRAM.read_text().startswith("#!/usr/bin/python3\n") and os.access(PROGRAM, os.X_OK)
