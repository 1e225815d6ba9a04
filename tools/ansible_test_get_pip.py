"""ansible-test's pip bootstrap, offline: pip from the interpreter's own ensurepip, then the rest from the index.

ansible-test (ansible-core 2.19) creates each sanity test's virtual environment without pip and bootstraps pip
by running https://ci-files.testing.ansible.com/ansible-test/get-pip-<version>.py, cached as
~/.ansible/test/cache/get_pip_<version>.py. That host is not reachable from every network
(https://github.com/ansible/ansible/issues/77304, where ansible-test's own error message sends the user).
tools/sanity.py installs this file at that cache path instead. It takes get-pip's arguments, installs the pip
wheel that ships with Python (ensurepip, no network), then installs the requested packages (pip==<version> among
them) from the configured package index, as get-pip would.
"""

import subprocess
import sys

# get-pip's own options; pip install has no such options (the bootstrap installs neither anyway).
GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def main() -> int:
    """Install pip from ensurepip, then pip install the arguments that are pip's; return pip's exit status."""
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
    subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "pip", "install", *args], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
