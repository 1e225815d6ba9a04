"""`ansible-test sanity` on this clone as the collection gpufleet.fleet, without ci-files.testing.ansible.com.

Run by `make lint`: .venv/bin/python tools/sanity.py [ansible-test sanity options, e.g. --test pep8].

ansible-test needs the collection at <dir>/ansible_collections/gpufleet/fleet. This copies the files git
tracks plus the untracked files it does not ignore, as they are in the working tree (uncommitted changes
included, so that it can run before a commit), into such a directory under a temporary one, and runs
`ansible-test sanity --local --python <this Python's version>` there with this venv's ansible-test.

ansible-test creates one virtual environment per sanity test in ~/.ansible/test/venv (even with --local) and
bootstraps pip in each by downloading a get-pip script from ci-files.testing.ansible.com, which not every
network reaches (ansible/ansible#77304). HOME is therefore .cache/ansible-test in the clone (ignored by git),
where tools/ansible_test_get_pip.py is installed as that cached script: nothing is written to the user's
home, and the per-test environments are kept there for the next run (`rm -rf .cache/ansible-test` starts
over). pip keeps the user's configuration (package index, find-links) and download cache.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

from ansible_test._internal.python_requirements import get_venv_packages

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".cache" / "ansible-test"
BOOTSTRAP = ROOT / "tools" / "ansible_test_get_pip.py"
NAMESPACE, NAME = "gpufleet", "fleet"
# Linux reads at most 127 characters of a shebang line, and pip writes the scripts of each per-test venv
# with its interpreter's path: HOME + this tail (the longest test name ansible-test 2.19 makes a venv for).
VENV_PYTHON_TAIL = "/.ansible/test/venv/sanity.validate-modules/3.11/0123abcd/bin/python"
SHEBANG_LIMIT = 127


def collection_files() -> list[str]:
    """Paths, relative to ROOT, of the tracked files and the untracked ones git does not ignore, as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    # A tracked file deleted in the working tree is still listed: the collection is the working tree.
    return sorted({path for path in listed if path and os.path.lexists(ROOT / path)})


def copy_tree(destination: Path) -> None:
    """Copy collection_files() into destination, links as links, modes kept."""
    for path in collection_files():
        target = destination / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, target, follow_symlinks=False)


def install_bootstrap(version: str) -> None:
    """Put BOOTSTRAP where ansible-test looks for its cached get-pip script (requirements.py, bootstrap())."""
    pip_version = get_venv_packages(types.SimpleNamespace(version=version))["pip"]
    cache = HOME / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(BOOTSTRAP, cache / f"get_pip_{pip_version.replace('.', '_')}.py")


def user_pip_environment() -> dict[str, str]:
    """PIP_CONFIG_FILE and PIP_CACHE_DIR naming the user's own, which pip would no longer find under HOME."""
    real_home = Path.home()
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or real_home / ".config")
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or real_home / ".cache")
    env = {"PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR") or str(cache_home / "pip")}
    if "PIP_CONFIG_FILE" not in os.environ:
        for config in (config_home / "pip" / "pip.conf", real_home / ".pip" / "pip.conf"):
            if config.is_file():
                env["PIP_CONFIG_FILE"] = str(config)
                break
    return env


def main() -> int:
    """Run ansible-test sanity on a copy of the working tree; return its exit status."""
    if len(str(HOME)) + len(VENV_PYTHON_TAIL) > SHEBANG_LIMIT:
        sys.exit(
            f"{HOME} is too long a path for ansible-test's virtual environments (their scripts' shebangs "
            f"would pass Linux's {SHEBANG_LIMIT} characters): clone the project to a shorter path"
        )
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    install_bootstrap(version)
    env = {**os.environ, **user_pip_environment(), "HOME": str(HOME)}
    ansible_test = Path(sys.executable).parent / "ansible-test"
    with tempfile.TemporaryDirectory(prefix="gpufleet-sanity-") as tmp:
        collection = Path(tmp) / "ansible_collections" / NAMESPACE / NAME
        copy_tree(collection)
        command = [str(ansible_test), "sanity", "--local", "--python", version, *sys.argv[1:]]
        return subprocess.run(command, cwd=collection, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
