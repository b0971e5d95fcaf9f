#!/usr/bin/env bash
# CheckFree launcher: out-of-order swaps OFF (as the authors' README says of run_2.sh).
# usage: simulate_training/run_2.sh SETTING WORLD_SIZE P CONFIG START_ITER [--option value ...]
LAUNCHER=run_2.sh exec "$(dirname "$0")/_launch.sh" --no-swaps "$@"
