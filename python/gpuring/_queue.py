"""gpuring.Queue: a drop-in for ``torch.multiprocessing.Queue`` of tensors."""

import os
import secrets
import threading
import time
from typing import Any, Optional

from ._gpuring import Channel
from .errors import Disconnected, Empty, Full, PeerDead, Timeout

# What a message's tag says the sender put in (a Queue owns its channel's tags).
_NUMPY = 0
_TORCH = 1

# Endpoints a forked child inherited from its parent: never used, never dropped (dropping
# them in the child would act on the parent's behalf).
_inherited = []


class _Until:
    """A ``timeout=`` as a deadline, and the pauses of a wait that polls (while the peers
    of the other side are all gone, a channel answers at once instead of waiting)."""

    def __init__(self, timeout):
        self._end = None if timeout is None else time.monotonic() + timeout
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

    Each putting process owns ``slots`` slots of ``slot_bytes`` bytes (the largest
    tensor a ``put`` takes; by default 8 of 1 MiB, as for a channel: larger tensors need a
    larger ``slot_bytes``, and host queues that much room in ``/dev/shm`` per putting
    process); ``maxsize`` (or ``capacity``) bounds the messages in flight.
    ``get`` returns a copy by default, so that slots go back at once; ``copy=False``
    returns a zero-copy view that holds its slot until the tensor is freed.

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
        slot_bytes: int = 1 << 20,
        device: Optional[int] = None,
        max_senders: int = 16,
        ready: Optional[str] = None,
    ) -> None:
        if name is None:
            name = "gpuring-queue-%d-%s" % (os.getpid(), secrets.token_hex(4))
        if capacity is None:
            capacity = _next_pow2(maxsize) if maxsize > 0 else 256
        self._name = name
        self._device = device
        self._ready = ready
        self._init_local()
        self._ch = Channel.create(
            name,
            capacity=capacity,
            slots=slots,
            slot_bytes=slot_bytes,
            device=device,
            mpmc=True,
            max_senders=max_senders,
            ready=ready,
        )

    def _init_local(self):
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._ch = None
        self._tx = None
        self._rx = None

    def __getstate__(self):
        return {"name": self._name, "device": self._device, "ready": self._ready}

    def __setstate__(self, state):
        self._name = state["name"]
        self._device = state["device"]
        self._ready = state.get("ready")
        self._init_local()

    def _endpoint(self, which):
        if self._pid != os.getpid():
            # A forked child: what the parent made is the parent's.
            _inherited.append((self._ch, self._tx, self._rx))
            self._init_local()
        with self._lock:
            if self._ch is None:
                self._ch = Channel.open(
                    self._name, device=self._device, timeout=10.0, ready=self._ready
                )
            if which == "tx":
                if self._tx is None:
                    self._tx = self._ch.sender()
                return self._tx
            if self._rx is None:
                self._rx = self._ch.receiver()
            return self._rx

    @property
    def name(self) -> str:
        """The name of the channel under the queue."""
        return self._name

    def put(self, obj: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Copies ``obj`` (a torch tensor or a numpy array) into a slot and queues it.

        Waits up to ``timeout`` seconds (forever if ``None``; not at all if ``block`` is
        false) for a free slot and room; raises :class:`gpuring.Full` (a ``queue.Full``).
        """
        tx = self._endpoint("tx")
        tag = _TORCH if type(obj).__module__.split(".")[0] == "torch" else _NUMPY
        until = _Until(timeout if block else 0)
        while True:
            try:
                return tx.send(obj, timeout=until.left(), tag=tag)
            except Timeout as e:
                raise Full(str(e)) from None
            except (Disconnected, PeerDead):
                # Every getter left: wait for one to come (torch's queue takes the put).
                if not until.pause():
                    raise

    def put_nowait(self, obj: Any) -> None:
        """``put(obj, block=False)``."""
        self.put(obj, block=False)

    def get(self, block: bool = True, timeout: Optional[float] = None, *, copy: bool = True) -> Any:
        """Removes a tensor from the queue and returns it: a torch tensor if a torch
        tensor was put (or the queue is on a GPU), else a numpy array.

        Waits up to ``timeout`` seconds (forever if ``None``; not at all if ``block`` is
        false); raises :class:`gpuring.Empty` (a ``queue.Empty``). ``copy=False``
        returns a zero-copy view of the slot, which goes back when the view is freed.
        """
        rx = self._endpoint("rx")
        until = _Until(timeout if block else 0)
        while True:
            try:
                msg = rx.recv(timeout=until.left())
                break
            except Timeout as e:
                raise Empty(str(e)) from None
            except (Disconnected, PeerDead) as e:
                # Every putter left (or died) and everything was taken: the queue is
                # empty until a putter comes, as with torch's queue.
                if not until.pause():
                    raise Empty(str(e)) from None
        with msg:
            if msg.tag == _TORCH or msg.device is not None:
                out = msg.torch()
                return out.clone() if copy else out
            import numpy

            out = numpy.from_dlpack(msg)
            return out.copy() if copy else out

    def get_nowait(self) -> Any:
        """``get(block=False)``."""
        return self.get(block=False)

    def close(self) -> None:
        """Leaves the channel from this process (the queue goes away once no process has
        it open and nothing is queued)."""
        with self._lock:
            for end in (self._tx, self._rx, self._ch):
                if end is not None and self._pid == os.getpid():
                    end.close()
            self._ch = self._tx = self._rx = None

    def join_thread(self) -> None:
        """Nothing to join: gpuring has no feeder thread (kept for compatibility)."""

    def cancel_join_thread(self) -> None:
        """Nothing to cancel (kept for compatibility)."""

    def __repr__(self):
        place = "host" if self._device is None else "cuda:%d" % self._device
        return "Queue(%r, %s)" % (self._name, place)
