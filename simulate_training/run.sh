#!/usr/bin/env bash
# CheckFree+ launcher: out-of-order swaps ON (as the authors' README says of run.sh).
# usage: simulate_training/run.sh SETTING WORLD_SIZE P CONFIG START_ITER [--option value ...]
# e.g.   simulate_training/run.sh ours-grad-avg 2 16 tiny_config.json 0     # CheckFree+, 2 replicas, 16 %/h
#        DRY_RUN=1 simulate_training/run.sh no_failure 4 10 500M_config.json 0
LAUNCHER=run.sh exec "$(dirname "$0")/_launch.sh" --swaps "$@"
