#!/usr/bin/env bash
# Run AN (docs/BENCHMARKS.md, issue 18 part 5): the sleeping hop's rows, ROUNDS rounds
# (default 5) in one call, pinned as scripts/sleep-bench.sh pins, the shipped (asymmetric)
# barrier only, so that each row's spread over rounds is seen beside the others'.
# Staged with ../shared/tools/gpu-stage; cp scripts/*.sh .gpu/; on the device:
#   OUT=$OUT bash .gpu/sleep-rounds.sh
set -uo pipefail
out=${OUT:-/tmp/gpuring-out}
mkdir -p "$out"
cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,4p' | paste -sd,)
uname -r
echo "cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null)"
echo "pinned to cpus $cpus"
rows="gpuring_spsc_sleep|gpuring_spsc_async|floor_futex|floor_futex_descriptor|one_way/pipe|one_way/unix_socket|tokio_unix_socket"
for r in $(seq 1 "${ROUNDS:-5}"); do
  log="$out/round-$r.log"
  echo "== round $r"
  GPURING_BENCH_CPUS=$cpus timeout 150 .gpu/bin/bench-rings --bench --noplot \
    --warm-up-time 1 --measurement-time 3 "$rows" >"$log" 2>&1
  echo "exit $?"
  grep -E '^latency_one_way/|^ +time:|^p99 |p50' "$log" | sed -E 's/ +/ /g'
done
