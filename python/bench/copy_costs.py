#!/usr/bin/env python3
"""CPU cost per call of the GPU submissions around a hand-off, in one process (GPU 0).

    python python/bench/copy_costs.py [--ptx python/src/kernels/gather.ptx]

Part 1, one received tensor (4 KB, 5 MB): ``clone()`` against ``empty_like`` + a driver
copy, a kernel, ``msg.torch()``: what ``Queue.get``'s copy can cost at the least. Part 2,
dicts of 2, 10 and 64 CUDA tensors: making torch views of a slot, ``_foreach_copy_``, a
driver copy per tensor, and the gather kernel (``--ptx``, launched through ctypes);
then ``send_object`` of the dict with ``recv`` and ``object()`` as the package does them.
Medians over thousands of calls (the GPU work runs behind; only the CPU time counts).
"""

import argparse
import ctypes
import time

import torch

import gpuring

U64 = ctypes.c_uint64


def timeit(label, f, n=2000):
    for _ in range(100):
        f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        f()
        ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    print("  %-56s p50 %7.2f us  p90 %7.2f us" % (label, ts[n // 2] / 1e3, ts[9 * n // 10] / 1e3))


def channel(slot_bytes):
    name = "gpuring-copycosts-%d" % time.monotonic_ns()
    ch = gpuring.Channel.create(name, slot_bytes=max(slot_bytes, 1 << 20), device=0)
    return ch, ch.sender(), ch.receiver()


def one_tensor(cuda, size):
    ch, tx, rx = channel(size)
    t = torch.ones(size // 4, device="cuda")
    tx.send(t)
    msg = rx.recv()
    x = msg.torch()
    y = torch.empty_like(x)
    s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    print("one tensor of %d B" % size)
    timeit("x.clone()", x.clone)
    timeit("torch.empty_like(x)", lambda: torch.empty_like(x))
    timeit("y.copy_(x) (y made before)", lambda: y.copy_(x))
    timeit(
        "cuMemcpyDtoDAsync (ctypes)",
        lambda: cuda.cuMemcpyDtoDAsync_v2(U64(y.data_ptr()), U64(x.data_ptr()), size, s),
    )
    timeit("y.fill_(1) (one kernel)", lambda: y.fill_(1))
    timeit("msg.torch()", msg.torch)

    def copied():
        tx.send(t)
        m = rx.recv()
        m.torch().clone()
        m.release()

    def viewed():
        tx.send(t)
        m = rx.recv()
        m.torch()
        m.release()

    timeit("send + recv + torch().clone() + release", copied, 1000)
    timeit("send + recv + torch() + release", viewed, 1000)
    torch.cuda.synchronize()
    msg.release()


class Part(ctypes.Structure):
    _fields_ = [("src", U64), ("dst", U64), ("n", U64)]


class Table(ctypes.Structure):
    _fields_ = [("p", Part * 64)]


def many_tensors(cuda, fn, count, size):
    ch, tx, rx = channel(count * size * 2)
    d = {"t%d" % k: torch.full((size // 4,), float(k), device="cuda") for k in range(count)}
    d["step"] = 1
    srcs = [d["t%d" % k] for k in range(count)]
    lease = tx.lease((count * size,), "uint8")
    slot = torch.from_dlpack(lease)
    base = slot.data_ptr()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    print("%d tensors of %d B" % (count, size))

    def views():
        return [slot[k * size : (k + 1) * size].view(torch.float32) for k in range(count)]

    dsts = views()
    timeit("views of the slot (3 torch calls each)", views)
    timeit("torch._foreach_copy_(views, tensors)", lambda: torch._foreach_copy_(dsts, srcs))
    if count <= 10:

        def driver_copies():
            for k, s in enumerate(srcs):
                cuda.cuMemcpyDtoDAsync_v2(U64(base + k * size), U64(s.data_ptr()), size, stream)

        timeit("a cuMemcpyDtoDAsync per tensor (ctypes)", driver_copies)
    if fn is not None:
        table = Table()
        for k, s in enumerate(srcs):
            table.p[k] = Part(s.data_ptr(), base + k * size, size)
        args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(table), ctypes.c_void_p))
        blocks = max(1, (size // 16 + 255) // 256)

        def launch():
            r = cuda.cuLaunchKernel(fn, blocks, count, 1, 256, 1, 1, 0, stream, args, None)
            assert r == 0, r

        slot.zero_()
        launch()
        torch.cuda.synchronize()
        exact = all(torch.equal(dsts[k], srcs[k]) for k in range(count))
        print("  the gather kernel copied every tensor exactly: %s" % exact)
        timeit("gather kernel launch (ctypes, its table made before)", launch)
    lease.cancel()

    def sent(copy):
        tx.send_object(d)
        m = rx.recv()
        if copy is not None:
            m.object(copy=copy)
        m.release()

    timeit("tx.send_object(d) + recv + release", lambda: sent(None), 1000)
    timeit("... + object(copy=True)", lambda: sent(True), 1000)
    timeit("... + object(copy=False)", lambda: sent(False), 1000)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ptx", help="the gather kernel's PTX (python/src/kernels/gather.ptx)")
    args = ap.parse_args()
    cuda = ctypes.CDLL("libcuda.so.1")
    torch.empty(1, device="cuda")  # torch's context first: ours is the same primary one
    fn = None
    if args.ptx:
        ptx = open(args.ptx, "rb").read() + b"\0"
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        assert cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(ptx)) == 0
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"gpuring_gather") == 0
    for size in (4096, 5 << 20):
        one_tensor(cuda, size)
    for count, size in ((2, 4096), (10, 4096), (10, 1 << 20), (64, 4096)):
        many_tensors(cuda, fn, count, size)


if __name__ == "__main__":
    main()
