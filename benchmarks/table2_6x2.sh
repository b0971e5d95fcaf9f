#!/usr/bin/env bash
# Paper Table 2 in the paper's geometry (configs/tiny_6x2_config.json: 6 transformer stages × 2 layers), with runs
# that train until they reach the target: the no-failure run without and with CheckFree+'s swaps, CheckFree and
# CheckFree+, checkpointing and redundant computation, paired on identical failure draws per seed; 5 seeds at
# 5 %/h (the paper's headline), 6 seeds at 10 and 16 %/h. Then the report (python -m checkfree report …
# --target-loss nofail@N_T --replay-baselines, with the archived 4 × 1 study for the pure swap cost).
#
# usage: benchmarks/table2_6x2.sh               # the whole set (≈ 19 core-hours on this 2-core CPU machine, measured;
#                                               # the archived set in benchmarks/results/table2_6x2 is complete)
#        DRY_RUN=1 benchmarks/table2_6x2.sh     # print every command; run and write nothing
#        SMOKE=1 benchmarks/table2_6x2.sh       # minutes: N_T=10, 2 seeds at 5 %/h, every kind of run once
#
# Fixed before any run of this config (docs/reports.md, "Table 2 in the paper's geometry"; never tuned after):
#   N_T [300]  the target of seed s is the no-failure (no swap) run's validation loss at effective iteration N_T.
#              300 iterations × 4,096 tokens = 1.23 M tokens, 0.75 of an epoch of the 1.64 M-token corpus: the target
#              is set by learning, not by a second pass over the same text. On the archived 4 × 1 curves
#              (benchmarks/results/paper_tiny) the no-failure validation loss still falls at 300, at a fifth of
#              its slope at 100.
#   CAP [750 = 2.5 × N_T]  a failure run stops at its first validation ≤ the target (--stop-at-loss) or at CAP
#              wall-clock iterations, where it is censored (reported with its loss at the cap, never as a time).
#   EVAL [25]  validations every 25 iterations place the crossing (interpolated between two validations).
#   The failure probabilities and checkpointing's K = 3 are the config's (configs/README.md: the paper's
#   failures per stage before its no-failure run reaches the target, and its checkpoint interval as a fraction of
#   that run, compressed from 10,000 paper iterations to N_T).
#   The clock: each iteration stands for 10,000 / N_T paper iterations of 91.32 s (REPORT_ARGS below), the recovery
#   of a stage costs the paper's 30 s, redundant computation the paper's 151.04 s / 91.32 s per iteration.
#
# Exact baselines by replay: checkpointing and redundant computation train the no-failure trajectory (verified
# bit for bit by tests/report/test_replay.py), so the report computes their times from the no-failure run, the
# failure draws and the timing model (checkfree/report/replay.py). One real run per rate (seed 0) of each is
# kept as the check; a redundant run whose draws put a stage and its predecessor down together before N_T (its
# fallback leaves the no-failure trajectory) is run for real too. Checkpointing follows the authors' rule
# (checkpoint_simulation.py: checkpoints at wall-clock multiples of K, each failure placed at one of the
# 10,000 / N_T paper iterations its iteration stands for; checkfree/recovery/checkpoint.py), in its real runs
# (checkpoint_paper_interval = K × 10,000 / N_T) and in the report's replays (--checkpoint-rule authors).
#
# Environment: SEEDS_5 ["0 1 2 3 4"], SEEDS_10 ["0 1 2 3 4 5"], SEEDS_16 ["0 1 2 3 4 5"], OUT [runs/table2_6x2],
#   JOBS [1] runs at a time (each OMP_NUM_THREADS=1), SKIP_EXISTING [1]: a run whose summary.json says completed is
#   not run again (an interrupted set resumes; a run killed or stopped mid-way is moved to OUT/incomplete/ and starts
#   again), ONLY [all]: an extended regular
#   expression; only runs whose name matches it are made (two instances on disjoint ONLYs share one set).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

CONFIG=tiny_6x2_config.json
if [ -n "${SMOKE:-}" ] && [ "${SMOKE}" != 0 ]; then
  : "${N_T:=10}" "${EVAL:=5}" "${SEEDS_5:=0 1}" "${SEEDS_10:=}" "${SEEDS_16:=}" "${OUT:=runs/table2_6x2_smoke}"
fi
N_T=${N_T:-300}
EVAL=${EVAL:-25}
CAP=${CAP:-$((N_T * 5 / 2))}
SEEDS_5=${SEEDS_5-"0 1 2 3 4"}
SEEDS_10=${SEEDS_10-"0 1 2 3 4 5"}
SEEDS_16=${SEEDS_16-"0 1 2 3 4 5"}
OUT=${OUT:-runs/table2_6x2}
JOBS=${JOBS:-1}
SKIP_EXISTING=${SKIP_EXISTING:-1}
PAPER_ITERATIONS=10000   # the paper's no-failure iterations to loss 2.85 (Table 2: 419.56 h / 151.04 s)

for v in N_T EVAL CAP JOBS; do
  case "${!v}" in ''|*[!0-9]*|0) echo "$v is '${!v}'; expected a positive integer." >&2; exit 2;; esac
done
for s in $SEEDS_5 $SEEDS_10 $SEEDS_16; do
  case "$s" in *[!0-9]*) echo "a seed is '$s'; expected non-negative integers." >&2; exit 2;; esac
done
if [ -n "${ONLY:-}" ]; then  # grep's own error would only skip every run: exit 0 with nothing made
  grep -Eq -- "$ONLY" <<< "" 2>/dev/null
  if [ $? -gt 1 ]; then
    echo "ONLY is '$ONLY', which is not an extended regular expression (grep -E); expected e.g. ONLY='r5-.*-s[01]'." >&2
    exit 2
  fi
fi
if [ $((N_T % EVAL)) -ne 0 ]; then echo "N_T $N_T is not a multiple of EVAL $EVAL; the target needs a validation at N_T." >&2; exit 2; fi
dry=0; if [ -n "${DRY_RUN:-}" ] && [ "${DRY_RUN}" != 0 ]; then dry=1; fi
[ "$dry" = 1 ] || mkdir -p "$OUT/runs" "$OUT/logs"
progress="$OUT/progress.log"
note() { if [ "$dry" = 1 ]; then echo "# $*"; else echo "$(date '+%F %T') $*" | tee -a "$progress"; fi; }
all_seeds=$(printf '%s\n' $SEEDS_5 $SEEDS_10 $SEEDS_16 | sort -nu | tr '\n' ' ')
iteration_seconds=$("$py" -c "print(f'{91.32 * $PAPER_ITERATIONS / $N_T:.6g}')")
# the authors' checkpoint rule: the paper iterations that the config's K stand for (3 × 10,000 / 300 = 100)
k_paper=$("$py" -c "import json; print(round(json.load(open('$root/configs/$CONFIG'))['checkpoint_every'] * $PAPER_ITERATIONS / $N_T))")
note "table2_6x2: N_T $N_T, cap $CAP, eval every $EVAL; seeds 5 %/h: $SEEDS_5; 10 %/h: $SEEDS_10; 16 %/h: $SEEDS_16"

# completed DIR: exit 0 when DIR's run has ended, by the report's own rule (checkfree.report.runs.stopped_early: a
# run stopped by a signal or a crash writes a summary.json too).
completed() {
  [ -f "$1/summary.json" ] && "$py" -c 'import json, sys
from checkfree.report.runs import stopped_early
sys.exit(stopped_early(json.load(open(sys.argv[1]))))' "$1/summary.json"
}

# run NAME LAUNCHER SETTING RATE SEED ARGS...: one simulator run (JOBS at a time); a failed run is logged.
run() {
  local name=$1 launcher=$2 setting=$3 rate=$4 seed=$5; shift 5
  local dir="$OUT/runs/$name"
  local cmd=("$root/simulate_training/$launcher" "$setting" 1 "$rate" "$CONFIG" 0 --seed "$seed" --eval-interval "$EVAL"
    --no-progress --no-final-checkpoint --run-dir "$dir" "$@")
  if [ -n "${ONLY:-}" ] && ! grep -Eq -- "$ONLY" <<< "$name"; then return; fi
  if [ "$dry" = 1 ]; then echo "${cmd[*]#"$root/"}"; return; fi
  if [ "$SKIP_EXISTING" != 0 ] && completed "$dir"; then note "skip $name (done)"; return; fi
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  (
    if [ -e "$dir" ]; then mkdir -p "$OUT/incomplete"; mv "$dir" "$OUT/incomplete/$name-$(date +%s)"; fi   # a killed run: kept aside (out of runs/, which the report reads), run again
    t0=$SECONDS
    "${cmd[@]}" > "$OUT/logs/$name.log" 2>&1
    note "$name: exit $? after $((SECONDS - t0)) s"
  ) &
  [ "$JOBS" = 1 ] && wait
  return 0
}

# target SEED: the no-failure (no swap) run's validation loss at N_T, exactly as metrics.jsonl holds it.
target() {
  if [ "$dry" = 1 ]; then echo "TARGET_s$1"; return; fi
  "$py" - "$OUT/runs/tiny_6x2-nofail-noswap-s$1/metrics.jsonl" "$N_T" <<'EOF'
import sys
from checkfree.telemetry.metrics import read_metrics
hits = [r["val_loss"] for r in read_metrics(sys.argv[1]) if r.get("kind") == "eval" and r.get("effective_iteration") == int(sys.argv[2])]
if not hits:
    sys.exit(f"{sys.argv[1]} has no validation at iteration {sys.argv[2]}")
print(repr(float(hits[-1])))
EOF
}

# needs_real_redundant RATE SEED: exit 0 when the seed's draws hold a redundant fallback before N_T.
needs_real_redundant() {
  "$py" - "$root/configs/$CONFIG" "$1" "$2" "$N_T" <<'EOF'
import json, sys
from checkfree.failures.injection import StageFailureInjector
from checkfree.report.replay import redundant_fallback_iterations
cfg = json.load(open(sys.argv[1]))
src = StageFailureInjector(cfg["n_stages"], cfg[sys.argv[2]], int(sys.argv[3]))
sys.exit(0 if redundant_fallback_iterations(src, cfg["n_stages"], int(sys.argv[4])) else 1)
EOF
}

# 1. the no-failure runs without swaps: each seed's target and every replay's trajectory
for seed in $all_seeds; do
  run "tiny_6x2-nofail-noswap-s$seed" run_2.sh no_failure 5 "$seed" --max-iterations "$N_T"
done
wait
# 2. per rate: CheckFree+ and CheckFree until the target or the cap; the no-failure run with swaps (Fig. 4c's
#    pure swap cost) alongside the 5 %/h runs of its seed
for rate in 5 10 16; do
  seeds_var="SEEDS_$rate"
  for seed in ${!seeds_var}; do
    t=$(target "$seed") || { note "seed $seed: no target ($t); its runs are skipped"; continue; }
    stop=(--stop-at-loss "$t" --max-iterations "$CAP")
    run "tiny_6x2-r$rate-checkfree_plus-s$seed" run.sh ours-grad-avg "$rate" "$seed" "${stop[@]}"
    run "tiny_6x2-r$rate-checkfree-s$seed" run_2.sh ours-grad-avg "$rate" "$seed" "${stop[@]}"
    [ "$rate" = 5 ] && run "tiny_6x2-nofail-swap-s$seed" run.sh no_failure 5 "$seed" "${stop[@]}"
  done
done
# 3. the exact baselines' real runs: seed 0 at each rate as the check of the replay, plus every redundant run
#    whose trajectory a fallback would change before N_T
for rate in 5 10 16; do
  seeds_var="SEEDS_$rate"
  for seed in ${!seeds_var}; do
    t=$(target "$seed") || continue
    stop=(--stop-at-loss "$t" --max-iterations "$CAP" --max-wall-iterations "$CAP")
    first=${!seeds_var%% *}
    [ "$seed" = "$first" ] && run "tiny_6x2-r$rate-checkpoint-s$seed" run_2.sh checkpoint "$rate" "$seed" "${stop[@]}" \
      --set checkpoint_rule=authors --set "checkpoint_paper_interval=$k_paper"
    if [ "$seed" = "$first" ] || { [ "$dry" = 0 ] && needs_real_redundant "$rate" "$seed"; }; then
      run "tiny_6x2-r$rate-redundant-s$seed" run_2.sh redundant "$rate" "$seed" "${stop[@]}"
    fi
  done
done
wait

archive="$root/benchmarks/results/paper_tiny/runs"   # the 4 × 1 study: its pure swap cost beside this one's
[ -d "$archive" ] || archive=
report=(-m checkfree report "$OUT/runs" ${archive:+"$archive"} --target-loss "nofail@$N_T" --replay-baselines
  --out "$OUT/report" --iteration-seconds "$iteration_seconds" --recovery-seconds 30 --redundant-ratio paper
  --checkpoint-rule authors)
if [ "$dry" = 1 ]; then echo "python ${report[*]}"; exit 0; fi
note "report → $OUT/report"
"$py" "${report[@]}" 2>&1 | tee -a "$progress"
note "done: $OUT/report/report.md"
