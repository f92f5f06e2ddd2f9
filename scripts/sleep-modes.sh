#!/usr/bin/env bash
# Run AN, second call (docs/BENCHMARKS.md, issue 18 part 5): why gpuring's sleeping row is
# bimodal. ROUNDS rounds (default 4) of gpuring_spsc_sleep beside the raw futex and the Unix
# socket, with the shipped (asymmetric: the sleeper's membarrier) wake-up barrier, then with
# the symmetric one (a SeqCst fence on both sides); the bench prints how many futex waits
# this side made per round trip in criterion's batches and in the sample pass.
# Staged with ../shared/tools/gpu-stage; cp scripts/*.sh .gpu/; on the device:
#   OUT=$OUT bash .gpu/sleep-modes.sh
set -uo pipefail
out=${OUT:-/tmp/gpuring-out}
mkdir -p "$out"
cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,4p' | paste -sd,)
echo "pinned to cpus $cpus"
rows='gpuring_spsc_sleep$|floor_futex$|one_way/unix_socket$'
for r in $(seq 1 "${ROUNDS:-4}"); do
  for mode in asymmetric symmetric; do
    log="$out/modes-$r-$mode.log"
    echo "== round $r, $mode barrier"
    GPURING_BARRIER=$mode GPURING_BENCH_CPUS=$cpus timeout 100 .gpu/bin/bench-rings --bench \
      --noplot --warm-up-time 1 --measurement-time 3 "$rows" >"$log" 2>&1
    echo "exit $?"
    grep -E '^latency_one_way/|^ +time:|^p99 |futex waits' "$log" | sed -E 's/ +/ /g'
  done
done
