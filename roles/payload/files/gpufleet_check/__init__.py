"""gpufleet_check: GPU health checks for gpufleet nodes, a library of small checks and a CLI.

The checks judge the NVIDIA driver (loaded module against installed
userspace), nvidia-smi's inventory, torch's CUDA and its libraries, GEMM
TFLOP/s, all-reduce bus bandwidth and the GPU topology, the passive health
signals (remapped rows, ECC, PCIe links, clock event reasons, NVLink and
Fabric Manager, kernel-log Xids, InfiniBand/RoCE ports) and DCGM's
diagnostic, and report one JSON
document; ``--train`` and the ``train`` subcommand also run the DDP payload
(train.py) under torchrun. Standard library only to start: torch is imported
when a check needs it, so the checks run, and report torch as missing, under
a python without torch.

Modules (each reads on its own; the arrows are their imports)::

    common         small shared helpers: exit codes, check_result, no_gpu, read_text, ...
    facts          host facts without torch: PCI bus, driver versions, nvidia-smi, topology   -> common
    launcher       train.py under torchrun, process-tree cleanup, the `train` subcommand      -> common, nccl
    nccl           NCCL's INFO log: transport and GPUDirect RDMA; the smoke network verdict (standard library only)
    profiles       per-SKU thresholds, each with its source; site overrides                    -> common
    health         nvidia-smi -q / -q -x, nvlink and sysfs InfiniBand parsers and judgements  -> common, profiles
    xid            kernel-log Xid/SXid parser and NVIDIA's Xid catalog                        (standard library only)
    dcgm           dcgmi diag -j JSON (DCGM 3 and 4) parser and judgement                     (standard library only)
    health_checks  the passive health checks and dcgm: their inputs and verdicts              -> common, facts, health,
                                                                                                 profiles, xid, dcgm
    checks         the checks, the JSON report and its summary                                -> common, facts,
                                                                                                 launcher, health,
                                                                                                 health_checks, profiles
    metrics        the report as Prometheus metrics text (cli writes it)                      (standard library only)
    cli            options and main()                                                        -> checks, launcher,
                                                                                                 metrics, common,
                                                                                                 profiles

A node receives one file: roles/payload/files/gpufleet_check.pyz, a zipapp of this
package built reproducibly by tools/build_pyz.py (``make payload-build``;
``--check`` says whether the committed one is current)::

    python3 gpufleet_check.pyz --json                  # cli's docstring has every command
    PYTHONPATH=roles/payload/files python3 -m gpufleet_check --json       # the same, from a checkout

Exit codes: 0 pass, 1 fail, 2 usage error; ``train``: torchrun's (124 on timeout).
"""

from .facts import count_pci_gpus

__all__ = ["count_pci_gpus"]
