"""gpufleet as the collection gpufleet.fleet: `ansible-galaxy collection build` makes a
tarball that installs into a scratch collections path, where ansible-doc shows every
role's settings and the example inventory stops `gpufleet.fleet.site` before any
connection. (tests/e2e/test_collection.py runs play 1 from the installed copy against
the lab.)"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from ansible.parsing.plugin_docs import read_docstring

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Every role, with or without an argument spec: ansible-doc lists only those with one.
ROLES = sorted(path.name for path in (REPO / "roles").iterdir() if (path / "tasks").is_dir())


def run(argv: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False)


def ansible_doc(installed: dict, kind: str, *args: str) -> subprocess.CompletedProcess:
    """``ansible-doc -t <kind> <args>`` against the installed collection (its text without colours)."""
    return run(
        [str(BIN / "ansible-doc"), "-t", kind, *args],
        cwd=installed["root"],
        env={**installed["env"], "ANSIBLE_NOCOLOR": "1"},
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The collection built from this clone and installed into a scratch path (no Galaxy)."""
    root = tmp_path_factory.mktemp("collection")
    path = root / "collections"
    # Outside the clone: its ansible.cfg (make exports ANSIBLE_CONFIG) and the link to the
    # clone must not be what answers, nor make ansible-galaxy think it is installed already.
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(path), ANSIBLE_LOCAL_TEMP=str(root / "tmp"), ANSIBLE_HOME=str(root / "home")
    )
    built = run(
        [str(BIN / "ansible-galaxy"), "collection", "build", str(REPO), "--output-path", str(root)], cwd=root, env=env
    )
    assert built.returncode == 0, built.stdout + built.stderr
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    tarball = root / f"{galaxy['namespace']}-{galaxy['name']}-{galaxy['version']}.tar.gz"
    done = run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(path), "--no-deps", "--force"],
        cwd=root,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (path / "ansible_collections" / galaxy["namespace"] / galaxy["name"] / "MANIFEST.json").is_file(), (
        done.stdout
    )
    return {
        "root": root,
        "tarball": tarball,
        "path": path,
        "env": env,
        "dir": path / "ansible_collections" / galaxy["namespace"] / galaxy["name"],
    }


def test_the_tarball_holds_the_product_and_not_the_lab(installed):
    with tarfile.open(installed["tarball"]) as tar:
        top = {name.split("/")[0] for name in tar.getnames()}
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert {"roles", "playbooks", "plugins", "files", "meta", "inventory", "docs", "README.md"} <= top
    assert not top & {"tests", "tools", "molecule", ".venv", ".lab", ".ansible", "reports", "ansible.cfg", "Makefile"}
    assert manifest["collection_info"]["namespace"] == "gpufleet"
    assert manifest["collection_info"]["name"] == "fleet"


def test_no_role_reaches_outside_its_folder(installed):
    """What `grep -rn "role_path.*\\.\\./" roles` checks in the clone, on the installed copy."""
    offenders = [
        f"{path.relative_to(installed['dir'])}: {line.strip()}"
        for path in (installed["dir"] / "roles").rglob("*.yml")
        for line in path.read_text().splitlines()
        if "role_path" in line and "../" in line
    ]
    assert offenders == []


def test_ansible_doc_lists_every_role_with_its_settings(installed):
    """Every role under roles/ is listed (so has an argument spec) and documented whole: each entry point with a
    short and a long description, and exactly its spec's options, each with a description and a type. One
    ansible-doc call for all of them."""
    listed = ansible_doc(installed, "role", "-l", "gpufleet.fleet", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(name.split(".")[-1] for name in json.loads(listed.stdout)) == ROLES
    shown = ansible_doc(installed, "role", "--json", *(f"gpufleet.fleet.{role}" for role in ROLES))
    assert shown.returncode == 0 and not shown.stderr.strip(), shown.stderr
    docs = json.loads(shown.stdout)
    problems = []
    for role in ROLES:
        spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        entry_points = docs[f"gpufleet.fleet.{role}"]["entry_points"]
        assert sorted(entry_points) == sorted(spec), role
        for name, entry in entry_points.items():
            where = f"{role} (entry point {name})"
            problems += [f"{where}: no {key}" for key in ("short_description", "description") if not entry.get(key)]
            options = entry.get("options") or {}
            if sorted(options) != sorted(spec[name].get("options") or {}):
                problems.append(f"{where}: ansible-doc shows options {sorted(options)}, the spec has others")
            problems += [
                f"{where}: option {option} has no {key}"
                for option, option_spec in options.items()
                for key in ("description", "type")
                if not option_spec.get(key)
            ]
    assert problems == []


def test_the_installed_site_playbook_stops_on_the_example_inventory(installed):
    """`ansible-playbook gpufleet.fleet.site -i inventory` from the installed collection, its own example."""
    played = run(
        [str(BIN / "ansible-playbook"), "gpufleet.fleet.site", "-i", str(installed["dir"] / "inventory")],
        cwd=installed["root"],
        env=installed["env"],
    )
    out = played.stdout + played.stderr
    assert played.returncode != 0
    assert "This is gpufleet's example inventory" in out, out
    assert "UNREACHABLE" not in out


# The keys an option of a plugin's DOCUMENTATION may carry (ansible-core's plugin docs schema, the ones gpufleet uses
# and their neighbours); a flow mapping with an unquoted comma in its description makes the rest of it a stray key.
OPTION_KEYS = {
    "description",
    "type",
    "default",
    "elements",
    "required",
    "choices",
    "aliases",
    "version_added",
    "ini",
    "env",
    "vars",
    "suboptions",
    "no_log",
    "keyword",
    "cli",
}
# Every lookup, callback and module (an action plugin is documented as the module of its name).
PLUGINS = sorted(
    (kind.name, path.stem)
    for kind in (REPO / "plugins").iterdir()
    if kind.name in {"lookup", "callback", "modules"}
    for path in kind.glob("*.py")
    if path.name != "__init__.py"
)

ACTIONS = sorted(path.stem for path in (REPO / "plugins" / "action").glob("*.py") if path.name != "__init__.py")


def test_every_action_plugin_is_documented_as_its_module():
    """ansible-doc has no type for action plugins: plugins/action/fleet_report.py's manual is the module's."""
    assert ACTIONS and [name for name in ACTIONS if ("modules", name) not in PLUGINS] == []


@pytest.mark.parametrize("name", ACTIONS)
def test_each_action_plugins_manual_gives_its_options_as_it_checks_them(name):
    """An action plugin's options are checked by its own ARGUMENT_SPEC, which validate-modules never compares with
    the manual (its module file has no code): the same names, types, elements, required and defaults."""
    spec = importlib.import_module(f"ansible_collections.gpufleet.fleet.plugins.action.{name}").ARGUMENT_SPEC
    documented = read_docstring(str(REPO / "plugins" / "modules" / f"{name}.py"))["doc"]["options"]
    assert sorted(documented) == sorted(spec)

    def shape(option: dict) -> tuple:
        return (option["type"], option.get("elements"), bool(option.get("required")), option.get("default"))

    assert {key: shape(documented[key]) for key in spec} == {key: shape(option) for key, option in spec.items()}


@pytest.mark.parametrize(("kind", "name"), PLUGINS, ids=[f"{k}/{n}" for k, n in PLUGINS])
def test_ansible_doc_shows_each_plugins_options_whole(installed, kind, name):
    """ansible-doc -t lookup gpufleet.fleet.stack (and each other documented plugin): its options, each with a
    description and no stray key (the stack lookup's three descriptions once ended at their first comma)."""
    doc_type = {"modules": "module"}.get(kind, kind)
    shown = ansible_doc(installed, doc_type, f"gpufleet.fleet.{name}", "--json")
    assert shown.returncode == 0 and not shown.stderr.strip(), shown.stderr
    doc = json.loads(shown.stdout)[f"gpufleet.fleet.{name}"]["doc"]
    assert doc.get("short_description") and doc.get("author"), doc
    for option, spec in (doc.get("options") or {}).items():
        assert set(spec) <= OPTION_KEYS, (option, sorted(set(spec) - OPTION_KEYS))
        assert spec.get("description"), option


# --- every filter and test: its manual in ansible-doc ----------------------------------------------------


def registered(kind: str) -> dict[str, Callable[..., Any]]:
    """{name: function} of every filter (``kind`` filter) or test (``kind`` test) that the collection's plugin files
    register, read from their FilterModule / TestModule classes as Ansible's loader reads them: a filter added
    there without its documentation fails the test below."""
    method = {"filter": "filters", "test": "tests"}[kind]
    found: dict[str, Callable[..., Any]] = {}
    for path in sorted((REPO / "plugins" / kind).glob("*.py")):
        module = importlib.import_module(f"ansible_collections.gpufleet.fleet.plugins.{kind}.{path.stem}")
        holder = getattr(module, f"{kind.capitalize()}Module", None)
        plugins = getattr(holder(), method)() if holder else {}
        assert not set(plugins) & set(found), (path.name, sorted(set(plugins) & set(found)))
        found.update(plugins)
    return found


def _text(value: Any) -> bool:
    """A description: a non-empty string or a non-empty list of non-empty strings (a stray ": " in a YAML list
    item makes a mapping of it, which ansible-doc cannot print)."""
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(item, str) and item.strip() for item in items)


def doc_problems(name: str, function: Callable[..., Any], entry: dict | None) -> list[str]:
    """What the ansible-doc JSON entry of one filter or test lacks, against the function it documents."""
    if entry is None:
        return [f"{name}: ansible-doc shows nothing"]
    doc, problems = entry.get("doc") or {}, []
    if doc.get("name") != name:
        problems.append(f"{name}: DOCUMENTATION names {doc.get('name')!r}")
    problems += [
        f"{name}: no {key}" for key in ("short_description", "description", "author") if not _text(doc.get(key))
    ]
    # The function's parameters: the first is the value the filter is applied to (_input), the rest its arguments.
    parameters = {
        ("_input" if index == 0 else parameter.name): parameter
        for index, parameter in enumerate(inspect.signature(function).parameters.values())
    }
    options = doc.get("options") or {}
    if sorted(options) != sorted(parameters):
        problems.append(f"{name}: options {sorted(options)}, the function takes {list(parameters)}")
    order = ", ".join(parameters)
    if len(parameters) > 1 and doc.get("positional") != order:
        problems.append(f"{name}: positional {doc.get('positional')!r}, the function's order is {order!r}")
    for key, parameter in parameters.items():
        option, label = options.get(key) or {}, f"{name}: option {key}"
        if not _text(option.get("description")) or not option.get("type"):
            problems.append(f"{label} lacks a description (text) or a type")
        problems += [f"{label} has a stray key {stray!r}" for stray in sorted(set(option) - OPTION_KEYS)]
        problems += [
            f"{label}: {sub} lacks a description (text)"
            for sub, spec in (option.get("suboptions") or {}).items()
            if not _text(spec.get("description"))
        ]
        if bool(option.get("required")) != (parameter.default is inspect.Parameter.empty):
            problems.append(
                f"{label}: required is {bool(option.get('required'))}, the function's default is "
                f"{'none' if parameter.default is inspect.Parameter.empty else repr(parameter.default)}"
            )
    value = (entry.get("return") or {}).get("_value") or {}
    if not (_text(value.get("description")) and value.get("type")):
        problems.append(f"{name}: RETURN has no _value with a description and a type")
    examples = entry.get("examples") or ""
    if f"gpufleet.fleet.{name}" not in examples:
        problems.append(f"{name}: EXAMPLES do not use gpufleet.fleet.{name}")
    try:
        yaml.safe_load(examples)
    except yaml.YAMLError as error:
        problems.append(f"{name}: EXAMPLES are not YAML: {error}")
    return problems


@pytest.mark.parametrize("kind", ["filter", "test"])
def test_ansible_doc_documents_every_filter_and_test(installed, kind):
    """ansible-doc -t filter gpufleet.fleet.<name> (and -t test) prints a whole manual for every filter and test the
    plugins register: a description, every argument the function takes as an option (in the function's order, required
    where it has no default), what it returns and examples. Two ansible-doc calls per kind: the JSON read here, and the
    text a user reads, which must print without an error or a warning."""
    functions = registered(kind)
    names = [f"gpufleet.fleet.{name}" for name in sorted(functions)]
    shown = ansible_doc(installed, kind, "--json", *names)
    assert shown.returncode == 0 and not shown.stderr.strip(), shown.stderr
    docs = json.loads(shown.stdout)
    problems = [
        problem
        for name, function in sorted(functions.items())
        for problem in doc_problems(name, function, docs.get(f"gpufleet.fleet.{name}"))
    ]
    assert problems == []
    printed = ansible_doc(installed, kind, *names)
    assert printed.returncode == 0 and not printed.stderr.strip(), printed.stderr
    assert [name for name in names if f"{kind.upper()} {name} " not in printed.stdout] == []
