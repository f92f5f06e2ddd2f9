"""Idle receivers' CPU from Python: N spawned processes block in ``rx.recv()`` on one
broadcast channel (host slots) while nothing is sent, each timing its own process CPU
(``time.process_time``) over the wait; the sender sends one message after ``--seconds``.
The Python form of ``tests/broadcast_channel.rs``'s ``eight_idle`` test.

    python python/bench/idle.py [--receivers 8] [--seconds 1 3] [--spsc]

A Python wait runs in slices with the GIL released (2 s, ended at once by a signal, which
is then handled), so this is what those slices cost besides the Rust wait's own.
"""

import argparse
import multiprocessing as mp
import os
import time

import numpy as np

import gpuring


def _receiver(name, conn, rounds):
    # `conn` (one end of a pipe) sends in this thread: a multiprocessing.Queue's feeder
    # thread would wake during the timed wait and count in its CPU.
    ch = gpuring.Channel.open(name)
    rx = ch.receiver()
    conn.send(os.getpid())
    rx.recv().release()  # the first message maps the sender's pool: not idle work
    for _ in range(rounds):
        conn.send(os.getpid())
        cpu = time.process_time()
        msg = rx.recv()
        used = time.process_time() - cpu
        msg.release()
        conn.send(used)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--receivers", type=int, default=8)
    ap.add_argument("--seconds", type=float, nargs="+", default=[1.0, 3.0])
    ap.add_argument("--spsc", action="store_true", help="one receiver on an SPSC channel")
    args = ap.parse_args()
    n = 1 if args.spsc else args.receivers
    name = "idle-py-%d" % os.getpid()
    ch = gpuring.Channel.create(name, capacity=4, slots=2, slot_bytes=4096, broadcast=not args.spsc)
    tx = ch.sender()
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
    procs = [ctx.Process(target=_receiver, args=(name, w, len(args.seconds))) for _, w in pipes]
    for p in procs:
        p.start()

    def from_each():
        out = []
        for r, _ in pipes:
            if not r.poll(60):
                raise SystemExit("a receiver did not answer in 60 s")
            out.append(r.recv())
        return out

    payload = np.zeros(4096, dtype=np.uint8)
    from_each()
    tx.send(payload)
    for secs in args.seconds:
        from_each()
        time.sleep(secs)
        tx.send(payload)
        used = sorted(from_each())
        total_ms = sum(used) * 1e3
        print(
            "%d receiver(s) idle %.0f s: %.2f ms of CPU together, %.2f ms a second "
            "(each: %s ms)"
            % (n, secs, total_ms, total_ms / secs, ", ".join("%.2f" % (u * 1e3) for u in used)),
            flush=True,
        )
    for p in procs:
        p.join(timeout=30)
    ch.close()


if __name__ == "__main__":
    main()
