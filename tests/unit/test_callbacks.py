"""plugins/callback: progress lines while a task runs long, and the summary at the end of a run (issue 16, 13 and 22).

The plugins are tested directly (a fake clock, fake results), and through a
real ansible-playbook run on the controller (local connection, a task that
sleeps) whose redirected output must carry the progress line, the summary and
no colour codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from ansible.plugins.loader import callback_loader

REPO = Path(__file__).resolve().parents[2]


def _plugin(name: str, **options):
    plugin = callback_loader.get(f"gpufleet.fleet.{name}")
    assert plugin is not None, f"gpufleet.fleet.{name} does not load"
    plugin.set_options(direct=options)
    return plugin


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _host(name):
    return SimpleNamespace(get_name=lambda: name)


def _task(name, ignore_unreachable=False):
    return SimpleNamespace(get_name=lambda: name, ignore_unreachable=ignore_unreachable)


def _result(host, task="Install the NVIDIA driver packages", ignore_unreachable=False, **res):
    return SimpleNamespace(_host=_host(host), _task=_task(task, ignore_unreachable), _result=res)


# --- progress -------------------------------------------------------------------


def test_elapsed_and_line_shapes():
    progress = sys.modules[type(_plugin("progress")).__module__]
    assert [progress.elapsed_text(s) for s in (9, 75, 3600)] == ["9s", "1m15s", "1h00m00s"]
    hosts = [f"node-{i:02d}" for i in range(1, 10)]
    assert progress.progress_line("Build", hosts, 90, max_hosts=2) == (
        "... 1m30s: Build still running on node-01, node-02 and 7 more"
    )


def test_a_long_task_gets_a_line_per_interval_until_its_last_host_answers():
    plugin = _plugin("progress", interval=30)
    plugin._clock = clock = Clock()
    plugin.v2_playbook_on_task_start(_task("Install the NVIDIA driver packages"), False)
    for host in ("gpu-02", "gpu-01"):
        plugin.v2_runner_on_start(_host(host), None)
    clock.now += 29
    assert plugin.tick() is None
    clock.now += 1
    assert plugin.tick() == "... 30s: Install the NVIDIA driver packages still running on gpu-01, gpu-02"
    assert plugin.tick() is None  # once per interval
    plugin.v2_runner_on_ok(_result("gpu-01"))
    clock.now += 30
    assert plugin.tick() == "... 1m00s: Install the NVIDIA driver packages still running on gpu-02"
    plugin.v2_runner_on_failed(_result("gpu-02"))
    clock.now += 60
    assert plugin.tick() is None


def test_a_quick_task_prints_nothing():
    plugin = _plugin("progress", interval=30)
    plugin._clock = clock = Clock()
    plugin.v2_playbook_on_task_start(_task("Read the state"), False)
    plugin.v2_runner_on_start(_host("gpu-01"), None)
    clock.now += 2
    plugin.v2_runner_on_skipped(_result("gpu-01"))
    clock.now += 100
    assert plugin.tick() is None


# --- summary --------------------------------------------------------------------


def _play(name):
    return SimpleNamespace(get_name=lambda: name)


def test_summary_names_plays_failed_hosts_and_reports(tmp_path):
    (tmp_path / "fleet-report.json").write_text(json.dumps({"verdict": "fail"}))
    plugin = _plugin("summary")
    plugin.v2_playbook_on_start(
        SimpleNamespace(get_plays=lambda: [_play(p) for p in ("Check", "Install", "Verify", "Smoke")])
    )
    plugin.v2_playbook_on_play_start(_play("Check"))
    plugin.v2_runner_on_failed(_result("gpu-01", "Apply the argument spec", msg="rejected"))
    plugin.v2_runner_on_ok(_result("gpu-01", "Collect the rejection"))  # rescued: not a stop
    for host in ("gpu-01", "gpu-02", "gpu-03"):
        plugin.v2_runner_on_ok(_result(host, "Probe"))
    # A rescued failure is the reason of a later stop in the same play.
    plugin.v2_runner_on_failed(_result("gpu-05", "Apply the argument spec", msg="cuda_release '11.0' is unknown"))
    plugin.v2_runner_on_ok(_result("gpu-05", "Remember the role"))
    plugin.v2_runner_on_failed(_result("gpu-05", "Stop a host", msg="settings of cuda rejected"))
    plugin.v2_playbook_on_play_start(_play("Install"))
    plugin.v2_runner_on_ok(_result("gpu-01"))
    plugin.v2_runner_on_failed(_result("gpu-02", msg="the package source http://mirror did not answer\nmore"))
    plugin.v2_runner_on_unreachable(_result("gpu-03", "Gathering Facts", msg="ssh: connect to host gpu-03 port 22"))
    plugin.v2_runner_on_failed(_result("gpu-04", msg="ignored"), ignore_errors=True)
    # A delegated probe of another host that may not answer: the host running it is not stopped.
    plugin.v2_runner_on_unreachable(
        _result(
            "gpu-01", "Gather the facts of nodes outside this run", ignore_unreachable=True, msg="All items completed"
        )
    )
    plugin.v2_playbook_on_play_start(_play("Verify"))
    plugin.v2_runner_on_ok(_result("gpu-01", "Check"))
    lines = plugin.summary_lines({"gpufleet_reports": {"verify": str(tmp_path / "fleet-report.md")}})
    assert lines[1] == "GPUFLEET SUMMARY"
    assert lines[2:] == [
        "Check: 3 ok, 1 failed",
        "Install: 2 ok, 1 failed, 1 unreachable",
        "Verify: 1 ok",
        "Smoke: not run (no host left, or the run stopped before it)",
        "failed: gpu-05 (Stop a host): settings of cuda rejected",
        "  because: cuda_release '11.0' is unknown",
        "failed: gpu-02 (Install the NVIDIA driver packages): the package source http://mirror did not answer",
        "unreachable: gpu-03 (Gathering Facts): ssh: connect to host gpu-03 port 22",
        f"report verify: {tmp_path / 'fleet-report.md'} (verdict: fail)",
    ]


# --- a real run -----------------------------------------------------------------


def test_a_real_run_prints_progress_while_a_task_runs_and_a_summary_at_the_end(tmp_path):
    """ansible-playbook with gpufleet's ansible.cfg, output redirected (as in CI): the 3 s task gets progress
    lines at a 1 s interval, the run ends with the summary, and no ANSI colour code is written."""
    playbook = tmp_path / "slow.yml"
    playbook.write_text(
        "- name: A slow step\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Build a kernel module\n      ansible.builtin.command: sleep 3\n      changed_when: false\n"
        "    - name: Announce a report\n      ansible.builtin.set_stats:\n"
        f"        data: {{gpufleet_reports: {{smoke: {tmp_path}/smoke-result.json}}}}\n"
    )
    (tmp_path / "smoke-result.json").write_text('{"verdict": "pass"}')
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "GPUFLEET_PROGRESS_INTERVAL": "1",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
    }
    env.pop("ANSIBLE_FORCE_COLOR", None)
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(playbook)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Build a kernel module still running on localhost" in run.stdout
    assert run.stdout.rstrip().splitlines()[-3:] == [
        "GPUFLEET SUMMARY",
        "A slow step: 1 ok",
        f"report smoke: {tmp_path}/smoke-result.json (verdict: pass)",
    ]
    assert "\x1b[" not in run.stdout


def test_forkshare_freezes_before_each_task_and_collects_what_the_run_dropped():
    """Before a task the live heap is frozen (the workers forked next do not walk it); a cycle dropped after it was
    frozen stays frozen across tasks while the heap does not grow, and is collected at the next play's start, or at
    the next task once the heap (its allocated blocks) has grown by a quarter; the run's end thaws everything."""
    import gc
    import weakref

    plugin = _plugin("forkshare")

    class Node:
        pass

    def dropped_cycle():
        cycle = Node()
        cycle.self = cycle
        return cycle, weakref.ref(cycle)

    try:
        plugin.v2_playbook_on_play_start(SimpleNamespace())
        cycle, dropped = dropped_cycle()
        plugin.v2_playbook_on_task_start(_task("Gather facts"), is_conditional=False)
        assert gc.get_freeze_count() > 0
        del cycle
        assert dropped() is not None  # frozen: no collection walks it
        plugin.v2_playbook_on_handler_task_start(_task("Restart munge"))
        assert dropped() is not None  # the heap did not grow: no full collection before this task
        plugin.v2_playbook_on_play_start(SimpleNamespace())
        assert dropped() is None and gc.get_freeze_count() > 0
        # Grown by more than a quarter since the last full collection: the next task collects.
        cycle, dropped = dropped_cycle()
        plugin.v2_playbook_on_task_start(_task("Probe"), is_conditional=False)
        del cycle
        grown = [[] for _number in range(sys.getallocatedblocks() // 3 + 1000)]
        plugin.v2_playbook_on_task_start(_task("Install"), is_conditional=False)
        assert dropped() is None and gc.get_freeze_count() >= len(grown)
        plugin.v2_playbook_on_stats(SimpleNamespace())
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
