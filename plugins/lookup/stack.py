"""Resolve gpufleet's compatibility matrix into one stack: the only reader of files/compatibility.yml.

DOCUMENTATION is below; in short::

    lookup('gpufleet.fleet.stack', driver_branch='535', cuda_release='12.1',
           pytorch_release='2.5.1', distribution='Ubuntu')

returns one mapping::

    {"errors": [reasons, each naming the setting and what the matrix allows],
     "driver":  {"branch", "version", "fabricmanager", "sources": [for this distribution]},
     "cuda":    {"release", "dashed", "toolkit_package", "toolkit_version", "component_version",
                 "min_driver", "pytorch_variant"},
     "cudnn":   {"version", "package_version", "packages"},
     "nccl":    {"version", "package_version", "packages"},
     "pytorch": {"release", "cuda_release", "variant", "variants", "expected_cuda", "label",
                 "torchvision", "torchaudio", "pins", "packages",
                 "bundled": {"cudnn", "nccl"}},  # the builds the wheels bring (see bundled_libraries)
     "known":   {"driver_branches", "cuda_releases", "pytorch_releases"}}

Empty settings take the matrix's defaults. A part that cannot be resolved is
empty (``{}``) and its reason is in ``errors``; the lookup itself never fails
on a setting, so that a role can list every wrong setting at once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: stack
author: gpufleet
short_description: Resolve the compatibility matrix into one driver/CUDA/cuDNN/NCCL/PyTorch stack
description:
  - Reads files/compatibility.yml of this collection (the only place that does) and returns one resolved stack
    for the given choices, with a list of reasons when a choice is not in the matrix.
options:
  driver_branch: {description: NVIDIA driver branch, e.g. "535"; empty for none., type: str, default: ""}
  driver_version: {description: Exact driver release; empty for the branch's default release., type: str, default: ""}
  cuda_release: {description: CUDA release, e.g. "12.1"; empty for the matrix default., type: str, default: ""}
  pytorch_release: {description: PyTorch release; empty for the matrix default., type: str, default: ""}
  pytorch_cuda_release: {description: CUDA release of the wheels; empty follows cuda_release., type: str, default: ""}
  pytorch_variant: {description: Wheel variant (cu121, cpu); empty for the CUDA release's variant., type: str, default: ""}
  distribution: {description: ansible_facts.distribution of the host (driver sources differ per OS)., type: str, default: ""}
  torchvision: {description: Pin torchvision with torch., type: bool, default: true}
  torchaudio: {description: Pin torchaudio with torch., type: bool, default: true}
  names:
    description: The caller's names of the settings, for the reasons (keys cuda_release, pytorch_release, pytorch_cuda_release, pytorch_variant).
    type: dict
    default: {}
"""

RETURN = r"""
_raw:
  description: One mapping (a list of one element, as lookups return).
  type: list
  elements: dict
"""

MATRIX_FILE = Path(__file__).resolve().parents[2] / "files" / "compatibility.yml"
_VARIANT = re.compile(r"^cu(\d+)(\d)$")


# Parsed once per file version: a role's `vars: lookup(...)` is templated at
# every reference (several times per host and task).
_LOADED: dict[Path, tuple[float, Any]] = {}


def load_matrix(path: Path = MATRIX_FILE) -> dict[str, Any]:
    """The matrix, as written (keys are strings); read again only when the file changed. Not to be modified."""
    try:
        mtime = path.stat().st_mtime
        if path not in _LOADED or _LOADED[path][0] != mtime:
            _LOADED[path] = (mtime, yaml.safe_load(path.read_text()))
        data = _LOADED[path][1]
    except (OSError, yaml.YAMLError) as error:
        raise AnsibleLookupError(f"gpufleet.fleet.stack: cannot read the compatibility matrix {path}: {error}") from error
    if not isinstance(data, dict) or not {"driver_branches", "cuda_releases", "pytorch_releases", "defaults"} <= set(data):
        raise AnsibleLookupError(f"gpufleet.fleet.stack: {path} is not gpufleet's compatibility matrix")
    return data


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def expected_cuda(variant: str) -> str:
    """cu121 -> 12.1, cu118 -> 11.8; cpu -> ''."""
    match = _VARIANT.match(variant)
    return f"{match.group(1)}.{match.group(2)}" if match else ""


# The settings the reasons name, unless the caller renames them.
SETTING_NAMES = {"cuda_release": "cuda_release", "pytorch_release": "pytorch_release",
                 "pytorch_cuda_release": "pytorch_cuda_release", "pytorch_variant": "pytorch_variant"}
_VARIANT_FORM = re.compile(r"^(cpu|cu[0-9]{3})$")


def _span(releases: list[str]) -> str:
    """2.1.0 ... 2.5.1 for a long run (matrix order is release order), else the list."""
    return f"{releases[0]} ... {releases[-1]}" if len(releases) > 2 else ", ".join(releases)


# What "bundled" says where the matrix records no build for the variant, and
# for the CPU wheels (which carry neither library).
UNKNOWN = "unknown"
NO_CUDA = "none"


def bundled_libraries(row: dict[str, Any], variant: str) -> dict[str, str]:
    """The cuDNN and NCCL builds torch's wheels of this variant bring with them (torch's own, not the system's).

    From the release's ``bundled`` entry for the variant; "unknown" where the
    matrix records none (never a guess from another variant), "none" for cpu.
    """
    if variant == "cpu":
        return {"cudnn": NO_CUDA, "nccl": NO_CUDA}
    recorded = (row.get("bundled") or {}).get(variant) or {}
    return {name: _text(recorded.get(name)) or UNKNOWN for name in ("cudnn", "nccl")}


def resolve_pytorch(matrix: dict[str, Any], release: Any = "", cuda_release: Any = "", variant: Any = "",
                    torchvision: bool = True, torchaudio: bool = True, names: dict[str, str] | None = None,
                    cuda_follows: bool = False) -> dict[str, Any]:
    """The PyTorch wheels for these choices: release, variant, pins, the CUDA torch must report; or reasons.

    ``cuda_release`` empty takes the matrix default; ``cuda_follows`` says it
    came from the CUDA setting (its own reason is given there, not twice).
    """
    names = {**SETTING_NAMES, **(names or {})}
    cudas = {str(key): value for key, value in matrix["cuda_releases"].items()}
    torches = {str(key): value for key, value in matrix["pytorch_releases"].items()}
    defaults = matrix["defaults"]
    release = _text(release) or _text(defaults.get("pytorch_release"))
    cuda_release = _text(cuda_release) or _text(defaults.get("cuda_release"))
    asked = _text(variant)
    cuda_row = cudas.get(cuda_release)
    variant = asked or _text((cuda_row or {}).get("pytorch_variant"))
    row = torches.get(release)
    with_variant = [key for key, value in torches.items() if variant in value.get("variants", [])]
    known_variants = list(dict.fromkeys(v for value in torches.values() for v in value.get("variants", [])))
    origin = (f"{names['pytorch_variant']} {variant}" if asked
              else f"the variant of CUDA {cuda_release}, {names['pytorch_cuda_release']}")
    errors: list[str] = []
    if row is None:
        errors.append(f"{names['pytorch_release']} '{release}' is not a PyTorch release gpufleet knows "
                      f"(files/compatibility.yml lists {_span(list(torches))}"
                      + (f"; {variant} wheels exist for torch {_span(with_variant)})" if with_variant else ")"))
    if asked and not _VARIANT_FORM.match(asked):
        errors.append(f"{names['pytorch_variant']} '{asked}' is not a wheel variant: cpu or cuXYZ "
                      f"(files/compatibility.yml knows {', '.join(known_variants)})")
        return {"errors": errors}
    if variant != "cpu" and cuda_row is None:
        # Said once: by the CUDA setting this release follows, else here.
        if not cuda_follows:
            errors.append(f"{names['pytorch_cuda_release']} '{cuda_release}' is not a CUDA release gpufleet knows "
                          f"(files/compatibility.yml lists {', '.join(cudas)}); set {names['pytorch_variant']}=cpu "
                          "for a CPU-only environment")
        return {"errors": errors}
    if not variant:
        errors.append(f"files/compatibility.yml gives CUDA {cuda_release} no pytorch_variant: "
                      f"set {names['pytorch_variant']}")
        return {"errors": errors}
    if variant != "cpu" and variant != _text(cuda_row.get("pytorch_variant")):
        wanted = _text(cuda_row.get("pytorch_variant")) or "?"
        errors.append(f"{names['pytorch_variant']} {variant} does not match CUDA {cuda_release} "
                      f"({names['pytorch_cuda_release']}): files/compatibility.yml gives CUDA {cuda_release} the "
                      f"{wanted} wheels; use {wanted}, or cpu for a CPU-only environment")
    if row is not None and variant not in row.get("variants", []):
        errors.append(f"torch {release} is published for {', '.join(row.get('variants', []))} only, not {variant} "
                      f"({origin}; {names['pytorch_release']} {release})"
                      + (f"; files/compatibility.yml: {variant} wheels exist for torch {_span(with_variant)}"
                         if with_variant else ""))
    if errors:
        return {"errors": errors}
    label = f"+{variant}"
    pins = [f"torch=={release}{label}"]
    for name, wanted in (("torchvision", torchvision), ("torchaudio", torchaudio)):
        if wanted and _text(row.get(name)):
            pins.append(f"{name}=={_text(row.get(name))}{label}")
    return {"errors": [], "release": release, "cuda_release": cuda_release, "variant": variant,
            "variants": list(row.get("variants", [])), "expected_cuda": expected_cuda(variant), "label": label,
            "torchvision": _text(row.get("torchvision")), "torchaudio": _text(row.get("torchaudio")),
            "pins": pins, "packages": ["torch", "torchvision", "torchaudio"],
            "bundled": bundled_libraries(row, variant)}


def resolve(matrix: dict[str, Any], driver_branch: Any = "", driver_version: Any = "", cuda_release: Any = "",
            pytorch_release: Any = "", pytorch_cuda_release: Any = "", pytorch_variant: Any = "",
            distribution: Any = "", torchvision: bool = True, torchaudio: bool = True,
            names: dict[str, str] | None = None) -> dict[str, Any]:
    """One stack for these choices, or its reasons in ``errors``.

    ``names`` renames the settings in the reasons (the container role's
    container_image_torch_release is this lookup's pytorch_release).
    """
    names = {**SETTING_NAMES, **(names or {})}
    errors: list[str] = []
    branches = {str(key): value for key, value in matrix["driver_branches"].items()}
    cudas = {str(key): value for key, value in matrix["cuda_releases"].items()}
    torches = {str(key): value for key, value in matrix["pytorch_releases"].items()}
    defaults = matrix["defaults"]
    known = {"driver_branches": list(branches), "cuda_releases": list(cudas), "pytorch_releases": list(torches)}

    driver: dict[str, Any] = {}
    branch, version = _text(driver_branch), _text(driver_version)
    if branch:
        row = branches.get(branch)
        if row is None:
            errors.append(f"nvidia_driver_branch '{branch}' is not a driver branch gpufleet knows "
                          f"(the compatibility matrix lists {', '.join(branches)})")
        else:
            version = version or _text(row.get("default_version"))
            if not re.match(rf"^{re.escape(branch)}\.[0-9]+(\.[0-9]+)?$", version):
                errors.append(f"nvidia_driver_version '{version}' is not a release of branch {branch} (expected the form "
                              f"{branch}.NNN.NN, for example {row.get('default_version')})")
            driver = {"branch": branch, "version": version, "fabricmanager": bool(row.get("fabricmanager")),
                      "sources": list((row.get("sources") or {}).get(_text(distribution), []))}

    release = _text(cuda_release) or _text(defaults.get("cuda_release"))
    cuda: dict[str, Any] = {}
    row = cudas.get(release)
    if row is None:
        errors.append(f"{names['cuda_release']} '{release}' is not a CUDA release gpufleet knows "
                      f"(the compatibility matrix lists {', '.join(cudas)})")
    else:
        cuda = {"release": release, "dashed": release.replace(".", "-"),
                "toolkit_package": "cuda-toolkit-" + release.replace(".", "-"),
                "toolkit_version": _text(row.get("toolkit_version")),
                "component_version": _text(row.get("component_version")),
                "min_driver": _text(row.get("min_driver")), "pytorch_variant": _text(row.get("pytorch_variant"))}
    cudnn = dict(row.get("cudnn") or {}) if row else {}
    nccl = dict(row.get("nccl") or {}) if row else {}

    pytorch = resolve_pytorch(matrix, pytorch_release, pytorch_cuda_release or release, pytorch_variant,
                              torchvision=torchvision, torchaudio=torchaudio, names=names,
                              cuda_follows=not _text(pytorch_cuda_release))
    errors += pytorch.pop("errors")

    return {"errors": errors, "driver": driver, "cuda": cuda, "cudnn": cudnn, "nccl": nccl, "pytorch": pytorch,
            "known": known}


class LookupModule(LookupBase):
    """lookup('gpufleet.fleet.stack', **choices)"""

    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        self.set_options(var_options=variables, direct=kwargs)
        matrix = load_matrix()
        choices = {name: self.get_option(name) for name in (
            "driver_branch", "driver_version", "cuda_release", "pytorch_release", "pytorch_cuda_release",
            "pytorch_variant", "distribution", "torchvision", "torchaudio", "names")}
        return [resolve(matrix, **choices)]
