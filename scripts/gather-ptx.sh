#!/usr/bin/env bash
# Compiles python/src/kernels/gather.cu to PTX (on a machine with nvcc: the GPU machine),
# for the oldest architecture the extension serves (sm_75: CUDA 13 dropped older ones) and the lowest PTX ISA that
# nvcc writes, so that drivers of CUDA 12 and later can JIT it. Writes $1 (default
# python/src/kernels/gather.ptx).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-python/src/kernels/gather.ptx}
nvcc --version | tail -2
nvcc -ptx -arch=compute_75 -O3 -o "$out" python/src/kernels/gather.cu
head -20 "$out"
