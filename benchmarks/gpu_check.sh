#!/usr/bin/env bash
# The simulator on CUDA (issue 12): throughput and MFU of the 124M config, with and without --compile, the tiny
# and small configs under failures, a recovery on CUDA vs CPU, and the swarm on CUDA with a whole-stage crash
# (issue 11); one table at the end (benchmarks/gpu_check.py).
# usage: benchmarks/gpu_check.sh                      on a CUDA machine ("no CUDA device: skipped" elsewhere)
#        SMOKE=1 DEVICE=cpu benchmarks/gpu_check.sh   every section's logic on the CPU, micro sizes
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

device=${DEVICE:-cuda}
case "$device" in cuda|cpu) ;; *) echo "DEVICE is '$device'; expected cuda or cpu." >&2; exit 2;; esac
if [ "$device" = cuda ] && ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: skipped"
  exit 0
fi
args=(--device "$device")
if [ "${SMOKE:-0}" != 0 ]; then
  args+=(--smoke)
fi
exec "$py" "$root/benchmarks/gpu_check.py" "${args[@]}"
