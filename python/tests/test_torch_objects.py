"""Objects of torch CPU tensors through host channels and queues: the plain-tree form
(tuples, lists, dicts, scalars and tensors, no pickle) and what falls back to pickle.
Needs torch (CPU is enough); CI runs it in the venv that has torch (beside test_ray.py)."""

import collections
import dataclasses
import multiprocessing as mp
import struct
import typing

import numpy as np
import peers
import pytest

import gpuring

torch = pytest.importorskip("torch")

spawn = mp.get_context("spawn")
same = peers.same
TREE = b"GRT1"


class Pair(typing.NamedTuple):
    a: object
    b: object


@dataclasses.dataclass
class Step:
    obs: object
    n: int


def roundtrip(tx, rx, obj, copy=True):
    """Sends obj, returns (the object received, the form its header names)."""
    tx.send_object(obj)
    with rx.recv(timeout=5) as msg:
        return msg.object(copy=copy), msg.header[:4]


def test_plain_trees_travel_without_pickle_and_come_back_equal(name):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cases = [
        t,
        (1.5, t),
        {"obs": t, "mask": t > 3, "step": 17, "none": None, "name": "ß-x", "raw": b"\x00\xff"},
        [t, [torch.ones(2, dtype=torch.int64), (t[:, ::2],)], True, False, -(2**63)],
        {1: "one", (2, "two"): [2.25, float("inf")], "bf16": t.to(torch.bfloat16)},
        {"empty": torch.empty(0, 3), "c": torch.tensor([1 + 2j], dtype=torch.complex64)},
        (t, np.arange(6, dtype=np.int16).reshape(2, 3), [np.zeros(0)]),
        (),
        {},
        "just a string",
        None,
    ]
    with gpuring.Channel.create(name, slots=2, slot_bytes=1 << 16) as ch:
        tx, rx = ch.sender(), ch.receiver()
        for obj in cases:
            for copy in (True, False):
                got, form = roundtrip(tx, rx, obj, copy)
                assert form == TREE, (obj, form)
                want = obj.contiguous() if isinstance(obj, torch.Tensor) else obj
                assert same(want, got), (obj, got)
        assert tx.free_slots == 2


def test_a_tree_keeps_tied_tensors_and_autograd_flags(name):
    w = torch.ones(4)
    p = torch.nn.Parameter(torch.zeros(3))
    g = torch.ones(2, requires_grad=True)
    with gpuring.Channel.create(name, slots=2, slot_bytes=1 << 16) as ch:
        tx, rx = ch.sender(), ch.receiver()
        got, form = roundtrip(tx, rx, {"w": w, "tied": w, "p": p, "g": g, "copy": w.clone()})
        assert form == TREE
        assert got["w"] is got["tied"] and got["copy"] is not got["w"]
        assert type(got["p"]) is torch.nn.Parameter and got["p"].requires_grad
        assert got["g"].requires_grad and not got["w"].requires_grad
        assert torch.equal(got["p"].detach(), p.detach())


def test_what_a_tree_cannot_say_goes_by_pickle_and_still_comes_back(name):
    t = torch.arange(6.0)
    shared = [t]
    cyclic = [t]
    cyclic.append(cyclic)
    deep = t
    for _ in range(70):
        deep = (deep,)
    big = {"layer%d.weight" % i: torch.full((4,), float(i)) for i in range(300)}
    cases = {
        "namedtuple": Pair(t, 1),
        "OrderedDict": collections.OrderedDict(a=t),
        "a list met twice": (shared, shared),
        "a list inside itself": cyclic,
        "an int past 64 bits": (t, 2**70),
        "a lone surrogate": (t, "\ud800"),
        "a numpy scalar": (t, np.float32(1.5)),
        "a dataclass": Step(t, 3),
        "70 levels": deep,
        "a description over 4 KB": big,
    }
    with gpuring.Channel.create(name, slots=2, slot_bytes=1 << 17) as ch:
        tx, rx = ch.sender(), ch.receiver()
        for what, obj in cases.items():
            got, form = roundtrip(tx, rx, obj)
            assert form != TREE, what
            if what == "a list met twice":
                assert got[0] is got[1] and torch.equal(got[0][0], t)
            elif what == "a list inside itself":
                assert got[1] is got and torch.equal(got[0], t)
            elif what in ("namedtuple", "OrderedDict"):
                first = list(got.values())[0] if isinstance(got, dict) else got[0]
                assert type(got) is type(obj) and torch.equal(first, t)
            else:
                assert same(obj, got), what
        assert tx.free_slots == 2


def test_tree_views_hold_the_slot_and_copies_do_not(name):
    with gpuring.Channel.create(name, slots=2, slot_bytes=1 << 16) as ch:
        tx, rx = ch.sender(), ch.receiver()
        obj = {"a": torch.arange(10.0), "b": [torch.zeros(2, 2, dtype=torch.int8)], "n": 3}
        tx.send_object(obj)
        msg = rx.recv(timeout=5)
        views = msg.object()
        msg.release()
        assert same(obj, views) and tx.free_slots == 1
        views["a"][0] = 42.0  # a view of the slot: writable, harms nobody
        del views
        import gc

        gc.collect()
        assert tx.free_slots == 2
        got, form = roundtrip(tx, rx, obj, copy=True)
        assert form == TREE and same(obj, got) and tx.free_slots == 2


def test_a_tree_larger_than_a_slot_is_too_large_and_sends_nothing(name):
    with gpuring.Channel.create(name, slots=2, slot_bytes=4096) as ch:
        tx, rx = ch.sender(), ch.receiver()
        with pytest.raises(gpuring.TooLarge):
            tx.send_object((torch.ones(512), torch.ones(512), torch.ones(512)))
        assert tx.free_slots == 2 and len(ch) == 0
        got, form = roundtrip(tx, rx, (torch.ones(512), 1))
        assert form == TREE and same((torch.ones(512), 1), got)


def tree(body):
    return TREE + body


def u32(n):
    return struct.pack("<I", n)


def tensor_node(code=11, flags=0, device=-1, off=0, dims=(4,)):
    """A tensor node: float32 (gpuring's code 11) of `dims` at `off`."""
    head = bytes([10, code, flags]) + struct.pack("<iQ", device, off) + bytes([len(dims)])
    return head + b"".join(struct.pack("<Q", d) for d in dims)


def test_forged_trees_are_corrupted_and_the_channel_carries_on(name):
    # A real tree's tensor code, to forge the rest around it.
    with gpuring.Channel.create(name, slots=1, slot_bytes=4096) as ch:
        tx, rx = ch.sender(), ch.receiver()
        tx.send_object(torch.ones(4))
        with rx.recv(timeout=5) as msg:
            real = msg.header
        code = real[5]
        cases = {
            "cut short": tree(b"\x07" + u32(2) + b"\x00"),
            "an unknown node": tree(b"\x63"),
            "a count beyond its length": tree(b"\x08" + u32(1 << 30)),
            "bytes after the end": tree(b"\x00\x00"),
            "a string not UTF-8": tree(b"\x05" + u32(2) + b"\xc3\x28"),
            "an unhashable key": tree(b"\x09" + u32(1) + b"\x08" + u32(0) + b"\x00"),
            "an unknown dtype": tree(tensor_node(code=200)),
            "a part outside the payload": tree(tensor_node(code=code, off=4096)),
            "a shape past the payload": tree(tensor_node(code=code, dims=(1 << 40,))),
            "unknown flags": tree(tensor_node(code=code, flags=0x80)),
            "an impossible device": tree(tensor_node(code=code, device=-7)),
            "too many dims": tree(tensor_node(code=code, dims=(1,) * 40)),
            "an unknown tensor": tree(b"\x0b" + u32(0)),
            "too deep": TREE + (b"\x07" + u32(1)) * 80 + b"\x00",
        }
        for what, header in cases.items():
            tx.send(torch.zeros(1024, dtype=torch.uint8), header=header)
            with rx.recv(timeout=5) as msg:
                with pytest.raises(gpuring.Corrupted):
                    msg.object()
                    pytest.fail(what)
        assert tx.free_slots == 1
        got, form = roundtrip(tx, rx, (torch.ones(3), "after"))
        assert form == TREE and same((torch.ones(3), "after"), got)


def put_trees(q, count):
    for i in range(count):
        t = torch.full((3, 4), float(i))
        q.put([(float(i), t), {"obs": t, "step": i, "mask": t > 0}, [t, [t * 2]]][i % 3])
    q.put("done")


def test_queue_carries_trees_between_processes_and_large_ones_aside(name):
    q = gpuring.Queue(name, slot_bytes=4096)
    p = spawn.Process(target=put_trees, args=(q, 60))
    p.start()
    got = [q.get(timeout=120) for _ in range(61)]
    p.join(60)
    assert p.exitcode == 0 and got[-1] == "done"
    for i, g in enumerate(got[:-1]):
        t = torch.full((3, 4), float(i))
        want = [(float(i), t), {"obs": t, "step": i, "mask": t > 0}, [t, [t * 2]]][i % 3]
        assert same(want, g), (i, g)
    # Larger than a slot: put aside through a second channel, as pickled objects are.
    big = {"a": torch.ones(2048), "b": torch.zeros(2048), "n": 1}
    q.put(big)
    q.put(big, timeout=5)
    assert same(big, q.get(timeout=5)) and same(big, q.get(timeout=5))
    with pytest.raises(gpuring.Full):
        for _ in range(300):
            q.put((torch.ones(4), 1), block=False)
    while not q.empty():
        assert same((torch.ones(4), 1), q.get(timeout=5))
    q.close()
