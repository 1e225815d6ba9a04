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

Which pip version ansible-test bootstraps (so which cached name it looks for) is ansible-test's own choice, with no
public interface to ask it. This reads it where ansible-test says it: when the script is not cached and the download
fails, ansible-test stops with "The bootstrap script can be manually downloaded and saved to: <path>". tools/sanity.py
echoes ansible-test's output as it comes, installs the bootstrap at each such path under HOME and runs ansible-test
once more; from then on the script is cached and one run suffices.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".cache" / "ansible-test"
BOOTSTRAP = ROOT / "tools" / "ansible_test_get_pip.py"
NAMESPACE, NAME = "gpufleet", "fleet"
# Linux reads at most 127 characters of a shebang line, and pip writes the scripts of each per-test venv
# with its interpreter's path: HOME + this tail (the longest test name ansible-test 2.19 makes a venv for).
VENV_PYTHON_TAIL = "/.ansible/test/venv/sanity.validate-modules/3.11/0123abcd/bin/python"
SHEBANG_LIMIT = 127
# ansible-test's words (ansible_test/_util/target/setup/requirements.py, bootstrap()) when it could not download
# the get-pip script: the path it would have read it from.
BOOTSTRAP_WANTED = re.compile(r"manually downloaded and saved to: (\S+/get_pip_[0-9_]+\.py)$")


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


def install_bootstrap(paths: set[str]) -> set[str]:
    """Copy BOOTSTRAP to each of the paths ansible-test asked for that lies in HOME and is not there yet;
    return the paths it was copied to."""
    installed = set()
    for path in sorted(paths):
        target = Path(path)
        if HOME.resolve() in target.resolve().parents and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(BOOTSTRAP, target)
            installed.add(path)
    return installed


def run_echoed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, set[str]]:
    """Run command with its output echoed as it comes; return its exit status and the get-pip paths it asked for."""
    wanted = set()
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        for line in process.stdout or ():
            sys.stdout.write(line)
            sys.stdout.flush()
            found = BOOTSTRAP_WANTED.search(line.rstrip())
            if found:
                wanted.add(found.group(1))
    return process.returncode, wanted


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
    env = {**os.environ, **user_pip_environment(), "HOME": str(HOME)}
    ansible_test = Path(sys.executable).parent / "ansible-test"
    with tempfile.TemporaryDirectory(prefix="gpufleet-sanity-") as tmp:
        collection = Path(tmp) / "ansible_collections" / NAMESPACE / NAME
        copy_tree(collection)
        command = [str(ansible_test), "sanity", "--local", "--python", version, *sys.argv[1:]]
        status, wanted = run_echoed(command, collection, env)
        if status and install_bootstrap(wanted):
            print(f"tools/sanity.py: {BOOTSTRAP.name} installed as {', '.join(sorted(wanted))}; running again")
            status, _wanted = run_echoed(command, collection, env)
        return status


if __name__ == "__main__":
    sys.exit(main())
