#!/usr/bin/env bash
# The mechanism of the paper's Fig. 2 without a long failing run: train a base model with no failures, then lose
# every middle stage (1 < i < S) of the trained state and rebuild it with every neighbour rule (random, copy, zero,
# average, checkfree, checkfree_plus), SEEDS seeds each, measuring validation loss after 0, 1, 10 and STEPS steps
# of continued training (`python -m checkfree probe`). Writes OUT/probe/probe.md (mean ± 95 % interval per cell,
# and which of Fig. 2's orderings are separated by non-overlapping intervals), probe.json and probe.png.
#
# usage: benchmarks/fig2_probe.sh                                        # tiny config, 1,500 base iterations
#        CONFIG=small_config.json ITERATIONS=1000 SEEDS=3 STEPS=50 benchmarks/fig2_probe.sh   # deeper stages
#        SWAPS=1 benchmarks/fig2_probe.sh                                # base and probe with CheckFree+ swaps
#        SMOKE=1 benchmarks/fig2_probe.sh                                # a minute: 20 base iterations, K = 2
#        DRY_RUN=1 benchmarks/fig2_probe.sh                              # print the two commands; run nothing
#
# Environment (defaults in brackets): CONFIG [tiny_config.json] ITERATIONS [1500] SEEDS [5] STEPS [100]
#   STRATEGIES [random,copy,zero,average,checkfree,checkfree_plus] SWAPS [0] OUT [runs/fig2_probe/<config stem>,
#   with -swaps appended when SWAPS=1] JOBS [1]. JOBS=N runs the probe as N processes sharing its cells (`probe
#   --shard K/N`; each with nproc/N threads, or SHARD_THREADS), so it finishes about N times sooner; their logs
#   are OUT/probe-shard<K>.log. SWAPS=1 trains the base with swaps (run.sh) and every probe cell with swaps
#   (`probe --swaps`): CheckFree+ in its own regime, every rule on the same footing.
# The base run is kept: a second invocation with the same OUT reuses it (delete OUT/base to retrain), and the probe
# resumes from the cells it finished (OUT/probe/cells.jsonl), so a killed benchmark loses at most one cell.
#
# Runtime (measured on this project's 2-core machine, OMP_NUM_THREADS=1, the other core busy): tiny defaults 2 h
# 23 min (65 cells × 100 steps); small config (1,000 base iterations at ≈ 5 s each, then 42 cells × 50 steps)
# ≈ 4–5 h. On shared cores, OMP_NUM_THREADS=1. On 2 idle cores with JOBS=2 OMP_NUM_THREADS=2: SWAPS=1 tiny
# defaults 1 h 14 min (base 16 min, 65 cells in 57 min); small config 2 h 31 min (base 50 min, 42 cells in 100 min).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

if [ -n "${SMOKE:-}" ] && [ "${SMOKE}" != 0 ]; then
  : "${ITERATIONS:=20}" "${SEEDS:=2}" "${STEPS:=2}" "${STRATEGIES:=random,checkfree}" "${OUT:=runs/fig2_probe_smoke}"
fi
CONFIG=${CONFIG:-tiny_config.json}
ITERATIONS=${ITERATIONS:-1500}
SEEDS=${SEEDS:-5}
STEPS=${STEPS:-100}
STRATEGIES=${STRATEGIES:-random,copy,zero,average,checkfree,checkfree_plus}
SWAPS=${SWAPS:-0}
JOBS=${JOBS:-1}
stem=$(basename "$CONFIG" .json)
case "$SWAPS" in 0) launcher=run_2.sh; swap_flag=(); suffix="" ;; 1) launcher=run.sh; swap_flag=(--swaps); suffix=-swaps ;;
  *) echo "SWAPS is '$SWAPS'; expected 0 or 1." >&2; exit 2 ;; esac
OUT=${OUT:-runs/fig2_probe/$stem$suffix}

for v in ITERATIONS SEEDS STEPS JOBS; do
  case "${!v}" in ''|*[!0-9]*|0) echo "$v is '${!v}'; expected a positive integer." >&2; exit 2;; esac
done
config_path=$CONFIG
[ -f "$config_path" ] || config_path="$root/configs/$CONFIG"
[ -f "$config_path" ] || { echo "CONFIG $CONFIG not found (looked in . and configs/)." >&2; exit 2; }
n_stages=$("$py" -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["n_stages"]))' "$config_path")
[ "$n_stages" -ge 3 ] || { echo "CONFIG has $n_stages stages; the probe needs a middle stage (S ≥ 3)." >&2; exit 2; }
stages=$(seq -s, 2 $((n_stages - 1)))

base_cmd=("$root/simulate_training/$launcher" no_failure 1 16 "$CONFIG" 0 --max-iterations "$ITERATIONS"
  --eval-interval "$ITERATIONS" --no-progress --run-dir "$OUT/base")
probe_cmd=("$py" -m checkfree probe "$OUT/base" --stages "$stages" --strategies "$STRATEGIES" --seeds "$SEEDS"
  --steps "$STEPS" --out "$OUT/probe" "${swap_flag[@]}")
if [ -n "${DRY_RUN:-}" ] && [ "${DRY_RUN}" != 0 ]; then
  echo "${base_cmd[*]}"
  if [ "$JOBS" = 1 ]; then echo "${probe_cmd[*]}"; else
    for k in $(seq 1 "$JOBS"); do echo "${probe_cmd[*]} --shard $k/$JOBS &"; done
  fi
  exit 0
fi
t0=$SECONDS
if [ ! -f "$OUT/base/summary.json" ]; then
  # A base killed part-way resumes from its newest run checkpoint (every 500 iterations: --checkpoint-interval).
  start=0
  if [ -d "$OUT/base/checkpoints" ]; then
    start=$("$py" -c 'import sys; from checkfree.checkpoint.store import list_checkpoints, read_checkpoint
found = list_checkpoints(sys.argv[1]); print(read_checkpoint(found[-1]).meta["iteration"] if found else 0)' \
      "$OUT/base/checkpoints")
  fi
  if [ "$start" = 0 ] && [ -d "$OUT/base" ] && [ -n "$(ls -A "$OUT/base")" ]; then
    echo "$OUT/base holds an unfinished base run with no checkpoint to resume from; delete it to retrain." >&2
    exit 2
  fi
  echo "[fig2_probe] base: $CONFIG, $ITERATIONS iterations without failures → $OUT/base (from iteration $start)"
  base_cmd[5]=$start
  "${base_cmd[@]}"
fi
echo "[fig2_probe] base ready after $((SECONDS - t0)) s; probing stages $stages with $STRATEGIES, $SEEDS seeds, K = $STEPS"
if [ "$JOBS" = 1 ]; then
  "${probe_cmd[@]}"
else
  # JOBS shards into one OUT/probe (`probe --shard K/N`); the last to finish writes the report. On an interrupt
  # only the shards started here are stopped, by process id.
  # Each shard gets its share of the cores (SHARD_THREADS overrides), so the base may use them all.
  threads=${SHARD_THREADS:-$(( $(nproc) / JOBS > 0 ? $(nproc) / JOBS : 1 ))}
  pids=()
  trap 'kill "${pids[@]}" 2>/dev/null; exit 130' INT TERM
  for k in $(seq 1 "$JOBS"); do
    OMP_NUM_THREADS=$threads "${probe_cmd[@]}" --shard "$k/$JOBS" > "$OUT/probe-shard$k.log" 2>&1 &
    pids+=($!)
  done
  failed=0
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}" || { failed=1; echo "[fig2_probe] shard $((k + 1))/$JOBS failed: see its log" >&2; }
  done
  trap - INT TERM
  tail -n 1 "$OUT"/probe-shard*.log
  [ "$failed" = 0 ] || exit 1
fi
echo "[fig2_probe] done in $((SECONDS - t0)) s: $OUT/probe/probe.md"
