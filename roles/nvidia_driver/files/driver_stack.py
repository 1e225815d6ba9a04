"""The installed driver stack: the named packages and every installed package they depend on, recursively
(Depends and Pre-Depends, virtual packages through their installed providers), whose name matches one of
the driver source's pin patterns. Prints the names as JSON.

argv[1]: JSON list of the named packages; argv[2]: JSON list of fnmatch patterns (*nvidia*, libcuda1);
argv[3] and argv[4], optional: the same for the branch this install replaces (NVIDIA's Ubuntu packages name the
branch: nvidia-utils-535 goes when nvidia-utils-580 comes). Prints {"stack": [...], "replaced": [...]}, the
replaced branch's stack without the packages of this one. Reads dpkg's database only (dpkg-query); changes nothing.
"""

import fnmatch
import json
import re
import subprocess
import sys

FORMAT = "${Package}\t${db:Status-Abbrev}\t${Depends}, ${Pre-Depends}\t${Provides}\n"


def driver_stack(listing, named, patterns):
    """The names of the stack, from dpkg-query's FORMAT lines."""
    depends, providers = {}, {}
    for line in listing.splitlines():
        name, status, deps, provides = (line.split("\t") + ["", "", ""])[:4]
        if status[1:2] != "i":  # installed ("ii", or "hi" when held)
            continue
        # "a (>= 1) | b, c": every alternative's name (the installed one satisfied it)
        depends[name] = {
            re.split(r"[\s(:]", alt.strip())[0] for dep in deps.split(",") for alt in dep.split("|") if alt.strip()
        }
        for virtual in provides.split(","):
            if virtual.strip():
                providers.setdefault(re.split(r"[\s(]", virtual.strip())[0], set()).add(name)
    stack, todo = set(), [n for n in named if n in depends]
    while todo:
        package = todo.pop()
        if package not in stack:
            stack.add(package)
            for dep in depends[package]:
                todo += sorted({dep} if dep in depends else providers.get(dep, set()))
    return sorted(p for p in stack if any(fnmatch.fnmatch(p, pattern) for pattern in patterns))


if __name__ == "__main__":
    dpkg = subprocess.run(["dpkg-query", "-W", "-f=" + FORMAT], capture_output=True, text=True, check=True)
    stack = driver_stack(dpkg.stdout, json.loads(sys.argv[1]), json.loads(sys.argv[2]))
    replaced = driver_stack(dpkg.stdout, json.loads(sys.argv[3]), json.loads(sys.argv[4])) if len(sys.argv) > 4 else []
    print(json.dumps({"stack": stack, "replaced": [name for name in replaced if name not in stack]}))
