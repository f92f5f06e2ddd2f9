"""A scheduler hands each step's input to N worker processes through one broadcast
channel: every worker reads the same slot in place (no copy per worker, no pickle), and
the slot goes back once every worker has released its message.

    python python/examples/broadcast_step.py                # numpy arrays, host slots
    python python/examples/broadcast_step.py --device 0     # torch CUDA tensors, GPU slots
    python python/examples/broadcast_step.py --lagging      # workers may skip steps
    python python/examples/broadcast_step.py --separate     # N SPSC channels instead
    python python/examples/broadcast_step.py --device 0 --no-sync  # workers never wait for the GPU

Each worker checks every step it gets (its values are the step number) and reports how many
it got and missed, and the latency from the scheduler's ``send`` to its own tensor being
usable (``np.from_dlpack`` / ``torch.from_dlpack`` returned; the send time travels in the
slot's header). The scheduler does a tensor op per step (``fill``) before it sends; with
``--interval`` it waits that long between steps (latency without queueing), else it
streams (steps per second). By default the slowest worker holds the scheduler back
(nothing is lost); with ``--lagging`` the scheduler never waits for a worker that is
behind, and such a worker is told how many steps it missed (``gpuring.Lagged``) and goes
on with the newest. ``--separate`` sends each step through N single-receiver channels
(one copy into a slot per worker): the baseline of the broadcast. With ``--no-sync`` (GPU) a
worker does not wait for the GPU at each step: it adds the step's sum into a running total
on the GPU (a read of the slot queued on its stream, released with the message, whose slot
must not be rewritten before that read) and checks the total once, at the end.
"""

import argparse
import multiprocessing as mp
import struct
import time

import gpuring

SHAPE = (64, 1024)  # a step's input: 64 rows of 1024 float32 (256 KiB)


def worker(name, device, index, nap, results, no_sync=False):
    ch = gpuring.Channel.open(name, device=device, timeout=10)
    rx = ch.receiver()
    results.put(("ready", index))
    total, expected = None, 0
    if no_sync:
        import torch

        total = torch.zeros((), dtype=torch.float64, device=device)

        def check(msg, step):
            nonlocal expected
            x = torch.from_dlpack(msg)
            usable = time.perf_counter()
            total.add_(x.sum(dtype=torch.float64))  # queued; x and the message go now
            expected += step * x.numel()
            return usable, True
    elif device is None:
        import numpy as np

        def check(msg, step):
            x = np.from_dlpack(msg)
            return time.perf_counter(), bool((x == step).all())
    else:
        import torch

        def check(msg, step):
            x = torch.from_dlpack(msg)
            usable = time.perf_counter()
            return usable, bool((x == step).all().item())

    got = missed = 0
    last = -1
    latencies = []
    while True:
        try:
            with rx.recv() as msg:
                step = msg.tag
                usable, ok = check(msg, step)
                latencies.append(usable - struct.unpack("d", msg.header)[0])
                if not ok or step <= last:
                    results.put(("bad", index, step, last))
                    return
                last, got = step, got + 1
                if nap:
                    time.sleep(nap)
        except gpuring.Lagged as e:
            missed += e.missed
        except gpuring.Disconnected:
            break
    if no_sync and total.item() != expected:
        results.put(("bad", index, -1, last))  # a slot rewritten under a queued read
        return
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e6 if latencies else float("nan")
    results.put(("done", index, got, missed, last, p50))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--device", type=int, default=None, help="a GPU: CUDA tensors, GPU slots")
    p.add_argument("--lagging", action="store_true", help="never wait for a worker behind")
    p.add_argument("--separate", action="store_true", help="one SPSC channel per worker")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between steps")
    p.add_argument("--nap", type=float, default=0.0, help="worker 0 sleeps this many s a step")
    p.add_argument("--slots", type=int, default=8, help="slots per channel (default 8)")
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="GPU: workers sum each step on the GPU and check the total at the end",
    )
    args = p.parse_args(argv)
    if args.separate and args.lagging:
        p.error("--lagging is a broadcast channel's policy")
    if args.no_sync and (args.device is None or args.lagging):
        p.error("--no-sync needs --device, and every step (no --lagging)")

    base = "gpuring-example-broadcast-%d" % mp.current_process().pid
    names = [base + "-%d" % i for i in range(args.workers)] if args.separate else [base]
    channels = [
        gpuring.Channel.create(
            n,
            broadcast=not args.separate,
            lagging=args.lagging,
            capacity=16,
            slots=args.slots,
            slot_bytes=4 * SHAPE[0] * SHAPE[1],
            device=args.device,
        )
        for n in names
    ]
    senders = [ch.sender() for ch in channels]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=worker,
            args=(
                names[i % len(names)],
                args.device,
                i,
                args.nap if i == 0 else 0,
                results,
                args.no_sync,
            ),
        )
        for i in range(args.workers)
    ]
    for w in procs:
        w.start()
    for _ in procs:
        assert results.get(timeout=60)[0] == "ready"

    if args.device is None:
        import numpy as np

        x = np.zeros(SHAPE, dtype=np.float32)
    else:
        import torch

        x = torch.zeros(SHAPE, dtype=torch.float32, device=args.device)
    start = time.perf_counter()
    for step in range(args.steps):
        if args.device is None:  # the scheduler's work
            x.fill(step)
        else:
            x.fill_(step)
        for tx in senders:  # one copy into a slot per channel; every worker reads its slot
            tx.send(x, tag=step, header=struct.pack("d", time.perf_counter()))
        if args.interval:
            time.sleep(args.interval)
    for tx in senders:
        tx.close()  # the workers' iteration ends once they have read what was sent
    reports = sorted((results.get(timeout=120) for _ in procs), key=lambda r: r[1])
    elapsed = time.perf_counter() - start
    for w in procs:
        w.join(30)
    for ch in channels:
        ch.close()
    for r in reports:
        if r[0] != "done":
            raise SystemExit("worker %d: step %d after %d, or wrong values" % r[1:])
        print("worker %d: %d steps, %d missed, last %d, p50 %.1f us to a usable tensor" % r[1:])
    how = "%d SPSC channels" % len(senders) if args.separate else "one broadcast channel"
    rate = args.steps / elapsed
    print(
        "%d steps to %d workers through %s in %.3f s: %.0f steps/s"
        % (args.steps, len(procs), how, elapsed, rate)
    )
    return reports


if __name__ == "__main__":
    main()
