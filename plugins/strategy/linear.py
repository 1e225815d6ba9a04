"""ansible.builtin.linear, with two costs of the controller's main process taken out of every host's task.

1. Waiting for workers without spinning. When every worker is busy (as many
   tasks running as ``forks``), linear's ``_queue_task`` looks for a free one
   in a loop that sleeps 0.1 ms after each sweep: on a play with more hosts
   than forks the main process spins through the whole of each task's run on
   the hosts beyond the first ``forks``. On 40 light lab nodes (forks 25),
   sampled with py-spy, that loop was 37 % of the controller's CPU in play 1.
   Here the main process blocks until a worker process exits (their
   sentinels, multiprocessing.connection.wait), then hands over to linear's
   own queueing, which finds the free worker at once. The same for the wait
   on a task's last results (linear polls every internal_poll_interval,
   1 ms): a worker's result arrives as it exits, so the main process waits
   for a worker to exit (at most 50 ms), polling only where none runs.

2. Each Jinja template compiled once per run, not once per host. ansible-core
   2.19 compiles a template string each time it renders one (Jinja's
   ``from_string`` keeps no cache), and a worker is a fresh fork for one host
   and one task: every host compiles every expression of its task's arguments
   and of the variables they read, the same strings on every host, several
   times each. Compiling was 26 % of the controller's CPU in the same run.
   Here compiled templates are kept by their text (and what else their
   compilation depends on), and before a task's first worker is forked the
   main process compiles the templates of the task and of the variables its
   first host sees: every worker of the task inherits them with the fork.

Every other behaviour is linear's. Both changes reach into ansible-core's
internals: they apply on the ansible-core releases they were written and
tested against (SUPPORTED) and leave linear as it is on any other.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: linear
author: gpufleet maintainers (@gpufleet)
short_description: ansible.builtin.linear without its busy wait for a worker and its per-host template compiling
description:
  - Runs a play exactly as P(ansible.builtin.linear#strategy) does, every host in lock-step, task by task.
  - Where linear waits for a free worker (every one of C(forks) busy) in a loop that sleeps 0.1 ms between sweeps,
    this strategy blocks until a worker process exits; a task with C(throttle) is queued by linear's loop as it is.
    Where linear polls for a task's last results every C(internal_poll_interval), it waits for a worker to exit
    (at most 50 ms at a time; a result arrives as its worker exits).
  - Each Jinja template is compiled once per run in the controller's main process (the templates of each task and of
    the variables its first host sees, before the task's workers are forked), not once per host and task in each
    forked worker. A template that includes or imports another is compiled where it is rendered, as before.
  - Both apply on ansible-core 2.19; on another release the strategy is ansible.builtin.linear unchanged.
  - gpufleet's C(ansible.cfg) selects it (C(strategy = gpufleet.fleet.linear)); docs/scale.md has the measurements.
"""

import multiprocessing.connection
import re
import time
from collections.abc import Mapping
from typing import Any

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.module_utils.ansible_release import __version__ as ANSIBLE_CORE_VERSION
from ansible.plugins.strategy.linear import StrategyModule as LinearStrategyModule

SUPPORTED = ("2.19.",)
# How long one wait for a worker to exit may take before the workers are looked at again (seconds): for a free
# worker, and for the results (which may also come from a worker still running: a loop's items).
WAIT_S = 1.0
RESULTS_WAIT_S = 0.05
# A template that pulls in another resolves it through its environment's loader: compiled where it is rendered.
_PULLS_IN = re.compile(r"{%-?\s*(include|import|from|extends)\b")
# Hits and misses of the compile cache in this process (for the tests).
STATS = {"hits": 0, "misses": 0}

_cache: dict[tuple, Any] = {}


def _patch_template_engine() -> bool:
    """Keep compiled templates and expressions by their text (and what their compilation depends on) in this process
    and the workers forked from it; True where ansible-core is a release this was written for."""
    if not ANSIBLE_CORE_VERSION.startswith(SUPPORTED):
        return False
    from ansible._internal._templating._engine import TemplateEngine
    from ansible._internal._templating._jinja_bits import AnsibleTemplate, AnsibleTemplateExpression

    if getattr(TemplateEngine, "_gpufleet_compile_cache", False):
        return True
    compile_template = TemplateEngine._compile_template
    compile_expression = TemplateEngine._compile_expression

    def cached(kind: str, compile_: Any, compiled_type: type) -> Any:
        def compile_once(self: Any, text: str, options: Any) -> Any:
            if not isinstance(text, str) or _PULLS_IN.search(text):
                return compile_(self, text, options)
            key = (kind, str(text), options.escape_backslashes, options.overrides, self.basedir)
            found = _cache.get(key)
            if found is not None:
                STATS["hits"] += 1
                return found
            STATS["misses"] += 1
            found = compile_(self, text, options)
            # A compile error becomes a function bound to this engine: not kept.
            if isinstance(found, compiled_type):
                _cache[key] = found
            return found

        return compile_once

    TemplateEngine._compile_template = cached("template", compile_template, AnsibleTemplate)
    TemplateEngine._compile_expression = cached("expression", compile_expression, AnsibleTemplateExpression)
    TemplateEngine._gpufleet_compile_cache = True
    return True


PATCHED = _patch_template_engine()


def _strings(value: Any, depth: int = 0) -> Any:
    """The strings of a structure of plain mappings and lists (no deeper than 8 levels: variables, not data)."""
    if isinstance(value, str):
        yield value
    elif depth < 8 and isinstance(value, Mapping) and type(value).__name__ != "HostVars":
        for item in value.values():
            yield from _strings(item, depth + 1)
    elif depth < 8 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item, depth + 1)


class StrategyModule(LinearStrategyModule):
    """ansible.builtin.linear with a blocking wait for a free worker and templates compiled once per run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compiled_for: set[str] = set()

    def _queue_task(self, host, task, task_vars, play_context):
        if PATCHED and task._uuid not in self._compiled_for:
            self._compiled_for.add(task._uuid)
            self._compile_before_forking(task, task_vars)
        if PATCHED and not task.throttle:
            self._wait_for_a_free_worker()
        super()._queue_task(host, task, task_vars, play_context)

    def _compile_before_forking(self, task: Any, task_vars: Mapping[str, Any]) -> None:
        """Compile, in this process, the templates of the task's arguments and variables and of the variables its
        first host sees, and its conditions: the task's workers inherit them."""
        from ansible._internal._datatag._tags import TrustedAsTemplate
        from ansible._internal._templating._engine import TemplateEngine, TemplateOptions
        from ansible._internal._templating._jinja_bits import is_possibly_template

        engine = TemplateEngine(loader=self._loader)
        options = TemplateOptions.DEFAULT
        expression_options = TemplateOptions(escape_backslashes=True, preserve_trailing_newlines=False)
        for text in _strings([task.args, task.vars, dict(task_vars)]):
            if TrustedAsTemplate.is_tagged_on(text) and is_possibly_template(text, options.overrides):
                engine._compile_template(text, options)
        conditions = [task.when, task.changed_when, task.failed_when, task.until]
        for text in _strings(conditions):
            if TrustedAsTemplate.is_tagged_on(text) and not is_possibly_template(text, options.overrides):
                engine._compile_expression(text, expression_options)

    def _wait_on_pending_results(self, iterator):
        """linear's wait for the task's pending results, waiting for a worker to exit instead of polling."""
        if not PATCHED:
            return super()._wait_on_pending_results(iterator)
        ret_results = []
        while self._pending_results > 0 and not self._tqm._terminated:
            if self._tqm.has_dead_workers():
                raise AnsibleError("A worker was found in a dead state")
            results = self._process_pending_results(iterator)
            ret_results.extend(results)
            if self._pending_results > 0 and not results:
                running = [worker.sentinel for worker in self._workers if worker is not None and worker.is_alive()]
                if running:
                    multiprocessing.connection.wait(running, timeout=RESULTS_WAIT_S)
                else:
                    time.sleep(C.DEFAULT_INTERNAL_POLL_INTERVAL)
        return ret_results

    def _wait_for_a_free_worker(self) -> None:
        """Return once a worker slot is free (never started, or its process has exited)."""
        while True:
            busy = [worker for worker in self._workers if worker is not None and worker.is_alive()]
            if len(busy) < len(self._workers):
                return
            multiprocessing.connection.wait([worker.sentinel for worker in busy], timeout=WAIT_S)
