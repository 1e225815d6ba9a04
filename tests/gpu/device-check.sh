#!/bin/bash
# The GPU-only checks, for a machine with an NVIDIA GPU and a CUDA build of
# torch (not part of `make test`: CI has no GPU). Runs the standalone health
# check (gpufleet_check.pyz, with the payload on every GPU) and the payload's
# GPU paths (DDP/bf16, fp16 with GradScaler, DataParallel, gradient
# accumulation, profiler traces), and writes each JSON result to OUTDIR,
# with stack.json: the torch build it ran and how it differs from the matrix.
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

step check "$py" "$payload/gpufleet_check.pyz" --require-gpus --train --json --output "$out/check.json"
"$py" "$payload/gpufleet_check.pyz" --require-gpus --quick --skip gemm 2>/dev/null | tail -n 12
nproc=$("$py" -c 'import torch; print(torch.cuda.device_count())')
common=(--steps 60 --hidden 4096 --num-samples 65536 --batch-size 2048 --json)
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
check = json.loads((out / "check.json").read_text()) if (out / "check.json").exists() else None
if check:
    for c in check["checks"]:
        print(f"{c['verdict'].upper():7s} {c['name']}: {c['detail']}")
    print("verdict", check["verdict"], check["reasons"])
PY
ls "$out/profile" 2>/dev/null | head -n 3
exit $status
