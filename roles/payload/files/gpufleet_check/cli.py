"""The command line: options, the run of the checks, and where the report goes.

Commands
--------
::

    python3 gpufleet_check.pyz                  # every check, human summary
    python3 gpufleet_check.pyz --json           # the JSON report on stdout
    python3 gpufleet_check.pyz --train          # also train on every GPU of the machine
    python3 gpufleet_check.pyz --quick --skip allreduce_busbw --output /tmp/check.json
    python3 gpufleet_check.pyz --metrics-file /var/lib/prometheus/node-exporter/gpufleet.prom
    python3 gpufleet_check.pyz train --nnodes 2 --nproc-per-node 8 --rdzv-endpoint node1:29500 ...
    python3 gpufleet_check.pyz --help

(from a checkout: ``PYTHONPATH=roles/payload/files python3 -m gpufleet_check ...``).
The report is described in checks, the metrics file in metrics, the ``train``
subcommand in launcher.

Exit codes: 0 pass, 1 fail (a check failed, or none passed: "nothing was
checked: no GPU"; a cron job is never told that an unverified machine is
healthy), 2 usage error: a bad option, or an ``--output`` file that cannot be
written (checked before any check runs; the report is then replaced
atomically). A ``--metrics-file`` that cannot be written is named on stderr
before the checks run and changes neither the report nor the exit code. The
``train`` subcommand exits with torchrun's code (0 when the payload passed,
124 on timeout).

Options for tests: ``--sysfs-pci-dir``, ``--module-version-file``,
``--driver-proc-file``, ``--driver-lib-dir`` and the nvidia-smi found on PATH;
for the health checks ``--smi-query-file``, ``--nvlink-status-file``,
``--nvlink-errors-file``, ``--kernel-log-file``, ``--dcgm-json-file``,
``--sysfs-infiniband-dir`` and ``--sysfs-module-dir`` (a saved output is judged
as the live one would be, also on a machine without GPUs: a support bundle's
``nvidia-smi -q`` for one). ``--profile-overrides FILE`` (or the same JSON
object inline, ``--profile-overrides-json``) that cannot be read or names an
unknown profile or field is a usage error before any check runs.
``--driver-fact PATH`` reads the nvidia_driver role's local fact (see checks).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Sequence

from . import launcher
from .checks import (
    ALLREDUCE_MIB,
    CHECKS,
    GEMM_MIN_FRACTION,
    GEMM_SIZE,
    QUICK_ALLREDUCE_MIB,
    QUICK_GEMM_SIZE,
    QUICK_MEMBW_MIB,
    TRAIN_CPU_NPROC,
    build_report,
    summary_lines,
)
from .common import (
    EXIT_FAIL,
    EXIT_PASS,
    EXIT_USAGE,
    check_writable,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_int,
    program_name,
    write_atomically,
)
from .metrics import METRICS_FILE_MODE, metrics_text
from .profiles import load_overrides, parse_overrides

DESCRIPTION = "GPU health checks for gpufleet nodes: a library of small checks and a CLI."


def major_minor(text: str) -> str:
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR like 12.1, got {text!r}")
    return text


def library_version(text: str) -> str:
    if not re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR.PATCH like 2.21.5 or 9.1.0.70, got {text!r}")
    return text


def xid_codes(text: str) -> str:
    """Comma- or space-separated Xid codes ("48,79 119"), kept as given once checked."""
    if not re.fullmatch(r"\s*(\d+[\s,]*)*", text):
        raise argparse.ArgumentTypeError(f"expected Xid codes like 48,79,119, got {text!r}")
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=program_name(),
        description=DESCRIPTION,
        epilog=f"Multi-node training: {program_name()} train --help. Exit codes: 0 pass, 1 fail, 2 usage.",
    )
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the summary")
    p.add_argument("--output", type=Path, metavar="PATH", help="also write the JSON report to this file")
    p.add_argument(
        "--metrics-file",
        type=Path,
        metavar="PATH",
        help="also write the result as Prometheus metrics (text format, replaced atomically, mode 0644) "
        "to this file, e.g. node exporter's textfile directory; the directory must exist",
    )
    p.add_argument("--require-gpus", action="store_true", help="'no GPU' is a failure, not a skip")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=list(CHECKS),
        metavar="CHECK",
        help=f"leave a check out (repeatable): {', '.join(CHECKS)}",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smaller sizes: gemm n={QUICK_GEMM_SIZE}, memory copies {QUICK_MEMBW_MIB} MiB, "
        f"all-reduce {QUICK_ALLREDUCE_MIB} MiB",
    )
    p.add_argument("--expect-gpus", type=non_negative_int, metavar="N", help="fail with fewer GPUs than this")
    p.add_argument(
        "--expect-cuda", type=major_minor, metavar="X.Y", help="CUDA release torch must be built for, e.g. 12.1"
    )
    p.add_argument(
        "--expect-torch-cudnn",
        type=library_version,
        metavar="X.Y.Z",
        help="cuDNN build torch's wheels bring, e.g. 9.1.0.70 (compared on major.minor.patch with "
        "torch.backends.cudnn.version()); not the system's libcudnn8",
    )
    p.add_argument(
        "--expect-torch-nccl",
        type=library_version,
        metavar="X.Y.Z",
        help="NCCL build torch's wheels bring, e.g. 2.21.5 (compared on major.minor.patch with "
        "torch.cuda.nccl.version()); not the system's libnccl2",
    )
    p.add_argument(
        "--max-ecc-errors",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="most uncorrected (volatile) ECC errors per GPU (default 0)",
    )
    p.add_argument("--gemm-size", type=positive_int, metavar="N", help=f"matrix size n (default {GEMM_SIZE})")
    p.add_argument(
        "--gemm-min-fraction",
        type=fraction,
        default=GEMM_MIN_FRACTION,
        metavar="F",
        help="least fraction (above 0, at most 1) of the GPU model's achievable TFLOP/s, measured "
        f"figures where published (default {GEMM_MIN_FRACTION})",
    )
    p.add_argument(
        "--allreduce-mib",
        type=positive_int,
        metavar="MIB",
        help=f"all-reduce size in MiB (default: the per-SKU floor's size, else {ALLREDUCE_MIB})",
    )
    p.add_argument(
        "--busbw-min-nvlink",
        type=non_negative_float,
        default=100.0,
        metavar="GBPS",
        help="least bus bandwidth, GB/s, when all GPU pairs are NVLink/NVSwitch and the GPUs' profile "
        "has no floor for their count and message size (default 100)",
    )
    p.add_argument(
        "--busbw-min-pcie",
        type=non_negative_float,
        default=5.0,
        metavar="GBPS",
        help="least bus bandwidth, GB/s, otherwise (default 5)",
    )
    health = p.add_argument_group("health checks (gpu_errors, pcie, clocks, nvlink, xid, interconnect, dcgm)")
    health.add_argument(
        "--max-corrected-ecc",
        type=non_negative_int,
        metavar="N",
        help="warn above this many corrected (volatile) ECC errors per GPU (default: not judged); "
        "uncorrected ones: --max-ecc-errors",
    )
    health.add_argument(
        "--pcie-gen-policy",
        choices=("warn", "fail"),
        default="warn",
        help="a PCIe generation below the GPU's maximum: warn (default: an idle GPU lowers it) or fail",
    )
    health.add_argument(
        "--expect-mig",
        choices=("any", "enabled", "disabled"),
        default="any",
        help="MIG mode every GPU must be in (default: any, not judged)",
    )
    health.add_argument(
        "--nvlink-max-errors",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="warn when an NVLink error counter (nvidia-smi nvlink -e) is above N (default 0)",
    )
    health.add_argument(
        "--xid-window-hours",
        type=non_negative_float,
        default=24.0,
        metavar="H",
        help="judge the Xid/SXid events of the last H hours of the kernel log (default 24; 0: all)",
    )
    health.add_argument(
        "--xid-drain",
        type=xid_codes,
        default="",
        metavar="CODES",
        help="Xid codes that drain whatever NVIDIA's catalog says (comma-separated)",
    )
    health.add_argument(
        "--xid-ignore",
        type=xid_codes,
        default="",
        metavar="CODES",
        help="Xid codes to ignore whatever NVIDIA's catalog says (comma-separated)",
    )
    health.add_argument(
        "--expect-ib-ports",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="fail with fewer InfiniBand/RoCE ports ACTIVE at --ib-min-rate (default 0: not judged)",
    )
    health.add_argument(
        "--ib-min-rate",
        type=non_negative_float,
        default=0.0,
        metavar="GBITS",
        help="least port rate, Gb/s, e.g. 400 for NDR (default 0)",
    )
    health.add_argument(
        "--ib-link-layer",
        choices=("any", "InfiniBand", "Ethernet"),
        default="any",
        help="count InfiniBand or Ethernet (RoCE) ports only (default any)",
    )
    health.add_argument(
        "--expect-peermem", action="store_true", help="fail when nvidia_peermem (GPUDirect RDMA) is not loaded"
    )
    health.add_argument(
        "--dcgm-level",
        type=int,
        choices=(0, 1, 2, 3),
        default=1,
        help="dcgmi diag run level: 1 seconds, 2 about 2 min, 3 about 15 min; 0: not run (default 1)",
    )
    health.add_argument(
        "--dcgm-timeout",
        type=positive_int,
        metavar="S",
        help="seconds before dcgmi diag is stopped (default: 300, 900, 2700 for levels 1, 2, 3)",
    )
    overrides = health.add_mutually_exclusive_group()
    overrides.add_argument(
        "--profile-overrides",
        type=Path,
        metavar="FILE",
        help='JSON object of per-SKU figures laid over the table, {"H200": '
        '{"allreduce_8gpu_busbw_gbps": 440}}; unknown names are refused',
    )
    overrides.add_argument(
        "--profile-overrides-json",
        metavar="JSON",
        help="the same object given on the command line (gpu_verify passes it so)",
    )
    p.add_argument("--train", action="store_true", help="also run the training payload on every GPU")
    p.add_argument(
        "--train-nproc",
        type=positive_int,
        metavar="N",
        help=f"training processes (default: one per GPU, {TRAIN_CPU_NPROC} without GPUs)",
    )
    p.add_argument(
        "--train-timeout",
        type=positive_int,
        default=launcher.TRAIN_TIMEOUT_S,
        metavar="S",
        help=f"seconds before training is stopped (default {launcher.TRAIN_TIMEOUT_S})",
    )
    p.add_argument("--payload", type=Path, metavar="PATH", help=launcher.PAYLOAD_HELP)
    where = p.add_argument_group("where host facts are read (tests point these at fake files)")
    where.add_argument(
        "--sysfs-pci-dir",
        default="/sys/bus/pci/devices",
        metavar="DIR",
        help="PCI devices, each with vendor and class files (default %(default)s)",
    )
    where.add_argument(
        "--module-version-file",
        default="/sys/module/nvidia/version",
        metavar="PATH",
        help="version of the loaded nvidia module (default %(default)s)",
    )
    where.add_argument(
        "--driver-proc-file",
        default="/proc/driver/nvidia/version",
        metavar="PATH",
        help="its fallback, an 'NVRM version:' line (default %(default)s)",
    )
    where.add_argument(
        "--driver-fact",
        default="",
        metavar="PATH",
        help="the nvidia_driver role's local fact (e.g. /etc/ansible/facts.d/nvidia_driver.fact): "
        "run when executable, else read as JSON; its requested/pinned driver version and "
        "source go in the report's versions, a missing or broken fact in its notes "
        "(default: not read)",
    )
    where.add_argument(
        "--driver-lib-dir",
        action="append",
        metavar="DIR",
        help="look for libnvidia-ml/libcuda here instead of asking ldconfig (repeatable)",
    )
    where.add_argument(
        "--smi-query-file",
        metavar="PATH",
        help="a saved nvidia-smi -q -x (or -q) output to judge instead of running nvidia-smi -q -x",
    )
    where.add_argument(
        "--nvlink-status-file", metavar="PATH", help="a saved nvidia-smi nvlink --status output instead of running it"
    )
    where.add_argument(
        "--nvlink-errors-file", metavar="PATH", help="a saved nvidia-smi nvlink -e output (with --nvlink-status-file)"
    )
    where.add_argument(
        "--kernel-log-file",
        metavar="PATH",
        help="a saved kernel log (journalctl -k -o short-iso, dmesg --time-format iso, ...) instead "
        "of journalctl -k / dmesg",
    )
    where.add_argument("--dcgm-json-file", metavar="PATH", help="a saved dcgmi diag -j output instead of running dcgmi")
    where.add_argument(
        "--sysfs-infiniband-dir",
        default="/sys/class/infiniband",
        metavar="DIR",
        help="InfiniBand/RoCE devices, each with ports/<n>/{state,phys_state,rate,link_layer} (default %(default)s)",
    )
    where.add_argument(
        "--sysfs-module-dir",
        default="/sys/module",
        metavar="DIR",
        help="loaded kernel modules, for nvidia_peermem (default %(default)s)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        return launcher.train_main(argv[1:])
    args = parse_args(argv)  # exits 2 on a bad option
    problem = check_writable(args.output) if args.output is not None else None
    if problem:  # before any check runs: a report that cannot be kept is a usage error
        print(f"{program_name()}: --output {args.output}: cannot be written ({problem})", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if args.profile_overrides is not None or args.profile_overrides_json is not None:
        option = "--profile-overrides" if args.profile_overrides is not None else "--profile-overrides-json"
        try:
            if args.profile_overrides is not None:
                load_overrides(str(args.profile_overrides))
            else:
                parse_overrides(args.profile_overrides_json)
        except ValueError as exc:  # before any check runs, like a bad option
            print(f"{program_name()}: {option} {exc}", file=sys.stderr, flush=True)
            return EXIT_USAGE
    metrics_file = args.metrics_file
    if metrics_file is not None and (problem := metrics_problem(metrics_file)):
        print(f"gpufleet_check: metrics not written to {metrics_file}: {problem}", file=sys.stderr, flush=True)
        metrics_file = None
    report = build_report(args)
    text = json.dumps(report, indent=2, allow_nan=False)
    code = EXIT_PASS if report["verdict"] == "pass" else EXIT_FAIL
    if args.output is not None:
        try:
            write_atomically(args.output, text + "\n")
        except OSError as exc:  # it could be written a moment ago: a full disk, a removed directory
            print(f"{program_name()}: --output {args.output}: not written ({exc})", file=sys.stderr, flush=True)
            code = EXIT_USAGE
    if metrics_file is not None:
        try:
            write_metrics(report, metrics_file)
        except OSError as exc:
            print(f"gpufleet_check: metrics not written to {metrics_file}: {exc}", file=sys.stderr, flush=True)
    print(text if args.json else "\n".join(summary_lines(report)), flush=True)
    return code


def write_metrics(report: dict, path: Path) -> None:
    """Replace path atomically with the report's metrics (metrics.metrics_text), mode 0644; OSError when it
    cannot be written. The temporary file starts with a dot and ends in .tmp: node exporter reads only *.prom."""
    write_atomically(path, metrics_text(report), METRICS_FILE_MODE)


def metrics_problem(path: Path) -> str | None:
    """Why the metrics file cannot be written, or None. Its directory is not created: node exporter's
    package or the monitoring role makes it."""
    if not path.parent.is_dir():
        return f"no directory {path.parent}"
    return check_writable(path)
