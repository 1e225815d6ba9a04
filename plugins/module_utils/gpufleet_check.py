"""gpufleet_check's own modules on the controller, for the rules play 1 must apply exactly as the checks will.

The checks run on the nodes (roles/payload/files/gpufleet_check/, shipped as gpufleet_check.pyz); a few of their
rules are needed before any node is touched: the validator of the per-SKU overrides (``profiles.merge_overrides``,
gpu_verify_profile_overrides) and DCGM's time limits per run level (``dcgm.DEFAULT_TIMEOUT_S``), and, after the
smoke training, the judgement of its network figures and NCCL's logs (``nccl.judge``); and the controller writes its
files as the checks write theirs (``common.write_atomically``: the fleet report, the wheel plan's shared
resolution). Rather than copy them, the filters, the report and the roles' rules
(plugins/module_utils/rules/gpu_verify.py: ``profile_overrides_problem`` below) import the package from the
collection (the payload role's files, at the collection root's ``roles/payload/files/gpufleet_check``), under a
private name so that it never meets another copy in ``sys.modules``.

Only modules that import nothing but the standard library and each other are
loaded: the package's ``__init__`` (facts, common), profiles, dcgm, nccl.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "roles" / "payload" / "files" / "gpufleet_check"
PRIVATE_NAME = "_gpufleet_fleet_gpufleet_check"


def gpufleet_check_package() -> ModuleType:
    """The package gpufleet_check of this collection, imported once under PRIVATE_NAME."""
    if PRIVATE_NAME in sys.modules:
        return sys.modules[PRIVATE_NAME]
    spec = importlib.util.spec_from_file_location(
        PRIVATE_NAME, PACKAGE_DIR / "__init__.py", submodule_search_locations=[str(PACKAGE_DIR)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"gpufleet_check not found at {PACKAGE_DIR}")
    package = importlib.util.module_from_spec(spec)
    sys.modules[PRIVATE_NAME] = package
    try:
        spec.loader.exec_module(package)
    except BaseException:
        del sys.modules[PRIVATE_NAME]
        raise
    return package


def gpufleet_check_module(name: str) -> ModuleType:
    """One module of the package (``profiles``, ``dcgm``, ...)."""
    gpufleet_check_package()
    return importlib.import_module(f"{PRIVATE_NAME}.{name}")


def write_atomically(path: Path, text: str) -> Path:
    """The checks' atomic write (common.write_atomically: a temporary file beside path, flushed, renamed over it),
    the one the controller's files use too: the fleet report's and the wheel plan's shared resolution."""
    return gpufleet_check_module("common").write_atomically(path, text)


def profile_overrides_problem(overrides: Any) -> str:
    """Why gpufleet_check would refuse these per-SKU overrides (its profiles.merge_overrides), or ""."""
    if overrides is None or overrides == "" or overrides == {}:
        return ""
    try:
        site = json.loads(json.dumps(overrides))  # plain JSON types, as the checks will read them
    except (TypeError, ValueError) as error:
        return f"not JSON data: {error}"
    try:
        gpufleet_check_module("profiles").merge_overrides(site)
    except ValueError as error:
        return str(error)
    return ""
