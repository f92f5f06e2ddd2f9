#!/usr/bin/env python3
"""The Python package's host path with pinned slots (issue 16, part 3), in one run:
54 MB tensors between a GPU process and a CPU process, both ways, against the raw copy
torch makes between the GPU and page-locked memory of its own.

    python python/bench/pinned.py [--items N] [--rounds R]

Rows (items/s and GB/s, the median of R rounds of N items, each round timed from the
first item to the last one done):

- GPU -> CPU process: the GPU process ``tx.send(t)``s a 54 MB CUDA tensor into a host
  channel it opened with ``pinned=True`` (one asynchronous device-to-host copy into the
  slot, published when the copy is done; the call does not wait for the GPU); the CPU
  process (numpy only) reads the first and last element of each message and releases it.
  The same with ``pinned=False`` (the driver stages the copy through its own buffer).
- CPU process -> GPU: the CPU process leases a slot and writes one element in place
  (zero-copy); the GPU process, its channel opened with ``pinned=True``, copies each
  message to the GPU with ``torch.from_dlpack(msg).to("cuda", non_blocking=True)`` and
  releases it (the slot goes back once that copy is done, in stream order); it
  synchronises at the end of each round. The same with ``pinned=False``.
- The floors, in the GPU process alone: ``pinned_host.copy_(t, non_blocking=True)`` and
  ``pinned_host.to("cuda", non_blocking=True)`` back to back into / out of torch's own
  page-locked buffers (``pin_memory=True``), one synchronise per round; and the same
  copies into / out of one gpuring slot pinned in that process (no hand-off), which
  tells the memory's own speed from the hand-off's.

Target (issue 16): the pinned rows at >= 0.9x their floor.
"""

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

import gpuring

BYTES = 54 << 20
SLOTS = 4


def rate(seconds, items):
    return items / seconds


def row(label, rounds):
    r = statistics.median(rounds)
    print(
        "  %-52s %8.1f items/s  %6.2f GB/s   (rounds: %s)"
        % (label, r, r * BYTES / 1e9, ", ".join("%.0f" % x for x in rounds)),
        flush=True,
    )
    return {"items_per_s": r, "gb_per_s": r * BYTES / 1e9, "rounds": rounds}


# ---------------------------------------------------------------------------------------
# GPU -> CPU process


def gpu_sender(name, pinned, items, rounds, go):
    import torch

    ch = gpuring.Channel.open(name, timeout=30, pinned=pinned)
    tx = ch.sender()
    src = [torch.full((BYTES // 4,), k, dtype=torch.int32, device="cuda") for k in range(2)]
    torch.cuda.synchronize()
    for _r in range(rounds + 1):  # round 0 warms up
        go.recv()
        for i in range(items):
            tx.send(src[i % 2], timeout=60)
    go.recv()
    torch.cuda.synchronize()
    tx.close()


def cpu_receiver(name, items, rounds, go, out):
    ch = gpuring.Channel.open(name, timeout=30)
    rx = ch.receiver()
    took = []
    acc = 0
    for r in range(rounds + 1):
        go.send(1)
        t0 = time.perf_counter()
        for _ in range(items):
            with rx.recv(timeout=60) as msg:
                a = np.from_dlpack(msg)
                acc ^= int(a[0]) ^ int(a[-1])
                del a
        if r:
            took.append(rate(time.perf_counter() - t0, items))
    go.send(1)
    out.put(took)


# ---------------------------------------------------------------------------------------
# CPU process -> GPU


def cpu_sender(name, items, rounds, go):
    ch = gpuring.Channel.open(name, timeout=30)
    tx = ch.sender()
    for _r in range(rounds + 1):
        go.recv()
        for i in range(items):
            with tx.lease((BYTES // 4,), "int32", timeout=60) as buf:
                np.from_dlpack(buf)[0] = i  # the producer writes in place
    go.recv()
    tx.close()


def gpu_receiver(name, pinned, items, rounds, go, out):
    import torch

    ch = gpuring.Channel.open(name, timeout=30, pinned=pinned)
    rx = ch.receiver()
    took = []
    for r in range(rounds + 1):
        go.send(1)
        t0 = time.perf_counter()
        for _i in range(items):
            msg = rx.recv(timeout=60)
            t = torch.from_dlpack(msg).to("cuda", non_blocking=True)
            msg.release()  # back once the copy is done, in stream order
            del t
        torch.cuda.synchronize()
        if r:
            took.append(rate(time.perf_counter() - t0, items))
    go.send(1)
    out.put(took)


def pair(ctx, name, sender, sargs, receiver, rargs):
    ch = gpuring.Channel.create(name, capacity=16, slots=SLOTS, slot_bytes=BYTES)
    a, b = ctx.Pipe()
    out = ctx.Queue()
    r = ctx.Process(target=receiver, args=(name,) + rargs + (b, out))
    s = ctx.Process(target=sender, args=(name,) + sargs + (a,))
    r.start()
    s.start()
    took = out.get(timeout=600)
    s.join(60)
    r.join(60)
    ch.close()
    if s.exitcode != 0 or r.exitcode != 0:
        raise RuntimeError("a process failed: sender %r receiver %r" % (s.exitcode, r.exitcode))
    return took


def floors(items, rounds):
    import torch

    dev = torch.full((BYTES // 4,), 3, dtype=torch.int32, device="cuda")
    host = torch.empty((BYTES // 4,), dtype=torch.int32, pin_memory=True)
    # A gpuring slot itself, pinned in this process (shared memory registered with CUDA,
    # where torch's buffer is the driver's own page-locked allocation): the same copies.
    ch = gpuring.Channel.create(
        "gpuring-pypinned-floor-%d" % os.getpid(), slots=1, slot_bytes=BYTES, pinned=True
    )
    lease = ch.sender().lease((BYTES // 4,), "int32")
    slot = torch.from_dlpack(lease)
    assert slot.is_pinned()
    out = {}
    for label, step in (
        ("floor: device -> pinned host, non_blocking", lambda: host.copy_(dev, non_blocking=True)),
        ("floor: pinned host -> device, non_blocking", lambda: host.to("cuda", non_blocking=True)),
        (
            "same, device -> a pinned gpuring slot, one process",
            lambda: slot.copy_(dev, non_blocking=True),
        ),
        (
            "same, a pinned gpuring slot -> device, one process",
            lambda: slot.to("cuda", non_blocking=True),
        ),
    ):
        took = []
        for r in range(rounds + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(items):
                step()
            torch.cuda.synchronize()
            if r:
                took.append(rate(time.perf_counter() - t0, items))
        out[label] = row(label, took)
    slot = None  # the view lets go of the slot before the lease does
    lease.cancel()
    ch.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n, rounds = args.items, args.rounds
    ctx = mp.get_context("spawn")
    base = "gpuring-pypinned-%d" % os.getpid()
    print("54 MB per item, %d rounds of %d items:" % (rounds, n), flush=True)
    res = floors(n, rounds)
    for pinned in (True, False):
        took = pair(ctx, base + "-d2h", gpu_sender, (pinned, n, rounds), cpu_receiver, (n, rounds))
        res["d2h pinned=%s" % pinned] = row(
            "GPU -> CPU process, tx.send(t), pinned=%s" % pinned, took
        )
    for pinned in (True, False):
        took = pair(ctx, base + "-h2d", cpu_sender, (n, rounds), gpu_receiver, (pinned, n, rounds))
        res["h2d pinned=%s" % pinned] = row(
            "CPU process -> GPU, .to(cuda, non_blocking), pinned=%s" % pinned, took
        )
    d2h = (
        res["d2h pinned=True"]["items_per_s"]
        / res["floor: device -> pinned host, non_blocking"]["items_per_s"]
    )
    h2d = (
        res["h2d pinned=True"]["items_per_s"]
        / res["floor: pinned host -> device, non_blocking"]["items_per_s"]
    )
    print(
        "pinned against the floor: GPU -> CPU process %.2fx, CPU process -> GPU %.2fx" % (d2h, h2d)
    )


if __name__ == "__main__":
    main()
