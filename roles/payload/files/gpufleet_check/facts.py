"""Host facts read without torch: the NVIDIA GPUs on the PCI bus, the loaded
nvidia kernel module and the installed userspace driver, nvidia-smi's
inventory and its GPU topology matrix.

Each reader takes its input from a path (sysfs, /sys/module, /proc, a library
directory) or from the nvidia-smi found on PATH, and hands the text to a pure
parser (``parse_*``) that the unit tests call directly. ``read_driver_fact``
runs (or reads) the nvidia_driver role's local fact, for the versions the
operator asked for and the run pinned. ``checks.Probe``
gathers these facts once per run. ``count_pci_gpus`` is also what the
smoke_training role imports (``from gpufleet_check import count_pci_gpus``).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .common import first_lines, read_text, version_key

NVIDIA_PCI_VENDOR = "0x10de"
GPU_PCI_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller (NVSwitches are bridges)
USERSPACE_LIBRARIES = ("libnvidia-ml.so.1", "libcuda.so.1")
SMI_QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "driver_version",
    "persistence_mode",
    "ecc.errors.uncorrected.volatile.total",
)
SMI_TIMEOUT_S = 60
REBOOT_ERRORS = ("driver/library version mismatch",)


# --------------------------------------------------------------------------- PCI bus and driver versions


def count_pci_gpus(sysfs_pci_dir: str | Path) -> int:
    """NVIDIA display/3D controllers on the PCI bus, whether or not a driver is loaded."""
    try:
        devices = sorted(os.listdir(sysfs_pci_dir))
    except OSError:
        return 0
    count = 0
    for device in devices:
        vendor = read_text(Path(sysfs_pci_dir, device, "vendor"))
        pci_class = read_text(Path(sysfs_pci_dir, device, "class")) or ""
        if vendor == NVIDIA_PCI_VENDOR and pci_class.startswith(GPU_PCI_CLASSES):
            count += 1
    return count


def parse_proc_driver_version(text: str) -> str | None:
    """The number in 'NVRM version: NVIDIA UNIX [Open] Kernel Module [for x86_64]  535.161.08  ...'."""
    first = text.splitlines()[0] if text else ""
    match = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", first + " ")
    return match.group(1) if match else None


def loaded_module_version(module_version_file: str, proc_version_file: str) -> tuple[str | None, str | None]:
    """(version, where it was read) of the nvidia kernel module in memory, or (None, None)."""
    version = read_text(module_version_file)
    if version:
        return version, module_version_file
    version = parse_proc_driver_version(read_text(proc_version_file) or "")
    if version:
        return version, proc_version_file
    return None, None


def library_version(path: str) -> str | None:
    """'.../libnvidia-ml.so.535.261.03' -> '535.261.03'; None for an unversioned name like '.so.1'."""
    match = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)*)$", path)
    return match.group(1) if match else None


def parse_ldconfig(text: str, soname: str) -> list[str]:
    """Paths `ldconfig -p` gives for soname, 64-bit entries first (32-bit copies come as plain 'libc6')."""
    entries = []
    for line in text.splitlines():
        match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if match and match.group(1) == soname:
            entries.append((match.group(2), match.group(3)))
    entries.sort(key=lambda entry: "64" not in entry[0])
    return [path for _kind, path in entries]


def ldconfig_paths(soname: str) -> list[str]:
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None
    )
    if ldconfig is None:
        return []
    try:
        proc = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_ldconfig(proc.stdout, soname)


def dir_paths(soname: str, lib_dirs: Sequence[str]) -> list[str]:
    """soname in each directory, else its versioned files there (newest first)."""
    stem = soname.rsplit(".", 1)[0]  # libnvidia-ml.so
    paths = []
    for lib_dir in lib_dirs:
        link = os.path.join(lib_dir, soname)
        if os.path.exists(link):
            paths.append(link)
            continue
        versioned = [p for p in glob.glob(os.path.join(lib_dir, stem + ".*")) if library_version(p)]
        paths += sorted(versioned, key=lambda p: version_key(library_version(p) or ""), reverse=True)
    return paths


def installed_driver_version(lib_dirs: Sequence[str] = ()) -> tuple[str | None, str | None]:
    """(version, resolved library path) of the userspace driver, from ldconfig or lib_dirs."""
    for soname in USERSPACE_LIBRARIES:
        paths = dir_paths(soname, lib_dirs) if lib_dirs else ldconfig_paths(soname)
        for path in paths:
            resolved = os.path.realpath(path)  # Debian: alternatives symlinks to nvidia/current/
            version = library_version(resolved)
            if version:
                return version, resolved
    return None, None


# --------------------------------------------------------------------------- the nvidia_driver role's local fact

DRIVER_FACT_TIMEOUT_S = 10


def parse_driver_fact(text: str) -> dict[str, Any]:
    """The fact's JSON object: its whole output, else its last line that is an object (a script may print
    more). Raises ValueError when there is none."""
    text = text.strip()
    candidates = [text] + [line.strip() for line in reversed(text.splitlines()) if line.strip().startswith("{")]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise ValueError(f"not a JSON object: {first_lines(text, 1)[:80] or 'empty output'}")


def read_driver_fact(path: str, timeout: float = DRIVER_FACT_TIMEOUT_S) -> tuple[dict[str, Any] | None, str]:
    """(the fact's object, "") or (None, why not) of the nvidia_driver role's local fact at path: run when it
    is executable (a shell script printing one JSON line, as Ansible runs it), else read as JSON text."""
    if not os.path.isfile(path):
        return None, f"driver fact {path}: not found (the nvidia_driver role did not run here)"
    if os.access(path, os.X_OK):
        try:
            proc = subprocess.run(
                [path], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
            )
        except subprocess.TimeoutExpired:
            return None, f"driver fact {path}: no answer within {timeout:g} s"
        except OSError as exc:
            return None, f"driver fact {path}: cannot be run ({exc.strerror or exc})"
        if proc.returncode != 0:
            return None, f"driver fact {path}: exited {proc.returncode}: {first_lines(proc.stderr, 1) or 'no message'}"
        text: str | None = proc.stdout
    else:
        text = read_text(path)
        if text is None:
            return None, f"driver fact {path}: cannot be read"
    try:
        return parse_driver_fact(text), ""
    except ValueError as exc:
        return None, f"driver fact {path}: {exc}"


# --------------------------------------------------------------------------- nvidia-smi


@dataclass
class SmiInventory:
    """What `nvidia-smi --query-gpu` said: the GPUs, or why there are none."""

    found: bool
    returncode: int | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    driver_version: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.found and not self.error

    @property
    def needs_reboot(self) -> bool:
        return any(text in self.error.lower() for text in REBOOT_ERRORS)


def run_nvidia_smi(*args: str) -> tuple[int | None, str]:
    """(exit code, stdout + stderr) of nvidia-smi from PATH; exit code None when it is absent."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None, "nvidia-smi not found on PATH"
    try:
        proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return -1, f"nvidia-smi {' '.join(args)} timed out after {SMI_TIMEOUT_S} s"
    except OSError as exc:
        return -1, f"nvidia-smi could not run: {exc}"
    return proc.returncode, proc.stdout + proc.stderr


def smi_field(text: str) -> str | None:
    text = text.strip()
    return None if text in ("", "[N/A]", "N/A", "[Not Supported]", "Not Supported") else text


def smi_int(text: str) -> int | None:
    value = smi_field(text)
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def smi_bool(text: str) -> bool | None:
    return {"enabled": True, "disabled": False}.get((smi_field(text) or "").lower())


def parse_smi_query(text: str) -> tuple[list[dict[str, Any]], str | None]:
    """Rows of the --query-gpu CSV -> (GPU dicts as in the report, driver version)."""
    gpus, driver = [], None
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) != len(SMI_QUERY_FIELDS):
            raise ValueError(f"unexpected nvidia-smi line ({len(row)} fields): {','.join(row)}")
        index, name, uuid, bus_id, memory, driver_version, persistence, ecc = row
        driver = driver or smi_field(driver_version)
        gpus.append(
            {
                "index": smi_int(index),
                "name": name.strip(),
                "uuid": uuid.strip(),
                "pci_bus_id": bus_id.strip(),
                "memory_total_mib": smi_int(memory),
                "persistence_mode": smi_bool(persistence),
                "ecc_uncorrected": smi_int(ecc),
                "gemm_tflops": None,
                "gemm_of_achievable": None,
            }
        )
    return gpus, driver


def query_nvidia_smi() -> SmiInventory:
    code, output = run_nvidia_smi(f"--query-gpu={','.join(SMI_QUERY_FIELDS)}", "--format=csv,noheader,nounits")
    if code is None:
        return SmiInventory(found=False, error=output)
    if code != 0:
        return SmiInventory(
            found=True, returncode=code, error=f"nvidia-smi failed (rc {code}): {first_lines(output) or 'no output'}"
        )
    try:
        gpus, driver = parse_smi_query(output)
    except ValueError as exc:
        return SmiInventory(found=True, returncode=code, error=str(exc))
    return SmiInventory(found=True, returncode=code, gpus=gpus, driver_version=driver)


# --------------------------------------------------------------------------- system cuDNN / NCCL packages


# The packages of the system's cuDNN and NCCL (the cuda role's cuda_libraries).
# torch's CUDA wheels load their own builds (nvidia-cudnn-cu12,
# nvidia-nccl-cu12), not these: the report lists both, apart.
SYSTEM_LIBRARY_PACKAGES = {"cudnn": "libcudnn8", "nccl": "libnccl2"}
DPKG_QUERY_FORMAT = "${Package}\t${db:Status-Abbrev}\t${Version}\n"
DPKG_TIMEOUT_S = 30


def parse_dpkg_query(text: str) -> dict[str, str]:
    """Installed packages' versions from ``dpkg-query -W -f DPKG_QUERY_FORMAT`` (package, status, version).

    Only packages whose status says installed ("ii", "hi": wanted install or
    hold, installed); a package removed with its configuration kept ("rc")
    is not installed. An architecture qualifier (libnccl2:amd64) is dropped.
    """
    versions = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3:
            continue
        name, status, version = (field.strip() for field in fields)
        if len(status) >= 2 and status[1] == "i" and version:
            versions[name.split(":")[0]] = version
    return versions


def system_library_versions() -> dict[str, str | None]:
    """{"cudnn": dpkg version of libcudnn8, "nccl": of libnccl2}, None where not installed or without dpkg."""
    found: dict[str, str] = {}
    dpkg_query = shutil.which("dpkg-query")
    if dpkg_query is not None:
        try:  # exits 1 when a package is unknown, after listing the others
            proc = subprocess.run(
                [dpkg_query, "-W", "-f", DPKG_QUERY_FORMAT, *SYSTEM_LIBRARY_PACKAGES.values()],
                capture_output=True,
                text=True,
                timeout=DPKG_TIMEOUT_S,
                check=False,
            )
            found = parse_dpkg_query(proc.stdout)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {library: found.get(package) for library, package in SYSTEM_LIBRARY_PACKAGES.items()}


# --------------------------------------------------------------------------- GPU topology


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def parse_topology(text: str) -> list[list[str]]:
    """`nvidia-smi topo -m` -> the GPU x GPU link matrix ("X", "NV18", "PIX", "SYS", ...).

    NIC rows and columns, the affinity columns and the legend are left out.
    """
    lines = [ANSI_ESCAPE.sub("", line) for line in text.splitlines()]
    header = next((line.split() for line in lines if re.search(r"\bGPU0\b", line)), None)
    if header is None:
        raise ValueError("no GPU0 column in nvidia-smi topo -m output")
    columns = 0
    while columns < len(header) and header[columns] == f"GPU{columns}":
        columns += 1
    rows = {}
    for line in lines:
        tokens = line.split()
        if tokens and re.fullmatch(r"GPU\d+", tokens[0]) and tokens != header:
            rows[int(tokens[0][3:])] = tokens[1 : columns + 1]
    matrix = [rows.get(i, []) for i in range(columns)]
    if any(len(row) != columns for row in matrix):
        raise ValueError(f"nvidia-smi topo -m: expected {columns} GPU rows of {columns} links")
    return matrix


def is_nvlink(link: str) -> bool:
    return re.fullmatch(r"NV\d+", link) is not None


def gpu_pairs(count: int) -> Iterable[tuple[int, int]]:
    return ((i, j) for i in range(count) for j in range(i + 1, count))


def all_pairs_nvlink(links: list[list[str]]) -> bool:
    return len(links) >= 2 and all(is_nvlink(links[i][j]) for i, j in gpu_pairs(len(links)))
