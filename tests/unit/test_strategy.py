"""plugins/strategy/linear.py: linear without its busy waits, each template compiled once per run.

The unit tests' role runs (tests/unit/role_run.py) and every ansible-playbook
run of the suite go through this strategy (ansible.cfg's strategy), so its
plays' results are checked there; here, its own parts: the waits use no CPU,
the cache gives the template ansible-core would compile, once, and leaves
out what it must not keep.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from typing import Any

import pytest
from conftest import REPO_ROOT, ansible_playbook

from ansible_collections.gpufleet.fleet.plugins.strategy import linear

pytestmark = pytest.mark.skipif(not linear.PATCHED, reason="an ansible-core release the strategy does not patch")


def _engine():
    from ansible._internal._templating._engine import TemplateEngine
    from ansible.parsing.dataloader import DataLoader

    return TemplateEngine(loader=DataLoader(), variables={"a": 2, "b": 3})


def _trusted(text: str) -> str:
    from ansible._internal._datatag._tags import TrustedAsTemplate

    return TrustedAsTemplate().tag(text)


class _Workers:
    """What _wait_for_a_free_worker reads of a strategy: its worker processes."""

    def __init__(self, workers: list) -> None:
        self._workers = workers


def test_the_wait_for_a_free_worker_blocks_without_using_the_cpu():
    workers = [multiprocessing.Process(target=time.sleep, args=(seconds,)) for seconds in (0.6, 0.9)]
    for worker in workers:
        worker.start()
    try:
        wall, cpu = time.monotonic(), time.process_time()
        linear.StrategyModule._wait_for_a_free_worker(_Workers(workers))
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    finally:
        for worker in workers:
            worker.join()
    # It returned when the first worker exited, having used a few milliseconds of CPU (linear's loop: the whole wait).
    assert 0.4 < wall < 0.85 and cpu < 0.05, (wall, cpu)
    # A slot never used is free at once.
    started = time.monotonic()
    linear.StrategyModule._wait_for_a_free_worker(_Workers([None, workers[0]]))
    assert time.monotonic() - started < 0.1


def test_a_template_is_compiled_once_and_renders_as_ansible_core_renders_it():
    engine = _engine()
    text = _trusted("{{ a * b + 1000 }}")
    before = dict(linear.STATS)
    assert engine.template(text) == 1006
    assert _engine().template(_trusted("{{ a * b + 1000 }}")) == 1006
    assert linear.STATS["hits"] >= before["hits"] + 1
    # The same text with other variables: the compiled template is reused, the result is these variables'.
    from ansible._internal._templating._engine import TemplateEngine
    from ansible.parsing.dataloader import DataLoader

    assert TemplateEngine(loader=DataLoader(), variables={"a": 5, "b": 5}).template(text) == 1025
    # Expressions (conditions) too.
    assert engine.evaluate_expression(_trusted("a < b and b == 3")) is True
    assert engine.evaluate_expression(_trusted("a < b and b == 3")) is True


def test_what_the_cache_must_not_keep_is_compiled_each_time():
    engine = _engine()
    broken = _trusted("{{ a + }}")
    for attempt in range(2):
        with pytest.raises(Exception, match="(?i)syntax|unexpected|template"):
            engine.template(broken)
        assert attempt in (0, 1)
    assert not [key for key in linear._cache if key[1] == "{{ a + }}"]
    pulls_in = "{% include 'x.j2' %}"
    assert linear._PULLS_IN.search(pulls_in) and not linear._PULLS_IN.search("{% if a %}x{% endif %}")


def test_a_play_through_the_strategy_gives_linears_results(tmp_path):
    """Five hosts, two forks: every host runs every task in order, the templates of a task compiled before its
    workers fork give each host its own values, and a failing host stops alone."""
    plays = [
        {
            "name": "Strategy",
            "hosts": "all",
            "gather_facts": False,
            "strategy": "gpufleet.fleet.linear",
            "tasks": [
                {"name": "Wait", "ansible.builtin.command": "sleep 0.2", "changed_when": False},
                {"name": "Say", "ansible.builtin.set_fact": {"said": "{{ inventory_hostname }}-{{ number * 2 }}"}},
                {"name": "Stop one", "ansible.builtin.fail": {"msg": "stopped"}, "when": "number == 3"},
                {
                    "name": "Write",
                    "ansible.builtin.copy": {
                        "content": "{{ said }}",
                        "dest": f"{tmp_path}/said-{{{{ inventory_hostname }}}}",
                        "mode": "0644",
                    },
                },
            ],
        }
    ]
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "[all]\n" + "".join(f"h{n} ansible_connection=local number={n}\n" for n in range(1, 6)) + "[all:vars]\n"
        f"ansible_python_interpreter={REPO_ROOT / '.venv' / 'bin' / 'python'}\n"
    )
    run = ansible_playbook(tmp_path, plays, "-i", str(inventory), "-f", "2")
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr
    assert sorted(p.name for p in tmp_path.glob("said-*")) == ["said-h1", "said-h2", "said-h4", "said-h5"]
    assert (tmp_path / "said-h4").read_text() == "h4-8"
    assert "h3" in run.stdout and "stopped" in run.stdout


def _json_results(run: Any) -> tuple[list, dict]:
    """Each task's result on each host, and the recap, from the json callback's output (timings left out)."""
    document, _end = json.JSONDecoder().raw_decode(run.stdout)
    rows = []
    for play in document["plays"]:
        for task in play["tasks"]:
            for host, result in sorted(task["hosts"].items()):
                rows.append((task["task"]["name"], host, {k: v for k, v in result.items() if k not in _TIMINGS}))
    return rows, document["stats"]


_TIMINGS = {"start", "end", "delta", "duration"}


def test_a_false_condition_is_decided_without_a_worker_and_gives_linears_result(tmp_path):
    """Each kind of task the strategy may skip in its own process, and each it must leave to a worker: the results
    and the recap are ansible.builtin.linear's, to the key; the skipped tasks' conditions ran in the main process
    (one process id for every host), the others' in a worker per host."""
    pids = tmp_path / "pids"
    seen = f"lookup('ansible.builtin.pipe', 'echo ' ~ inventory_hostname ~ ' $PPID >> {pids}') == 'never'"
    plays = [
        {
            "name": "Conditions",
            "hosts": "all",
            "gather_facts": False,
            "vars": {"gate": False, "only_h2": "{{ inventory_hostname == 'h2' }}"},
            "tasks": [
                {"name": "Seen", "ansible.builtin.command": "/bin/true", "when": seen, "register": "probe"},
                {"name": "Registered", "ansible.builtin.debug": {"var": "probe"}},
                # A condition that warns (an embedded template): left to the worker, whose result carries the warning.
                {"name": "Warns", "ansible.builtin.debug": {"msg": "w"}, "when": "'{{ gate }}' == 'True'"},
                {
                    "name": "Per host",
                    "ansible.builtin.command": "/bin/true",
                    "changed_when": False,
                    "when": "only_h2 | bool",
                },
                {
                    "name": "Hidden",
                    "ansible.builtin.command": "/bin/true",
                    "no_log": True,
                    "changed_when": False,
                    "when": "inventory_hostname != 'h1'",
                },
                {"name": "Undefined", "ansible.builtin.debug": {"msg": "x"}, "when": "nothere", "ignore_errors": True},
                {"name": "Second false", "ansible.builtin.debug": {"msg": "y"}, "when": [True, "gate"]},
                # Defined by the connection's settings only (the host's address, as the worker sets it).
                {"name": "Connection", "ansible.builtin.debug": {"msg": "c"}, "when": "ansible_host is defined"},
                {"name": "Looped", "ansible.builtin.debug": {"msg": "{{ item }}"}, "loop": [1, 2], "when": "item == 2"},
                {"name": "Include", "ansible.builtin.include_tasks": "absent.yml", "when": "gate"},
                {"name": "Once", "ansible.builtin.debug": {"msg": "z"}, "run_once": True, "when": "gate"},
                {
                    "name": "Block",
                    "when": "not gate",
                    "block": [{"name": "In block", "ansible.builtin.debug": {"msg": "b"}, "when": "only_h2 | bool"}],
                },
            ],
        }
    ]
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "[all]\n" + "".join(f"h{n} ansible_connection=local\n" for n in range(1, 4)) + "[all:vars]\n"
        f"ansible_python_interpreter={REPO_ROOT / '.venv' / 'bin' / 'python'}\n"
    )
    outcomes = {}
    for strategy in ("ansible.builtin.linear", "gpufleet.fleet.linear"):
        pids.unlink(missing_ok=True)
        plays[0]["strategy"] = strategy
        run = ansible_playbook(tmp_path, plays, "-i", str(inventory), env={"ANSIBLE_STDOUT_CALLBACK": "json"})
        outcomes[strategy] = run, pids.read_text().split("\n")
    rows = {}
    for strategy, (run, _pids) in outcomes.items():
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        rows[strategy] = _json_results(run)
    assert rows["gpufleet.fleet.linear"] == rows["ansible.builtin.linear"]
    results, recap = rows["gpufleet.fleet.linear"]
    assert [r["skipped"] for name, _host, r in results if name == "Seen"] == [True] * 3
    assert [r.get("skipped", False) for name, _host, r in results if name == "Per host"] == [True, False, True]
    assert recap["h2"]["skipped"] < recap["h1"]["skipped"]
    assert all(r.get("warnings") and r["skipped"] for name, _host, r in results if name == "Warns")
    # The condition of "Seen" ran in one process for the three hosts here, in three workers under linear.
    workers = {line.split()[1] for line in outcomes["ansible.builtin.linear"][1] if line}
    here = {line.split()[1] for line in outcomes["gpufleet.fleet.linear"][1] if line}
    assert len(workers) == 3 and len(here) == 1, (workers, here)


def test_cached_facts_decode_to_what_ansible_core_decodes_reading_each_class_once(monkeypatch):
    """A fact cache payload with tagged values (a fact set from a template carries its origin) decodes to the same
    values, tags included, as with ansible-core's own _from_dict; a bare tuple field still becomes a tuple; the
    class's type hints are read once, not at each object."""
    import dataclasses
    import typing

    from ansible._internal._datatag._tags import Origin
    from ansible.module_utils._internal._datatag import AnsibleSerializableDataclass, AnsibleTagHelper

    facts = {
        "nvidia_driver_installed_version": Origin(path="/r/facts.yml", line_num=14, col_num=38).tag("535.261.03"),
        "nvidia_driver_reboot_reasons": Origin(path="/r/facts.yml", line_num=16, col_num=9).tag([]),
        "plain": {"a": [1, 2]},
    }
    from ansible.plugins.loader import cache_loader

    cache = cache_loader.get("ansible.builtin.memory")  # behind ansible-core's encoding layer, as every fact cache
    cache.set("node-1", facts)

    def decoded() -> list:
        values = cache.get("node-1")
        return [(key, value, AnsibleTagHelper.tags(value)) for key, value in sorted(values.items())]

    ours = decoded()
    original = AnsibleSerializableDataclass.__dict__["_gpufleet_original_from_dict"]
    monkeypatch.setattr(AnsibleSerializableDataclass, "_from_dict", original)
    assert decoded() == ours
    assert ours[0][2] == {Origin(path="/r/facts.yml", line_num=14, col_num=38)}
    monkeypatch.undo()

    @dataclasses.dataclass(frozen=True)
    class Pair(AnsibleSerializableDataclass):
        name: str
        items: tuple[str, ...]

    read = []
    real = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda cls, *a, **k: read.append(cls) or real(cls, *a, **k))
    built = [Pair._from_dict({"name": "n", "items": ["a", "b"]}) for _number in range(3)]
    assert built[0] == Pair(name="n", items=("a", "b")) and isinstance(built[2].items, tuple)
    assert read == [Pair]
    assert Pair._gpufleet_original_from_dict({"name": "n", "items": ["a", "b"]}) == built[0]
