#!/usr/bin/env python3
"""The floor under a streaming hand-off of small CUDA tensors: what torch's own calls cost
the host, in one process, with no queue at all.

    python python/bench/torch_floor.py [--size 4096] [--n 20000] [--device 0]

A hand-off as ``queue_rate.py`` and ``ray_transport.py`` stream it costs each side some
torch calls besides the queue's own work: the producer ``t.fill_(i)``, a copy into a slot
and an event record; the consumer a wait on that event, a copy out of the slot (``get()``'s
default), ``x.mul(2)`` and an event record for the slot's release. Each line here is the
host time per call of such calls, back to back on the current stream (a kernel launch is
host work: its time is what bounds a rate of small items), and the last two lines each
side's sum. A side that needs ``c`` µs of these per item cannot stream more than
``1e6 / c`` items/s through any queue on the same machine; run it beside the queue's
figures (and under MPS where they ran under MPS).
"""

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="bytes per tensor")
    ap.add_argument("--n", type=int, default=20000, help="calls a line")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    dev = torch.device("cuda", args.device)
    x = torch.empty(args.size // 4, dtype=torch.float32, device=dev)
    slot = torch.empty_like(x)
    event = torch.cuda.Event()
    stream = torch.cuda.current_stream(dev)

    def line(name, call):
        for _ in range(500):
            call()
        torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for _ in range(args.n):
            call()
        host = time.perf_counter() - start
        torch.cuda.synchronize(dev)
        print(f"{name:44s} {1e6 * host / args.n:7.2f} µs a call (host)")

    def producer():
        x.fill_(1.0)
        slot.copy_(x)
        event.record(stream)

    def consumer():
        stream.wait_event(event)
        slot.clone().mul(2)
        event.record(stream)

    print(f"{torch.cuda.get_device_name(dev)}, {args.size} B tensors, torch {torch.__version__}")
    line("x.fill_(1.0)", lambda: x.fill_(1.0))
    line("x.mul(2)", lambda: x.mul(2))
    line("x.clone()", lambda: x.clone())
    line("slot.copy_(x)", lambda: slot.copy_(x))
    line("event.record(stream)", lambda: event.record(stream))
    line("stream.wait_event(event)", lambda: stream.wait_event(event))
    line("slot[:] (a view)", lambda: slot[:])
    line("producer: fill_ + copy_ + record", producer)
    line("consumer: wait + clone + mul + record", consumer)


if __name__ == "__main__":
    main()
