"""Run a role's logic for real: ansible-core's PlaybookExecutor, in this process, on fake hosts.

The unit tests ask what a role resolves and what it refuses for a host and a
set of settings. Instead of re-evaluating the role's expressions by hand, they
run a real playbook with ansible-core's own executor (variable precedence,
task order, ``when``, ``vars``, loops, ``run_once``, ``include_role``,
``include_vars``, lookups and filters all Ansible's own), in this pytest
process:

* one inventory host per case (or a fake cluster, a play of its own): its
  settings are inventory host variables (the precedence of a user's
  group_vars/host_vars), its facts are put in an in-memory fact cache before
  the run (as ``setup`` would leave them; ``gather_facts`` is off), and it
  may belong to inventory groups; a host may be in the inventory only;
* every fake host uses the connection ``gpufleet_no_host``
  (tests/unit/role_run_plugins): a task that would run a module or a command
  on a host fails (the host is unreachable) instead of running on this
  machine, so only controller-side tasks (set_fact, fail, assert, debug,
  include_vars, include_role, lookups) can pass;
* the play runs the given tasks (typically ``import_role`` of
  ``gpufleet.fleet.<role>`` with ``tasks_from: validate``)
  inside a block whose rescue records the task that stopped the host
  and its message; afterwards, ``capture`` tasks may template more
  expressions in the same play (the role's defaults and vars are visible
  there), for example a role template through the
  ``ansible.builtin.template`` lookup;
* the outcome of each host is read back from the variable manager: every
  variable set_fact set on it, the captured values, and the stop. A task
  that failed for another reason than a fail/assert task, or a host that
  became unreachable, makes the outcome raise when a test reads it.

Cost: a run starts in about 0.05 s; each host costs one forked worker
process per task (20-40 ms of CPU on this build machine, half of it the
kernel's fork and page copies), so a module batches its cases (``Batch``:
the cases it knows up front, in one run) and keeps its capture tasks few.
The runs happen in a process forked from pytest early (start_runner), where
a fork is cheaper than from pytest with every test module loaded.

``PlaybookCLI.parse()`` and its ``_play_prereqs()`` run once per process (the
vault secrets context can be initialised only once); each run gets a new
inventory and variable manager. The clone's ansible.cfg keeps facts in
.cache/facts, which the fake hosts must not reach: their fact cache is in
memory. No callback of ansible.cfg is loaded: the run prints nothing.
"""

from __future__ import annotations

import copy
import functools
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = REPO_ROOT / "roles"
COLLECTION = "gpufleet.fleet"
CONNECTION = "gpufleet_no_host"
_PLUGINS = Path(__file__).resolve().parent / "role_run_plugins"
# The actions whose failure is a role's refusal (anything else that fails is an error of the run).
# The tasks that refuse: fail, assert, and the rules of a role (the action gpufleet.fleet.settings).
_STOP_ACTIONS = {"fail", "ansible.builtin.fail", "assert", "ansible.builtin.assert", "gpufleet.fleet.settings"}


@functools.cache
def init_plugin_loader() -> None:
    """The collection loader, as ansible-playbook starts it, once per process (conftest.py calls it first).

    The clone is the collection gpufleet.fleet through the link `make venv`
    makes (.ansible/collections), searched first whatever ansible.cfg says.
    """
    from ansible import constants as C
    from ansible.plugins.loader import connection_loader
    from ansible.plugins.loader import init_plugin_loader as init

    init([str(REPO_ROOT / ".ansible" / "collections"), *C.COLLECTIONS_PATHS])
    connection_loader.add_directory(str(_PLUGINS / "connection"))


@functools.cache
def _ansible() -> Any:
    """ansible-playbook's set-up, once per process: plugin loaders, CLI arguments, the data loader."""
    from ansible.cli.playbook import PlaybookCLI

    init_plugin_loader()
    cli = PlaybookCLI(["ansible-playbook", "--inventory", "localhost,", "--forks", "8", str(REPO_ROOT / "site.yml")])
    cli.parse()
    loader, _inventory, _variables = cli._play_prereqs()
    _load_plugins_before_forking(loader)
    return loader


def _load_plugins_before_forking(loader: Any) -> None:
    """Load the plugins every run uses here, once: each worker is forked from this process and would load them again."""
    from ansible.plugins.loader import action_loader, connection_loader, filter_loader, lookup_loader, test_loader
    from ansible.template import Templar, trust_as_template

    for name in ("set_fact", "fail", "assert", "debug", "include_vars"):
        action_loader.get(f"ansible.builtin.{name}", class_only=True)
    for name in (
        "ansible.builtin.first_found",
        "ansible.builtin.template",
        "ansible.builtin.file",
        "ansible.builtin.vars",
        f"{COLLECTION}.stack",
    ):
        lookup_loader.get(name)
    connection_loader.get(CONNECTION, class_only=True)
    list(filter_loader.all(class_only=True))
    list(test_loader.all(class_only=True))
    Templar(loader=loader).template(
        trust_as_template(
            "{{ [1] | map('string') | %s.as_list | select('match', '1') | list }}{{ 'http://x' is %s.http_url }}"
            % (COLLECTION, COLLECTION)
        )
    )


@dataclass(frozen=True)
class Host:
    """One fake host: a case of a test, or a member of a fake cluster.

    ``play``: hosts with the same value run in one play of the run (its own
    ``run_once`` scope); ``targeted`` false: the host is in the inventory
    (groups, hostvars, facts) but no play runs on it.
    """

    name: str
    facts: Mapping[str, Any]
    vars: Mapping[str, Any] = field(default_factory=dict)
    groups: tuple[str, ...] = ()
    play: str = ""
    targeted: bool = True


class RunError(AssertionError):
    """The run itself went wrong for a host (not a refusal by the role): a test that reads it fails."""


@dataclass
class Outcome:
    """What the run left on one host."""

    host: str
    # Every variable set_fact set on the host (plain Python values).
    facts: dict[str, Any]
    # Values of the capture tasks, by the names given to capture().
    captured: dict[str, Any]
    # The task that stopped the host inside the block: {"task", "action", "msg"}, or None.
    stop: dict[str, Any] | None
    # Failures the rescue did not catch (a capture that could not be templated, ...).
    errors: list[str]

    def _check(self) -> None:
        if self.errors:
            raise RunError(f"the run failed on {self.host}: " + "; ".join(self.errors))
        if self.stop is not None and self.stop["action"] not in _STOP_ACTIONS:
            raise RunError(
                f"{self.host} stopped with an error, not a refusal, in task {self.stop['task']!r} "
                f"({self.stop['action']}): {self.stop['msg']}"
            )

    @property
    def failure(self) -> str | None:
        """The message of the fail (or assert) task that stopped the host, stripped; None when none did."""
        self._check()
        return None if self.stop is None else str(self.stop["msg"]).strip()

    @property
    def failed_task(self) -> str | None:
        """The name of the task that stopped the host."""
        self._check()
        return None if self.stop is None else self.stop["task"]

    def _resolved(self, name: str) -> tuple[bool, Any]:
        """What a role's rules resolved, as its vars/main.yml reads it: ``__<role>_<name>`` from the judgement
        registered as ``__<role>_judged`` (its ``resolved``, ``__<role>_invalid`` its ``errors``)."""
        for registered, judged in self.facts.items():
            if not (registered.endswith("_judged") and isinstance(judged, Mapping)):
                continue
            prefix = registered[: -len("judged")]
            if name.startswith(prefix) and name in (judged.get("resolved") or {}):
                return True, judged["resolved"][name]
            if name == f"{prefix}invalid" and "errors" in judged:
                return True, judged["errors"]
        return False, None

    def __getitem__(self, name: str) -> Any:
        """A captured value, else a variable set_fact set on the host (e.g. cfg['__pytorch_index_url']), else what
        the role's rules resolved for it (see _resolved)."""
        self._check()
        if name in self.captured:
            return self.captured[name]
        if name in self.facts:
            return self.facts[name]
        found, value = self._resolved(name)
        if found:
            return value
        raise KeyError(
            f"{name} was neither set by set_fact on {self.host} nor captured "
            f"(stopped: {self.failure!r}; capture it with role_run.capture())"
        )

    def __contains__(self, name: str) -> bool:
        return name in self.captured or name in self.facts or self._resolved(name)[0]


def plain(value: Any) -> Any:
    """Ansible's (tagged) values as plain Python values: dict, list, str, int, float, bool, None."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


# --------------------------------------------------------------------------- tasks


def import_role(role: str, tasks_from: str = "validate", *, skip_apt_source: bool = False, **keywords: Any) -> dict:
    """An ``import_role`` task of gpufleet.fleet.<role> (its task file ``tasks_from``).

    Imported, not included: its tasks are the play's from the start, and the
    role's defaults and vars are visible to the tasks after it (capture
    tasks), as ``public`` makes them for an include; an include would cost a
    worker process per host for itself. ``skip_apt_source``: the file's own
    includes of roles/apt_source (its trial and configuration, which run apt
    on the host) are skipped, every other task of the file runs: the
    import's ``when`` (``apt_source_repository is not defined``) goes to each of
    its tasks, and only those includes set apt_source_repository (their
    ``vars``; checked here).
    """
    task: dict[str, Any] = {
        "name": f"Import {role} {tasks_from}",
        "ansible.builtin.import_role": {"name": f"{COLLECTION}.{role}", "tasks_from": tasks_from},
    }
    if skip_apt_source:
        _check_apt_source_includes(role, tasks_from)
        task["when"] = "apt_source_repository is not defined"
    return {**task, **keywords}


def expose(role: str, tasks_from: str) -> dict:
    """An ``import_role`` of gpufleet.fleet.<role> whose tasks all skip (``when: false``, the argument spec check
    included): its defaults and vars are visible to the tasks after it, none of its tasks runs.

    Each skipped task still costs a worker process per host: name a short task file.
    """
    return {
        "name": f"Expose the variables of {role}",
        "when": False,
        "ansible.builtin.import_role": {"name": f"{COLLECTION}.{role}", "tasks_from": tasks_from},
    }


def tasks_of(node: Any) -> Iterable[dict]:
    """Every task of a task list, those inside blocks included."""
    for task in node or []:
        if isinstance(task, dict):
            yield task
            for key in ("block", "rescue", "always"):
                yield from tasks_of(task.get(key))


def _check_apt_source_includes(role: str, tasks_from: str) -> None:
    """Only the includes of apt_source in roles/<role>/tasks/<tasks_from>.yml (and the task files it imports or
    includes) name apt_source_repository."""
    path = ROLES_DIR / role / "tasks" / f"{tasks_from}.yml"
    for task in tasks_of(yaml.safe_load(path.read_text())):
        include = task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role")
        is_apt_source = isinstance(include, dict) and include.get("name") == "apt_source"
        names = "apt_source_repository" in (task.get("vars") or {})
        assert is_apt_source == names, f"{path}: task {task.get('name')!r}: skip_apt_source cannot tell it apart"
        assert "apt_source_repository" not in str({k: v for k, v in task.items() if k != "vars"}), path
        nested = task.get("ansible.builtin.import_tasks") or task.get("ansible.builtin.include_tasks")
        nested = nested.get("file") if isinstance(nested, dict) else nested
        if nested is not None:
            assert "{{" not in nested and nested.endswith(".yml"), f"{path}: cannot follow {nested!r}"
            _check_apt_source_includes(role, nested[: -len(".yml")])


def capture(
    values: Mapping[str, Any], *, vars: Mapping[str, Any] | None = None, name: str = "Capture", run_once: bool = False
) -> dict:
    """A task that templates ``values`` ({name: expression or structure}) on each host, after the block.

    ``vars``: task variables for the expressions (e.g. the ``vars`` of a role
    task whose arguments are captured). ``run_once``: templated on the
    play's first host, the values given to every host of the play.
    """
    task: dict[str, Any] = {"name": name, "ansible.builtin.set_fact": {"__role_run_capture": dict(values)}}
    if vars:
        task["vars"] = dict(vars)
    if run_once:
        task["run_once"] = True
    return task


def names(*variables: str) -> dict[str, str]:
    """capture() values for variables under their own names."""
    return {variable: "{{ %s }}" % variable for variable in variables}


def role_task(role: str, task_file: str, name_contains: str, directory: str = "tasks") -> dict:
    """A copy of the task of roles/<role>/<directory>/<task_file> whose name contains ``name_contains``
    (blocks searched).

    For a task that cannot run in the role's own file here (it follows a host
    probe there): the harness play runs this copy, with the probe's registered
    result given as a host variable. The copy's ``vars`` and ``when`` are the
    role's; role-relative paths do not resolve in the play.
    """
    path = ROLES_DIR / role / directory / task_file
    found = [task for task in tasks_of(yaml.safe_load(path.read_text())) if name_contains in str(task.get("name", ""))]
    assert len(found) == 1, f"{len(found)} tasks of {path} have a name containing {name_contains!r}"
    return copy.deepcopy(found[0])


def role_of(task: Mapping[str, Any]) -> dict:
    """A task's include_role or import_role arguments ({} for any other task)."""
    return task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role") or {}


def apt_source_include(role: str, task_file: str, entry_point: str = "main") -> dict:
    """A copy of the one include (or import) of roles/apt_source's ``entry_point`` in roles/<role>/tasks/<task_file>."""
    path = ROLES_DIR / role / "tasks" / task_file
    found = [
        task
        for task in tasks_of(yaml.safe_load(path.read_text()))
        if role_of(task).get("name") == "apt_source" and role_of(task).get("tasks_from", "main") == entry_point
    ]
    assert len(found) == 1, f"{len(found)} includes of apt_source {entry_point} in {path}"
    return copy.deepcopy(found[0])


def apt_source_inputs(role: str, task_file: str, entry_point: str) -> dict:
    """The ``vars`` of roles/<role>/tasks/<task_file>'s include of apt_source's ``entry_point``, to capture as they are:
    a capture templates each one in the play, as the include would.

    None of them reads another input (apt_source_*), so they need not be task variables (checked).
    """
    inputs = apt_source_include(role, task_file, entry_point)["vars"]
    assert not any("apt_source_" in text for text in _strings(inputs)), f"an input of {role}'s include reads another"
    return inputs


def apt_source_capture(
    role: str, task_file: str, prefix: str, also: Mapping[str, Any] | None = None, trial_file: str | None = None
) -> dict:
    """A capture of what roles/<role>/tasks/<task_file> gives apt_source's entry point main, and what main writes.

    Captured, templated with the include's ``vars`` as task variables (after
    ``expose("apt_source", ...)``, for apt_source's defaults and vars):
    ``<prefix>inputs`` (each input of the include), ``<prefix>source`` (the
    deb822 source main writes; the trial compares the host's copy with the
    same template), ``<prefix>sources_file`` (its path: one per repository)
    and ``<prefix>pins``: [{name, text}] of the pins main writes, selected by
    the loop of its own template task. ``trial_file``: the task file of the
    role's include of entry point trial, whose ``vars`` join main's (the
    inputs both take must be given alike, checked): ``trial_given`` is then
    what the action gpufleet.fleet.apt_source_trial is given and reads (its
    inputs as trial.yml templates them, the role's variables of the source),
    from which trial_claim() derives the claim the trial makes on the
    repository as the action does.
    ``also``: more values to capture in the same task (one task less per
    host), not reading the include's names.
    """
    include = apt_source_include(role, task_file, "main")
    task_vars = dict(include["vars"])
    read = " ".join(_strings(also or {}))
    assert not any(name in read for name in include["vars"]), "also's values would see the include's vars"
    values: dict[str, Any] = {
        **(also or {}),
        f"{prefix}inputs": names(*include["vars"]),
        f"{prefix}source": template("apt_source", "source.sources.j2"),
        f"{prefix}pins": apt_source_pins(),
        f"{prefix}sources_file": "{{ __apt_source_sources_file }}",
    }
    if trial_file is not None:
        # After init_plugin_loader (the collection's imports).
        from ansible_collections.gpufleet.fleet.plugins.action import apt_source_trial

        trial_vars = apt_source_include(role, trial_file, "trial")["vars"]
        differ = [name for name in set(trial_vars) & set(task_vars) if trial_vars[name] != task_vars[name]]
        assert differ == [], f"roles/{role} gives apt_source's trial and main these inputs differently: {differ}"
        task_vars.update(trial_vars)
        values["trial_given"] = {
            "inputs": role_task("apt_source", "trial.yml", "Try the source")["gpufleet.fleet.apt_source_trial"],
            "variables": names(
                *(f"apt_source_{part}" for part in apt_source_trial.PARTS), *apt_source_trial.PATHS.values()
            ),
        }
    return capture(values, vars=task_vars, name=f"Capture what {role} gives apt_source")


def trial_claim(outcome: Outcome) -> dict[str, Any]:
    """The claim apt_source's trial makes on its repository (the ``claim`` the action gives the module, which
    refuses another role's different claim), from what apt_source_capture captured as ``trial_given``: the action's
    own reading of the source (read_source), its argument spec and trial_arguments."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    from ansible_collections.gpufleet.fleet.plugins.action import apt_source_trial
    from ansible_collections.gpufleet.fleet.plugins.module_utils import apt_source

    given = outcome["trial_given"]
    source = apt_source_trial.read_source(given["variables"].__getitem__)
    validated = ArgumentSpecValidator(apt_source_trial.ARGUMENT_SPEC).validate(given["inputs"])
    assert not validated.error_messages, validated.error_messages
    return apt_source.trial_arguments(source, validated.validated_parameters, "")["claim"]


def _strings(value: Any) -> Iterable[str]:
    """The strings of a structure's values (not its keys)."""
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def apt_source_pins() -> str:
    """An expression: [{name, text}] of the preferences files apt_source's entry point main writes for its inputs.

    The pins are those its template task's own ``loop`` selects, each
    rendered from its ``src`` with the task's ``loop_var``.
    """
    pin_task = role_task("apt_source", "main.yml", "Pin the packages")
    loop_var = pin_task["loop_control"]["loop_var"]
    selected = pin_task["loop"].strip()
    assert selected.startswith("{{") and selected.endswith("}}") and "{{" not in selected[2:-2], selected
    return (
        "{%% set out = [] %%}{%% for %(var)s in (%(loop)s) %%}{%% set _ = out.append({'name': %(var)s.name, 'text': "
        "lookup('ansible.builtin.template', %(src)r, template_vars={%(var)r: %(var)s})}) %%}{%% endfor %%}{{ out }}"
        % {
            "var": loop_var,
            "loop": " ".join(selected[2:-2].split()),
            "src": str(ROLES_DIR / "apt_source" / "templates" / pin_task["ansible.builtin.template"]["src"]),
        }
    )


def condition(task: Mapping[str, Any]) -> str:
    """An expression that is the task's ``when`` (its conditions ANDed), to capture where the task cannot run."""
    when = task.get("when", [])
    conditions = when if isinstance(when, list) else [when]
    return "{{ %s }}" % (" and ".join(f"({c})" for c in conditions) or "true")


def template(role: str, template_name: str) -> str:
    """An expression rendering roles/<role>/templates/<template_name> with the variables of the task it is in.

    The ``ansible.builtin.template`` lookup renders as the template action
    does (trim_blocks on, lstrip_blocks off, "\\n" newlines, backslashes not
    escaped, ansible_managed and template_* variables set).
    """
    path = ROLES_DIR / role / "templates" / template_name
    assert path.is_file(), path
    return "{{ lookup('ansible.builtin.template', %r) }}" % str(path)


def ansible_managed() -> str:
    """The ``ansible_managed`` text the template action and lookup put in a rendered file
    (ansible.cfg's, or Ansible's)."""
    from ansible import constants as C

    return C.config.get_config_value("DEFAULT_MANAGED_STR")


# --------------------------------------------------------------------------- the run


def _callback() -> Any:
    from ansible.plugins.callback import CallbackBase

    class Collector(CallbackBase):
        """Prints nothing; keeps every failure and unreachable host that no rescue handled."""

        CALLBACK_VERSION = 2.0
        CALLBACK_TYPE = "stdout"
        CALLBACK_NAME = "gpufleet_role_run"

        def __init__(self) -> None:
            super().__init__()
            self.failures: dict[str, list[tuple[str, str]]] = {}

        def _record(self, result: Any, what: str) -> None:
            msg = result._result.get("msg") or result._result.get("reason") or str(result._result)
            self.failures.setdefault(result._host.get_name(), []).append(
                (result._task.name, f"{what} in task {result._task.get_name()!r}: {msg}")
            )

        def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
            self._record(result, "failed")

        def v2_runner_on_unreachable(self, result: Any) -> None:
            self._record(result, "unreachable")

    collector = Collector()
    collector._init_callback_methods()
    collector.set_options()
    return collector


def _in_fresh_thread(function: Any) -> Any:
    """function() in a new thread, its exception re-raised here.

    The executor forks a worker per host and task from the calling thread. In
    pytest that thread is deep in pytest's frames, and CPython 3.11 then maps
    and unmaps a 16 KiB frame-stack chunk over and over in every worker (its
    hot calls straddle a chunk's end): twice the system time. A new thread
    starts with an empty frame stack, as ansible-playbook's main thread does.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller
            outcome["error"] = error

    thread = threading.Thread(target=target, name="gpufleet-role-run")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


_server: dict[str, Any] = {}


def start_runner() -> None:
    """Fork the process the runs happen in, now, while this process is small (conftest.py calls it first thing).

    Every task of a run forks a worker per host from the process the run is
    in, and a fork costs in proportion to that process's memory: once pytest
    has imported every test module, twice what it costs here. The runner is
    a fork of this process (the same ansible-core, plugins and files); run()
    sends it the hosts and tasks and gets the outcomes back. It ends with
    this process (or when its pipe closes).
    """
    if _server:
        return
    import atexit
    import multiprocessing
    import os

    ours, theirs = multiprocessing.Pipe()
    pid = os.fork()  # not a multiprocessing.Process: the executor forks its own workers from it
    if pid == 0:
        code = 0
        try:
            ours.close()
            _serve(theirs)
        except BaseException:  # noqa: BLE001 - nothing to tell once the pipe is gone
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    _server.update(connection=ours, pid=pid)

    def stop() -> None:
        # The runner ends on the pipe's end; one stuck in a run is killed rather than waited for.
        ours.close()
        for _attempt in range(100):
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    atexit.register(stop)


def _serve(connection: Any) -> None:
    import traceback

    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        try:
            connection.send(("ok", _run_here(*request)))
        except BaseException:  # noqa: BLE001 - the caller raises it
            connection.send(("error", traceback.format_exc()))


def run(
    hosts: Iterable[Host], tasks: list[dict], after: list[dict] | None = None, check_mode: bool = False
) -> dict[str, Outcome]:
    """Run ``tasks`` (in a block with a rescue) and then ``after`` on every host; {host name: Outcome}.

    ``check_mode``: the plays run as ``ansible-playbook --check`` runs them (the
    play keyword ``check_mode``: ``ansible_check_mode`` is true, and a task
    runs in check mode unless it says ``check_mode: false``).
    In the runner process when start_runner() started one, else here.
    """
    hosts = list(hosts)
    if not _server:
        return _run_here(hosts, tasks, after, check_mode)
    _server["connection"].send((hosts, tasks, after, check_mode))
    status, value = _server["connection"].recv()
    if status != "ok":
        raise RuntimeError(f"the run failed in the runner process:\n{value}")
    return value


def _run_here(
    hosts: list[Host], tasks: list[dict], after: list[dict] | None = None, check_mode: bool = False
) -> dict[str, Outcome]:
    from ansible.executor.playbook_executor import PlaybookExecutor
    from ansible.inventory.manager import InventoryManager
    from ansible.plugins.loader import cache_loader
    from ansible.vars.manager import VariableManager

    loader = _ansible()
    hosts = list(hosts)
    assert len({h.name for h in hosts}) == len(hosts), "host names repeat"
    inventory_data: dict[str, Any] = {"all": {"hosts": {}, "children": {}}}
    play_ids = list(dict.fromkeys(host.play for host in hosts if host.targeted))
    # apt_source's trial given to a host (its registered result, as a test states it): the trial's task is skipped
    # here, and a skipped task registers its skip over a host variable. An imported trial (nvidia_driver's
    # preflight.yml, cuda's trial.yml: an include would cost every host a task of its own) registers even so: the
    # given result is an extra variable (above what a task registers) that templates each host's own, undefined on a
    # host given none.
    given_trials = any("apt_source_trial" in host.vars for host in hosts)
    for host in hosts:
        host_vars = dict(host.vars)
        if "apt_source_trial" in host_vars:
            host_vars["__role_run_given_trial"] = host_vars.pop("apt_source_trial")
        inventory_data["all"]["hosts"][host.name] = {"ansible_connection": CONNECTION, **host_vars}
        groups = host.groups + ((f"role_run_play_{play_ids.index(host.play)}",) if host.targeted else ())
        for group in groups:
            inventory_data["all"]["children"].setdefault(group, {"hosts": {}})["hosts"][host.name] = None
    # Each capture task sets its own fact, __role_run_capture_<n>.
    after = [
        dict(
            task,
            **{
                "ansible.builtin.set_fact": {
                    f"__role_run_capture_{n}": task["ansible.builtin.set_fact"]["__role_run_capture"]
                }
            },
        )
        if "__role_run_capture" in (task.get("ansible.builtin.set_fact") or {})
        else task
        for n, task in enumerate(after or [])
    ]
    plays = [
        {
            "name": f"gpufleet unit test {play_id}",
            "hosts": f"role_run_play_{index}",
            "gather_facts": False,
            **({"check_mode": True} if check_mode else {}),
            "tasks": [
                {
                    "name": "Run the role",
                    "block": tasks,
                    "rescue": [
                        {
                            "name": "Record the task that stopped the host",
                            "ansible.builtin.set_fact": {
                                "__role_run_stop": {
                                    "task": "{{ ansible_failed_task.name }}",
                                    "action": "{{ ansible_failed_task.action }}",
                                    "msg": "{{ ansible_failed_result.msg | default(ansible_failed_result) }}",
                                }
                            },
                        }
                    ],
                },
                *([{"name": "Capture", "when": "__role_run_stop is not defined", "block": after}] if after else []),
            ],
        }
        for index, play_id in enumerate(play_ids)
    ]
    with tempfile.TemporaryDirectory(prefix="gpufleet-role-run-") as tmp:
        inventory_file = Path(tmp) / "inventory.yml"
        inventory_file.write_text(yaml.safe_dump(inventory_data, sort_keys=False))
        playbook = Path(tmp) / "play.yml"
        playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
        inventory = InventoryManager(loader=loader, sources=[str(inventory_file)])
        variables = VariableManager(loader=loader, inventory=inventory)
        variables._fact_cache = cache_loader.get("memory")
        # ansible-playbook --check: the magic variable,
        # which comes from the command line (context.CLIARGS), not the play.
        variables._options_vars = {**variables._options_vars, "ansible_check_mode": check_mode}
        if given_trials:
            from ansible._internal._datatag._tags import TrustedAsTemplate

            trial = TrustedAsTemplate().tag("{{ __role_run_given_trial }}")
            variables._extra_vars = {**variables._extra_vars, "apt_source_trial": trial}
        for host in hosts:
            variables.set_host_facts(host.name, dict(host.facts))
        # The task queue manager takes SIGINT and SIGTERM: pytest's handlers are put back after the run.
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            executor = PlaybookExecutor(
                playbooks=[str(playbook)], inventory=inventory, variable_manager=variables, loader=loader, passwords={}
            )
            collector = _callback()
            # The collector alone (no stdout callback, none of ansible.cfg's callbacks_enabled).
            executor._tqm._callback_plugins = [collector]
            _in_fresh_thread(executor.run)
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        outcomes = {}
        for host in hosts:
            facts = plain(variables._nonpersistent_fact_cache.get(host.name, {}))
            captured: dict[str, Any] = {}
            for n in range(len(after)):
                captured.update(facts.pop(f"__role_run_capture_{n}", None) or {})
            stop = facts.pop("__role_run_stop", None)
            # The failure the rescue recorded is the stop; any other is an error of the run.
            errors = [
                text for task, text in collector.failures.get(host.name, []) if stop is None or task != stop["task"]
            ]
            outcomes[host.name] = Outcome(host=host.name, facts=facts, captured=captured, stop=stop, errors=errors)
    return outcomes


class Batch:
    """Cases of one kind of run (the same tasks on every host), run together the first time one is read.

    ``declare`` the cases a module knows up front; ``get`` returns one case's
    Outcome, running every declared case not run yet in one run with it (one
    fake host each). A case is a facts key of ``facts`` (or facts given as a
    mapping) and the host's settings.
    """

    def __init__(
        self,
        facts: Mapping[str, Mapping[str, Any]],
        tasks: list[dict],
        after: list[dict] | None = None,
        check_mode: bool = False,
    ) -> None:
        self._facts = facts
        self._check_mode = check_mode
        self._tasks = tasks
        self._after = after or []
        self._pending: dict[str, Host] = {}
        self._done: dict[str, Outcome] = {}
        self._count = 0

    @staticmethod
    def _key(facts: Any, settings: Mapping[str, Any]) -> str:
        return repr((facts if isinstance(facts, str) else sorted(facts.items()), sorted(settings.items())))

    def declare(self, facts: str | Mapping[str, Any] = "ubuntu2204", **settings: Any) -> None:
        key = self._key(facts, settings)
        if key in self._done or key in self._pending:
            return
        self._count += 1
        label = (
            facts
            if isinstance(facts, str)
            else f"{facts['distribution']}{facts.get('distribution_major_version', '')}".lower()
        )
        self._pending[key] = Host(
            name=f"{label}-{self._count}", facts=self._facts[facts] if isinstance(facts, str) else facts, vars=settings
        )

    def get(self, facts: str | Mapping[str, Any] = "ubuntu2204", **settings: Any) -> Outcome:
        key = self._key(facts, settings)
        if key not in self._done:
            self.declare(facts, **settings)
            pending, self._pending = self._pending, {}
            outcomes = run(pending.values(), self._tasks, self._after, self._check_mode)
            self._done.update({k: outcomes[host.name] for k, host in pending.items()})
        return self._done[key]
