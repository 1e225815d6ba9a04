"""Play 1's judgement of every host's settings, once on the controller (playbooks/check.yml's own two tasks: the
action gpufleet.fleet.settings with hosts, run_once, then each host's stop), run for real on fake hosts.

The roles' rules are tested one by one in test_rules_<role>.py and through each role's tasks/validate.yml; this
module checks what only the whole-play judgement does: each host judged with its own settings over the roles'
defaults and vars (as the role would see them), the part switches choosing the roles, a rejection shared by
several hosts said once naming them, and only the wrong hosts stopped.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from pathlib import Path

import role_run
import yaml
from conftest import FAKE_FACTS, REPO_ROOT, ansible_playbook

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import INSTALL_PLAY

PLAY_1 = next(
    play
    for play in yaml.safe_load((REPO_ROOT / "playbooks" / "check.yml").read_text())
    if play["name"] == "Check hosts and settings (read-only)"
)
TASKS = [
    copy.deepcopy(task)
    for task in PLAY_1["tasks"]
    if task["name"]
    in (
        "Judge the settings of every host (once, on the controller)",
        "Stop a host whose settings are wrong (nothing has been changed)",
    )
]


def judged(before=(), after=(), **hosts):
    """{host: Outcome} of the two tasks on fake Ubuntu 22.04 hosts with these settings (host vars); ``before``:
    tasks run first (what earlier tasks of the play set), ``after``: capture tasks."""
    fake = [
        role_run.Host(name, FAKE_FACTS["ubuntu2204"], settings, groups=("gpu_nodes",))
        for name, settings in hosts.items()
    ]
    return role_run.run(fake, [*before, *copy.deepcopy(TASKS)], after=list(after))


def test_play_1_has_the_two_tasks():
    assert len(TASKS) == 2 and TASKS[0].get("run_once") is True, TASKS


def test_good_hosts_pass_and_only_the_wrong_ones_stop():
    outcome = judged(
        **{
            "node-1": {},
            "node-2": {},
            "node-3": {"smoke_training_steps": 2},
            "node-4": {"pytorch_require_gpu": "perhaps"},
        }
    )
    assert outcome["node-1"].failure is None and outcome["node-2"].failure is None
    assert outcome["node-3"].failure == (
        "smoke_training settings rejected on node-3: [1] smoke_training_steps '2' is too few: the loss trend needs 4"
        " steps or more; nothing has been changed"
    )
    assert outcome["node-4"].failure.startswith(
        "pytorch settings rejected on node-4 (argument spec): argument 'pytorch_require_gpu' is of type str and we"
        " were unable to convert to bool"
    )


def test_a_rejection_several_hosts_share_is_said_once_naming_them():
    wrong = {"gpu_verify_timeout": 0}
    outcome = judged(**{"node-1": wrong, "node-2": {}, "node-3": wrong, "node-4": wrong})
    reason = "gpu_verify_timeout '0' is not a number of seconds (above 0)"
    said = [outcome[host].failure for host in ("node-1", "node-3", "node-4")]
    assert sum(reason in message for message in said) == 1, said
    assert said[0].startswith("gpu_verify settings rejected on 3 hosts (node-1, node-3, node-4): [1] " + reason), said
    assert said[1] == (
        "gpu_verify settings rejected on node-3: the same settings as node-1, whose message gives the"
        " reasons; nothing has been changed"
    )
    assert outcome["node-2"].failure is None


def test_the_part_switches_choose_the_roles_judged():
    """pytorch's settings are judged only where PyTorch is on (gpufleet_pytorch, default true)."""
    wrong = {"pytorch_release": "1.0.0"}
    outcome = judged(**{"on": wrong, "off": {**wrong, "gpufleet_pytorch": False}})
    assert "pytorch_release '1.0.0' is not a PyTorch release gpufleet knows" in outcome["on"].failure
    assert outcome["off"].failure is None


def test_a_role_default_is_judged_as_the_role_sees_it():
    """A role's default that follows another setting (pytorch_cuda_release follows cuda_release) is templated over
    the host's variables: an unknown cuda_release reaches pytorch's rules through it, not as the default's text."""
    outcome = judged(**{"node-1": {"cuda_release": "11.0"}})
    failure = outcome["node-1"].failure
    assert "cuda settings rejected on node-1: [1] cuda_release '11.0' is not a CUDA release gpufleet knows" in failure
    assert "{{" not in failure, failure


def test_an_unknown_setting_stops_its_hosts_said_once_naming_them():
    typo = {"cuda_version": "12.4"}
    outcome = judged(**{"node-1": typo, "node-2": {}, "node-3": typo})
    assert outcome["node-1"].failure == (
        "inventory settings rejected on 2 hosts (node-1, node-3): [1] cuda_version is not a setting of role cuda"
        " (did you mean cuda_release?); nothing has been changed"
    )
    assert outcome["node-3"].failure.startswith("inventory settings rejected on node-3: the same settings as node-1")
    assert outcome["node-2"].failure is None


def test_an_unknown_setting_comes_before_the_roles_rejections_of_its_host():
    outcome = judged(**{"node-1": {"slurm_frobnicate": 1, "smoke_training_steps": 2}})
    failure = outcome["node-1"].failure
    assert failure.startswith(
        "inventory settings rejected on node-1: [1] slurm_frobnicate is not a setting of role slurm"
        " (docs/roles.md lists the settings of slurm) | smoke_training settings rejected on node-1"
    ), failure


def test_warn_only_warns_once_naming_the_hosts():
    warn = {"cuda_version": "12.4", "gpufleet_unknown_settings": "warn"}
    outcome = judged(
        after=[role_run.capture({"warnings": "{{ gpufleet_judgement.warnings }}"})], **{"node-1": warn, "node-2": warn}
    )
    assert outcome["node-1"].failure is None and outcome["node-2"].failure is None
    assert outcome["node-1"]["warnings"] == [
        "node-1, node-2: cuda_version is not a setting of role cuda (did you mean cuda_release?) (ignored)"
    ]


def test_what_a_task_of_the_run_set_is_not_a_setting():
    """preflight publishes preflight_report (set_fact) before the judgement: a fact, not an unknown setting."""
    publish = {"name": "Publish", "ansible.builtin.set_fact": {"preflight_report": {"passed": True}, "cuda_seen": 1}}
    outcome = judged(before=[publish], **{"node-1": {}})
    assert outcome["node-1"].failure is None


def test_what_play_1_resolves_for_each_probed_role_is_what_the_roles_own_judgement_resolves():
    """The entry points probe judge nothing themselves: their roles' vars read what play 1's judgement resolved for
    the host (gpufleet_judgement.resolved[host][role]). It must be what the role's own validate.yml resolves on that
    host (play 2 judges again), for hosts with different settings judged in one run."""
    roles = ("nvidia_driver", "cuda", "pytorch")
    outcome = judged(
        after=[
            *(role_run.import_role(role, "validate") for role in roles),
            role_run.capture(
                {
                    "play_1": "{{ gpufleet_judgement.resolved[inventory_hostname] }}",
                    "own": {role: "{{ __%s_judged.resolved }}" % role for role in roles},
                }
            ),
        ],
        **{
            "node-1": {},
            "node-2": {"nvidia_driver_branch": "580", "nvidia_driver_source": "nvidia", "gpufleet_pytorch": True},
            "node-3": {},
        },
    )
    for host in ("node-1", "node-2", "node-3"):
        assert outcome[host].failure is None, outcome[host].failure
        play_1, own = outcome[host]["play_1"], outcome[host]["own"]
        assert play_1["nvidia_driver"] and play_1["cuda"], host
        # A part that is off is not judged (nor probed: the lookup gpufleet.fleet.parts, probed).
        assert "container" not in play_1 and "slurm" not in play_1, host
        for role in roles:
            if role in play_1:
                assert play_1[role] == own[role], (host, role)
    assert (
        outcome["node-2"]["play_1"]["nvidia_driver"]["__nvidia_driver_version"]
        != (outcome["node-1"]["play_1"]["nvidia_driver"]["__nvidia_driver_version"])
    )


def test_the_probe_says_the_driver_warnings_once_and_play_2_says_nothing_again():
    """nvidia_driver's probe (play 1) says the branch's end of life once, naming the hosts, from play 1's judgement;
    validate.yml's pass of play 2 does not say it again."""
    outcome = judged(
        after=[
            role_run.import_role("nvidia_driver", "warnings"),
            role_run.capture(
                {
                    "probe_said": "{{ __nvidia_driver_warnings_collected is not skipped }}",
                    "said": "{{ __nvidia_driver_eol_warnings }}",
                }
            ),
            role_run.import_role("nvidia_driver", "validate"),
            role_run.capture(
                {"again": "{{ __nvidia_driver_warnings_collected is not skipped }}"}, name="Capture again"
            ),
        ],
        **{"node-1": {}, "node-2": {}, "node-3": {"nvidia_driver_branch": "580", "nvidia_driver_source": "nvidia"}},
    )
    first = outcome["node-1"]
    assert first["probe_said"] is True and first["again"] is False
    assert len(first["said"]) == 1 and first["said"][0].startswith("WARNING node-1, node-2: NVIDIA driver branch 535")


def test_the_install_play_the_judgement_emulates_is_provision_yml_s():
    """settings.INSTALL_PLAY names the roles provision.yml's install play imports together (their defaults seen by
    one another's tasks), in its order."""
    play = next(
        play
        for play in yaml.safe_load((REPO_ROOT / "playbooks" / "provision.yml").read_text())
        if play.get("name") == "Install the driver, the CUDA stack and PyTorch"
    )
    imported = [
        task["ansible.builtin.import_role"]["name"].rsplit(".", 1)[-1]
        for block in play["tasks"]
        for task in block.get("block", [block])
        if "ansible.builtin.import_role" in task
    ]
    assert tuple(imported) == INSTALL_PLAY


def test_the_container_probe_reads_play_1_s_judgement_as_validate_would_resolve_it():
    """With gpufleet_container on, the container role's entry point probe judges nothing: its vars read play 1's
    judgement (here before the role's own validate.yml has run on the host), and resolve what validate.yml would."""
    outcome = judged(
        after=[
            role_run.import_role("container", "probe", skip_apt_source=True),
            role_run.capture(
                {
                    "probe_reads": "{{ __container_repo_url }}",
                    "play_1": "{{ gpufleet_judgement.resolved[inventory_hostname] }}",
                },
                name="Capture the probe's view",
            ),
            role_run.import_role("container", "validate"),
            role_run.capture({"own": "{{ __container_judged.resolved }}"}, name="Capture validate's"),
        ],
        **{
            "node-1": {"gpufleet_container": True},
            "node-2": {
                "gpufleet_container": True,
                "container_nvidia_toolkit_repository_url": "http://mirror.example.com/libnvidia-container/stable/deb",
            },
        },
    )
    for host in ("node-1", "node-2"):
        assert outcome[host].failure is None, outcome[host].failure
        assert outcome[host]["play_1"]["container"] == outcome[host]["own"], host
        assert outcome[host]["probe_reads"] == outcome[host]["own"]["__container_repo_url"] != "", host
    # Each host its own: the mirror of node-2, the public repository of node-1.
    assert outcome["node-2"]["probe_reads"].startswith("http://mirror.example.com/")
    assert not outcome["node-1"]["probe_reads"].startswith("http://mirror.example.com/")


def test_play_1_gathers_every_fact_the_roles_read_and_no_more():
    """Play 1 gathers the minimal subset and the virtualization (issue 30: a cheaper setup on each host and smaller
    variables in every later task): every ansible_facts key the roles, the playbooks and the plugins read must be
    in what setup gathers so, on this machine, except the RAM, which preflight's module reads where the play did
    not gather it (host_facts.memtotal_mb); Slurm's node lines read the CPU topology in services.yml's plays, which
    gather every fact again."""
    assert PLAY_1["gather_subset"] == ["min", "virtual"]
    services = yaml.safe_load((REPO_ROOT / "playbooks" / "services.yml").read_text())
    slurm = next(play for play in services if play["name"] == "Slurm")
    assert slurm["gather_facts"] is True and "gather_subset" not in slurm
    # A fact read in Jinja (ansible_facts['kernel'], ansible_facts.hostname) or in Python from the facts
    # (facts.get('os_family'), j["ansible_facts"]["distribution"]); slurm's configure.yml reads the CPU topology in
    # the services play (above).
    fact_read = re.compile(
        r"""(?:(?<![\w.])(?:ansible_)?facts|\[['"]ansible_facts['"]\])(?:\[['"]|\.get\(['"])(\w+)"""
        r"""|(?<![\w.])ansible_facts\.(\w+)"""
    )
    services_only = REPO_ROOT / "roles" / "slurm" / "tasks" / "configure.yml"
    read = set()
    for folder in ("roles", "playbooks", "plugins"):
        for path in (REPO_ROOT / folder).rglob("*"):
            if path.suffix in (".yml", ".j2", ".py") and path.is_file() and path != services_only:
                read |= {key for pair in fact_read.findall(path.read_text()) for key in pair if key}
    assert {"distribution", "kernel", "hostname", "architecture", "virtualization_role", "os_family"} <= read
    with tempfile.TemporaryDirectory() as tmp:
        play = {
            "hosts": "localhost",
            "connection": "local",
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
            "gather_facts": True,
            "gather_subset": PLAY_1["gather_subset"],
            "tasks": [{"ansible.builtin.copy": {"content": "{{ ansible_facts | to_json }}", "dest": f"{tmp}/facts"}}],
        }
        run = ansible_playbook(Path(tmp), [play])
        assert run.returncode == 0, run.stdout + run.stderr
        gathered = set(json.loads(Path(tmp, "facts").read_text()))
    assert read - gathered == {"memtotal_mb"}
