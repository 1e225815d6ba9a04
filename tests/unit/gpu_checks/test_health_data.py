"""Every input under tests/unit/data/gpu/ names its source."""

from __future__ import annotations

import re
from pathlib import Path

from .saved_outputs import DATA

# --------------------------------------------------------------------------- every data file names its source


def test_every_data_file_has_a_source() -> None:
    files = [p for p in DATA.rglob("*") if p.is_file() and not p.name.endswith(".source") and "ib-sysfs" not in p.parts]
    assert len(files) >= 30
    for path in files:
        source = Path(f"{path}.source")
        assert source.is_file(), f"{path} has no {source.name}"
        text = source.read_text()
        assert text.startswith(("Verbatim", "Edited in ONE field from", "Captured verbatim")), source
        if text.startswith("Captured verbatim"):  # on the lent GPU machine: the script, the date, the stack
            assert "tests/gpu/device-check.sh" in text and re.search(r"\d{4}-\d\d-\d\d", text), source
            assert "driver" in text and "torch" in text, f"{source}: no stack"
        else:
            assert "@ " in text or "https://" in text, f"{source}: no commit or URL"
    for tree in (p for p in (DATA / "ib-sysfs").iterdir() if p.is_dir()):
        assert Path(f"{tree}.source").read_text().startswith("Verbatim"), tree
