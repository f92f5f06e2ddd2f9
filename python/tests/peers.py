"""What the child processes of the tests run (a module of its own, so that
``multiprocessing``'s spawn start method can import it in the child)."""

import dataclasses
import os
import sys
import time

import numpy as np

import gpuring

BIG_SHAPE = (3, 2160, 2080)  # float32: 53.9 MB, the size the issue names


def big_array(i):
    """A 54 MB float32 array whose every byte depends on ``i`` and its position."""
    a = np.arange(np.prod(BIG_SHAPE), dtype=np.uint32).reshape(BIG_SHAPE)
    a += np.uint32(i * 7919)
    return a.view(np.float32)


def send_big(name, count):
    ch = gpuring.Channel.open(name, timeout=10)
    tx = ch.sender()
    for i in range(count):
        tx.send(big_array(i), tag=i)
    tx.close()


def send_numbered(name, producer, count, all_attached):
    """Sends ``count`` int64 pairs (producer, i) through an MPMC channel, once every peer
    has its endpoint (``all_attached``, a barrier): a sender that found no receiver yet,
    or receivers that found every sender gone before the last one came, would end early."""
    ch = gpuring.Channel.open(name, timeout=10)
    tx = ch.sender()
    all_attached.wait(60)
    for i in range(count):
        with tx.lease((2,), "int64", tag=producer) as buf:
            v = np.from_dlpack(buf)
            v[0] = producer
            v[1] = i
    tx.close()


def receive_numbered(name, out_queue, stop_after, all_attached):
    """Receives until every sender left, once every peer has its endpoint (see
    ``send_numbered``); reports the (producer, i) pairs it got."""
    ch = gpuring.Channel.open(name, timeout=10)
    rx = ch.receiver()
    all_attached.wait(60)
    got = []
    deadline = time.monotonic() + stop_after
    while time.monotonic() < deadline:
        try:
            with rx.recv(timeout=0.5) as msg:
                v = np.from_dlpack(msg)
                got.append((int(v[0]), int(v[1])))
        except gpuring.Timeout:
            continue
        except gpuring.Disconnected:
            break
    out_queue.put(got)


def send_then_hang(name, ready):
    """Sends one message, says so, then waits to be killed."""
    ch = gpuring.Channel.open(name, timeout=10)
    tx = ch.sender()
    tx.send(np.full(4, 9, dtype=np.int32))
    ready.set()
    time.sleep(600)


def receive_then_hang(name, ready):
    """Attaches as the receiver, says so, then waits to be killed."""
    ch = gpuring.Channel.open(name, timeout=10)
    rx = ch.receiver()
    ready.set()
    time.sleep(600)
    rx.close()


def put_queue(q, count):
    for i in range(count):
        q.put(np.full((16,), i, dtype=np.int16))


def blocked_recv_main(name):
    """Run as a script: blocks in recv() until interrupted; exits 3 on KeyboardInterrupt."""
    import signal

    # Python raises KeyboardInterrupt on SIGINT only if SIGINT was not ignored when it
    # started, and a job started in the background by a non-interactive shell (`cmd &`, as
    # a CI runner may do) inherits SIGINT ignored: the test would then hang for want of a
    # signal, not for anything of ours. Ctrl-C in a terminal is the default handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ch = gpuring.Channel.open(name, timeout=10)
    rx = ch.receiver()
    print("blocking", flush=True)
    try:
        rx.recv()
    except KeyboardInterrupt:
        os._exit(3)
    os._exit(0)


if __name__ == "__main__":
    import sys

    blocked_recv_main(sys.argv[1])


def produce_then_die(name, values, ready):
    """A producer that may be restarted: finds or makes the channel, sends ``values``,
    says so, then waits to be killed (no clean-up runs)."""
    ch = gpuring.Channel.open_or_create(name, slots=8, slot_bytes=64)
    tx = ch.sender()
    for v in values:
        tx.send(np.array([v], dtype=np.int64))
    ready.set()
    time.sleep(600)


@dataclasses.dataclass
class Batch:
    """A dataclass of arrays, as users put through queues."""

    obs: object
    mask: object
    step: int


def objects(i):
    """The i-th object of a known stream: arrays inside tuples, dicts, lists and a
    dataclass, mixed with plain values."""
    a = np.arange(24, dtype=np.float32).reshape(4, 6) + i
    b = np.full((3,), i, dtype=np.int64)
    return [
        (float(i), a),
        {"obs": a, "mask": b > 0, "step": i, "none": None, "name": "x%d" % i},
        Batch(a, b, i),
        [a, [b, (a[:, ::2],)]],
        "plain %d" % i,
    ][i % 5]


def put_objects(q, count):
    for i in range(count):
        q.put(objects(i))


def put_queue_items(q, items):
    for it in items:
        q.put(it)


def same(a, b):
    """Equal structure and values: arrays and tensors bit for bit, of the same dtype and
    shape (tensors on the same device), containers and dataclasses item by item."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and (a.device, a.dtype, a.shape) == (b.device, b.dtype, b.shape)
            and torch.equal(a, b)
        )
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and (a.dtype, a.shape) == (b.dtype, b.shape)
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and same(dataclasses.astuple(a), dataclasses.astuple(b))
    return type(a) is type(b) and a == b


def qsize_then_put(q, out):
    """In a forked child: the queue's size as inherited, then an object put from here."""
    out.put(q.qsize())
    q.put(("from the child", np.arange(3)))


def receive_broadcast(name, out_queue, all_attached):
    """A broadcast channel's receiver: reports every int64 value it got until the sender
    left, and how many it was told it missed (a lagging channel)."""
    ch = gpuring.Channel.open(name, timeout=10)
    rx = ch.receiver()
    all_attached.wait(60)
    got, missed = [], 0
    while True:
        try:
            with rx.recv(timeout=30) as msg:
                got.append(int(np.from_dlpack(msg)[0]))
        except gpuring.Lagged as e:
            missed += e.missed
        except gpuring.Disconnected:
            break
    out_queue.put((got, missed))


def put_kept(q, count, finished):
    """Puts ``count`` arrays as fast as it can, which the getter keeps (views); stays until
    ``finished``."""
    for i in range(count):
        q.put(np.full((16,), i, dtype=np.int32), timeout=60)
    assert finished.wait(120)
    q.close()
