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
                 "torchvision", "torchaudio"},
     "known":   {"driver_branches", "cuda_releases", "pytorch_releases"}}

Empty settings take the matrix's defaults. A part that cannot be resolved is
empty (``{}``) and its reason is in ``errors``; the lookup itself never fails
on a setting, so that a role can list every wrong setting at once.
``lookup('gpufleet.fleet.stack', matrix=true)`` returns the matrix as it is (tests, the lab).
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
  matrix: {description: Return the matrix itself instead of a stack., type: bool, default: false}
"""

RETURN = r"""
_raw:
  description: One mapping (a list of one element, as lookups return).
  type: list
  elements: dict
"""

MATRIX_FILE = Path(__file__).resolve().parents[2] / "files" / "compatibility.yml"
_VARIANT = re.compile(r"^cu(\d+)(\d)$")


def load_matrix(path: Path = MATRIX_FILE) -> dict[str, Any]:
    """The matrix, as written (keys are strings)."""
    try:
        data = yaml.safe_load(path.read_text())
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


def resolve(matrix: dict[str, Any], driver_branch: Any = "", driver_version: Any = "", cuda_release: Any = "",
            pytorch_release: Any = "", pytorch_cuda_release: Any = "", pytorch_variant: Any = "",
            distribution: Any = "") -> dict[str, Any]:
    """One stack for these choices, or its reasons in ``errors``."""
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
        errors.append(f"cuda_release '{release}' is not a CUDA release gpufleet knows "
                      f"(the compatibility matrix lists {', '.join(cudas)})")
    else:
        cuda = {"release": release, "dashed": release.replace(".", "-"),
                "toolkit_package": "cuda-toolkit-" + release.replace(".", "-"),
                "toolkit_version": _text(row.get("toolkit_version")),
                "component_version": _text(row.get("component_version")),
                "min_driver": _text(row.get("min_driver")), "pytorch_variant": _text(row.get("pytorch_variant"))}
    cudnn = dict(row.get("cudnn") or {}) if row else {}
    nccl = dict(row.get("nccl") or {}) if row else {}

    torch_release = _text(pytorch_release) or _text(defaults.get("pytorch_release"))
    torch_cuda = _text(pytorch_cuda_release) or release
    variant = _text(pytorch_variant) or _text((cudas.get(torch_cuda) or {}).get("pytorch_variant"))
    pytorch: dict[str, Any] = {}
    torch_row = torches.get(torch_release)
    if torch_row is None:
        errors.append(f"pytorch_release '{torch_release}' is not a PyTorch release gpufleet knows "
                      f"(the compatibility matrix lists {', '.join(torches)})")
    elif not variant:
        errors.append(f"CUDA {torch_cuda} has no PyTorch wheel variant in the compatibility matrix "
                      f"(it lists {', '.join(cudas)}): set pytorch_variant")
    elif variant not in torch_row.get("variants", []):
        errors.append(f"pytorch_release {torch_release} has no {variant} build (the compatibility matrix: "
                      f"{', '.join(torch_row.get('variants', []))})")
    else:
        pytorch = {"release": torch_release, "cuda_release": torch_cuda, "variant": variant,
                   "variants": list(torch_row.get("variants", [])), "expected_cuda": expected_cuda(variant),
                   "label": f"+{variant}", "torchvision": _text(torch_row.get("torchvision")),
                   "torchaudio": _text(torch_row.get("torchaudio"))}

    return {"errors": errors, "driver": driver, "cuda": cuda, "cudnn": cudnn, "nccl": nccl, "pytorch": pytorch,
            "known": known}


class LookupModule(LookupBase):
    """lookup('gpufleet.fleet.stack', **choices)"""

    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        self.set_options(var_options=variables, direct=kwargs)
        matrix = load_matrix()
        if self.get_option("matrix"):
            return [matrix]
        choices = {name: self.get_option(name) for name in (
            "driver_branch", "driver_version", "cuda_release", "pytorch_release", "pytorch_cuda_release",
            "pytorch_variant", "distribution")}
        return [resolve(matrix, **choices)]
