#!/usr/bin/env python
"""Which stack a GPU-tier run measured, said plainly (tests/gpu/device-check.sh).

    python stack_record.py COMPATIBILITY_YML OUT_JSON

Run with the interpreter whose torch is measured. A GPU machine without
network access may not have the matrix's wheels: this records what it ran
(torch, the CUDA it was built for, torch's own cuDNN and NCCL, the driver
and the GPUs) and whether that is a stack files/compatibility.yml names,
field by field. It prints one line and writes the record as JSON; it never
fails the run (a measurement on another stack is still a measurement, as
long as it says so).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

# The health checks' own readers of what torch reports (roles/payload/files/gpufleet_check.pyz, a zipapp
# that imports from sys.path like a directory): one decoding of cuDNN/NCCL versions, not a copy here.
sys.path.append(str(Path(__file__).resolve().parents[2] / "roles" / "payload" / "files" / "gpufleet_check.pyz"))
from gpufleet_check.checks import release_parts, torch_versions  # noqa: E402


def load_matrix(path: Path) -> dict[str, Any]:
    """The matrix with PyYAML where the interpreter has it, else the flow-style rows of pytorch_releases."""
    text = path.read_text()
    try:
        import yaml

        return yaml.safe_load(text)
    except ImportError:
        pass
    rows: dict[str, Any] = {}
    # Release keys only (X.Y.Z): gpu_devices' keys ("2330") are flow rows too.
    for match in re.finditer(r'^\s+"([0-9]+\.[0-9]+\.[0-9]+)": \{', text, re.M):
        depth, end = 1, match.end()
        while depth and end < len(text):  # the flow mapping may span lines
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        body = text[match.end() : end - 1]
        row: dict[str, Any] = {}
        pypi = re.search(r"\bpypi: (\w+)", body)
        if pypi:
            row["pypi"] = pypi.group(1)
        bundled = re.findall(r'(cu\d+): \{cudnn: "([^"]+)", nccl: "([^"]+)"\}', body)
        if bundled:
            row["bundled"] = {variant: {"cudnn": cudnn, "nccl": nccl} for variant, cudnn, nccl in bundled}
        rows[match.group(1)] = row
    return {"pytorch_releases": rows}


def compare(measured: dict[str, Any], matrix: dict[str, Any]) -> dict[str, Any]:
    """The matrix's row for the measured torch and what differs from it ([] when it is the matrix's stack)."""
    version = measured.get("torch") or ""
    release, _plus, local = version.partition("+")
    cuda = measured.get("cuda")
    variant = local or (f"cu{cuda.replace('.', '')}" if cuda else "cpu")
    row = (matrix.get("pytorch_releases") or {}).get(release)
    differences = []
    expected: dict[str, Any] = {}
    if row is None:
        differences.append(f"torch {release or 'none'} is not a release files/compatibility.yml knows")
    else:
        bundled = (row.get("bundled") or {}).get(variant)
        if not local and row.get("pypi") and row["pypi"] != variant:
            differences.append(
                f"torch {release} without a local version is PyPI's {row['pypi']} build, this one reports {variant}"
            )
        if bundled is None:
            differences.append(f"the matrix records no {variant} build of torch {release}")
        else:
            expected = {"cuda": f"{variant[2:-1]}.{variant[-1]}", **bundled}
            if cuda != expected["cuda"]:
                differences.append(f"CUDA {cuda}, the matrix's {variant} is {expected['cuda']}")
            for library in ("cudnn", "nccl"):
                if release_parts(measured.get(library)) != release_parts(bundled[library]):
                    differences.append(f"{library} {measured.get(library)}, the matrix's is {bundled[library]}")
    return {"variant": variant, "matrix": expected, "differences": differences, "matrix_stack": not differences}


def measure() -> dict[str, Any]:
    import torch

    versions = torch_versions(torch)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:  # no nvidia-smi at all
        smi = subprocess.CompletedProcess([], 127, "", "")
    gpus = [line.split(", ") for line in smi.stdout.splitlines() if line.strip()] if smi.returncode == 0 else []
    return {
        **versions,
        "python": sys.version.split()[0],
        "gpus": [g[0] for g in gpus],
        "driver": gpus[0][1] if gpus and len(gpus[0]) > 1 else None,
    }


def summary(measured: dict[str, Any], compared: dict[str, Any]) -> str:
    stack = (
        f"torch {measured['torch']} (CUDA {measured['cuda']}, cuDNN {measured['cudnn']}, NCCL {measured['nccl']}), "
        f"driver {measured.get('driver')}, {len(measured.get('gpus') or [])} x "
        f"{(measured.get('gpus') or ['no GPU'])[0]}"
    )
    if compared["matrix_stack"]:
        return f"stack measured: {stack}: the matrix's {compared['variant']} stack"
    return (
        f"stack measured: {stack}: NOT the stack gpufleet installs ({'; '.join(compared['differences'])}); "
        "figures are of this stack"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    measured = measure()
    compared = compare(measured, load_matrix(Path(argv[1])))
    line = summary(measured, compared)
    Path(argv[2]).write_text(json.dumps({"measured": measured, **compared, "summary": line}, indent=2) + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
