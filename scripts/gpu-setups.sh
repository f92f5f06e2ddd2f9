#!/usr/bin/env bash
# Issue 17 figures: the GPU tests, the demo and the GPU bench in each setup this machine
# has, in one call, over binaries staged by ../shared/tools/gpu-stage (docs/GPU.md):
#
#   bash scripts/gpu-setups.sh [same|two|all]     (default: all the machine has)
#
#   same: both processes on GPU 0, first without MPS, then under an MPS daemon started
#         and stopped here;
#   two:  producer on GPU 0, consumer on GPU 1, without MPS (a machine with two GPUs):
#         every cross-process GPU test and the bench's peer run on GPU 1
#         (GPURING_TEST_PEER_DEVICE=1, GPURING_BENCH_PEER_DEVICE=1).
#
# Bench logs go to $OUT (default /tmp/out). COMPARE="bench-gpu-x ..." also runs those
# staged bench binaries' gpuring rows after each setup's bench (an earlier build, say).
# BENCH_ONLY=1 runs the bench alone in each setup (no tests, no demo).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
which=${1:-all}
nvidia-smi -L
gpus=$(nvidia-smi -L | grep -c '^GPU')
cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
show() {
  grep -E '^gpu bench|probe|^[A-Za-z_0-9]+/[A-Za-z_0-9]+$|^ +time:|^ +thrpt:|skipped|panicked|STALLED' "$1" \
    | grep -v '%' | sed -E 's/ +/ /g'
}
run_setup() {
  local tag=$1 peer=$2
  echo "######## $tag"
  export GPURING_TEST_PEER_DEVICE=$peer GPURING_BENCH_PEER_DEVICE=$peer
  if [ -z "${BENCH_ONLY:-}" ]; then
    if [ "$peer" = 0 ]; then
      timeout 120 .gpu/bin/test-cli --include-ignored gpu_ 2>&1 | grep -E "MPS daemon|^test |result"
    fi
    timeout 240 .gpu/bin/test-gpu --include-ignored 2>&1 | grep -E "^test result|FAILED|panicked|on device"
    timeout 120 .gpu/bin/test-pinned --include-ignored 2>&1 | grep -E "^test result|FAILED|panicked"
    if [ "$peer" = 0 ]; then
      timeout 120 .gpu/bin/gpuring demo 2>&1 | tail -7
    fi
  fi
  GPURING_BENCH_CPUS=$cpus timeout 240 .gpu/bin/bench-gpu --bench >"$out/bench-gpu-$tag.log" 2>&1
  echo "bench-gpu: exit $?"
  show "$out/bench-gpu-$tag.log"
  for b in ${COMPARE:-}; do
    GPURING_BENCH_CPUS=$cpus timeout 120 ".gpu/bin/$b" --bench gpuring >"$out/$b-$tag.log" 2>&1
    echo "$b (gpuring rows): exit $?"
    show "$out/$b-$tag.log"
  done
  unset GPURING_TEST_PEER_DEVICE GPURING_BENCH_PEER_DEVICE
}
if [ "$which" = same ] || [ "$which" = all ]; then
  run_setup no-mps 0
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && sleep 1
  run_setup mps 0
  echo quit | nvidia-cuda-mps-control
  sleep 1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
if [ "$which" = two ] || [ "$which" = all ]; then
  if [ "$gpus" -ge 2 ]; then
    run_setup two-gpus 1
  else
    echo "######## two-gpus: skipped (this machine has $gpus GPU)"
  fi
fi
echo "/dev/shm leftovers:"; ls /dev/shm | grep gpuring | head || true
