#!/usr/bin/env bash
# Runs on the GPU machine, over binaries staged here by ../shared/tools/gpu-stage:
#   bash scripts/device-bench.sh            (results under $OUT, or /tmp/gpuring-out)
# Records the machine, runs every staged test binary, the demo, and the ring benchmarks
# pinned to one logical CPU per physical core (core 0 left alone), in the default wake-up
# barrier mode (GPURING_MODES="asymmetric symmetric" runs both), then the demo.
set -uo pipefail
out=${OUT:-/tmp/gpuring-out}
mkdir -p "$out"
{ date -u; nproc; lscpu; nvidia-smi -L; } >"$out/machine.txt" 2>&1
grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)' "$out/machine.txt"

bash .gpu/run.sh >"$out/tests.log" 2>&1
grep -E '^test result|FAILED|panicked|gpu-stage:' "$out/tests.log" | sort | uniq -c


cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
# Name and median only (criterion prints [low median high]); change lines dropped.
summary() { grep -E '^[a-z_]+/|^ +time:|^ +thrpt:' | grep -v '%' | sed -E 's/ +/ /g'; }
for mode in ${GPURING_MODES:-asymmetric}; do
  echo "== bench, $mode barrier, pinned to cpus $cpus"
  GPURING_BARRIER=$mode GPURING_BENCH_CPUS=$cpus .gpu/bin/bench-rings --bench >"$out/bench-$mode.log" 2>&1
  grep -E 'barrier mode' "$out/bench-$mode.log"
  summary <"$out/bench-$mode.log"
  echo "== demo, $mode barrier"
  GPURING_BARRIER=$mode .gpu/bin/example-demo 2>&1 | tail -4
done
tar czf "$out/criterion.tgz" target/criterion 2>/dev/null
ls -la "$out"
