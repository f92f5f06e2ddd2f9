#!/usr/bin/env python3
"""A GPU Queue's calls one by one, in one process: what ``put`` and ``get`` cost beside the
channel calls they make.

    python python/bench/queue_parts.py

4 KB CUDA tensors on GPU 0. Each row times one call in batches of 32 (the items drained
between batches, outside the timing) and prints the median of 200 batches per call. The
rows that move items across processes are in ``queue_rate.py``; this one shows the Python
and driver work of each call without the other process.
"""

import statistics
import time

import torch

import gpuring
import gpuring._queue as gq

N, ROUNDS = 32, 200


def per_call(call, drain):
    """Median µs of one `call`, over ROUNDS batches of N; `drain(N)` between batches."""
    ts = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter_ns()
        for _ in range(N):
            call()
        ts.append((time.perf_counter_ns() - t0) / N / 1e3)
        drain(N)
    return statistics.median(ts)


def per_take(fill, take):
    """Median µs of one `take()`, over ROUNDS batches of N items that `fill(N)` queued."""
    ts = []
    for _ in range(ROUNDS):
        fill(N)
        t0 = time.perf_counter_ns()
        for _ in range(N):
            take()
        ts.append((time.perf_counter_ns() - t0) / N / 1e3)
    return statistics.median(ts)


def main():
    t = torch.zeros(1024, device="cuda")
    torch.cuda.synchronize()
    q = gpuring.Queue(device=0, slots=64)
    q.put(t)
    q.get()
    tx = q._tx
    tag = "gpuring-bench-parts-%d" % time.time_ns()
    spsc = gpuring.Channel.create(tag + "-spsc", device=0, slots=64, capacity=64)
    mpmc = gpuring.Channel.create(tag + "-mpmc", device=0, slots=64, capacity=64, mpmc=True)
    stx, srx = spsc.sender(), spsc.receiver()
    mtx, mrx = mpmc.sender(), mpmc.receiver()

    def drained(get):
        def drain(n):
            for _ in range(n):
                get()

        return drain

    def nocopy():
        return q.get(copy=False)

    def release(rx):
        return lambda: rx.recv().release()

    def nothing(n):
        return None

    def view_of_message():
        m = srx.recv()
        x = m.torch()
        del x
        m.release()

    rows = [
        ("q.put(t)", lambda: q.put(t), drained(nocopy)),
        ("queue's tx.send(t, tag)", lambda: tx.send(t, tag=gq._TORCH), drained(nocopy)),
        ("spsc tx.send(t)", lambda: stx.send(t), drained(release(srx))),
        ("mpmc tx.send(t)", lambda: mtx.send(t), drained(release(mrx))),
        ("t.fill_(1)", lambda: t.fill_(1.0), nothing),
        ("_kind(t)", lambda: gq._kind(t), nothing),
        ("_nbytes(t)", lambda: gq._nbytes(t), nothing),
        ("tx.free_slots", lambda: tx.free_slots, nothing),
    ]
    for name, call, drain in rows:
        print("%-26s %7.2f us" % (name, per_call(call, drain)), flush=True)

    def put_n(n):
        for _ in range(n):
            q.put(t)

    def send_n(n):
        for _ in range(n):
            stx.send(t)

    print("%-26s %7.2f us" % ("q.get()", per_take(put_n, q.get)))
    print("%-26s %7.2f us" % ("q.get(copy=False)", per_take(put_n, nocopy)))
    print("%-26s %7.2f us" % ("spsc recv+torch+release", per_take(send_n, view_of_message)))
    q.close()
    spsc.close()
    mpmc.close()


if __name__ == "__main__":
    main()
