#!/usr/bin/python3
"""Proves that a CUDA toolkit compiles a CUDA C++ kernel, without a GPU.

    cuda-compile-check.py --cuda-home /usr/local/cuda --arch sm_80 --arch sm_90 [--json]

With <cuda-home>/bin/nvcc present, the kernel is compiled with `nvcc -cubin`
for each architecture. Without it (a toolkit of NVRTC and ptxas only), NVRTC
(<cuda-home>/lib64/libnvrtc.so.12, through ctypes) compiles the kernel to PTX
for each architecture's virtual architecture (compute_NN) and ptxas assembles
that PTX into a cubin for sm_NN.

Reported per architecture: the method, whether it compiled, the size of the
cubin (checked to be a CUDA ELF object); for the toolkit: the release from
`nvcc --version` or `ptxas --version` and NVRTC's nvrtcVersion().
Exit status: 0 when every architecture compiled, 1 when one did not, 2 when
the toolkit or the arguments are unusable. --json prints one JSON object.

Standard library only; runs with the node's /usr/bin/python3 (3.8+).
"""

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile

KERNEL_NAME = "twice"
KERNEL = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'
EM_CUDA = 190  # ELF e_machine of a cubin
ARCH_PATTERN = re.compile(r"^sm_([0-9]{2,3}a?)$")
NVRTC_NAMES = ("libnvrtc.so.12", "libnvrtc.so")


class CheckError(Exception):
    """The toolkit cannot be checked at all (exit 2)."""


def toolkit_release(tool):
    """(release, version) from `<tool> --version`: ('12.1', 'V12.1.105'); None when it does not run."""
    try:
        result = subprocess.run(
            [tool, "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            universal_newlines=True,
            timeout=60,
            check=False,
        )
    except OSError:
        return None
    match = re.search(r"release ([0-9]+\.[0-9]+), (V[0-9.]+)", result.stdout)
    return (match.group(1), match.group(2)) if match else None


def cubin_error(path, arch):
    """None when path is a cubin for arch (a 64-bit ELF object for EM_CUDA whose
    e_flags name the SM), else what is wrong with it."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(64)
    except OSError as error:
        return "no cubin written: {}".format(error)
    if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:
        return "the output is not a 64-bit ELF object"
    machine = int.from_bytes(header[18:20], "little")
    if machine != EM_CUDA:
        return "the output is an ELF object for machine {}, not CUDA ({})".format(machine, EM_CUDA)
    sm = int.from_bytes(header[48:52], "little") & 0xFF  # e_flags: EF_CUDA_SM in the low byte
    wanted = int(ARCH_PATTERN.match(arch).group(1).rstrip("a"))
    if sm != wanted:
        return "the cubin is for sm_{}, not {}".format(sm, arch)
    return None


def last_lines(text, count=5):
    return " | ".join(line.strip() for line in text.strip().splitlines()[-count:])


class Nvrtc:
    """The NVRTC calls the check needs, through ctypes."""

    def __init__(self, cuda_home):
        lib_dir = os.path.join(cuda_home, "lib64")
        errors = []
        for name in NVRTC_NAMES:
            path = os.path.join(lib_dir, name)
            if not os.path.exists(path):
                continue
            try:
                self.lib = ctypes.CDLL(path)
                self.path = path
                break
            except OSError as error:
                errors.append(str(error))
        else:
            raise CheckError(
                "no usable NVRTC in {} ({}): {}".format(
                    lib_dir, " or ".join(NVRTC_NAMES), "; ".join(errors) or "not found"
                )
            )
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def _call(self, name, *args):
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise RuntimeError("{} failed: {}".format(name, self.lib.nvrtcGetErrorString(status).decode()))

    def version(self):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("nvrtcVersion", ctypes.byref(major), ctypes.byref(minor))
        return "{}.{}".format(major.value, minor.value)

    def ptx(self, source, virtual_arch):
        """PTX for compute_NN; RuntimeError with NVRTC's log when it does not compile."""
        program = ctypes.c_void_p()
        self._call("nvrtcCreateProgram", ctypes.byref(program), source.encode(), b"twice.cu", 0, None, None)
        try:
            options = (ctypes.c_char_p * 1)("--gpu-architecture={}".format(virtual_arch).encode())
            status = self.lib.nvrtcCompileProgram(program, 1, options)
            if status != 0:
                log_size = ctypes.c_size_t()
                self._call("nvrtcGetProgramLogSize", program, ctypes.byref(log_size))
                log = ctypes.create_string_buffer(log_size.value)
                self._call("nvrtcGetProgramLog", program, log)
                raise RuntimeError(
                    "nvrtcCompileProgram failed: {}: {}".format(
                        self.lib.nvrtcGetErrorString(status).decode(), last_lines(log.value.decode(errors="replace"))
                    )
                )
            size = ctypes.c_size_t()
            self._call("nvrtcGetPTXSize", program, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            self._call("nvrtcGetPTX", program, ptx)
            return ptx.value
        finally:
            self._call("nvrtcDestroyProgram", ctypes.byref(program))


def compile_tool(name, argv):
    """Run nvcc or ptxas; raise RuntimeError with its exit status and last lines when it fails."""
    result = subprocess.run(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError("{} exit {}: {}".format(name, result.returncode, last_lines(result.stdout)))


def compile_with_nvcc(nvcc, arch, workdir):
    source = os.path.join(workdir, "twice.cu")
    with open(source, "w") as handle:
        handle.write(KERNEL)
    cubin = os.path.join(workdir, "twice_{}.cubin".format(arch))
    compile_tool("nvcc", [nvcc, "-cubin", "-arch={}".format(arch), "-o", cubin, source])
    return cubin


def compile_with_nvrtc(nvrtc, ptxas, arch, workdir):
    ptx = nvrtc.ptx(KERNEL, "compute_" + ARCH_PATTERN.match(arch).group(1))
    ptx_file = os.path.join(workdir, "twice_{}.ptx".format(arch))
    with open(ptx_file, "wb") as handle:
        handle.write(ptx)
    cubin = os.path.join(workdir, "twice_{}.cubin".format(arch))
    compile_tool("ptxas", [ptxas, "-arch={}".format(arch), "-o", cubin, ptx_file])
    return cubin


def check(cuda_home, archs):
    """The report as a dict; raises CheckError when nothing can be compiled."""
    if not os.path.isdir(cuda_home):
        raise CheckError("{} is not a directory (no CUDA toolkit there)".format(cuda_home))
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    ptxas = os.path.join(cuda_home, "bin", "ptxas")
    report = {
        "cuda_home": cuda_home,
        "cuda_home_resolved": os.path.realpath(cuda_home),
        "method": None,
        "toolkit_release": None,
        "toolkit_version": None,
        "release_from": None,
        "nvrtc_version": None,
        "archs": [],
        "ok": False,
    }
    for tool in (nvcc, ptxas):
        release = toolkit_release(tool) if os.access(tool, os.X_OK) else None
        if release:
            report["toolkit_release"], report["toolkit_version"] = release
            report["release_from"] = "{} --version".format(os.path.basename(tool))
            break
    nvrtc, nvrtc_error = None, None  # the error is set when nvrtc stays None
    try:
        nvrtc = Nvrtc(cuda_home)
        report["nvrtc_version"] = nvrtc.version()
    except (CheckError, RuntimeError, AttributeError) as error:
        nvrtc_error = str(error)
    if os.access(nvcc, os.X_OK):
        report["method"] = "nvcc"
    elif nvrtc is not None and os.access(ptxas, os.X_OK):
        report["method"] = "nvrtc+ptxas"
    else:
        missing = [] if nvrtc else [nvrtc_error]
        if not os.access(ptxas, os.X_OK):
            missing.append("no executable {}".format(ptxas))
        raise CheckError(
            "{} has no bin/nvcc, and NVRTC + ptxas are not usable: {}".format(cuda_home, "; ".join(missing))
        )

    with tempfile.TemporaryDirectory(prefix="cuda-compile-check-") as workdir:
        for arch in archs:
            entry = {"arch": arch, "method": report["method"], "ok": False, "cubin_bytes": None, "error": None}
            try:
                if report["method"] == "nvcc":
                    cubin = compile_with_nvcc(nvcc, arch, workdir)
                else:
                    cubin = compile_with_nvrtc(nvrtc, ptxas, arch, workdir)
                problem = cubin_error(cubin, arch)
                if problem:
                    raise RuntimeError(problem)
                entry["cubin_bytes"] = os.path.getsize(cubin)
                entry["ok"] = True
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
                entry["error"] = str(error)
            report["archs"].append(entry)
    report["ok"] = all(entry["ok"] for entry in report["archs"])
    return report


def print_text(report):
    print(
        "cuda-compile-check: {} ({}): CUDA release {} ({}, from {}), NVRTC {}".format(
            report["cuda_home"],
            report["cuda_home_resolved"],
            report["toolkit_release"] or "unknown",
            report["toolkit_version"] or "?",
            report["release_from"] or "no tool",
            report["nvrtc_version"] or "not loaded",
        )
    )
    for entry in report["archs"]:
        if entry["ok"]:
            print("  {:<7} {:<12} ok      cubin {} bytes".format(entry["arch"], entry["method"], entry["cubin_bytes"]))
        else:
            print("  {:<7} {:<12} FAILED  {}".format(entry["arch"], entry["method"], entry["error"]))
    compiled = sum(1 for entry in report["archs"] if entry["ok"])
    print("cuda-compile-check: {} of {} architecture(s) compiled".format(compiled, len(report["archs"])))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Compile a CUDA C++ kernel for GPU architectures (no GPU needed).")
    parser.add_argument(
        "--cuda-home", default="/usr/local/cuda", help="the toolkit directory (default /usr/local/cuda)"
    )
    parser.add_argument(
        "--arch",
        action="append",
        dest="archs",
        metavar="sm_NN",
        help="a GPU architecture such as sm_80; repeat for more (default sm_80)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)
    archs = args.archs or ["sm_80"]
    bad = [arch for arch in archs if not ARCH_PATTERN.match(arch)]
    try:
        if bad:
            raise CheckError("not a GPU architecture like sm_80 or sm_90a: {}".format(", ".join(bad)))
        report = check(args.cuda_home, archs)
    except CheckError as error:
        if args.json:
            print(json.dumps({"cuda_home": args.cuda_home, "ok": False, "error": str(error)}))
        else:
            print("cuda-compile-check: {}".format(error), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print_text(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
