"""The lookup gpufleet.fleet.role_template (plugins/lookup/role_template.py): apt_source's trial renders the source
and the pins it compares with the host's files through it (issue 30: ansible.builtin.template's lookup deep-copies
every variable of the task, per host and term). Its text must be the template action's, which entry point main
writes the files with, and the builtin lookup's, for the role's own templates and inputs of every shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, ansible_playbook

ROLE = REPO_ROOT / "roles" / "apt_source"
REPOSITORY = {
    "caller": "cuda",
    "name": "cuda",
    "description": "NVIDIA's CUDA repository",
    "url": "http://gpufleet-mirror/cuda/repos/ubuntu2204/x86_64///",
    "suites": ["/"],
    "keyring": "/usr/share/keyrings/cuda-archive-keyring.gpg",
}
PINS = [
    {"name": "cuda", "packages": ["cuda-toolkit-12-1"], "version": "12.1.1-1"},
    {
        "name": "nvidia-driver",
        "packages": ["nvidia-driver-535-server", "libnvidia-compute-535-server"],
        "version": "535.261.03",
        "build": "535.261.03-0ubuntu0.22.04.1",
        "competitors": ["origin developer.download.nvidia.com", "release o=Ubuntu"],
    },
]


def render(tmp_path: Path, template: str, cases: list[dict], extra_vars: dict | None = None) -> list[dict]:
    """Each case (variables over the role's vars) rendered three ways: the template action (main's writer), the
    builtin lookup and role_template; [{action, builtin, ours}]."""
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    src = str(ROLE / "templates" / template)
    tasks = []
    for index, case in enumerate(cases):
        case_vars = {**role_vars, **case}
        tasks += [
            {"ansible.builtin.template": {"src": src, "dest": f"{tmp_path}/action-{index}"}, "vars": case_vars},
            {
                "ansible.builtin.copy": {
                    "content": "{{ {'builtin': lookup('ansible.builtin.template', %r), "
                    "'ours': lookup('gpufleet.fleet.role_template', %r)} | to_json }}" % (src, src),
                    "dest": f"{tmp_path}/lookups-{index}",
                },
                "vars": case_vars,
            },
        ]
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": extra_vars or {},
        "tasks": tasks,
    }
    run = ansible_playbook(tmp_path, [play], "-e", "ansible_python_interpreter={{ ansible_playbook_python }}")
    assert run.returncode == 0, run.stdout + run.stderr
    out = []
    for index in range(len(cases)):
        lookups = yaml.safe_load((tmp_path / f"lookups-{index}").read_text())
        out.append({"action": (tmp_path / f"action-{index}").read_text(), **lookups})
    return out


def test_the_source_is_the_text_main_writes(tmp_path):
    cases = [
        {"apt_source_repository": REPOSITORY},
        {
            "apt_source_repository": {
                **REPOSITORY,
                "url": "http://gpufleet-mirror/ubuntu",
                "suites": ["jammy-updates", "jammy-security"],
                "components": ["main", "restricted"],
                "architectures": ["amd64", "arm64"],
            }
        },
    ]
    for case in render(tmp_path, "source.sources.j2", cases):
        assert case["ours"] == case["builtin"]
        # The action writes the text as the lookups give it, with a final newline of its own.
        assert case["action"].rstrip("\n") == case["ours"].rstrip("\n")
        assert case["ours"].startswith("# Ansible managed\n")
    assert "Suites: /" in case["ours"] or "Suites: jammy-updates jammy-security" in case["ours"]


@pytest.mark.parametrize("pin", PINS, ids=lambda pin: pin["name"])
def test_a_pin_is_the_text_main_writes(tmp_path, pin):
    (case,) = render(tmp_path, "pin.pref.j2", [{"apt_source_repository": REPOSITORY, "__apt_source_pin": pin}])
    assert case["ours"] == case["builtin"]
    assert case["action"].rstrip("\n") == case["ours"].rstrip("\n")
    assert f"Pin: version {pin.get('build', pin['version'])}" in case["ours"]


def test_an_ansible_managed_the_inventory_sets_is_kept(tmp_path):
    (case,) = render(
        tmp_path, "source.sources.j2", [{"apt_source_repository": REPOSITORY}], {"ansible_managed": "Site managed"}
    )
    assert case["ours"] == case["builtin"] and case["ours"].startswith("# Site managed\n")
    assert case["action"].startswith("# Site managed\n")


def test_a_missing_template_is_named(tmp_path):
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{"ansible.builtin.debug": {"msg": "{{ lookup('gpufleet.fleet.role_template', 'absent.j2') }}"}}],
    }
    run = ansible_playbook(tmp_path, [play])
    assert run.returncode != 0 and "the role has no template absent.j2" in run.stdout
