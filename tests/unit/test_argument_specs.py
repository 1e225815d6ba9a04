"""tools/check_argument_specs.py: the roles' argument specs match their defaults, and the checker catches drift."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def _write_role(roles_dir: Path, name: str, defaults: str, argument_specs: str) -> None:
    role = roles_dir / name
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text(textwrap.dedent(defaults))
    (role / "meta" / "argument_specs.yml").write_text(textwrap.dedent(argument_specs))


def test_repository_roles_are_in_sync(checker, capsys):
    """Every role under roles/ documents every default, with the same value, a type and a description."""
    assert checker.main([]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    role_count = len([p for p in (REPO_ROOT / "roles").iterdir() if p.is_dir()])
    assert out.strip() == f"argument specs: {role_count} roles in sync"


def test_every_role_has_a_main_argument_spec(checker):
    """Each role ships meta/argument_specs.yml with a 'main' entry point, so ansible validates its inputs."""
    for role in sorted(p for p in (REPO_ROOT / "roles").iterdir() if p.is_dir()):
        spec, where = checker.load_argument_spec(role)
        assert spec is not None, f"{role.name}: {where}"
        assert where == "meta/argument_specs.yml"


def test_checker_reports_every_kind_of_drift(checker, tmp_path, capsys):
    """A fake role with one of each mistake fails with one message per mistake, naming the variable."""
    _write_role(
        tmp_path,
        "fake",
        defaults="""\
            ---
            fake_port: 8080
            fake_enabled: true
            fake_name: "{{ inventory_hostname }}"
            fake_undocumented: x
            """,
        argument_specs="""\
            ---
            argument_specs:
              main:
                short_description: Fake.
                options:
                  fake_port:
                    type: int
                    description: A port, documented as a string by mistake.
                    default: "8080"
                  fake_enabled:
                    type: bool
                    description: 1 is not true.
                    default: 1
                  fake_name:
                    type: str
                    description: Jinja default copied with different spacing.
                    default: "{{inventory_hostname}}"
                  fake_gone:
                    type: str
                    description: Removed from defaults but still documented.
                    default: y
                  fake_untyped:
                    description: No type.
                  fake_undescribed:
                    type: str
            """,
    )
    assert checker.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "argument specs: 7 problem(s)" in err
    for expected in (
        "fake_undocumented is in defaults/main.yml but has no option",
        "option fake_port defaults to '8080' (str)",
        "but to 8080 (int) in defaults/main.yml",
        "option fake_enabled defaults to 1 (int)",
        "option fake_name defaults to '{{inventory_hostname}}'",
        "option fake_gone has a default but is not in defaults/main.yml",
        "option fake_untyped has no type",
        "option fake_undescribed has no description",
    ):
        assert expected in err


def test_checker_accepts_a_role_in_sync(checker, tmp_path, capsys):
    """Lists, dicts and Jinja strings that match exactly are accepted."""
    _write_role(
        tmp_path,
        "good",
        defaults="""\
            ---
            good_os: [{distribution: Ubuntu, version: "22.04"}]
            good_kernel: "{{ ansible_facts['kernel'] }}"
            """,
        argument_specs="""\
            ---
            argument_specs:
              main:
                options:
                  good_os:
                    type: list
                    elements: dict
                    description: OS list.
                    default:
                      - distribution: Ubuntu
                        version: "22.04"
                  good_kernel:
                    type: str
                    description: Kernel.
                    default: "{{ ansible_facts['kernel'] }}"
                  good_required:
                    type: str
                    required: true
                    description: An option without a default need not be in defaults.
            """,
    )
    assert checker.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "argument specs: 1 roles in sync"


def test_checker_reports_a_role_without_argument_spec(checker, tmp_path, capsys):
    """A role with defaults but no meta/argument_specs.yml is a problem, not silently skipped."""
    (tmp_path / "bare" / "defaults").mkdir(parents=True)
    (tmp_path / "bare" / "defaults" / "main.yml").write_text("---\nbare_x: 1\n")
    assert checker.main([str(tmp_path)]) == 1
    assert (
        "roles/bare: has no meta/argument_specs.yml but defaults/main.yml sets 1 variable(s)" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (1, 1, True),
        (1, "1", False),
        (True, 1, False),
        (0, False, False),
        (1, 1.0, False),
        ([1, {"a": "x"}], [1, {"a": "x"}], True),
        ({"a": 1}, {"a": True}, False),
        ([], [], True),
        ("", None, False),
    ],
)
def test_same_value_is_type_strict(checker, a, b, same):
    """Defaults compare as YAML values with their types: YAML 20 and "20" are different defaults."""
    assert checker.same_value(a, b) is same


def test_driver_source_choices_are_the_package_layouts():
    """nvidia_driver_source's choices are "" plus exactly the sources roles/nvidia_driver/vars/<OS>.yml define."""
    spec = yaml.safe_load((REPO_ROOT / "roles" / "nvidia_driver" / "meta" / "argument_specs.yml").read_text())
    choices = spec["argument_specs"]["main"]["options"]["nvidia_driver_source"]["choices"]
    layouts = set()
    for path in (REPO_ROOT / "roles" / "nvidia_driver" / "vars").glob("*.yml"):
        layouts |= set((yaml.safe_load(path.read_text()) or {}).get("__nvidia_driver_sources", {}))
    assert sorted(choices) == sorted({""} | layouts)


def test_play_1_skips_only_the_probe_specs_the_judgement_applied_already():
    """playbooks/check.yml imports or includes each role's entry point probe with rolespec_validate: false, because
    the run-once judgement (gpufleet.fleet.settings) applied that role's main spec to every host just before: that
    holds only while each probe entry point takes exactly main's options, each with main's spec (a probe option main
    lacked, or typed otherwise, would go unchecked)."""
    check = yaml.safe_load((REPO_ROOT / "playbooks" / "check.yml").read_text())
    probes = [
        task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role")
        for play in check
        for task in play.get("tasks", [])
        if (task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role") or {}).get("tasks_from")
        == "probe"
    ]
    assert len(probes) == 4 and all(probe["rolespec_validate"] is False for probe in probes)
    specs = {
        role.name: yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        for role in sorted((REPO_ROOT / "roles").iterdir())
        if (role / "meta" / "argument_specs.yml").exists()
    }
    probing = [role for role, entry_points in specs.items() if "probe" in entry_points]
    assert {"nvidia_driver", "cuda", "pytorch", "container", "slurm"} <= set(probing)
    for role in probing:
        assert specs[role]["probe"].get("options") == specs[role]["main"].get("options"), role
