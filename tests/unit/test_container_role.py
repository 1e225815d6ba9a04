"""roles/container and roles/container/files/Containerfile.train without a host or a registry.

The role runs for real (tests/unit/role_run.py): ansible-core's executor runs
its tasks/validate.yml on fake hosts of Ubuntu 20.04, Ubuntu 22.04 and Debian
12 (one per case, the settings as inventory variables), in one run for the
cases this module knows up front. In the same play, after validate.yml, it
templates what tasks/repository.yml gives roles/apt_source (and the source
and pin apt_source renders from it), and the arguments of the tasks that run
commands on a host (install.yml, configure.yml, image.yml, the handler),
with their registered inputs given as task variables. Nothing is copied from
the role into the tests.

Expected values are NVIDIA's published layout (the Container Toolkit
install guide): the repository list
``deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /``
Signed-By the key from https://nvidia.github.io/libnvidia-container/gpgkey,
and the four packages nvidia-container-toolkit, nvidia-container-toolkit-base,
libnvidia-container-tools and libnvidia-container1 installed at one version
(``X.Y.Z-1``); ``nvidia-ctk runtime configure`` edits
/etc/docker/daemon.json for docker and /etc/containerd/config.toml for
containerd. Where apt is installed, apt itself reads the rendered files.

The training image's ARG defaults are compared with files/compatibility.yml,
so that the Containerfile and the matrix cannot drift apart.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
import role_run
import yaml
from conftest import FAKE_FACTS, host_tool, load_script, load_trusted
from test_driver_rendering import _isolated_apt_options, apt_index_urls, parse_deb822

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLE = REPO_ROOT / "roles" / "container"
COMPATIBILITY_FILE = REPO_ROOT / "files" / "compatibility.yml"
CONTAINERFILE = REPO_ROOT / "roles" / "container" / "files" / "Containerfile.train"
MATRIX = yaml.safe_load(COMPATIBILITY_FILE.read_text())
filters = load_script(REPO_ROOT / "plugins" / "filter" / "gpufleet_filters.py")

NVIDIA_REPOSITORY = "https://nvidia.github.io/libnvidia-container/stable/deb/amd64"
# NVIDIA's nvidia-container-toolkit.list, as the install guide fetches it.
NVIDIA_LIST = "deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
NVIDIA_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
# One apt source per repository, named after it (gpufleet_filters.apt_source_files): its file, and the keyring a key
# URL's key is fetched into.
SOURCE_FILE = "/etc/apt/sources.list.d/gpufleet-nvidia.github.io_libnvidia--container_stable_deb_amd64.sources"
FETCHED_KEYRING = "/etc/apt/keyrings/gpufleet-nvidia.github.io_libnvidia--container_stable_deb_amd64.asc"
# Where releases before it fetched the key: replaced.
PREVIOUS_KEYRING = "/etc/apt/keyrings/gpufleet-nvidia-container-toolkit.asc"
TOOLKIT_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
# Packages of NVIDIA's repository that the pin must not catch.
OTHER_PACKAGES = [
    "nvidia-docker2",
    "nvidia-container-runtime",
    "libnvidia-container-dev",
    "libnvidia-container1-dbg",
    "docker.io",
]
HOSTS = ["ubuntu2004", "ubuntu2204", "debian12"]


# --------------------------------------------------------------------------- the role on fake hosts

# validate.yml alone: what it resolves and what it refuses.
VALIDATE = role_run.Batch(FAKE_FACTS, [role_run.import_role("container")])
# ... then what repository.yml gives apt_source's trial and main, and what apt_source writes from it.
WITH_SOURCE = role_run.Batch(
    FAKE_FACTS,
    [role_run.import_role("container")],
    after=[
        role_run.expose("apt_source", "hold"),
        role_run.apt_source_capture(
            "container",
            "repository.yml",
            "main_",
            also={"trial_inputs": role_run.apt_source_inputs("container", "repository.yml", "trial")},
            trial_file="repository.yml",
        ),
    ],
)
# ... or the arguments of the tasks that run commands, templated on the host (registered inputs as task variables).
_TOOLKIT = role_run.role_task("container", "install.yml", "Install the NVIDIA Container Toolkit")
_SELECTION = role_run.role_task("container", "install.yml", "dpkg selection")
_RUNTIME = role_run.role_task("container", "configure.yml", "Configure the NVIDIA Container Runtime")
_HANDLER = role_run.role_task(
    "container", "main.yml", "Restart the container runtimes whose configuration changed", "handlers"
)
_CDI = role_run.role_task("container", "configure.yml", "Generate the CDI specification where the driver is loaded")
_STAT = role_run.role_task("container", "configure.yml", "control device")
_GENERATE = role_run.role_task("container", "configure.yml", "Generate the CDI specification of this host's GPUs")
_INSTALL_CDI = role_run.role_task("container", "configure.yml", "Install the CDI specification")
_BUILD = role_run.role_task("container", "image.yml", "Build the training image")
CHANGED = {"results": [{"item": "docker", "changed": True}, {"item": "containerd", "changed": False}]}
UNCHANGED = {"results": [{"item": "docker", "changed": False}]}
SCRATCH = {"path": "/tmp/gpufleet-cdi.x"}
# Two capture tasks: the registered inputs of one (CHANGED, the control device there, ...) and of the other
# (UNCHANGED, no control device) as task variables; each variable is read by one expression only.
WITH_TASKS = role_run.Batch(
    FAKE_FACTS,
    [role_run.import_role("container")],
    after=[
        role_run.capture(
            {
                "toolkit_apt_name": _TOOLKIT["ansible.builtin.apt"]["name"],
                "selection_loop": _SELECTION["loop"],
                "stat_path": _STAT["ansible.builtin.stat"]["path"],
                "cdi_dest": _INSTALL_CDI["ansible.builtin.copy"]["dest"],
                "build_chdir": _BUILD["ansible.builtin.command"]["chdir"],
                **role_run.names("__container_runtimes", "__container_nvidiactl"),
                "containerd_environment": _RUNTIME["environment"],
                "restart_changed": _HANDLER["loop"],
                "cdi_when_True": role_run.condition(_CDI),
                "generate_argv": _GENERATE["ansible.builtin.command"]["argv"],
                "build_argv": _BUILD["ansible.builtin.command"]["argv"],
            },
            vars={
                "item": "containerd",
                "__container_runtime_configured": CHANGED,
                "__container_nvidiactl_stat": {"stat": {"exists": True}},
                "__container_toolkit_installed": {"changed": False},
                "__container_cdi_scratch": SCRATCH,
                "__container_image_inputs": "abc",
            },
            name="Template the tasks' arguments",
        ),
        role_run.capture(
            {"restart_unchanged": _HANDLER["loop"], "cdi_when_False": role_run.condition(_CDI)},
            vars={
                "__container_runtime_configured": UNCHANGED,
                "__container_nvidiactl_stat": {"stat": {"exists": False}},
                "__container_toolkit_installed": {"changed": False},
            },
            name="Template the tasks' arguments with the other registered inputs",
        ),
    ],
)


def cfg_for(host: str | dict = "ubuntu2204", **overrides: Any) -> role_run.Outcome:
    """What tasks/validate.yml resolved (or the message it stopped with) on fake host ``host`` (a FAKE_FACTS key or
    facts); ``overrides`` are inventory variables."""
    return VALIDATE.get(host, **overrides)


def source_text(cfg: role_run.Outcome) -> str:
    """The toolkit's source as roles/apt_source writes it (a WITH_SOURCE case)."""
    return cfg["main_source"]


def pin_text(cfg: role_run.Outcome) -> str:
    """The toolkit's pin as roles/apt_source writes it (a WITH_SOURCE case)."""
    (pin,) = cfg["main_pins"]
    return pin["text"]


def one_stanza(text: str) -> dict[str, str]:
    stanzas = parse_deb822(text)
    assert len(stanzas) == 1, text
    return stanzas[0]


# --------------------------------------------------------------------------- the Containerfile


def containerfile_args(path: Path = CONTAINERFILE) -> dict[str, str]:
    """ARG NAME=default lines of a Containerfile (quotes removed; continuation lines joined);
    an ARG without default maps to None."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*ARG\s+(.*)$", line, re.IGNORECASE)
        if not match:
            continue
        for word in shlex.split(match[1]):
            name, sep, value = word.partition("=")
            if sep or name not in args:
                args[name] = value if sep else None
    return args


def matrix_stack() -> dict[str, str]:
    """The default stack of files/compatibility.yml as the image's ARGs must say it."""
    cuda = MATRIX["defaults"]["cuda_release"]
    row = MATRIX["cuda_releases"][cuda]
    return {
        "torch": MATRIX["defaults"]["pytorch_release"],
        "variant": row["pytorch_variant"],
        "toolkit": row["toolkit_version"].rsplit("-", 1)[0],
        "cudnn_major": row["cudnn"]["version"].split(".")[0],
    }


def test_containerfile_arg_defaults_are_the_matrix_defaults():
    """torch is the default release from the CUDA release's index; BASE_IMAGE is the role's default base."""
    args = containerfile_args()
    stack = matrix_stack()
    assert stack == {"torch": "2.5.1", "variant": "cu121", "toolkit": "12.1.1", "cudnn_major": "8"}
    assert args["BASE_IMAGE"] == load_trusted(ROLE / "vars" / "main.yml")["__container_image_default_base"]
    assert args["TORCH_VERSION"] == stack["torch"]
    assert args["TORCH_VARIANT"] == stack["variant"]
    assert args["TORCH_INDEX_URL"] == f"https://download.pytorch.org/whl/{stack['variant']}"
    assert args["PIP_EXTRA_ARGS"] == ""
    # The default torch release is published for the default variant.
    assert stack["variant"] in MATRIX["pytorch_releases"][stack["torch"]]["variants"]


def test_the_default_base_is_one_that_stays():
    """Not NVIDIA's CUDA image: NVIDIA marks a CUDA image set EOL when the last driver it shipped with goes EOL and
    deletes the EOL tags (and their layers, so a digest with them) from Docker Hub and NGC after six months (its
    "Container Support Policy", gitlab.com/nvidia/container-images/cuda doc/support-policy.md, mirrored in
    github.com/pranavmishra90/nvidia-container-images-cuda at 60a1c892e6b996382e182b4654e0a3f31aeedbee); its EOL chart
    there (doc/container_tags.xlsx) marks CUDA 12.1.1 with R470 (EOL 2024-07-01) alone, and R535 went EOL on
    2026-06-01. The default is Ubuntu 22.04, the image NVIDIA's own 12.1.1 base is built FROM (dist/12.1.1/ubuntu2204/
    base/Dockerfile there: "FROM ubuntu:22.04"), whose standard support runs to April 2027 (ubuntu.com/about/
    release-cycle), named in full for podman. torch's cu121 wheels bring the CUDA runtime, cuDNN and NCCL themselves
    (the matrix's bundled builds), and the image keeps what NVIDIA's base told the container runtime (ENV
    NVIDIA_VISIBLE_DEVICES all, NVIDIA_DRIVER_CAPABILITIES compute,utility, the same Dockerfile)."""
    base = containerfile_args()["BASE_IMAGE"]
    assert base == "docker.io/library/ubuntu:22.04"
    assert not base.startswith(("nvcr.io/nvidia/cuda", "nvidia/cuda", "docker.io/nvidia/cuda"))
    text = CONTAINERFILE.read_text()
    assert "ENV NVIDIA_VISIBLE_DEVICES=all \\\n    NVIDIA_DRIVER_CAPABILITIES=compute,utility\n" in text
    # torch's cu121 wheels bring the CUDA user space: the matrix records what they bundle for the default release.
    assert MATRIX["pytorch_releases"][matrix_stack()["torch"]]["bundled"]["cu121"] == {
        "cudnn": "9.1.0.70",
        "nccl": "2.21.5",
    }
    # Every stack builds on it; a CPU-only image needs no CUDA release for it either.
    for settings in ({}, {"container_image_torch_variant": "cpu", "container_image_cuda_release": "9.9"}):
        cfg = cfg_for("ubuntu2204", container_build_image=True, **settings)
        assert cfg.failure is None, cfg.failure
        assert cfg["__container_image_build_args"]["BASE_IMAGE"] == base


def test_arg_parser_reads_quotes_and_redeclarations(tmp_path):
    """The parser used above: a redeclared ARG without a default keeps the first default; quotes are removed."""
    path = tmp_path / "Containerfile"
    path.write_text('ARG A=1\nFROM x\nARG A\narg B="two words" \\\n    C=3\nRUN echo ARG D=4\n')
    assert containerfile_args(path) == {"A": "1", "B": "two words", "C": "3"}


@pytest.mark.parametrize("host", HOSTS)
def test_role_build_args_default_to_the_containerfile_defaults(host):
    """With no settings the role builds with exactly the Containerfile's defaults
    (the same image as a plain docker build).

    The image's torch is the newest release for the image's own Python (the base image's Ubuntu 22.04 python3, 3.10:
    https://packages.ubuntu.com/jammy/python3), not the host's: 2.5.1 on an Ubuntu 20.04 host too, whose own
    environment gets 2.4.1 (its Python 3.8 has no torch 2.5 wheel)."""
    cfg = cfg_for(host, container_build_image=True)
    assert cfg.failure is None
    args = containerfile_args()
    assert cfg["__container_image_build_args"] == {name: args[name] for name in cfg["__container_image_build_args"]}
    assert set(cfg["__container_image_build_args"]) == {
        "BASE_IMAGE",
        "TORCH_VERSION",
        "TORCH_VARIANT",
        "TORCH_INDEX_URL",
        "PIP_EXTRA_ARGS",
    }
    assert cfg["__container_image_ref"] == "gpufleet-train:2.5.1-cu121"


def test_containerfile_copies_what_the_role_ships():
    """The COPY sources are the payload files the role puts in the node's build context, and they exist."""
    text = CONTAINERFILE.read_text()
    copies = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ")]
    sources = [src for srcs in copies for src in srcs if not src.startswith("--")]
    build_files = load_trusted(ROLE / "vars" / "main.yml")["__container_build_files"]
    assert sorted(sources + ["roles/container/files/Containerfile.train"]) == sorted(build_files)
    for path in build_files:
        assert (REPO_ROOT / path).is_file(), path


def test_containerfile_runs_unprivileged_with_torchrun_and_labels():
    """A numeric non-root USER, the payload as default command, torchrun checked at build time, OCI labels."""
    text = CONTAINERFILE.read_text()
    user = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert user == ["${TRAIN_UID}:${TRAIN_UID}"] and containerfile_args()["TRAIN_UID"] == "1000"
    assert re.search(r'^CMD \["python", "/opt/gpufleet/payload/train.py", "--json"\]$', text, re.MULTILINE)
    assert "command -v torchrun" in text
    assert "torch==${TORCH_VERSION}${TORCH_VARIANT:++${TORCH_VARIANT}}" in text
    assert "org.opencontainers.image.title=" in text
    # No parser directive: docker would pull the syntax frontend from a registry.
    assert not text.startswith("# syntax")


def test_build_context_ignores_local_state():
    """The repository root is the build context: .dockerignore (read by docker and podman) keeps local state out."""
    entries = {
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".lab", ".cache", "reports"} <= entries
    assert not any(
        fnmatchcase(path, entry)
        for path in ("roles/payload/files/train.py", "roles/container/files/Containerfile.train")
        for entry in entries
    )


# --------------------------------------------------------------------------- repository, pin, engine


@pytest.mark.parametrize("host", HOSTS)
def test_defaults_pass_validation(host):
    """No settings: docker with NVIDIA's amd64 repository, Signed-By the fetched NVIDIA key,
    the docker runtime configured."""
    cfg = cfg_for(host)
    assert cfg.failure is None
    assert cfg["__container_invalid"] == []
    assert cfg["__container_engine_spec"] == {"packages": ["docker.io"], "service": "docker"}
    assert cfg["__container_nvidia_runtimes"] == ["docker"]
    assert cfg["__container_repo_url"] == NVIDIA_REPOSITORY
    assert cfg["__container_key_url"] == NVIDIA_KEY_URL
    written = WITH_SOURCE.get(host)
    assert written["main_inputs"]["apt_source_repository"]["keyring"] == FETCHED_KEYRING
    assert written["main_sources_file"] == SOURCE_FILE
    assert written["main_inputs"]["apt_source_replaces"] == [PREVIOUS_KEYRING]


@pytest.mark.parametrize("host", HOSTS)
def test_source_is_nvidias_flat_repository_signed_by_a_keyring(host):
    """The deb822 source: NVIDIA's list with $(ARCH) = amd64, flat (Suites "/"),
    Signed-By the keyring in /etc/apt/keyrings."""
    text = source_text(WITH_SOURCE.get(host))
    assert text.startswith(f"# {role_run.ansible_managed()}\n")
    assert one_stanza(text) == {
        "Types": "deb",
        "URIs": f"{NVIDIA_REPOSITORY}/",
        "Suites": "/",
        "Architectures": "amd64",
        "Signed-By": FETCHED_KEYRING,
    }
    assert "Components" not in text


@pytest.mark.parametrize("host", HOSTS)
def test_apt_reads_the_same_indexes_as_nvidias_list(tmp_path, host):
    """apt derives the same Packages index from the rendered source as from NVIDIA's own list (apt expands $(ARCH))."""
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ours = apt_index_urls(tmp_path / "ours", {SOURCE_FILE.rpartition("/")[2]: source_text(WITH_SOURCE.get(host))})
    theirs = apt_index_urls(
        tmp_path / "theirs", {"nvidia-container-toolkit.list": NVIDIA_LIST.replace("$(ARCH)", "amd64")}
    )
    assert ours == theirs
    assert ours and all(url.startswith(NVIDIA_REPOSITORY + "/") for url in ours)


BAKED_MIRROR = {
    "container_nvidia_toolkit_repository_url": "http://mirror.example.com/libnvidia-container/stable/deb/amd64/",
    "container_nvidia_toolkit_repository_keyring": "/usr/share/keyrings/mirror-archive-keyring.gpg",
}
KEYED_MIRROR = {
    "container_nvidia_toolkit_repository_url": "https://mirror.example.com/nct",
    "container_nvidia_toolkit_repository_key_url": "https://mirror.example.com/key.asc",
}
MIRROR = {"container_nvidia_toolkit_repository_url": "http://mirror.example.com/nct"}


def test_mirror_with_baked_keyring():
    """An air-gapped mirror: its URL, a keyring already on the host, nothing fetched."""
    cfg = WITH_SOURCE.get("debian12", **BAKED_MIRROR)
    assert cfg.failure is None
    assert cfg["__container_repo_url"] == "http://mirror.example.com/libnvidia-container/stable/deb/amd64"
    assert cfg["__container_key_url"] == ""
    stanza = one_stanza(source_text(cfg))
    assert stanza["URIs"] == "http://mirror.example.com/libnvidia-container/stable/deb/amd64/"
    assert stanza["Signed-By"] == "/usr/share/keyrings/mirror-archive-keyring.gpg"


def test_mirror_with_its_own_key_url():
    """A mirror re-signed with the site's key: the key is fetched into the mirror repository's keyring file (one per
    repository, whichever role fetches it), in its one source file."""
    cfg = WITH_SOURCE.get("ubuntu2204", **KEYED_MIRROR)
    assert cfg.failure is None
    assert cfg["__container_key_url"] == "https://mirror.example.com/key.asc"
    assert one_stanza(source_text(cfg))["Signed-By"] == "/etc/apt/keyrings/gpufleet-mirror.example.com_nct.asc"
    assert cfg["main_sources_file"] == "/etc/apt/sources.list.d/gpufleet-mirror.example.com_nct.sources"


def test_a_keyring_at_the_previous_path_is_not_replaced():
    """A site keyring that happens to lie where earlier releases fetched the key is the source's Signed-By: kept."""
    cfg = WITH_SOURCE.get(
        "ubuntu2204", **{**BAKED_MIRROR, "container_nvidia_toolkit_repository_keyring": PREVIOUS_KEYRING}
    )
    assert one_stanza(source_text(cfg))["Signed-By"] == PREVIOUS_KEYRING
    assert cfg["main_inputs"]["apt_source_replaces"] == []


@pytest.mark.parametrize("host", HOSTS)
def test_the_trial_tries_the_source_repository_yml_writes(host):
    """The trial and the configuration describe one source;
    the trial looks for the toolkit version, naming its setting."""
    cfg = WITH_SOURCE.get(host, **MIRROR)
    trial, main = cfg["trial_inputs"], cfg["main_inputs"]
    assert {k: v for k, v in trial.items() if k in main} == {k: v for k, v in main.items() if k in trial}
    assert set(main) - set(trial) == {"apt_source_pins", "apt_source_replaces"}
    repository = trial["apt_source_repository"]
    assert repository["architectures"] == ["amd64"] and repository["key_url"] == NVIDIA_KEY_URL
    assert (trial["apt_source_package"], trial["apt_source_version"], trial["apt_source_version_name"]) == (
        "nvidia-container-toolkit",
        "1.19.1-1",
        "container_nvidia_toolkit_version",
    )
    assert trial["apt_source_url_name"] == "container_nvidia_toolkit_repository_url"


@pytest.mark.parametrize("version", ["1.17.8-1", "1.18.1-1", "1.19.0~rc.5-1"])
def test_pin_holds_the_four_toolkit_packages_at_the_version(version):
    """The preferences pin exactly the toolkit's four packages (also libnvidia-container)
    at the version, priority 1001."""
    cfg = WITH_SOURCE.get("ubuntu2204", container_nvidia_toolkit_version=version)
    assert cfg.failure is None
    stanza = one_stanza(pin_text(cfg))
    assert stanza["Pin"] == f"version {version}"
    assert stanza["Pin-Priority"] == "1001"
    assert stanza["Explanation"].startswith("gpufleet container")
    patterns = stanza["Package"].split()
    assert sorted(patterns) == sorted(TOOLKIT_PACKAGES)
    for package in OTHER_PACKAGES:
        assert not any(fnmatchcase(package, p) for p in patterns), package
    # The install task asks apt for the same four packages at that version.
    tasks = WITH_TASKS.get("ubuntu2204", container_nvidia_toolkit_version=version)
    assert tasks["toolkit_apt_name"] == [f"{p}={version}" for p in TOOLKIT_PACKAGES]
    assert tasks["selection_loop"] == TOOLKIT_PACKAGES


def test_default_version_is_the_release_of_nvidias_latest_security_bulletin():
    """The default is 1.19.1-1: the updated version NVIDIA's latest Container Toolkit security bulletin names
    ("Security Bulletin: NVIDIA Container Toolkit - June 2026", CVE-2026-24260, "All versions up to and including
    1.19.0" affected, updated version 1.19.1: github.com/NVIDIA/product-security 2026/5850/5850.md at
    dbb4ada053156ea7f41a15229c7b85e2380b3b87; the CVE record, CVEProject cvelistV5
    cves/2026/24xxx/CVE-2026-24260.json, says the same), with the package revision 1 of that tag
    (github.com/NVIDIA/nvidia-container-toolkit versions.mk at v1.19.1, 09ceee5dde66ba9ce25c7cc69b1ebd5e6e3266fa:
    LIB_VERSION 1.19.1, PACKAGE_REVISION 1). The previous default, 1.17.8-1 (the July 2025 bulletin's fix), is
    affected."""
    default = load_trusted(ROLE / "defaults" / "main.yml")["container_nvidia_toolkit_version"]
    assert default == "1.19.1-1"
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert spec["container_nvidia_toolkit_version"]["default"] == default
    affected_up_to = "1.19.0"
    assert filters.debian_version_compare(default, affected_up_to + "-1") > 0
    assert filters.debian_version_compare("1.17.8-1", affected_up_to + "-9") < 0


@pytest.mark.parametrize(
    ("version", "flag"),
    [("1.17.8-1", False), ("1.18.2-1", False), ("1.19.0~rc.5-1", True), ("1.19.1-1", True), ("1.20.0-1", True)],
)
def test_cdi_spec_keeps_the_schema_the_distributions_engines_read(version, flag):
    """From 1.19.0 (rc.4 added additional GIDs for device nodes) nvidia-ctk writes CDI spec v0.7.0 by default, which
    podman reads from 5.1.0 and docker from 26.1.0 on (NVIDIA's release notes, Container Toolkit 1.19.1, "Known
    Issues": github.com/NVIDIA/cloud-native-docs container-toolkit/release-notes.md at
    52dcb7b8d956784344e241df476de17094a4574c); Debian 12's podman is 4.3. The feature flag NVIDIA names there keeps
    the older schema; older toolkits, which have no such flag, are not given it."""
    argv = WITH_TASKS.get("ubuntu2204", container_nvidia_toolkit_version=version)["generate_argv"]
    assert argv[:4] == ["nvidia-ctk", "cdi", "generate", "--output=/tmp/gpufleet-cdi.x/nvidia.yaml"]
    assert argv[4:] == (["--feature-flag=no-additional-gids-for-device-nodes"] if flag else [])


def test_apt_accepts_the_rendered_pin(tmp_path):
    """apt parses the rendered preferences without an error or warning."""
    pref = tmp_path / "gpufleet.pref"
    pref.write_text(pin_text(WITH_SOURCE.get("debian12")))
    result = subprocess.run(
        [host_tool("apt-cache"), "policy", *_isolated_apt_options(tmp_path, preferences=pref)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and not re.search(r"^(E|W):", result.stderr, re.MULTILINE), result.stderr


def test_podman_on_debian_uses_cdi_only():
    """podman (Debian 12): its package, no daemon, no nvidia-ctk runtime (CDI instead)."""
    cfg = cfg_for("debian12", container_engine="podman")
    assert cfg.failure is None
    assert cfg["__container_engine_spec"] == {"packages": ["podman"], "service": ""}
    assert cfg["__container_nvidia_runtimes"] == []


@pytest.mark.parametrize("host", ["ubuntu2004", "ubuntu2204"])
def test_podman_on_ubuntu_is_rejected_with_the_reason(host):
    """Ubuntu 20.04 has no podman, 22.04's podman 3.4 has no CDI: stopped before any change, the variable named."""
    cfg = cfg_for(host, container_engine="podman")
    assert cfg.failure is not None
    assert f"container settings rejected on {cfg.host}: " in cfg.failure
    assert (
        "container_engine 'podman'"
        f" is not an engine gpufleet installs on Ubuntu {FAKE_FACTS[host]['distribution_version']}" in cfg.failure
    )
    assert "podman supports CDI from 4.1 on" in cfg.failure and "(choose docker)" in cfg.failure


KUBERNETES = {"container_nvidia_runtimes": ["containerd", "crio"], "container_nvidia_runtime_default": True}


def test_runtimes_for_kubernetes_nodes():
    """containerd/CRI-O on request, each with the file nvidia-ctk edits (passed as --config)
    and the service to restart."""
    cfg = WITH_TASKS.get("ubuntu2204", **KUBERNETES)
    assert cfg.failure is None
    assert cfg["__container_nvidia_runtimes"] == ["containerd", "crio"]
    runtimes = cfg["__container_runtimes"]
    assert runtimes["docker"] == {"config": "/etc/docker/daemon.json", "service": "docker"}
    assert runtimes["containerd"] == {"config": "/etc/containerd/config.toml", "service": "containerd"}
    assert runtimes["crio"]["service"] == "crio" and runtimes["crio"]["config"].startswith("/etc/crio/")
    task = _RUNTIME
    assert (
        'nvidia-ctk runtime configure --runtime="$RUNTIME" --config="$CONFIG" $SET_AS_DEFAULT'
        in task["ansible.builtin.shell"]["cmd"]
    )
    assert task["loop"] == "{{ __container_nvidia_runtimes }}"
    # The task's environment for the item containerd.
    assert cfg["containerd_environment"] == {
        "RUNTIME": "containerd",
        "CONFIG": "/etc/containerd/config.toml",
        "SET_AS_DEFAULT": "--set-as-default",
    }
    assert task["notify"] == "Restart the container runtimes whose configuration changed"


def test_only_changed_runtimes_are_restarted():
    """The handler restarts the services of the runtimes whose configuration nvidia-ctk changed, nothing else."""
    cfg = WITH_TASKS.get("ubuntu2204")
    handler = load_trusted(ROLE / "handlers" / "main.yml")[0]
    assert handler["name"] == _HANDLER["name"] == "Restart the container runtimes whose configuration changed"
    assert handler["listen"] == "container runtime restart"
    # The handler's loop, templated on the host after configure.yml registered CHANGED or UNCHANGED.
    assert cfg["restart_changed"] == ["docker"]
    assert cfg["restart_unchanged"] == []


def test_runtime_configuration_reports_a_change_only_when_the_file_changed(tmp_path):
    """The configure command's own logic, with a fake nvidia-ctk: a rewrite with the same content is no change."""
    task = _RUNTIME
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-ctk"
    # Writes a fixed document to --config, as nvidia-ctk writes its merged configuration.
    fake.write_text(
        "#!/bin/sh\n"
        'for a; do case "$a" in --config=*) printf \'{"runtimes": {"nvidia": {}}}\\n\' > "${a#--config=}";;'
        " esac; done\n"
    )
    fake.chmod(0o755)
    config = tmp_path / "daemon.json"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RUNTIME": "docker", "CONFIG": str(config), "SET_AS_DEFAULT": ""}

    def run() -> str:
        result = subprocess.run(
            ["/bin/bash", "-c", task["ansible.builtin.shell"]["cmd"]],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    assert "gpufleet: " in run()  # created
    assert "gpufleet: " not in run()  # rewritten identically
    config.write_text('{"log-driver": "journald"}\n')
    assert "gpufleet: " in run()  # an admin's edit is replaced: changed


def test_cdi_is_generated_only_where_the_driver_is_loaded():
    """The CDI block runs only when /dev/nvidiactl exists,
    writes nvidia-ctk's output to the spec file (0644), and cleans up."""
    cfg = WITH_TASKS.get("ubuntu2204")
    assert cfg["__container_nvidiactl"] == "/dev/nvidiactl"
    assert cfg["stat_path"] == "/dev/nvidiactl"
    # The block's when, templated on the host (not in check mode) with the stat's result.
    assert cfg["cdi_when_True"] is True
    assert cfg["cdi_when_False"] is False
    assert cfg["generate_argv"] == [
        "nvidia-ctk",
        "cdi",
        "generate",
        "--output=/tmp/gpufleet-cdi.x/nvidia.yaml",
        "--feature-flag=no-additional-gids-for-device-nodes",
    ]
    install = _INSTALL_CDI["ansible.builtin.copy"]
    assert cfg["cdi_dest"] == "/etc/cdi/nvidia.yaml" and install["mode"] == "0644" and install["remote_src"] is True
    cleanup = role_run.role_task("container", "configure.yml", "Remove the CDI scratch directory")
    assert cleanup["ansible.builtin.file"]["state"] == "absent" and cleanup["check_mode"] is False


# --------------------------------------------------------------------------- image settings


LAB_IMAGE = {
    "container_build_image": True,
    "pytorch_release": "2.3.1",
    "pytorch_wheel_source": "pypi",
    "pytorch_wheelhouse_url": "http://gpufleet-mirror/wheels/",
}


def test_lab_image_settings_follow_the_pytorch_role():
    """The lab's pytorch settings (PyPI's cu121 build of torch 2.3.1 from the mirror's wheelhouse,
    https://pypi.org/project/torch/2.3.1/: unlabelled, Requires-Dist nvidia-cuda-runtime-cu12==12.1.105)
    give the image's: TORCH_VARIANT empty (the Containerfile pins torch==2.3.1),
    pip uses the wheelhouse alone, trusting its plain-http host (pip ignores an untrusted http find-links);
    the tag still names the build's variant."""
    cfg = cfg_for("debian12", **LAB_IMAGE)
    assert cfg.failure is None
    assert cfg["__container_image_build_args"] == {
        "BASE_IMAGE": "docker.io/library/ubuntu:22.04",
        "TORCH_VERSION": "2.3.1",
        "TORCH_VARIANT": "",
        "TORCH_INDEX_URL": "https://pypi.org/simple",
        "PIP_EXTRA_ARGS": "--no-index --find-links http://gpufleet-mirror/wheels/ --trusted-host=gpufleet-mirror",
    }
    assert cfg["__container_image_ref"] == "gpufleet-train:2.3.1-cu121"


def test_the_lab_inventory_is_what_the_image_test_uses():
    lab = yaml.safe_load((REPO_ROOT / "tests" / "lab" / "inventory" / "group_vars" / "all" / "main.yml").read_text())
    assert {key: lab[key] for key in ("pytorch_release", "pytorch_wheel_source")} == {
        key: LAB_IMAGE[key] for key in ("pytorch_release", "pytorch_wheel_source")
    }
    assert "pytorch_variant" not in lab


PYPI_IMAGE = {
    "container_build_image": True,
    "container_image_torch_release": "2.4.1",
    "container_image_wheel_source": "pypi",
}
PYPI_MIRROR_IMAGE = {
    "container_build_image": True,
    "pytorch_release": "2.4.1",
    "pytorch_wheel_source": "pypi",
    "container_image_index_url": "https://nexus.corp.example/repository/pypi/simple/",
}
PYTORCH_IMAGE = {"container_build_image": True, "pytorch_release": "2.4.1", "pytorch_wheel_source": "pytorch"}


def test_image_from_pypi_without_a_wheelhouse():
    """pypi source, no wheelhouse: torch==2.4.1 from https://pypi.org/simple
    (https://pypi.org/project/torch/2.4.1/: the cu121 build, Requires-Dist nvidia-cuda-runtime-cu12==12.1.105)."""
    cfg = cfg_for("ubuntu2204", **PYPI_IMAGE)
    assert cfg.failure is None
    args = cfg["__container_image_build_args"]
    assert (args["TORCH_VERSION"], args["TORCH_VARIANT"], args["TORCH_INDEX_URL"], args["PIP_EXTRA_ARGS"]) == (
        "2.4.1",
        "",
        "https://pypi.org/simple",
        "",
    )


def test_image_wheel_source_follows_the_pytorch_role_and_an_explicit_index_wins():
    cfg = cfg_for("ubuntu2204", **PYPI_MIRROR_IMAGE)
    assert cfg.failure is None
    assert cfg["__container_image_build_args"]["TORCH_INDEX_URL"] == "https://nexus.corp.example/repository/pypi/simple"
    assert cfg["__container_image_build_args"]["TORCH_VARIANT"] == ""
    # The default source: PyTorch's index, labelled.
    cfg = cfg_for("ubuntu2204", **PYTORCH_IMAGE)
    args = cfg["__container_image_build_args"]
    assert (args["TORCH_VARIANT"], args["TORCH_INDEX_URL"]) == ("cu121", "https://download.pytorch.org/whl/cu121")


def test_image_wheel_source_setting_is_declared_like_the_other_image_settings():
    spec = yaml.safe_load((REPO_ROOT / "roles" / "container" / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]["main"]
    assert (
        spec["options"]["container_image_wheel_source"]["default"] == "{{ pytorch_wheel_source | default('pytorch') }}"
    )
    assert spec["options"]["container_image_index_url"]["default"] == ""


IMAGE_BUILD = {
    "container_build_image": True,
    "container_image_tag": "v1",
    "container_image_pip_extra_args": ["--proxy", "http://proxy:3128"],
}


def test_build_command_passes_every_build_arg():
    """docker/podman build -f roles/container/files/Containerfile.train
    with the inputs label and one --build-arg per ARG, context '.'."""
    cfg = WITH_TASKS.get("ubuntu2204", **IMAGE_BUILD)
    argv = cfg["build_argv"]  # the task's argv, with the inputs label "abc"
    assert argv[:8] == [
        "docker",
        "build",
        "--file",
        "roles/container/files/Containerfile.train",
        "--tag",
        "gpufleet-train:v1",
        "--label",
        "org.gpufleet.inputs=abc",
    ]
    assert argv[-1] == "."
    assert "--build-arg=PIP_EXTRA_ARGS=--proxy http://proxy:3128" in argv
    assert "--build-arg=BASE_IMAGE=docker.io/library/ubuntu:22.04" in argv
    assert cfg["build_chdir"] == "/opt/gpufleet/container-build"


# --------------------------------------------------------------------------- validation


BAD_INPUT = [
    (
        {"container_engine": "lxc"},
        "container_engine 'lxc' is not an engine gpufleet installs on Ubuntu 22.04 (choose docker)",
    ),
    ({"container_nvidia_toolkit_version": "1.17"}, "container_nvidia_toolkit_version '1.17' is not a package version"),
    (
        {"container_nvidia_toolkit_version": "latest"},
        "container_nvidia_toolkit_version 'latest' is not a package version",
    ),
    (
        {"container_nvidia_toolkit_repository_url": "ftp://mirror/nct"},
        "container_nvidia_toolkit_repository_url 'ftp://mirror/nct' is not an http(s) URL",
    ),
    (
        {"container_nvidia_toolkit_repository_key_url": "nvidia.github.io/gpgkey"},
        "container_nvidia_toolkit_repository_key_url 'nvidia.github.io/gpgkey' is not an http(s) URL",
    ),
    (
        {"container_nvidia_toolkit_repository_key_url": ""},
        "container_nvidia_toolkit_repository_key_url and container_nvidia_toolkit_repository_keyring are both empty",
    ),
    (
        {"container_nvidia_toolkit_repository_keyring": "keyrings/mirror.gpg"},
        "container_nvidia_toolkit_repository_keyring 'keyrings/mirror.gpg' is not an absolute path",
    ),
    (
        {"container_nvidia_runtimes": ["docker", "runc"]},
        "container_nvidia_runtimes names runc, which nvidia-ctk cannot configure",
    ),
    (
        {"container_cdi_spec_file": "/etc/cdi/nvidia.txt"},
        "container_cdi_spec_file '/etc/cdi/nvidia.txt' must be an absolute path ending in .yaml or .json",
    ),
]
BAD_IMAGE_INPUT = [
    (
        {"container_image_torch_release": "2.0.1"},
        "container_image_torch_release '2.0.1' is not a PyTorch release gpufleet knows",
    ),
    (
        {"container_image_cuda_release": "11.8"},
        "container_image_cuda_release '11.8' is not a CUDA release gpufleet knows",
    ),
    # https://pypi.org/project/torch/2.5.1/: the cu124 build (Requires-Dist nvidia-cuda-runtime-cu12==12.4.127).
    (
        {"container_image_wheel_source": "pypi"},
        "torch 2.5.1 on PyPI (container_image_wheel_source pypi) is the cu124 build, not cu121"
        " (the variant of CUDA 12.1, container_image_cuda_release): use container_image_wheel_source pytorch"
        " (https://download.pytorch.org/whl/cu121), or a release PyPI publishes as cu121: 2.1.0 ... 2.4.1",
    ),
    (
        {"container_image_wheel_source": "conda"},
        "container_image_wheel_source 'conda' is not a wheel source gpufleet knows"
        " (files/compatibility.yml lists pytorch, pypi)",
    ),
    ({"container_image_torch_variant": "cu118"}, "container_image_torch_variant cu118 does not match CUDA 12.1"),
    ({"container_image_name": "Bad Name"}, "container_image_name 'Bad Name' is not an image name"),
    ({"container_image_tag": "2.5.1+cu121"}, "container_image_tag '2.5.1+cu121' is not an image tag"),
    (
        {"container_image_index_url": "download.pytorch.org/whl/{variant}"},
        "container_image_index_url 'download.pytorch.org/whl/{variant}' is not an http(s) URL",
    ),
    (
        {"container_image_wheelhouse_url": "http://mirror/wheels"},
        "container_image_wheelhouse_url 'http://mirror/wheels' is not the http(s) URL of a directory listing",
    ),
    (
        {"container_image_pip_extra_args": ["--proxy http://proxy:3128"]},
        "container_image_pip_extra_args must be a list of options without spaces",
    ),
    ({"container_image_build_dir": "/opt"}, "container_image_build_dir '/opt' must be an absolute path of its own"),
    (
        {"container_image_build_dir": "relative/dir"},
        "container_image_build_dir 'relative/dir' must be an absolute path of its own",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    BAD_INPUT,
    ids=[next(iter(o)) + "=" + str(next(iter(o.values()))) for o, _message in BAD_INPUT],
)
def test_bad_input_is_rejected_naming_the_variable(overrides, message):
    cfg = cfg_for("ubuntu2204", **overrides)
    assert cfg.failure is not None, overrides
    assert cfg.failure.startswith(f"container settings rejected on {cfg.host}: [1] ")
    assert message in cfg.failure


@pytest.mark.parametrize(
    ("overrides", "message"),
    BAD_IMAGE_INPUT,
    ids=[next(iter(o)) + "=" + str(next(iter(o.values()))) for o, _message in BAD_IMAGE_INPUT],
)
def test_bad_image_input_is_rejected_when_the_image_is_built(overrides, message):
    """Image settings are checked when container_build_image is on."""
    cfg = cfg_for("ubuntu2204", container_build_image=True, **overrides)
    assert cfg.failure is not None and message in cfg.failure, cfg.failure


def test_image_settings_are_not_checked_without_an_image():
    """With container_build_image off (the default) the image settings cannot stop a host."""
    assert cfg_for("ubuntu2204", **MERGED_IMAGE_INPUT).failure is None
    assert cfg_for("ubuntu2204", container_build_image=True, **MERGED_IMAGE_INPUT).failure is not None


EVERY_PROBLEM = {
    "container_engine": "podman",
    "container_nvidia_toolkit_version": "x",
    "container_cdi_spec_file": "nvidia.yaml",
    "container_build_image": True,
    "container_image_name": "UPPER",
}
MERGED_IMAGE_INPUT = {key: value for overrides, _message in BAD_IMAGE_INPUT for key, value in overrides.items()}


def test_every_problem_comes_in_one_message():
    """All wrong settings of a host in one rejection, numbered."""
    cfg = cfg_for("ubuntu2204", **EVERY_PROBLEM)
    assert cfg.failure is not None
    assert [int(n) for n in re.findall(r"\[(\d+)\] ", cfg.failure)] == [1, 2, 3, 4]


ROCKY = dict(
    FAKE_FACTS["debian12"],
    distribution="Rocky",
    os_family="RedHat",
    distribution_major_version="9",
    distribution_version="9.3",
)


def test_unsupported_os_is_rejected():
    """A host without a package layout (not Ubuntu/Debian) is named, before any change."""
    cfg = cfg_for(ROCKY)
    assert cfg.failure is not None and "no package layout for Rocky 9.3" in cfg.failure


def test_validation_is_the_provision_entry_point():
    """tasks/validate.yml only reads: facts, include_vars and the role's rules (gpufleet.fleet.settings, which judges
    on the controller), safe in the read-only play; what the rules resolve the role's vars read from the judgement,
    with no set_fact. The entry point probe runs none of it (play 1 judged already)."""
    modules = set()
    for task in load_trusted(ROLE / "tasks" / "validate.yml"):
        modules |= {k for k in task if k.startswith(("ansible.builtin.", "gpufleet.fleet."))}
    assert modules == {"ansible.builtin.setup", "ansible.builtin.include_vars", "gpufleet.fleet.settings"}
    assert "validate.yml" not in (ROLE / "tasks" / "probe.yml").read_text()
    main = load_trusted(ROLE / "tasks" / "main.yml")
    assert main[0]["ansible.builtin.import_tasks"] == "validate.yml"


# --------------------------------------------------------------------------- argument specs


def test_argument_spec_documents_every_default_and_engine():
    """meta/argument_specs.yml has every default; container_engine's choices are the engines the OS files know."""
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert set(spec) == set(defaults)
    for name, option in spec.items():
        assert option["default"] == defaults[name], name
    engines = set()
    for path in (ROLE / "vars").glob("*.yml"):
        data = yaml.safe_load(path.read_text()) or {}
        engines |= set(data.get("__container_engines", {})) | set(data.get("__container_engines_refused", {}))
    assert engines and sorted(spec["container_engine"]["choices"]) == sorted(engines)


# --------------------------------------------------------------------------- the cases, known up front: one run a kind

for _host in HOSTS:
    for _settings in ({}, {"container_build_image": True}):
        VALIDATE.declare(_host, **_settings)
    for _settings in ({}, MIRROR):
        WITH_SOURCE.declare(_host, **_settings)
for _host in ("ubuntu2004", "ubuntu2204", "debian12"):
    VALIDATE.declare(_host, container_engine="podman")
VALIDATE.declare("debian12", **LAB_IMAGE)
for _settings in (PYPI_IMAGE, PYPI_MIRROR_IMAGE, PYTORCH_IMAGE):
    VALIDATE.declare("ubuntu2204", **_settings)
for _overrides, _ in BAD_INPUT:
    VALIDATE.declare("ubuntu2204", **_overrides)
for _overrides, _ in BAD_IMAGE_INPUT:
    VALIDATE.declare("ubuntu2204", container_build_image=True, **_overrides)
VALIDATE.declare("ubuntu2204", **MERGED_IMAGE_INPUT)
VALIDATE.declare("ubuntu2204", container_build_image=True, **MERGED_IMAGE_INPUT)
VALIDATE.declare("ubuntu2204", **EVERY_PROBLEM)
VALIDATE.declare("ubuntu2204", container_build_image=True)
VALIDATE.declare(
    "ubuntu2204", container_build_image=True, container_image_torch_variant="cpu", container_image_cuda_release="9.9"
)
VALIDATE.declare(ROCKY)
WITH_SOURCE.declare("debian12", **BAKED_MIRROR)
WITH_SOURCE.declare("ubuntu2204", **KEYED_MIRROR)
WITH_SOURCE.declare("ubuntu2204", **{**BAKED_MIRROR, "container_nvidia_toolkit_repository_keyring": PREVIOUS_KEYRING})
for _host in HOSTS:
    WITH_SOURCE.declare(_host)
    WITH_SOURCE.declare(_host, **MIRROR)
for _version in ("1.17.8-1", "1.18.1-1", "1.19.0~rc.5-1"):
    WITH_SOURCE.declare("ubuntu2204", container_nvidia_toolkit_version=_version)
    WITH_TASKS.declare("ubuntu2204", container_nvidia_toolkit_version=_version)
for _version in ("1.18.2-1", "1.19.1-1", "1.20.0-1"):
    WITH_TASKS.declare("ubuntu2204", container_nvidia_toolkit_version=_version)
for _settings in ({}, KUBERNETES, IMAGE_BUILD):
    WITH_TASKS.declare("ubuntu2204", **_settings)
