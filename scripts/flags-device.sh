#!/usr/bin/env bash
# Issue 17 part 3, host ready flags: the GPU tests (all, without MPS; test-gpu again under
# MPS, less the test that kills a sender whose stream is held by a value wait), then the
# GPU bench without and under MPS with only the orderings in which no stream waits on a
# value. Over binaries staged by ../shared/tools/gpu-stage. Logs to $OUT (default /tmp/out).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi -L
cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
show() {
  grep -E '^gpu bench|probe|^[A-Za-z_0-9]+/[A-Za-z_0-9]+$|^ +time:|^ +thrpt:|skipped|panicked|STALLED' "$1" \
    | grep -v '%' | sed -E 's/ +/ /g'
}
echo "######## tests, no MPS"
timeout 300 bash .gpu/run.sh 2>&1 | tail -25
timeout 200 .gpu/bin/test-gpu --include-ignored host_flags --nocapture 2>&1 | grep -E "^test |PeerDead after|result" | head -20
echo "######## bench, no MPS"
GPURING_BENCH_NO_VALUE_WAITS=1 GPURING_BENCH_CPUS=$cpus timeout 200 .gpu/bin/bench-gpu --bench >"$out/bench-gpu-no-mps.log" 2>&1
echo "bench-gpu: exit $?"; show "$out/bench-gpu-no-mps.log" | grep -v "ns$"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && sleep 1
echo "######## tests, MPS"
timeout 200 .gpu/bin/test-gpu --include-ignored --skip gpu_host_flags_receiver_sees_its_senders_death 2>&1 | grep -E "^test result|FAILED|panicked"
echo "######## bench, MPS"
GPURING_BENCH_NO_VALUE_WAITS=1 GPURING_BENCH_CPUS=$cpus timeout 200 .gpu/bin/bench-gpu --bench >"$out/bench-gpu-mps.log" 2>&1
echo "bench-gpu: exit $?"; show "$out/bench-gpu-mps.log" | grep -v "ns$"
echo quit | nvidia-cuda-mps-control
echo "/dev/shm leftovers:"; ls /dev/shm | grep gpuring | head || true
