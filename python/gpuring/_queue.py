"""gpuring.Queue: a drop-in for ``torch.multiprocessing.Queue`` of tensors."""

import collections
import os
import secrets
import sys
import threading
import time
from multiprocessing import util
from typing import Any, Optional

from . import _objects
from ._gpuring import Channel, copies
from .errors import Disconnected, Empty, Error, Full, PeerDead, Timeout, TooLarge

# What a message's tag says the sender put in (a Queue owns its channel's tags).
_NUMPY = 0
_TORCH = 1
_OBJECT = 2
# An empty message whose header names the putter's channel that holds the item (larger
# than a slot).
_BIG = 3

# Endpoints a forked child inherited from its parent: never used again here (the child
# opens its own). Dropping them would be harmless (the core's drops of a handle another
# process made act on nothing shared); keeping them spares the child the unmapping.
_inherited = []

# How many forks this process descends from (in this interpreter): a queue whose endpoints
# were made under another count was inherited through a fork. A counter, not `getpid()`,
# so that a put or get makes no system call of its own.
_forks = [0]


def _forked():
    _forks[0] += 1


os.register_at_fork(after_in_child=_forked)


class _Until:
    """A ``timeout=`` as a deadline, and the pauses of a wait that polls (while the peers
    of the other side are all gone, a channel answers at once instead of waiting)."""

    def __init__(self, timeout, start=None):
        # `start`: when the wait began, if before now (`time.monotonic()`).
        if timeout is None:
            self._end = None
        else:
            self._end = (time.monotonic() if start is None else start) + timeout
        self._pause = 0.001

    def left(self):
        if self._end is None:
            return None
        return max(0.0, self._end - time.monotonic())

    def pause(self):
        """Sleeps a little (1 ms, growing to 50 ms); False once the deadline passed."""
        left = self.left()
        if left == 0.0:
            return False
        time.sleep(self._pause if left is None else min(self._pause, left))
        self._pause = min(self._pause * 2, 0.05)
        return True


def _started(timeout):
    """A ``timeout=`` as handed to a channel call (negative or NaN: 0, as the polling loop
    takes them), and when the wait began (None without a timeout), for a :class:`_Until`
    that goes on from there."""
    if timeout is None:
        return None, None
    return (timeout if timeout > 0 else 0.0), time.monotonic()


def _kind(obj):
    """What a message of ``obj`` carries: one tensor or array (sent as is), or an object
    (its tensors and arrays in one slot, the rest described or pickled beside them)."""
    module = type(obj).__module__
    if module == "torch" and type(obj) is sys.modules["torch"].Tensor and not obj.requires_grad:
        return _TORCH
    if module == "numpy" and type(obj) is sys.modules["numpy"].ndarray:
        dtype = obj.dtype
        carried = _CARRIED_DTYPES.get(dtype)
        if carried is None:
            # `dtype.name` builds a string (some µs): asked once per dtype.
            carried = not dtype.hasobject and dtype.name in _CARRIED
            if len(_CARRIED_DTYPES) < 256:
                _CARRIED_DTYPES[dtype] = carried
        if carried:
            return _NUMPY
    return _OBJECT


# The numpy dtype names a plain send carries: gpuring's dtypes that numpy exports through
# DLPack itself (not `dtypes()`: bfloat16 and float8 arrays, from ml_dtypes, have no
# DLPack export). Others travel as objects: their bytes in the slot, their dtype pickled.
_CARRIED = frozenset(
    (
        "bool int8 uint8 int16 uint16 int32 uint32 int64 uint64 float16 float32 float64 "
        "complex64 complex128"
    ).split()
)


# numpy dtype -> whether a plain send carries it (`_kind`'s answers; a few entries).
_CARRIED_DTYPES: dict = {}


def _nbytes(obj):
    """Bytes a tensor or array takes in a slot."""
    n = getattr(obj, "nbytes", None)
    return n if isinstance(n, int) else obj.numel() * obj.element_size()


def _prefetch_count(n):
    """A ``prefetch=`` argument, checked."""
    if not isinstance(n, int) or n < 1:
        raise ValueError("prefetch must be an int of at least 1, not %r" % (n,))
    return n


def _give_back(ahead, rx):
    """Puts the messages a getter took ahead (``prefetch``) back in the queue's channel,
    first in line for the next get of any getter (the queue's close, or this process's
    exit: a ``multiprocessing.util.Finalize``). One that cannot go back is released
    (dropped)."""
    while ahead:
        _, msg, _, _ = ahead.popleft()
        if msg is None:
            continue  # an error met taking ahead
        try:
            rx.requeue(msg)
        except Error:
            msg.release()


def _current_stream(device):
    """torch's current stream on ``device``, as a raw handle."""
    return sys.modules["torch"]._C._cuda_getCurrentRawStream(device)


# A putter's senders of one channel, at most: the first and, while getters keep most of
# their slots, more like it (`_Senders.roomy`).
_MAX_SENDERS = 8

# Seconds a put waits for a slot before it looks again whether more slots are warranted.
_LOOK = 0.002


class _Senders:
    """This process's senders of one channel: the first, and more like it (as many slots
    of the same size, a pool each) while getters keep most of their slots (``get(copy=False)``
    views alive): so that items a getter keeps do not make ``put`` wait, as they do not
    with torch's queue. Up to :data:`_MAX_SENDERS` in all; the pools stay until the queue
    closes here."""

    __slots__ = ("ch", "all", "more")

    def __init__(self, ch, first):
        self.ch, self.all, self.more = ch, [first], True

    def roomy(self):
        """A sender with a free slot; a new one where none has and getters hold more than
        half of the slots; else the first (``put`` waits for a slot of it)."""
        for s in self.all:
            if s.free_slots:
                return s
        first = self.all[0]
        if not self.may_grow():
            return first
        # Slots sent and not yet taken are the getters' lag: more slots would only queue
        # more. Slots held are items taken and kept: those are worth more slots.
        if 2 * sum(s.held_slots for s in self.all) <= len(self.all) * first.slot_count:
            return first
        try:
            more = self.ch.sender(slots=first.slot_count, slot_bytes=first.slot_bytes)
        except Error:
            self.more = False  # the channel's pool table is full, or memory is: wait
            return first
        self.all.append(more)
        return more

    def may_grow(self):
        """Whether another sender may still be added."""
        return self.more and len(self.all) < _MAX_SENDERS

    def send(self, until, call):
        """``call(sender, timeout)`` with :meth:`roomy`'s sender. Where that one has no free
        slot and the group may still grow, it waits in slices of :data:`_LOOK` seconds and
        looks again between them: a getter may meanwhile take and keep enough items."""
        while True:
            s = self.roomy()
            if s.free_slots or not self.may_grow():
                return call(s, until.left())
            left = until.left()
            try:
                return call(s, _LOOK if left is None else min(left, _LOOK))
            except Timeout:
                if until.left() == 0.0:
                    raise

    def close(self):
        for s in self.all:
            s.close()


class _Big:
    """A channel of a putter for items larger than the queue's slots, and its end here (a
    putter's :class:`_Senders`, or a getter's receiver)."""

    __slots__ = ("name", "ch", "end")

    def __init__(self, name, ch, end):
        self.name, self.ch, self.end = name, ch, end


def _next_pow2(n):
    p = 2
    while p < n:
        p *= 2
    return p


class Queue:
    """A multi-producer, multi-consumer queue of tensors between processes, for code
    written against ``torch.multiprocessing.Queue``: ``put`` copies a tensor (or a numpy
    array) into a slot of the putting process's pool, ``get`` returns a tensor, and
    nothing is pickled.

    The queue is a gpuring MPMC channel named ``name`` (a unique name when ``None``),
    created here. Pass the queue to child processes as usual (``multiprocessing``
    pickles it by name; the child opens the same channel). ``device=None`` carries
    tensors through host shared memory; ``device=N`` through memory of GPU ``N`` (CUDA
    tensors stay on the GPU: one device-to-device copy in ``put``, one in ``get``).
    ``ready``: with ``device=N``, how ``put`` signals the copy's end to the getter
    (``"flag"`` or ``"event"``; ``None``, the default: flags where the GPU can; see
    :meth:`gpuring.Channel.create`).

    Each putting process owns ``slots`` slots of ``slot_bytes`` bytes (by default 8 of
    1 MiB, as for a channel; host queues take that much room in ``/dev/shm`` per putting
    process). Without a ``slot_bytes``, a process whose first ``put`` is a tensor or array
    larger than 1 MiB gets ``large_slots`` slots (by default 2, 4 on a GPU) of that size's
    power of two instead, so that such items go as one message each; ``maxsize`` (or
    ``capacity``) bounds the messages in flight. An item larger than the putter's slots
    goes through ``large_slots`` slots of its size class (see :meth:`put`).
    ``get`` returns a copy by default, so that slots go back at once; ``copy=False``
    returns a zero-copy view that holds its slot until the tensor is freed (a putter
    whose getters keep its items so gets more pools like its first, up to 8, before
    ``put`` waits; see :meth:`get`).

    ``prefetch`` (default 1: off), for a queue with one getting process: a ``get`` (with
    ``copy=True``) whose item is a GPU tensor takes up to ``prefetch - 1`` more items that
    already wait behind it and copies the run of GPU tensors among them with its own, in
    one kernel launch; the next ``get`` calls hand them out, in order, without waiting.
    A getter that has fallen behind a stream so pays one GPU submission for several
    items (some 5-8 µs of CPU each under MPS). Items taken ahead count in ``qsize()``
    and stay the queue's: a getter that closes the queue (or exits, or is killed) before
    ``get`` hands them out leaves them to the next ``get`` of any getter, first in line
    (:meth:`gpuring.Receiver.requeue`). With several getters, one that takes ahead
    leaves the others less to take meanwhile.

    As with torch's queue, the other side may come and go: ``get`` waits (polling every
    few ms) while no process is putting, and ``put`` while every getter has left.
    """

    def __init__(
        self,
        name: Optional[str] = None,
        maxsize: int = 0,
        *,
        capacity: Optional[int] = None,
        slots: int = 8,
        slot_bytes: Optional[int] = None,
        device: Optional[int] = None,
        max_senders: int = 16,
        ready: Optional[str] = None,
        large_slots: Optional[int] = None,
        prefetch: int = 1,
    ) -> None:
        self._setup(
            name, maxsize, capacity, slots, slot_bytes, device, max_senders, ready, large_slots
        )
        self._prefetch = _prefetch_count(prefetch)
        self._ch = Channel.create(name=self._name, **self._options)

    @classmethod
    def open_or_create(
        cls,
        name: str,
        maxsize: int = 0,
        *,
        capacity: Optional[int] = None,
        slots: int = 8,
        slot_bytes: Optional[int] = None,
        device: Optional[int] = None,
        max_senders: int = 16,
        ready: Optional[str] = None,
        large_slots: Optional[int] = None,
        prefetch: int = 1,
    ) -> "Queue":
        """The queue ``name`` if its channel exists (with what waits in it), else a new one
        made with these options: what processes that meet by name call (each of them, in
        any order; one creates it), and what a restarted process calls to take up its
        queue again. The options are :class:`Queue`'s; an existing queue keeps its own
        ring and each putter its slots, but ``maxsize``, ``device``, ``ready`` and
        ``large_slots`` are this process's."""
        q = cls.__new__(cls)
        q._setup(
            name, maxsize, capacity, slots, slot_bytes, device, max_senders, ready, large_slots
        )
        q._prefetch = _prefetch_count(prefetch)
        q._ch = Channel.open_or_create(name=name, **q._options)
        return q

    def _setup(self, name, maxsize, capacity, slots, slot_bytes, device, max_senders, ready, large):
        if name is None:
            name = "gpuring-queue-%d-%s" % (os.getpid(), secrets.token_hex(4))
        if capacity is None:
            capacity = _next_pow2(maxsize) if maxsize > 0 else 256
        if large is not None and large < 1:
            raise ValueError("large_slots must be at least 1")
        # No slot size asked for: a putter's slots follow its first item (`_sender`).
        self._fit = slot_bytes is None
        if slot_bytes is None:
            slot_bytes = 1 << 20
        self._name = name
        self._maxsize = maxsize if maxsize > 0 else capacity
        self._device = device
        self._ready = ready
        self._large = large
        self._init_local()
        self._options = dict(
            capacity=capacity,
            slots=slots,
            slot_bytes=slot_bytes,
            device=device,
            mpmc=True,
            max_senders=max_senders,
            ready=ready,
        )

    def _init_local(self):
        self._gen = _forks[0]
        self._lock = threading.Lock()
        self._ch = None
        self._tx = None
        self._txs = None  # _Senders: self._tx first
        self._rx = None
        self._big = {}  # size -> _Big: this process's channels for large items
        self._big_rx = {}  # name -> _Big: putters' large-item channels, opened here
        # Items a get took ahead (`prefetch`), in order: (copy, message, stream, device),
        # the message held until its item is handed out; (None, message, ...) for one not
        # yet unpacked; (error, None, ...) for an error met taking ahead, raised in its
        # turn. Given back by `close` or at exit (`_give_back`, registered at the first
        # take-ahead).
        self._ahead = collections.deque()
        self._ahead_back = None

    def __getstate__(self):
        return {
            "name": self._name,
            "device": self._device,
            "ready": self._ready,
            "maxsize": self._maxsize,
            "large": self._large,
            "fit": self._fit,
            "prefetch": self._prefetch,
        }

    def __setstate__(self, state):
        self._name = state["name"]
        self._device = state["device"]
        self._ready = state.get("ready")
        self._maxsize = state["maxsize"]
        self._large = state.get("large")
        self._fit = state.get("fit", False)
        self._prefetch = state.get("prefetch", 1)
        self._init_local()

    def _here(self):
        """In a forked child, leaves what the parent made to the parent (its lock too, which
        the fork may have copied held) and starts afresh; then the lock."""
        if self._gen != _forks[0]:
            _inherited.append((self._ch, self._txs, self._rx, self._big, self._big_rx, self._ahead))
            self._init_local()
        return self._lock

    def _channel(self):
        """The queue's channel, opened here on first use (the lock held)."""
        if self._ch is None:
            self._ch = Channel.open(
                self._name, device=self._device, timeout=10.0, ready=self._ready
            )
        return self._ch

    def _endpoint(self, which, need=0):
        with self._here():
            ch = self._channel()
            if which == "tx":
                if self._tx is None:
                    self._tx = self._sender(ch, need)
                    self._txs = _Senders(ch, self._tx)
                return self._tx
            if self._rx is None:
                self._rx = self._ch.receiver()
            return self._rx

    def _sender(self, ch, need):
        """This process's sender, for a first item of ``need`` bytes (0: an object): with
        the channel's slots or, where the queue fits putters' slots to their items and
        this one is larger, with ``large_slots`` slots of its size's power of two."""
        if self._fit and need > ch.slot_bytes:
            count = self._large or (2 if self._device is None else 4)
            return ch.sender(slots=count, slot_bytes=_next_pow2(need))
        return ch.sender()

    @property
    def name(self) -> str:
        """The name of the channel under the queue."""
        return self._name

    def put(self, obj: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Queues ``obj``: a torch tensor, a numpy array, or any picklable object holding
        them (a tuple, a dict, a dataclass, a state dict, ...). Every tensor and array is
        copied into one slot of this process's pool (none of their bytes is pickled); the
        rest of the object travels beside them: tuples, lists, dicts, ``None``, numbers,
        strings and bytes described without pickle, anything else pickled (see
        :meth:`gpuring.Sender.send_object`).

        An item larger than a slot goes too: through a second channel of this process,
        made on first need with ``large_slots`` slots (by default 2, 4 on a GPU) of the next
        power of two (at least twice ``slot_bytes``) and kept for later items of that size,
        while a small message in the queue tells the getter where to take it.

        Waits up to ``timeout`` seconds (forever if ``None``; not at all if ``block`` is
        false) for a free slot and room; raises :class:`gpuring.Full` (a ``queue.Full``).
        An object that cannot be pickled raises :class:`gpuring.PicklingError` before
        anything is queued.
        """
        kind = _kind(obj)
        tx = self._tx
        if tx is None or self._gen != _forks[0]:
            tx = self._endpoint("tx", 0 if kind == _OBJECT else _nbytes(obj))
        roomy = tx.free_slots
        if not roomy:
            # Another of this process's senders may have one (or be made: getters keep items).
            tx = self._txs.roomy()
            roomy = tx.free_slots
        packed = None
        timeout, start = _started(timeout)
        if block and roomy:
            # The common cases: one call, which waits for room up to `timeout` itself.
            try:
                if kind == _OBJECT:
                    return tx.send_object(obj, timeout=timeout, tag=_OBJECT)
                if _nbytes(obj) <= tx.slot_bytes:
                    return tx.send(obj, timeout=timeout, tag=kind)
            except TooLarge:
                packed = _objects.Packed(obj, self._device)  # the loop puts it aside
            except Timeout as e:
                raise Full(str(e)) from None
            except (Disconnected, PeerDead):
                pass  # no getter: the loop below waits for one
        if packed is not None:
            need = packed.total
        else:
            need = 0 if kind == _OBJECT else _nbytes(obj)
        until = _Until(timeout if block else 0, start)
        txs = self._txs
        while True:
            try:
                if kind == _OBJECT and packed is None:
                    try:
                        # A plain tree goes without pickle; anything else pickled.
                        return txs.send(
                            until, lambda s, t: s.send_object(obj, timeout=t, tag=_OBJECT)
                        )
                    except TooLarge:
                        packed = _objects.Packed(obj, self._device)
                        need = packed.total
                if packed is not None or need > tx.slot_bytes:
                    # (An object is packed here only once `send_object` found it too large.)
                    return self._put_big(obj, kind, packed, need, until)
                return txs.send(until, lambda s, t: s.send(obj, timeout=t, tag=kind))
            except Timeout as e:
                raise Full(str(e)) from None
            except (Disconnected, PeerDead):
                # Every getter left: wait for one to come (torch's queue takes the put).
                if not until.pause():
                    raise

    def _put_big(self, obj, kind, packed, need, until):
        """Puts an item larger than a slot through this process's channel for its size,
        and a message naming it into the queue."""
        size = max(_next_pow2(need), 2 * self._tx.slot_bytes)
        big = self._big_sender(size)
        # The queue's slot first (nothing sent if none comes in time), then the item, then
        # the message that names it: once the item went, that message waits for room as
        # long as it takes, so that no item is left without one.
        note = self._txs.send(until, lambda s, t: s.lease((0,), "uint8", timeout=t, tag=_BIG))
        try:
            note.header = big.name.encode()
            if packed is not None:
                big.end.send(until, lambda s, t: packed.send(s, t, _OBJECT))
            else:
                big.end.send(until, lambda s, t: s.send(obj, timeout=t, tag=kind))
        except BaseException:
            note.cancel()
            raise
        note.send(None)

    def _big_sender(self, size):
        big = self._big.get(size)
        if big is None:
            name = "%s.big%d.%d" % (self._name, os.getpid(), size.bit_length() - 1)
            ch = Channel.open_or_create(
                name,
                slots=self._large or (2 if self._device is None else 4),
                slot_bytes=size,
                device=self._device,
                mpmc=True,
                ready=self._ready,
            )
            big = self._big[size] = _Big(name, ch, _Senders(ch, ch.sender()))
        return big

    def _get_big(self, name, copy):
        """The item a ``_BIG`` message names: the next one in that channel."""
        rx = self._big_rx.get(name)
        if rx is None:
            ch = Channel.open(name, device=self._device, timeout=10.0, ready=self._ready)
            rx = self._big_rx[name] = _Big(name, ch, ch.receiver())
        # The item went before the message that names it, so it is there (or, with several
        # getters, one of the same putter's is).
        return self._unpack(rx.end.recv(), copy)

    def get(self, block: bool = True, timeout: Optional[float] = None, *, copy: bool = True) -> Any:
        """Removes an item from the queue and returns it, as it was put: a tensor (a torch
        tensor if a torch tensor was put, or the queue is on a GPU), an array, or the
        object with its tensors and arrays, each on the device it was put from (on a GPU
        queue, CUDA tensors on this process's ``device``: a getter on another GPU than
        the putter's reads the slot over the link and gets its copies on its own GPU).

        Waits up to ``timeout`` seconds (forever if ``None``; not at all if ``block`` is
        false); raises :class:`gpuring.Empty` (a ``queue.Empty``). ``copy=False``
        returns zero-copy views of the slot, which goes back when every view is freed:
        no copy (on a GPU queue, one GPU submission less: some 10 µs of CPU under MPS).
        A putter whose getters keep more than half of its slots so gets another pool of as
        many slots rather than waiting, up to 8 pools (then its ``put`` waits for a slot).
        On a GPU queue the views are the putting process's memory: keep that process alive
        while you use them (its exit waits up to 10 s for them), as with torch's queue.

        An item is the queue's until ``get`` returns it: a consumer killed inside ``get``
        leaves it to another consumer. With ``copy=False``, one killed while it still holds
        the views leaves it to another consumer too (which may then see an item the dead one
        had acted on).
        """
        rx = self._rx
        if rx is None or self._gen != _forks[0]:
            rx = self._endpoint("rx")
        if self._ahead:
            return self._hand_out(copy)
        timeout, start = _started(timeout)
        if block:
            # The common case: one call, which waits up to `timeout` itself.
            try:
                return self._take(rx.recv(timeout=timeout), copy)
            except Timeout as e:
                raise Empty(str(e)) from None
            except (Disconnected, PeerDead):
                pass  # no putter (or a large item's died): the loop below waits for one
        until = _Until(timeout if block else 0, start)
        while True:
            try:
                return self._take(rx.recv(timeout=until.left()), copy)
            except Timeout as e:
                raise Empty(str(e)) from None
            except (Disconnected, PeerDead) as e:
                # Every putter left (or died) and everything was taken (a large item's
                # putter died before its item went): the queue is empty until a putter
                # comes, as with torch's queue.
                if not until.pause():
                    raise Empty(str(e)) from None

    def _take(self, msg, copy):
        """The item a message of the queue carries, or names (a large item); with
        ``prefetch``, a GPU tensor's copy made together with those of the tensors already
        waiting behind it, which this getter hands out next."""
        if self._prefetch > 1 and copy and msg.tag == _TORCH and msg.device is not None:
            try:
                more = self._rx.recv_ready(self._prefetch - 1)
            except (Disconnected, PeerDead):
                more = []  # nothing waits behind it (the next get sees the same)
            except Error as e:
                # Met after this item: this get returns the item, the get that reaches the
                # error raises it.
                self._ahead.append((e, None, 0, 0))
                more = []
            if more:
                return self._take_ahead(msg, more)
        if msg.tag != _BIG:
            return self._unpack(msg, copy)
        with msg:
            name = msg.header.decode()
        return self._get_big(name, copy)

    def _take_ahead(self, first, more):
        """``first``'s tensor, copied in one launch with those of the run of GPU tensors
        that follows it in ``more``; the copies and the rest of ``more`` wait in
        ``_ahead`` (their messages held: this getter's until handed out)."""
        run = [first]
        for m in more:
            if m.tag != _TORCH or m.device != first.device:
                break
            run.append(m)
        rest = more[len(run) - 1 :]
        device = first.device
        if self._ahead_back is None:
            # Not lost if this process closes the queue, or exits, before handing them out:
            # multiprocessing's finalizers run at the exit of its children too (which end
            # in os._exit, past atexit), and at the main process's.
            self._ahead_back = util.Finalize(
                self, _give_back, args=(self._ahead, self._rx), exitpriority=10
            )
        try:
            made = copies(run)
        except BaseException:
            # Every one still this getter's to hand out, one by one, `first` first.
            self._ahead.appendleft((None, first, 0, 0))
            self._ahead.extend((None, m, 0, 0) for m in more)
            raise
        stream = _current_stream(device)
        self._ahead.extend((t, m, stream, device) for t, m in zip(made[1:], run[1:]))
        self._ahead.extend((None, m, 0, 0) for m in rest)
        first.release()
        return made[0]

    def _hand_out(self, copy):
        """The next item taken ahead."""
        made, msg, stream, device = self._ahead.popleft()
        if msg is None:
            raise made  # an error the take-ahead met after the items before it
        if made is None:
            return self._take(msg, copy)
        if _current_stream(device) != stream:
            # Copied on another stream than the caller's now: this one waits for the copy,
            # and the copy's memory is not reused before this stream's reads of it.
            torch = sys.modules["torch"]
            ext = torch.cuda.ExternalStream(stream, device=device)
            here = torch.cuda.current_stream(device)
            here.wait_stream(ext)
            made.record_stream(here)
        msg.release()  # its slot goes back after the copy (its stream orders that)
        return made

    @staticmethod
    def _unpack(msg, copy):
        try:
            tag = msg.tag
            if tag == _TORCH or (tag != _OBJECT and msg.device is not None):
                out = msg.torch()
                return out.clone() if copy else out
            if tag == _OBJECT:
                return msg.object(copy)
            import numpy

            out = numpy.from_dlpack(msg)
            return out.copy() if copy else out
        finally:
            msg.release()

    def get_nowait(self) -> Any:
        """``get(block=False)``."""
        return self.get(block=False)

    def qsize(self) -> int:
        """Items put and not yet taken, now (a snapshot, as ``multiprocessing``'s)."""
        with self._here():
            return len(self._channel()) + sum(m is not None for _, m, _, _ in self._ahead)

    def empty(self) -> bool:
        """Whether no item waits now (a snapshot)."""
        return self.qsize() == 0

    def full(self) -> bool:
        """Whether the queue holds ``maxsize`` items (or, without one, as many as its
        ring has cells) now (a snapshot)."""
        return self.qsize() >= self._maxsize

    def close(self) -> None:
        """Leaves the channel from this process (the queue goes away once no process has
        it open and nothing is queued)."""
        with self._lock:
            if self._gen == _forks[0]:
                if self._ahead_back is not None:
                    self._ahead_back()  # what was taken ahead goes back first
                    self._ahead_back = None
                bigs = list(self._big.values()) + list(self._big_rx.values())
                ends = [self._txs, self._rx, self._ch] + [b.end for b in bigs]
                for end in ends + [b.ch for b in bigs]:
                    if end is not None:
                        end.close()
            self._ch = self._tx = self._txs = self._rx = None
            self._big, self._big_rx = {}, {}

    def join_thread(self) -> None:
        """Nothing to join: gpuring has no feeder thread (kept for compatibility)."""

    def cancel_join_thread(self) -> None:
        """Nothing to cancel (kept for compatibility)."""

    def __repr__(self):
        place = "host" if self._device is None else "cuda:%d" % self._device
        return "Queue(%r, %s)" % (self._name, place)


class SimpleQueue(Queue):
    """A drop-in for ``torch.multiprocessing.SimpleQueue``: a :class:`Queue` with no size
    bound of its own (the ring's 256 cells) whose ``get`` and ``put`` wait as long as it
    takes. The options are :class:`Queue`'s."""

    def __init__(self, name: Optional[str] = None, **options: Any) -> None:
        super().__init__(name, **options)

    def put(self, obj: Any) -> None:  # type: ignore[override]
        """Queues ``obj`` (see :meth:`Queue.put`), waiting for room as long as it takes."""
        super().put(obj)

    def get(self, *, copy: bool = True) -> Any:  # type: ignore[override]
        """Removes an item and returns it (see :meth:`Queue.get`), waiting for one as long
        as it takes."""
        return super().get(copy=copy)
