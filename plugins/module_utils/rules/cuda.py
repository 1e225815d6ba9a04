"""The cuda role's rules: the release from the compatibility matrix, the driver it needs,
NVIDIA's repository for this OS.

Run by roles/cuda/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes.
"""

from __future__ import annotations

import re

from ansible.module_utils.compat.version import LooseVersion

from ansible_collections.gpufleet.fleet.plugins.module_utils.apt_source import apt_source_files
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import Judgement, as_list, is_http_url, to_bool

READS = (
    "cuda_*",
    "nvidia_driver_version",
    "nvidia_driver_branch",
    "ansible_local.nvidia_driver",
    "preflight_report.gpu_device_ids",
    "preflight_report.gpu_pci_addresses",
    "__cuda_repo_os",
    "__cuda_supported_os",
    "__cuda_public_repository_url",
    "__cuda_keyring_package_keyring",
)

_ARCH = re.compile(r"^sm_[0-9]{2,3}a?$")


def driver(j: Judgement, stack: dict) -> tuple[str, str]:
    """The driver the release must run on, and the setting it comes from (for the message)."""
    wanted = str(j.get("nvidia_driver_version") or "").replace("latest", "")
    installed = str(((j.get("ansible_local") or {}).get("nvidia_driver") or {}).get("installed_version", ""))
    if j["cuda_driver_version"]:
        return str(j["cuda_driver_version"]), "cuda_driver_version"
    version = wanted or str((stack.get("driver") or {}).get("version") or "") or installed.replace("not installed", "")
    if wanted:
        return version, "nvidia_driver_version"
    if j.get("nvidia_driver_branch") is not None:
        return version, f"nvidia_driver_branch {j['nvidia_driver_branch']} (its default release)"
    return version, "the installed driver"


def judge(j: Judgement) -> None:
    """Resolve the release and its builds; refuse a driver too old, an OS NVIDIA has no repository for, bad URLs."""
    report = j.get("preflight_report") or {}
    repo_os = j["__cuda_repo_os"]
    supported = list(j["__cuda_supported_os"])
    stack = j.stack(
        cuda_release=str(j["cuda_release"]),
        driver_branch=str(j.get("nvidia_driver_branch", "")),
        repository_os=repo_os,
        gpu_device_ids=report.get("gpu_device_ids", []),
        gpu_addresses=report.get("gpu_pci_addresses", []),
    )
    release = j.set("__cuda_release", (stack.get("cuda") or {}).get("release", str(j["cuda_release"])))
    j.set("__cuda_stack", stack)
    version, source = driver(j, stack)
    j.set("__cuda_driver", version)
    j.set("__cuda_driver_source", source)
    spec = dict(stack["cuda"], cudnn=stack["cudnn"], nccl=stack["nccl"]) if stack.get("cuda") else {}
    j.set("__cuda_spec", spec)
    site = j["cuda_repository_url"]
    j.refuse([error for error in stack.get("errors", []) if error.startswith("cuda_release")])
    j.check(
        not spec or not version or LooseVersion(version) >= LooseVersion(spec["min_driver"]),
        f"CUDA {release} needs NVIDIA driver {spec.get('min_driver', '?')} or newer, but {source} is driver {version}:"
        " choose a newer driver branch (nvidia_driver_branch) or an older CUDA release (cuda_release)",
    )
    j.check(
        repo_os in supported or site,
        f"NVIDIA publishes no CUDA repository for {repo_os} (it does for {', '.join(supported)})",
    )
    # NVIDIA's directory for this OS must carry the release (Debian 12's starts at CUDA 12.3), unless a site
    # repository is given.
    installs = to_bool(j["cuda_toolkit"]) or bool(as_list(j["cuda_libraries"]))
    j.check(
        repo_os not in supported or site or not spec.get("repository_gap") or not installs,
        f"{spec.get('repository_gap', '')}. Set cuda_repository_url to a site repository that carries"
        f" {spec.get('toolkit_package', 'the toolkit')} {spec.get('toolkit_version', '')} and the builds of"
        f" cuda_libraries for {repo_os} (flat, like NVIDIA's), or choose a CUDA release NVIDIA publishes for it"
        " (cuda_release)",
    )
    j.check(not site or is_http_url(site), f"cuda_repository_url '{site}' is not an http(s) URL")
    key_url = j["cuda_repository_key_url"]
    j.check(not key_url or is_http_url(key_url), f"cuda_repository_key_url '{key_url}' is not an http(s) URL")
    archs = as_list(j["cuda_compile_check_archs"])
    j.check(
        all(_ARCH.match(str(arch)) for arch in archs),
        f"cuda_compile_check_archs must be GPU architectures like sm_80 or sm_90, got {j['cuda_compile_check_archs']}",
    )
    paths(j, release, spec)


def paths(j: Judgement, release: str, spec: dict) -> None:
    """The toolkit's package and home, the repository's URL and keyring, and the pins main writes (one per
    library of cuda_libraries, after the toolkit's)."""
    dashed = j.set("__cuda_dashed", release.replace(".", "-"))
    j.set("__cuda_home", f"/usr/local/cuda-{release}")
    toolkit = j.set("__cuda_toolkit_package", f"cuda-toolkit-{dashed}")
    url = j.set("__cuda_repo_url", (j["cuda_repository_url"] or j["__cuda_public_repository_url"]).rstrip("/"))
    keyring = j["cuda_repository_keyring"] or j["__cuda_keyring_package_keyring"]
    if j["cuda_repository_key_url"]:
        # A key fetched from a URL goes into the repository's own keyring file (a URL that names no repository
        # is refused above).
        try:
            keyring = apt_source_files(url)["keyring_file"]
        except ValueError:
            keyring = ""
    j.set("__cuda_keyring", keyring)
    libraries = j.set("__cuda_libraries", list(dict.fromkeys(as_list(j["cuda_libraries"]))))
    present = to_bool(j["cuda_pin"])
    pins = [{"name": "cuda", "packages": [toolkit], "version": spec.get("toolkit_version", ""), "present": present}]
    pins = pins if to_bool(j["cuda_toolkit"]) else []
    pins += [
        {
            "name": library,
            "packages": (spec.get(library) or {}).get("packages", []),
            "version": (spec.get(library) or {}).get("package_version", ""),
            "present": present,
        }
        for library in libraries
    ]
    j.set("__cuda_repository_pins", pins)
