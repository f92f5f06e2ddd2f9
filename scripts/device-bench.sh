#!/usr/bin/env bash
# Runs on the GPU machine, over binaries staged here by ../shared/tools/gpu-stage:
#   bash scripts/device-bench.sh            (results under $OUT, or /tmp/gpuring-out)
# Records the machine, runs every staged test binary, the benchmarks (GPURING_BENCHES, by
# default "rings payloads gpu") pinned to one logical CPU per physical core (core 0 left
# alone), in the default wake-up barrier mode (GPURING_MODES="asymmetric symmetric" runs
# both), then the demo and the 54 MB example.
set -uo pipefail
out=${OUT:-/tmp/gpuring-out}
mkdir -p "$out"
{ date -u; nproc; lscpu; nvidia-smi -L; } >"$out/machine.txt" 2>&1
grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)' "$out/machine.txt"

bash .gpu/run.sh >"$out/tests.log" 2>&1
grep -E '^test result|FAILED|panicked|gpu-stage:' "$out/tests.log" | sort | uniq -c


cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
# Name and median only (criterion prints [low median high]); change lines dropped; then the
# p50/p99 lines of the single-item second pass (benches/common/mod.rs, `Samples`).
summary() { grep -E '^[A-Za-z_0-9]+/|^ +time:|^ +thrpt:|^p99 ' | grep -v '%' | sed -E 's/ +/ /g'; }
for mode in ${GPURING_MODES:-asymmetric}; do
  for b in ${GPURING_BENCHES:-rings payloads gpu}; do
    echo "== bench $b, $mode barrier, pinned to cpus $cpus"
    GPURING_BARRIER=$mode GPURING_BENCH_CPUS=$cpus .gpu/bin/bench-$b --bench >"$out/bench-$b-$mode.log" 2>&1
    grep -E 'barrier mode' "$out/bench-$b-$mode.log"
    summary <"$out/bench-$b-$mode.log"
  done
  echo "== demo, $mode barrier"
  GPURING_BARRIER=$mode .gpu/bin/example-demo 2>&1 | tail -4
done
echo "== gpuring demo (GPU path), then --host"
.gpu/bin/gpuring demo 2>&1 | tail -8
.gpu/bin/gpuring demo --host 2>&1 | tail -8
echo "== big_buffers (54 MB), in place, then --fill"
.gpu/bin/example-big_buffers --items 5000 2>&1 | tail -5
.gpu/bin/example-big_buffers --items 500 --fill 2>&1 | tail -5
cp target/criterion/samples-*.csv "$out/" 2>/dev/null
tar czf "$out/criterion.tgz" target/criterion 2>/dev/null
ls -la "$out"
