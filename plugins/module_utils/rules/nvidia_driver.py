"""The nvidia_driver role's rules: the source, the branch's release from the compatibility matrix, the mirror's URLs.

Run by roles/nvidia_driver/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes, once
the OS's package layout (``__nvidia_driver_sources``, roles/nvidia_driver/vars) is loaded.
"""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import Judgement, is_http_url, matches, text

READS = (
    "nvidia_driver_branch",
    "nvidia_driver_version",
    "nvidia_driver_source",
    "nvidia_driver_repository_url",
    "nvidia_driver_repository_key_url",
    "cuda_release",
    "preflight_report.gpu_device_ids",
    "preflight_report.gpu_pci_addresses",
    "ansible_facts.distribution",
    "ansible_local.nvidia_driver",
    "__nvidia_driver_sources",
    "__nvidia_driver_latest",
)


def default_source(distribution: str) -> str:
    """The source of an empty nvidia_driver_source: NVIDIA's CUDA repository on Ubuntu, Debian's non-free elsewhere."""
    return "nvidia" if distribution == "Ubuntu" else "debian_nonfree"


def judge(j: Judgement) -> None:
    """Resolve the source, the stack and the release; refuse a source or branch this OS lacks, bad URLs, a move."""
    distribution = j["ansible_facts"]["distribution"]
    report = j.get("preflight_report") or {}
    wants_latest = j["nvidia_driver_version"] == "latest"
    # latest: the matrix's checks see the branch's default release (its lifecycle is the branch's). The GPUs
    # preflight found (play 1 runs it first): the branch must drive every one of them (the GPU-generation gate).
    stack = j.set(
        "__nvidia_driver_stack",
        j.stack(
            driver_branch=text(j["nvidia_driver_branch"]),
            driver_version="" if wants_latest else j["nvidia_driver_version"],
            distribution=distribution,
            cuda_release=text(j.get("cuda_release", "")),
            gpu_device_ids=report.get("gpu_device_ids", []),
            gpu_addresses=report.get("gpu_pci_addresses", []),
        ),
    )
    source = j.set("__nvidia_driver_source", j["nvidia_driver_source"] or default_source(distribution))
    driver = stack.get("driver") or {}
    # latest: the release preflight.yml resolves once per run (empty until then).
    j.set(
        "__nvidia_driver_version",
        j.get("__nvidia_driver_latest", "") if wants_latest else driver.get("version", j["nvidia_driver_version"]),
    )
    # Said once per run by validate.yml, for every host of the play on such a branch.
    j.set("__nvidia_driver_eol_warning", (driver.get("lifecycle") or {}).get("warning", ""))

    # The stack's reasons about the driver only: cuda_release is passed for the branch's lifecycle, and its own
    # reasons are the cuda role's to give.
    j.refuse([error for error in stack.get("errors", []) if matches("^nvidia_driver_", error)])
    sources = j["__nvidia_driver_sources"]
    j.check(
        source in sources,
        f"nvidia_driver_source '{source}' does not exist on {distribution} (choose one of {', '.join(sources)})",
    )
    j.check(
        not driver or source in driver["sources"],
        f"branch {j['nvidia_driver_branch']} is not offered by source '{source}' on {distribution}"
        " (the compatibility matrix)",
    )
    url, key_url = j["nvidia_driver_repository_url"], j["nvidia_driver_repository_key_url"]
    j.check(
        not url or is_http_url(url),
        f"nvidia_driver_repository_url '{url}' is not an http(s) URL (for example http://mirror.example.com/debian)",
    )
    j.check(not key_url or is_http_url(key_url), f"nvidia_driver_repository_key_url '{key_url}' is not an http(s) URL")
    j.check(
        not key_url or url,
        "nvidia_driver_repository_key_url is set but nvidia_driver_repository_url is empty: a mirror's key needs"
        " the mirror's URL (set nvidia_driver_repository_url to the mirror's repository root)",
    )
    # The default source is not the one this host's driver came from: NVIDIA's packages have other names than
    # Canonical's, and installing them would replace the driver. The driver fact records its source; one written
    # before it did (gpufleet 0.3) came from the default of then, Canonical's archive on Ubuntu. An explicit
    # nvidia_driver_source is the user's move.
    installed = (j.get("ansible_local") or {}).get("nvidia_driver") or {}
    came_from = text(installed.get("source", "ubuntu" if distribution == "Ubuntu" else "debian_nonfree"))
    j.check(
        j["nvidia_driver_source"]
        or installed.get("installed_version", "not installed") == "not installed"
        or came_from == source,
        f"the driver on this host ({text(installed.get('installed_version', ''))}) came from source '{came_from}',"
        f" and the default source is '{source}', whose packages would replace it: set nvidia_driver_source:"
        f" {came_from} to keep it, or nvidia_driver_source: {source} to move this host",
    )
