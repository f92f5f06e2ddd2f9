#!/usr/bin/env bash
# Runs on the GPU machine, over binaries staged here by ../shared/tools/gpu-stage:
#   bash scripts/device-bench.sh            (results under $OUT, or /tmp/gpuring-out)
# Records the machine, runs every staged test binary, the demo, and the ring benchmarks
# twice: unpinned, and pinned to one logical CPU per physical core (core 0 left alone).
set -uo pipefail
out=${OUT:-/tmp/gpuring-out}
mkdir -p "$out"
{ date -u; nproc; lscpu; nvidia-smi -L; } >"$out/machine.txt" 2>&1
grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)' "$out/machine.txt"

bash .gpu/run.sh >"$out/tests.log" 2>&1
grep -E '^test result|FAILED|panicked|gpu-stage:' "$out/tests.log" | sort | uniq -c

.gpu/bin/example-demo 2>&1 | tee "$out/demo.log"

cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
summary() { grep -E '^[a-z_]+/|^ +time:|^ +thrpt:' | sed -E 's/ +/ /g'; }
echo "== bench, unpinned"
.gpu/bin/bench-rings --bench >"$out/bench-unpinned.log" 2>&1
summary <"$out/bench-unpinned.log"
echo "== bench, pinned to cpus $cpus"
GPURING_BENCH_CPUS=$cpus .gpu/bin/bench-rings --bench >"$out/bench-pinned.log" 2>&1
summary <"$out/bench-pinned.log"
tar czf "$out/criterion.tgz" target/criterion 2>/dev/null
ls -la "$out"
