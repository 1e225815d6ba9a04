"""What every benchmark of tools/bench/ writes: the run's date and machine, its results as JSON in
reports/bench/<kind>-<UTC time>.json, and its printed table."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path


def header() -> dict:
    """The date and the machine of a run, as the recorded tables name them."""
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}, {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
    }


def finish(results: dict, out_dir: Path, kind: str, table: str) -> int:
    """Writes the results, prints the table and where the results are; the exit status of a benchmark."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{kind}-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2))
    print()
    print(table)
    print(f"\n(results: {out})")
    return 0
