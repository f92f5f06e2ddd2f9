"""A scheduler hands each step's input to N worker processes through one broadcast
channel: every worker reads the same slot in place (no copy per worker, no pickle), and
the slot goes back once every worker has released its message.

    python python/examples/broadcast_step.py                # numpy arrays, host slots
    python python/examples/broadcast_step.py --device 0     # torch CUDA tensors, GPU slots
    python python/examples/broadcast_step.py --lagging      # workers may skip steps

Each worker checks every step it gets (its values are the step number) and reports how many
it got and missed; the scheduler prints one line per worker and the steps per second.
By default the slowest worker holds the scheduler back (nothing is lost); with
``--lagging`` the scheduler never waits for a worker that is behind, and such a worker is
told how many steps it missed (``gpuring.Lagged``) and goes on with the newest.
"""

import argparse
import multiprocessing as mp
import time

import gpuring

SHAPE = (64, 1024)  # a step's input: 64 rows of 1024 float32 (256 KiB)


def worker(name, device, index, nap, results):
    ch = gpuring.Channel.open(name, device=device, timeout=10)
    rx = ch.receiver()
    results.put(("ready", index))
    got = missed = 0
    last = -1
    while True:
        try:
            with rx.recv() as msg:
                step = msg.tag
                if device is None:
                    import numpy as np

                    x = np.from_dlpack(msg)
                    ok = bool((x == step).all())
                else:
                    import torch

                    x = torch.from_dlpack(msg)
                    ok = bool((x == step).all().item())
                if not ok or step <= last:
                    results.put(("bad", index, step, last))
                    return
                last, got = step, got + 1
                if nap:
                    time.sleep(nap)
        except gpuring.Lagged as e:
            missed += e.missed
        except gpuring.Disconnected:
            break
    results.put(("done", index, got, missed, last))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--device", type=int, default=None, help="a GPU: CUDA tensors, GPU slots")
    p.add_argument("--lagging", action="store_true", help="never wait for a worker behind")
    p.add_argument("--nap", type=float, default=0.0, help="worker 0 sleeps this many s a step")
    args = p.parse_args(argv)

    name = "gpuring-example-broadcast-%d" % mp.current_process().pid
    ch = gpuring.Channel.create(
        name,
        broadcast=True,
        lagging=args.lagging,
        capacity=16,
        slots=8,
        slot_bytes=4 * SHAPE[0] * SHAPE[1],
        device=args.device,
    )
    tx = ch.sender()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(name, args.device, i, args.nap if i == 0 else 0, results))
        for i in range(args.workers)
    ]
    for w in procs:
        w.start()
    for _ in procs:
        assert results.get(timeout=60)[0] == "ready"

    if args.device is None:
        import numpy as np

        x = np.zeros(SHAPE, dtype=np.float32)
    else:
        import torch

        x = torch.zeros(SHAPE, dtype=torch.float32, device=args.device)
    start = time.perf_counter()
    for step in range(args.steps):
        if args.device is None:  # the scheduler's work
            x.fill(step)
        else:
            x.fill_(step)
        tx.send(x, tag=step)  # one copy into a slot; every worker reads that slot
    tx.close()  # the workers' iteration ends once they have read what was sent
    reports = sorted((results.get(timeout=120) for _ in procs), key=lambda r: r[1])
    elapsed = time.perf_counter() - start
    for w in procs:
        w.join(30)
    ch.close()
    for r in reports:
        if r[0] != "done":
            raise SystemExit("worker %d: step %d after %d, or wrong values" % r[1:])
        print("worker %d: %d steps, %d missed, last %d" % r[1:])
    rate = args.steps / elapsed
    print(
        "%d steps to %d workers in %.3f s: %.0f steps/s" % (args.steps, len(procs), elapsed, rate)
    )
    return reports


if __name__ == "__main__":
    main()
