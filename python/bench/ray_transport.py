"""Ray between two actors that share a GPU: gpuring's tensor transport against Ray's CUDA-IPC
transport and Ray's object store, and a gpuring.ray.channel against gpuring.Queue between two
plain processes, all in one run.

    python python/bench/ray_transport.py [--quick] [--json out.json]

Transfers (one in flight, as a program that passes each result on): actor A's method fills
its CUDA tensor (or a 300-tensor state dict of ~500 MB) and returns it; the driver passes
the result to actor B's method, which reads a value of it (``x[-1].item()``: the data is
there). Time per transfer: from A's method returning (``time.monotonic()`` in A, the last
thing it does) to B having read the value (the same clock in B), median over the rounds;
items/s: rounds over the driver's wall time (each round a produce and a consume call).

Channel rows: A puts ``(time, tensor)`` (one ``fill_`` first), B gets it (a copy, the
default, or ``get(copy=False)``, views) and reads a value; one item in flight (B answers
through a second channel) for the latency, then A puts ``--rate-items`` tensors back to
back (a ``fill_`` each) while B gets each and runs a torch op on it, for items/s. At 4 KB
the rows run ``--repeat`` times (medians printed at the end): the actors as Ray starts
them (niceness 15), a pair started with ``gpuring.ray.runtime_env()`` (niceness 0), and,
the baseline, the same two loops in two processes started by ``multiprocessing`` (spawn)
over a ``gpuring.Queue``. ``--channel-only``: those rows alone. ``--load N``: N processes
of normal priority keep a core busy each meanwhile (a node whose cores are busy).

``--two-gpus`` (a machine with two GPUs): the actors get a GPU each and see both
(``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``, each making its own current), the
layout in which gpuring carries tensors between GPUs; Ray's NCCL transport replaces its
CUDA-IPC one (same GPU only); the baseline's getter runs on B's GPU. Then NCCL again
between actors that see only their own GPU (Ray's default). ``--apart``: only that layout,
gpuring against NCCL, and the channel at 4 KB.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import ray
import torch

import gpuring
import gpuring.ray as gray

gray.register()

SIZES = {"4KB": 4096, "5MB": 5 << 20, "64MB": 64 << 20}
SD_TENSORS, SD_NUMEL = 300, 436_907  # 300 float32 tensors of 1.75 MB: 524 MB


# "cpu" (--cpu): a dry run of the script where there is no GPU (CUDA_IPC rows fail).
DEVICE = "cpu" if "--cpu" in sys.argv else "cuda"


def _make(shape):
    if shape == "sd":
        return {"w%03d" % i: torch.empty(SD_NUMEL, device=DEVICE) for i in range(SD_TENSORS)}
    return torch.empty(SIZES[shape] // 4, device=DEVICE)


def _fill(x, k):
    if isinstance(x, dict):
        for i, v in enumerate(x.values()):
            v.fill_(k + i)
    else:
        x.fill_(k)


def _check(x, k):
    """Every tensor holds what A wrote (after the timed read)."""
    if isinstance(x, dict):
        lasts = torch.stack([v[-1] for v in x.values()]).cpu()
        firsts = torch.stack([v[0] for v in x.values()]).cpu()
        want = torch.arange(len(x), dtype=torch.float32) + k
        return bool((lasts == want).all() and (firsts == want).all())
    return bool(x[0].item() == k and x[-1].item() == k)


# With --two-gpus the actors see every GPU (Ray leaves CUDA_VISIBLE_DEVICES alone) and each
# makes the GPU Ray gave it current: the layout in which gpuring carries tensors between
# GPUs (docs/RAY.md).
SEE_ALL = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}


def _take_gpu():
    """Makes the GPU Ray gave this actor current on the calling thread (Ray may run an
    actor's methods on another thread than its ``__init__``; the current device is per
    thread)."""
    if DEVICE == "cuda":
        torch.cuda.set_device(gray._own_gpu())


def _where():
    """The GPU Ray gave this actor (an ordinal it sees), and what it sees."""
    if DEVICE != "cuda":
        return -1, ""
    seen = "sees %d GPU(s), CUDA_VISIBLE_DEVICES=%s" % (
        torch.cuda.device_count(),
        os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    return gray._own_gpu(), seen


@ray.remote(num_gpus=0.5, enable_tensor_transport=True)
class Producer:
    def __init__(self):
        _take_gpu()
        self.bufs = {}
        self.ends = []

    def produce(self, shape, k, slow=False):
        _take_gpu()
        x = self.bufs.get(shape)
        if x is None:
            x = self.bufs[shape] = _make(shape)
        if slow and DEVICE == "cuda":
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
        _fill(x, k)
        self.ends.append(time.monotonic())
        return x

    def gpu(self):
        return _where()

    def take_ends(self):
        e, self.ends = self.ends, []
        return e

    def run_sender(self, ch, ack, shape, rounds, rate_items):
        _take_gpu()
        return _sender(ch, ack, shape, rounds, rate_items)


@ray.remote(num_gpus=0.5, enable_tensor_transport=True)
class Consumer:
    def __init__(self):
        _take_gpu()

    def consume(self, x, k):
        _take_gpu()
        first = next(iter(x.values())) if isinstance(x, dict) else x
        v = first[-1].item()
        t = time.monotonic()
        return t, v == k and _check(x, k), first.get_device()

    def gpu(self):
        return _where()

    def run_receiver(self, ch, ack, rounds, rate_items, copy=True):
        _take_gpu()
        return _receiver(ch, ack, rounds, rate_items, copy)

    def stats(self):
        return gray.stats()


def _sender(ch, ack, shape, rounds, rate_items):
    x = _make(shape)
    for k in range(rounds):
        _fill(x, k)
        ch.put((time.monotonic(), k, x))
        ack.get(timeout=60)
    t0 = time.monotonic()
    for k in range(rate_items):
        _fill(x, k)
        ch.put(x)
    ack.get(timeout=120)
    return time.monotonic() - t0


def _receiver(ch, ack, rounds, rate_items, copy=True):
    lat, bad = [], 0
    for k in range(rounds):
        t0, j, x = ch.get(timeout=60, copy=copy)
        first = next(iter(x.values())) if isinstance(x, dict) else x
        v = first[-1].item()
        lat.append(time.monotonic() - t0)
        bad += (j != k) or (v != k and not isinstance(x, dict))
        ack.put(0)
    for k in range(rate_items):
        x = ch.get(timeout=60, copy=copy)
        x[-1:].mul(2)  # a torch op per item
        if k == rate_items - 1:
            bad += x[-1].item() != k
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    ack.put(0)
    return lat, bad


def _proc_sender(q, ack, shape, rounds, rate_items, out, argv):
    _as_parent(argv)
    out.put(_sender(q, ack, shape, rounds, rate_items))


def _proc_receiver(q, ack, rounds, rate_items, out, argv, copy, device=None):
    _as_parent(argv)
    if device is not None:  # the getter on another GPU than the putter's slots
        torch.cuda.set_device(device)
        q = gpuring.Queue.open_or_create(q.name, device=device)
    out.put(_receiver(q, ack, rounds, rate_items, copy))


def _as_parent(argv):
    global DEVICE
    DEVICE = "cpu" if "--cpu" in argv else "cuda"


def transfers(a, b, transport, shape, rounds, warm, timeout=None):
    """Per-transfer times (µs) and items/s of one transport."""
    opts = {} if transport == "object store" else {"tensor_transport": transport}
    bad = 0
    walls, where = [], set()
    for k in range(warm + rounds):
        w0 = time.monotonic()
        ref = a.produce.options(**opts).remote(shape, k)
        t_b, ok, dev = ray.get(b.consume.remote(ref, k), timeout=timeout)
        where.add(dev)
        walls.append(time.monotonic() - w0)
        del ref
        bad += not ok
        if k == warm - 1:
            a.take_ends.remote()
            t_bs = []
        if k >= warm:
            t_bs.append(t_b)
    ends = ray.get(a.take_ends.remote())
    us = [(tb - te) * 1e6 for tb, te in zip(t_bs, ends)]
    return {
        "p50_us": statistics.median(us),
        "min_us": min(us),
        "items_per_s": rounds / sum(walls[warm:]),
        "bad": bad,
        "device": sorted(where),
    }


def apart(args, rounds):
    """Two actors on two GPUs, each seeing only its own (Ray's default layout)."""
    from ray.experimental.collective import create_collective_group

    print("python", sys.version.split()[0], "torch", torch.__version__, "ray", ray.__version__)
    a = Producer.options(num_gpus=1).remote()
    b = Consumer.options(num_gpus=1).remote()
    (gpu_a, seen_a), (gpu_b, seen_b) = ray.get([a.gpu.remote(), b.gpu.remote()])
    print("A on GPU %d (%s), B on GPU %d (%s)" % (gpu_a, seen_a, gpu_b, seen_b))
    create_collective_group([a, b], backend="nccl")
    ref = a.produce.options(tensor_transport="gpuring").remote("64MB", 77, True)
    print(
        "slow kernel before the fill, gpuring transport: values %s"
        % ray.get(b.consume.remote(ref, 77))[1]
    )
    del ref
    results = {"transfers": {}, "channel": {}}
    _header()
    for shape in ("4KB", "5MB", "64MB", "sd"):
        for transport in ("gpuring", "nccl"):
            try:
                r = transfers(a, b, transport, shape, rounds[shape], warm=2, timeout=120)
            except Exception as e:
                print("%-10s %-14s failed: %s" % (shape, transport, _why(e)))
                continue
            results["transfers"]["%s/%s, apart" % (shape, transport)] = r
            _row(shape, transport + ", apart", r)
    print("B's counters:", ray.get(b.stats.remote()))
    for copy in (True, False):
        _channel_row(a, b, "4KB", 200, args.rate_items, copy, "cuda", results, ", apart")
    _finish(args, results)


def _burn():
    """A process of normal priority that keeps a core busy (``--load``)."""
    while True:
        pass


def _why(e):
    """What a failed row says: the first line of Ray's error and its last (the cause)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return " ... ".join(lines[:1] + lines[-1:])[:400] if lines else type(e).__name__


def _actors(share, see_all, nice):
    """A producer and a consumer actor, each with ``share`` of a GPU; ``see_all``: both see
    every GPU; ``nice``: started with gpuring.ray.runtime_env() (niceness 0)."""
    env = SEE_ALL if see_all else None
    if nice:
        env = gray.runtime_env(env)
    opts = {"num_gpus": share}
    if env:
        opts["runtime_env"] = env
    return Producer.options(**opts).remote(), Consumer.options(**opts).remote()


def _header():
    print(
        "\n%-10s %-14s %12s %12s %12s %5s  %s"
        % ("size", "transport", "p50 µs", "min µs", "items/s", "bad", "B got it on")
    )


def _channel_row(a, b, shape, n, items, copy, device, results, where="", prefetch=None):
    """A gpuring.ray.channel from A to B: ``n`` items one in flight (p50 µs), then
    ``items`` streamed (items/s); ``copy=False``: B gets views; ``prefetch``: the
    channel's (B's gets take ahead; None: the default)."""
    more = {} if prefetch is None else {"prefetch": prefetch}
    ch = gray.channel(a, b, device=device, **more)
    ack = gray.channel(b, a)
    rx = b.run_receiver.remote(ch, ack, n, items, copy)
    secs = ray.get(a.run_sender.remote(ch, ack, shape, n, items))
    lat, bad = ray.get(rx)
    views = "" if copy else ", views"
    _record(results, "%s/ray channel%s%s" % (shape, where, views), lat, items / secs, bad)


def _plain_row(shape, n, items, copy, gpus, args, results, getter=()):
    """The same two loops in two processes started by multiprocessing, over a
    gpuring.Queue (``getter``: the getter's GPU, where it is another than the putter's)."""
    ctx = mp.get_context("spawn")
    q, ackq = gpuring.Queue(device=0 if gpus else None), gpuring.Queue()
    out = ctx.Queue()
    argv = ["--cpu"] if args.cpu else []
    ps = ctx.Process(target=_proc_sender, args=(q, ackq, shape, n, items, out, argv))
    pr = ctx.Process(target=_proc_receiver, args=(q, ackq, n, items, out, argv, copy) + getter)
    pr.start()
    ps.start()
    got = [out.get(timeout=300), out.get(timeout=300)]
    ps.join()
    pr.join()
    q.close()
    ackq.close()
    secs = next(g for g in got if isinstance(g, float))
    lat, bad = next(g for g in got if not isinstance(g, float))
    views = "" if copy else ", views"
    _record(results, "%s/gpuring.Queue, 2 procs%s" % (shape, views), lat, items / secs, bad)


def _record(results, key, lat, rate, bad):
    """One channel row: printed, and added to the key's list of repeats."""
    row = {"p50_us": statistics.median(lat) * 1e6, "items_per_s": rate, "bad": bad}
    results["channel"].setdefault(key, []).append(row)
    shape, what = key.split("/", 1)
    print(
        "%-6s %-38s %8.1f µs %10.0f items/s bad %d"
        % (shape, what, row["p50_us"], row["items_per_s"], bad)
    )
    sys.stdout.flush()


def _finish(args, results):
    """Prints the medians of repeated channel rows, writes the JSON, ends Ray and says what
    is left in /dev/shm."""
    repeated = {k: v for k, v in results["channel"].items() if len(v) > 1}
    if repeated:
        print("\nchannel rows, medians over %d repeats:" % max(map(len, repeated.values())))
        for key, rows in repeated.items():
            shape, what = key.split("/", 1)
            print(
                "%-6s %-38s %8.1f µs %10.0f items/s"
                % (
                    shape,
                    what,
                    statistics.median(r["p50_us"] for r in rows),
                    statistics.median(r["items_per_s"] for r in rows),
                )
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    ray.shutdown()
    gray.cleanup()
    print(
        "gpuring objects left in /dev/shm:", [f for f in os.listdir("/dev/shm") if "gpuring" in f]
    )


def _row(shape, transport, r):
    print(
        "%-10s %-14s %12.1f %12.1f %12.1f %5d  %s"
        % (
            shape,
            transport,
            r["p50_us"],
            r["min_us"],
            r["items_per_s"],
            r["bad"],
            ",".join("cpu" if d < 0 else "cuda:%d" % d for d in r["device"]),
        )
    )
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--rate-items", type=int, default=5000)
    ap.add_argument("--cpu", action="store_true", help="a dry run without a GPU")
    ap.add_argument(
        "--repeat", type=int, default=1, help="runs of the 4 KB channel rows (medians at the end)"
    )
    ap.add_argument(
        "--load",
        type=int,
        default=0,
        help="processes that keep a core busy each, at normal priority, during the 4 KB "
        "channel rows (a node whose cores are busy)",
    )
    ap.add_argument(
        "--channel-only", action="store_true", help="the 4 KB channel rows alone (no transfers)"
    )
    ap.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="also a 4 KB channel row whose getter's prefetch is N (the default rows: "
        "gpuring.ray.channel's default, 4; --prefetch 1: a row that copies one item a get)",
    )
    ap.add_argument(
        "--two-gpus",
        action="store_true",
        help="actors on two GPUs, each seeing both, against Ray's NCCL (and NCCL between "
        "actors that see only their own GPU, Ray's default)",
    )
    ap.add_argument(
        "--apart",
        action="store_true",
        help="actors on two GPUs that see only their own (Ray's default): gpuring against "
        "Ray's NCCL, and the channel at 4 KB",
    )
    args = ap.parse_args()
    rounds = {"4KB": 40, "5MB": 30, "64MB": 20, "sd": 8}
    if args.quick:
        rounds = {k: max(3, v // 4) for k, v in rounds.items()}
    gpus = 0 if args.cpu else 2 if args.two_gpus or args.apart else 1
    ray.init(num_cpus=8, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    if args.apart:
        return apart(args, rounds)
    share = 1 if args.two_gpus else gpus / 2
    a, b = _actors(share, args.two_gpus, False)
    # Two GPUs: Ray's NCCL rows come last (below), with a timeout each.
    transports = ("gpuring", "object store") if args.two_gpus else ("gpuring", "cuda_ipc")
    transports += () if args.two_gpus else ("object store",)
    results = {"transfers": {}, "channel": {}}
    print("python", sys.version.split()[0], "torch", torch.__version__, "ray", ray.__version__)
    print(torch.cuda.get_device_name(0) if gpus else "no GPU: a dry run on the CPU")
    (gpu_a, seen_a), (gpu_b, seen_b) = ray.get([a.gpu.remote(), b.gpu.remote()])
    print("A on GPU %d (%s), B on GPU %d (%s)" % (gpu_a, seen_a, gpu_b, seen_b))

    # Stream order: A's slow kernel then fill; B must see the fill (gpuring transport).
    ref = a.produce.options(tensor_transport="gpuring").remote("64MB", 77, True)
    _, ok, _ = ray.get(b.consume.remote(ref, 77))
    del ref
    print(
        "slow kernel before the fill, gpuring transport: values %s" % ("right" if ok else "WRONG")
    )
    results["slow_kernel_ok"] = ok

    _header()
    for shape in () if args.channel_only else ("4KB", "5MB", "64MB", "sd"):
        for transport in transports:
            n = rounds[shape] if transport != "object store" or shape != "sd" else 3
            try:
                r = transfers(a, b, transport, shape, n, warm=2)
            except Exception as e:  # a transport that cannot do a row says so
                print("%-10s %-14s failed: %s" % (shape, transport, _why(e)))
                continue
            results["transfers"]["%s/%s" % (shape, transport)] = r
            _row(shape, transport, r)
    print("B's counters:", ray.get(b.stats.remote()))

    print(
        "\nchannel rows: one item in flight (p50 µs), then %d items back to back" % args.rate_items
    )
    # 4 KB, --repeat times: the actors at Ray's niceness (15), a pair started with
    # gpuring.ray.runtime_env() (niceness 0), and two plain processes; copies and views.
    device = "cuda" if gpus else None
    n4 = max(rounds["4KB"], 200)
    burners = [mp.get_context("spawn").Process(target=_burn, daemon=True) for _ in range(args.load)]
    for p in burners:
        p.start()
    getter = (gpu_b,) if args.two_gpus else ()  # on B's GPU, as the channel's B
    for rep in range(args.repeat):
        for nice in (False, True):
            if rep or nice:
                ray.kill(a)
                ray.kill(b)
                a, b = _actors(share, args.two_gpus, nice)
            for copy in (True, False):
                where = ", niceness 0" if nice else ""
                _channel_row(a, b, "4KB", n4, args.rate_items, copy, device, results, where)
            if args.prefetch > 0:
                where += ", prefetch=%d" % args.prefetch
                _channel_row(
                    a, b, "4KB", n4, args.rate_items, True, device, results, where, args.prefetch
                )
        for copy in (True, False):
            _plain_row("4KB", n4, args.rate_items, copy, gpus, args, results, getter)
    for p in burners:
        p.terminate()
    if args.channel_only:
        return _finish(args, results)
    # The rows below run between actors as Ray starts them.
    ray.kill(a)
    ray.kill(b)
    a, b = _actors(share, args.two_gpus, False)
    for shape in ("5MB", "64MB"):
        n, items = rounds[shape] * 5, args.rate_items // 10
        _channel_row(a, b, shape, n, items, True, device, results)
        _plain_row(shape, n, items, True, gpus, args, results, getter)
    if args.two_gpus:
        from ray.experimental.collective import create_collective_group

        # Ray's NCCL between the same actors (each sees both GPUs), then between actors
        # that see only their own GPU (Ray's default layout; --apart has gpuring's rows there).
        for layout in ("both", "own"):
            if layout == "own":
                ray.kill(a)
                ray.kill(b)
                a = Producer.options(num_gpus=1).remote()
                b = Consumer.options(num_gpus=1).remote()
                (gpu_a, seen_a), (gpu_b, seen_b) = ray.get([a.gpu.remote(), b.gpu.remote()])
                print("\nA on GPU %d (%s), B on GPU %d (%s)" % (gpu_a, seen_a, gpu_b, seen_b))
            create_collective_group([a, b], backend="nccl")
            what = "nccl" if layout == "both" else "nccl, apart"
            for shape in ("4KB", "5MB", "64MB", "sd"):
                try:
                    r = transfers(a, b, "nccl", shape, rounds[shape], warm=2, timeout=120)
                except Exception as e:
                    print("%-10s %-14s failed: %s" % (shape, what, _why(e)))
                    break
                results["transfers"]["%s/%s" % (shape, what)] = r
                _row(shape, what, r)
    _finish(args, results)


if __name__ == "__main__":
    main()
