"""gpufleet pytorch role: which pinned requirements a virtual environment does not satisfy.

Run with the environment's own interpreter (python -I -c <this> '<JSON list of pins>').
Reads package metadata only: imports none of the packages it checks, changes
nothing, needs no network. Prints one JSON line:
  {"pip": "23.0.1" or null, "installed": {name: version or null}, "unsatisfied": [pin, ...]}
A pin with a local version (torch==2.5.1+cu121) is satisfied only by that
exact build; one without (numpy==1.26) follows PEP 440 (1.26.0 satisfies it).
"""

import json
import sys
from importlib import metadata


def installed_version(name):
    """The installed version of distribution ``name``, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _split(pin):
    """(distribution name, version) of 'name[extras]==version'."""
    name, _separator, version = pin.partition("==")
    return name.split("[", 1)[0].strip(), version.strip()


def satisfied(pin, version):
    """Whether an installed ``version`` (None: not installed) satisfies the exact ``pin``."""
    if version is None:
        return False
    try:
        from pip._vendor.packaging.specifiers import SpecifierSet
        from pip._vendor.packaging.version import InvalidVersion
    except ImportError:  # pip absent or rearranged: exact text comparison
        return _split(pin)[1] == version
    try:
        return SpecifierSet("==" + _split(pin)[1]).contains(version, prereleases=True)
    except (InvalidVersion, ValueError):
        return _split(pin)[1] == version


def check(pins):
    """The report for ``pins`` (a list of 'name==version' strings)."""
    installed = {}
    unsatisfied = []
    for pin in pins:
        name = _split(pin)[0]
        version = installed_version(name)
        installed[name] = version
        if not satisfied(pin, version):
            unsatisfied.append(pin)
    return {"pip": installed_version("pip"), "installed": installed, "unsatisfied": unsatisfied}


def main(argv):
    pins = json.loads(argv[1]) if len(argv) > 1 else []
    print(json.dumps(check(pins), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
