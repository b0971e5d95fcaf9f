#!/usr/bin/env bash
# A real preemption trace replayed through the swarm (issue 23): the Bamboo p3 trace mapped onto the swarm's
# 12 transformer stages × 2 replicas, then one `swarm run` per setting on that schedule, then `swarm table`.
# A slot stays down until its node comes back; a stage with every replica down is lost and the swarm waits for
# the first returning node, which recovers it by the setting's rule. The run ends with the trace's window.
#
# usage: benchmarks/trace_replay_swarm.sh                 # the whole p3 trace, 300 s per iteration
#        DRY_RUN=1 benchmarks/trace_replay_swarm.sh       # print the commands; run and write nothing
#
# Environment (defaults in brackets):
#   TRACE [failure_traces/bamboo-p3-trace.csv]  ITERATION_SECONDS [300]  START_HOURS [0]  HOURS [the whole trace]
#   CONFIG [swarm_tiny_12x2.json: 13 stages × 2 replicas = 26 node processes, ≈ 10 GiB of RAM]
#   SETTINGS [ours checkpoint]  TIME_SCALE [the config's: 1 = real WAN delays]  OUT [runs/trace_p3_swarm]
#
# 300 s per iteration maps the 11.4 h trace to 137 schedule iterations with 20 whole-stage losses and 116
# iterations with every stage alive (`failure_generator.py --describe`); on 2 busy cores one `ours` run took
# about half an hour.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

TRACE=${TRACE:-failure_traces/bamboo-p3-trace.csv}
ITERATION_SECONDS=${ITERATION_SECONDS:-300}
START_HOURS=${START_HOURS:-0}
HOURS=${HOURS:-}
CONFIG=${CONFIG:-swarm_tiny_12x2.json}
SETTINGS=${SETTINGS:-"ours checkpoint"}
TIME_SCALE=${TIME_SCALE:-}
OUT=${OUT:-runs/trace_p3_swarm}
dry=0; if [ -n "${DRY_RUN:-}" ] && [ "${DRY_RUN}" != 0 ]; then dry=1; fi

stages=$("$py" -c 'import sys; from checkfree.swarm.config import load_swarm_config as l; c = l(sys.argv[1]); print(c.n_stages, c.replicas)' "$CONFIG") || exit 2
read -r n_stages replicas <<< "$stages"
schedule="$OUT/schedule.json"
window=(--start-hours "$START_HOURS"); [ -n "$HOURS" ] && window+=(--hours "$HOURS")
gen=("$py" "$root/failure_generator.py" --trace "$TRACE" --stages "$n_stages" --replicas "$replicas"
     --iteration-seconds "$ITERATION_SECONDS" "${window[@]}" --out "$schedule")
scale=(); [ -n "$TIME_SCALE" ] && scale=(--time-scale "$TIME_SCALE")
if [ "$dry" = 1 ]; then
  echo "${gen[*]}"
else
  mkdir -p "$OUT/runs"
  if [ ! -f "$schedule" ]; then "${gen[@]}" || exit $?; fi
  "$py" "$root/failure_generator.py" --describe "$schedule" | tee "$OUT/schedule.txt"
fi
dirs=()
for setting in $SETTINGS; do
  dir="$OUT/runs/swarm-p3-$setting"
  dirs+=("$dir")
  # --iterations far above the trace's: the replay ends with the trace's window (throughput.json ended_by)
  cmd=("$root/communication/run_throughput.sh" 0 "$(((n_stages + 1) * replicas))" "$setting" 16 --config "$CONFIG"
       --schedule "$schedule" --iterations 100000 "${scale[@]}" --run-dir "$dir")
  if [ "$dry" = 1 ]; then echo "${cmd[*]}"; continue; fi
  if [ -f "$dir/throughput.json" ]; then echo "skip $setting (done)"; continue; fi
  t0=$SECONDS
  "${cmd[@]}" > "$OUT/$setting.log" 2>&1
  echo "$(date '+%F %T') $setting: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/progress.log"
done
if [ "$dry" = 1 ]; then echo "$py -m checkfree swarm table ${dirs[*]}"; exit 0; fi
"$py" -m checkfree swarm table "${dirs[@]}" | tee "$OUT/table.md"
