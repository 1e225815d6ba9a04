"""ansible.builtin.linear, with four costs of the controller taken out of every host's task.

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

3. A task skipped without a worker. linear forks a worker for every host and
   task, and the worker's first step is the task's condition (``when``): on a
   converged re-run of site.yml most tasks are skipped on most hosts, and the
   fork, the worker's start and its result's way back cost ~25 ms of CPU for
   each (docs/scale.md). Here the main process evaluates the condition first,
   with the variables the worker would have (the task's variables with the
   connection's "magic" variables added, the host's address included, as
   the TaskExecutor adds them);
   where it is false, the result is the worker's skip result, to the key
   (``skip_reason``, ``false_condition``, ``_ansible_no_log``), handed to the
   strategy's results as a worker's. A task with a loop or ``delegate_to``,
   and a condition that fails or warns here, go to a worker as in linear,
   which evaluates and reports them itself. A condition that is true is
   evaluated again by the worker: a lookup in it runs twice (a condition
   with side effects would see that).

4. The fact cache decoded without reading type hints again. ansible-core
   2.19 keeps each host's facts in the cache encoded, and decodes them in
   every ``get_vars`` (once per host and task): each tagged value in them
   (a fact set from a template carries its origin) is rebuilt by
   ``AnsibleSerializableDataclass._from_dict``, which reads its class's
   type hints (``typing.get_type_hints``) every time. That was 16 % of the
   main process's CPU in a converged re-run of site.yml on the lab's
   3 nodes. Here the fields it converts (those typed as a bare tuple) are
   found once per class; the object built is the same.

Every other behaviour is linear's. All four reach into ansible-core's
internals: they apply on the ansible-core releases they were written and
tested against (SUPPORTED) and leave linear as it is on any other.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: linear
author: gpufleet maintainers (@gpufleet)
short_description: ansible.builtin.linear without its busy wait, per-host compiling and forks for skipped tasks
description:
  - Runs a play exactly as P(ansible.builtin.linear#strategy) does, every host in lock-step, task by task.
  - Where linear waits for a free worker (every one of C(forks) busy) in a loop that sleeps 0.1 ms between sweeps,
    this strategy blocks until a worker process exits; a task with C(throttle) is queued by linear's loop as it is.
    Where linear polls for a task's last results every C(internal_poll_interval), it waits for a worker to exit
    (at most 50 ms at a time; a result arrives as its worker exits).
  - Each Jinja template is compiled once per run in the controller's main process (the templates of each task and of
    the variables its first host sees, before the task's workers are forked), not once per host and task in each
    forked worker. A template that includes or imports another is compiled where it is rendered, as before.
  - A task whose condition (C(when)) is false for a host is skipped by the main process, without forking a worker for
    it; the result is the one the worker would give. A task with a loop or C(delegate_to), and a condition that fails
    or warns when evaluated there, are run by a worker as in linear. A true condition is evaluated again by the
    worker (a lookup in it runs twice).
  - The hosts' cached facts are decoded without reading each tagged value's type hints again (once per class, not once
    per value, host and task).
  - All four apply on ansible-core 2.19; on another release the strategy is ansible.builtin.linear unchanged.
  - gpufleet's C(ansible.cfg) selects it (C(strategy = gpufleet.fleet.linear)); docs/scale.md has the measurements.
"""

import dataclasses
import multiprocessing.connection
import re
import time
import typing
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


def _patch_dataclass_decoding() -> bool:
    """Find the tuple fields of each serializable dataclass once, not at each decoding of one of its objects; True
    where ansible-core is a release this was written for."""
    if not ANSIBLE_CORE_VERSION.startswith(SUPPORTED):
        return False
    from ansible.module_utils._internal._datatag import AnsibleSerializableDataclass

    if getattr(AnsibleSerializableDataclass, "_gpufleet_tuple_fields", None) is not None:
        return True
    tuple_fields: dict[type, tuple[str, ...]] = {}

    def from_dict(cls: type, d: dict[str, Any]) -> Any:
        names = tuple_fields.get(cls)
        if names is None:
            hints = typing.get_type_hints(cls)
            fields = dataclasses.fields(cls)
            names = tuple_fields[cls] = tuple(f.name for f in fields if typing.get_origin(hints[f.name]) is tuple)
        # A plain list only, as ansible-core's own: a tagged list (a subclass) stays as it is.
        plain = [name for name in names if type(d.get(name)) is list]  # pylint: disable=unidiomatic-typecheck
        converted = {name: tuple(d[name]) for name in plain}
        return cls(**(d | converted if converted else d))

    # ansible-core's own, kept for the tests that compare the two.
    AnsibleSerializableDataclass._gpufleet_original_from_dict = AnsibleSerializableDataclass.__dict__["_from_dict"]
    AnsibleSerializableDataclass._from_dict = classmethod(from_dict)
    AnsibleSerializableDataclass._gpufleet_tuple_fields = tuple_fields
    return True


PATCHED = _patch_template_engine() and _patch_dataclass_decoding()


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
    """ansible.builtin.linear with a blocking wait for a free worker, templates compiled once per run and skipped tasks
    decided without a worker."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compiled_for: set[str] = set()

    def _queue_task(self, host, task, task_vars, play_context):
        if PATCHED and self._skipped_here(host, task, task_vars, play_context):
            return
        if PATCHED and task._uuid not in self._compiled_for:
            self._compiled_for.add(task._uuid)
            self._compile_before_forking(task, task_vars)
        if PATCHED and not task.throttle:
            self._wait_for_a_free_worker()
        super()._queue_task(host, task, task_vars, play_context)

    def _skipped_here(self, host: Any, task: Any, task_vars: Mapping[str, Any], play_context: Any) -> bool:
        """Skip, without forking a worker, a task whose condition is false for this host; True where it did.

        The result is the one the worker's TaskExecutor returns for it (the same keys, from the same evaluation
        of the same variables), handed to the strategy's result list as the worker's would be. Where this process
        cannot decide it exactly as the worker would (a loop, delegation, an error or a warning from the condition),
        the worker decides, as in linear."""
        from ansible._internal import _display_utils, _task
        from ansible._internal._templating._engine import TemplateEngine
        from ansible.executor.task_result import _WireTaskResult

        if not task.when or task.loop_with or task.loop is not None or task.delegate_to is not None:
            return False
        variables = dict(task_vars)
        search_path = task.get_search_path()
        if self._loader.get_basedir() not in search_path:
            search_path.append(self._loader.get_basedir())
        variables["ansible_search_path"] = search_path
        context: dict[str, Any] = {}
        try:
            with _task.TaskContext(task), _display_utils.DeferredWarningContext(variables=variables) as warnings:
                # The connection's variables as the TaskExecutor adds them before it evaluates the condition.
                templar = TemplateEngine(loader=self._loader, variables=variables)
                connection = play_context.set_task_and_variable_override(
                    task=task, variables=variables, templar=templar
                )
                connection.post_validate(templar=templar)
                if not connection.remote_addr:
                    connection.remote_addr = host.address
                condition_variables = dict(variables)
                connection.update_vars(condition_variables)
                if task._resolve_conditional(task.when, condition_variables, result_context=context):
                    return False
                result = dict(changed=False, skipped=True, skip_reason="Conditional result was False") | context
                task.update_result_no_log(templar, result)
        except Exception:  # noqa: BLE001 - the worker decides, and reports, what this process could not
            return False
        if warnings.get_warnings() or warnings.get_deprecation_warnings():
            return False
        self._queued_task_cache[(host.name, task._uuid)] = {
            "host": host,
            "task": task,
            "task_vars": task_vars,
            "play_context": play_context,
        }
        self._tqm.send_callback("v2_runner_on_start", host, task)
        wire = _WireTaskResult(
            host_name=host.name, task_uuid=task._uuid, return_data=result, task_fields=task.dump_attrs()
        )
        raw = self._convert_wire_task_result_to_raw(wire)
        with self._results_lock:
            self._results.append(raw)
        self._pending_results += 1
        return True

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
