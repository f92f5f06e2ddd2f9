#!/usr/bin/env bash
# gpuring.ray on a GPU machine that has torch but no network and no Rust toolchain.
#
# Here:   bash scripts/ray-gpu.sh stage [DIR]   # DIR (default .gpu): the abi3 wheel, pytest,
#                                               # the Rust GPU test binary (bin/test-gpu),
#                                               # Ray 2.60 (cp312) without its Java jars and
#                                               # dashboard client, and Ray's dependencies
# There:  OUT=$OUT bash scripts/ray-gpu.sh run [DIR]   # installs them into torch's Python ($PY),
#         runs the pytest suite, then python/bench/ray_transport.py without and under MPS
#         (PARTS picks), writing logs and JSON to $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
dir=${2:-.gpu}
if [ "$what" = stage ]; then
  set -e
  rm -rf "$dir/py" "$dir/ray" && mkdir -p "$dir/py" "$dir/ray"
  python3 -m pip install -q "maturin>=1.9,<2"
  python3 -m maturin build --release -m python/Cargo.toml -o "$dir/py"
  python3 -m pip download -q --only-binary :all: -d "$dir/py" pytest
  # The Rust GPU tests (PARTS=rust), stripped: a few MB.
  mkdir -p "$dir/bin"
  exe=$(cargo build --release --features cuda --test gpu --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])')
  cp "$exe" "$dir/bin/test-gpu" && strip "$dir/bin/test-gpu"
  tmp=$(mktemp -d)
  python3 -m pip download -q "ray==2.60.0" --python-version 3.12 --only-binary :all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$tmp"
  mv "$tmp"/*.whl "$dir/ray/"
  # Ray's wheel holds a 30 MB Java jar and the dashboard's web client, neither used here.
  python3 - "$dir/ray" <<'PY'
import glob, os, sys, zipfile
src = glob.glob(os.path.join(sys.argv[1], "ray-*.whl"))[0]
dst = src + ".slim"
drop = ("ray/jars/", "ray/dashboard/client/build/")
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if info.filename.startswith(drop):
            continue
        data = zi.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"\n".join(l for l in data.split(b"\n") if not l.startswith(tuple(d.encode() for d in drop)))
        zo.writestr(info, data)
os.replace(dst, src)
PY
  du -sh "$dir/py" "$dir/ray"
  exit 0
fi
[ "$what" = run ] || { echo "usage: $0 stage [DIR] | run [DIR]"; exit 2; }
PY=${PY:-/opt/torch/.venv/bin/python3}
OUT=${OUT:-/tmp}
$PY -m pip install -q --no-index --find-links "$dir/ray" --find-links "$dir/py" "$dir"/ray/ray-*.whl pytest 2>&1 | tail -3
$PY -m pip install -q --no-deps --no-index --force-reinstall "$dir"/py/gpuring-*.whl || exit 1
$PY -c "import sys, torch, ray, gpuring.ray; print('python', sys.version.split()[0], 'torch', torch.__version__, 'ray', ray.__version__)" || exit 1
nvidia-smi -L
rc=0
# PARTS (default "tests example nomps mps"): the whole pytest suite (host, GPU, Ray; over
# 300 s with Ray and two GPUs),
# python/examples/ray_weights.py on GPU 0, the bench
# without MPS, the bench under an MPS daemon of its own
for part in ${PARTS:-tests example nomps mps}; do
  case $part in
    example) timeout 120 $PY python/examples/ray_weights.py 2>&1 | grep -v "^(raylet\|^\[" | tee "$OUT/ray-example.txt" | tail -8 || rc=1 ;;
    two)  # a machine with two GPUs: the two-GPU tests (channels, a Queue, Ray actors on GPUs
      # 0 and 1), then the bench with the actors on GPUs 0 and 1 against Ray's NCCL transport
      timeout 240 $PY -m pytest -q -rs -k "two-gpus or two_gpus" python/tests/test_gpu.py python/tests/test_ray_two_gpus.py 2>&1 \
        | tee "$OUT/pytest-two.txt" | tail -4 || rc=1
      timeout 120 $PY python/examples/ray_weights.py --all-gpus 2>&1 | grep -v "^(raylet\|^\[" \
        | tee "$OUT/ray-example-all-gpus.txt" | tail -7 || rc=1
      timeout 330 $PY python/bench/ray_transport.py --two-gpus --quick --json "$OUT/ray-two.json" 2>&1 \
        | grep -v "^(raylet\|^\[" | tee "$OUT/ray-two.txt" || rc=1 ;;
    apart)  # two GPUs Ray gave apart (each actor sees only its own): the Rust GPU tests with
      # peers that see GPU 1 alone (bin/test-gpu, bin/test-gpu_broadcast, staged beside the
      # wheels), the two-GPU Python tests, then the bench's --apart rows
      for t in gpu gpu_broadcast; do
        [ -x "$dir/bin/test-$t" ] || continue
        GPURING_TEST_PEER_ONLY_SEES=1 timeout 150 "$dir/bin/test-$t" --include-ignored > "$OUT/only-sees-$t.log" 2>&1
        echo "== $t, peers that see GPU 1 alone (exit $?)"; grep -E '^test |test result|panicked' "$OUT/only-sees-$t.log" | tail -30
      done
      timeout 200 $PY -m pytest -q -rs -k "two-gpus or two_gpus" python/tests/test_gpu.py python/tests/test_ray_two_gpus.py 2>&1 \
        | tee "$OUT/pytest-two.txt" | tail -4 || rc=1
      timeout 240 $PY python/bench/ray_transport.py --apart --quick --json "$OUT/ray-apart.json" 2>&1 \
        | grep -v "^(raylet\|^\[" | tee "$OUT/ray-apart.txt" || rc=1 ;;
    prefetch)  # Queue(prefetch=N) and Receiver.requeue on the GPU: their GPU tests, then under
      # MPS queue_rate.py's rows beside torch's Queue, and the 4 KB Ray channel rows (the
      # channel's default, prefetch=4) with a prefetch=1 row (~5 min in all)
      timeout 170 $PY -m pytest -q -rs -k "prefetch or copies or took_ahead or queue" \
        python/tests/test_gpu.py 2>&1 | tee "$OUT/pytest-prefetch.txt" | tail -6 || rc=1
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d && echo "MPS daemon started"
      timeout 170 $PY python/bench/queue_rate.py --json "$OUT/queue-rate-mps.json" \
        --rows "torch Queue,Queue.get(),Queue.get() prefetch=4,Queue.get(copy=False),Channel: send + torch()" \
        2>&1 | tee "$OUT/queue-rate-mps.txt" || rc=1
      timeout 200 $PY python/bench/ray_transport.py --channel-only --quick --repeat 2 --prefetch 1 \
        --json "$OUT/ray-channel-mps.json" 2>&1 | grep -v "^(raylet\|^\[" | tee "$OUT/ray-channel-mps.txt" || rc=1
      echo quit | nvidia-cuda-mps-control; echo "MPS daemon stopped"
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY ;;
    rust)  # the Rust GPU tests staged as $dir/bin/test-gpu (cargo build --release --features
      # cuda --test gpu; the target/release/deps/gpu-<hash> binary, stripped), RUST_FILTER picks
      [ -x "$dir/bin/test-gpu" ] || { echo "no $dir/bin/test-gpu staged"; rc=1; continue; }
      timeout 150 "$dir/bin/test-gpu" --include-ignored --test-threads 1 ${RUST_FILTER:-} > "$OUT/rust-gpu.log" 2>&1 || rc=1
      grep -E '^test |test result|panicked|control read' "$OUT/rust-gpu.log" | tail -30 ;;
    raytests) timeout 200 $PY -m pytest -q -rs python/tests/test_ray.py python/tests/test_ray_gpu.py 2>&1 | tee "$OUT/pytest-ray.txt" | tail -6 || rc=1 ;;
    tests) timeout 480 $PY -m pytest -q -rs python/tests 2>&1 | tee "$OUT/pytest.txt" | tail -6 || rc=1 ;;
    nomps) timeout 420 $PY python/bench/ray_transport.py --json "$OUT/ray-nomps.json" ${BENCH_ARGS:-} 2>&1 \
      | grep -v "^(raylet\|^\[" | tee "$OUT/ray-nomps.txt" || rc=1 ;;
    mps)
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d && echo "MPS daemon started"
      timeout 420 $PY python/bench/ray_transport.py --json "$OUT/ray-mps.json" ${BENCH_ARGS:-} 2>&1 \
        | grep -v "^(raylet\|^\[" | tee "$OUT/ray-mps.txt" || rc=1
      echo quit | nvidia-cuda-mps-control; echo "MPS daemon stopped"
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY ;;
  esac
done
echo "gpuring objects left in /dev/shm: $(ls /dev/shm | grep -c gpuring || true)"
exit $rc
