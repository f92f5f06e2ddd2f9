"""What the child processes of the GPU tests run (spawned: they import this module)."""

import torch

import gpuring

# About 0.3 s of GPU time (torch.cuda._sleep spins this many clock cycles).
SLOW_CYCLES = 600_000_000


def expected(i):
    return torch.arange(4096, dtype=torch.float32, device="cuda") + i


def send_tensors(name, count):
    ch = gpuring.Channel.open(name, device=0, timeout=30)
    tx = ch.sender()
    for i in range(count):
        tx.send(expected(i), tag=i)
    tx.close()


def opened(channel, ready=None):
    """`channel` opened on GPU 0: by name (its senders signalling by `ready`), or a Channel
    unpickled in this process (signalling as the pickling process's do)."""
    if isinstance(channel, str):
        return gpuring.Channel.open(channel, device=0, timeout=30, ready=ready)
    return channel


def send_after_slow_kernel(name, count, ready=None):
    """Each tensor is written after a slow kernel on the current stream; send queues the
    copy into the slot after it (torch's stream order), without waiting for the GPU.
    `name`: a channel name (opened on GPU 0, signalling by `ready`) or a pickled Channel."""
    ch = opened(name, ready)
    tx = ch.sender()
    for k in range(1, count + 1):
        x = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
        torch.cuda._sleep(SLOW_CYCLES)
        x.fill_(k)
        tx.send(x, timeout=60)
    torch.cuda.synchronize()
    tx.close()


def send_ones_then_twos(name, n, count, ready=None):
    """Message k holds n values k + 1, each into the one slot as soon as it is free."""
    ch = opened(name, ready)
    tx = ch.sender()
    for k in range(count):
        tx.send(torch.full((n,), float(k + 1), device="cuda"), timeout=60)
    torch.cuda.synchronize()
    tx.close()


def send_numbers(name, count, ready=None):
    ch = opened(name, ready)
    tx = ch.sender()
    numbers = torch.arange(count, dtype=torch.int64, device="cuda")
    for i in range(count):
        tx.send(numbers[i : i + 1], timeout=60)
    torch.cuda.synchronize()
    tx.close()


def put_tensors(q, count):
    for i in range(count):
        q.put(expected(i))
    torch.cuda.synchronize()


def put_tensors_then_wait(q, count, until):
    """``put_tensors``, then alive (its slots with it) until the event ``until`` is set."""
    put_tensors(q, count)
    until.wait(120)


def put_after_slow_kernels(q, count, until, mixed=False):
    """Item i is ``expected(i)`` written after a slow kernel (the put's copy queued behind
    it, not waited for); with ``mixed``, every third item a dict holding it instead. Then
    alive (its slots with it) until the event ``until`` is set."""
    for i in range(count):
        x = torch.zeros(4096, device="cuda")
        torch.cuda._sleep(SLOW_CYCLES // 8)
        x.copy_(expected(i))
        q.put({"i": i, "t": x} if mixed and i % 3 == 2 else x)
    torch.cuda.synchronize()
    until.wait(120)


def send_pinned_after_slow_kernel(name, count, took):
    """Into a pinned host channel: each 54 MB CUDA tensor is written after a slow kernel,
    and `send` queues one asynchronous copy into the slot and returns (the descriptor is
    published when the copy is done). `took` gets how long each send call took."""
    import time

    ch = gpuring.Channel.open(name, timeout=30, pinned=True)
    tx = ch.sender()
    for k in range(1, count + 1):
        x = torch.empty((54 << 20) // 4, dtype=torch.int32, device="cuda")
        torch.cuda._sleep(SLOW_CYCLES)
        x.fill_(k)
        t0 = time.perf_counter()
        tx.send(x, timeout=60)
        took.put(time.perf_counter() - t0)
    torch.cuda.synchronize()
    tx.close()


def send_filled_arrays(name, count):
    """A CPU process: 54 MB numpy arrays of k, each into the one slot once it is free."""
    import numpy as np

    ch = gpuring.Channel.open(name, timeout=30)
    tx = ch.sender()
    for k in range(1, count + 1):
        tx.send(np.full((54 << 20) // 4, k, dtype=np.int32), timeout=60)
    tx.close()


def gpu_objects(i):
    """The i-th object of a known stream: CUDA and CPU tensors and numpy arrays in one
    object, mixed with plain values."""
    import numpy as np

    t = expected(i)[:1000].reshape(10, 100)
    return {
        "stamp": (float(i), t),
        "cpu": torch.arange(6, dtype=torch.int16).reshape(2, 3) + i,
        "np": np.full((4,), i, dtype=np.float64),
        "nested": [t.to(torch.bfloat16), (t[:, ::3], None)],
        "step": i,
        "name": "o%d" % i,
    }


def put_gpu_objects(q, count):
    for i in range(count):
        q.put(gpu_objects(i))
    torch.cuda.synchronize()


STATE_SHAPE = (416, 1024)  # float32: 1.7 MB; 300 of them ~511 MB


def state_tensor(k):
    """Tensor k of the known state dict: values that differ in every element and key."""
    n = STATE_SHAPE[0] * STATE_SHAPE[1]
    return (torch.arange(n, dtype=torch.float32, device="cuda") * 1e-3 + k).reshape(STATE_SHAPE)


def put_state_dict(q, rounds):
    for r in range(rounds):
        sd = {"layers.%d.weight" % k: state_tensor(k + r) for k in range(300)}
        q.put(sd)
    torch.cuda.synchronize()


def put_after_slow_kernel(q, count):
    """Objects whose tensors (two: one foreach copy into the slot) are written after a
    slow kernel on the current stream."""
    for k in range(1, count + 1):
        x = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
        y = torch.zeros(1 << 10, dtype=torch.float16, device="cuda")
        torch.cuda._sleep(SLOW_CYCLES)
        x.fill_(k)
        y.fill_(k + 0.5)
        q.put({"k": k, "x": x, "y": y}, timeout=60)
    torch.cuda.synchronize()


def many_tensors(k, zeros=False):
    """Message k's dict of 70 CUDA tensors (more than one copy launch holds): odd byte
    counts, a view that starts 4 bytes into its storage, a 3 MB one, several dtypes; the
    values of tensor i are k + i (or zeros)."""
    out = {}
    for i in range(70):
        v = 0 if zeros else k + i
        if i % 7 == 0:
            t = torch.full((3 * i + 1,), v, dtype=torch.int8, device="cuda")
        elif i % 7 == 1:
            t = torch.full((1001,), float(v), device="cuda")[1:]  # data_ptr 4 bytes in
        elif i == 2:
            t = torch.full((3 << 18,), float(v), device="cuda")  # 3 MB
        elif i % 7 == 3:
            t = torch.full((5, 3), float(v), dtype=torch.bfloat16, device="cuda")
        else:
            t = torch.full((256 + i,), float(v), dtype=torch.float64, device="cuda")
        out["t%d" % i] = t
    out["k"] = k
    return out


def send_many_tensors_after_slow_kernel(name, count):
    """Each message is `many_tensors(k)`, its values written by kernels queued after a
    slow one on this process's current stream: `send_object` must copy them after the
    slow kernel, without waiting for it on the host."""
    ch = opened(name)
    tx = ch.sender()
    for k in range(count):
        obj = many_tensors(k, zeros=True)
        torch.cuda._sleep(SLOW_CYCLES)
        for i in range(70):
            obj["t%d" % i].fill_(k + i)
        tx.send_object(obj, timeout=60)
    torch.cuda.synchronize()
    tx.close()


def put_kept(q, count, finished):
    """Puts ``count`` tensors, which the getter keeps (views), then stays until ``finished``:
    the views are this process's memory."""
    for i in range(count):
        q.put(expected(i), timeout=60)
    torch.cuda.synchronize()
    assert finished.wait(120)
    q.close()


def get_one_taking_ahead(q, took, close):
    """One ``get`` of ``q`` (made with ``prefetch``), reporting the item's first value and
    how many items it took ahead; then ``q.close()`` (or not) and exit: what it took ahead
    goes back to the queue either way."""
    x = q.get(timeout=60)
    took.put((float(x[0].item()), len(q._ahead)))
    if close:
        q.close()


def put_tensors_close_then_wait(q, count, closed, until):
    """``put_tensors``, then ``q.close()`` (every sender of the queue gone: after the last
    item a receive says the channel's end) and the event ``closed`` set, then alive (its
    device memory with it) until the event ``until`` is set."""
    put_tensors(q, count)
    q.close()
    closed.set()
    until.wait(120)
