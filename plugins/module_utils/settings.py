"""The rules of gpufleet's roles' settings, as Python: one module per role, judged on the controller.

Each role whose settings have rules across them (a URL that must be http(s),
a floor that needs a measurement, a CUDA release its driver must run, the
matrix's resolution for this OS and these GPUs) has them in one module,
``plugins/module_utils/rules/<role>.py``, with:

* ``READS``: the variables the rules read, as names or prefixes ending in
  ``*`` (``"cuda_*"``: every variable of that prefix the role sees, its
  defaults included);
* ``judge(judgement)``: the rules; each failed rule adds its message with
  ``judgement.check(ok, message)`` (``judgement.check_form(name, pattern,
  says)`` for a setting that must match a pattern), and what the role's later tasks use is
  set with ``judgement.set(name, value)`` (its private ``__<role>_*`` facts).

The action ``gpufleet.fleet.settings`` (plugins/action/settings.py) templates
the variables a module reads for one host, runs its ``judge`` and stops the
host with one message naming the role, the host and every failed rule; the
unit tests call ``judge`` directly (tests/unit/test_settings_rules.py). The
helpers below are the one implementation of what Jinja's filters did to a
setting before a rule read it (``| int``, ``| float``, ``| bool``,
``| gpufleet.fleet.as_list``), so that the Python rules accept the same
values the YAML rules did.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible.module_utils.common.validation import check_type_dict, check_type_list
from ansible.module_utils.parsing.convert_bool import BOOLEANS_TRUE

# An http(s) URL with a host (http://mirror:8080/debian): the test gpufleet.fleet.http_url.
HTTP_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[^\s{}]*)?$")
_SPACE = re.compile(r"\s+")
_RULES_PACKAGE = "ansible_collections.gpufleet.fleet.plugins.module_utils.rules"


def as_list(value: Any) -> list[Any]:
    """A list setting's value as a list (a string is split on commas, as the spec check does). Raises TypeError."""
    if value is None:
        return []
    return list(check_type_list(value))


def as_dict(value: Any) -> dict[str, Any]:
    """A dict setting's value as a dict (``key=value`` pairs and JSON too, as the spec check accepts).
    Raises TypeError."""
    if value is None or value == "":
        return {}
    return dict(check_type_dict(value))


def is_http_url(value: Any) -> bool:
    """True for an http(s) URL with a host (``http://mirror:8080/debian``)."""
    return isinstance(value, str) and HTTP_URL.match(value) is not None


def to_int(value: Any, default: int = 0) -> int:
    """Jinja's ``| int``: a number, a numeric string (``"8"``, ``"8.0"``), else ``default``."""
    if isinstance(value, bool):
        return int(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def to_float(value: Any, default: float = 0.0) -> float:
    """Jinja's ``| float``: a number or a numeric string, else ``default``."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def to_bool(value: Any) -> bool:
    """Ansible's ``| bool``: True for true, yes, on, 1 (any case), else False."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        value = value.strip().lower()
    return value in BOOLEANS_TRUE


def text(value: Any) -> str:
    """Jinja's ``| string``: None is 'None', False is 'False'."""
    return str(value)


def shown(value: Any) -> str:
    """A value as ``{{ value }}`` shows it inside a message: None is '' (Ansible's finalize), anything else ``str``."""
    return "" if value is None else str(value)


def matches(pattern: str, value: Any) -> bool:
    """Ansible's ``value | string is match(pattern)``: the pattern at the start of the string."""
    return re.match(pattern, str(value)) is not None


def one_line(message: str) -> str:
    """A message on one line, its runs of white space one space (the YAML rules' folded ``>-`` text)."""
    return _SPACE.sub(" ", message).strip()


def rejection(messages: Sequence[str], role: str, host: str) -> str:
    """``<role> settings rejected on <host>: [1] first; [2] second``: the filter gpufleet.fleet.rejection."""
    numbered = "; ".join(f"[{index}] {message}" for index, message in enumerate(messages, start=1))
    return f"{role} settings rejected on {host}: {numbered}"


SYNONYMS = {"version": "release", "versions": "releases"}


def _owner(name: str, roles: Sequence[str]) -> str | None:
    """The role whose prefix ``name`` carries (the longest prefix wins: nvidia_driver_ before a role nvidia)."""
    owners = [role for role in roles if name.startswith(role + "_")]
    return max(owners, key=len) if owners else None


def suggestion(name: str, role: str, options: Sequence[str]) -> str | None:
    """The valid setting ``name`` most likely meant."""
    rest = name[len(role) + 1 :]
    for word, meant in SYNONYMS.items():
        candidate = f"{role}_" + re.sub(rf"(^|_){word}($|_)", rf"\g<1>{meant}\g<2>", rest)
        if candidate != name and candidate in options:
            return candidate
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.8)
    return close[0] if close else None


def unknown_settings(names: Sequence[str], settings: Mapping[str, Sequence[str]]) -> list[str]:
    """Messages for the variables with a role's prefix that no spec of that role defines."""
    messages = []
    for name in sorted(set(names or [])):
        role = _owner(name, list(settings))
        if role is None or name in settings[role]:
            continue
        meant = suggestion(name, role, settings[role])
        hint = f" (did you mean {meant}?)" if meant else f" (docs/roles.md lists the settings of {role})"
        messages.append(f"{name} is not a setting of role {role}{hint}")
    return messages


def rejection_of_hosts(messages: Sequence[str], role: str, host: str, first: str, hosts: Sequence[str]) -> str:
    """The rejection of settings that several hosts share: said in full once, by the first host, naming them all;
    the others point to it."""
    if len(hosts) == 1:
        return rejection(messages, role, host)
    if host != first:
        return f"{role} settings rejected on {host}: the same settings as {first}, whose message gives the reasons"
    return rejection(messages, role, f"{len(hosts)} hosts ({', '.join(hosts)})")


def entry_points(spec_file: Any) -> dict[str, Any]:
    """The ``argument_specs`` mapping of a role's spec file (a Path), parsed once per file version and process with
    libyaml's parser when PyYAML has it. Raises OSError or yaml.YAMLError."""
    import yaml  # only on the controller

    mtime = spec_file.stat().st_mtime
    if spec_file not in _SPECS or _SPECS[spec_file][0] != mtime:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(spec_file.read_text(encoding="utf-8"), Loader=loader) or {}  # noqa: S506 (a safe loader)
        _SPECS[spec_file] = (mtime, data.get("argument_specs") or {})
    return _SPECS[spec_file][1]


def without_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options without their ``default`` keys, suboptions included: play 1 checks the values the inventory
    gives; a role's default (often a template over facts) is the role's own."""
    stripped = {}
    for name, option in options.items():
        option = {key: value for key, value in (option or {}).items() if key != "default"}
        if isinstance(option.get("options"), Mapping):
            option["options"] = without_defaults(option["options"])
        stripped[name] = option
    return stripped


def spec_options(role: str, roles_dir: Any) -> dict[str, Any]:
    """The options of ``role``'s main argument spec without their defaults. Raises OSError, yaml.YAMLError, KeyError."""
    return without_defaults(
        (entry_points(roles_dir / role / "meta" / "argument_specs.yml")["main"]).get("options") or {}
    )


_SPECS: dict[Any, tuple[float, dict[str, Any]]] = {}


# The parts a run can switch on: the gpufleet role's switch and the role it adds (defaults: its defaults/main.yml).
# The roles provision.yml's install play imports together (import_role): each one's tasks see the others' defaults, so
# that cuda judges the driver branch nvidia_driver installs (its default when the inventory gives none). Play 1's
# judgement of a host gives them the same view (tests/unit/test_settings_play.py checks both, and this list against
# the play).
INSTALL_PLAY = ("nvidia_driver", "cuda", "pytorch")

PARTS = {
    "pytorch": "gpufleet_pytorch",
    "slurm": "gpufleet_slurm",
    "monitoring": "gpufleet_monitoring",
    "container": "gpufleet_container",
}


def parts(switches: Mapping[str, Any]) -> dict[str, bool]:
    """{part: on} from the gpufleet role's switches (their values, defaults already under them)."""
    return {part: to_bool(switches.get(name, False)) for part, name in PARTS.items()}


def judged_roles(switched: Mapping[str, bool]) -> list[str]:
    """The roles whose settings play 1 judges: the playbooks', the install's and the verification's, and the parts on
    (the verification and smoke training too: site.yml runs them after provisioning, and a typo there must not wait
    for the install)."""
    return (
        ["gpufleet", "nvidia_driver", "cuda"]
        + [part for part in PARTS if switched.get(part)]
        + ["gpu_verify", "smoke_training"]
    )


def probed_roles(switched: Mapping[str, bool]) -> list[str]:
    """The roles whose download sources play 1 tries (their entry point probe)."""
    return ["nvidia_driver", "cuda"] + [part for part in ("pytorch", "container", "slurm") if switched.get(part)]


class Judgement:
    """One role's settings on one host: what its rules read, what they refuse, what they resolve."""

    def __init__(
        self, role: str, host: str, values: Mapping[str, Any], stack: Callable[..., dict[str, Any]] | None = None
    ):
        self.role = role
        self.host = host
        self.values = dict(values)
        self._stack = stack
        self.errors: list[str] = []
        self.facts: dict[str, Any] = {}
        self.notes: list[str] = []

    def __getitem__(self, name: str) -> Any:
        """The value of a variable the rules read; a KeyError names the variable and the role."""
        try:
            return self.values[name]
        except KeyError:
            raise KeyError(f"rules of role {self.role}: variable {name} is not defined") from None

    def get(self, name: str, default: Any = None) -> Any:
        """The value of a variable, ``default`` when it is not defined (Jinja's ``| default(...)``)."""
        return self.values.get(name, default)

    def check(self, ok: Any, message: str) -> bool:
        """One rule: when ``ok`` is false, its message (on one line) is one of the host's reasons."""
        if not ok:
            self.errors.append(one_line(message))
        return bool(ok)

    def check_form(self, name: str, pattern: str, says: str) -> bool:
        """The rule that setting ``name`` has the form ``pattern`` (a regular expression, re.match); its message
        names the setting and its value: "<name> '<value>' <says>"."""
        value = self[name]
        return self.check(matches(pattern, value), f"{name} '{value}' {says}")

    def refuse(self, messages: Sequence[str]) -> None:
        """Reasons found elsewhere (the matrix's), added as they are."""
        self.errors.extend(one_line(str(message)) for message in messages)

    def set(self, name: str, value: Any) -> Any:
        """A fact the role's later tasks read (set on the host as set_fact would), also readable by later rules."""
        self.facts[name] = value
        self.values[name] = value
        return value

    def note(self, message: str) -> None:
        """A warning for this host that does not stop it."""
        self.notes.append(one_line(message))

    def stack(self, **choices: Any) -> dict[str, Any]:
        """The compatibility matrix resolved for these choices (the lookup gpufleet.fleet.stack)."""
        if self._stack is None:
            raise RuntimeError(f"rules of role {self.role}: no matrix reader was given")
        return self._stack(**choices)

    @property
    def message(self) -> str:
        """The host's rejection, or '' when every rule holds."""
        return rejection(self.errors, self.role, self.host) if self.errors else ""


def rules_of(role: str) -> Any:
    """The rules module of ``role`` (plugins/module_utils/rules/<role>.py). Raises ValueError for a role without one."""
    if not re.match(r"^[a-z][a-z0-9_]*$", role):
        raise ValueError(f"{role!r} is not a role name")
    try:
        module = importlib.import_module(f"{_RULES_PACKAGE}.{role}")
    except ModuleNotFoundError as error:
        if error.name != f"{_RULES_PACKAGE}.{role}":
            raise
        raise ValueError(f"role {role} has no rules module (plugins/module_utils/rules/{role}.py)") from None
    return module


def read_names(reads: Sequence[str], defined: Sequence[str]) -> list[str]:
    """The variable names ``reads`` selects among ``defined``: names as they are, ``prefix*`` every match,
    ``name.key`` the variable ``name`` (of which the rules get only the keys named so: see ``narrowed``)."""
    names = []
    for entry in reads:
        if entry.endswith("*"):
            names.extend(name for name in defined if name.startswith(entry[:-1]))
        elif entry.split(".", 1)[0] in defined:
            names.append(entry.split(".", 1)[0])
    return sorted(set(names))


def narrowed(reads: Sequence[str], values: Mapping[str, Any]) -> dict[str, Any]:
    """The values with each mapping that ``reads`` names as ``name.key`` cut to those keys: the rules of a role read
    a few facts (``ansible_facts.distribution``), and hosts that differ only in the others share one judgement."""
    keys: dict[str, list[str]] = {}
    for entry in reads:
        if "." in entry and not entry.endswith("*"):
            name, key = entry.split(".", 1)
            keys.setdefault(name, []).append(key)
    cut = dict(values)
    for name, wanted in keys.items():
        if isinstance(cut.get(name), Mapping):
            cut[name] = {key: cut[name][key] for key in wanted if key in cut[name]}
    return cut


def judge(
    role: str, host: str, values: Mapping[str, Any], stack: Callable[..., dict[str, Any]] | None = None
) -> Judgement:
    """Run ``role``'s rules on these values (already templated) for ``host``."""
    rules = rules_of(role)
    judgement = Judgement(role, host, narrowed(rules.READS, values), stack)
    rules.judge(judgement)
    return judgement


def os_vars_file(vars_dir: str, facts: Mapping[str, Any]) -> str:
    """The path of a role's OS vars file, as geerlingguy's roles look for it: the first of
    <distribution>-<major>.yml, <distribution>.yml and <os_family>.yml in its vars/ that exists; '' where none does.
    The one place of that order (the lookup gpufleet.fleet.os_vars and the run-once judgement read it)."""
    for name in (
        f"{facts.get('distribution')}-{facts.get('distribution_major_version')}.yml",
        f"{facts.get('distribution')}.yml",
        f"{facts.get('os_family')}.yml",
    ):
        path = os.path.join(vars_dir, name)
        if os.path.isfile(path):
            return path
    return ""
