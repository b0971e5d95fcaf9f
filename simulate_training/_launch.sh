#!/usr/bin/env bash
# Shared body of run.sh (swaps on) and run_2.sh (swaps off). Not meant to be called directly.
# usage: _launch.sh --swaps|--no-swaps SETTING WORLD_SIZE P CONFIG START_ITER [--option value ...]
set -euo pipefail
swaps=$1; shift
if [ $# -lt 5 ]; then
  echo "usage: $(basename "${LAUNCHER:-run.sh}") SETTING WORLD_SIZE P CONFIG START_ITER [--option value ...]" >&2
  echo "  e.g. $(basename "${LAUNCHER:-run.sh}") ours-grad-avg 2 16 tiny_config.json 0 --max-iterations 200" >&2
  echo "  options: python -m checkfree simulate --help" >&2
  exit 2
fi
setting=$1 world=$2 rate=$3 config=$4 start=$5; shift 5
case "$world" in ''|*[!0-9]*|0) echo "WORLD_SIZE is '$world'; expected a positive integer." >&2; exit 2;; esac
case "$start" in ''|*[!0-9]*) echo "START_ITER is '$start'; expected an integer >= 0." >&2; exit 2;; esac
if ! [[ "$rate" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "P is '$rate'; expected a failure rate in %/h, a number >= 0 (e.g. 16)." >&2; exit 2
fi
# A path into a directory is that file or none (checkfree.config.resolve_config_path): said here, before python starts.
if [[ "$config" == */* && "$config" != configs/* && ! -e "$config" ]]; then
  echo "CONFIG '$config' does not exist; expected the path of a JSON or YAML config, or a bare name such as tiny_config.json (looked for in configs/)." >&2
  exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

args=(simulate --setting "$setting" --world-size "$world" --rate "$rate" --config "$config"
      --start-iter "$start" "$swaps" "$@")
# More than one machine (docs/gpu.md, Several machines): NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT as torchrun names them;
# WORLD_SIZE counts the replicas of all nodes, NNODES must divide it. TORCHRUN_ARGS adds torchrun options; with
# --rdzv-* among them, they replace the static MASTER_ADDR rendezvous.
nnodes=${NNODES:-1}
case "$nnodes" in ''|*[!0-9]*|0) echo "NNODES is '$nnodes'; expected a positive integer." >&2; exit 2;; esac
if [[ " ${TORCHRUN_ARGS:-}" == *" --rdzv"* ]]; then
  rdzv=(--nnodes="$nnodes")  # the user's own rendezvous (e.g. --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT)
elif [ "$nnodes" -gt 1 ]; then
  node_rank=${NODE_RANK:-}
  case "$node_rank" in ''|*[!0-9]*) echo "NODE_RANK is '$node_rank'; expected 0..$((nnodes - 1)) with NNODES=$nnodes." >&2; exit 2;; esac
  [ "$node_rank" -lt "$nnodes" ] || { echo "NODE_RANK is $node_rank; expected 0..$((nnodes - 1)) with NNODES=$nnodes." >&2; exit 2; }
  [ $((world % nnodes)) -eq 0 ] || { echo "WORLD_SIZE $world is not a multiple of NNODES=$nnodes; expected the same number of replicas on every node." >&2; exit 2; }
  [ -n "${MASTER_ADDR:-}" ] || { echo "MASTER_ADDR is not set; expected the address of the NODE_RANK=0 machine with NNODES=$nnodes." >&2; exit 2; }
  rdzv=(--nnodes="$nnodes" --node_rank="$node_rank" --master_addr="$MASTER_ADDR" --master_port="${MASTER_PORT:-29500}")
else
  rdzv=(--standalone --nnodes=1)
fi
read -r -a extra_torchrun <<< "${TORCHRUN_ARGS:-}"
if [ "$world" -eq 1 ] && [ "$nnodes" -eq 1 ] && [ ${#extra_torchrun[@]} -eq 0 ]; then
  cmd=("$py" -m checkfree "${args[@]}")
else
  # torchrun starts and reaps its own workers; nothing else is ever killed.
  cmd=("$py" -m torch.distributed.run "${rdzv[@]}" ${extra_torchrun[@]+"${extra_torchrun[@]}"}
       --nproc_per_node=$((world / nnodes)) -m checkfree "${args[@]}")
fi

if [ -n "${DRY_RUN:-}" ] && [ "${DRY_RUN}" != 0 ]; then
  printf '%q ' "${cmd[@]}"; echo
  exec "$py" -m checkfree "${args[@]}" --dry-run
fi
exec "${cmd[@]}"
