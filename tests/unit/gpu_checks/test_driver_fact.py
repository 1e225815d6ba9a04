"""The nvidia_driver role's local fact (--driver-fact), as the checks read it and as gpu_verify passes it."""

from __future__ import annotations

import json
import shlex
from typing import Any

import jinja2
import pytest
import yaml
from gpufleet_check import checks, cli, facts

from .fakes import FakeHost, explain, probe, run_cli
from .payload_path import PAYLOAD_DIR

# --------------------------------------------------------------------------- the driver fact (--driver-fact)

DRIVER_FACT = {
    "branch": "535",
    "source": "cuda-repo",
    "requested_version": "latest",
    "pinned_version": "535.261.03",
    "installed_version": "535.261.03",
    "loaded_version": "535.261.03",
    "gpus": 0,
    "reboot_required": False,
    "reboot_reasons": [],
}


def driver_fact_fields(report: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(report["versions"][key] for key in ("driver_requested", "driver_pinned", "driver_source"))


def test_cli_reads_the_driver_fact(driver_only: FakeHost) -> None:
    """An executable fact (the nvidia_driver role's script) is run: what was asked and what was pinned."""
    fact = driver_only.driver_fact(json.dumps(DRIVER_FACT))
    proc = run_cli(driver_only, *driver_only.argv("--json", "--skip", "torch_cuda", "--driver-fact", str(fact)))
    assert proc.returncode == 0, explain(proc)
    report = json.loads(proc.stdout)
    assert driver_fact_fields(report) == ("latest", "535.261.03", "cuda-repo")
    assert report["notes"] == [] and report["verdict"] == "pass"


@pytest.mark.parametrize("requested, shown", [("", "default"), ("535.261.03", "535.261.03"), (None, None)])
def test_driver_fact_requested_version(driver_only: FakeHost, requested: str | None, shown: str | None) -> None:
    """The role's default ("" asked) reads "default"; an exact version as asked; a fact without the field: null."""
    fact = {**DRIVER_FACT, "requested_version": requested}
    if requested is None:
        del fact["requested_version"]
    p = probe(driver_only, "--driver-fact", str(driver_only.driver_fact(json.dumps(fact))))
    assert checks.report_versions(p)["driver_requested"] == shown
    assert checks.report_versions(p)["driver_pinned"] == "535.261.03"


def test_driver_fact_not_executable_is_read_as_json(driver_only: FakeHost) -> None:
    fact = driver_only.driver_fact(json.dumps({**DRIVER_FACT, "source": "debian"}), executable=False)
    p = probe(driver_only, "--driver-fact", str(fact))
    assert driver_fact_fields(checks.build_report(p.args)) == ("latest", "535.261.03", "debian")
    assert p.driver_fact == (DRIVER_FACT | {"source": "debian"}, "")


def test_missing_driver_fact_is_a_note_not_a_failure(driver_only: FakeHost) -> None:
    missing = driver_only.root / "facts.d" / "nvidia_driver.fact"
    proc = run_cli(driver_only, *driver_only.argv("--json", "--skip", "torch_cuda", "--driver-fact", str(missing)))
    assert proc.returncode == 0, explain(proc)
    report = json.loads(proc.stdout)
    assert report["verdict"] == "pass" and driver_fact_fields(report) == (None, None, None)
    assert report["notes"] == [f"driver fact {missing}: not found (the nvidia_driver role did not run here)"]
    summary = run_cli(driver_only, *driver_only.argv("--skip", "torch_cuda", "--driver-fact", str(missing)))
    assert summary.stdout.splitlines()[-1] == f"note: {report['notes'][0]}"


@pytest.mark.parametrize(
    "output, executable, note",
    [
        ('{"requested_version": "latest",', True, 'not a JSON object: {"requested_version": "latest",'),
        ("not json", False, "not a JSON object: not json"),
        ("[1, 2]", True, "not a JSON object: [1, 2]"),
        ("", True, "not a JSON object: empty output"),
    ],
)
def test_broken_driver_fact_is_a_note(driver_only: FakeHost, output: str, executable: bool, note: str) -> None:
    fact = driver_only.driver_fact(output, executable=executable)
    report = checks.build_report(cli.parse_args(driver_only.argv("--skip", "torch_cuda", "--driver-fact", str(fact))))
    assert report["verdict"] == "pass" and driver_fact_fields(report) == (None, None, None)
    assert report["notes"] == [f"driver fact {fact}: {note}"]


def test_failing_or_slow_driver_fact_is_a_note(driver_only: FakeHost) -> None:
    fact = driver_only.root / "nvidia_driver.fact"
    fact.write_text("#!/bin/sh\necho 'dpkg-query: broken' >&2\nexit 3\n")
    fact.chmod(0o755)
    assert facts.read_driver_fact(str(fact)) == (None, f"driver fact {fact}: exited 3: dpkg-query: broken")
    fact.write_text("#!/bin/sh\nwhile :; do :; done\n")  # no sleep on the fake host's PATH
    assert facts.read_driver_fact(str(fact), timeout=0.2) == (None, f"driver fact {fact}: no answer within 0.2 s")


def test_driver_fact_output_with_extra_lines() -> None:
    assert facts.parse_driver_fact("warning: something\n" + json.dumps(DRIVER_FACT)) == DRIVER_FACT


def role_command_line(**settings: Any) -> list[str]:
    """The options roles/gpu_verify/tasks/check.yml passes the checks, rendered with the role's defaults
    overridden by settings (plain Jinja2 with the filters the command uses)."""
    role = PAYLOAD_DIR.parents[1] / "gpu_verify"
    task = next(
        t for t in yaml.safe_load((role / "tasks" / "check.yml").read_text()) if t["name"] == "Run the health checks"
    )
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(
        {"quote": shlex.quote, "float": float, "int": int, "string": str, "bool": bool, "gpufleet.fleet.as_list": list}
    )
    values = {
        "__gpu_verify_check_script": "/tmp/gpufleet_check.pyz",
        "__gpu_verify_cuda": "12.1",
        "__gpu_verify_torch_cudnn": "",
        "__gpu_verify_torch_nccl": "",
        "__gpu_verify_dcgm": {"level": 1, "timeout": 300},
        "__gpu_verify_profile_overrides": "",
        "gpu_verify_module_version_file": "/sys/module/nvidia/version",
        "gpu_verify_metrics_file": "",
        "__gpu_verify_launcher": "launch",
        "gpu_verify_python": "/opt/gpufleet/venv/bin/python",
        "__gpu_verify_fallback_python": "/usr/bin/python3",
        **{
            k: v
            for k, v in yaml.safe_load((role / "defaults" / "main.yml").read_text()).items()
            if not (isinstance(v, str) and "{{" in v)
        },
        **settings,
    }
    words = shlex.split(env.from_string(task["ansible.builtin.command"]["cmd"]).render(**values))
    # sh -c <launcher> <its $0> <the venv's python> <the fallback>, then the checks' own options
    assert words[:6] == ["sh", "-c", "launch", "gpufleet-check", "/opt/gpufleet/venv/bin/python", "/usr/bin/python3"]
    return words[6:]


@pytest.mark.parametrize(
    "settings, fact",
    [
        ({}, "/etc/ansible/facts.d/nvidia_driver.fact"),
        ({"gpu_verify_driver_fact_file": "/srv/facts.d/nvidia driver.fact"}, "/srv/facts.d/nvidia driver.fact"),
        ({"gpu_verify_driver_fact_file": ""}, ""),
    ],
)
def test_gpu_verify_passes_the_driver_fact(settings: dict[str, Any], fact: str) -> None:
    """The role's command line is one the checks accept; gpu_verify_driver_fact_file becomes --driver-fact
    (left out when empty): no task of its own on hundreds of nodes."""
    argv = role_command_line(**settings)
    assert ("--driver-fact" in argv) == bool(fact)
    args = cli.parse_args(argv)
    assert (args.driver_fact, args.module_version_file, args.expect_cuda) == (
        fact,
        "/sys/module/nvidia/version",
        "12.1",
    )
