"""The benchmark and the e2e helpers run this environment's ansible-playbook (issue 16, item 21).

`.venv/bin/python tools/bench/provisioning.py --verify-only`, as the README
shows it, runs without the venv on PATH: ansible-runner then found no
ansible-playbook, and the benchmark blamed the lab ("converge the lab
first"). tests/e2e/conftest.py, which both import, puts the interpreter's
own bin directory first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ansible_playbook_is_the_venvs_without_the_venv_on_path():
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, shutil; sys.path.insert(0, 'tests/e2e'); import conftest; "
            "print(shutil.which('ansible-playbook'))",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found == str(Path(sys.executable).parent / "ansible-playbook")
