#!/usr/bin/env bash
# The swarm throughput experiment (docs/paper.md §8): start nodes START..END-1 of the swarm on this machine.
# usage: communication/run_throughput.sh START END SETTING RATE [--option value ...]
#   SETTING: no_failure | checkpoint | ours | ours-plus          RATE: failure rate in %/h (16 -> failure_p_configs/16.json)
#   e.g. communication/run_throughput.sh 0 21 ours 16                              # the paper's 7 x 3 topology
#        communication/run_throughput.sh 0 10 checkpoint 16 --config configs/swarm_tiny.json \
#            --schedule failure_p_configs/swarm_tiny_16.json --iterations 100 --run-dir runs/sw
#        DRY_RUN=1 communication/run_throughput.sh 0 21 ours 16                    # print the node commands, start nothing
#   GPUs: --device auto|cpu|cuda --gpus 0,1 (this machine's k-th node on GPU gpus[k mod 2]; DRY_RUN prints the map)
#   multi-machine: machine A runs START=0 with --bind-host 0.0.0.0 --advertise-host A --port 5555 (the bootstrap);
#   machine B runs its range with --join-token FILE (A writes RUN_DIR/join_tokens/machine<START>.json) --bind-host 0.0.0.0 --advertise-host B.
#   resume: communication/run_throughput.sh --resume RUN_DIR   # the run whose supervisor died, from its journal
#   options: python -m checkfree swarm run --help
# The python supervisor starts its node processes itself and kills only those, by pid; this script kills nothing.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = "--resume" ]; then  # every other option comes from the run's journal
  if [ $# -ne 2 ]; then echo "--resume takes one RUN_DIR and nothing else; expected: $0 --resume RUN_DIR." >&2; exit 2; fi
  exec "$py" -m checkfree swarm run --resume "$2"
fi
case " $* " in *" --resume "*|*" --resume="*)
  echo "--resume RUN_DIR takes no START END SETTING RATE or options (they come from the run's journal); expected: $0 --resume RUN_DIR." >&2
  exit 2;;
esac
if [ $# -lt 4 ]; then
  sed -n '3,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
start=$1 end=$2 setting=$3 rate=$4; shift 4
case "$start" in ''|*[!0-9]*) echo "START is '$start'; expected an integer >= 0." >&2; exit 2;; esac
case "$end" in ''|*[!0-9]*) echo "END is '$end'; expected an integer > START." >&2; exit 2;; esac
if [ "$end" -le "$start" ]; then echo "END $end is not above START $start; expected START < END." >&2; exit 2; fi

schedule=()
case " $* " in *" --schedule "*|*" --schedule="*|*" --no-schedule "*) ;;  # the caller chose the schedule
*)
if [ -f "failure_p_configs/$rate.json" ]; then schedule=(--schedule "failure_p_configs/$rate.json");
elif [ -f "$root/failure_p_configs/$rate.json" ]; then schedule=(--schedule "$root/failure_p_configs/$rate.json"); fi;;
esac
cmd=("$py" -m checkfree swarm run --start "$start" --end "$end" --setting "$setting" --rate "$rate" "${schedule[@]}" "$@")
if [ -n "${DRY_RUN:-}" ] && [ "${DRY_RUN}" != 0 ]; then
  printf '%q ' "${cmd[@]}"; echo
  exec "${cmd[@]}" --dry-run
fi
exec "${cmd[@]}"
