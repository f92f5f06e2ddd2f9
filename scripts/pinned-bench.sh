#!/usr/bin/env bash
# Issue 16's figures in one call on the GPU machine: the pinned bench (launch stalls under
# device-to-host copies; 54 MB GPU -> CPU-process hand-offs against the raw copy) and the
# torch baseline (t.cpu() + multiprocessing.Queue). Copy into .gpu/ after gpu-stage:
#   bash .gpu/pinned-bench.sh      (from the repo root on the GPU machine)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-/opt/torch/.venv/bin/python3}
echo "== bench-pinned"
"$here/bin/bench-pinned" --bench --noplot
echo "== torch baseline"
"$py" "$here/pinned-torch.py" 40
