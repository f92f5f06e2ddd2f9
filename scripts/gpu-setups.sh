#!/usr/bin/env bash
# Issue 17 figures: the same GPU tests, demo and GPU bench without MPS and under MPS, one
# call on the GPU machine, over binaries staged by ../shared/tools/gpu-stage (docs/GPU.md).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi -L
cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
run_setup() {
  local tag=$1
  echo "######## $tag"
  timeout 120 .gpu/bin/test-cli --include-ignored gpu_ 2>&1 | grep -E "MPS daemon|^test |result"
  timeout 200 .gpu/bin/test-gpu --include-ignored 2>&1 | grep -E "^test result|FAILED|panicked"
  timeout 120 .gpu/bin/gpuring demo 2>&1 | tail -7
  GPURING_BENCH_CPUS=$cpus timeout 200 .gpu/bin/bench-gpu --bench >"$out/bench-gpu-$tag.log" 2>&1
  grep -E '^[A-Za-z_0-9]+/|^ +time:|^ +thrpt:|^p99 ' "$out/bench-gpu-$tag.log" | grep -v '%' | sed -E 's/ +/ /g'
}
run_setup no-mps
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && sleep 1
run_setup mps
echo quit | nvidia-cuda-mps-control
ls /dev/shm | grep gpuring | head || true
