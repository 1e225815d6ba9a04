"""Resolve gpufleet's compatibility matrix into one stack: the only reader of files/compatibility.yml.

DOCUMENTATION is below; in short::

    lookup('gpufleet.fleet.stack', driver_branch='535', cuda_release='12.1',
           pytorch_release='2.5.1', distribution='Ubuntu')

returns one mapping::

    {"errors": [reasons, each naming the setting and what the matrix allows],
     "driver":  {"branch", "version", "fabricmanager", "sources": [for this distribution],
                 "lifecycle": {"designation", "end_of_life", "published", "past_end_of_life",
                               "successor": {...} or {}, "warning": text or ""}},
     "cuda":    {"release", "dashed", "toolkit_package", "toolkit_version", "component_version",
                 "min_driver", "pytorch_variant", "repositories", "repository_gap": text or ""},
     "cudnn":   {"version", "package_version", "packages"},
     "nccl":    {"version", "package_version", "packages"},
     "pytorch": {"release", "cuda_release", "variant", "variants", "expected_cuda", "label",
                 "torchvision", "torchaudio", "pins", "packages",
                 "source", "index_url",  # where the wheels come from (pytorch_wheel_sources)
                 "bundled": {"cudnn", "nccl"},  # the builds the wheels bring (see bundled_libraries)
                 "python": {"version", "origin", "releases"},  # the environment's Python (environment_python)
                 "default": bool},  # the release is the default for that Python (none was asked for)
     "gpus":    {"gpus": [per device ID], "warnings": [...]},  # the GPU-generation gate (gpu_generations)
     "known":   {"driver_branches", "cuda_releases", "pytorch_releases"}}

Empty settings take the matrix's defaults. A part that cannot be resolved is
empty (``{}``) and its reason is in ``errors``; the lookup itself never fails
on a setting, so that a role can list every wrong setting at once.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: stack
author: gpufleet maintainers (@gpufleet)
short_description: Resolve the compatibility matrix into one driver/CUDA/cuDNN/NCCL/PyTorch stack
description:
  - Reads files/compatibility.yml of this collection (the only place that does) and returns one resolved stack
    for the given choices, with a list of reasons when a choice is not in the matrix.
options:
  driver_branch:
    description: NVIDIA driver branch, e.g. "535"; empty for none.
    type: str
    default: ""
  driver_version:
    description: Exact driver release; empty for the branch's default release.
    type: str
    default: ""
  cuda_release:
    description: CUDA release, e.g. "12.1"; empty for the matrix default.
    type: str
    default: ""
  pytorch_release:
    description: PyTorch release; empty for the matrix default.
    type: str
    default: ""
  pytorch_cuda_release:
    description: CUDA release of the wheels; empty follows cuda_release.
    type: str
    default: ""
  pytorch_variant:
    description: Wheel variant (cu121, cpu); empty for the CUDA release's variant.
    type: str
    default: ""
  pytorch_wheel_source:
    description: >-
      Where the wheels come from, a key of pytorch_wheel_sources (pytorch, download.pytorch.org with +variant labels;
      pypi, PyPI or a mirror of it, unlabelled); empty for pytorch.
    type: str
    default: ""
  distribution:
    description: ansible_facts.distribution of the host (driver sources and the OS's Python differ per OS).
    type: str
    default: ""
  os_version:
    description: >-
      ansible_facts.distribution_version of the host (Ubuntu 20.04, Debian 12.5), for the OS's python3 (os_pythons).
    type: str
    default: ""
  python:
    description: >-
      The interpreter the PyTorch environment is made with (pytorch_python); empty or /usr/bin/python3 is the OS's
      python3. The default PyTorch release is the newest whose wheels exist for its Python, and a release without them
      is a reason.
    type: str
    default: ""
  gpu_device_ids:
    description: >-
      The host's NVIDIA PCI device IDs (preflight_report.gpu_device_ids, 0x2330); judged against driver_branch and
      cuda_release (gpu_architectures, gpu_devices), the reasons among errors, unknown IDs among gpus.warnings.
    type: list
    elements: str
    default: []
  gpu_addresses:
    description: The PCI addresses of those GPUs, in the same order (for the messages).
    type: list
    elements: str
    default: []
  repository_os:
    description: The host's directory of NVIDIA's CUDA repository (ubuntu2204, debian12); empty for no check of it.
    type: str
    default: ""
  today:
    description: The date the end of life is judged on (YYYY-MM-DD); empty for the controller's date.
    type: str
    default: ""
  torchvision:
    description: Pin torchvision with torch.
    type: bool
    default: true
  torchaudio:
    description: Pin torchaudio with torch.
    type: bool
    default: true
  names:
    description: >-
      The caller's names of the settings, for the reasons (keys cuda_release, pytorch_release, pytorch_cuda_release,
      pytorch_variant, pytorch_wheel_source).
    type: dict
    default: {}
"""

RETURN = r"""
_raw:
  description: One mapping (a list of one element, as lookups return).
  type: list
  elements: dict
"""

import datetime
import re
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

MATRIX_FILE = Path(__file__).resolve().parents[2] / "files" / "compatibility.yml"
_VARIANT = re.compile(r"^cu(\d+)(\d)$")


# Parsed once per file version: a role's `vars: lookup(...)` is templated at
# every reference (several times per host and task). Every task of every host
# is a fresh worker process, so the parse itself counts at fleet scale:
# libyaml's parser when PyYAML has it (28 ms -> 3 ms here, docs/scale.md).
_LOADED: dict[Path, tuple[float, Any]] = {}
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_matrix(path: Path = MATRIX_FILE) -> dict[str, Any]:
    """The matrix, as written (keys are strings); read again only when the file changed. Not to be modified."""
    try:
        mtime = path.stat().st_mtime
        if path not in _LOADED or _LOADED[path][0] != mtime:
            _LOADED[path] = (mtime, yaml.load(path.read_text(), Loader=_YAML_LOADER))  # noqa: S506 (a safe loader)
        data = _LOADED[path][1]
    except (OSError, yaml.YAMLError) as error:
        raise AnsibleLookupError(
            f"gpufleet.fleet.stack: cannot read the compatibility matrix {path}: {error}"
        ) from error
    if not isinstance(data, dict) or not {"driver_branches", "cuda_releases", "pytorch_releases", "defaults"} <= set(
        data
    ):
        raise AnsibleLookupError(f"gpufleet.fleet.stack: {path} is not gpufleet's compatibility matrix")
    return data


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def expected_cuda(variant: str) -> str:
    """cu121 -> 12.1, cu118 -> 11.8; cpu -> ''."""
    match = _VARIANT.match(variant)
    return f"{match.group(1)}.{match.group(2)}" if match else ""


# The settings the reasons name, unless the caller renames them.
SETTING_NAMES = {
    "cuda_release": "cuda_release",
    "pytorch_release": "pytorch_release",
    "pytorch_cuda_release": "pytorch_cuda_release",
    "pytorch_variant": "pytorch_variant",
    "pytorch_wheel_source": "pytorch_wheel_source",
}
_VARIANT_FORM = re.compile(r"^(cpu|cu[0-9]{3})$")


def _span(releases: list[str]) -> str:
    """2.1.0 ... 2.5.1 for a long run (matrix order is release order), else the list."""
    return f"{releases[0]} ... {releases[-1]}" if len(releases) > 2 else ", ".join(releases)


# What "bundled" says where the matrix records no build for the variant, and
# for the CPU wheels (which carry neither library).
UNKNOWN = "unknown"
NO_CUDA = "none"


# Where torch's wheels come from: an empty setting is PyTorch's own index.
DEFAULT_WHEEL_SOURCE = "pytorch"
# For a matrix without pytorch_wheel_sources (the entries of files/compatibility.yml).
WHEEL_SOURCES = {
    "pytorch": {"index_url": "https://download.pytorch.org/whl/{variant}", "local_version": True},
    "pypi": {"index_url": "https://pypi.org/simple", "local_version": False},
}


def wheel_sources(matrix: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The wheel sources the matrix knows (pytorch_wheel_sources), by name."""
    return {
        str(key): dict(value or {}) for key, value in (matrix.get("pytorch_wheel_sources") or WHEEL_SOURCES).items()
    }


def _pypi_check(
    torches: dict[str, Any],
    release: str,
    row: dict[str, Any],
    variant: str,
    origin: str,
    names: dict[str, str],
    source: str,
    pytorch_index: str,
) -> list[str]:
    """Why a source without local version labels (PyPI) cannot give these wheels; empty when it can.

    Such a source has one build per release (the row's ``pypi``), and no CPU-only build on Linux.
    """
    setting = f"{names['pytorch_wheel_source']} {source}"
    way_out = (
        f"use {names['pytorch_wheel_source']} {DEFAULT_WHEEL_SOURCE} ({pytorch_index.replace('{variant}', variant)})"
    )
    if variant == "cpu":
        return [
            f"torch {release} on PyPI ({setting}) has no CPU-only build: PyPI's Linux x86_64 torch wheels are CUDA "
            f"builds ({_text(row.get('pypi')) or 'none recorded'} for {release}); {way_out} for the cpu wheels"
        ]
    built = _text(row.get("pypi"))
    if built == variant:
        return []
    on_pypi = [key for key, value in torches.items() if _text(value.get("pypi")) == variant]
    return [
        f"torch {release} on PyPI ({setting}) is "
        + (f"the {built} build, not {variant}" if built else f"not recorded as a {variant} build")
        + f" ({origin}): {way_out}"
        + (
            f", or a release PyPI publishes as {variant}: {_span(on_pypi)}"
            if on_pypi
            else f"; files/compatibility.yml records no release PyPI publishes as {variant}"
        )
    ]


def bundled_libraries(row: dict[str, Any], variant: str) -> dict[str, str]:
    """The cuDNN and NCCL builds torch's wheels of this variant bring with them (torch's own, not the system's).

    From the release's ``bundled`` entry for the variant; "unknown" where the
    matrix records none (never a guess from another variant), "none" for cpu.
    """
    if variant == "cpu":
        return {"cudnn": NO_CUDA, "nccl": NO_CUDA}
    recorded = (row.get("bundled") or {}).get(variant) or {}
    return {name: _text(recorded.get(name)) or UNKNOWN for name in ("cudnn", "nccl")}


# --- the Python the environment is made with ---------------------------------

# The interpreter path that is the OS's own python3 (Debian's and Ubuntu's
# python3 package), and the form of a versioned interpreter's name.
OS_PYTHON3 = "/usr/bin/python3"
_VERSIONED_PYTHON = re.compile(r"(?:^|/)python(3\.[0-9]+)$")


def os_python(matrix: dict[str, Any], distribution: Any = "", os_version: Any = "") -> str:
    """The OS's python3 (matrix os_pythons): Ubuntu 20.04 -> 3.8; Debian 12.5 -> its major version's, 3.11; ''
    unknown."""
    pythons = {str(key): value for key, value in (matrix.get("os_pythons") or {}).items()}
    distribution, version = _text(distribution), _text(os_version)
    for key in (f"{distribution} {version}", f"{distribution} {version.split('.', maxsplit=1)[0]}"):
        row = pythons.get(key)
        if row:
            return _text(row.get("python") if isinstance(row, dict) else row)
    return ""


def environment_python(
    matrix: dict[str, Any], interpreter: Any = "", distribution: Any = "", os_version: Any = ""
) -> dict[str, str]:
    """The Python (X.Y) the environment is made with, and where that comes from; version '' when not known.

    /usr/bin/python3 (or no interpreter) is the OS's python3 (os_pythons); a
    versioned name (/usr/bin/python3.9) is that version; any other path is not
    known before the host runs it (the wheel check of the pytorch role's
    preflight then judges it).
    """
    path = _text(interpreter)
    os_name = " ".join(part for part in (_text(distribution), _text(os_version)) if part)
    if path in ("", OS_PYTHON3):
        version = os_python(matrix, distribution, os_version)
        return {
            "version": version,
            "origin": f"{OS_PYTHON3}, the python3 of {os_name or 'the OS'}"
            + ("" if version else " (files/compatibility.yml os_pythons does not know it)"),
        }
    match = _VERSIONED_PYTHON.search(path)
    return {"version": match.group(1) if match else "", "origin": path}


def release_pythons(matrix: dict[str, Any], release: str) -> list[str]:
    """The Pythons (X.Y) the release's wheels exist for (matrix pytorch_pythons); [] when not recorded."""
    return [_text(p) for p in (matrix.get("pytorch_pythons") or {}).get(release) or []]


def releases_for_python(matrix: dict[str, Any], python: str) -> list[str]:
    """The releases (matrix order) whose wheels exist for this Python."""
    return [str(key) for key in matrix["pytorch_releases"] if python in release_pythons(matrix, str(key))]


def python_gap(matrix: dict[str, Any], release: str, python: str) -> bool:
    """True when the release's Pythons are recorded and this (known) Python is not one of them."""
    recorded = release_pythons(matrix, release)
    return bool(python and recorded and python not in recorded)


def default_release(matrix: dict[str, Any], python: str = "") -> str:
    """The release gpufleet installs when none is asked for: the newest up to defaults.pytorch_release whose wheels
    exist for this Python; defaults.pytorch_release when the Python is not known; '' when no release has it."""
    ceiling = _text(matrix["defaults"].get("pytorch_release"))
    if not python:
        return ceiling
    order = [str(key) for key in matrix["pytorch_releases"]]
    upto = order[: order.index(ceiling) + 1] if ceiling in order else order
    fitting = [key for key in releases_for_python(matrix, python) if key in upto]
    return fitting[-1] if fitting else ""


def resolve_pytorch(
    matrix: dict[str, Any],
    release: Any,
    cuda_release: Any,
    variant: Any,
    *,
    torchvision: bool,
    torchaudio: bool,
    names: dict[str, str] | None,
    cuda_follows: bool,
    wheel_source: Any,
    python: dict[str, str] | None,
) -> dict[str, Any]:
    """The PyTorch wheels for these choices: release, variant, pins, the CUDA torch must report, where they come
    from; or reasons.

    ``cuda_release`` empty takes the matrix default; ``cuda_follows`` says it
    came from the CUDA setting (its own reason is given there, not twice).
    ``wheel_source`` is a key of the matrix's pytorch_wheel_sources (empty:
    pytorch); a source without local versions (pypi) pins torch==2.3.1, not
    torch==2.3.1+cu121, and has only the build the release's row names.
    ``python`` is the environment's Python (environment_python): an empty
    release is the newest whose wheels exist for it, and a release without
    wheels for it is a reason.
    """
    names = {**SETTING_NAMES, **(names or {})}
    cudas = {str(key): value for key, value in matrix["cuda_releases"].items()}
    torches = {str(key): value for key, value in matrix["pytorch_releases"].items()}
    defaults = matrix["defaults"]
    python = dict(python or {})
    python_version = _text(python.get("version"))
    python_text = f"Python {python_version} ({_text(python.get('origin'))})"
    asked_release = _text(release)
    release = asked_release or default_release(matrix, python_version)
    cuda_release = _text(cuda_release) or _text(defaults.get("cuda_release"))
    asked = _text(variant)
    cuda_row = cudas.get(cuda_release)
    variant = asked or _text((cuda_row or {}).get("pytorch_variant"))
    row = torches.get(release)
    with_variant = [key for key, value in torches.items() if variant in value.get("variants", [])]
    known_variants = list(dict.fromkeys(v for value in torches.values() for v in value.get("variants", [])))
    origin = (
        f"{names['pytorch_variant']} {variant}"
        if asked
        else f"the variant of CUDA {cuda_release}, {names['pytorch_cuda_release']}"
    )
    sources = wheel_sources(matrix)
    source_name = _text(wheel_source) or DEFAULT_WHEEL_SOURCE
    source = sources.get(source_name)
    errors: list[str] = []
    if not release:
        pythons = sorted({p for key in torches for p in release_pythons(matrix, key)}, key=_version_tuple)
        errors.append(
            f"no PyTorch release of files/compatibility.yml has wheels for {python_text} (they exist for Python "
            f"{', '.join(pythons)}): make the environment with such an interpreter (pytorch_python, "
            "pytorch_python_packages)"
        )
        return {"errors": errors}
    if python_gap(matrix, release, python_version):
        fitting = releases_for_python(matrix, python_version)
        errors.append(
            f"{names['pytorch_release']} {release}: torch {release} has no wheels for {python_text}, only for "
            f"Python {', '.join(release_pythons(matrix, release))}; "
            + (
                f"choose a release whose wheels exist for Python {python_version}: {_span(fitting)} (or leave "
                f"{names['pytorch_release']} empty for the newest of them, {fitting[-1]})"
                if fitting
                else f"no release of files/compatibility.yml has wheels for Python {python_version}"
            )
            + f", or make the environment with an interpreter torch {release} has wheels for (pytorch_python, "
            "pytorch_python_packages)"
        )
    if source is None:
        errors.append(
            f"{names['pytorch_wheel_source']} '{source_name}' is not a wheel source gpufleet knows "
            f"(files/compatibility.yml lists {', '.join(sources)})"
        )
    if row is None:
        errors.append(
            f"{names['pytorch_release']} '{release}' is not a PyTorch release gpufleet knows "
            f"(files/compatibility.yml lists {_span(list(torches))}"
            + (f"; {variant} wheels exist for torch {_span(with_variant)})" if with_variant else ")")
        )
    if asked and not _VARIANT_FORM.match(asked):
        errors.append(
            f"{names['pytorch_variant']} '{asked}' is not a wheel variant: cpu or cuXYZ "
            f"(files/compatibility.yml knows {', '.join(known_variants)})"
        )
        return {"errors": errors}
    if variant != "cpu" and cuda_row is None:
        # Said once: by the CUDA setting this release follows, else here.
        if not cuda_follows:
            errors.append(
                f"{names['pytorch_cuda_release']} '{cuda_release}' is not a CUDA release gpufleet knows "
                f"(files/compatibility.yml lists {', '.join(cudas)}); set {names['pytorch_variant']}=cpu "
                "for a CPU-only environment"
            )
        return {"errors": errors}
    if not variant:
        errors.append(
            f"files/compatibility.yml gives CUDA {cuda_release} no pytorch_variant: set {names['pytorch_variant']}"
        )
        return {"errors": errors}
    if variant != "cpu" and variant != _text(cuda_row.get("pytorch_variant")):
        wanted = _text(cuda_row.get("pytorch_variant")) or "?"
        errors.append(
            f"{names['pytorch_variant']} {variant} does not match CUDA {cuda_release} "
            f"({names['pytorch_cuda_release']}): files/compatibility.yml gives CUDA {cuda_release} the "
            f"{wanted} wheels; use {wanted}, or cpu for a CPU-only environment"
        )
    if row is not None and variant not in row.get("variants", []):
        errors.append(
            f"torch {release} is published for {', '.join(row.get('variants', []))} only, not {variant} "
            f"({origin}; {names['pytorch_release']} {release})"
            + (
                f"; files/compatibility.yml: {variant} wheels exist for torch {_span(with_variant)}"
                if with_variant
                else ""
            )
        )
    if not errors and not source.get("local_version", True):
        pytorch_index = _text((sources.get(DEFAULT_WHEEL_SOURCE) or {}).get("index_url")) or "PyTorch's index"
        errors += _pypi_check(torches, release, row, variant, origin, names, source_name, pytorch_index)
    if errors:
        return {"errors": errors}
    label = f"+{variant}" if source.get("local_version", True) else ""
    pins = [f"torch=={release}{label}"]
    for name, wanted in (("torchvision", torchvision), ("torchaudio", torchaudio)):
        if wanted and _text(row.get(name)):
            pins.append(f"{name}=={_text(row.get(name))}{label}")
    return {
        "errors": [],
        "release": release,
        "cuda_release": cuda_release,
        "variant": variant,
        "variants": list(row.get("variants", [])),
        "expected_cuda": expected_cuda(variant),
        "label": label,
        "torchvision": _text(row.get("torchvision")),
        "torchaudio": _text(row.get("torchaudio")),
        "pins": pins,
        "packages": ["torch", "torchvision", "torchaudio"],
        "source": source_name,
        "index_url": _text(source.get("index_url")).replace("{variant}", variant),
        "bundled": bundled_libraries(row, variant),
        "python": {
            "version": python_version,
            "origin": _text(python.get("origin")),
            "releases": releases_for_python(matrix, python_version) if python_version else [],
        },
        "default": not asked_release,
    }


# --- driver branch lifecycle -------------------------------------------------

_MONTH = re.compile(r"^([0-9]{4})-([0-9]{2})$")
LTSB = "Long Term Support Branch"


def _version_tuple(version: str) -> tuple[int, ...]:
    """535.261.03 -> (535, 261, 3); non-numeric parts count as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def _today(today: Any = "") -> datetime.date:
    text = _text(today)
    try:
        return datetime.date.fromisoformat(text) if text else datetime.date.today()
    except ValueError as error:
        raise AnsibleLookupError(f"gpufleet.fleet.stack: today '{text}' is not a date (YYYY-MM-DD)") from error


def past_end_of_life(end_of_life: Any, today: datetime.date) -> bool:
    """True once the month of end_of_life (YYYY-MM) is over; False for an empty or malformed one."""
    match = _MONTH.match(_text(end_of_life))
    if not match:
        return False
    year, month = int(match.group(1)), int(match.group(2))
    return (today.year, today.month) > (year, month)


def lifecycle(
    matrix: dict[str, Any],
    branch: str,
    cuda_release: str = "",
    distribution: str = "",
    today: datetime.date | None = None,
) -> dict[str, Any]:
    """A branch's designation and end of life, whether it is past it, and the supported Long Term Support
    Branch that runs the same CUDA release (its default release at least the release's minimum driver),
    with the warning play 1 gives (empty while the branch is supported)."""
    today = today or datetime.date.today()
    branches = {str(key): value for key, value in matrix["driver_branches"].items()}
    cudas = {str(key): value for key, value in matrix["cuda_releases"].items()}
    row = (branches.get(branch) or {}).get("lifecycle") or {}
    info = {
        "designation": _text(row.get("designation")),
        "end_of_life": _text(row.get("end_of_life")),
        "published": _text(row.get("published")),
        "past_end_of_life": past_end_of_life(row.get("end_of_life"), today),
        "successor": {},
        "warning": "",
    }
    if not info["past_end_of_life"]:
        return info
    min_driver = _text((cudas.get(cuda_release) or {}).get("min_driver"))
    for name, other in branches.items():
        other_life = other.get("lifecycle") or {}
        if name == branch or _text(other_life.get("designation")) != LTSB:
            continue
        if past_end_of_life(other_life.get("end_of_life"), today):
            continue
        if min_driver and _version_tuple(_text(other.get("default_version"))) < _version_tuple(min_driver):
            continue
        info["successor"] = {
            "branch": name,
            "version": _text(other.get("default_version")),
            "end_of_life": _text(other_life.get("end_of_life")),
            "published": _text(other_life.get("published")),
            "sources": list((other.get("sources") or {}).get(distribution, [])),
        }
    cuda_part = f"CUDA {cuda_release}" if cuda_release else "the same CUDA release"
    text = (
        f"NVIDIA driver branch {branch} ({info['designation'] or 'no designation'}) is past its end of life "
        f"({info['end_of_life']}, {info['published']})"
    )
    successor = info["successor"]
    if successor:
        text += (
            f": branch {successor['branch']}, the {LTSB} supported until {successor['end_of_life']} "
            f"({successor['published']}), runs {cuda_part} too"
        )
        if successor["sources"]:
            text += (
                f", on {distribution} from source {' or '.join(successor['sources'])} (nvidia_driver_source); "
                f"move to it with playbooks/upgrade-driver.yml -e upgrade_driver_version={successor['version']}"
            )
        else:
            text += f", but no source gpufleet knows offers it on {distribution or 'this OS'}"
    else:
        text += f": the compatibility matrix has no supported {LTSB} that runs {cuda_part}"
    info["warning"] = text
    return info


def repository_gap(matrix: dict[str, Any], cuda_release: str, repository_os: str) -> str:
    """Why NVIDIA's CUDA repository directory ``repository_os`` cannot serve this release; empty when it can
    (or when the release or the directory is not given)."""
    cudas = {str(key): value for key, value in matrix["cuda_releases"].items()}
    row = cudas.get(cuda_release)
    if not row or not repository_os:
        return ""
    published = [str(item) for item in row.get("repositories") or []]
    if repository_os in published:
        return ""
    has = [name for name, other in cudas.items() if repository_os in [str(i) for i in other.get("repositories") or []]]
    directory = (matrix.get("cuda_repositories") or {}).get(repository_os) or {}
    oldest = _text(directory.get("oldest_release"))
    return (
        f"NVIDIA publishes no CUDA {cuda_release} (cuda-toolkit-{cuda_release.replace('.', '-')}) for "
        f"{repository_os}: its {repository_os} repository "
        + (f"starts at CUDA {oldest} and " if oldest else "")
        + f"has {'CUDA ' + ', '.join(has) if has else 'none'} of the releases the compatibility matrix lists "
        f"({', '.join(cudas)}); CUDA {cuda_release} is published for {', '.join(published) or 'no directory'}"
    )


# --- the GPU-generation gate -------------------------------------------------

_DEVICE_ID = re.compile(r"^(?:0[xX])?([0-9a-fA-F]{4})$")
_DEVICE_RANGE = re.compile(r"^([0-9A-F]{4})-([0-9A-F]{4})$")


def device_id(value: Any) -> str:
    """A PCI device ID as the matrix keys it: 0x2330 (sysfs), 2330, 0X2330 -> '2330'; '' when it is none."""
    match = _DEVICE_ID.match(_text(value))
    return match.group(1).upper() if match else ""


def gpu_device(matrix: dict[str, Any], device: str) -> dict[str, Any]:
    """The matrix's entry for a device ID ('2330'): an exact ID first, then a range ("2900-29FF"); {} when unknown."""
    devices = {str(key).upper(): value for key, value in (matrix.get("gpu_devices") or {}).items()}
    if device in devices:
        return dict(devices[device] or {})
    for key, value in devices.items():
        bounds = _DEVICE_RANGE.match(key)
        if bounds and int(bounds.group(1), 16) <= int(device, 16) <= int(bounds.group(2), 16):
            return dict(value or {})
    return {}


def _branch_number(branch: Any) -> int | None:
    text = _text(branch)
    return int(text) if text.isdigit() else None


def _counted(name: str, device: str, architecture: str, addresses: list[str]) -> str:
    """'the NVIDIA B200 (PCI ID 10de:2901, Blackwell; 8 GPUs: 0000:18:00.0, ...)'."""
    where = ""
    if addresses:
        shown = ", ".join(addresses[:3]) + (", ..." if len(addresses) > 3 else "")
        where = f"; {len(addresses)} GPU{'s' if len(addresses) != 1 else ''}: {shown}"
    return f"the {name} (PCI ID 10de:{device.lower()}, {architecture}{where})"


def gpu_generations(
    matrix: dict[str, Any],
    device_ids: Any = (),
    driver_branch: Any = "",
    cuda_release: Any = "",
    addresses: Any = (),
    names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Whether the host's GPUs can run this driver branch and CUDA release: the compatibility matrix's
    gpu_architectures / gpu_devices against the host's PCI device IDs (preflight_report.gpu_device_ids).

    Returns ``{"gpus": [one entry per device ID: device_id, name, architecture, min_driver_branch,
    last_driver_branch, min_cuda, addresses], "errors": [...], "warnings": [...]}``. An error names the GPU,
    its architecture, the minimum (or last) branch or CUDA release and the fix; it starts with the setting
    (``nvidia_driver_branch`` / ``cuda_release``, renamed by ``names``) so that each role gives its own. A
    device ID the matrix does not know is a warning, not an error. An empty driver_branch or cuda_release
    is not judged.
    """
    names = {**SETTING_NAMES, "driver_branch": "nvidia_driver_branch", **(names or {})}
    ids = [_text(item) for item in (device_ids or [])]
    places = [_text(item) for item in (addresses or [])]
    places = places if len(places) == len(ids) else [""] * len(ids)
    architectures = {str(key): dict(value or {}) for key, value in (matrix.get("gpu_architectures") or {}).items()}
    published = matrix.get("gpu_published") or {}
    branches = [str(key) for key in matrix.get("driver_branches") or {}]
    cudas = [str(key) for key in matrix.get("cuda_releases") or {}]
    branch, release = _text(driver_branch), _text(cuda_release)
    branch_number = _branch_number(branch)

    # One entry per device ID, in the order the host lists them.
    seen: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for raw, place in zip(ids, places, strict=True):
        device = device_id(raw)
        if not device:
            warnings.append(
                f"GPU {place or '?'} reports PCI device ID '{raw}', which is not one (4 hex digits): "
                "its architecture is not checked"
            )
            continue
        if device not in seen:
            entry = gpu_device(matrix, device)
            arch = architectures.get(_text(entry.get("architecture")), {})
            seen[device] = {
                "device_id": device,
                "name": _text(entry.get("name")),
                "architecture": _text(entry.get("architecture")) if arch else "",
                "min_driver_branch": _text(entry.get("min_driver_branch")) or _text(arch.get("min_driver_branch")),
                "last_driver_branch": _text(arch.get("last_driver_branch")),
                "min_cuda": _text(entry.get("min_cuda")) or _text(arch.get("min_cuda")),
                "own_minimum": bool(_text(entry.get("min_driver_branch"))),
                "addresses": [],
            }
        if place:
            seen[device]["addresses"].append(place)

    errors: list[str] = []
    for gpu in seen.values():
        device, where = gpu["device_id"], gpu["addresses"]
        if not gpu["architecture"]:
            many = len(where) > 1
            warnings.append(
                f"{f'{len(where)} GPUs' if many else 'a GPU'} with PCI ID 10de:{device.lower()}"
                + (f" ({', '.join(where)})" if where else "")
                + f" {'are' if many else 'is'} not in the compatibility matrix (files/compatibility.yml "
                f"gpu_devices): the driver branch and CUDA release {'they need' if many else 'it needs'}"
                " are not checked; add the device ID with its architecture, from NVIDIA's supported-GPU list "
                "of the driver release, to gpu_devices"
            )
            continue
        gpu_text = _counted(gpu["name"] or "GPU", device, gpu["architecture"], where)
        minimum = _branch_number(gpu["min_driver_branch"])
        last = _branch_number(gpu["last_driver_branch"])
        if branch_number is not None and minimum is not None and branch_number < minimum:
            fits = [
                b
                for b in branches
                if _branch_number(b) is not None
                and _branch_number(b) >= minimum
                and (last is None or _branch_number(b) <= last)
            ]
            who = (
                f"the {gpu['name']} needs driver branch {minimum} or newer, the first whose supported-GPU list "
                f"names it ({_text(published.get('devices'))})"
                if gpu["own_minimum"]
                else f"{gpu['architecture']} needs driver branch {minimum} or newer "
                f"({_text(published.get('architectures'))})"
            )
            errors.append(
                f"{names['driver_branch']} {branch} cannot drive {gpu_text}: {who}; "
                + (
                    f"set {names['driver_branch']} to {' or '.join(fits)}"
                    if fits
                    else f"no driver branch of the compatibility matrix ({', '.join(branches)}) drives it: leave "
                    "this host out of the run until the matrix has a stack for it"
                )
            )
        if branch_number is not None and last is not None and branch_number > last:
            fits = [
                b
                for b in branches
                if _branch_number(b) is not None and minimum is not None and minimum <= _branch_number(b) <= last
            ]
            errors.append(
                f"{names['driver_branch']} {branch} no longer drives {gpu_text}: branch {last} is the last "
                f"for {gpu['architecture']} ({_text(published.get('architectures'))}); "
                + (
                    f"set {names['driver_branch']} to {' or '.join(fits)}"
                    if fits
                    else "no driver branch of the compatibility matrix drives it"
                )
            )
        needed = gpu["min_cuda"]
        if release and needed and _version_tuple(release) < _version_tuple(needed):
            fits = [c for c in cudas if _version_tuple(c) >= _version_tuple(needed)]
            errors.append(
                f"{names['cuda_release']} {release} does not support {gpu_text}: {gpu['architecture']} needs "
                f"CUDA {needed} or newer ({_text(published.get('architectures'))}), and torch's "
                f"cu{release.replace('.', '')} wheels are built for CUDA {release}; "
                + (
                    f"set {names['cuda_release']} to {' or '.join(fits)}"
                    if fits
                    else f"the compatibility matrix has no such CUDA release (it lists {', '.join(cudas)}): leave "
                    "this host out of the run until it has one"
                )
            )
    gpus = [{key: value for key, value in gpu.items() if key != "own_minimum"} for gpu in seen.values()]
    return {"gpus": gpus, "errors": errors, "warnings": warnings}


def resolve(
    matrix: dict[str, Any],
    driver_branch: Any = "",
    driver_version: Any = "",
    cuda_release: Any = "",
    pytorch_release: Any = "",
    pytorch_cuda_release: Any = "",
    pytorch_variant: Any = "",
    distribution: Any = "",
    torchvision: bool = True,
    torchaudio: bool = True,
    names: dict[str, str] | None = None,
    repository_os: Any = "",
    today: Any = "",
    pytorch_wheel_source: Any = "",
    os_version: Any = "",
    python: Any = "",
    gpu_device_ids: Any = (),
    gpu_addresses: Any = (),
) -> dict[str, Any]:
    """One stack for these choices, or its reasons in ``errors``.

    ``names`` renames the settings in the reasons (the container role's
    container_image_torch_release is this lookup's pytorch_release).
    ``distribution``/``os_version`` and ``python`` (the interpreter the
    environment is made with) give the Python the default PyTorch release is
    chosen for; ``gpu_device_ids`` (with their ``gpu_addresses``) are judged
    against the driver branch and CUDA release (gpu_generations), its
    reasons among ``errors``, its findings under ``gpus``.
    """
    names = {**SETTING_NAMES, **(names or {})}
    errors: list[str] = []
    release = _text(cuda_release) or _text(matrix["defaults"].get("cuda_release"))
    branches = {str(key): value for key, value in matrix["driver_branches"].items()}
    cudas = {str(key): value for key, value in matrix["cuda_releases"].items()}
    torches = {str(key): value for key, value in matrix["pytorch_releases"].items()}
    known = {"driver_branches": list(branches), "cuda_releases": list(cudas), "pytorch_releases": list(torches)}

    driver: dict[str, Any] = {}
    branch, version = _text(driver_branch), _text(driver_version)
    if branch:
        row = branches.get(branch)
        if row is None:
            errors.append(
                f"nvidia_driver_branch '{branch}' is not a driver branch gpufleet knows "
                f"(the compatibility matrix lists {', '.join(branches)})"
            )
        else:
            version = version or _text(row.get("default_version"))
            if not re.match(rf"^{re.escape(branch)}\.[0-9]+(\.[0-9]+)?$", version):
                errors.append(
                    f"nvidia_driver_version '{version}' is not a release of branch {branch} (expected the form "
                    f"{branch}.NNN.NN, for example {row.get('default_version')})"
                )
            driver = {
                "branch": branch,
                "version": version,
                "fabricmanager": bool(row.get("fabricmanager")),
                "sources": list((row.get("sources") or {}).get(_text(distribution), [])),
                "lifecycle": lifecycle(
                    matrix, branch, release if release in cudas else "", _text(distribution), _today(today)
                ),
            }

    cuda: dict[str, Any] = {}
    row = cudas.get(release)
    if row is None:
        errors.append(
            f"{names['cuda_release']} '{release}' is not a CUDA release gpufleet knows "
            f"(the compatibility matrix lists {', '.join(cudas)})"
        )
    else:
        cuda = {
            "release": release,
            "dashed": release.replace(".", "-"),
            "toolkit_package": "cuda-toolkit-" + release.replace(".", "-"),
            "toolkit_version": _text(row.get("toolkit_version")),
            "component_version": _text(row.get("component_version")),
            "min_driver": _text(row.get("min_driver")),
            "pytorch_variant": _text(row.get("pytorch_variant")),
            "repositories": [str(item) for item in row.get("repositories") or []],
            "repository_gap": repository_gap(matrix, release, _text(repository_os)),
        }
    cudnn = dict(row.get("cudnn") or {}) if row else {}
    nccl = dict(row.get("nccl") or {}) if row else {}

    pytorch = resolve_pytorch(
        matrix,
        pytorch_release,
        pytorch_cuda_release or release,
        pytorch_variant,
        torchvision=torchvision,
        torchaudio=torchaudio,
        names=names,
        cuda_follows=not _text(pytorch_cuda_release),
        wheel_source=pytorch_wheel_source,
        python=environment_python(matrix, python, distribution, os_version),
    )
    errors += pytorch.pop("errors")

    gpus = gpu_generations(matrix, gpu_device_ids, branch, release if release in cudas else "", gpu_addresses, names)
    errors += gpus.pop("errors")

    return {
        "errors": errors,
        "driver": driver,
        "cuda": cuda,
        "cudnn": cudnn,
        "nccl": nccl,
        "pytorch": pytorch,
        "gpus": gpus,
        "known": known,
    }


class LookupModule(LookupBase):
    """lookup('gpufleet.fleet.stack', **choices)"""

    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        self.set_options(var_options=variables, direct=kwargs)
        matrix = load_matrix()
        choices = {
            name: self.get_option(name)
            for name in (
                "driver_branch",
                "driver_version",
                "cuda_release",
                "pytorch_release",
                "pytorch_cuda_release",
                "pytorch_variant",
                "distribution",
                "torchvision",
                "torchaudio",
                "names",
                "repository_os",
                "today",
                "pytorch_wheel_source",
                "os_version",
                "python",
                "gpu_device_ids",
                "gpu_addresses",
            )
        }
        return [resolve(matrix, **choices)]
