#!/usr/bin/env bash
# Runs on the GPU machine, over binaries staged here by ../shared/tools/gpu-stage:
#   bash scripts/sleep-bench.sh             (results under $OUT, or /tmp/gpuring-out)
# The sleeping hop in one call: gpuring's sync sleeping SPSC ping-pong and its async form
# (pop_async on a current-thread tokio runtime), against the raw futex, a pipe, a Unix
# socket and a Unix socket read by a tokio task; in each wake-up barrier mode
# (GPURING_MODES, default "asymmetric symmetric"), ROUNDS times (default 2), interleaved.
# Pinned as scripts/device-bench.sh pins (one logical CPU per physical core, core 0 left
# alone). Then the async tests.
set -uo pipefail
out=${OUT:-/tmp/gpuring-out}
mkdir -p "$out"
cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,4p' | paste -sd,)
uname -r
echo "pinned to cpus $cpus"
rows="gpuring_spsc_sleep gpuring_spsc_async floor_futex one_way/pipe one_way/unix_socket tokio_unix_socket"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in ${GPURING_MODES:-asymmetric symmetric}; do
    for row in $rows; do
      log="$out/sleep-$round-$mode-${row//\//_}.log"
      GPURING_BARRIER=$mode GPURING_BENCH_CPUS=$cpus .gpu/bin/bench-rings --bench \
        --warm-up-time 1 --measurement-time 3 "$row" >"$log" 2>&1
      med=$(grep -E '^ +time:|time: +\[' "$log" | head -1 | sed -E 's/.*\[[^ ]+ [^ ]+ ([^ ]+ [^ ]+) .*/\1/')
      p=$(grep -E '^p99 ' "$log" | head -1 | sed -E 's/^p99 [^:]+: //')
      echo "round $round, $mode: $row: median $med; $p"
    done
  done
done
echo "== async tests"
.gpu/bin/test-async_waits --include-ignored 2>&1 | grep -E 'test result|FAILED|panicked|idle|noticed'
