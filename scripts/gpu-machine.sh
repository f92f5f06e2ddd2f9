#!/usr/bin/env bash
# The lent GPU machine's part of a change: the GPU tests, the demo, the Python GPU suite, the
# bench suites, and a before/after of two builds, one part per device call (each fits the
# call's 10 minutes; its logs go straight to $OUT, at most 8 files, so that a part cut off
# by the limit still returns what it wrote).
#
# Staged here first (this machine has the Rust toolchain, that one has not):
#   ../shared/tools/gpu-stage && strip .gpu/bin/*                (this build)
#   bash scripts/python-gpu.sh stage                             (the Python wheel)
#   cp scripts/gpu-machine.sh .gpu/
# For `bench` / `mps`, the build to compare with, from a worktree of its commit:
#   (cd ../base && cargo build --release --features cuda --bench rings --bench gpu)
#   cp <its rings and gpu bench binaries> .gpu/bin/bench-rings-before .gpu/bin/bench-gpu-before
#   (and, for the host channel rows, its payloads bench as .gpu/bin/bench-payloads-before)
# Then a device `run` with carry [".gpu"] of `OUT=$OUT bash .gpu/gpu-machine.sh PART`:
#   tests    .gpu/run.sh (every test binary, --include-ignored), the demo, /dev/shm after
#   python   the Python suite, then again under MPS
#   full     this build's rings, payloads and gpu suites (gpu without and under MPS)
#   rest     the CLI's GPU tests, the rows `full` runs out of time for, the Python bench
#   check    all of the tests (Rust and Python) and the demo without and under MPS
#   two-gpus (a two-GPU machine) the test binaries, the cross-process GPU tests with their
#            peers on GPU 1, the idle receivers' CPU, the demo
#   bench    before/after, alternated, two rounds, no MPS
#   channel  the host channel 4 KB rows of before (/ middle) / this build, five rounds; then
#            one thread's cost (examples/path_cost) of the same builds
#   mps      before/after under MPS, and the demo under MPS
#   release  the test binaries, broadcast_step.py --no-sync with .gpu/py-before/ and this
#            build's wheel, without and under MPS, then the Python suite
#   broadcast-ab  only those broadcast runs (ORDER="after before" to swap, ROUNDS)
#   broadcast-pairs  under MPS, each configuration with both wheels back to back
#   objects  python/bench/objects.py --quick without MPS (one call: ~5 min)
#   objects-mps  the same under MPS (another call, on the same warm machine)
#   queue-ab the objects bench's tensor, tuple and dict10 rows (no Rust rows) under MPS with
#            the wheel of an earlier build (.gpu/py-before/, `maturin build` in a worktree of
#            its commit) and this build's, alternated, ROUNDS (default "1") rounds
#   trees    the Python suite, then under MPS objects.py --quick and object_steps.py
#   handoff  the one-tensor rows of objects.py (--quick; with the Rust API's, from
#            .gpu/bin/example-handoff) and object_steps.py, under MPS, then without
#   qsteps   the Python suite, then python/bench/queue_steps.py under MPS and without
#   gather   the package's GPU tests, copy_costs.py under MPS, then queue-ab (SHAPES)
#   idle-ab  eight idle broadcast receivers' CPU (tests/broadcast_channel.rs eight_idle) with
#            .gpu/before/test-broadcast_channel and this build's, alternated (ROUNDS, default
#            "1 2 3"); python/bench/idle.py with the wheels .gpu/py-before/ and .gpu/py/ (if
#            staged; the before wheel from `maturin build` in a worktree of its commit); then
#            the test binaries; then the demo under MPS with .gpu/before/gpuring and this
#            build's (SKIP_TESTS=1: without the test binaries)
#   fanout-ab  the 4 KB gpuring fan-out rows with .gpu/before/bench-fanout and this build's,
#            alternated (ROUNDS)
#   storms   the GPU crash tests built with fault injection, from .gpu/bin/test-storms-fault
#            (`cargo test --release --features cuda,fault-injection --test storms --no-run`,
#            that binary stripped and copied there): the refusal test, then the storm with
#            senders killed (STORM_RUNS, default 8, stopping at the first failure), then the
#            three storms once
set -uo pipefail
what=${1:-tests}
# Logs go straight to $OUT (at most 8 files a part: what the device gives back), so that
# a part cut off by the call's time limit still returns what it wrote.
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi -L; lscpu | grep -E "Model name"; uname -r
cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | cut -d, -f1 | sed -n '2,7p' | paste -sd,)
export GPURING_BENCH_CPUS=$cpus GPURING_BENCH_NO_VALUE_WAITS=1
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && sleep 1 && echo "MPS daemon started"
}
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; echo "MPS daemon stopped"; }
show() { grep -E '^[A-Za-z_0-9]+/[A-Za-z_0-9/]+( +time:.*)?$|^ +time:|^ +thrpt:|panicked|STALLED' "$1" | grep -v '%' | sed -E 's/ +/ /g'; }
rings_rows='latency_one_way/gpuring_spsc_(spin|sleep)$|throughput/gpuring_(spsc|spsc_batch32|mpmc)/'
gpu_rows='gpu_handoff_one_way/(floor_ipc_events_spin|gpuring_spsc_(spin|default)(_host_flags)?)$|gpu_stream/(floor_ipc_events_stream|gpuring_spsc_1p1c)'
payload_rows='payload_4KB/gpuring_(spsc|mpmc)$'
bench() { # tag binary rows
  timeout 240 .gpu/bin/$2 --bench "$3" > "$out/$1-$2.log" 2>&1; echo "== $1 $2 (exit $?)"; show "$out/$1-$2.log"
}
bcast_ab() { # broadcast_step.py --no-sync, wheels .gpu/py-before/ and .gpu/py/ (see `release`)
  local py=/opt/torch/.venv/bin/python3 m r w whl workers mode steps
  for m in nomps mps; do
    [ $m = mps ] && mps_on
    [ $m = mps ] && steps=${STEPS_MPS:-20000} || steps=${STEPS_NOMPS:-4000}
    for r in ${ROUNDS:-1}; do
      for w in ${ORDER:-before after}; do
        [ $w = before ] && whl=.gpu/py-before/*.whl || whl=.gpu/py/*.whl
        $py -m pip install -q --no-deps --no-index --force-reinstall $whl
        for workers in 4 1; do
          for mode in "" --separate; do
            echo "== $m round $r $w, $workers workers $mode, $steps steps, --no-sync"
            timeout 100 $py python/examples/broadcast_step.py --device 0 --no-sync \
              --workers $workers --steps $steps $mode 2>&1 | tail -$((workers + 1))
          done
        done
      done
    done | tee "$out/broadcast-$m.txt"
    [ $m = mps ] && mps_off
  done
}
bcast_pairs() { # broadcast_step.py --no-sync under MPS, run by run: each configuration with
  # the .gpu/py-before/ wheel and this build's, their order swapped every round (ROUNDS,
  # WORKERS, STEPS_MPS)
  local py=/opt/torch/.venv/bin/python3 r w workers mode order
  $py -m pip install -q --no-deps --no-index --target /tmp/wheel-before .gpu/py-before/*.whl
  $py -m pip install -q --no-deps --no-index --target /tmp/wheel-after .gpu/py/*.whl
  mps_on
  for r in ${ROUNDS:-1 2 3 4}; do
    [ $((r % 2)) = 1 ] && order="before after" || order="after before"
    for workers in ${WORKERS:-4 1}; do
      for mode in "" --separate; do
        for w in $order; do
          echo "== round $r $w, $workers workers $mode, ${STEPS_MPS:-20000} steps, --no-sync"
          PYTHONPATH=/tmp/wheel-$w timeout 100 $py python/examples/broadcast_step.py --device 0 \
            --no-sync --workers $workers --steps ${STEPS_MPS:-20000} $mode 2>&1 | tail -1
        done
      done
    done
  done | tee "$out/broadcast-pairs-mps.txt"
  mps_off
}
case $what in
  tests)
    timeout 500 bash .gpu/run.sh > "$out/tests.log" 2>&1; echo "run.sh exit $?"
    grep -E '^test result|FAILED|panicked|gpu-stage:' "$out/tests.log" | sort | uniq -c
    timeout 150 .gpu/bin/gpuring demo > "$out/demo-nomps.log" 2>&1; tail -9 "$out/demo-nomps.log"
    echo "/dev/shm leftovers:"; ls /dev/shm | grep gpuring | head || true
    ;;
  python)
    timeout 280 bash scripts/python-gpu.sh run tests 2>&1 | tee "$out/py-nomps.log" | tail -8
    timeout 280 bash scripts/python-gpu.sh run tests --mps 2>&1 | tee "$out/py-mps.log" | tail -8
    ;;
  bench)  # ROUNDS (default "1 2"): which rounds this call runs
    for r in ${ROUNDS:-1 2}; do
      bench nomps-$r bench-rings-before "$rings_rows"; bench nomps-$r bench-rings "$rings_rows"
      bench nomps-$r bench-gpu-before "$gpu_rows"; bench nomps-$r bench-gpu "$gpu_rows"
      if [ -x .gpu/bin/bench-payloads-before ]; then
        bench nomps-$r bench-payloads-before "$payload_rows"
        bench nomps-$r bench-payloads "$payload_rows"
      fi
    done
    ;;
  channel)  # ROUNDS (default "1 2 3 4 5"): the host channel 4 KB rows, point estimates (ns),
    # of the before build, an optional middle one (.gpu/bin/bench-payloads-mid) and this
    # build, alternated: the noisy two-process rows need more rounds than `bench` gives
    for r in ${ROUNDS:-1 2 3 4 5}; do
      for b in bench-payloads-before bench-payloads-mid bench-payloads; do
        [ -x .gpu/bin/$b ] || continue
        timeout 60 .gpu/bin/$b --bench "$payload_rows" > /tmp/channel.log 2>&1
        echo "r$r $b $(grep -A1 -E '^payload_4KB/gpuring_(spsc|mpmc)$' /tmp/channel.log | grep time: \
          | sed -E 's/.*\[[^ ]+ [^ ]+ ([^ ]+) [^ ]+ [^ ]+ [^ ]+\]/\1/' | paste -sd' ')"
      done
    done | tee "$out/channel.txt"
    # One thread's cost of the same hand-off (examples/path_cost.rs), where the builds'
    # binaries are there (.gpu/bin/path-cost-before, -mid; this build's example-path_cost)
    for r in ${ROUNDS:-1 2 3 4 5}; do
      for b in path-cost-before path-cost-mid example-path_cost; do
        [ -x .gpu/bin/$b ] || continue
        for f in mpmc spsc; do echo "r$r $b $(taskset -c ${cpus%%,*} .gpu/bin/$b $f)"; done
      done
    done | tee "$out/path-cost.txt"
    ;;
  mps)
    mps_on
    bench mps-1 bench-gpu-before "$gpu_rows"; bench mps-1 bench-gpu "$gpu_rows"
    timeout 150 .gpu/bin/gpuring demo > "$out/demo-mps.log" 2>&1; tail -9 "$out/demo-mps.log"
    mps_off
    ;;
  full)  # this build's complete suites, for docs/BENCHMARKS.md and docs/GPU.md
    timeout 180 .gpu/bin/bench-rings --bench > "$out/rings.log" 2>&1; echo "== rings (exit $?)"; show "$out/rings.log"
    timeout 100 .gpu/bin/bench-payloads --bench > "$out/payloads.log" 2>&1; echo "== payloads (exit $?)"; show "$out/payloads.log"
    timeout 150 .gpu/bin/bench-gpu --bench > "$out/gpu-nomps.log" 2>&1; echo "== gpu, no MPS (exit $?)"; show "$out/gpu-nomps.log"
    mps_on
    timeout 150 .gpu/bin/bench-gpu --bench > "$out/gpu-mps.log" 2>&1; echo "== gpu, MPS (exit $?)"; show "$out/gpu-mps.log"
    mps_off
    ;;
  rest)  # the CLI's GPU tests; the rows `full` had no time for; then the Python bench
    timeout 60 .gpu/bin/test-cli --include-ignored gpu_ > "$out/test-cli.log" 2>&1; echo "test-cli exit $?"
    grep -E "^test |test result" "$out/test-cli.log"
    timeout 100 .gpu/bin/bench-payloads --bench 'payload_5MB/iceoryx2|payload_54MB' > "$out/payloads-54.log" 2>&1
    echo "== payloads 54 MB (exit $?)"; show "$out/payloads-54.log"
    timeout 100 .gpu/bin/bench-rings --bench 'throughput/(gpuring_mpmc_batch32|pipe|unix|iceoryx2|ipc)' > "$out/rings-rest.log" 2>&1
    echo "== rings, the rest (exit $?)"; show "$out/rings-rest.log"
    OUT=$out timeout 300 bash scripts/python-gpu.sh run bench > "$out/pybench-nomps.log" 2>&1
    echo "== python bench, no MPS (exit $?)"; grep -E "items/s|skipped" "$out/pybench-nomps.log"
    ;;
  check)  # one call: every test binary, the Python suite, the demo without and under MPS
    timeout 300 bash .gpu/run.sh > "$out/tests.log" 2>&1; echo "run.sh exit $?"
    grep -E '^test result|FAILED|panicked|gpu-stage:' "$out/tests.log" | sort | uniq -c
    timeout 200 bash scripts/python-gpu.sh run tests > "$out/py.log" 2>&1; echo "python exit $?"
    tail -4 "$out/py.log"
    timeout 60 .gpu/bin/gpuring demo > "$out/demo-nomps.log" 2>&1; tail -9 "$out/demo-nomps.log"
    mps_on
    timeout 60 .gpu/bin/gpuring demo > "$out/demo-mps.log" 2>&1; tail -9 "$out/demo-mps.log"
    mps_off
    ;;
  two-gpus)  # a machine with two GPUs: `check`'s test binaries and demo, then the cross-process
    # GPU tests with every peer on GPU 1 (GPURING_TEST_PEER_DEVICE), then the idle receivers
    timeout 300 bash .gpu/run.sh > "$out/tests.log" 2>&1; echo "run.sh exit $?"
    grep -E '^test result|FAILED|panicked|gpu-stage:' "$out/tests.log" | sort | uniq -c
    for t in gpu gpu_broadcast; do
      GPURING_TEST_PEER_DEVICE=1 timeout 200 .gpu/bin/test-$t --include-ignored --nocapture > "$out/peer1-$t.log" 2>&1
      echo "== $t, peers on GPU 1 (exit $?)"; grep -E '^test |test result|panicked|unordered' "$out/peer1-$t.log"
      # the same with peers that see GPU 1 alone (CUDA_VISIBLE_DEVICES=1, as Ray's actors)
      GPURING_TEST_PEER_ONLY_SEES=1 timeout 200 .gpu/bin/test-$t --include-ignored --nocapture > "$out/only1-$t.log" 2>&1
      echo "== $t, peers that see GPU 1 alone (exit $?)"; grep -E 'test result|panicked' "$out/only1-$t.log"
    done
    timeout 60 .gpu/bin/test-broadcast_channel eight_idle --nocapture 2>&1 | grep -E "idle|result" | tee "$out/idle.txt"
    timeout 60 .gpu/bin/gpuring demo > "$out/demo-nomps.log" 2>&1; tail -9 "$out/demo-nomps.log"
    echo "/dev/shm leftovers:"; ls /dev/shm | grep gpuring | head || true
    ;;
  broadcast)  # python/examples/broadcast_step.py on GPU 0: one broadcast channel against four
    # SPSC channels, streaming (steps/s) and one step every ms (latency), without then under MPS
    for m in nomps mps; do
      [ $m = mps ] && mps_on
      for mode in "" --separate; do
        for pace in "--steps 3000" "--steps 1000 --interval 0.001"; do
          echo "== $m $mode $pace"
          timeout 120 /opt/torch/.venv/bin/python3 python/examples/broadcast_step.py --device 0 $mode $pace 2>&1 | tail -5
        done
      done | tee "$out/broadcast-$m.txt"
      [ $m = mps ] && mps_off
    done
    ;;
  release)  # GPU broadcast receivers' drops that do not wait for their reads: every test
    # binary (.gpu/run.sh); broadcast_step.py --no-sync (workers that never wait for the GPU)
    # with the wheel of an earlier build (.gpu/py-before/) and this build's, alternated, 4
    # and 1 workers, broadcast and SPSC, without MPS (STEPS_NOMPS, default 4000 steps) then
    # under MPS (STEPS_MPS, default 20000); then the Python suite (PYTEST_LIMIT s)
    timeout 200 bash .gpu/run.sh > "$out/tests.log" 2>&1
    echo "== .gpu/run.sh (exit $?)"; grep -E "panicked|FAILED|^gpu-stage|reads still queued" "$out/tests.log" | head -30
    bcast_ab
    py=/opt/torch/.venv/bin/python3
    $py -m pip install -q --no-deps --no-index --force-reinstall .gpu/py/*.whl
    timeout ${PYTEST_LIMIT:-240} $py -m pytest -q -rs python/tests > "$out/pytest.log" 2>&1
    echo "== the Python suite, no MPS (exit $?)"; tail -4 "$out/pytest.log"
    echo "/dev/shm leftovers:"; ls /dev/shm | grep gpuring | head || true
    ;;
  broadcast-ab)  # `release`'s broadcast runs alone (ORDER, ROUNDS)
    bcast_ab
    /opt/torch/.venv/bin/python3 -m pip install -q --no-deps --no-index --force-reinstall .gpu/py/*.whl
    ;;
  broadcast-pairs)  # under MPS, each configuration with both wheels back to back (ROUNDS)
    bcast_pairs
    ;;
  objects)  # the objects bench (--quick) without MPS: ~5 min with the Rust API's rows
    OUT=$out timeout 560 bash scripts/python-gpu.sh run objects "" --quick > "$out/objects-nomps.log" 2>&1
    echo "== objects bench, no MPS (exit $?)"; cat "$out/objects-nomps.log"
    ;;
  objects-mps)  # the objects bench (--quick) under MPS (run `objects` in the next call)
    OUT=$out timeout 560 bash scripts/python-gpu.sh run objects --mps --quick > "$out/objects-mps.log" 2>&1
    echo "== objects bench, MPS (exit $?)"; cat "$out/objects-mps.log"
    ;;
  queue-ab)  # before/after of the package under MPS: .gpu/py-before/*.whl against .gpu/py/*.whl
    mps_on
    for r in ${ROUNDS:-1}; do
      for w in before after; do
        [ $w = before ] && whl=.gpu/py-before/*.whl || whl=.gpu/py/*.whl
        /opt/torch/.venv/bin/python3 -m pip install -q --no-deps --no-index --force-reinstall $whl
        echo "== round $r, $w"
        # From /tmp: no .gpu/bin/example-handoff there, so no Rust rows
        (cd /tmp && timeout 250 /opt/torch/.venv/bin/python3 "$OLDPWD/python/bench/objects.py" --quick \
          --shapes "${SHAPES:-tensor,tuple,dict10}" 2>&1 | grep -v "^Rust API rows skipped") | tee "$out/ab-$r-$w.txt"
      done
    done
    mps_off
    ;;
  trees)  # objects through the package in one call: the Python suite (no MPS, ~200 s), then
    # under MPS the objects bench (--quick) and the one-process steps of object_steps.py
    timeout 230 bash scripts/python-gpu.sh run tests > "$out/py.log" 2>&1; echo "python exit $?"
    grep -E "passed|failed|SKIPPED|left in" "$out/py.log"
    OUT=$out timeout 300 bash scripts/python-gpu.sh run objects --mps --quick > "$out/objects-mps.log" 2>&1
    echo "== objects bench, MPS (exit $?)"; cat "$out/objects-mps.log"
    timeout 60 bash scripts/python-gpu.sh run steps --mps --n 2000 > "$out/steps-mps.log" 2>&1
    echo "== object_steps, MPS (exit $?)"; cat "$out/steps-mps.log"
    ;;
  handoff)  # one tensor per item, the Rust API beside the package, under MPS then without
    OUT=$out timeout 250 bash scripts/python-gpu.sh run objects --mps --quick --shapes tensor > "$out/handoff-mps.log" 2>&1
    echo "== one-tensor rows, MPS (exit $?)"; cat "$out/handoff-mps.log"
    OUT=$out timeout 250 bash scripts/python-gpu.sh run objects "" --quick --shapes tensor > "$out/handoff-nomps.log" 2>&1
    echo "== one-tensor rows, no MPS (exit $?)"; cat "$out/handoff-nomps.log"
    timeout 60 bash scripts/python-gpu.sh run steps "" --n 2000 > "$out/steps.log" 2>&1
    echo "== steps, no MPS, one process (exit $?)"; cat "$out/steps.log"
    ;;
  qsteps)  # the Python suite (no MPS, ~200 s), then python/bench/queue_steps.py (the Queue's
    # way from a plain channel, step by step) under MPS and, at 4 KB, without
    timeout 230 bash scripts/python-gpu.sh run tests > "$out/py.log" 2>&1; echo "python exit $?"
    grep -E "passed|failed|SKIPPED|left in" "$out/py.log"
    mps_on
    timeout 180 /opt/torch/.venv/bin/python3 python/bench/queue_steps.py --n 800 \
      --json "$out/qsteps-mps.json" 2>&1 | tee "$out/qsteps-mps.txt"
    mps_off
    timeout 150 /opt/torch/.venv/bin/python3 python/bench/queue_steps.py --n 400 --sizes 4096 \
      --json "$out/qsteps-nomps.json" 2>&1 | tee "$out/qsteps-nomps.txt"
    ;;
  gather)  # the package's GPU tests (no MPS), python/bench/copy_costs.py under MPS, then
    # queue-ab's before/after (.gpu/py-before against .gpu/py) of SHAPES (default dict10,state)
    PY=/opt/torch/.venv/bin/python3
    $PY -m pip install -q --no-deps --no-index .gpu/py/*.whl 2>&1 | tail -1
    $PY -m pip install -q --no-deps --no-index --force-reinstall .gpu/py/gpuring*.whl
    timeout 200 $PY -m pytest -q -rs python/tests/test_gpu.py python/tests/test_torch_objects.py > "$out/py-gpu.log" 2>&1
    echo "python GPU tests exit $?"; grep -E "passed|failed|Error|SKIPPED" "$out/py-gpu.log" | tail -8
    mps_on
    timeout 90 $PY python/bench/copy_costs.py --ptx python/src/kernels/gather.ptx 2>&1 | tee "$out/copy-costs-mps.txt"
    mps_off
    SHAPES=${SHAPES:-dict10,state} bash "$0" queue-ab
    ;;
  storms)  # the GPU crash tests of tests/storms.rs (fault injection), host ready flags
    bin=.gpu/bin/test-storms-fault
    timeout 120 $bin --ignored --nocapture --exact gpu_receiver_killed_refusing_a_dead_senders_message > "$out/refuser.log" 2>&1
    echo "== refusal test (exit $?)"; grep -E "test result|panicked" "$out/refuser.log"
    for i in $(seq 1 "${STORM_RUNS:-8}"); do
      GPURING_TEST_STORM=2 timeout 90 $bin --ignored --nocapture --exact gpu_storms_lose_nothing > "$out/storm2.log" 2>&1; rc=$?
      echo "storm with senders killed, run $i: exit $rc $(grep -E 'published' "$out/storm2.log" | sed 's/.*kills, //')"
      [ $rc -ne 0 ] && { grep -v '^GPURING' "$out/storm2.log" | tail -40; break; }
    done
    timeout 200 $bin --ignored --nocapture --exact gpu_storms_lose_nothing > "$out/storms.log" 2>&1
    echo "== the three storms (exit $?)"; grep -E "published|slowest|panicked|test result" "$out/storms.log"
    ;;
  idle-ab)  # idle receivers' CPU before/after, the test binaries, the demo under MPS before/after
    for r in ${ROUNDS:-1 2 3}; do
      for b in before after; do
        [ $b = before ] && bin=.gpu/before/test-broadcast_channel || bin=.gpu/bin/test-broadcast_channel
        echo "== idle round $r $b"
        timeout 60 $bin eight_idle --nocapture 2>&1 | grep -E "8 receivers|test result|panicked"
      done
    done | tee "$out/idle.txt"
    if ls .gpu/py/*.whl > /dev/null 2>&1; then  # the same from Python: .gpu/py-before/, .gpu/py/
      py=/opt/torch/.venv/bin/python3
      for w in before after; do
        [ $w = before ] && [ ! -d .gpu/py-before ] && continue
        [ $w = before ] && whl=".gpu/py-before/gpuring*.whl" || whl=".gpu/py/gpuring*.whl"
        $py -m pip install -q --no-deps --no-index --target /tmp/wheel-$w $whl
      done
      for r in ${ROUNDS:-1 2 3}; do
        for w in before after; do
          [ -d /tmp/wheel-$w ] || continue
          echo "== python idle round $r $w"
          PYTHONPATH=/tmp/wheel-$w timeout 60 $py python/bench/idle.py
        done
      done | tee -a "$out/idle.txt"
    fi
    if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: not the test binaries this time
      timeout 330 bash .gpu/run.sh > "$out/tests.log" 2>&1; echo "run.sh exit $?"
      grep -E '^test result|FAILED|panicked|gpu-stage:' "$out/tests.log" | sort | uniq -c
    fi
    mps_on
    for b in before after before after; do
      [ $b = before ] && bin=.gpu/before/gpuring || bin=.gpu/bin/gpuring
      echo "== demo MPS $b"; timeout 60 $bin demo 2>&1 | grep -E "│ (gpuring|pipe)"
    done | tee "$out/demo-mps.txt"
    mps_off
    ;;
  fanout-ab)  # the 4 KB fan-out rows of gpuring (SPSC; broadcast to 1 and 8, spinning and
    # sleeping) with .gpu/before/bench-fanout and this build's, alternated (ROUNDS, default
    # "1 2 3"); unpinned (N + 1 processes: eight spinning receivers pinned to six CPUs
    # time-slice, 4 ms a turn). The filter is a list of substrings (benches/common `selected`).
    unset GPURING_BENCH_CPUS
    # ROWS overrides the rows (the same substring list).
    rows=${ROWS:-'fanout_4KB_to_1/gpuring_spsc|fanout_4KB_to_1/gpuring_broadcast|fanout_4KB_to_8/gpuring_broadcast'}
    for r in ${ROUNDS:-1 2 3}; do
      for b in before after; do
        [ $b = before ] && bin=.gpu/before/bench-fanout || bin=.gpu/bin/bench-fanout
        echo "== fanout round $r $b"
        timeout 120 $bin --bench "$rows" > "$out/fanout-$r-$b.log" 2>&1
        grep -E '^oneway|^p99|thrpt|time:|^fanout' "$out/fanout-$r-$b.log" | sed -E 's/ +/ /g'
      done
    done | tee "$out/fanout.txt"
    ;;
  pybench)  # the Python package against Python's queues, no MPS
    OUT=$out timeout 500 bash scripts/python-gpu.sh run bench > "$out/pybench-nomps.log" 2>&1
    echo "== python bench, no MPS (exit $?)"; grep -E "items/s|skipped" "$out/pybench-nomps.log"
    ;;
esac
echo "/dev/shm leftovers:"; ls /dev/shm | grep gpuring | head || true
