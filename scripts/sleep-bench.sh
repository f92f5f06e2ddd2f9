#!/usr/bin/env bash
# Runs on the GPU machine, over binaries staged here by ../shared/tools/gpu-stage:
#   bash scripts/sleep-bench.sh             (results under $OUT, or /tmp/gpuring-out)
# The sleeping hop in one call: gpuring's sync sleeping SPSC ping-pong, its async form
# (pop_async on a current-thread tokio runtime) and a blocking select over four rings,
# against the raw futex, a pipe, a Unix socket and a Unix socket read by a tokio task; one
# bench run per wake-up barrier mode
# (GPURING_MODES, default "asymmetric symmetric"). Pinned as scripts/device-bench.sh pins
# (one logical CPU per physical core, core 0 left alone). Then the async tests.
set -uo pipefail
out=${OUT:-/tmp/gpuring-out}
mkdir -p "$out"
cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,4p' | paste -sd,)
uname -r
echo "pinned to cpus $cpus"
rows="gpuring_spsc_sleep|gpuring_spsc_async|gpuring_spsc_select|floor_futex|floor_futex_descriptor|one_way/pipe|one_way/unix_socket|tokio_unix_socket"
for mode in ${GPURING_MODES:-asymmetric symmetric}; do
  log="$out/sleep-$mode.log"
  echo "== $mode barrier"
  GPURING_BARRIER=$mode GPURING_BENCH_CPUS=$cpus timeout "${ROW_LIMIT:-240}" \
    .gpu/bin/bench-rings --bench --noplot --warm-up-time 1 --measurement-time 3 "$rows" >"$log" 2>&1
  echo "exit $?"
  grep -E '^latency_one_way/|^ +time:|^p99 ' "$log" | sed -E 's/ +/ /g'
done
echo "== async tests"
timeout 120 .gpu/bin/test-async_waits --include-ignored 2>&1 | grep -E 'test result|FAILED|panicked|idle|noticed'
