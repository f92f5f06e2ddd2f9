#!/usr/bin/env bash
# The measurements the open issues still wait for, for one device call each (a call has
# 600 s). Here: `../shared/tools/gpu-stage`, `bash scripts/python-gpu.sh stage`, then
# `cp scripts/*.sh scripts/*.py .gpu/`. There, from the repo root:
#   bash .gpu/open-issues-device.sh sleep    # issue 18: the sleeping hop (sync, async,
#                                            #   select) against pipe / socket / tokio socket
#   bash .gpu/open-issues-device.sh pinned   # issue 16: launch_call, incl. the stream-ordered
#                                            #   sender (pinned_stream_ordered, never run yet)
#   bash .gpu/open-issues-device.sh python   # issue 15: the Python bench, without then with MPS
#   bash .gpu/open-issues-device.sh steps-ab # issue 15: steps.py (one process, then two) with
#                                            #   the wheel in .gpu/py-old/ and the staged one,
#                                            #   alternating, twice (same VM, same call)
# Logs go to $OUT (or /tmp/gpuring-out).
set -uo pipefail
out=${OUT:-/tmp/gpuring-out}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
nvidia-smi -L 2>/dev/null
case "${1:-}" in
  sleep)
    # The guest's idle driver decides how fast a sleeping CPU wakes (run AA).
    echo "cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null) /" \
      "$(cat /sys/devices/system/cpu/cpuidle/current_governor_ro 2>/dev/null)"
    GPURING_MODES=asymmetric OUT="$out" timeout 420 bash "$here/sleep-bench.sh" 2>&1 | tee "$out/sleep.txt"
    ;;
  pinned)
    timeout 500 "$here/bin/bench-pinned" --bench --noplot launch_call 2>&1 | tee "$out/pinned-launch.txt"
    ;;
  python)
    OUT="$out" timeout 270 bash "$here/python-gpu.sh" run bench 2>&1 | tee "$out/python-nomps.txt"
    OUT="$out" timeout 270 bash "$here/python-gpu.sh" run bench --mps 2>&1 | tee "$out/python-mps.txt"
    ;;
  steps-ab)
    py=${PYTHON:-/opt/torch/.venv/bin/python3}
    rm -rf /tmp/gpuring-old
    "$py" -m pip install -q --no-deps --no-index --target /tmp/gpuring-old "$here"/py-old/*.whl || exit 1
    "$py" -m pip install -q --no-deps --no-index --force-reinstall "$here"/py/*.whl || exit 1
    for round in 1 2; do
      for which in old new; do
        echo "== round $round: $which wheel"
        if [ "$which" = old ]; then pp=/tmp/gpuring-old; else pp=; fi
        PYTHONPATH=$pp timeout 60 "$py" python/bench/steps.py --n 3000
        PYTHONPATH=$pp timeout 60 "$py" python/bench/steps.py --cross --n 3000
      done
    done 2>&1 | tee "$out/steps-ab.txt"
    ;;
  *)
    echo "usage: $0 sleep | pinned | python | steps-ab"; exit 2 ;;
esac
