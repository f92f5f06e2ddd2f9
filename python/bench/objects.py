#!/usr/bin/env python3
"""The hand-off as real code meets it, against torch's queues, in one run.

    python python/bench/objects.py [--quick] [--json out.json] [--rust BIN] [--shapes S,..]

Each row is a producer and a consumer process on GPU 0. Per item the producer runs a
torch op on its tensor (``t.fill_(i)``, one kernel) and hands it over; the consumer takes
it and runs a torch op that reads it (``x.view(-1)[:1] * 2``, one kernel). Default
settings everywhere: ``gpuring.Queue(device=0)`` (``get`` returns a copy, as torch's queue
returns a tensor the consumer owns), ``torch.multiprocessing.Queue()`` and
``SimpleQueue()``; and a second gpuring row, ``gpuring copy=False``: ``get(copy=False)``,
views of the slot that hold it until they are freed. What goes through:

- ``tensor``: one CUDA tensor of 4 KB, 5 MB, 64 MB; also through a gpuring channel as a
  program written for it does (``tx.send(t)``; ``torch.from_dlpack(msg)``, zero-copy;
  and with the package's accessor ``msg.torch()``), and through the Rust API doing the
  same (``examples/handoff.rs``, given as ``--rust BIN``: a memset over the tensor, lease,
  copy, send; receive, a 4-byte copy out of the message);
- ``tuple``: ``(time.time(), t)`` with a 4 KB tensor;
- ``dict10``: ten 4 KB tensors and an int in a dict;
- ``state``: a state dict of 300 float32 tensors, 511 MB (time per message).

Latency: one item in flight (the consumer acknowledges each through a pipe), from the
producer's ``put``/``send`` call (after its op) to the consumer holding the object, its
tensors usable (``get`` or ``torch.from_dlpack`` returned; its op comes next, outside
the window, as the producer's op is: the ops are the user's, the same in every row, and
the Rust rows' raw driver calls cost less CPU than torch's); CPU side, both ends on
CLOCK_MONOTONIC. Rate: the producer puts as fast as it can, the
consumer takes every item; items/s over the consumer's steady state (after the first
tenth), with a synchronize at the end. torch's producer cycles through 8 tensors (torch's
rule: a tensor must stay alive while a consumer may use it), gpuring's copies each item
into its slot.
"""

import argparse
import json
import os
import queue
import subprocess
import time

import torch

import gpuring

SIZES = [("4 KB", 4 << 10), ("5 MB", 5 << 20), ("64 MB", 64 << 20)]
POOL = 8
STATE = (300, (416, 1024))


def now():
    return time.perf_counter_ns()


def make_item(shape, size, i):
    """The object of kind ``shape`` for item i (its tensors on GPU 0)."""
    if shape == "tensor":
        return torch.full((size // 4,), float(i), device="cuda")
    if shape == "tuple":
        return (time.time(), torch.full((size // 4,), float(i), device="cuda"))
    if shape == "dict10":
        d = {"t%d" % k: torch.full((size // 4,), float(i + k), device="cuda") for k in range(10)}
        d["step"] = i
        return d
    n, dims = STATE
    return {"layers.%d.weight" % k: torch.full(dims, float(k), device="cuda") for k in range(n)}


def first_tensor(obj):
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, tuple):
        return obj[1]
    return next(v for v in obj.values() if isinstance(v, torch.Tensor))


def producer(how, q, name, shape, size, n, lat, ack, out):
    pool = [make_item(shape, size, i) for i in range(POOL)]
    torch.cuda.synchronize()
    tx = (
        gpuring.Channel.open(name, device=0, timeout=30).sender()
        if how.startswith("channel")
        else None
    )
    sent = []
    for i in range(n):
        item = pool[i % POOL]
        first_tensor(item).fill_(float(i))  # the producer's torch op
        t0 = now()
        if tx is not None:
            tx.send(item)
        else:
            q.put(item)
        sent.append(t0)
        if lat:
            ack.recv()
    ack.recv()  # the consumer is done: the tensors may go
    out.put(sent)


def consumer(how, q, name, n, lat, ack, out):
    torch.cuda.init()
    rx = (
        gpuring.Channel.open(name, device=0, timeout=30).receiver()
        if how.startswith("channel")
        else None
    )
    got = []
    t_first = None
    for i in range(n):
        if rx is not None:
            msg = rx.recv(timeout=60)
            x = msg.torch() if how == "channel .torch()" else torch.from_dlpack(msg)
        else:
            obj = q.get(copy=how != "gpuring copy=False") if how.startswith("gpuring") else q.get()
            x = first_tensor(obj)
        t1 = now()  # the tensor is usable: reads queued now are ordered after its writes
        y = x.view(-1)[:1] * 2  # the consumer's torch op, reading it
        got.append(t1)
        if i == n // 10:
            t_first = t1
        del x, y
        if rx is not None:
            msg.release()
        if lat:
            ack.send(1)
    torch.cuda.synchronize()
    t_end = now()
    ack.send(1)
    out.put({"got": got, "secs": (t_end - t_first) / 1e9, "items": n - 1 - n // 10})


def _report(box, reporter, procs, row, limit=900):
    """What ``reporter`` puts in ``box``, waiting while it lives and no other of ``procs``
    failed: a child that dies ends the row at once, not after ``limit`` s."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return box.get(timeout=1)
        except queue.Empty:
            pass
        failed = [
            x for x in procs if x.exitcode not in (None, 0) or (x is reporter and x.exitcode == 0)
        ]
        if failed or time.monotonic() > deadline:
            try:  # a report put just before the exit
                return box.get(timeout=1)
            except queue.Empty:
                pass
            for x in procs:
                x.kill()
            why = "exit %r" % failed[0].exitcode if failed else "no report in %d s" % limit
            raise RuntimeError("%s: %s" % (row, why))


def run(ctx, how, shape, size, n, lat):
    name = "gpuring-objbench-%d" % time.monotonic_ns()
    ch = q = None
    if how.startswith("channel"):
        ch = gpuring.Channel.create(name, slot_bytes=max(size, 1 << 20), device=0)
    elif how.startswith("gpuring"):
        q = gpuring.Queue(device=0)
    elif how == "torch Queue":
        q = ctx.Queue()
    else:
        q = ctx.SimpleQueue()
    a, b = ctx.Pipe()
    pout, cout = ctx.Queue(), ctx.Queue()
    c = ctx.Process(target=consumer, args=(how, q, name, n, lat, b, cout))
    p = ctx.Process(target=producer, args=(how, q, name, shape, size, n, lat, a, pout))
    c.start()
    p.start()
    rep = _report(cout, c, (c, p), "%s %s" % (how, shape))
    sent = _report(pout, p, (c, p), "%s %s" % (how, shape))
    p.join(60)
    c.join(60)
    if p.exitcode or c.exitcode:
        raise RuntimeError("%s %s: exit %r %r" % (how, shape, p.exitcode, c.exitcode))
    if q is not None and hasattr(q, "close") and how.startswith("gpuring"):
        q.close()
    del ch
    rep["lat"] = [g - s for s, g in zip(sent, rep["got"])]
    return rep


def counts(shape, size, quick):
    """Items timed for latency and for the rate, and warm-up items, of a row."""
    big = shape == "state" or size >= 32 << 20
    n_lat = (10 if quick else 30) if shape == "state" else (100 if big else 1000)
    n_rate = (10 if quick else 30) if shape == "state" else (300 if big else 5000)
    if quick and shape != "state":
        n_lat, n_rate = n_lat // 4, n_rate // 4
    return n_lat, n_rate, 3 if shape == "state" else 20


def rust_row(binary, size, quick):
    """The Rust API doing the channel rows' pattern (examples/handoff.rs), same counts."""
    n_lat, n_rate, warm = counts("tensor", size, quick)
    out = subprocess.run(
        [binary, str(size), str(n_lat), str(n_rate), str(warm)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(ctx, how, shape, size, quick):
    n_lat, n_rate, warm = counts(shape, size, quick)
    lat = sorted(run(ctx, how, shape, size, n_lat + warm, True)["lat"][warm:])
    rate = run(ctx, how, shape, size, n_rate, False)
    return {
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p99_us": lat[min(len(lat) - 1, int(0.99 * len(lat)))] / 1e3,
        "items_per_s": rate["items"] / rate["secs"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--rust", help="examples/handoff.rs built (.gpu/bin/example-handoff)")
    ap.add_argument("--shapes", default="tensor,tuple,dict10,state")
    ap.add_argument("--sizes", help="tensor rows' sizes, e.g. '4 KB' (default: all three)")
    ap.add_argument(
        "--rows",
        help="only these rows of each shape, e.g. 'gpuring,gpuring copy=False' (the "
        "comparisons with torch's Queue need its row)",
    )
    args = ap.parse_args()
    if args.rust is None and os.path.exists(".gpu/bin/example-handoff"):
        args.rust = ".gpu/bin/example-handoff"
    if args.rust is None:
        print("Rust API rows skipped: no --rust binary (examples/handoff.rs)", flush=True)
    ctx = torch.multiprocessing.get_context("spawn")
    shapes = args.shapes.split(",")
    plan = [("tensor", label, size) for label, size in SIZES]
    plan += [("tuple", "4 KB", 4 << 10), ("dict10", "10 x 4 KB", 4 << 10)]
    plan += [("state", "300 tensors, 511 MB", 0)]
    plan = [p for p in plan if p[0] in shapes]
    if args.sizes:
        plan = [p for p in plan if p[0] != "tensor" or p[1] in args.sizes.split(",")]
    results = []
    for shape, label, size in plan:
        hows = ["Rust API"] if shape == "tensor" and args.rust else []
        hows += ["channel", "channel .torch()"] if shape == "tensor" else []
        hows += ["gpuring", "gpuring copy=False", "torch Queue", "torch SimpleQueue"]
        if args.rows:
            hows = [h for h in hows if h in args.rows.split(",")]
        base = None
        for how in hows:
            if how == "Rust API":
                r = rust_row(args.rust, size, args.quick)
            else:
                r = row(ctx, how, shape, size, args.quick)
            r.update(shape=shape, size=label, how=how)
            results.append(r)
            if how == "torch Queue":
                base = r
            print(
                "%-7s %-20s %-18s p50 %9.1f us  p99 %9.1f us  %9.0f items/s"
                % (shape, label, how, r["p50_us"], r["p99_us"], r["items_per_s"]),
                flush=True,
            )
        if base is None or "gpuring" not in hows or "gpuring copy=False" not in hows:
            continue
        g = next(
            r
            for r in results
            if r["shape"] == shape and r["how"] == "gpuring" and r["size"] == label
        )
        print(
            "%-7s %-20s gpuring Queue vs torch Queue: p50 %.1fx lower, %.1fx the items/s"
            % (shape, label, base["p50_us"] / g["p50_us"], g["items_per_s"] / base["items_per_s"]),
            flush=True,
        )
        mine = {r["how"]: r for r in results if r["shape"] == shape and r["size"] == label}
        views = mine["gpuring copy=False"]
        print(
            "%-7s %-20s gpuring Queue get(copy=False) vs torch Queue: p50 %.1fx lower, "
            "%.1fx the items/s"
            % (
                shape,
                label,
                base["p50_us"] / views["p50_us"],
                views["items_per_s"] / base["items_per_s"],
            ),
            flush=True,
        )
        if "Rust API" in mine:
            rust = mine["Rust API"]["p50_us"]
            print(
                "%-7s %-20s p50 over the Rust API: channel %+.1f us, channel .torch() %+.1f us, "
                "Queue %+.1f us; torch Queue p50 / channel p50: %.1fx"
                % (
                    shape,
                    label,
                    mine["channel"]["p50_us"] - rust,
                    mine["channel .torch()"]["p50_us"] - rust,
                    g["p50_us"] - rust,
                    base["p50_us"] / mine["channel"]["p50_us"],
                ),
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
