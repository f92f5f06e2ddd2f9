#!/usr/bin/env python3
"""Where an object hand-off spends its CPU time: each step of ``Queue.put`` / ``get`` of a
``(time.time(), tensor)`` tuple and a dict of ten tensors and an int timed alone, in one
process (both ends here: no wake-up in any figure), beside the single-tensor path; both
in the form the package uses for them (a plain tree, no pickle) and in the pickle form
any other object takes.

    python python/bench/object_steps.py [--n N] [--device 0|none]

``--device none`` uses host slots (and CPU tensors where there is no GPU: a profile of
the package's Python on any machine).

Prints the median and p99 of each step in microseconds.
"""

import argparse
import time

import torch

import gpuring
from gpuring import _objects


def timed(label, fn, n):
    ns = []
    out = None
    for _ in range(n):
        t0 = time.perf_counter_ns()
        out = fn()
        ns.append(time.perf_counter_ns() - t0)
    ns.sort()
    print(
        "  %-52s p50 %7.2f us  p99 %7.2f us"
        % (label, ns[len(ns) // 2] / 1e3, ns[int(0.99 * len(ns))] / 1e3),
        flush=True,
    )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--device", default="0")
    ap.add_argument("--profile", action="store_true", help="cProfile the tuple round trip")
    args = ap.parse_args()
    device = None if args.device == "none" else int(args.device)
    n = args.n
    where = "cuda" if torch.cuda.is_available() else "cpu"
    t = torch.ones(1024, device=where)
    obj = (time.time(), t)
    d10 = {"t%d" % k: torch.ones(1024, device=where) for k in range(10)}
    # What runs killed earlier left (their channels have no process now), then this run's.
    gpuring.clean("gpuring-steps-", queued=True)
    ch = gpuring.Channel.create("gpuring-steps-%d" % time.monotonic_ns(), device=device, slots=4)
    tx, rx = ch.sender(), ch.receiver()
    sync()
    print("device", device, "tensors", where)

    def whole_tensor():
        tx.send(t)
        with rx.recv() as m:
            return m.torch().clone()

    def whole(o):
        def run():
            tx.send_object(o)  # a plain tree: the extension's form, no pickle
            with rx.recv() as m:
                return m.object(True)

        return run

    def pickled(o):
        def run():
            _objects.Packed(o, device).send(tx)  # the pickle form, as any other object
            with rx.recv() as m:
                return _objects.load(m, True)

        return run

    if args.profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(n):
            pickled(obj)()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    timed("tensor: send + recv + torch().clone()", whole_tensor, n)
    for label, o in (("tuple", obj), ("dict10", d10)):
        timed("%s: send_object + recv + object(copy=True)" % label, whole(o), n)
        timed("%s, pickle form: the same" % label, pickled(o), n)
    for label, o in (("tuple", obj), ("dict10", d10)):
        print("%s, step by step:" % label)
        tree_steps(tx, rx, o, n)
        print("%s, pickle form, step by step:" % label)
        object_steps(tx, rx, o, device, n)
    print("one tensor, step by step (the pattern of objects.py's channel rows):")
    got = []

    def send_t():
        tx.send(t)

    def recv_t():
        got.append([rx.recv()])

    def from_dlpack():
        got[-1].append(torch.from_dlpack(got[-1][0]))

    def accessor():
        got[-1].append(got[-1][0].torch())

    def op():
        got[-1].append(got[-1][1].view(-1)[:1] * 2)

    def release():
        m = got.pop()[0]
        m.release()

    step_rows(
        [
            ("t.fill_(1.0) (the producer's op)", lambda: t.fill_(1.0)),
            ("tx.send(t)", send_t),
            ("rx.recv()", recv_t),
            ("torch.from_dlpack(msg)", from_dlpack),
            ("msg.torch()", accessor),
            ("x.view(-1)[:1] * 2 (the consumer's op)", op),
            ("drop views, msg.release()", release),
        ],
        n,
    )
    sync()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def tree_steps(tx, rx, obj, n):
    """Times each step of a plain tree's put and get, one after another, n times."""
    msgs = []

    def recv():
        msgs.append(rx.recv())

    def load_copy():
        out = msgs[-1].object(True)
        msgs.pop().release()
        return out

    step_rows(
        [
            ("tx.send_object(obj)", lambda: tx.send_object(obj)),
            ("rx.recv()", recv),
            ("msg.object(copy=False)", lambda: msgs[-1].object(False)),
            ("msg.object(copy=True) + release", load_copy),
        ],
        n,
    )


def object_steps(tx, rx, obj, device, n):
    """Times each step of an object's put and get, one after another, n times."""
    packed = timed("Packed(obj) (pickle with references)", lambda: _objects.Packed(obj, device), n)
    lease_box = []

    def lease():
        lease_box.append(tx.lease((packed.total,), "uint8"))

    def fill():
        _objects._fill(lease_box[-1], packed.parts, packed.blob, packed.spill, device)

    def header():
        lease_box[-1].header = packed.header

    def send():
        lease_box.pop().send()

    msgs = []

    def recv():
        msgs.append(rx.recv())

    def load_view():
        return _objects.load(msgs[-1], False)

    def load_copy():
        out = _objects.load(msgs[-1], True)
        msgs.pop().release()
        return out

    step_rows(
        [
            ("tx.lease((n,), 'uint8')", lease),
            ("_fill (the copies into the slot)", fill),
            ("lease.header = ...", header),
            ("lease.send()", send),
            ("rx.recv()", recv),
            ("msg.header", lambda: msgs[-1].header),
            ("msg.torch()", lambda: msgs[-1].torch()),
            ("load(msg, copy=False)", load_view),
            ("load(msg, copy=True) + release", load_copy),
        ],
        n,
    )


def step_rows(rows, n):
    """Times each step of ``rows`` (label, fn), run in turn n times."""
    per = {label: [] for label, _ in rows}
    for _ in range(n):
        for label, fn in rows:
            t0 = time.perf_counter_ns()
            fn()
            per[label].append(time.perf_counter_ns() - t0)
    for label, _ in rows:
        ns = sorted(per[label])
        print(
            "  %-52s p50 %7.2f us  p99 %7.2f us"
            % (label, ns[len(ns) // 2] / 1e3, ns[int(0.99 * len(ns))] / 1e3)
        )


if __name__ == "__main__":
    main()
