#!/usr/bin/env python3
"""Where a GPU Queue hand-off's time goes, across two processes, step by step.

    python python/bench/queue_steps.py [--sizes 4096,5242880] [--n 1000] [--device 0|none]
                                       [--json out.json]

One item in flight (the consumer acknowledges each through a pipe), a producer and a
consumer process on GPU 0, the producer's torch op (``t.fill_(i)``) before each hand-off as
in ``objects.py``. Each row changes one thing on the way from a plain channel
(``tx.send(t)``; ``rx.recv()``, ``msg.torch()``) to ``gpuring.Queue``'s defaults
(an MPMC channel with redelivery; ``get`` clones and releases before it returns; a
putter's slots fitted to its first item, or 1 MiB ones and the large-item way), so the
cost of each step shows in the same run. Times are CLOCK_MONOTONIC on both sides, from
the producer's send/put call; the consumer's marks are printed as medians: ``recv`` (the
message is here), ``view`` (the tensor is made), ``done`` (what the row's ``get`` does
before returning is done: the row's latency). ``--device none``: CPU tensors through
host slots (the rows' Python and channel costs without a GPU).
"""

import argparse
import json
import time

import torch

import gpuring

DEV = [0]  # the GPU ordinal, or None (CPU tensors, host slots)

# name -> (channel options or "queue", consumer steps inside the window)
ROWS = [
    ("spsc: recv + torch()", dict(), ""),
    ("mpmc: recv + torch()", dict(mpmc=True), ""),
    ("mpmc, no redeliver: recv + torch()", dict(mpmc=True, redeliver=False), ""),
    ("mpmc: + release", dict(mpmc=True), "release"),
    ("mpmc: + clone + release", dict(mpmc=True), "clone,release"),
    ("spsc: + clone + release", dict(), "clone,release"),
    ("Queue.get(copy=False)", "queue", "nocopy"),
    ("Queue.get()", "queue", ""),
    ("Queue(slot_bytes=1 MiB).get()", "queue-1mib", ""),
]


def now():
    return time.perf_counter_ns()


def where():
    return "cpu" if DEV[0] is None else "cuda:%d" % DEV[0]


def sync():
    if DEV[0] is not None:
        torch.cuda.synchronize()


def producer(dev, name, q, size, n, ack, out):
    DEV[0] = dev
    pool = [torch.full((size // 4,), float(i), device=where()) for i in range(8)]
    sync()
    tx = None if q is not None else gpuring.Channel.open(name, device=DEV[0], timeout=30).sender()
    marks = []
    for i in range(n):
        t = pool[i % 8]
        t.fill_(float(i))
        t0 = now()
        if tx is not None:
            tx.send(t)
        else:
            q.put(t)
        t1 = now()
        marks.append((t0, t1))
        ack.recv()
    ack.recv()
    out.put(marks)


def consumer(dev, steps, name, q, n, ack, out):
    DEV[0] = dev
    rx = None if q is not None else gpuring.Channel.open(name, device=DEV[0], timeout=30).receiver()
    marks = []
    for _ in range(n):
        if rx is not None:
            msg = rx.recv(timeout=60)
            a = now()
            x = msg.torch()
            b = now()
            if "clone" in steps:
                x = x.clone()
            if "release" in steps:
                msg.release()
            c = now()
        else:
            x = q.get(copy="nocopy" not in steps)
            a = b = c = now()
        y = x.view(-1)[:1] * 2
        del x, y
        if rx is not None:
            msg.release()
        marks.append((a, b, c))
        ack.send(1)
    sync()
    ack.send(1)
    out.put(marks)


def run(ctx, opts, steps, size, n):
    name = "gpuring-qsteps-%d" % time.monotonic_ns()
    q = ch = None
    if opts == "queue":
        q = gpuring.Queue(device=DEV[0])
    elif opts == "queue-1mib":
        # 1 MiB slots whatever the first item: a larger one goes the large-item way (two
        # messages), where the default fits the putter's slots to its first item.
        q = gpuring.Queue(device=DEV[0], slot_bytes=1 << 20)
    else:
        ch = gpuring.Channel.create(name, slot_bytes=max(size, 1 << 20), device=DEV[0], **opts)
    a, b = ctx.Pipe()
    pout, cout = ctx.Queue(), ctx.Queue()
    c = ctx.Process(target=consumer, args=(DEV[0], steps, name, q, n, b, cout))
    p = ctx.Process(target=producer, args=(DEV[0], name, q, size, n, a, pout))
    c.start()
    p.start()
    got = cout.get(timeout=600)
    sent = pout.get(timeout=60)
    p.join(60)
    c.join(60)
    if p.exitcode or c.exitcode:
        raise RuntimeError("exit %r %r" % (p.exitcode, c.exitcode))
    if q is not None:
        q.close()
    del ch
    warm = min(50, n // 10)
    cols = {"send": [], "recv": [], "view": [], "done": []}
    for (t0, t1), (ra, rb, rc) in list(zip(sent, got))[warm:]:
        cols["send"].append(t1 - t0)
        cols["recv"].append(ra - t0)
        cols["view"].append(rb - t0)
        cols["done"].append(rc - t0)
    return {k: sorted(v)[len(v) // 2] / 1e3 for k, v in cols.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4096,5242880")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--device", default="0")
    ap.add_argument("--json")
    args = ap.parse_args()
    DEV[0] = None if args.device == "none" else int(args.device)
    ctx = torch.multiprocessing.get_context("spawn")
    results = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for label, opts, steps in ROWS:
            r = run(ctx, opts, steps, size, args.n)
            r.update(size=size, row=label)
            results.append(r)
            print(
                "%8d B  %-36s send %6.1f  recv %6.1f  view %6.1f  done %6.1f us (p50)"
                % (size, label, r["send"], r["recv"], r["view"], r["done"]),
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
