#!/usr/bin/env bash
# Run AM (docs/BENCHMARKS.md): the host-flag wait's short naps at a lowered timer slack,
# on the default WaitPolicy (an application's), against the build before them, interleaved,
# without MPS (where a flag comes a context switch after its send and the wait naps) and
# under MPS (where it does not). Staged here first (docs/GPU.md):
#   ../shared/tools/gpu-stage                        (this build: bench-gpu, gpuring)
#   cp <earlier build's bench-gpu and gpuring> .gpu/bin/bench-gpu-v0 .gpu/bin/gpuring-v0
#   rustc -O --edition 2024 scripts/nap.rs -o .gpu/bin/nap; cp scripts/*.sh .gpu/
# then on the device: OUT=$OUT bash .gpu/flag-nap-device.sh [no-mps|mps|all]
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
what=${1:-all}
nvidia-smi -L; lscpu | grep -E "Model name"; uname -r; cat /proc/self/timerslack_ns
.gpu/bin/nap
export GPURING_BENCH_NO_VALUE_WAITS=1
export GPURING_BENCH_CPUS=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
rows='gpu_handoff_one_way/(floor_ipc_events_spin|gpuring_spsc_default|gpuring_spsc_default_host_flags)$'
show() { grep -E '^[A-Za-z_0-9]+/[A-Za-z_0-9]+$|^ +time:|panicked|STALLED' "$1" | grep -v '%' | sed -E 's/ +/ /g'; }
bench() { # tag build
  timeout 150 .gpu/bin/$2 --bench "$rows" > "$out/$1-$2.log" 2>&1; echo "== $1 $2 (exit $?)"; show "$out/$1-$2.log"
}
demo() { # tag build
  timeout 120 .gpu/bin/$2 demo > "$out/$1-demo-$2.log" 2>&1; echo "== $1 demo $2 (exit $?)"; tail -9 "$out/$1-demo-$2.log"
}
if [ "$what" != mps ]; then
  echo "######## no-mps"
  timeout 200 .gpu/bin/test-gpu --include-ignored host_flags --test-threads 1 2>&1 | grep -E "^test |^test result|FAILED|panicked"
  for r in 1 2; do
    bench no-mps-$r bench-gpu-v0; bench no-mps-$r bench-gpu
    demo no-mps-$r gpuring-v0; demo no-mps-$r gpuring
  done
fi
if [ "$what" != no-mps ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && sleep 1
  echo "######## mps"
  bench mps-1 bench-gpu-v0; bench mps-1 bench-gpu
  demo mps-1 gpuring-v0; demo mps-1 gpuring
  echo quit | nvidia-cuda-mps-control; sleep 1
fi
echo "/dev/shm leftovers:"; ls /dev/shm | grep gpuring | head || true
