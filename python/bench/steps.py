#!/usr/bin/env python3
"""Where a Python GPU hand-off spends its CPU time: each step timed alone, in one process
(sender and receiver both here, so no wake-up is in any figure).

    python python/bench/steps.py [--size BYTES] [--n N] [--cross]

Prints the median and p99 of each step in microseconds.
"""

import argparse
import os
import time

import torch

import gpuring


def timed(label, fn, n):
    ns = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ns.append(time.perf_counter_ns() - t0)
    ns.sort()
    print(
        "  %-46s p50 %7.2f us  p99 %7.2f us"
        % (label, ns[len(ns) // 2] / 1e3, ns[int(0.99 * len(ns))] / 1e3)
    )


def cross_producer(name, size, n, times, ack):
    t = torch.ones(size // 4, device="cuda")
    torch.cuda.synchronize()
    ch = gpuring.Channel.open(name, device=0, timeout=30)
    tx = ch.sender()
    sent = []
    for _i in range(n):
        t0 = time.perf_counter_ns()
        tx.send(t, tag=t0)
        sent.append((t0, time.perf_counter_ns()))
        ack.recv()
    times.put(sent)
    ack.recv()
    tx.close()


def cross_consumer(name, n, spins, times, ack):
    ch = gpuring.Channel.open(name, device=0, timeout=30)
    rx = ch.receiver(spins=spins)
    got = []
    for _i in range(n):
        msg = rx.recv(timeout=60)
        t1 = time.perf_counter_ns()
        v = msg.torch()
        t2 = time.perf_counter_ns()
        got.append((t1, t2))
        del v
        msg.release()
        ack.send(1)
    torch.cuda.synchronize()
    times.put(got)
    ack.send(1)


def cross(size, n, spins):
    """Two processes, one message at a time (as bench.py's latency rows): where the
    one-way time goes between the sender's call, its return, the receiver's ``recv``
    returning, and ``msg.torch()``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    name = "gpuring-steps-x-%d" % os.getpid()
    ch = gpuring.Channel.create(name, capacity=64, slots=32, slot_bytes=max(size, 4096), device=0)
    a, b = ctx.Pipe()
    tp, tc = ctx.Queue(), ctx.Queue()
    c = ctx.Process(target=cross_consumer, args=(name, n, spins, tc, b))
    p = ctx.Process(target=cross_producer, args=(name, size, n, tp, a))
    c.start()
    p.start()
    sent, got = tp.get(timeout=300), tc.get(timeout=300)
    p.join(60)
    c.join(60)
    ch.close()
    warm = min(50, n // 10)
    cols = {"send call": [], "send returned -> recv returned": [], "msg.torch()": [], "one way": []}
    for (t0, ts), (t1, t2) in list(zip(sent, got))[warm:]:
        cols["send call"].append(ts - t0)
        cols["send returned -> recv returned"].append(t1 - ts)
        cols["msg.torch()"].append(t2 - t1)
        cols["one way"].append(t2 - t0)
    print("two processes, %d bytes, receiver(spins=%r), %d items:" % (size, spins, n - warm))
    for label, ns in cols.items():
        ns.sort()
        print(
            "  %-46s p50 %7.2f us  p99 %7.2f us"
            % (label, ns[len(ns) // 2] / 1e3, ns[int(0.99 * len(ns))] / 1e3)
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--cross", action="store_true", help="two processes instead (see cross())")
    args = ap.parse_args()
    if args.cross:
        for spins in (None, 100_000):
            cross(args.size, args.n, spins)
        return
    n = args.n
    t = torch.ones(args.size // 4, device="cuda")
    torch.cuda.synchronize()
    name = "gpuring-steps-%d" % os.getpid()
    ch = gpuring.Channel.create(
        name, capacity=64, slots=8, slot_bytes=max(args.size, 4096), device=0
    )
    tx, rx = ch.sender(), ch.receiver()
    print(
        "one process, %d bytes, %d rounds each (gpuring from %s):"
        % (args.size, n, gpuring.__file__)
    )

    def accessors():
        # What `send` asks of a torch tensor (its own accessors), from Python.
        return (
            t.layout,
            t.is_cuda,
            t.get_device(),
            t.dtype,
            t.is_neg(),
            t.is_contiguous(),
            t.shape,
            t.data_ptr(),
        )

    timed("the tensor accessors send reads, from Python", accessors, n)
    timed("torch.cuda.current_stream(0)", lambda: torch.cuda.current_stream(0), n)
    timed("torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0), n)
    timed("t.__dlpack__(stream=1)", lambda: t.__dlpack__(stream=1), n)
    timed("torch.empty_like(t)", lambda: torch.empty_like(t), n)

    def lease_cancel():
        tx.lease((args.size // 4,), "float32").cancel()

    def lease_send():
        tx.lease((args.size // 4,), "float32").send()
        rx.recv().release()

    def lease_write_send():
        with tx.lease((args.size // 4,), "float32") as buf:
            buf.torch()[:1].fill_(1.0)
        rx.recv().release()

    v = t.clone()
    timed("v[0] = 1.0 (torch, a CUDA tensor)", lambda: v.__setitem__(0, 1.0), n)
    timed("v[:1].fill_(1.0)", lambda: v[:1].fill_(1.0), n)

    def lease_torch_cancel():
        buf = tx.lease((args.size // 4,), "float32")
        v = buf.torch()
        del v
        buf.cancel()

    timed("tx.lease(..).cancel()", lease_cancel, n)
    timed("tx.lease(..) + .torch() + .cancel()", lease_torch_cancel, n)
    timed("lease, .torch()[:1].fill_(1), send + recv", lease_write_send, n)
    timed("tx.lease(..).send() + rx.recv().release()", lease_send, n)

    def send_recv():
        tx.send(t)
        rx.recv().release()

    timed("tx.send(t) + rx.recv().release()", send_recv, n)

    def send_only():
        tx.send(t)

    msgs = []

    def recv_only():
        msgs.append(rx.recv())

    def from_dlpack():
        v = torch.from_dlpack(msgs[-1])
        del v

    def torch_view():
        v = msgs[-1].torch()
        del v

    def release():
        msgs.pop().release()

    # Step by step, 8 at a time (the pool holds 8 slots).
    steps = {
        "tx.send(t)": [],
        "rx.recv()": [],
        "torch.from_dlpack(msg)": [],
        "msg.torch()": [],
        "msg.release()": [],
    }
    for _ in range(n // 8):
        for _ in range(8):
            t0 = time.perf_counter_ns()
            send_only()
            steps["tx.send(t)"].append(time.perf_counter_ns() - t0)
        for _ in range(8):
            t0 = time.perf_counter_ns()
            recv_only()
            steps["rx.recv()"].append(time.perf_counter_ns() - t0)
            t0 = time.perf_counter_ns()
            from_dlpack()
            steps["torch.from_dlpack(msg)"].append(time.perf_counter_ns() - t0)
            t0 = time.perf_counter_ns()
            torch_view()
            steps["msg.torch()"].append(time.perf_counter_ns() - t0)
        for _ in range(8):
            t0 = time.perf_counter_ns()
            release()
            steps["msg.release()"].append(time.perf_counter_ns() - t0)
    for label, ns in steps.items():
        ns.sort()
        print(
            "  %-46s p50 %7.2f us  p99 %7.2f us"
            % (label, ns[len(ns) // 2] / 1e3, ns[int(0.99 * len(ns))] / 1e3)
        )
    torch.cuda.synchronize()
    tx.close()
    rx.close()
    ch.close()


if __name__ == "__main__":
    main()
