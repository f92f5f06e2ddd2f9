#!/usr/bin/env bash
# Run AL (docs/BENCHMARKS.md): the host-flag wait following the receiver's WaitPolicy,
# an earlier build's bench against this one's, interleaved, without MPS and under MPS.
# Staged here first (docs/GPU.md):
#   ../shared/tools/gpu-stage                            (this build, .gpu/bin/bench-gpu)
#   cp <earlier build's bench-gpu> .gpu/bin/bench-gpu-v0
#   rustc -O scripts/nap.rs -o .gpu/bin/nap; cp scripts/*.sh .gpu/
# then on the device: OUT=$OUT bash .gpu/flag-wait-device.sh
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi -L; lscpu | grep -E "Model name"; cat /proc/self/timerslack_ns
.gpu/bin/nap
export GPURING_BENCH_NO_VALUE_WAITS=1
export GPURING_BENCH_CPUS=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
show() { grep -E '^[A-Za-z_0-9]+/[A-Za-z_0-9]+$|^ +time:|^ +thrpt:|panicked|STALLED' "$1" | grep -v '%' | sed -E 's/ +/ /g'; }
bench() { # tag build filter
  timeout 150 .gpu/bin/$2 --bench "$3" > "$out/$1-$2.log" 2>&1; echo "== $1 $2 (exit $?)"; show "$out/$1-$2.log"
}
echo "######## no-mps"
timeout 200 .gpu/bin/test-gpu --include-ignored host_flags --test-threads 1 2>&1 | grep -E "^test |^test result|FAILED|panicked|PeerDead"
for r in 1 2; do
  bench no-mps-$r bench-gpu-v0 'one_way/gpuring_spsc_spin_host_flags|one_way/floor_ipc|stream/gpuring_spsc_1p1c_host_flags'
  bench no-mps-$r bench-gpu 'one_way/gpuring_spsc_spin_host_flags|one_way/floor_ipc|stream/gpuring_spsc_1p1c_host_flags'
done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && sleep 1
echo "######## mps"
for r in 1 2; do
  bench mps-$r bench-gpu-v0 'one_way/gpuring_spsc_spin_host_flags|one_way/floor_ipc|stream/gpuring_spsc_1p1c_host_flags'
  bench mps-$r bench-gpu 'one_way/gpuring_spsc_spin_host_flags|one_way/floor_ipc|stream/gpuring_spsc_1p1c_host_flags'
done
echo quit | nvidia-cuda-mps-control; sleep 1
echo "/dev/shm leftovers:"; ls /dev/shm | grep gpuring | head || true
