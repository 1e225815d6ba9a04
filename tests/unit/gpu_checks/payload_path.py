"""Unit tests for the GPU health checks (roles/payload/files/gpufleet_check/, shipped as
gpufleet_check.pyz), without torch and without a GPU; one module per check or part of the
program. The passive health checks and DCGM's diagnostic (test_health_*.py) are judged on real
published outputs (saved_outputs.py says where they come from).

The modules are imported from the package (roles/payload/files on sys.path, put there
by tests/unit/conftest.py, before any module of these tests imports them); the command line runs
gpufleet_check.pyz, the file the nodes receive, in a subprocess
(tests/unit/test_gpufleet_check_pyz.py checks that it is built from these sources).

The host is faked (fakes.py): an ``nvidia-smi`` shell script first (and alone) on PATH,
sysfs PCI device directories with vendor/class files, a module version file,
a /proc/driver/nvidia/version file and a directory of driver libraries, all in
tmp_path and handed over with the check's own test options. torch is blocked
in this process (``sys.modules["torch"] = None``, conftest.py) and, for the CLI runs in a
subprocess, by a ``torch`` package on PYTHONPATH that raises ImportError, so
the tests behave the same whether or not the venv has torch.
"""

from __future__ import annotations

from pathlib import Path

PAYLOAD_DIR = Path(__file__).resolve().parents[3] / "roles" / "payload" / "files"
PYZ = PAYLOAD_DIR / "gpufleet_check.pyz"
