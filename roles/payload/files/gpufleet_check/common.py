"""Small helpers the other modules share: exit codes, the dict a check returns (and the
"no GPU" one), JSON-safe numbers, file reading, GPU model matching, version sorting and
argparse types.

Standard library only, and nothing else of the package: every other module
may import this one.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_TIMEOUT = 124  # the `train` subcommand, like coreutils' timeout


def check_result(
    name: str,
    verdict: str,
    detail: str,
    value: Any = None,
    unit: str | None = None,
    threshold: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """The dict every check returns; extra keys go after the common ones."""
    return {
        "name": name,
        "verdict": verdict,
        "value": value,
        "unit": unit,
        "threshold": threshold,
        "detail": detail,
        **extra,
    }


def finite_or_none(value: Any) -> Any:
    """NaN and infinities become None, in nested lists and dicts too (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    return value


def read_text(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def model_pattern(model: str) -> str:
    """Each word of the model as a whole word, in order, anything between them ("A100 PCIe" matches
    "A100-PCIE-40GB" and "A100 80GB PCIe"; "A10" does not match "A100")."""
    return ".*".join(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])" for word in model.split())


def no_gpu(name: str, probe: Any, note: str = "") -> dict[str, Any]:
    """Skipped "no GPU", or failed with --require-gpus (probe: anything with ``args.require_gpus``)."""
    detail = "no GPU" + (f" ({note})" if note else "")
    if probe.args.require_gpus:
        return check_result(name, "fail", f"{detail}; --require-gpus")
    return check_result(name, "skipped", detail)


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def first_lines(text: str, count: int = 3) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[:count] if line.strip())


def program_name() -> str:
    """The command as the user typed it, for usage messages: gpufleet_check.pyz (or its
    copy's name), or ``python3 -m gpufleet_check`` when the package runs from source."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python3 -m gpufleet_check" if name in ("", "-c", "__main__.py") else name


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def fraction(text: str) -> float:
    """A share above 0 and at most 1 (nan, inf and 0 refused)."""
    value = float(text)
    if not 0 < value <= 1:  # False for nan too
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {text}")
    return value


def check_writable(path: Path) -> str | None:
    """Why a file cannot be written at path (its directory created if missing), or None when it can:
    a temporary file is created beside it and removed, which is what writing it will take."""
    try:
        if path.is_dir():
            return "is a directory"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def write_atomically(path: Path, text: str, mode: int = 0o644) -> Path:
    """Replace path with text: a temporary file beside it, flushed to disk, then renamed over it;
    returns path. Readers see the old file or the new one, never half of one; on an error the
    temporary file is removed and the old file is left as it was (OSError raised). The fleet
    report (plugins/module_utils/fleet_report.py) writes its files with it too."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return path
