#!/usr/bin/env bash
# The Python package on a GPU machine that has torch but no Rust toolchain.
#
# Here (with Rust):      bash scripts/python-gpu.sh stage     # wheel + pytest wheels into .gpu/py/
# There (one call):      bash scripts/python-gpu.sh run [tests|bench|objects|steps|all] [--mps]
#
# `run` installs the staged abi3 wheel into torch's Python ($PY, default
# /opt/torch/.venv/bin/python3) with --no-deps, runs the pytest suite (host and GPU tests)
# and python/bench/bench.py, writing the bench's JSON to $OUT (or /tmp). With --mps the
# same runs under a CUDA MPS daemon of its own, started and stopped here.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
shift || true

if [ "$what" = stage ]; then
  set -e
  rm -rf .gpu/py && mkdir -p .gpu/py
  python3 -m pip install -q "maturin>=1.9,<2"
  python3 -m maturin build --release -m python/Cargo.toml -o .gpu/py
  python3 -m pip download -q --only-binary :all: -d .gpu/py pytest
  ls -la .gpu/py
  exit 0
fi
[ "$what" = run ] || { echo "usage: $0 stage | run [tests|bench|objects|steps|all] [--mps]"; exit 2; }

part=${1:-all}
mps=${2:-}
shift 2 2>/dev/null || shift $#  # what follows goes to the objects bench (e.g. --quick)
PY=${PY:-/opt/torch/.venv/bin/python3}
OUT=${OUT:-/tmp}
$PY -m pip install -q --no-deps --no-index --force-reinstall .gpu/py/*.whl || exit 1
$PY -c "import sys, torch, numpy, gpuring; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available(), 'gpuring', gpuring.__version__)"
nvidia-smi -L

if [ "$mps" = --mps ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "MPS daemon started"
  trap 'echo quit | nvidia-cuda-mps-control; echo "MPS daemon stopped"' EXIT
  tag=mps
else
  tag=nomps
fi

rc=0
if [ "$part" = tests ] || [ "$part" = all ]; then
  $PY -m pytest -q -rs --durations=12 python/tests || rc=1
  left=$(ls /dev/shm | grep -c gpuring || true)
  echo "gpuring objects left in /dev/shm: $left"
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  extra=()
  [ "$tag" = mps ] && extra=(--gpu-only)  # host rows do not depend on MPS
  $PY python/bench/bench.py --json "$OUT/pybench-$tag.json" "${extra[@]}" || rc=1
fi
if [ "$part" = objects ]; then
  $PY python/bench/objects.py --json "$OUT/objects-$tag.json" "$@" || rc=1
fi
if [ "$part" = steps ]; then
  $PY python/bench/object_steps.py "$@" || rc=1
fi
exit $rc
