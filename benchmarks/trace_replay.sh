#!/usr/bin/env bash
# A real preemption trace replayed through the simulator for every strategy, on the same failures (issue 23):
# the Bamboo p3 trace (AWS p3 spot instances, 11.4 h) mapped onto S stages × R replicas, then one run per
# strategy with that schedule, then one report.
#
# usage: benchmarks/trace_replay.sh                      # the whole p3 trace, 12 × 2, 300 s per iteration
#        DRY_RUN=1 benchmarks/trace_replay.sh            # print the commands; run and write nothing
#
# Environment (defaults in brackets):
#   TRACE [failure_traces/bamboo-p3-trace.csv]  STAGES [12]  REPLICAS [2]  ITERATION_SECONDS [300]
#   START_HOURS [0]  HOURS [the whole trace]  CONFIG [tiny_config.json]  SEED [0]  EVAL_INTERVAL [25]
#   CHECKPOINT_INTERVAL [10: as configs/swarm_tiny.json; the tiny config's 100 would redo ≈ 50 iterations per loss]
#   STRATEGIES [no_failure checkfree checkfree_plus checkpoint ladder]  OUT [runs/trace_p3]
#   SKIP_EXISTING [1: a run whose summary.json exists is not run again]
#
# The run length is the schedule's: every iteration of the trace window is trained (max_iterations is set to the
# schedule's iterations). 300 s per iteration maps the 11.4 h trace to 137 iterations with 20 whole-stage losses
# on 12 × 2, the schedule benchmarks/trace_replay_swarm.sh replays through the swarm (91.32 s, the paper's
# iteration time, gives 449 iterations and 18 losses); the choice keeps a run of the tiny config with 12 stages to
# minutes (≈ 5 s per iteration on one shared core).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

TRACE=${TRACE:-failure_traces/bamboo-p3-trace.csv}
STAGES=${STAGES:-12}
REPLICAS=${REPLICAS:-2}
ITERATION_SECONDS=${ITERATION_SECONDS:-300}
START_HOURS=${START_HOURS:-0}
HOURS=${HOURS:-}
CONFIG=${CONFIG:-tiny_config.json}
SEED=${SEED:-0}
EVAL_INTERVAL=${EVAL_INTERVAL:-25}
CHECKPOINT_INTERVAL=${CHECKPOINT_INTERVAL:-10}
STRATEGIES=${STRATEGIES:-"no_failure checkfree checkfree_plus checkpoint ladder"}
OUT=${OUT:-runs/trace_p3}
SKIP_EXISTING=${SKIP_EXISTING:-1}
dry=0; if [ -n "${DRY_RUN:-}" ] && [ "${DRY_RUN}" != 0 ]; then dry=1; fi

for v in STAGES REPLICAS SEED EVAL_INTERVAL CHECKPOINT_INTERVAL; do
  case "${!v}" in ''|*[!0-9]*) echo "$v is '${!v}'; expected a non-negative integer." >&2; exit 2;; esac
done
schedule="$OUT/schedule.json"
window=(--start-hours "$START_HOURS"); [ -n "$HOURS" ] && window+=(--hours "$HOURS")
gen=("$py" "$root/failure_generator.py" --trace "$TRACE" --stages "$STAGES" --replicas "$REPLICAS"
     --iteration-seconds "$ITERATION_SECONDS" "${window[@]}")
if [ "$dry" = 1 ]; then
  echo "${gen[*]} --out $schedule"
  iterations='$(iterations of the schedule)'
else
  mkdir -p "$OUT/runs" "$OUT/logs"
  if [ ! -f "$schedule" ]; then "${gen[@]}" --out "$schedule" || exit $?; fi
  "$py" "$root/failure_generator.py" --describe "$schedule" | tee "$OUT/schedule.txt"
  iterations=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["iterations"])' "$schedule")
fi

stem=$(basename "$CONFIG" .json)
for s in $STRATEGIES; do
  case "$s" in
    checkfree_plus) launcher=run.sh; setting=ours-grad-avg ;;   # CheckFree+ = swaps on
    checkfree) launcher=run_2.sh; setting=ours-grad-avg ;;      # CheckFree = swaps off
    ladder) launcher=run.sh; setting=ladder ;;                 # its neighbour rung is CheckFree+
    *) launcher=run_2.sh; setting=$s ;;
  esac
  dir="$OUT/runs/$stem-p3-$s"
  cmd=("$root/simulate_training/$launcher" "$setting" 1 16 "$CONFIG" 0 --set "n_stages=$STAGES" \
       --set "checkpoint_interval=$CHECKPOINT_INTERVAL"
       --max-iterations "$iterations" --eval-interval "$EVAL_INTERVAL" --seed "$SEED"
       --failure-schedule "$schedule" --no-progress --run-dir "$dir")
  if [ "$dry" = 1 ]; then echo "${cmd[*]}"; continue; fi
  if [ "$SKIP_EXISTING" != 0 ] && [ -f "$dir/summary.json" ]; then echo "skip $s (done)"; continue; fi
  rm -rf "$dir"
  t0=$SECONDS
  "${cmd[@]}" > "$OUT/logs/$s.log" 2>&1
  echo "$(date '+%F %T') $s: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/progress.log"
done

report=("$py" -m checkfree report "$OUT/runs" --out "$OUT/report")
if [ "$dry" = 1 ]; then echo "${report[*]}"; exit 0; fi
"${report[@]}" 2>&1 | tail -n 3
