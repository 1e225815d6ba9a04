"""The nvidia_driver role's rules: the source, the branch's release from the compatibility matrix, the mirror's URLs.

Run by roles/nvidia_driver/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes, once
the OS's package layout (``__nvidia_driver_sources``, roles/nvidia_driver/vars) is loaded.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.apt_source import apt_source_files
from ansible_collections.gpufleet.fleet.plugins.module_utils.driver_packages import (
    driver_layout,
    signed_module_packages,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import (
    Judgement,
    is_http_url,
    matches,
    text,
    to_bool,
)

READS = (
    "nvidia_driver_branch",
    "nvidia_driver_version",
    "nvidia_driver_source",
    "nvidia_driver_repository_url",
    "nvidia_driver_repository_key_url",
    "nvidia_driver_repository_suites",
    "nvidia_driver_repository_components",
    "nvidia_driver_repository_manage",
    "nvidia_driver_repository_keyring",
    "nvidia_driver_kernel_release",
    "nvidia_driver_module_source",
    "nvidia_driver_headless",
    "nvidia_driver_fabricmanager",
    "nvidia_driver_blacklist_nouveau",
    "nvidia_driver_signed_flavours",
    "nvidia_driver_pin",
    "preflight_report.in_container",
    "preflight_report.nvswitch_count",
    "ansible_facts.virtualization_role",
    "ansible_facts.virtualization_type",
    "cuda_release",
    "preflight_report.gpu_device_ids",
    "preflight_report.gpu_pci_addresses",
    "ansible_facts.distribution",
    "ansible_facts.distribution_version",
    "ansible_local.nvidia_driver",
    "__nvidia_driver_sources",
    "__nvidia_driver_latest",
    "__nvidia_driver_container_types",
    "__nvidia_driver_cuda_keyring_deb",
    "__nvidia_driver_nvidia_repo_os",
    "__nvidia_driver_previous_keyring",
)


def default_source(distribution: str) -> str:
    """The source of an empty nvidia_driver_source: NVIDIA's CUDA repository on Ubuntu, Debian's non-free elsewhere."""
    return "nvidia" if distribution == "Ubuntu" else "debian_nonfree"


def judge(j: Judgement) -> None:
    """Resolve the source, the stack and the release; refuse a source or branch this OS lacks, bad URLs, a move."""
    distribution = j["ansible_facts"]["distribution"]
    # The package layouts of this OS (vars/<distribution>.yml, loaded by validate.yml): none, nothing to judge.
    if not j.get("__nvidia_driver_sources"):
        j.refuse(
            [
                f"no package layout for {distribution} {j['ansible_facts'].get('distribution_version', '')}"
                " (roles/nvidia_driver/vars has Ubuntu and Debian)"
            ]
        )
        return
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
    # The OS's package layouts, which the look for a driver gpufleet did not install compares with (foreign.yml).
    sources = j.set("__nvidia_driver_layouts", j["__nvidia_driver_sources"])
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
    if source in sources:
        packages(j, source, sources[source])


def packages(j: Judgement, source: str, layouts: dict) -> None:
    """The host's repository and package lists from its source's layout (roles/nvidia_driver/vars/<OS>.yml): the
    repository, its keyring and the files it replaces, the driver's packages (with the flavour metapackages of
    Ubuntu's signed modules), the support packages, the pin, and the branch a move replaces."""
    branch, kernel = text(j["nvidia_driver_branch"]), text(j["nvidia_driver_kernel_release"])
    module_source = text(j["nvidia_driver_module_source"])
    headless, fabricmanager = to_bool(j["nvidia_driver_headless"]), to_bool(j["nvidia_driver_fabricmanager"])
    layout = driver_layout(layouts, branch, kernel, module_source, headless, fabricmanager)
    # What this source cannot install: Debian packages neither signed modules nor Fabric Manager, and half a driver
    # is not installed.
    distribution = j["ansible_facts"]["distribution"]
    j.check(
        module_source != "signed" or layouts.get("packages_signed"),
        f"Secure Boot calls for signed prebuilt modules (nvidia_driver_module_source=signed) but {distribution} source"
        f" '{source}' has none. Enrol a MOK for DKMS (preflight_secure_boot_policy=mok) or turn Secure Boot off",
    )
    switches = (j.get("preflight_report") or {}).get("nvswitch_count") or "some"
    j.check(
        not fabricmanager or layouts.get("packages_fabricmanager"),
        f"{switches} NVSwitch(es) need nvidia-fabricmanager-{branch}, which source '{source}' does not ship: set"
        " nvidia_driver_source=nvidia (NVIDIA's CUDA repository) for this host",
    )
    url, key_url = j["nvidia_driver_repository_url"], j["nvidia_driver_repository_key_url"]
    repo_url = j.set("__nvidia_driver_repo_url", re.sub(r"/+$", "", url or layouts["repository_url"]))
    j.set("__nvidia_driver_repo_suites", j["nvidia_driver_repository_suites"] or layouts["repository_suites"])
    j.set(
        "__nvidia_driver_repo_components",
        j["nvidia_driver_repository_components"] or layouts["repository_components"],
    )
    managed = j.set(
        "__nvidia_driver_repo_managed",
        to_bool(j["nvidia_driver_repository_manage"])
        and (to_bool(layouts["manage_repository_by_default"]) or bool(url)),
    )
    # A key URL is given with the repository URL only (refused above otherwise): the key goes to that repository's
    # keyring file, whichever role fetches it (one source per repository: every role that uses it names one
    # Signed-By).
    keyring = j["nvidia_driver_repository_keyring"] or layouts["keyring"]
    if key_url:
        try:
            keyring = apt_source_files(url)["keyring_file"]
        except ValueError:
            keyring = ""
    j.set("__nvidia_driver_keyring", keyring)
    # Canonical's signed modules come per kernel and as flavour metapackages (linux-modules-nvidia-535-server-
    # generic): without the metapackage, the next kernel has no module. The metapackage carries the kernel's
    # version, not the driver's: it is neither moved to the driver's version nor held.
    flavours = []
    if module_source == "signed" and layouts.get("packages_signed"):
        given = j["nvidia_driver_signed_flavours"]
        try:
            flavours = signed_module_packages([kernel], branch, given if given else None)[1:]
        except ValueError as error:
            j.refuse([f"{error}: set nvidia_driver_signed_flavours to the kernel's flavour (generic, say)"])
    driver_packages = layout["packages"] + [name for name in flavours if name not in layout["packages"]]
    j.set("__nvidia_driver_signed_flavour_packages", flavours)
    j.set("__nvidia_driver_packages", driver_packages)
    j.set(
        "__nvidia_driver_support_packages",
        (["dkms", "linux-headers-" + kernel] if module_source == "dkms" else [])
        + (["initramfs-tools", "kmod"] if to_bool(j["nvidia_driver_blacklist_nouveau"]) else []),
    )
    # The pin's glob patterns as one regular expression: the names of the driver's packages.
    pin_regex = j.set(
        "__nvidia_driver_pin_regex",
        "^(" + "|".join(re.escape(pattern).replace("\\*", ".*") for pattern in layout["pin_patterns"]) + ")$",
    )
    j.set(
        "__nvidia_driver_versioned_packages",
        [name for name in driver_packages if re.match(pin_regex, name) and name not in flavours],
    )
    j.set("__nvidia_driver_pin_patterns", layout["pin_patterns"])
    j.set("__nvidia_driver_pin_competitors", layouts["pin_competitors"])
    # The driver's pin (repository.yml writes it, with the build the trial finds; play 1's simulation applies it).
    j.set(
        "__nvidia_driver_pin",
        {
            "name": "nvidia-driver",
            "packages": layout["pin_patterns"],
            "version": f"{text(j['nvidia_driver_version'])}-*",
            "build": "",
            # The other repositories that offer these names never supply them (the pin by origin).
            "competitors": layouts["pin_competitors"],
            "present": to_bool(j["nvidia_driver_pin"]),
        },
    )
    j.set("__nvidia_driver_upgrade_blacklist", layout["upgrade_blacklist"])
    j.set("__nvidia_driver_version_package", layout["version_package"])
    # A move to another branch of the same source (535 -> 580) whose packages carry the branch in their names:
    # the installed branch's packages go (the new ones conflict with them), their holds released first.
    installed = (j.get("ansible_local") or {}).get("nvidia_driver") or {}
    old_branch = text(installed.get("branch", ""))
    replacing = (
        layout["branch_named"]
        and installed.get("source", "") == source
        and installed.get("installed_version", "not installed") != "not installed"
        and old_branch not in ("", branch)
    )
    old = driver_layout(layouts, old_branch if replacing else "", kernel, module_source, headless, fabricmanager)
    j.set(
        "__nvidia_driver_replaced",
        {"branch": old_branch, "packages": old["packages"], "pin_patterns": old["pin_patterns"]}
        if replacing
        else {"branch": "", "packages": [], "pin_patterns": []},
    )
    j.set("__nvidia_driver_dkms_module", layouts["dkms_module"])
    facts = j["ansible_facts"]
    report = j.get("preflight_report") or {}
    j.set(
        "__nvidia_driver_in_container",
        to_bool(
            report["in_container"]
            if "in_container" in report
            else facts.get("virtualization_role", "") == "guest"
            and facts.get("virtualization_type", "") in j["__nvidia_driver_container_types"]
        ),
    )
    # NVIDIA's repository is signed by the keyring its cuda-keyring package installs (unless a mirror's key URL is
    # given); that package also brings its own .list for the repository, which the managed source replaces. Earlier
    # releases fetched a key URL's key into a file of this role's own name, now replaced by the repository's
    # (apt_source replaces their source files itself).
    nvidia = source == "nvidia"
    j.set(
        "__nvidia_driver_keyring_deb_url",
        f"{repo_url}/{j['__nvidia_driver_cuda_keyring_deb']}" if nvidia and not key_url else "",
    )
    previous = j["__nvidia_driver_previous_keyring"]
    j.set(
        "__nvidia_driver_replaced_sources",
        (
            ([f"/etc/apt/sources.list.d/cuda-{j['__nvidia_driver_nvidia_repo_os']}-x86_64.list"] if nvidia else [])
            + ([previous] if keyring != previous else [])
        )
        if managed
        else [],
    )
