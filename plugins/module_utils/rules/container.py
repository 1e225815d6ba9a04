"""The container role's rules: the engine and runtimes for this OS, the toolkit's repository, the training image.

Run by roles/container/tasks/validate.yml (the action gpufleet.fleet.settings) before anything changes, after
it loaded the engine packages of the host's OS (vars/<OS>.yml).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ansible_collections.gpufleet.fleet.plugins.module_utils.settings import (
    Judgement,
    as_list,
    is_http_url,
    matches,
    text,
    to_bool,
)

READS = (
    "container_*",
    "ansible_facts.architecture",
    "ansible_facts.distribution",
    "ansible_facts.distribution_version",
    "__container_engines",
    "__container_engines_refused",
    "__container_engine_runtimes",
    "__container_runtimes",
    "__container_deb_architectures",
    "__container_nvidia_toolkit_public_url",
    "__container_toolkit_version_pattern",
    "__container_image_default_base",
    "__container_image_base_os",
    "__container_image_name_pattern",
    "__container_image_tag_pattern",
    "__container_system_dirs",
)

# The settings of the matrix's choices, as this role names them in the matrix's reasons.
NAMES = {
    "cuda_release": "container_image_cuda_release",
    "pytorch_release": "container_image_torch_release",
    "pytorch_cuda_release": "container_image_cuda_release",
    "pytorch_variant": "container_image_torch_variant",
    "pytorch_wheel_source": "container_image_wheel_source",
}


def _no_trailing_slash(url: str) -> str:
    return re.sub(r"/+$", "", url)


def resolve_engine(j: Judgement) -> None:
    """The engine's packages and service, the runtimes nvidia-ctk configures, NVIDIA's repository for this machine."""
    engine = text(j["container_engine"])
    arch = j["ansible_facts"]["architecture"]
    deb_archs = j["__container_deb_architectures"]
    j.set("__container_engine_spec", (j.get("__container_engines") or {}).get(engine, {}))
    j.set(
        "__container_nvidia_runtimes",
        as_list(j["container_nvidia_runtimes"]) or j["__container_engine_runtimes"].get(engine, []),
    )
    j.set("__container_deb_arch", deb_archs.get(arch, ""))
    url = j["container_nvidia_toolkit_repository_url"]
    j.set(
        "__container_repo_url",
        _no_trailing_slash(
            url or j["__container_nvidia_toolkit_public_url"].replace("{arch}", text(deb_archs.get(arch, arch)))
        ),
    )
    j.set(
        "__container_key_url",
        "" if j["container_nvidia_toolkit_repository_keyring"] else j["container_nvidia_toolkit_repository_key_url"],
    )


def resolve_image(j: Judgement) -> None:
    """The training image's stack (the compatibility matrix), base, name, pip sources and build arguments."""
    # The image's OS (its python3 takes the wheels), known for the default base only.
    base_os = j["__container_image_base_os"] if not j["container_image_base"] else {}
    stack = j.stack(
        cuda_release=text(j["container_image_cuda_release"]),
        pytorch_release=text(j["container_image_torch_release"]),
        pytorch_variant=text(j["container_image_torch_variant"]),
        pytorch_wheel_source=text(j["container_image_wheel_source"]),
        distribution=base_os.get("distribution", ""),
        os_version=base_os.get("version", ""),
        names=NAMES,
    )
    torch = stack.get("pytorch") or {}
    j.set("__container_image_stack", stack)
    release = j.set("__container_image_torch_release", torch.get("release", text(j["container_image_torch_release"])))
    j.set(
        "__container_image_cuda_release",
        (stack.get("cuda") or {}).get("release", text(j["container_image_cuda_release"])),
    )
    variant = j.set("__container_image_variant", torch.get("variant", text(j["container_image_torch_variant"])))
    # The variant as the pins carry it: empty where the source has no local version labels (PyPI's torch==2.3.1 is
    # its cu121 build).
    label = j.set("__container_image_label", re.sub(r"^\+", "", text(torch.get("label", ""))))
    j.set("__container_image_source_index_url", torch.get("index_url", ""))
    # The base stays the same for every stack: the CUDA user space comes with the wheels (vars/main.yml).
    base = j.set("__container_image_base", j["container_image_base"] or j["__container_image_default_base"])
    tag = j["container_image_tag"] or f"{release}-{variant}"
    j.set("__container_image_ref", f"{text(j['container_image_name'])}:{text(tag)}")
    # An explicit index (a mirror) wins over the wheel source's.
    index_url = j.set(
        "__container_image_index_url",
        _no_trailing_slash(
            (text(j["container_image_index_url"]) or text(j["__container_image_source_index_url"])).replace(
                "{variant}", text(variant)
            )
        ),
    )
    # pip ignores a plain-http source unless its host is trusted: an http URL in the settings is the operator's
    # choice (an internal mirror).
    wheelhouse = j["container_image_wheelhouse_url"]
    pip_args = []
    if wheelhouse:
        pip_args = ["--no-index", "--find-links", wheelhouse]
        if matches(r"^http://[^/]+", wheelhouse):
            pip_args.append(f"--trusted-host={urlsplit(wheelhouse).netloc}")
    pip_args += as_list(j["container_image_pip_extra_args"])
    j.set("__container_image_pip_args", pip_args)
    # The ARGs of roles/container/files/Containerfile.train; TORCH_VARIANT is empty for the pypi source (the
    # Containerfile then pins the plain version).
    j.set(
        "__container_image_build_args",
        {
            "BASE_IMAGE": base,
            "TORCH_VERSION": release,
            "TORCH_VARIANT": label,
            "TORCH_INDEX_URL": index_url,
            "PIP_EXTRA_ARGS": " ".join(text(arg) for arg in pip_args),
        },
    )


def check_engine(j: Judgement) -> None:
    """The engine for this OS, the toolkit's version and repository, the runtimes, the CDI specification."""
    facts = j["ansible_facts"]
    host_os = f"{facts.get('distribution', '')} {facts.get('distribution_version', '')}"
    engine = j["container_engine"]
    engines = j.get("__container_engines")
    refused = j.get("__container_engines_refused") or {}
    reason = f": {refused[text(engine)]}" if text(engine) in refused else ""
    j.check(
        engines is not None,
        f"the container role has no package layout for {host_os} (roles/container/vars has Ubuntu and Debian)",
    )
    j.check(
        engines is None or j["__container_engine_spec"],
        f"container_engine '{engine}' is not an engine gpufleet installs on {host_os}{reason}"
        f" (choose {' or '.join(engines or {})})",
    )
    j.check_form(
        "container_nvidia_toolkit_version",
        j["__container_toolkit_version_pattern"],
        "is not a package version of the NVIDIA Container Toolkit (the form X.Y.Z-N, for example 1.19.1-1)",
    )
    j.check(
        j["__container_deb_arch"],
        f"NVIDIA publishes no Container Toolkit repository for the architecture {facts['architecture']}"
        f" (it does for {', '.join(j['__container_deb_architectures'])})",
    )
    url = j["container_nvidia_toolkit_repository_url"]
    j.check(
        not url or is_http_url(url),
        f"container_nvidia_toolkit_repository_url '{url}' is not an http(s) URL"
        " (for example http://mirror.example.com/libnvidia-container/stable/deb/amd64)",
    )
    key_url = j["container_nvidia_toolkit_repository_key_url"]
    keyring = j["container_nvidia_toolkit_repository_keyring"]
    j.check(
        not key_url or is_http_url(key_url),
        f"container_nvidia_toolkit_repository_key_url '{key_url}' is not an http(s) URL",
    )
    j.check(
        key_url or keyring,
        "container_nvidia_toolkit_repository_key_url and container_nvidia_toolkit_repository_keyring are both"
        " empty: the toolkit repository must be Signed-By a key (NVIDIA's is"
        " https://nvidia.github.io/libnvidia-container/gpgkey)",
    )
    j.check(
        not keyring or matches(r"^/[^\s]+$", keyring),
        f"container_nvidia_toolkit_repository_keyring '{keyring}' is not an absolute path of a keyring on the host"
        " (for example /usr/share/keyrings/mirror-archive-keyring.gpg)",
    )
    runtimes = j["__container_runtimes"]
    bad = [runtime for runtime in as_list(j["container_nvidia_runtimes"]) if runtime not in list(runtimes)]
    j.check(
        not bad,
        f"container_nvidia_runtimes names {', '.join(text(runtime) for runtime in bad)}, which nvidia-ctk cannot"
        f" configure (choose from {', '.join(runtimes)}; empty for the engine's own)",
    )
    j.check_form(
        "container_cdi_spec_file",
        r"^/[^\s]+\.(yaml|json)$",
        "must be an absolute path ending in .yaml or .json (for example /etc/cdi/nvidia.yaml)",
    )


def check_image(j: Judgement) -> None:
    """The training image's name, tag, base, pip sources and build directory (with container_build_image)."""
    j.check_form(
        "container_image_name",
        j["__container_image_name_pattern"],
        "is not an image name (lower case, for example gpufleet-train or registry.example.com:5000/ml/gpufleet-train)",
    )
    j.check(
        matches(j["__container_image_tag_pattern"], j["__container_image_ref"].split(":")[-1]),
        f"container_image_tag '{j['container_image_tag']}' is not an image tag (letters, digits, '_', '.', '-';"
        " at most 128 characters)",
    )
    base = j["container_image_base"]
    j.check(not base or matches(r"^[^\s]+$", base), f"container_image_base '{base}' is not an image reference")
    wheelhouse = j["container_image_wheelhouse_url"]
    j.check(
        wheelhouse or is_http_url(j["__container_image_index_url"]),
        f"container_image_index_url '{j['container_image_index_url']}' is not an http(s) URL"
        f" (rendered: '{j['__container_image_index_url']}'; PyTorch's own is"
        " https://download.pytorch.org/whl/{variant}, {variant} being the only placeholder, PyPI's"
        " https://pypi.org/simple; empty for the index of container_image_wheel_source)",
    )
    j.check(
        not wheelhouse or (is_http_url(wheelhouse) and matches(r".*/$", wheelhouse)),
        f"container_image_wheelhouse_url '{wheelhouse}' is not the http(s) URL of a directory listing ending in '/'"
        " (for example http://mirror.example.com/wheels/)",
    )
    extra = j["container_image_pip_extra_args"]
    j.check(
        not any(re.search(r"\s", text(arg)) for arg in as_list(extra)),
        "container_image_pip_extra_args must be a list of options without spaces inside them"
        f' (for example ["--proxy", "http://proxy:3128"]), got {extra}',
    )
    build_dir = j["container_image_build_dir"]
    j.check(
        matches(r"^/[^\s]*$", build_dir)
        and (_no_trailing_slash(text(build_dir)) or "/") not in j["__container_system_dirs"],
        f"container_image_build_dir '{build_dir}' must be an absolute path of its own, not / or a system directory"
        " (for example /opt/gpufleet/container-build)",
    )


def judge(j: Judgement) -> None:
    """Resolve the engine, the toolkit's repository and the training image; refuse what gpufleet cannot set up."""
    resolve_engine(j)
    resolve_image(j)
    build = to_bool(j["container_build_image"])
    if build:
        # The matrix's reasons for the image come first; a CPU-only image needs no CUDA release (its base does not
        # depend on one).
        needless = r"^container_image_cuda_release" if j["__container_image_variant"] == "cpu" else r"^$"
        j.refuse([error for error in j["__container_image_stack"].get("errors", []) if not matches(needless, error)])
    check_engine(j)
    if build:
        check_image(j)
