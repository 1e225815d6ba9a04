"""tests/payload: train.py imports the modules beside it (train_plan, train_measure), which `python train.py` and
torchrun find in the script's directory; test_train.py loads it in-process from its path, so that directory goes on
sys.path here."""

from __future__ import annotations

import sys
from pathlib import Path

PAYLOAD_DIR = Path(__file__).resolve().parents[2] / "roles" / "payload" / "files"
if str(PAYLOAD_DIR) not in sys.path:
    sys.path.insert(0, str(PAYLOAD_DIR))
