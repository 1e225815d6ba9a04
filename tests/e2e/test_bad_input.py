"""Bad input, as a new user would give it: the play stops before any change,
on a never-provisioned node, with a message naming the variable or host."""

import shutil

import pytest
import yaml
from conftest import LAB_INVENTORY, REPO, make_fresh_node, podman, run_playbook

CASES = [
    pytest.param(
        {"nvidia_driver_branch": "abc"},
        "nvidia_driver_branch 'abc' is not a driver branch gpufleet knows",
        id="branch-abc",
    ),
    pytest.param(
        {"nvidia_driver_version": "550.54.15"},
        "nvidia_driver_version '550.54.15' is not a release of branch 535",
        id="version-of-other-branch",
    ),
    pytest.param(
        {"nvidia_driver_source": "rpmfusion"},
        "value of nvidia_driver_source must be one of: , ubuntu, nvidia, debian_nonfree, got: rpmfusion",
        id="unknown-source",
    ),
    pytest.param(
        {"nvidia_driver_source": "ubuntu"},
        "nvidia_driver_source 'ubuntu' does not exist on Debian",
        id="source-of-another-os",
    ),
    pytest.param(
        {"nvidia_driver_repository_url": "gpufleet-mirror/debian"},
        "nvidia_driver_repository_url 'gpufleet-mirror/debian' is not an http(s) URL",
        id="malformed-mirror-url",
    ),
    pytest.param(
        {
            "nvidia_driver_repository_url": "",
            "nvidia_driver_repository_key_url": "http://gpufleet-mirror/gpufleet-lab.asc",
        },
        "nvidia_driver_repository_key_url is set but nvidia_driver_repository_url is empty",
        id="missing-mirror-url",
    ),
    pytest.param(
        {"nvidia_driver_repository_keyring": "/etc/apt/keyrings/absent.gpg"},
        "nvidia_driver_repository_keyring /etc/apt/keyrings/absent.gpg does not exist",
        id="missing-keyring",
    ),
    pytest.param(
        {"nvidia_driver_version": "535.999.99"},
        "nvidia_driver_version 535.999.99 is not in http://gpufleet-mirror/debian; nvidia-smi is offered at",
        id="version-not-in-repository",
    ),
    # The lab's fixture of a transitional build (tests/lab/files/build-fixture-transitional.sh): its nvidia-smi
    # 535.261.03 depends on branch 580's libnvidia-compute-580, as Canonical's 535-server builds depend on 580-server's.
    pytest.param(
        {
            "nvidia_driver_repository_url": "http://gpufleet-mirror/fixtures/transitional",
            "nvidia_driver_repository_suites": ["gpufleet-fixture-transitional"],
            "nvidia_driver_repository_components": ["non-free"],
        },
        "nvidia-smi 535.261.03-1+gpufleetlab1 depends on libnvidia-compute-580 of branch 580",
        id="release-of-another-branch",
    ),
    pytest.param(
        {
            "nvidia_driver_repository_key_url": "http://gpufleet-mirror/debian/dists/bookworm/Release",
            "nvidia_driver_repository_keyring": "",
        },
        "apt rejects the driver repository http://gpufleet-mirror/debian",
        id="wrong-key",
    ),
    pytest.param(
        {"nvidia_driver_branch": "470"},
        "CUDA 12.1 needs NVIDIA driver 530.30.02 or newer, but nvidia_driver_branch 470 (its default release)"
        " is driver 470.256.02",
        id="driver-branch-too-old-for-cuda",
    ),
    pytest.param(
        {"cuda_release": "11.0"}, "cuda_release '11.0' is not a CUDA release gpufleet knows", id="unknown-cuda-release"
    ),
    pytest.param(
        {"pytorch_release": "2.0.1", "pytorch_variant": "cu121"},
        "pytorch_release '2.0.1' is not a PyTorch release gpufleet knows",
        id="torch-release-without-cu121",
    ),
    # PyPI's torch 2.5.1 is the CUDA 12.4 build (https://pypi.org/project/torch/2.5.1/): the lab's source
    # (pytorch_wheel_source pypi) has no cu121 build of it.
    pytest.param({"pytorch_release": "2.5.1"}, "torch 2.5.1 on PyPI", id="pypi-torch-2.5-is-cu124"),
    # The wheelhouse without its lock: refused before any change (pytorch_require_hashes_offline).
    pytest.param(
        {"pytorch_hashes_file": ""},
        "pytorch_wheelhouse_url is an offline install, which gpufleet checks wheel by wheel",
        id="wheelhouse-without-lock",
    ),
    pytest.param(
        {"preflight_secure_boot_policy": "sometimes"}, "preflight_secure_boot_policy", id="unknown-secure-boot-policy"
    ),
    pytest.param(
        {"gpu_verify_expected_gpus": -1}, "gpu_verify_expected_gpus '-1' is not a GPU count", id="negative-gpu-count"
    ),
    pytest.param(
        {"smoke_training_amp": "fp8"},
        "value of smoke_training_amp must be one of: auto, bf16, fp16, off, got: fp8",
        id="unknown-amp-mode",
    ),
    pytest.param(
        {"smoke_training_rendezvous_port": 80},
        "smoke_training_rendezvous_port '80' is not a TCP port (1024-65535)",
        id="privileged-rendezvous-port",
    ),
    pytest.param(
        {"smoke_training_busbw_mib": 0},
        "smoke_training_busbw_mib is 0 (nothing measured) but a smoke_training_min_busbw_*_gbps floor is set",
        id="floor-without-measurement",
    ),
    # Types and choices: the roles' argument specs, applied by play 1 (their message).
    pytest.param(
        {"pytorch_require_gpu": "perhaps"},
        "pytorch settings rejected on {host} (argument spec): argument 'pytorch_require_gpu' is of type str"
        " and we were unable to convert to bool",
        id="spec-bool",
    ),
    pytest.param(
        {"cuda_compile_check": "perhaps"},
        "cuda settings rejected on {host} (argument spec): argument 'cuda_compile_check' is of type str",
        id="spec-bool-cuda",
    ),
    pytest.param(
        {"gpu_verify_gemm_min_fraction": "most"},
        "argument 'gpu_verify_gemm_min_fraction' is of type str and we were unable to convert to float",
        id="spec-float",
    ),
    pytest.param(
        {"smoke_training_steps": "many"},
        "argument 'smoke_training_steps' is of type str and we were unable to convert to int",
        id="spec-int",
    ),
    pytest.param(
        {"smoke_training_expect_transport": "infiniband"},
        "value of smoke_training_expect_transport must be one of: any, ib, roce, socket, got: infiniband",
        id="unknown-transport",
    ),
    # A setting no role has: refused, naming the one meant.
    pytest.param(
        {"cuda_version": "12.4"},
        "inventory settings rejected on {host}: [1] cuda_version is not a setting of role cuda"
        " (did you mean cuda_release?)",
        id="unknown-setting",
    ),
]


# Download sources that do not answer: play 1 tries every one the run needs
# (each role's `probe`), so none is found after the driver is installed
# (issue 16, item 18).
SOURCE_CASES = [
    pytest.param(
        {"nvidia_driver_repository_url": "http://gpufleet-mirror/no-such-repo"},
        "(nvidia_driver_repository_url) is not usable from this host",
        id="driver-repository",
    ),
    pytest.param(
        {"cuda_repository_url": "http://gpufleet-mirror/no-such-cuda"},
        "http://gpufleet-mirror/no-such-cuda (cuda_repository_url) is not usable from this host",
        id="cuda-repository",
    ),
    pytest.param(
        {"pytorch_wheelhouse_url": "http://gpufleet-mirror/no-such-wheels/"},
        "the wheel source is not usable from this host: http://gpufleet-mirror/no-such-wheels/ answered HTTP 404",
        id="wheel-source",
    ),
    # Play 1's wheel plan (roles/pytorch/files/pytorch_wheel_plan.py): the wheelhouse answers, but a wheel the
    # install needs is not there, or is served by a second host that does not answer (mirror_listings below).
    pytest.param(
        {"pytorch_wheelhouse_url": "http://gpufleet-mirror/wheels-without-one/"},
        "offers no wheel of nvidia-nccl-cu12==2.20.5",
        id="wheelhouse-without-a-wheel",
    ),
    pytest.param(
        {"pytorch_wheelhouse_url": "http://gpufleet-mirror/wheels-second-host/"},
        "gpufleet-mirror:8099 does not answer",
        id="wheel-on-a-second-host",
    ),
]

# The wheel the two listings leave out, or serve from a second host: NCCL, a dependency of torch 2.3.1.
MISSING_WHEEL = "nvidia_nccl_cu12-2.20.5-py3-none-manylinux2014_x86_64.whl"


def mirror_listings() -> list:
    """Two find-links pages on the lab's mirror beside its wheelhouse (/wheels/): one without the NCCL wheel, one
    that links it on port 8099 of the mirror, where nothing listens (a second host the site's firewall drops)."""
    root = REPO / ".lab" / "mirror"
    wheels = sorted(p.name for p in (root / "wheels").glob("*.whl"))
    assert MISSING_WHEEL in wheels, wheels
    pages = {
        "wheels-without-one": [f"../wheels/{w}" for w in wheels if w != MISSING_WHEEL],
        "wheels-second-host": [
            f"http://gpufleet-mirror{':8099' if w == MISSING_WHEEL else ''}/wheels/{w}" for w in wheels
        ],
    }
    made = []
    for name, links in pages.items():
        directory = root / name
        directory.mkdir(exist_ok=True)
        (directory / "index.html").write_text(
            "<html><body>\n"
            + "".join(f'<a href="{link}">{link.rsplit("/", 1)[1]}</a><br>\n' for link in links)
            + "</body></html>\n"
        )
        made.append(directory)
    return made


def alias(case_id: str) -> str:
    return f"bad-{case_id}"


@pytest.fixture(scope="module")
def bad_input_run(tmp_path_factory, fresh_node):
    """Every case of SOURCE_CASES and CASES in one site.yml run: each case is an inventory name of its own for
    the never-provisioned node (its settings as host variables), so that play 1 judges them side by side as it
    judges a fleet's hosts, one ansible-playbook run instead of one per case (the CI budget, issue 12). The
    -e path of the settings is test_unknown_setting_given_with_e below and the other tests of this file."""
    hosts = yaml.safe_load((fresh_node.inventory / "hosts.yml").read_text())
    group = hosts["all"]["children"]["gpu_nodes"]
    node = group["hosts"][fresh_node.name]
    group["hosts"] = {alias(case.id): {**node, **case.values[0]} for case in SOURCE_CASES + CASES}
    inventory = tmp_path_factory.mktemp("inv-bad-input")
    (inventory / "group_vars").symlink_to(LAB_INVENTORY / "group_vars")
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    listings = mirror_listings()
    before = fresh_node.state()
    try:
        # Every name is the same sshd: at most 8 connections at once, below its MaxStartups (10 unauthenticated
        # connections; more are reset at random, "kex_exchange_identification: Connection reset by peer").
        run = run_playbook(tmp_path_factory.mktemp("bad-input"), "site.yml", inventory, envvars={"ANSIBLE_FORKS": "8"})
    finally:
        for directory in listings:
            shutil.rmtree(directory, ignore_errors=True)
    after = fresh_node.state()
    return run, before, after


def stopped_before_any_change(run, before, after, host, expected):
    """The run stopped this host with the expected message, said once, and nothing on the node changed."""
    assert run.status == "failed"
    assert host in run.failures(), sorted(run.failures())
    expected = expected.format(host=host)
    messages = run.failures()[host]
    assert expected in " ".join(messages), messages
    # Said once: by the task that stopped the role, not again by the host's final stop (issue 16, item 21).
    assert sum(expected in message for message in messages) == 1, messages
    assert run.changed_tasks() == {}
    assert after == before


def stops_before_any_change(tmp_path, node, extravars, expected):
    """site.yml with these settings (-e) fails on the node with the expected message, and nothing on it changed."""
    before = node.state()
    run = run_playbook(tmp_path, "site.yml", node.inventory, extravars=extravars)
    stopped_before_any_change(run, before, node.state(), node.name, expected)
    return run


@pytest.mark.parametrize("extravars, expected", SOURCE_CASES)
def test_a_dead_download_source_stops_play_1(request, bad_input_run, extravars, expected):
    run, before, after = bad_input_run
    host = alias(request.node.callspec.id)
    stopped_before_any_change(run, before, after, host, expected)
    plays = {
        ev["event_data"].get("play")
        for ev in run.events
        if ev.get("event") == "runner_on_failed" and ev["event_data"]["host"] == host
    }
    assert plays == {"Check hosts and settings (read-only)"}, plays


@pytest.mark.parametrize("extravars, expected", CASES)
def test_bad_input_stops_before_any_change(request, bad_input_run, extravars, expected):
    run, before, after = bad_input_run
    stopped_before_any_change(run, before, after, alias(request.node.callspec.id), expected)


def test_every_case_stopped_and_no_other_host(bad_input_run):
    run, _before, _after = bad_input_run
    assert set(run.failures()) == {alias(case.id) for case in SOURCE_CASES + CASES}


def test_unknown_setting_given_with_e(tmp_path, fresh_node):
    """A setting no role has, given with -e (extra vars outrank the inventory): refused, naming the one meant."""
    stops_before_any_change(
        tmp_path,
        fresh_node,
        {"cuda_version": "12.4"},
        "inventory settings rejected on {host}: [1] cuda_version is not a setting of role cuda"
        " (did you mean cuda_release?)",
    )


# The playbooks' own settings (roles/gpufleet) and the inventory itself:
# refused by play 0 on the controller, before any host is contacted.
CONTROLLER_CASES = [
    pytest.param(
        {"gpufleet_slurm": "perhaps"},
        "gpufleet settings rejected on localhost (argument spec): argument 'gpufleet_slurm' is of type str and"
        " we were unable to convert to bool",
        id="switch-not-a-bool",
    ),
    pytest.param(
        {"gpufleet_unknown_settings": "ignore"},
        "value of gpufleet_unknown_settings must be one of: refuse, warn, got: ignore",
        id="unknown-settings-mode",
    ),
]


@pytest.mark.parametrize("extravars, expected", CONTROLLER_CASES)
def test_bad_playbook_settings_stop_on_the_controller(tmp_path, fresh_node, extravars, expected):
    before = fresh_node.state()
    run = run_playbook(tmp_path, "site.yml", fresh_node.inventory, extravars=extravars)
    assert run.status == "failed"
    messages = " ".join(run.failures().get("localhost", []))
    assert expected in messages, messages
    assert fresh_node.name not in run.failures()
    assert run.changed_tasks() == {}
    assert fresh_node.state() == before


def test_a_misspelled_switch_is_refused(tmp_path, fresh_node):
    """gpufleet_monitorng (a typo of a playbook switch) is refused like a role's setting, not ignored."""
    run = run_playbook(tmp_path, "site.yml", fresh_node.inventory, extravars={"gpufleet_monitorng": True})
    assert run.status == "failed"
    messages = " ".join(run.failures().get(fresh_node.name, []))
    assert "gpufleet_monitorng is not a setting of role gpufleet (did you mean gpufleet_monitoring?)" in messages, (
        messages
    )
    assert run.changed_tasks() == {}


def test_an_inventory_without_gpu_nodes_is_refused(tmp_path, fresh_node):
    """No host in gpu_nodes: every play would match no host and exit 0 having done nothing (issue 16, item 16)."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(LAB_INVENTORY / "group_vars")
    (inventory / "hosts.yml").write_text("all:\n  children:\n    gpu_nodes: {}\n    slurm_controller: {}\n")
    run = run_playbook(tmp_path, "site.yml", inventory)
    assert run.status == "failed"
    messages = " ".join(run.failures().get("localhost", []))
    assert f"the inventory ({inventory}) has no host in the group gpu_nodes" in messages, messages


def test_a_misspelled_setting_in_group_vars_is_refused(tmp_path, fresh_node):
    """nvidia_driver_verison in the inventory's group_vars: refused in play 1, naming nvidia_driver_version,
    not ignored (the run would otherwise go on with the default)."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all").symlink_to(LAB_INVENTORY / "group_vars" / "all")
    (inventory / "group_vars" / "gpu_nodes.yml").write_text('nvidia_driver_verison: "535.261.03"\n')
    (inventory / "hosts.yml").write_text((fresh_node.inventory / "hosts.yml").read_text())
    before = fresh_node.state()
    run = run_playbook(tmp_path, "site.yml", inventory)
    assert run.status == "failed"
    messages = " ".join(run.failures().get(fresh_node.name, []))
    assert (
        "nvidia_driver_verison is not a setting of role nvidia_driver (did you mean nvidia_driver_version?)" in messages
    ), messages
    assert run.changed_tasks() == {}
    assert fresh_node.state() == before


def test_unsupported_os_stops_in_preflight(tmp_path, tmp_path_factory, lab_hosts):
    node = make_fresh_node(tmp_path_factory, "gpufleet-e2e-noble")
    try:
        node.exec(
            "printf '%s\\n' 'PRETTY_NAME=\"Ubuntu 24.04 LTS\"' 'NAME=\"Ubuntu\"' 'VERSION_ID=\"24.04\"'"
            " 'ID=ubuntu' 'ID_LIKE=debian' 'VERSION_CODENAME=noble' > /etc/os-release"
        )
        before = node.state()
        run = run_playbook(tmp_path, "site.yml", node.inventory)
        assert run.status == "failed"
        messages = " ".join(run.failures().get(node.name, []))
        assert f"gpufleet preflight failed on {node.name}" in messages
        assert "unsupported operating system Ubuntu 24.04" in messages
        assert run.changed_tasks() == {}
        assert node.state() == before
    finally:
        podman("rm", "-f", node.name, check=False)


def test_conflicting_admin_source_stops_before_apt_breaks(tmp_path, fresh_node):
    """A Debian host as installed: the archive key in trusted.gpg.d and an
    admin's own list for non-free without Signed-By, sorting after the role's
    file. Writing the role's source (with Signed-By) would make every apt run
    on the host fail ("Conflicting values set for option Signed-By"). The
    role's scratch trial sees the conflict and stops before writing anything."""
    admin_list = "/etc/apt/sources.list.d/non-free.list"
    trusted = "/etc/apt/trusted.gpg.d/gpufleet-lab.gpg"
    fresh_node.exec(
        f"cp /usr/share/keyrings/gpufleet-lab-archive-keyring.gpg {trusted} &&"
        f" echo 'deb http://mirror.gpufleet.lab/debian bookworm non-free' > {admin_list}"
    )
    try:
        before = fresh_node.state()
        run = run_playbook(
            tmp_path,
            "site.yml",
            fresh_node.inventory,
            extravars={"nvidia_driver_repository_url": "http://mirror.gpufleet.lab/debian"},
        )
        assert run.status == "failed"
        messages = " ".join(run.failures().get(fresh_node.name, []))
        assert "apt rejects the driver repository http://mirror.gpufleet.lab/debian" in messages
        assert "Conflicting values set for option Signed-By" in messages
        assert run.changed_tasks() == {}
        assert fresh_node.state() == before
        assert "E:" not in fresh_node.exec("apt-cache policy 2>&1 >/dev/null")
    finally:
        fresh_node.exec(f"rm -f {admin_list} {trusted}")


def _bool_settings() -> list[str]:
    """The bool settings of every public role's spec (apt_source and payload take theirs from roles, not users)."""
    names = []
    for spec_file in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        if spec_file.parent.parent.name in ("apt_source", "payload"):
            continue
        options = yaml.safe_load(spec_file.read_text())["argument_specs"]["main"]["options"]
        names += [name for name, option in options.items() if option.get("type") == "bool"]
    return names


def _what_ran(run) -> dict[str, list[tuple]]:
    """{host: [(task, outcome), ...] in order}: the behaviour of the run. Per host, since the order of the
    results of one task on several hosts (play 0 runs on localhost and the node) is the forks' race."""
    outcome = {
        "runner_on_ok": "ok",
        "runner_on_skipped": "skipped",
        "runner_on_failed": "failed",
        "runner_on_unreachable": "unreachable",
    }
    ran: dict[str, list[tuple]] = {}
    for ev in run.events:
        if ev.get("event") in outcome:
            ran.setdefault(ev["event_data"]["host"], []).append((ev["event_data"].get("task"), outcome[ev["event"]]))
    return ran


def test_string_booleans_behave_as_false(tmp_path, fresh_node):
    """Every bool setting of every role given as the strings "no" and "false" (as -e and an INI inventory give
    them): play 1 does exactly what it does with false (issue 16, item 15); before, "no" read as true or broke a
    conditional without naming the setting."""
    names = _bool_settings()
    assert len(names) > 30 and "preflight_require_kernel_headers" in names
    as_false = {name: False for name in names}
    as_strings = {name: ("no", "false")[i % 2] for i, name in enumerate(names)}
    runs = {
        label: run_playbook(tmp_path / label, "playbooks/check.yml", fresh_node.inventory, extravars=values)
        for label, values in (("false", as_false), ("strings", as_strings))
    }
    assert runs["strings"].failures() == runs["false"].failures()
    assert _what_ran(runs["strings"]) == _what_ran(runs["false"])
    assert runs["strings"].status == runs["false"].status
