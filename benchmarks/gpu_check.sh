#!/usr/bin/env bash
# The simulator and the swarm on CUDA at paper scale (benchmarks/gpu_check.py; sections in gpu_check_sections.py):
# 124M tokens/s, MFU, peak memory, staged ÷ plain, bf16 autocast on/off; the paper's Table 2 model; the 1.5B
# config with activation checkpointing (measured peak beside the estimate); recovery CUDA vs CPU; the swarm with
# a whole-stage crash; tiny and small under failures; 124M with --compile if time remains. Every row as it comes
# in OUT_DIR/gpu_check.md and gpu_check.json; the default sections end within 8 min on one H100.
# usage: benchmarks/gpu_check.sh [--sections 1,3,5] [--budgets N=S,...] [--deadline S]   on a GPU machine
#        benchmarks/gpu_check.sh --plan [--sections ...]     any machine: every section's inputs at full size, no training
#        SMOKE=1 DEVICE=cpu benchmarks/gpu_check.sh          every section's logic on the CPU, micro sizes
# Environment: DEVICE (cuda | cpu), SMOKE=1, SECTIONS (as --sections), OUT_DIR (default runs/gpu_check-<UTC time>).
# With DEVICE=cuda (and no --plan): "no GPU: skipped" and exit code 0 only where nvidia-smi is missing or lists no
# GPU; where it lists one but torch sees none (a CPU build of torch, or a CUDA build the driver cannot run), exit
# code 1 with torch's version and CUDA build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
# torch.cuda.is_available() through NVML: no CUDA context in a process that forks (datasets' map, swarm nodes).
export PYTORCH_NVML_BASED_CUDA_CHECK=${PYTORCH_NVML_BASED_CUDA_CHECK:-1}

device=${DEVICE:-cuda}
case "$device" in cuda|cpu) ;; *) echo "DEVICE is '$device'; expected cuda or cpu." >&2; exit 2;; esac
plan=0
for arg in "$@"; do [ "$arg" != --plan ] || plan=1; done
if [ "$device" = cuda ] && [ "$plan" = 0 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "no GPU: skipped (no nvidia-smi)"
    exit 0
  fi
  gpus=$(timeout 60 nvidia-smi -L 2>&1) && listed=$(grep -c '^GPU [0-9]' <<<"$gpus") || listed=0
  first=$(head -1 <<<"$gpus")
  if [ "$listed" -eq 0 ]; then
    echo "no GPU: skipped (nvidia-smi -L lists none${first:+: $first})"
    exit 0
  fi
  # CUDA initialised for real (a one-off process): with the NVML check alone, a driver too old for torch's
  # CUDA build would pass here and fail in the first section.
  if ! "$py" - "$listed" "$first" <<'EOF'
import sys

import torch

try:
    torch.cuda.init()
    torch.empty(1, device="cuda")
    sys.exit(0)
except Exception as e:  # any failure to use CUDA is the answer here, in torch's words
    why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
print(
    f"gpu_check: nvidia-smi lists {sys.argv[1]} GPU(s) ({sys.argv[2]}) but torch {torch.__version__}, {build}, "
    f"sees none ({why}); expected a CUDA build of torch that this driver runs.",
    file=sys.stderr,
)
sys.exit(1)
EOF
  then
    exit 1
  fi
fi
args=(--device "$device")
if [ "${SMOKE:-0}" != 0 ]; then
  args+=(--smoke)
fi
if [ -n "${SECTIONS:-}" ]; then
  args+=(--sections "$SECTIONS")
fi
exec "$py" "$root/benchmarks/gpu_check.py" "${args[@]}" "$@"
