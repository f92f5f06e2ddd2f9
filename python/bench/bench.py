#!/usr/bin/env python3
"""gpuring's Python path against the queues Python users pass tensors through, in one run.

    python python/bench/bench.py [--quick] [--json out.json]

Rows (each in its own pair of spawned processes):

- CUDA tensors of 4 KB, 5 MB and 64 MB: ``gpuring`` (``tx.send(t)`` into a GPU channel: one
  device-to-device copy; the receiver's ``torch.from_dlpack(msg)``, or its shortcut
  ``msg.torch()``: zero-copy, stream-ordered), and ``gpuring`` zero-copy (``tx.lease``, the
  producer writing one element of the slot in place through ``buf.torch()``: one kernel,
  no copy of the tensor, as the numpy row below), and ``gpuring`` zero-copy with the lease
  sent as is (no kernel per item: the transport alone, as torch's rows measure theirs)
  against ``torch.multiprocessing.Queue`` and ``SimpleQueue`` (CUDA IPC handles, pickled:
  no copy of the tensor either; the producer hands over 8 tensors written once, before the
  loop). Needs torch with CUDA; skipped otherwise.
- numpy arrays of 4 KB and 54 MB: ``gpuring`` host channel, zero-copy (``tx.lease``, one
  element written in place; ``np.from_dlpack(msg)``), and with one copy (``tx.send(a)``),
  against ``multiprocessing.Queue`` (pickled).

A third gpuring row on the GPU has the receiver spin longer before it sleeps
(``ch.receiver(spins=100_000)``), so that no item pays a futex wake-up. Two more repeat
the ``send`` and the zero-copy "as is" rows with the producer's channel opened with
``ready="event"``: each send is signalled by an interprocess event that the receiver's
stream waits on, instead of the default flag its stream writes in shared memory.

Latency is one-way and CPU side, as a user sees it: from the sender's call until the
receiver holds the tensor (``perf_counter_ns`` is CLOCK_MONOTONIC, shared by the
processes). One item at a time: the receiver acknowledges each through a pipe before the
next is sent, so nothing queues. p50 and p99 over the items after a warm-up.
Throughput: the sender sends as fast as it can, the receiver takes every item (and, on
the GPU, synchronizes once at the end); items/s over the receiver's time, in steady state:
from the receipt of item ``skip(n)`` on (64, or a tenth of the items where that is
less), so that opening each slot's memory (gpuring) or each tensor's (torch's queues)
once, on first use, is not counted in the rate.
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

import gpuring

GPU_SIZES = [("4 KB", 4 << 10), ("5 MB", 5 << 20), ("64 MB", 64 << 20)]
HOST_SIZES = [("4 KB", 4 << 10), ("54 MB", 3 * 2160 * 2080 * 4)]
RING_SLOTS = 8  # the tensors each producer cycles through
GPU_SLOTS = 32  # gpuring slots per sender on the GPU (in flight: one GPU time slice each way)
HOST_SLOTS = 8
SPINS = 100_000  # a receiver that spins (some 1-4 ms) before it sleeps: no wake-up per item


def now():
    return time.perf_counter_ns()


def counts(size, quick, slow=False):
    """(latency items, throughput items) for an item of ``size`` bytes."""
    if slow:  # pickled 54 MB arrays: ~0.2 s each
        return (12, 12) if quick else (40, 40)
    if size >= 32 << 20:
        return (100, 500) if quick else (400, 3000)
    if size >= 1 << 20:
        return (200, 2000) if quick else (1000, 10000)
    return (500, 5000) if quick else (3000, 30000)


def skip(n):
    """Items a throughput run takes before its clock starts (the steady state after)."""
    return min(2 * GPU_SLOTS, n // 10)


def stats(ns):
    ns = sorted(ns)
    pick = lambda q: ns[min(len(ns) - 1, int(q * len(ns)))] / 1000.0  # noqa: E731
    return {"p50_us": pick(0.50), "p99_us": pick(0.99), "n": len(ns)}


# ---------------------------------------------------------------------------------------
# The two ends of each transport. `mode` is "lat" (one at a time, acknowledged) or "tput".


def gpuring_producer(name, device, size, n, mode, how, ready, ack):
    if device is not None:
        import torch

        pool = [
            torch.full((size // 4,), float(i), device="cuda:%d" % device) for i in range(RING_SLOTS)
        ]
        torch.cuda.synchronize()
    else:
        pool = [np.full(size, i, dtype=np.uint8) for i in range(RING_SLOTS)]
    ch = gpuring.Channel.open(name, device=device, timeout=30, ready=ready)
    tx = ch.sender()
    for i in range(n):
        t0 = now()
        if how == "lease" and device is not None:
            with tx.lease((size // 4,), "float32", tag=t0) as buf:
                buf.torch()[:1].fill_(float(i))  # the producer writes in place (one kernel)
        elif how == "lease as is":
            # The transport alone, as torch's rows measure it (they hand over tensors
            # written once, before the loop): the slot goes out with what it holds.
            tx.lease((size // 4,), "float32", tag=t0).send()
        elif how == "lease":
            with tx.lease((size,), "uint8", tag=t0) as buf:
                np.from_dlpack(buf)[0] = i & 0xFF  # the producer writes in place
        else:
            tx.send(pool[i % RING_SLOTS], tag=t0)
        if mode == "lat":
            ack.recv()
    ack.recv()  # the receiver is done: our pool may go
    tx.close()


def gpuring_consumer(name, device, n, mode, view_by, spins, ack, out):
    ch = gpuring.Channel.open(name, device=device, timeout=30)
    rx = ch.receiver(spins=spins)
    if device is None:
        view = np.from_dlpack
    elif view_by == "torch.from_dlpack":
        import torch

        view = torch.from_dlpack
    else:
        import torch

        view = gpuring.Message.torch
    lat = []
    t_first = None
    for i in range(n):
        msg = rx.recv(timeout=60)
        t = view(msg)
        got = now()
        if i == skip(n):
            t_first = got
        lat.append(got - msg.tag)
        del t
        msg.release()
        if mode == "lat":
            ack.send(1)
    if device is not None:
        torch.cuda.synchronize()
    t_end = now()
    ack.send(1)
    out.put({"lat": lat, "secs": (t_end - t_first) / 1e9, "items": n - 1 - skip(n)})


def torch_producer(qkind, q, device, size, n, mode, ack):
    import torch

    pool = [
        torch.full((size // 4,), float(i), device="cuda:%d" % device) for i in range(RING_SLOTS)
    ]
    torch.cuda.synchronize()
    for i in range(n):
        q.put((now(), pool[i % RING_SLOTS]))
        if mode == "lat":
            ack.recv()
    ack.recv()  # keep the tensors alive until the consumer is done (torch's rule)


def queue_consumer(q, n, mode, cuda, ack, out):
    """The consumer of a torch or multiprocessing queue: items are (timestamp, tensor)."""
    if cuda:
        import torch

        torch.cuda.init()
    lat = []
    t_first = None
    for i in range(n):
        ts, t = q.get()
        got = now()
        if i == skip(n):
            t_first = got
        lat.append(got - ts)
        del t
        if mode == "lat":
            ack.send(1)
    if cuda:
        torch.cuda.synchronize()
    t_end = now()
    ack.send(1)
    out.put({"lat": lat, "secs": (t_end - t_first) / 1e9, "items": n - 1 - skip(n)})


def mpq_producer(q, size, n, mode, ack):
    pool = [np.full(size, i, dtype=np.uint8) for i in range(RING_SLOTS)]
    for i in range(n):
        q.put((now(), pool[i % RING_SLOTS]))
        if mode == "lat":
            ack.recv()
    ack.recv()


# ---------------------------------------------------------------------------------------


def run_pair(ctx, producer, pargs, consumer, cargs):
    """Runs one producer and one consumer; returns the consumer's report."""
    a, b = ctx.Pipe()
    out = ctx.Queue()
    c = ctx.Process(target=consumer, args=cargs + (b, out))
    p = ctx.Process(target=producer, args=pargs + (a,))
    c.start()
    p.start()
    report = out.get(timeout=900)
    p.join(60)
    c.join(60)
    if p.exitcode != 0 or c.exitcode != 0:
        raise RuntimeError("a process failed: producer %r consumer %r" % (p.exitcode, c.exitcode))
    return report


def measure(ctx, make, quick, size, slow=False, warm=20):
    """Latency then throughput rows of one transport. `make(mode, n)` runs one pair."""
    n_lat, n_tput = counts(size, quick, slow)
    lat = make("lat", n_lat + warm)
    tput = make("tput", n_tput)
    row = stats(lat["lat"][warm:])
    row["items_per_s"] = tput["items"] / tput["secs"]
    row["gb_per_s"] = row["items_per_s"] * size / 1e9
    return row


def gpuring_rows(ctx, device, sizes, quick, how, view_by="np.from_dlpack", spins=None, ready=None):
    rows = {}
    for label, size in sizes:
        name = "gpuring-pybench-%d-%s" % (os.getpid(), label.replace(" ", ""))
        slot = max(size, 4096)

        def make(mode, n, name=name, size=size, slot=slot):
            slots = HOST_SLOTS if device is None else GPU_SLOTS
            ch = gpuring.Channel.create(
                name, capacity=64, slots=slots, slot_bytes=slot, device=device
            )
            try:
                return run_pair(
                    ctx,
                    gpuring_producer,
                    (name, device, size, n, mode, how, ready),
                    gpuring_consumer,
                    (name, device, n, mode, view_by, spins),
                )
            finally:
                ch.close()

        rows[label] = measure(ctx, make, quick, size)
        wait = "" if spins is None else ", spins=%d" % spins
        wait += "" if ready is None else ", ready=%s" % ready
        print(
            "  gpuring %s + %-17s%s %-5s %s" % (how, view_by, wait, label, fmt(rows[label])),
            flush=True,
        )
    return rows


def torch_rows(tctx, device, sizes, quick, qkind):
    rows = {}
    for label, size in sizes:

        def make(mode, n, size=size):
            q = tctx.Queue() if qkind == "Queue" else tctx.SimpleQueue()
            return run_pair(
                tctx,
                torch_producer,
                (qkind, q, device, size, n, mode),
                queue_consumer,
                (q, n, mode, True),
            )

        rows[label] = measure(tctx, make, quick, size)
        print(
            "  torch.multiprocessing.%-11s %-5s %s" % (qkind, label, fmt(rows[label])), flush=True
        )
    return rows


def mpq_rows(ctx, sizes, quick):
    rows = {}
    for label, size in sizes:

        def make(mode, n, size=size):
            q = ctx.Queue()
            return run_pair(
                ctx, mpq_producer, (q, size, n, mode), queue_consumer, (q, n, mode, False)
            )

        rows[label] = measure(
            ctx, make, quick, size, slow=size > 1 << 20, warm=2 if size > 1 << 20 else 20
        )
        print("  multiprocessing.Queue %-5s %s" % (label, fmt(rows[label])), flush=True)
    return rows


def fmt(r):
    return "p50 %9.1f us  p99 %9.1f us  %10.0f items/s  %7.2f GB/s" % (
        r["p50_us"],
        r["p99_us"],
        r["items_per_s"],
        r["gb_per_s"],
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer items (a smoke run)")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--no-gpu", action="store_true", help="host rows only")
    ap.add_argument("--gpu-only", action="store_true", help="GPU rows only")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    results = {"host": {}, "gpu": {}, "python": sys.version.split()[0], "numpy": np.__version__}
    gpu = False
    if not args.no_gpu:
        try:
            import torch

            gpu = torch.cuda.is_available()
            results["torch"] = torch.__version__
            if gpu:
                results["device"] = torch.cuda.get_device_name(args.device)
        except ImportError:
            pass
    if gpu:
        import torch.multiprocessing as tmp

        tctx = tmp.get_context("spawn")
        print("CUDA tensors (%s):" % results["device"], flush=True)
        results["gpu"]["gpuring (torch.from_dlpack)"] = gpuring_rows(
            ctx, args.device, GPU_SIZES, args.quick, "send", "torch.from_dlpack"
        )
        results["gpu"]["gpuring (msg.torch())"] = gpuring_rows(
            ctx, args.device, GPU_SIZES, args.quick, "send", "msg.torch()"
        )
        results["gpu"]["gpuring (msg.torch(), receiver(spins=%d))" % SPINS] = gpuring_rows(
            ctx, args.device, GPU_SIZES, args.quick, "send", "msg.torch()", SPINS
        )
        results["gpu"]["gpuring zero-copy (lease, msg.torch())"] = gpuring_rows(
            ctx, args.device, GPU_SIZES, args.quick, "lease", "msg.torch()"
        )
        results["gpu"]["gpuring zero-copy (lease sent as is, msg.torch())"] = gpuring_rows(
            ctx, args.device, GPU_SIZES, args.quick, "lease as is", "msg.torch()"
        )
        # The same two with the producer's sends signalled by an interprocess event instead
        # of the default host flag (`ready="event"`: the receiver's stream waits on it).
        results["gpu"]["gpuring (msg.torch(), ready=event)"] = gpuring_rows(
            ctx, args.device, GPU_SIZES, args.quick, "send", "msg.torch()", ready="event"
        )
        results["gpu"]["gpuring zero-copy (lease sent as is, msg.torch(), ready=event)"] = (
            gpuring_rows(
                ctx, args.device, GPU_SIZES, args.quick, "lease as is", "msg.torch()", ready="event"
            )
        )
        results["gpu"]["torch.multiprocessing.Queue"] = torch_rows(
            tctx, args.device, GPU_SIZES, args.quick, "Queue"
        )
        results["gpu"]["torch.multiprocessing.SimpleQueue"] = torch_rows(
            tctx, args.device, GPU_SIZES, args.quick, "SimpleQueue"
        )
    else:
        print("CUDA tensors: skipped (no torch with CUDA here)", flush=True)
    if args.gpu_only:
        results["host"] = None
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    print("numpy arrays:", flush=True)
    results["host"]["gpuring zero-copy (lease)"] = gpuring_rows(
        ctx, None, HOST_SIZES, args.quick, "lease"
    )
    results["host"]["gpuring one copy (send)"] = gpuring_rows(
        ctx, None, HOST_SIZES, args.quick, "send"
    )
    results["host"]["multiprocessing.Queue"] = mpq_rows(ctx, HOST_SIZES, args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
