"""roles/apt_source, the internal role behind every apt source of the other roles.

Checked without a host:

* its argument specs make Ansible refuse each entry point without its
  required inputs, before any of its tasks runs (a real ansible-playbook run
  on localhost that includes the role with no inputs);
* the callers (nvidia_driver, cuda, container) pass every required input of
  the entry point they include, and nothing that is not an input of it;
* no role reaches into another's folder for the trial script any more;
* the deb822 source and the pins it renders (a real play: apt_source's
  defaults and vars exposed by an include that runs none of its tasks, the
  inputs as the host's variables, its templates rendered by the template
  lookup, its pins selected by its own loop), read by apt itself; two builds
  of the same release from two origins: the pin's build wins;
* entry point trial, run read-only against localhost and a signed repository
  served on 127.0.0.1 (gpg, apt and a local HTTP server): the fact it
  publishes and the one message it stops with, for each kind of problem, and
  the converged path (the host's copy of the source has the bytes entry point
  main writes: the host's apt is asked instead).

The callers' tests (test_driver_rendering.py, test_container_role.py,
test_cuda_stack.py) render what the role writes from the inputs each caller
passes in the same way, in their own plays (role_run.apt_source_capture).
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import role_run
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.plugin_docs import read_docstring
from conftest import (
    CUDA,
    FAKE_FACTS,
    REPO_ROOT,
    ROLES_DIR,
    ansible_playbook,
    cuda_config,
    declare_driver,
    driver_config,
    host_tool,
    load_script,
    load_trusted,
)

from ansible_collections.gpufleet.fleet.plugins.module_utils import apt_source

ROLE = ROLES_DIR / "apt_source"
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
CALLERS = ["container", "cuda", "nvidia_driver"]


# --------------------------------------------------------------------------- helpers


def include_tasks(role: str) -> list[tuple[str, dict]]:
    """(task file, task) of every include_role (or import_role) of apt_source in roles/<role>/tasks."""
    found = []
    for path in sorted((ROLES_DIR / role / "tasks").glob("*.yml")):
        for task in role_run.tasks_of(load_trusted(path)):
            include = task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role")
            if isinstance(include, dict) and include.get("name") == "apt_source":
                found.append((path.name, task))
    return found


def include_task(role: str, task_file: str, entry_point: str) -> dict:
    """The one include of apt_source entry point ``entry_point`` in roles/<role>/tasks/<task_file>."""
    tasks = [
        t
        for f, t in include_tasks(role)
        if f == task_file and role_run.role_of(t).get("tasks_from", "main") == entry_point
    ]
    assert len(tasks) == 1, f"{len(tasks)} includes of apt_source {entry_point} in roles/{role}/tasks/{task_file}"
    return tasks[0]


# What entry point main writes, rendered in a play: apt_source's defaults and vars exposed (none of its tasks
# runs), the inputs as host variables (above the role's defaults, as an include's vars are), then the source
# template and the pins main's template task selects with its own loop.
WRITTEN = role_run.Batch(
    FAKE_FACTS,
    [role_run.expose("apt_source", "hold")],
    after=[
        role_run.capture(
            {
                "source": role_run.template("apt_source", "source.sources.j2"),
                "pins": role_run.apt_source_pins(),
                **role_run.names("__apt_source_sources_file", "__apt_source_origin"),
            },
            name="Render what entry point main writes",
        )
    ],
)


def written(inputs: dict[str, Any]) -> role_run.Outcome:
    """What entry point main writes for these inputs (captured: source, pins [{name, text}], the paths)."""
    cfg = WRITTEN.get("debian12", **inputs)
    assert cfg.failure is None, cfg.failure
    return cfg


def source_text(inputs: dict[str, Any]) -> str:
    return written(inputs)["source"]


def pin_text(inputs: dict[str, Any], pin: dict[str, Any]) -> str:
    """The preferences file main writes for ``pin`` (the one pin of the inputs)."""
    (rendered,) = written({**inputs, "apt_source_pins": [pin]})["pins"]
    assert rendered["name"] == pin["name"]
    return rendered["text"]


def required(entry_point: str) -> set[str]:
    return {name for name, option in SPECS[entry_point]["options"].items() if option.get("required")}


# --------------------------------------------------------------------------- the inputs


def test_the_role_is_marked_internal_and_has_four_entry_points():
    assert sorted(SPECS) == ["hold", "main", "simulate", "trial"]
    for spec in SPECS.values():
        assert spec["short_description"].startswith("Internal: ")


@pytest.mark.parametrize("entry_point", ["main", "trial", "hold", "simulate"])
def test_each_entry_point_requires_the_inputs_it_cannot_work_without(entry_point):
    """What the role must be told has no default: not in defaults/main.yml, not in the spec."""
    names = required(entry_point)
    assert names, entry_point
    defaults = load_trusted(ROLE / "defaults" / "main.yml")
    for name in names:
        assert name not in defaults and "default" not in SPECS[entry_point]["options"][name], name
    expected = {
        "main": {"apt_source_repository"},
        "trial": {"apt_source_repository", "apt_source_package"},
        "hold": {"apt_source_hold_packages", "apt_source_hold"},
        "simulate": {"apt_source_simulate_packages"},
    }
    assert names == expected[entry_point]


@pytest.mark.parametrize("host", ["ubuntu2004", "ubuntu2204", "debian12"])
def test_what_each_caller_gives_the_trial_passes_the_trial_spec(host):
    """The callers include entry point trial with rolespec_validate: false (in play 1 it runs host by host, and its
    validation would cost a task a host): what each gives it, templated as on a host of each OS, takes only the
    trial's options and passes its spec (types, choices, required), as the validation would have checked it."""
    validator = ArgumentSpecValidator(SPECS["trial"]["options"])
    for caller, inputs in (
        ("nvidia_driver", driver_config(host)["trial_inputs"]),
        # NVIDIA publishes no CUDA 12.1 for debian12: a site repository there.
        (
            "cuda",
            cuda_config(
                host, **({"cuda_repository_url": "http://mirror.example.com/cuda"} if host == "debian12" else {})
            )["trial_inputs"],
        ),
    ):
        inputs = role_run.plain(inputs)
        assert set(inputs) <= set(SPECS["trial"]["options"]), (caller, sorted(inputs))
        errors = validator.validate(inputs, validate_role_argument_spec=True).error_messages
        assert errors == [], (caller, errors)
        # The check sees a wrong input.
        wrong = validator.validate({**inputs, "apt_source_repository": "a string"}, validate_role_argument_spec=True)
        assert wrong.error_messages, caller
    for role in CALLERS:
        includes = [
            role_run.role_of(task)
            for path in (ROLES_DIR / role / "tasks").glob("*.yml")
            for task in yaml.safe_load(path.read_text()) or []
            if role_run.role_of(task).get("tasks_from") == "trial"
        ]
        assert includes and all(include.get("rolespec_validate") is False for include in includes), role


def test_the_source_is_one_input_whose_parts_the_role_derives():
    """apt_source_repository (one dict, the same option in main and trial) is the source: vars/main.yml derives one
    role variable per part, under the name the tasks and templates read, an optional part with the spec's default;
    none of them is an input or a default of its own (a caller cannot give a part twice)."""
    option = SPECS["main"]["options"]["apt_source_repository"]
    assert SPECS["trial"]["options"]["apt_source_repository"] == option
    parts = option["options"]
    derived = load_trusted(ROLE / "vars" / "main.yml")
    defaults = load_trusted(ROLE / "defaults" / "main.yml")
    for part, spec in parts.items():
        name = f"apt_source_{part}"
        assert name not in defaults and all(name not in s["options"] for s in SPECS.values()), name
        reads = f"apt_source_repository.{part}"
        if spec.get("required"):
            assert derived[name] == "{{ %s }}" % reads, name
        else:
            default = str(spec["default"]).lower() if isinstance(spec["default"], bool) else repr(spec["default"])
            assert derived[name] == "{{ %s | default(%s) }}" % (reads, default), name
    assert {name for name in derived if name.startswith("apt_source_")} == {f"apt_source_{part}" for part in parts}
    assert [name for name, spec in parts.items() if spec.get("required")] == [
        "caller",
        "name",
        "description",
        "url",
        "suites",
        "keyring",
    ]


def test_the_trial_action_takes_the_entry_points_inputs_and_reads_every_part_of_the_source():
    """trial.yml gives the action gpufleet.fleet.apt_source_trial each input of entry point trial once (the source as
    one value, apt_source_repository), under the option's name without apt_source_, of the option's type and default;
    the action reads every part of the source through the role's own variables (vars/main.yml, the defaults above)."""
    from ansible_collections.gpufleet.fleet.plugins.action import apt_source_trial

    options = SPECS["trial"]["options"]
    assert apt_source_trial.PARTS == tuple(options["apt_source_repository"]["options"])
    given = role_run.role_task("apt_source", "trial.yml", "Try the source")["gpufleet.fleet.apt_source_trial"]
    assert set(given) == set(apt_source_trial.ARGUMENT_SPEC)
    assert given.pop("claims") == "{{ apt_source_trial.claims | default([]) }}"
    for name, expression in given.items():
        option, spec = options[f"apt_source_{name}"], apt_source_trial.ARGUMENT_SPEC[name]
        default = "" if option.get("required") else " | default(%s)" % repr(option["default"])
        assert expression == "{{ apt_source_%s%s }}" % (name, default), name
        assert (spec["type"], spec.get("elements"), spec.get("required", False), spec.get("default")) == (
            option["type"],
            option.get("elements"),
            option.get("required", False),
            option.get("default"),
        ), name
    # Every input of the entry point reaches the action.
    assert {f"apt_source_{name}" for name in apt_source_trial.ARGUMENT_SPEC if name != "claims"} == set(options)


TRIAL_SOURCE = {
    "caller": "cuda",
    "name": "cuda",
    "description": "NVIDIA's CUDA repository",
    "url": "https://mirror.example.com/cuda//",
    "suites": ["/"],
    "components": [],
    "architectures": ["amd64"],
    "keyring": "/usr/share/keyrings/cuda-archive-keyring.gpg",
    "key_url": "",
    "keyring_deb_url": "https://mirror.example.com/cuda/cuda-keyring_1.1-1_all.deb",
    "managed": True,
    "sources_file": "/etc/apt/sources.list.d/gpufleet-mirror.example.com-cuda.sources",
    "records_dir": "/var/lib/gpufleet/apt-sources",
    "preferences_dir": "/etc/apt/preferences.d",
}
TRIAL_INPUTS = {
    "package": "cuda-toolkit-12-1",
    "version": "12.1.1-1",
    "version_name": "the toolkit of cuda_release 12.1",
    "url_name": "cuda_repository_url",
    "keyring_name": "cuda_repository_keyring",
    "setting_names": {"url": "cuda_repository_url"},
    "show_packages": [],
    "simulate_packages": [],
    "simulate_release": [],
    "simulate_pins": [],
}


def test_the_trial_arguments_of_a_flat_repository_signed_by_a_keyring_package():
    """apt_source.trial_arguments (the action's derivation, plain Python): the Release file at a flat repository's
    root, the URL's trailing slashes dropped from the claim and the Release URL but kept where the message quotes it,
    no keyring looked for on the host (the keyring package brings it)."""
    args = apt_source.trial_arguments(TRIAL_SOURCE, TRIAL_INPUTS, "node1")
    assert args["release_url"] == "https://mirror.example.com/cuda/Release"
    assert args["claim"]["url"] == "https://mirror.example.com/cuda"
    assert args["source"]["url"] == TRIAL_SOURCE["url"]
    assert args["look_for_keyring"] is False
    assert args["source"]["keyring_deb_url"] == TRIAL_SOURCE["keyring_deb_url"]
    assert args["source"]["host"] == "node1"
    assert args["claim"]["settings"] == {"url": "cuda_repository_url"}
    assert args["environment"] == {
        "TRIAL_SHOW_VERSION": "12.1.1-1",
        "TRIAL_SIMULATE": "",
        "TRIAL_RELEASE": "",
        "TRIAL_OWN_PREFERENCES": "",
    }
    # The module takes every argument the derivation gives (its own spec would refuse another).
    documented = read_docstring(str(role_run.REPO_ROOT / "plugins" / "modules" / "apt_trial.py"))["doc"]["options"]
    assert set(args) <= set(documented), sorted(set(args) - set(documented))


def test_the_trial_arguments_of_a_suite_repository_with_a_key_url_and_simulated_pins():
    source = {
        **TRIAL_SOURCE,
        "url": "http://archive.ubuntu.com/ubuntu",
        "suites": ["jammy-updates", "jammy-security"],
        "components": ["restricted"],
        "key_url": "http://archive.example.com/key.asc",
        "keyring_deb_url": "",
    }
    inputs = {
        **TRIAL_INPUTS,
        "version": "1:535.261.03",
        "simulate_packages": ["nvidia-driver-535-server=535.261.03-*", "nvidia-dkms-535-server"],
        "simulate_release": ["nvidia-driver-535-server"],
        "simulate_pins": [
            {"name": "nvidia-driver", "packages": ["nvidia-driver-535-server"], "version": "535.261.03-*"}
        ],
    }
    args = apt_source.trial_arguments(source, inputs, "node1")
    # The first suite's Release file.
    assert args["release_url"] == "http://archive.ubuntu.com/ubuntu/dists/jammy-updates/Release"
    assert args["look_for_keyring"] is False and args["key_url"] == source["key_url"]
    assert args["environment"] == {
        "TRIAL_SHOW_VERSION": "535.261.03",
        "TRIAL_SIMULATE": "nvidia-driver-535-server=535.261.03-* nvidia-dkms-535-server",
        "TRIAL_RELEASE": "nvidia-driver-535-server",
        "TRIAL_OWN_PREFERENCES": "/etc/apt/preferences.d/gpufleet-nvidia-driver.pref",
    }
    # Neither a key URL nor a keyring package: the keyring must be on the host.
    assert apt_source.trial_arguments({**source, "key_url": ""}, inputs, "node1")["look_for_keyring"] is True


@pytest.mark.parametrize(
    ("version", "offered", "counts"),
    [
        ("535.261.03", "535.261.03-1~deb12u1", True),  # the upstream part of a Debian build
        ("535.261.03", "535.261.03-0ubuntu1", True),
        ("535.261.03", "1:535.261.03-1", True),  # an epoch is ignored
        ("535.261.03", "535.261.031-1", False),
        ("535.261.03", "535.261.03-1-2", False),  # one revision only
        ("535.261.03", "535x261.03-1", False),  # dots are literal
        ("12.1.1-1", "12.1.1-1", True),
        ("12.1.1-1", "12.1.1-10", False),
    ],
)
def test_the_versions_that_count_as_the_one_asked_for(version, offered, counts):
    regex = apt_source.trial_arguments(TRIAL_SOURCE, {**TRIAL_INPUTS, "version": version}, "node1")["version_regex"]
    assert bool(re.match(regex, offered)) is counts


def test_a_source_without_suites_is_refused_with_its_caller_named():
    """The role's spec takes any list; the trial's arguments need a suite (the Release file's place)."""
    with pytest.raises(
        ValueError, match=r"^apt_source: cuda gives the source https://mirror.example.com/cuda// no suites"
    ):
        apt_source.trial_arguments({**TRIAL_SOURCE, "suites": []}, TRIAL_INPUTS, "node1")


def test_no_version_asked_for_counts_any():
    assert apt_source.trial_arguments(TRIAL_SOURCE, {**TRIAL_INPUTS, "version": ""}, "node1")["version_regex"] == ""


@pytest.mark.parametrize("entry_point", ["main", "trial", "hold"])
def test_ansible_refuses_an_entry_point_without_its_inputs(tmp_path, entry_point):
    """An inline localhost play includes apt_source with no input: the spec check fails, and no task of the role
    runs."""
    include = {"name": "apt_source"} if entry_point == "main" else {"name": "apt_source", "tasks_from": entry_point}
    run = ansible_playbook(
        tmp_path,
        [
            {
                "name": "Include apt_source without its inputs",
                "hosts": "localhost",
                "connection": "local",
                "gather_facts": False,
                "tasks": [{"name": "Include the role", "ansible.builtin.include_role": include}],
            }
        ],
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert f"Validating arguments against arg spec '{entry_point}'" in out
    assert "missing required arguments: " + ", ".join(sorted(required(entry_point))) in out, out
    ran = [
        line
        for line in out.splitlines()
        if line.startswith("TASK [apt_source : ") and "Validating arguments" not in line
    ]
    assert ran == [], ran


@pytest.mark.parametrize("entry_point", ["main", "trial"])
def test_ansible_refuses_a_source_with_a_part_missing_misspelt_or_mistyped(tmp_path, entry_point):
    """The parts of apt_source_repository are checked by the spec, before any task of the role: a required part
    missing, a part the spec does not know (a misspelt keyring) and a part of the wrong type are each named."""
    include = {"name": "apt_source"} if entry_point == "main" else {"name": "apt_source", "tasks_from": entry_point}
    repository = {
        "caller": "tester",
        "name": "test",
        "description": "the test repository",
        "suites": ["/"],
        "keyrng": "/usr/share/keyrings/test.gpg",
        "managed": "maybe",
    }
    run = ansible_playbook(
        tmp_path,
        [
            {
                "name": "Include apt_source with a wrong source",
                "hosts": "localhost",
                "connection": "local",
                "gather_facts": False,
                "tasks": [
                    {
                        "name": "Include the role",
                        "ansible.builtin.include_role": include,
                        "vars": {"apt_source_repository": repository, "apt_source_package": "apt"},
                    }
                ],
            }
        ],
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert f"Validating arguments against arg spec '{entry_point}'" in out
    assert "missing required arguments: keyring, url found in apt_source_repository" in out, out
    assert "apt_source_repository.keyrng. Supported parameters include: " in out, out
    assert "argument 'managed' is of type str found in 'apt_source_repository'" in out, out
    assert [line for line in out.splitlines() if line.startswith("TASK [apt_source : ")] == [
        f"TASK [apt_source : Validating arguments against arg spec '{entry_point}' - "
        f"{SPECS[entry_point]['short_description']}] ***"
    ]


def test_every_caller_includes_both_the_trial_and_the_configuration():
    for role in CALLERS:
        entry_points = [role_run.role_of(t).get("tasks_from", "main") for _file, t in include_tasks(role)]
        assert "trial" in entry_points and "main" in entry_points, role


@pytest.mark.parametrize(
    ("role", "task_file", "entry_point"),
    [(role, f, role_run.role_of(t).get("tasks_from", "main")) for role in CALLERS for f, t in include_tasks(role)],
    ids=str,
)
def test_callers_pass_every_required_input_and_only_inputs(role, task_file, entry_point):
    given = set(include_task(role, task_file, entry_point).get("vars") or {})
    assert required(entry_point) - given == set(), f"roles/{role}/tasks/{task_file} does not give {entry_point} these"
    assert given - set(SPECS[entry_point]["options"]) == set(), (
        f"roles/{role}/tasks/{task_file} gives what {entry_point} does not take"
    )


def test_the_trial_script_lives_in_the_role_and_no_role_reaches_outside_its_folder():
    """Only apt_source names its trial script, from its own files/; none of these roles climbs out of its folder."""
    assert (ROLE / "files" / "apt-repository-trial.sh").is_file()
    assert not (REPO_ROOT / "files" / "apt-repository-trial.sh").exists()
    for path in sorted(ROLES_DIR.rglob("*.yml")):
        if "apt-repository-trial.sh" in path.read_text():
            assert path.is_relative_to(ROLE), path
    paths = [
        *ROLE.rglob("*.yml"),
        *(ROLES_DIR / "cuda").rglob("*.yml"),
        *(ROLES_DIR / "nvidia_driver").rglob("*.yml"),
        *(ROLES_DIR / "container" / "tasks").glob("*.yml"),
    ]
    climbing = [
        f"{p.relative_to(REPO_ROOT)}: {line.strip()}"
        for p in paths
        for line in p.read_text().splitlines()
        if "role_path" in line and "../" in line
    ]
    assert climbing == []


def test_no_role_reads_the_private_facts_of_another():
    """The callers read apt_source's published facts only, and no role reads __cuda_repository_done any more."""
    for role in CALLERS:
        text = "\n".join(p.read_text() for p in (ROLES_DIR / role / "tasks").glob("*.yml"))
        assert "__apt_source_" not in text, role
    assert not any("__cuda_repository_done" in p.read_text() for p in ROLES_DIR.rglob("*.yml"))


# --------------------------------------------------------------------------- what main writes


REPOSITORY = {
    "caller": "tester",
    "name": "test",
    "description": "the test repository",
    "url": "https://mirror.example.com/debian/",
    "suites": ["bookworm", "bookworm-updates"],
    "components": ["contrib", "non-free"],
    "keyring": "/usr/share/keyrings/test.gpg",
}
SOURCE = {"apt_source_repository": REPOSITORY}
FLAT = {
    "apt_source_repository": {
        **REPOSITORY,
        "url": "https://mirror.example.com/cuda/debian12/x86_64",
        "suites": ["/"],
        "components": [],
        "architectures": ["arm64"],
    }
}
# Another role's use of the same repository.
OTHER_CALLER = {
    "apt_source_repository": {
        **REPOSITORY,
        "caller": "another",
        "name": "another-test",
        "description": "another repository",
    }
}


def _stanzas(text: str) -> list[dict[str, str]]:
    stanzas, current = [], {}
    for line in text.splitlines() + [""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current = {}
            continue
        key, _colon, value = line.partition(":")
        assert key not in current
        current[key] = value.strip()
    return stanzas


def test_the_source_is_deb822_signed_by_the_keyring():
    text = source_text(SOURCE)
    assert text.startswith(
        f"# {role_run.ansible_managed()}\n# gpufleet's one source for this repository, shared by every"
    )
    assert _stanzas(text) == [
        {
            "Types": "deb",
            "URIs": "https://mirror.example.com/debian",
            "Suites": "bookworm bookworm-updates",
            "Components": "contrib non-free",
            "Architectures": "amd64",
            "Signed-By": "/usr/share/keyrings/test.gpg",
        }
    ]


def test_a_flat_source_has_a_trailing_slash_and_no_components():
    assert _stanzas(source_text(FLAT)) == [
        {
            "Types": "deb",
            "URIs": "https://mirror.example.com/cuda/debian12/x86_64/",
            "Suites": "/",
            "Architectures": "arm64",
            "Signed-By": "/usr/share/keyrings/test.gpg",
        }
    ]


def test_the_source_file_is_the_repositorys_and_its_bytes_name_no_caller():
    """One file per repository URL, named after it (not after the source user, apt_source_name), with the same bytes
    whichever role writes it: the roles that install from one repository share it."""
    variables = written(SOURCE)
    assert (
        variables["__apt_source_sources_file"] == "/etc/apt/sources.list.d/gpufleet-mirror.example.com_debian.sources"
    )
    assert variables["__apt_source_origin"] == "mirror.example.com"
    other = written(OTHER_CALLER)
    assert other["__apt_source_sources_file"] == variables["__apt_source_sources_file"]
    assert other["source"] == variables["source"]


EXACT_PIN = {"name": "cuda", "packages": ["cuda-toolkit-12-1"], "version": "12.1.1-1"}
BUILD_PIN = {
    "name": "nvidia-driver",
    "packages": ["*nvidia*", "libcuda1"],
    "version": "535.261.03-*",
    "build": "535.261.03-1~deb12u1",
}


def test_an_exact_version_is_one_record():
    assert _stanzas(pin_text(FLAT, EXACT_PIN)) == [
        {
            "Explanation": "gpufleet tester cuda: 12.1.1-1",
            "Package": "cuda-toolkit-12-1",
            "Pin": "version 12.1.1-1",
            "Pin-Priority": "1001",
        }
    ]


def test_a_pattern_with_the_source_build_is_two_records_the_build_first():
    first, second = _stanzas(pin_text(SOURCE, BUILD_PIN))
    assert (first["Pin"], first["Pin-Priority"]) == ("version 535.261.03-1~deb12u1", "1001")
    assert (second["Pin"], second["Pin-Priority"]) == ("version 535.261.03-*", "1000")
    assert first["Package"] == second["Package"] == "*nvidia* libcuda1"
    assert "mirror.example.com" in first["Explanation"] and "mirror.example.com" in second["Explanation"]


def _policy(tmp_path: Path, preferences: str, repos: dict[str, list[tuple[str, str]]], package: str) -> str:
    """apt-cache policy of ``package`` with flat file: repositories {name: [(package, version)]} and these
    preferences."""
    host_tool("apt-get")
    sources = []
    for name, packages in repos.items():
        repo = tmp_path / name
        repo.mkdir()
        (repo / "Packages").write_text(
            "".join(
                f"Package: {p}\nVersion: {v}\nArchitecture: amd64\nMaintainer: t <t@example.com>\nFilename: "
                f"./{p}_{v}.deb\nSize: 1\nSHA256: {'0' * 64}\nDescription: test\n\n"
                for p, v in packages
            )
        )
        sources.append(f"Types: deb\nURIs: file:{repo}/\nSuites: /\nSigned-By: /dev/null\n")
    for part in ("parts", "lists/partial", "cache/archives/partial", "prefs"):
        (tmp_path / part).mkdir(parents=True)
    (tmp_path / "parts" / "test.sources").write_text("\n".join(sources))
    (tmp_path / "prefs" / "gpufleet-test.pref").write_text(preferences)
    options = [
        "-oDir::Etc::SourceList=/dev/null",
        f"-oDir::Etc::SourceParts={tmp_path / 'parts'}",
        f"-oDir::State::Lists={tmp_path / 'lists'}",
        f"-oDir::Cache={tmp_path / 'cache'}",
        "-oDir::State::status=/dev/null",
        "-oDir::Etc::Preferences=/dev/null",
        f"-oDir::Etc::PreferencesParts={tmp_path / 'prefs'}",
        "-oDebug::NoLocking=1",
        "-oAPT::Sandbox::User=root",
        # Test repositories made here, unsigned: only for these scratch lists.
        "-oAcquire::AllowInsecureRepositories=1",
    ]
    update = subprocess.run(["apt-get", *options, "update"], capture_output=True, text=True, check=False)
    assert update.returncode == 0, update.stdout + update.stderr
    policy = subprocess.run(["apt-cache", *options, "policy", package], capture_output=True, text=True, check=False)
    assert policy.returncode == 0 and "E:" not in policy.stderr, policy.stderr
    return policy.stdout


TWO_ORIGINS = {
    "ours": [
        ("nvidia-smi", "535.261.03-1~deb12u1"),
        ("nvidia-smi", "535.300.01-1~deb12u1"),
        ("libcuda1", "535.261.03-1~deb12u1"),
    ],
    "theirs": [("nvidia-smi", "535.261.03-1"), ("nvidia-smi", "550.127.05-1"), ("libcuda1", "535.261.03-1")],
}


def two_origins_pin(build: str) -> dict[str, Any]:
    return {"name": "test", "packages": ["*nvidia*", "libcuda1"], "version": "535.261.03-*", "build": build}


@pytest.mark.parametrize(
    ("build", "candidate"),
    [("535.261.03-1~deb12u1", "535.261.03-1~deb12u1"), ("", "535.261.03-1")],
    ids=["with-the-build", "pattern-only"],
)
def test_the_build_keeps_another_origins_build_of_the_release_out(tmp_path, build, candidate):
    """Two origins build 535.261.03 (their version strings differ); the pattern alone lets apt take the higher string,
    another origin's; the pin with this source's build (from the trial) keeps this source's."""
    policy = _policy(tmp_path, pin_text(SOURCE, two_origins_pin(build)), TWO_ORIGINS, "nvidia-smi")
    assert f"Candidate: {candidate}\n" in policy, policy
    assert f"     {candidate} 1001\n" in policy, policy


# The cases above, known up front: one run.
for _inputs in (
    SOURCE,
    FLAT,
    OTHER_CALLER,
    {**FLAT, "apt_source_pins": [EXACT_PIN]},
    {**SOURCE, "apt_source_pins": [BUILD_PIN]},
    *({**SOURCE, "apt_source_pins": [two_origins_pin(_build)]} for _build in ("535.261.03-1~deb12u1", "")),
):
    WRITTEN.declare("debian12", **_inputs)


# --------------------------------------------------------------------------- entry point trial on localhost


@pytest.fixture(scope="module")
def signed_repository(tmp_path_factory):
    """A flat repository signed by a fresh key, served on 127.0.0.1: (url, keyring file, other key file, directory)."""
    for tool in ("gpg", "apt-ftparchive", "apt-get", "dpkg-query"):
        host_tool(tool)
    if not Path("/usr/bin/python3").is_file():
        pytest.skip("no /usr/bin/python3 (with apt) to run the role's modules on localhost")
    root = tmp_path_factory.mktemp("signed")
    home = root / "gnupg"
    home.mkdir(mode=0o700)
    other_home = root / "gnupg-other"
    other_home.mkdir(mode=0o700)

    def gpg(*args: str, home_dir: Path = home) -> str:
        return subprocess.run(
            ["gpg", "--homedir", str(home_dir), "--batch", "--quiet", *args], capture_output=True, text=True, check=True
        ).stdout

    for home_dir in (home, other_home):
        gpg(
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            "gpufleet test <test@example.com>",
            "ed25519",
            "sign",
            "never",
            home_dir=home_dir,
        )
    (root / "key.asc").write_text(gpg("--armor", "--export"))
    (root / "other.asc").write_text(gpg("--armor", "--export", home_dir=other_home))
    repo = root / "www" / "repo"
    repo.mkdir(parents=True)
    (repo / "Packages").write_text(
        "".join(
            f"Package: gpufleet-test-tool\nVersion: {v}\nArchitecture: amd64\nMaintainer: t <t@example.com>\n"
            f"Filename: ./tool_{v}.deb\nSize: 1\nSHA256: {'0' * 64}\nDescription: test\n\n"
            for v in ("2.0.1-1", "2.1.0-1")
        )
    )
    release = subprocess.run(
        ["apt-ftparchive", "release", "."], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    (repo / "Release").write_text(release)
    gpg("--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
    (root / "www" / "key.asc").write_text((root / "key.asc").read_text())

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root / "www"))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"url": f"http://127.0.0.1:{server.server_address[1]}", "root": root}
    finally:
        server.shutdown()


def _claim(url: str, keyring: str) -> dict[str, Any]:
    """Another role's claim on a flat repository, as its trial makes it (trial.yml)."""
    return {
        "name": "other-test",
        "caller": "other",
        "description": "the other repository",
        "url": url,
        "suites": ["/"],
        "components": [],
        "architectures": ["amd64"],
        "keyring": keyring,
        "key_url": "",
        "settings": {"url": "other_repository_url", "keyring": "other_repository_keyring"},
    }


def _installed(package: str) -> str:
    return subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def trials(signed_repository, tmp_path_factory):
    """Entry point trial for each case, read-only, in one localhost run (one inventory host per case, in parallel):
    {case: {fact, failed}}."""
    url, root = signed_repository["url"], signed_repository["root"]
    repository = {
        "caller": "tester",
        "name": "gpufleet-unit-test",
        "description": "the test repository",
        "url": f"{url}/repo",
        "suites": ["/"],
        "keyring": str(root / "key.asc"),
        "key_url": "",
        "managed": True,
    }
    base = {
        "apt_source_repository": repository,
        "apt_source_url_name": "test_repository_url",
        "apt_source_keyring_name": "test_repository_keyring",
        "apt_source_package": "gpufleet-test-tool",
        "apt_source_version": "2.0.1",
        "apt_source_version_name": "test_version",
        "apt_source_show_packages": [],
        "apt_source_setting_names": {"url": "test_repository_url", "keyring": "test_repository_keyring"},
        # Where the host's copy of the source would be; none, but for the converged case.
        "__apt_source_sources_file": str(root / "absent.sources"),
    }
    # The converged host's copy of the source: the bytes entry point main would write (the same template action).
    written = root / "written.sources"
    cases = {
        "ok": {},
        "missing-version": {"apt_source_version": "2.9.9"},
        "wrong-key": {"apt_source_repository": {**repository, "keyring": str(root / "other.asc")}},
        "key-url": {
            "apt_source_repository": {**repository, "keyring": str(root / "fetched.asc"), "key_url": f"{url}/key.asc"}
        },
        "key-url-404": {
            "apt_source_repository": {
                **repository,
                "keyring": str(root / "fetched.asc"),
                "key_url": f"{url}/absent.asc",
            }
        },
        "missing-keyring": {"apt_source_repository": {**repository, "keyring": str(root / "absent.gpg")}},
        "wrong-url": {"apt_source_repository": {**repository, "url": f"{url}/no-such-repo"}},
        # A package installed here at its version, and the host's copy of the source as main writes it.
        "converged": {
            "apt_source_package": "apt",
            "apt_source_version": _installed("apt"),
            "__apt_source_sources_file": str(written),
        },
        "not-managed": {
            "apt_source_repository": {**repository, "managed": False},
            "apt_source_package": "apt",
            "apt_source_version": "0.0.1",
        },
        # The stanzas of packages to show: from the scratch trial, and from the host's apt on a converged host.
        "stanzas": {"apt_source_show_packages": ["gpufleet-test-tool"]},
        "stanzas-all-versions": {"apt_source_show_packages": ["gpufleet-test-tool"], "apt_source_version": ""},
        "converged-stanzas": {
            "apt_source_package": "apt",
            "apt_source_version": _installed("apt"),
            "__apt_source_sources_file": str(written),
            "apt_source_show_packages": ["apt"],
        },
        # Another role of the run claimed this repository: alike, or with another Signed-By (and another scheme).
        "claimed-alike": {},
        "claimed-otherwise": {},
    }
    claims = {
        "claimed-alike": [_claim(f"{url}/repo/", str(root / "key.asc"))],
        "claimed-otherwise": [_claim(f"{url.replace('http:', 'https:')}/repo", "/usr/share/keyrings/other.gpg")],
    }
    out = tmp_path_factory.mktemp("trials")
    inventory = out / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        case: {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": "/usr/bin/python3",
                            "trial_case": {**base, **given},
                            # The claims of the host's earlier trial (another role's), as its result has them.
                            **({"apt_source_trial": {"claims": claims[case]}} if case in claims else {}),
                        }
                        for case, given in cases.items()
                    }
                }
            }
        )
    )
    plays = [
        {
            "name": "Trials",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Write the source as entry point main would",
                    "ansible.builtin.template": {
                        "src": str(ROLE / "templates" / "source.sources.j2"),
                        "dest": str(written),
                        "mode": "0644",
                    },
                    # The role's variables: what the template reads, derived from apt_source_repository.
                    "vars": {**yaml.safe_load((ROLE / "vars" / "main.yml").read_text()), **base},
                    "when": "inventory_hostname == 'converged'",
                },
                {
                    "name": "Try the case",
                    "block": [
                        {
                            "name": "Include the trial",
                            "ansible.builtin.include_role": {"name": "apt_source", "tasks_from": "trial"},
                            "vars": {key: "{{ trial_case['%s'] }}" % key for key in base},
                        },
                        {
                            "name": "Record the trial",
                            "ansible.builtin.set_fact": {
                                "trial_result": {
                                    "fact": "{{ apt_source_trial }}",
                                    "failed": "",
                                    "claims": "{{ apt_source_trial.claims | default([]) }}",
                                }
                            },
                        },
                    ],
                    "rescue": [
                        {
                            "name": "Record the failure",
                            "ansible.builtin.set_fact": {
                                "trial_result": {
                                    "fact": "{{ apt_source_trial | default({}) }}",
                                    "failed": "{{ ansible_failed_result.msg }}",
                                    "claims": "{{ apt_source_trial.claims | default([]) }}",
                                }
                            },
                        },
                    ],
                },
                {
                    "name": "Write the results",
                    "run_once": True,
                    "ansible.builtin.copy": {
                        "content": (
                            "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, "
                            "'trial_result'))) | to_json }}"
                        ),
                        "dest": f"{out}/results.json",
                        "mode": "0644",
                    },
                },
            ],
        }
    ]
    run = ansible_playbook(out, plays, "-i", str(inventory), "--forks", str(len(cases)))
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr
    return json.loads((out / "results.json").read_text())


def test_trial_of_a_good_source(trials):
    result = trials["ok"]
    assert result["failed"] == ""
    fact = result["fact"]
    assert fact["ok"] is True and fact["reason"] == "" and fact["message"] == ""
    assert fact["tried"] is True and fact["converged"] is False
    assert fact["offered"] == ["2.1.0-1", "2.0.1-1"]
    assert fact["version"] == "2.0.1" and fact["build"] == "2.0.1-1" and fact["found"] is True


def test_trial_publishes_the_stanzas_of_the_packages_to_show(trials):
    """apt_source_show_packages: their stanzas at the version asked for (at every version when none is), as parsed
    records, from the scratch trial or from the host's apt on a converged host; none by default."""
    assert trials["ok"]["fact"]["stanzas"] == []
    (stanza,) = trials["stanzas"]["fact"]["stanzas"]
    assert (stanza["Package"], stanza["Version"]) == ("gpufleet-test-tool", "2.0.1-1")
    assert sorted(s["Version"] for s in trials["stanzas-all-versions"]["fact"]["stanzas"]) == ["2.0.1-1", "2.1.0-1"]
    converged = trials["converged-stanzas"]["fact"]
    assert converged["tried"] is False
    assert [(s["Package"], s["Version"]) for s in converged["stanzas"]] == [("apt", _installed("apt"))]


def test_trial_stops_when_the_version_is_not_offered(trials):
    result = trials["missing-version"]
    assert result["failed"] == (
        f"tester on missing-version: test_version 2.9.9 is not in {result['fact']['url']};"
        " gpufleet-test-tool is offered at 2.1.0-1, 2.0.1-1"
    )
    assert result["fact"]["ok"] is True and result["fact"]["found"] is False


def test_trial_stops_when_apt_rejects_the_signature(trials, signed_repository):
    result = trials["wrong-key"]
    fact = result["fact"]
    assert fact["ok"] is False and "NO_PUBKEY" in fact["reason"]
    assert result["failed"] == (
        f"tester on wrong-key: apt rejects the test repository {fact['url']} (test_repository_url)"
        f" signed by {signed_repository['root'] / 'other.asc'}: {fact['reason']}"
    )


def test_trial_fetches_a_key_url_into_its_scratch_state(trials):
    assert trials["key-url"]["failed"] == "" and trials["key-url"]["fact"]["build"] == "2.0.1-1"
    failed = trials["key-url-404"]["failed"]
    assert " that signs the test repository " in failed and "is not usable from this host: HTTP 404" in failed


def test_trial_stops_on_a_missing_keyring_and_a_wrong_url(trials):
    assert trials["missing-keyring"]["failed"].startswith("tester on missing-keyring: test_repository_keyring ")
    assert "absent.gpg does not exist on the host" in trials["missing-keyring"]["failed"]
    assert trials["missing-keyring"]["fact"]["reason"].startswith("no file ")
    failed = trials["wrong-url"]["failed"]
    assert (
        "the test repository " in failed
        and "/no-such-repo (test_repository_url) is not usable from this host" in failed
    )
    assert "answered HTTP 404" in failed


def test_trial_asks_the_host_on_a_converged_host_and_for_the_hosts_own_source(trials):
    converged = trials["converged"]
    assert converged["failed"] == ""
    fact = converged["fact"]
    assert fact["converged"] is True and fact["tried"] is False and fact["found"] is True
    # The host's lists do not carry this URL: nothing offered, the installed version is the build.
    assert fact["offered"] == [] and fact["build"] == fact["installed"] == _installed("apt")
    own = trials["not-managed"]
    assert own["fact"]["tried"] is False and own["fact"]["converged"] is False
    assert own["failed"].startswith("tester on not-managed: test_version 0.0.1 is not in ")


def test_every_reason_is_said_when_not_ok(trials):
    for case, result in trials.items():
        fact = result["fact"]
        if case == "claimed-otherwise":
            continue  # stopped by its claim, before the trial (test_trial_refuses_...)
        assert fact["ok"] is (fact["reason"] == ""), case
        assert (result["failed"] == "") is (fact["message"] == ""), case
        if result["failed"]:
            assert result["failed"] == fact["message"] and result["failed"].startswith(f"tester on {case}: "), case


def test_trial_claims_the_repository_and_refuses_another_roles_different_claim(trials, signed_repository):
    """Each trial of a written source claims its repository for the run (apt_source_trial.claims); a claim of another
    role on the same repository (https and http of one path are one repository to apt) that gives it otherwise stops the
    host before the trial reads anything, naming both roles' settings; a claim alike is no problem."""
    url, root = signed_repository["url"], signed_repository["root"]
    own = trials["ok"]["claims"]
    assert [(c["name"], c["caller"], c["url"], c["keyring"]) for c in own] == [
        ("gpufleet-unit-test", "tester", f"{url}/repo", str(root / "key.asc"))
    ]
    alike = trials["claimed-alike"]
    assert alike["failed"] == "" and alike["fact"]["ok"] is True
    assert sorted(c["name"] for c in alike["claims"]) == ["gpufleet-unit-test", "other-test"]
    refused = trials["claimed-otherwise"]
    assert "ok" not in refused["fact"] and "answers" not in refused["fact"]  # the trial did not run
    assert refused["claims"] == []  # and its result claims nothing: the host stops
    https = url.replace("http:", "https:")
    assert refused["failed"] == (
        f"tester on claimed-otherwise: the test repository {url}/repo is the repository of other too (the other "
        f"repository, at {https}/repo): apt reads one source per repository "
        f"({filters.apt_source_files(url + '/repo')['sources_file']}, written for both), and the two roles give it "
        f"differently: URL {url}/repo (test_repository_url) for tester, {https}/repo (other_repository_url) for other; "
        f"Signed-By {root / 'key.asc'} (test_repository_keyring) for tester, /usr/share/keyrings/other.gpg "
        "(other_repository_keyring) for other. Give both roles the same URL, Signed-By for this repository, or give "
        "each its own repository URL. Nothing has been changed."
    )


# --------------------------------------------------------------------------- one source per repository URL
#
# apt keeps one Release index per repository and refuses two entries of one
# repository that disagree on an option; a target configured twice it reads
# twice, with a warning. Published in apt's source (Debian/apt, tag 2.4.0,
# the apt of Ubuntu 22.04, commit 409ee5821500f140896715a516ec8ffa008de789):
# apt-pkg/deb/debmetaindex.cc line 354, "Target %s (%s) is configured multiple
# times in %s and %s" (a warning); line 805, "Conflicting values set for option
# %s regarding source %s %s: %s != %s" for Signed-By (an error); lines
# 1171-1208, GetDebReleaseIndexBy: two entries are one repository when
# URItoFileName of their Release URIs is equal; apt-pkg/contrib/strutl.cc
# lines 548-565, URItoFileName drops the scheme, the user and the password.
# The same messages as users meet them: github.com/debops/debops/issues/2381
# (W: Target Packages (main/binary-amd64/Packages) is configured multiple
# times ...), github.com/microsoft/linux-package-repositories/issues/69 and
# github.com/gantsign/ansible-role-visual-studio-code/issues/263 (E:
# Conflicting values set for option Signed-By regarding source ...: ... != ...,
# then E: The list of sources could not be read.). File names in
# sources.list.d: doc/sources.list.5.xml lines 52-56 of the same tag ("may only
# contain letters (a-z and A-Z), digits (0-9), underscore (_), hyphen (-) and
# period (.) characters", else apt ignores the file with a notice).

filters = load_script(REPO_ROOT / "plugins" / "filter" / "gpufleet_filters.py")
NVIDIA_UBUNTU2204 = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64"
UBUNTU2204_SOURCE_FILE = (
    "/etc/apt/sources.list.d/gpufleet-developer.download.nvidia.com_compute_cuda_repos_ubuntu2204_x86-5f64.sources"
)
SITE_KEYRING = "/usr/share/keyrings/site-cuda-archive-keyring.gpg"
MIRROR = {"url": "https://mirror.example.com/cuda/ubuntu2204/x86_64", "key": "https://mirror.example.com/site.asc"}


def _apt_update(tmp_path: Path, files: dict[str, str]) -> tuple[int, str, list[str]]:
    """A real ``apt-get update`` of these sources.list.d files ({name: text}) alone, in a scratch apt state (nothing of
    this machine's apt is read or written): (exit status, stdout and stderr, the apt options)."""
    host_tool("apt-get")
    for part in ("parts", "empty", "lists/partial", "cache/archives/partial"):
        (tmp_path / part).mkdir(parents=True)
    for name, text in files.items():
        (tmp_path / "parts" / name).write_text(text)
    options = [
        "-oDir::Etc::SourceList=/dev/null",
        f"-oDir::Etc::SourceParts={tmp_path / 'parts'}",
        f"-oDir::State::Lists={tmp_path / 'lists'}",
        f"-oDir::Cache={tmp_path / 'cache'}",
        "-oDir::State::status=/dev/null",
        "-oDir::Etc::Preferences=/dev/null",
        f"-oDir::Etc::PreferencesParts={tmp_path / 'empty'}",
        "-oDebug::NoLocking=1",
        "-oAPT::Sandbox::User=root",
    ]
    run = subprocess.run(["apt-get", *options, "update"], capture_output=True, text=True, check=False)
    return run.returncode, run.stdout + run.stderr, options


def _served(text: str, repository: dict[str, Any], keyring: str | None = None) -> str:
    """A rendered source of NVIDIA's ubuntu2204 repository pointed at the signed repository on 127.0.0.1 (and, given
    ``keyring``, Signed-By it); nothing else of the text changes."""
    served = text.replace(f"URIs: {NVIDIA_UBUNTU2204}/\n", f"URIs: {repository['url']}/repo/\n")
    assert served != text, text
    return re.sub(r"(?m)^Signed-By: .*$", f"Signed-By: {keyring}", served) if keyring else served


def test_the_ubuntu_defaults_of_driver_and_cuda_are_one_source_for_a_real_apt(driver, signed_repository, tmp_path):
    """Ubuntu 22.04's defaults: nvidia_driver (source nvidia) and cuda both install from NVIDIA's CUDA repository
    ubuntu2204/x86_64, each through apt_source. Rendered the way the roles render them (their includes of apt_source,
    on fake hosts), pointed at the signed repository on 127.0.0.1 and read by a real apt-get update.

    The regression this guards (issue 27, item 5): one file per role, the names before this release, for one
    repository makes apt warn on every run that each target is configured twice. Now both roles name one file, with
    the same bytes, and apt reads the repository once, without a warning."""
    drv, cud = driver("ubuntu2204", "nvidia"), cuda_config("ubuntu2204")
    assert drv.failure is None and cud.failure is None
    assert [cfg["main_inputs"]["apt_source_repository"]["url"] for cfg in (drv, cud)] == [NVIDIA_UBUNTU2204] * 2
    assert drv["main_sources_file"] == cud["main_sources_file"] == UBUNTU2204_SOURCE_FILE
    assert drv["main_source"] == cud["main_source"]
    keyring = str(signed_repository["root"] / "key.asc")

    # Before: one file per role.
    before = {
        "gpufleet-nvidia-driver.sources": _served(drv["main_source"], signed_repository, keyring),
        "gpufleet-cuda.sources": _served(cud["main_source"], signed_repository, keyring),
    }
    rc, out, _options = _apt_update(tmp_path / "before", before)
    assert rc == 0, out
    assert re.search(
        r"(?m)^W: Target Packages \(Packages\) is configured multiple times in \S+/gpufleet-cuda\.sources:1"
        r" and \S+/gpufleet-nvidia-driver\.sources:1$",
        out,
    ), out

    # Now: the repository's one file.
    rc, out, options = _apt_update(
        tmp_path / "now", {Path(UBUNTU2204_SOURCE_FILE).name: _served(drv["main_source"], signed_repository, keyring)}
    )
    assert rc == 0, out
    assert re.findall(r"(?m)^[WEN]: .*$", out) == [], out
    offered = subprocess.run(
        ["apt-cache", *options, "madison", "gpufleet-test-tool"], capture_output=True, text=True, check=True
    )
    assert sorted(line.split("|")[1].strip() for line in offered.stdout.splitlines()) == ["2.0.1-1", "2.1.0-1"]


def test_two_signed_by_for_one_repository_break_apt_and_are_refused_in_play_1(driver, signed_repository, tmp_path):
    """The driver keeps cuda-keyring's keyring, cuda is given a site keyring (cuda_repository_keyring): one file per
    role made every apt run fail (apt's error, read here from a real apt-get update); one file per repository cannot
    hold both, and the trial's claims stop the host in play 1 instead, naming both roles' settings and the fix."""
    drv, cud = driver("ubuntu2204", "nvidia"), cuda_config("ubuntu2204", cuda_repository_keyring=SITE_KEYRING)
    before = {
        "gpufleet-nvidia-driver.sources": _served(drv["main_source"], signed_repository),
        "gpufleet-cuda.sources": _served(cud["main_source"], signed_repository),
    }
    rc, out, _options = _apt_update(tmp_path, before)
    assert rc != 0
    # apt reads gpufleet-cuda.sources first (sources.list.d in name order).
    assert (
        f"E: Conflicting values set for option Signed-By regarding source {signed_repository['url']}/repo/ /: "
        f"{SITE_KEYRING} != /usr/share/keyrings/cuda-archive-keyring.gpg\n"
    ) in out, out
    assert "E: The list of sources could not be read." in out

    assert cud["main_sources_file"] == drv["main_sources_file"]
    message = filters.apt_source_conflict(role_run.trial_claim(cud), [role_run.trial_claim(drv)], "node1")
    assert message == (
        f"cuda on node1: NVIDIA's CUDA repository {NVIDIA_UBUNTU2204} is the repository of nvidia_driver too (the "
        f"driver repository): apt reads one source per repository ({UBUNTU2204_SOURCE_FILE}, written for both), and "
        f"the two roles give it differently: Signed-By {SITE_KEYRING} (cuda_repository_keyring, "
        "cuda_repository_key_url) for cuda, /usr/share/keyrings/cuda-archive-keyring.gpg "
        "(nvidia_driver_repository_keyring, nvidia_driver_repository_key_url) for nvidia_driver. Give both roles the "
        "same Signed-By for this repository, or give each its own repository URL. Nothing has been changed."
    )
    # The driver's trial runs first in play 1; had cuda's, the driver's would say the same from its side.
    assert filters.apt_source_conflict(role_run.trial_claim(drv), [role_run.trial_claim(cud)]).startswith(
        "nvidia_driver: the driver repository "
    )


def test_the_roles_defaults_and_a_shared_mirror_with_one_key_url_claim_alike(driver):
    """No refusal where the roles agree: Ubuntu's defaults; one mirror for both with one key URL (the key goes to the
    repository's keyring file, whichever role fetches it); the lab's two repositories (two URLs, two files)."""
    drv, cud = driver("ubuntu2204", "nvidia"), cuda_config("ubuntu2204")
    assert filters.apt_source_conflict(role_run.trial_claim(cud), [role_run.trial_claim(drv)]) == ""
    drv = driver(
        "ubuntu2204",
        "nvidia",
        nvidia_driver_repository_url=MIRROR["url"],
        nvidia_driver_repository_key_url=MIRROR["key"],
    )
    cud = cuda_config("ubuntu2204", cuda_repository_url=MIRROR["url"] + "/", cuda_repository_key_url=MIRROR["key"])
    keyring = "/etc/apt/keyrings/gpufleet-mirror.example.com_cuda_ubuntu2204_x86-5f64.asc"
    assert role_run.trial_claim(drv)["keyring"] == role_run.trial_claim(cud)["keyring"] == keyring
    assert drv["main_source"] == cud["main_source"] and f"\nSigned-By: {keyring}\n" in drv["main_source"]
    assert filters.apt_source_conflict(role_run.trial_claim(cud), [role_run.trial_claim(drv)]) == ""
    other_key = cuda_config(
        "ubuntu2204", cuda_repository_url=MIRROR["url"], cuda_repository_key_url="https://mirror.example.com/other.asc"
    )
    message = filters.apt_source_conflict(role_run.trial_claim(other_key), [role_run.trial_claim(drv)], "node1")
    assert (
        "the two roles give it differently: key URL https://mirror.example.com/other.asc (cuda_repository_key_url) "
        f"for cuda, {MIRROR['key']} (nvidia_driver_repository_key_url) for nvidia_driver. Give both roles the same key "
        "URL"
    ) in message
    lab_driver = driver("debian12", "debian_nonfree", nvidia_driver_repository_url="http://mirror.gpufleet.lab/debian")
    lab_cuda = cuda_config("debian12", cuda_repository_url="http://mirror.gpufleet.lab/site/cuda-12.1/debian12")
    assert lab_driver["main_sources_file"] != lab_cuda["main_sources_file"]
    assert filters.apt_source_conflict(role_run.trial_claim(lab_cuda), [role_run.trial_claim(lab_driver)]) == ""


@pytest.mark.parametrize(
    ("field", "value", "label", "setting"),
    [
        ("suites", ["jammy"], "Suites", "nvidia_driver_repository_suites"),
        ("components", ["main"], "Components", "nvidia_driver_repository_components"),
        ("architectures", ["arm64"], "Architectures", "not a setting"),
    ],
)
def test_every_part_of_the_one_source_must_be_alike(driver, field, value, label, setting):
    """Suites, components and architectures are the file's too: a difference in any is refused, naming its setting."""
    drv, cud = driver("ubuntu2204", "nvidia"), cuda_config("ubuntu2204")
    changed = {**role_run.trial_claim(drv), field: value}
    message = filters.apt_source_conflict(changed, [role_run.trial_claim(cud)])
    assert f"differently: {label} {' '.join(value)} ({setting}) for nvidia_driver, " in message, message
    assert f"Give both roles the same {label} for this repository" in message


# --- the file's name


def _decoded(name: str) -> str:
    """apt_source_files's name read back: _ is /, -- is -, -XX is a byte (the test's own reading of the rule)."""
    out, index = bytearray(), 0
    while index < len(name):
        char = name[index]
        if char == "_":
            out += b"/"
            index += 1
        elif char == "-" and name[index + 1] == "-":
            out += b"-"
            index += 2
        elif char == "-":
            out.append(int(name[index + 1 : index + 3], 16))
            index += 3
        else:
            out += char.encode()
            index += 1
    return out.decode("utf-8")


@pytest.mark.parametrize(
    ("url", "name"),
    [
        (NVIDIA_UBUNTU2204, "developer.download.nvidia.com_compute_cuda_repos_ubuntu2204_x86-5f64"),
        (
            "https://nvidia.github.io/libnvidia-container/stable/deb/amd64/",
            "nvidia.github.io_libnvidia--container_stable_deb_amd64",
        ),
        ("http://mirror.gpufleet.lab/site/cuda-12.1/debian12", "mirror.gpufleet.lab_site_cuda--12.1_debian12"),
        # apt's identity of a repository: no scheme, no credentials (never in a file name), no trailing slash.
        ("http://user:secret@10.0.0.5:8080/debian//", "10.0.0.5-3a8080_debian"),
        ("file:///srv/site-repo", "_srv_site--repo"),
    ],
)
def test_the_file_is_named_after_the_repository(url, name):
    repository = filters.apt_source_files(url)
    assert repository["name"] == name
    assert repository["sources_file"] == f"/etc/apt/sources.list.d/gpufleet-{name}.sources"
    assert repository["keyring_file"] == f"/etc/apt/keyrings/gpufleet-{name}.asc"
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", name)
    assert _decoded(name) == repository["key"]


def test_different_repositories_never_share_a_name():
    """The name is the key written one to one (read back, it is the key again), so two keys never meet in one name:
    keys that swap / and _ or - and /, and arbitrary ones."""
    import random

    keys = [
        "a.example/b_c",
        "a.example/b/c",
        "a.example_b/c",
        "a.example/b-c",
        "a.example/b--c",
        "a.example/b-2dc",
        "a.example/b%2dc",
        "a.example/x86_64",
        "a.example/x86-5f64",
        "a.example:81/r",
        "a.example/81/r",
    ]
    generator = random.Random(27)
    keys += [
        "".join(generator.choice("ab/_-.:%~9é") for _char in range(generator.randint(1, 12))) for _key in range(3000)
    ]
    names = {}
    for key in set(keys):
        name = apt_source._apt_file_name(key)
        assert _decoded(name) == key
        assert names.setdefault(name, key) == key, (key, names[name])


def test_apt_reads_a_file_of_that_name_and_http_and_https_of_one_path_are_one_repository(tmp_path):
    """A real apt reads the names this rule makes (no "ignored" notice); and it takes https and http of one path for one
    repository, refusing them with two Signed-By: hence the scheme is no part of the name."""
    name = filters.apt_source_files("http://127.0.0.1:9/repo-x_y")["sources_file"].rpartition("/")[2]
    entry = "Types: deb\nURIs: {}://127.0.0.1:9/repo-x_y/\nSuites: /\nSigned-By: {}\n"
    options = [
        "-oDir::Etc::SourceList=/dev/null",
        f"-oDir::Etc::SourceParts={tmp_path}",
        f"-oDir::State::Lists={tmp_path}",
    ]
    (tmp_path / name).write_text(entry.format("http", "/a.gpg"))
    targets = subprocess.run(
        [host_tool("apt-get"), *options, "indextargets", "--no-release-info", "--format", "$(URI)"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert targets.returncode == 0 and targets.stderr == "", targets.stderr
    assert "http://127.0.0.1:9/repo-x_y/Packages" in targets.stdout.splitlines()
    (tmp_path / "other.sources").write_text(entry.format("https", "/b.gpg"))
    policy = subprocess.run(["apt-cache", *options, "policy"], capture_output=True, text=True, check=False)
    assert (
        "E: Conflicting values set for option Signed-By regarding source http://127.0.0.1:9/repo-x_y/ /:"
        " /a.gpg != /b.gpg"
    ) in policy.stderr
    https, http = (filters.apt_source_files(f"{scheme}://127.0.0.1:9/repo-x_y") for scheme in ("https", "http"))
    assert https["name"] == http["name"]


@pytest.mark.parametrize("url", ["", "not a url", "https://", "https:///"])
def test_no_repository_no_name(url):
    with pytest.raises(AnsibleFilterError, match="apt_source_files: "):
        filters.apt_source_files(url)


def test_a_url_too_long_for_a_file_name_is_refused():
    with pytest.raises(
        AnsibleFilterError, match=r"too long to name its apt source file \(239 characters, at most 238\)"
    ):
        filters.apt_source_files("https://" + "a" * 239)


# --- moving a host to the new names, and a URL to a mirror


# The script plan.yml runs (and the module apt_trial, with the same argument): sh -c <script> sh <records directory>.
PLAN_PROBE = (role_run.ROLES_DIR / "apt_source" / "files" / "apt-source-files.sh").read_text()
assert role_run.role_task("apt_source", "plan.yml", "Read gpufleet's apt source files")["ansible.builtin.command"][
    "argv"
] == [
    "/bin/sh",
    "-c",
    "{{ lookup('ansible.builtin.file', 'apt-source-files.sh') }}",
    "sh",
    "{{ __apt_source_records_dir }}",
]


class Host:
    """A host's apt source files and apt_source's records, in a scratch directory: plan.yml's probe runs there for real
    (its paths moved into the directory), apt_source_plan reads it, and the plan is applied as main applies it."""

    def __init__(self, root: Path) -> None:
        self.root, self.sources, self.records = root, root / "sources.list.d", root / "records"
        self.sources.mkdir(parents=True)
        self.records.mkdir()

    def probe(self) -> str:
        command = PLAN_PROBE.replace("/etc/apt/sources.list.d", str(self.sources))
        run = ["/bin/sh", "-c", command, "sh", str(self.records)]
        out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
        return out.replace(str(self.sources), "/etc/apt/sources.list.d")

    def files(self) -> dict[str, str]:
        return {path.name: path.read_text() for path in sorted(self.sources.iterdir())}

    def converge(self, name: str, url: str, text: str) -> list[str]:
        """Entry point main's steps on the files for source user ``name``: remove what the plan says, write the
        repository's file, record it. The removed file names."""
        plan = filters.apt_source_plan(self.probe(), name, url)
        for path in plan["remove"]:
            (self.sources / Path(path).name).unlink()
        (self.sources / Path(plan["sources_file"]).name).write_text(text)
        (self.records / name).write_text(plan["sources_file"] + "\n")
        return [Path(path).name for path in plan["remove"]]


def test_a_host_of_the_old_names_moves_to_the_one_source_and_apt_never_sees_both(driver, signed_repository, tmp_path):
    """A host converged by the release before: gpufleet-nvidia-driver.sources and gpufleet-cuda.sources for NVIDIA's
    ubuntu2204 repository (and the Container Toolkit's own file). The driver's main, which runs first, removes both
    before it writes the repository's file, so its index refresh reads the repository once (a real apt-get update of
    the files as they are then); cuda's main then changes nothing; the toolkit's own file moves to its repository's
    name; a second run removes nothing."""
    drv, cud = driver("ubuntu2204", "nvidia"), cuda_config("ubuntu2204")
    keyring = str(signed_repository["root"] / "key.asc")
    text = _served(drv["main_source"], signed_repository, keyring)
    local = f"{signed_repository['url']}/repo"
    toolkit = "https://nvidia.github.io/libnvidia-container/stable/deb/amd64"
    host = Host(tmp_path / "host")
    (host.sources / "gpufleet-nvidia-driver.sources").write_text(text)
    (host.sources / "gpufleet-cuda.sources").write_text(_served(cud["main_source"], signed_repository, keyring))
    (host.sources / "gpufleet-nvidia-container-toolkit.sources").write_text(
        f"Types: deb\nURIs: {toolkit}/\nSuites: /\n"
    )

    assert host.converge("nvidia-driver", local, text) == ["gpufleet-cuda.sources", "gpufleet-nvidia-driver.sources"]
    new = filters.apt_source_files(local)["sources_file"].rpartition("/")[2]
    assert sorted(host.files()) == sorted([new, "gpufleet-nvidia-container-toolkit.sources"])
    rc, out, _options = _apt_update(tmp_path / "apt", {new: host.files()[new]})
    assert rc == 0 and re.findall(r"(?m)^[WEN]: .*$", out) == [], out

    assert host.converge("cuda", local, _served(cud["main_source"], signed_repository, keyring)) == []
    assert host.files()[new] == text
    assert host.converge("nvidia-container-toolkit", toolkit, "Types: deb\n") == [
        "gpufleet-nvidia-container-toolkit.sources"
    ]
    assert sorted(host.files()) == sorted([new, filters.apt_source_files(toolkit)["sources_file"].rpartition("/")[2]])
    for name, url in (("nvidia-driver", local), ("cuda", local), ("nvidia-container-toolkit", toolkit)):
        assert filters.apt_source_plan(host.probe(), name, url)["remove"] == [], name


def test_a_url_moved_to_a_mirror_leaves_no_source_behind_unless_another_role_still_uses_it(tmp_path):
    """Both roles on NVIDIA's repository; cuda moves to a mirror: the shared file stays (the driver's record names it);
    then the driver moves too: the old file goes. The lab's two repositories: neither role touches the other's file."""
    host = Host(tmp_path / "host")
    public, mirror = NVIDIA_UBUNTU2204, MIRROR["url"]
    for name in ("nvidia-driver", "cuda"):
        host.converge(name, public, f"URIs: {public}/\n")
    shared = Path(filters.apt_source_files(public)["sources_file"]).name
    assert host.converge("cuda", mirror, f"URIs: {mirror}/\n") == []
    assert shared in host.files()
    assert host.converge("nvidia-driver", mirror, f"URIs: {mirror}/\n") == [shared]
    assert list(host.files()) == [Path(filters.apt_source_files(mirror)["sources_file"]).name]

    lab = Host(tmp_path / "lab")
    (lab.sources / "gpufleet-nvidia-driver.sources").write_text("URIs: http://mirror.gpufleet.lab/debian\n")
    (lab.sources / "gpufleet-cuda.sources").write_text("URIs: http://mirror.gpufleet.lab/site/cuda-12.1/debian12/\n")
    assert lab.converge("cuda", "http://mirror.gpufleet.lab/site/cuda-12.1/debian12", "x") == ["gpufleet-cuda.sources"]
    assert "gpufleet-nvidia-driver.sources" in lab.files()
    assert lab.converge("nvidia-driver", "http://mirror.gpufleet.lab/debian", "x") == ["gpufleet-nvidia-driver.sources"]


def test_main_removes_the_plan_before_it_writes_and_records_what_it_wrote():
    """Entry point main's order: the plan (plan.yml), the removal of the caller's replaced files and the plan's, the
    one source, its record; the index refresh comes after all of them."""
    names = [task["name"] for task in role_run.tasks_of(load_trusted(ROLE / "tasks" / "main.yml"))]
    order = [
        "Plan the files the source replaces",
        "Remove the files the source replaces",
        "Write the source",
        "Record the source file of this source user",
        "Refresh the package index",
    ]
    assert [name for name in names if name in order] == order
    remove = role_run.role_task("apt_source", "main.yml", "Remove the files the source replaces")
    assert (
        remove["loop"] == "{{ apt_source_replaces + (__apt_source_plan.remove if apt_source_managed | bool else []) }}"
    )
    record = role_run.role_task("apt_source", "main.yml", "Record the source file of this source user")[
        "ansible.builtin.copy"
    ]
    assert (record["content"], record["dest"]) == (
        "{{ __apt_source_sources_file }}\n",
        "{{ __apt_source_records_dir }}/{{ apt_source_name }}",
    )
    assert load_trusted(ROLE / "vars" / "main.yml")["__apt_source_records_dir"] == "/var/lib/gpufleet/apt-sources"
    assert (
        apt_source.APT_SOURCES_DIR == "/etc/apt/sources.list.d"
        and f"{apt_source.APT_SOURCES_DIR}/gpufleet-*.sources" in PLAN_PROBE
    )


for _settings in (
    {},
    {"cuda_repository_keyring": SITE_KEYRING},
    {"cuda_repository_url": MIRROR["url"] + "/", "cuda_repository_key_url": MIRROR["key"]},
    {"cuda_repository_url": MIRROR["url"], "cuda_repository_key_url": "https://mirror.example.com/other.asc"},
):
    CUDA.declare("ubuntu2204", **_settings)
CUDA.declare("debian12", cuda_repository_url="http://mirror.gpufleet.lab/site/cuda-12.1/debian12")
declare_driver("ubuntu2204", "nvidia")
declare_driver(
    "ubuntu2204", "nvidia", nvidia_driver_repository_url=MIRROR["url"], nvidia_driver_repository_key_url=MIRROR["key"]
)
declare_driver("debian12", "debian_nonfree", nvidia_driver_repository_url="http://mirror.gpufleet.lab/debian")
