"""The pytorch role's rules: the wheels from the compatibility matrix, where pip gets them, its command line, the lock.

Run by roles/pytorch/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes; the host's
checks (the environment, the free space, the wheel source's listings, the wheel plan) are tasks/preflight.yml's.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import (
    Judgement,
    as_list,
    is_http_url,
    matches,
    shown,
    text,
    to_bool,
    to_int,
)

READS = (
    "pytorch_*",
    "cuda_release",
    "ansible_facts.distribution",
    "ansible_facts.distribution_version",
    "__pytorch_matrix_packages",
)

# name==version, optionally with extras: numpy==1.26.4, ray[default]==2.9.3
PIN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\[[A-Za-z0-9._,-]+\])?==[A-Za-z0-9][A-Za-z0-9.!+_-]*$"
# A line of a hash lock: name==version and at least one sha256 hash.
HASH_LINE = r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?==[^\s;]+(\s*;[^-]*)?(\s+--hash=sha256:[0-9a-f]{64})+$"
# Directories the environment must not be (python3 -m venv would fill them).
SYSTEM_DIRS = (
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib64",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/usr/local",
    "/var",
)


def unique(items: list[str]) -> list[str]:
    """Jinja's ``| unique``: the first of each, compared without case."""
    seen: set[str] = set()
    kept = []
    for item in items:
        if item.lower() not in seen:
            seen.add(item.lower())
            kept.append(item)
    return kept


def truncate(value: str, length: int) -> str:
    """Jinja's ``| truncate(length)``: cut at a word before ``length`` with '...', unless within 5 characters of it."""
    if len(value) <= length + 5:
        return value
    return value[: length - 3].rsplit(" ", 1)[0] + "..."


def project_pin(requirement: Any) -> str:
    """``name==version`` of a requirement or lock line, the name as pip compares it (lower case, runs of -_. one -)."""
    return re.sub(r"[-_.]+(?=[^=]*==)", "-", str(requirement).lower())


def lock_text(path: Any) -> str:
    """The hash lock on the controller, '' when ``path`` is not a file (the lookup ansible.builtin.file, stripped)."""
    if not isinstance(path, str) or not path or not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as lock:
        return lock.read().rstrip()


def lock_lines(lock: str) -> list[str]:
    """One requirement per line of the lock once continuations are joined, comments dropped."""
    lines = (re.sub(r"(^|\s)#.*$", "", line).strip() for line in lock.replace("\\\n", " ").splitlines())
    return [line for line in lines if line]


def resolve_wheels(j: Judgement) -> dict[str, Any]:
    """The release, variant and pins as the compatibility matrix resolves them (the lookup gpufleet.fleet.stack).

    An empty pytorch_release is the newest release whose wheels exist for the environment's Python (pytorch_python);
    pytorch_cuda_release follows the play's cuda_release unless set apart, and a reason about it then says so.
    """
    cuda_release = text(j["pytorch_cuda_release"])
    following = "cuda_release" in j.values and cuda_release == text(j["cuda_release"])
    facts = j.get("ansible_facts") or {}
    stack = j.stack(
        pytorch_release=text(j["pytorch_release"]),
        pytorch_cuda_release=cuda_release,
        pytorch_variant=text(j["pytorch_variant"]),
        pytorch_wheel_source=text(j["pytorch_wheel_source"]),
        torchvision=to_bool(j["pytorch_torchvision"]),
        torchaudio=to_bool(j["pytorch_torchaudio"]),
        distribution=facts.get("distribution", ""),
        os_version=facts.get("distribution_version", ""),
        python=text(j["pytorch_python"]),
        names={
            "pytorch_cuda_release": "pytorch_cuda_release (following cuda_release)"
            if following
            else "pytorch_cuda_release"
        },
    )
    pytorch = stack.get("pytorch") or {}
    j.set("__pytorch_stack", dict(pytorch, errors=stack["errors"]))
    j.set("__pytorch_release", pytorch.get("release", text(j["pytorch_release"])))
    j.set("__pytorch_cuda_release", pytorch.get("cuda_release", cuda_release))
    j.set("__pytorch_variant", pytorch.get("variant", text(j["pytorch_variant"])))
    j.set("__pytorch_matrix_pins", list(pytorch.get("pins", [])))
    # What torch.version.cuda must say: 12.1 for cu121, nothing for cpu.
    j.set("__pytorch_expected_cuda", pytorch.get("expected_cuda", ""))
    j.refuse(stack["errors"])
    return pytorch


def resolve_source(j: Judgement, pytorch: dict[str, Any]) -> None:
    """Where pip gets the wheels, its source options, and the listings that must hold the matrix's wheels."""
    j.set("__pytorch_venv", re.sub(r"/+$", "", text(j["pytorch_venv"])) or "/")
    # An explicit pytorch_index_url (a mirror) wins over the source's index ({variant} replaced).
    index = (text(j["pytorch_index_url"]) or pytorch.get("index_url", "")).replace("{variant}", j["__pytorch_variant"])
    index = j.set("__pytorch_index_url", re.sub(r"/+$", "", index))
    wheelhouse, extra_index = j["pytorch_wheelhouse_url"], j["pytorch_extra_index_url"]
    pins = j["__pytorch_matrix_pins"]
    j.set("__pytorch_requirements", pins + as_list(j["pytorch_extra_packages"]))
    if wheelhouse:
        args, urls = ["--no-index", "--find-links", wheelhouse], [wheelhouse]
    else:
        args = ["--index-url", index] + (["--extra-index-url", extra_index] if extra_index else [])
        urls = [index, extra_index]
    # pip refuses plain-http sources unless told to trust their host; an http URL in the settings is the operator's
    # choice (an internal mirror).
    hosts = unique([urlsplit(url).netloc for url in urls if matches(r"^http://[^/]+", url)])
    j.set("__pytorch_pip_source_args", args + [f"--trusted-host={host}" for host in hosts])
    j.set(
        "__pytorch_source_pages",
        [wheelhouse] if wheelhouse else [f"{index}/{re.sub(r'==.*$', '/', pin)}" for pin in pins],
    )


def resolve_plan(j: Judgement, lock: str) -> None:
    """The hash lock's lines (its text read on the controller), and what play 1's wheel plan (preflight.yml) gives pip.

    The plan resolves what the install would: the same source and extra options, and the lock's pins without their
    hashes (pip reads only metadata when no hash is required; every pin of the lock is then a requirement, so a
    dependency the lock lacks shows).
    """
    lines = j.set("__pytorch_hash_lines", lock_lines(lock))
    wheelhouse = j["pytorch_wheelhouse_url"]
    j.set(
        "__pytorch_plan_requirements",
        [re.sub(r"\s+--hash=\S+", "", line) for line in lines] if lines else j["__pytorch_requirements"],
    )
    j.set(
        "__pytorch_plan_pip_args",
        j["__pytorch_pip_source_args"]
        + as_list(j["pytorch_pip_extra_args"])
        + ["--timeout", text(j["pytorch_pip_timeout"]), "--retries", text(min(to_int(j["pytorch_pip_retries"]), 1))],
    )
    j.set(
        "__pytorch_plan_context",
        {
            "source": wheelhouse if wheelhouse else j["__pytorch_index_url"],
            "source_setting": "pytorch_wheelhouse_url" if wheelhouse else "pytorch_index_url",
            "hashes_file": j["pytorch_hashes_file"] if lines else "",
            "matrix_packages": j["__pytorch_matrix_packages"],
        },
    )


def check_sources(j: Judgement) -> None:
    """The index, the second index and the wheelhouse: http(s) URLs, and a wheelhouse alone."""
    wheelhouse, extra_index, index = j["pytorch_wheelhouse_url"], j["pytorch_extra_index_url"], j["__pytorch_index_url"]
    j.check(
        wheelhouse or is_http_url(index),
        f"""
        pytorch_index_url '{shown(j["pytorch_index_url"])}' is not an http(s) URL (rendered: '{index}'; PyTorch's own
        is https://download.pytorch.org/whl/{{variant}}, {{variant}} being the only placeholder, PyPI's
        https://pypi.org/simple; empty for the index of pytorch_wheel_source)""",
    )
    j.check(
        not extra_index or is_http_url(extra_index),
        f"""
        pytorch_extra_index_url '{shown(extra_index)}' is not an http(s) URL (for example https://pypi.org/simple)""",
    )
    j.check(
        not wheelhouse or is_http_url(wheelhouse),
        f"""
        pytorch_wheelhouse_url '{shown(wheelhouse)}' is not an http(s) URL
        (for example http://mirror.example.com/wheels/)""",
    )
    j.check(
        not wheelhouse or matches(".*/$", wheelhouse),
        f"""
        pytorch_wheelhouse_url '{shown(wheelhouse)}' must end with '/': it is the directory listing of the wheels
        (for example {shown(wheelhouse)}/)""",
    )
    j.check(
        not (wheelhouse and extra_index),
        """
        pytorch_extra_index_url is set but pytorch_wheelhouse_url makes pip use no index at all (--no-index):
        put the extra packages' wheels in the wheelhouse and empty pytorch_extra_index_url""",
    )


def check_environment(j: Judgement) -> None:
    """The environment's directory, its interpreter, and the extra packages: exact pins, none of the matrix's."""
    venv = j["pytorch_venv"]
    j.check(
        matches(r"^/[^\s]*$", venv) and j["__pytorch_venv"] not in SYSTEM_DIRS,
        f"""
        pytorch_venv '{shown(venv)}' must be an absolute path of its own, not / or a system directory such as /usr or
        /opt (for example /opt/gpufleet/venv)""",
    )
    python = j["pytorch_python"]
    j.check(
        matches(r"^/[^\s]+$", python),
        f"""
        pytorch_python '{shown(python)}' must be the absolute path of an interpreter (for example /usr/bin/python3)""",
    )
    extras = as_list(j["pytorch_extra_packages"])
    loose = [str(extra) for extra in extras if not matches(PIN, extra)]
    j.check(
        not loose,
        f"""
        pytorch_extra_packages must be exact pins name==version (as every host must get the same build):
        {", ".join(loose)}""",
    )
    names = [re.sub(r"[\[=<>!~; ].*$", "", str(extra)).lower().replace("_", "-") for extra in extras]
    matrix_packages = j["__pytorch_matrix_packages"]
    pinned = unique([name for name in names if name in matrix_packages])
    j.check(
        not pinned,
        f"""
        pytorch_extra_packages pins {", ".join(pinned)}, whose versions come from pytorch_release and
        files/compatibility.yml (turn torchvision or torchaudio off with pytorch_torchvision or pytorch_torchaudio)""",
    )


def check_lock(j: Judgement, lock: str) -> None:
    """The hash lock: required offline, present, every line a hashed pin, every requirement pinned by it."""
    hashes_file, lines = j["pytorch_hashes_file"], j["__pytorch_hash_lines"]
    j.check(
        not j["pytorch_wheelhouse_url"] or hashes_file or not to_bool(j["pytorch_require_hashes_offline"]),
        """
        pytorch_wheelhouse_url is an offline install, which gpufleet checks wheel by wheel: set pytorch_hashes_file to a
        requirements file with --hash=sha256 for every wheel (python3 files/wheelhouse_lock.py DIR writes one), or
        pytorch_require_hashes_offline to false""",
    )
    j.check(
        not hashes_file or lock,
        f"pytorch_hashes_file {shown(hashes_file)} does not exist on the controller, or is empty",
    )
    bad = [line for line in lines if not matches(HASH_LINE, line)]
    j.check(
        not bad,
        f"""
        pytorch_hashes_file {shown(hashes_file)} has lines that are not an exact pin with --hash=sha256:<64 hex digits>
        (pip --require-hashes refuses them): {truncate(bad[0], 120) if bad else ""}""",
    )
    # name==version of each lock line and of each requirement, names normalised as pip does.
    locked = [project_pin(re.sub(r"^([^=\s\[]+)(\[[^\]]*\])?==([^\s;]+).*$", r"\1==\3", line)) for line in lines]
    missing = [
        pin
        for pin in (
            project_pin(re.sub(r"\[[^\]]*\]", "", str(requirement))) for requirement in j["__pytorch_requirements"]
        )
        if pin not in locked
    ]
    projects = "|".join(re.escape(re.sub(r"==.*$", "", pin)) for pin in missing)
    j.check(
        not lines or not missing,
        f"""
        pytorch_hashes_file {shown(hashes_file)} does not pin {", ".join(missing)} (it pins
        {", ".join(pin for pin in locked if re.match(f"^({projects})==", pin)) or "no such project"}):
        write it again for this release""",
    )


def check_pip(j: Judgement) -> None:
    """pip's timeout and retries, and the free space the install needs: whole numbers."""
    j.check(
        to_int(j["pytorch_pip_timeout"]) > 0,
        f"pytorch_pip_timeout must be a whole number of seconds above 0, got '{shown(j['pytorch_pip_timeout'])}'",
    )
    j.check(
        to_int(j["pytorch_pip_retries"]) >= 0,
        f"pytorch_pip_retries must be a whole number, got '{shown(j['pytorch_pip_retries'])}'",
    )
    j.check(
        to_int(j["pytorch_min_free_disk_gb"]) >= 0,
        f"pytorch_min_free_disk_gb must be a whole number of GB, got '{shown(j['pytorch_min_free_disk_gb'])}'",
    )


def judge(j: Judgement) -> None:
    """The wheels, their source, pip's command line and the lock; what the matrix or pip would not take is refused."""
    lock = lock_text(j["pytorch_hashes_file"])
    resolve_source(j, resolve_wheels(j))
    resolve_plan(j, lock)
    check_sources(j)
    check_environment(j)
    check_lock(j, lock)
    check_pip(j)
