#!/usr/bin/env python3
"""Where a streaming GPU queue's time goes, on each side: items/s and each step's median.

    python python/bench/queue_rate.py [--size 4096] [--n 20000] [--json out.json]

Two spawned processes on GPU 0 stream ``--n`` CUDA tensors of ``--size`` bytes, as real
code does: the producer runs a torch op on its tensor (``t.fill_(i)``) and puts it; the
consumer gets it and runs a torch op reading it (``x.mul(2)``). Each side times each of its
two steps (``time.perf_counter_ns``); the rates are the consumer's: from its first item to
its last (``items/s``), and the median over windows of 500 items (``window/s``: a stall of
the VM moves one window, not the median). The slower side sets the rate: the faster one's
blocking step (``put`` waiting for room, ``get`` for an item) takes up the difference. Rows,
in one run:

- ``torch Queue``: ``torch.multiprocessing.Queue(maxsize=8)`` (CUDA IPC handles of a pool
  of 16 tensors that the producer fills in turn);
- ``Queue.get()``: ``gpuring.Queue(device=0)`` with its defaults (``get`` copies);
- ``Queue.get() prefetch=4``: ``gpuring.Queue(device=0, prefetch=4)``: a ``get`` that finds
  tensors waiting behind its item copies up to four in one launch and hands the others
  out next;
- ``Queue, timeout=60``: the same with ``put(x, timeout=60)`` / ``get(timeout=60)``;
- ``Queue.get(copy=False)``: zero-copy views (the slot goes back when the view is freed);
- ``Channel: send + torch()``: a channel's ``tx.send(t)`` / ``rx.recv()`` +
  ``msg.torch()`` (the message freed after the op), for reference;
- ``Channel: send + from_dlpack``: the same with ``torch.from_dlpack(msg)``;
- ``Channel: from_dlpack + release()``: and ``msg.release()`` after the op;
- ``Channel: legacy capsule``: ``torch.utils.dlpack.from_dlpack(msg.__dlpack__(stream=1))``
  (an unversioned capsule, as ``msg.torch()`` makes).

The ``put`` p99 column shows the producer's stalls (a slot not back yet).
"""

import argparse
import json
import multiprocessing as mp
import statistics
import time

import torch
import torch.utils.dlpack

import gpuring

WINDOW = 500  # items a rate window holds

ROWS = [
    "torch Queue",
    "Queue.get()",
    "Queue.get() prefetch=4",
    "Queue timeout=60",
    "Queue.get(copy=False)",
    "Channel: send + torch()",
    "Channel: send + from_dlpack",
    "Channel: from_dlpack + release()",
    "Channel: legacy capsule",
]


def now():
    return time.perf_counter_ns()


def _endpoint(row, q, name, side):
    """What the row's side puts into or gets from."""
    if row.startswith("Channel"):
        ch = gpuring.Channel.open(name, device=0, timeout=30)
        return ch.sender() if side == "tx" else ch.receiver()
    return q


def producer(row, q, name, size, n, out, done):
    torch.cuda.set_device(0)
    end = _endpoint(row, q, name, "tx")
    pool = [torch.zeros(size // 4, device="cuda") for _ in range(16)]
    torch.cuda.synchronize()
    op_ns, put_ns = [], []
    for i in range(n):
        t = pool[i % 16]
        t0 = now()
        t.fill_(float(i))
        t1 = now()
        if row == "torch Queue":
            q.put(t)
        elif row == "Queue timeout=60":
            q.put(t, timeout=60)
        elif row.startswith("Channel"):
            end.send(t)
        else:
            q.put(t)
        t2 = now()
        op_ns.append(t1 - t0)
        put_ns.append(t2 - t1)
    torch.cuda.synchronize()
    out.put(("tx", op_ns, put_ns))
    done.wait(300)  # keep the tensors (torch's queue) and the pool until the consumer is done


def consumer(row, q, name, n, out):
    torch.cuda.set_device(0)
    end = _endpoint(row, q, name, "rx")
    get_ns, op_ns = [], []
    last = None
    first_at = None
    stamps = []
    for _ in range(n):
        t0 = now()
        if row == "Queue timeout=60":
            x = q.get(timeout=60)
        elif row == "Queue.get(copy=False)":
            x = q.get(copy=False)
        elif row == "Channel: send + torch()":
            msg = end.recv()
            x = msg.torch()
        elif row in ("Channel: send + from_dlpack", "Channel: from_dlpack + release()"):
            msg = end.recv()
            x = torch.from_dlpack(msg)
        elif row == "Channel: legacy capsule":
            msg = end.recv()
            x = torch.utils.dlpack.from_dlpack(msg.__dlpack__(stream=1))
        else:
            x = q.get()
        t1 = now()
        y = x.mul(2)
        t2 = now()
        if first_at is None:
            first_at = t0
        stamps.append(t1)
        get_ns.append(t1 - t0)
        op_ns.append(t2 - t1)
        last = y
        del x
        if row == "Channel: from_dlpack + release()":
            msg.release()
        if row.startswith("Channel"):
            del msg
    value = float(last[0].item())  # every item's op done
    took = now() - first_at
    # Items/s over each window of WINDOW items: a stall moves one window, not the median.
    windows = [
        WINDOW / ((stamps[i + WINDOW] - stamps[i]) / 1e9)
        for i in range(0, len(stamps) - WINDOW, WINDOW)
    ]
    out.put(("rx", get_ns, op_ns, took, value, windows))


def run(row, size, n):
    ctx = mp.get_context("spawn")
    name = None
    if row == "torch Queue":
        q = ctx.Queue(maxsize=8)
    elif row.startswith("Channel"):
        name = "queue-rate-%d" % time.monotonic_ns()
        ch = gpuring.Channel.create(name, device=0)
        q = None
    elif row == "Queue.get() prefetch=4":
        q = gpuring.Queue(device=0, prefetch=4)
    else:
        q = gpuring.Queue(device=0)
    out_tx, out_rx, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    p = ctx.Process(target=producer, args=(row, q, name, size, n, out_tx, done))
    c = ctx.Process(target=consumer, args=(row, q, name, n, out_rx))
    p.start()
    c.start()
    _, g, o, took, value, windows = out_rx.get(timeout=300)
    _, po, pp = out_tx.get(timeout=300)
    done.set()
    p.join(30)
    c.join(30)
    if name is not None:
        ch.close()
    elif row != "torch Queue":
        q.close()
    med = lambda v: statistics.median(v[n // 10 :]) / 1e3  # noqa: E731 (after a warm-up)
    return {
        "items_per_s": n / (took / 1e9),
        "window_items_per_s": statistics.median(windows) if windows else None,
        "producer_op_us": med(po),
        "put_us": med(pp),
        "put_p99_us": sorted(pp)[int(n * 0.99)] / 1e3,
        "get_us": med(g),
        "consumer_op_us": med(o),
        "last_value": value,
        "expected": 2.0 * (n - 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {}
    print(
        "%-34s %10s %10s %8s %8s %8s %8s %8s"
        % (
            "row (%d B), medians in µs" % args.size,
            "items/s",
            "window/s",
            "fill_",
            "put",
            "get",
            "mul",
            "put p99",
        )
    )
    for row in args.rows.split(","):
        r = run(row, args.size, args.n)
        results[row] = r
        bad = "" if r["last_value"] == r["expected"] else "  BAD VALUE %r" % r["last_value"]
        print(
            "%-34s %10.0f %10.0f %8.1f %8.1f %8.1f %8.1f %8.1f%s"
            % (
                row,
                r["items_per_s"],
                r["window_items_per_s"] or 0.0,
                r["producer_op_us"],
                r["put_us"],
                r["get_us"],
                r["consumer_op_us"],
                r["put_p99_us"],
                bad,
            ),
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "n": args.n, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
