"""gpufleet pytorch role: import torch (and torchvision, torchaudio when installed) and report the build.

Run with the environment's own interpreter (python -I -c <this>). Read-only:
imports, a tiny tensor computation (on GPU 0 too when one is visible),
version queries. Prints one JSON line whose keys the role publishes as
pytorch_* facts and writes to /var/lib/gpufleet/pytorch.json. Nothing in
it changes between two runs on an unchanged host.
"""

import importlib
import importlib.util
import json
import platform
import sys


def cudnn_version_string(code):
    """torch.backends.cudnn.version() as text: 8902 -> '8.9.2' (cuDNN 8), 90100 -> '9.1.0' (cuDNN 9+); None stays
    None."""
    if code is None:
        return None
    code = int(code)
    # cuDNN 8: major*1000 + minor*100 + patch; cuDNN 9+: major*10000 + minor*100 + patch.
    major, rest = divmod(code, 10000 if code >= 10000 else 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def nccl_version_string(version):
    """torch.cuda.nccl.version() as text: (2, 21, 5) -> '2.21.5'; older ints 21805 -> '2.18.5', 2708 -> '2.7.8'."""
    if isinstance(version, int):
        # NCCL >= 2.9: major*10000 + minor*100 + patch; before: major*1000 + minor*100 + patch.
        major, rest = divmod(version, 10000 if version >= 20900 else 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"
    text = ".".join(str(part) for part in version[:3])
    if len(version) > 3 and version[3]:
        text += str(version[3])
    return text


def local_variant(torch_version, cuda_version):
    """The wheel variant: the local version of torch (2.5.1+cu121 -> cu121), else what the build says."""
    if "+" in torch_version:
        return torch_version.split("+", 1)[1]
    return "cpu" if cuda_version is None else "cu" + cuda_version.replace(".", "")


def nccl_state(torch):
    """NCCL's version as torch was built with it, or 'not built' (CPU wheels)."""
    built = hasattr(torch._C, "_nccl_version")
    if not built:
        return "not built"
    return nccl_version_string(torch.cuda.nccl.version())


def optional_module_version(name):
    """Import ``name`` when installed and return its __version__; None when it is not installed."""
    if importlib.util.find_spec(name) is None:
        return None
    return str(importlib.import_module(name).__version__)


def report():
    import torch

    torch_version = str(torch.__version__)
    cuda_version = torch.version.cuda
    cuda_available = bool(torch.cuda.is_available())
    device_count = int(torch.cuda.device_count()) if cuda_available else 0

    # A computation that only a working build gets right.
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    if (x @ torch.ones(3)).tolist() != [3.0, 12.0]:
        raise SystemExit("torch computes wrong results on the CPU")
    if cuda_available:
        if (x.cuda() @ torch.ones(3, device="cuda")).cpu().tolist() != [3.0, 12.0]:
            raise SystemExit("torch computes wrong results on GPU 0")

    return {
        "python_version": platform.python_version(),
        "torch_version": torch_version,
        "torchvision_version": optional_module_version("torchvision"),
        "torchaudio_version": optional_module_version("torchaudio"),
        "cuda_version": cuda_version,
        "cudnn_version": cudnn_version_string(torch.backends.cudnn.version()),
        "nccl_version": nccl_state(torch),
        "cuda_available": cuda_available,
        "device_count": device_count,
        "devices": [torch.cuda.get_device_name(i) for i in range(device_count)],
        "variant_installed": local_variant(torch_version, cuda_version),
        "cpu_only": cuda_version is None,
    }


if __name__ == "__main__":
    print(json.dumps(report(), sort_keys=True))
    sys.exit(0)
