#!/usr/bin/env bash
# The GPU-only checks, for a machine with an NVIDIA GPU and a CUDA build of
# torch (not part of `make test`: CI has no GPU). Runs the standalone health
# check (gpufleet_check.pyz, with the payload on every GPU) and the payload's
# GPU paths (DDP/bf16, fp16 with GradScaler, DataParallel, gradient
# accumulation, profiler traces), and writes each JSON result to OUTDIR,
# with stack.json: the torch build it ran and how it differs from the matrix.
# The raw tool outputs the health checks parse are saved under OUTDIR/raw
# (nvidia-smi -q -x and -q, nvlink status and error counters, topology, the
# remapped-rows query, kernel-log Xid lines, dcgmi diag -r 1 -j where DCGM is
# installed, the InfiniBand ports in sysfs), with raw/STACK.txt naming the
# driver, GPUs and kernel they came from: test inputs for tests/unit/data/gpu/
# (each file there cites its source; these would cite "the H200 of
# tests/gpu/device-check.sh, <date>", with STACK.txt).
#
#   tests/gpu/device-check.sh [PYTHON] [OUTDIR]
set -uo pipefail
py=${1:-python3}
out=${2:-/tmp/gpufleet-gpu-check}
here=$(cd "$(dirname "$0")/../.." && pwd)
payload=$here/roles/payload/files
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
step() {  # step NAME COMMAND...: runs it, keeps its output, records failures
  local name=$1; shift
  echo "=== $name: $*"
  local began=$SECONDS
  "$@" >"$out/$name.out" 2>"$out/$name.err"
  local rc=$?
  echo "--- $name: rc $rc in $((SECONDS - began)) s"
  tail -n 15 "$out/$name.err"
  [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
# Which stack this run measured, and whether it is the matrix's (a machine
# without network access may have another torch): $out/stack.json.
"$py" "$here/tests/gpu/stack_record.py" "$here/files/compatibility.yml" "$out/stack.json" || status=1

raw=$out/raw
mkdir -p "$raw"
{ date -u +%FT%TZ; uname -r; nvidia-smi --query-gpu=name,pci.device_id,driver_version,vbios_version --format=csv,noheader
  cat /proc/driver/nvidia/version 2>/dev/null; dcgmi --version 2>/dev/null | head -n 3; } > "$raw/STACK.txt" 2>&1
capture() {  # capture FILE COMMAND...: its stdout and stderr, and its exit status at the end of the .rc file
  local file=$1; shift
  timeout 300 "$@" > "$raw/$file" 2>&1; echo $? > "$raw/$file.rc"
}
capture nvidia-smi-q.xml nvidia-smi -q -x
capture nvidia-smi-q.txt nvidia-smi -q
capture nvlink-status.txt nvidia-smi nvlink --status
capture nvlink-errors.txt nvidia-smi nvlink -e
capture topo.txt nvidia-smi topo -m
capture remapped-rows.csv nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure --format=csv
capture xid.log sh -c 'journalctl -k --no-pager -o short-iso 2>/dev/null | grep -E "NVRM: Xid|SXid" || dmesg --time-format iso 2>/dev/null | grep -E "NVRM: Xid|SXid"; true'
command -v dcgmi >/dev/null && capture dcgmi-diag-r1.json dcgmi diag -r 1 -j
capture dmesg-tail.log sh -c 'dmesg --time-format iso 2>/dev/null | tail -n 300; true'
capture nvidia-modules.txt sh -c 'for m in nvidia nvidia_uvm nvidia_modeset nvidia_peermem nv_peer_mem; do printf "%s: %s\n" "$m" "$(cat /sys/module/$m/version 2>/dev/null || echo absent)"; done'
capture gpu-pci-links.txt sh -c 'for d in /sys/bus/pci/devices/*; do [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue; for f in device class current_link_speed current_link_width max_link_speed max_link_width; do printf "%s/%s: %s\n" "$d" "$f" "$(cat "$d/$f" 2>/dev/null)"; done; done'
capture infiniband.txt sh -c 'for p in /sys/class/infiniband/*/ports/*; do [ -d "$p" ] || continue; for f in state phys_state rate link_layer; do printf "%s/%s: %s\n" "$p" "$f" "$(cat "$p/$f" 2>/dev/null)"; done; done; true'

step check "$py" "$payload/gpufleet_check.pyz" --require-gpus --train --json --output "$out/check.json"
# Slurm's health check runs this tier (roles/slurm/vars/main.yml, __slurm_health_check_args) under
# slurm_health_check_timeout (40 s): its time on a real GPU is the figure that limit rests on.
step slurm_quick "$py" "$payload/gpufleet_check.pyz" --quick --dcgm-level 0 --require-gpus --json --output "$out/slurm_quick.json"
nproc=$("$py" -c 'import torch; print(torch.cuda.device_count())')
common=(--steps 60 --hidden 4096 --num-samples 65536 --batch-size 2048 --json)
# NCCL's own INFO log of this run (transport, GPUDirect RDMA: what gpufleet_check.nccl reads) as a test input.
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$raw/nccl-ddp-bf16.%h.%p.log" \
step ddp_bf16 "$py" -m torch.distributed.run --standalone --nproc-per-node="$nproc" "$payload/train.py" "${common[@]}" \
  --amp bf16 --grad-accum 4 --profile-dir "$out/profile" --result "$out/ddp_bf16.json"
step ddp_fp16 "$py" -m torch.distributed.run --standalone --nproc-per-node="$nproc" "$payload/train.py" "${common[@]}" \
  --amp fp16 --result "$out/ddp_fp16.json"
step ddp_fp32 "$py" -m torch.distributed.run --standalone --nproc-per-node="$nproc" "$payload/train.py" "${common[@]}" \
  --amp off --result "$out/ddp_fp32.json"
step dp_bf16 "$py" "$payload/train.py" --mode dp "${common[@]}" --amp bf16 --empty-cache --result "$out/dp_bf16.json"
"$py" - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("ddp_bf16", "ddp_fp16", "ddp_fp32", "dp_bf16"):
    path = out / f"{name}.json"
    if not path.exists():
        print(f"{name:9s} no result"); continue
    r = json.loads(path.read_text())
    peak = max((p or 0) for p in r["peak_memory_bytes"]) / 2**20
    print(f"{name:9s} {r['verdict']:4s} world {r['world_size']} amp {r['amp']:4s} loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}"
          f"  {r['samples_per_s']:.0f} samples/s  peak {peak:.0f} MiB")
for report in ("check", "slurm_quick"):
    path = out / f"{report}.json"
    if not path.exists():
        print(f"{report}: no report"); continue
    check = json.loads(path.read_text())
    print(f"--- {report}: {check['duration_s']} s")
    for c in check["checks"]:
        figure = "" if c.get("value") is None else f" [{c['value']} {c.get('unit') or ''} vs {c.get('threshold')}]"
        print(f"{c['verdict'].upper():7s} {c['name']}{figure}: {c['detail']}")
    print("verdict", check["verdict"], check["reasons"])
PY
ls "$out/profile" 2>/dev/null | head -n 3
exit $status
