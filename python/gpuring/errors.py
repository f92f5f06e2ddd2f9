"""gpuring's exceptions: one base class, :class:`Error`, and one subclass per kind of failure.

Each carries the message of the Rust error it stands for. Where a built-in exception means
the same, the class is also one of those, so code that catches ``TimeoutError``,
``FileNotFoundError``, ``ValueError`` or ``TypeError`` keeps working::

    try:
        msg = rx.recv(timeout=0.5)
    except gpuring.Timeout:          # also a TimeoutError
        ...
    except gpuring.Disconnected:     # every sender left and everything was received
        ...
"""

import queue as _queue

__all__ = [
    "Error",
    "Timeout",
    "Empty",
    "Full",
    "PeerDead",
    "Disconnected",
    "SenderGone",
    "Corrupted",
    "ShmError",
    "NotFound",
    "AlreadyExists",
    "NoSpace",
    "AttachError",
    "ConfigError",
    "WrongBackend",
    "DTypeError",
    "TooLarge",
    "Closed",
    "CudaError",
]


class Error(Exception):
    """Base class of every gpuring error."""


class Timeout(Error, TimeoutError):
    """A blocking call gave up at its timeout (nothing was sent or received)."""


class Empty(Timeout, _queue.Empty):
    """``Queue.get``: nothing arrived in time (also a ``queue.Empty``, as
    ``torch.multiprocessing.Queue`` raises)."""


class Full(Timeout, _queue.Full):
    """``Queue.put``: no slot or ring room in time (also a ``queue.Full``)."""


class PeerDead(Error):
    """Every peer this call waits for has died (noticed within ~30 ms of waiting).

    A receiver gets it once everything the dead senders published has been received; a
    sender, when the ring is full and every receiver has died.
    """


class Disconnected(Error):
    """Every peer left cleanly: for a receiver, every sender left and everything they sent
    was received (the channel's end, seen at once); for a sender, every receiver left.

    Not for ever: a peer that attaches later makes the channel work again.
    """


class SenderGone(Error):
    """GPU channels: the message's sender left, and its device memory with it; the message
    was dropped unread. The next ``recv`` carries on."""


class Corrupted(Error):
    """A value read from shared memory is impossible (a corrupt segment, or a descriptor
    that does not match its pool). A bad descriptor is dropped; the next ``recv`` carries
    on."""


class ShmError(Error, OSError):
    """A shared-memory segment could not be created or opened: not a gpuring channel, of
    another owner, of another layout version, and the like."""


class NotFound(ShmError, FileNotFoundError):
    """No channel of this name exists (within the open timeout)."""


class AlreadyExists(ShmError, FileExistsError):
    """``Channel.create``: a channel (or another object) of this name exists."""


class NoSpace(ShmError):
    """``/dev/shm`` (or memory) cannot hold the slots asked for; checked and reserved at
    create, never a crash later."""


class AttachError(Error):
    """An endpoint could not attach: the one sender or receiver of an SPSC channel is
    taken by a live process, or every participant entry is in use."""


class ConfigError(Error, ValueError):
    """An option is out of range (capacity, slots, slot size, name, max_senders, ...), or
    the pool table is full (raise ``max_senders``)."""


class WrongBackend(ConfigError):
    """The channel keeps its slots elsewhere than asked: ``device=None`` opened a GPU
    channel, or ``device=N`` a host one."""


class DTypeError(Error, TypeError):
    """A tensor or array whose element type gpuring does not carry, or an object that is
    neither a tensor nor an array (no ``__dlpack__``)."""


class TooLarge(Error, ValueError):
    """A tensor spans more bytes than a slot holds (or more dimensions than 8)."""


class Closed(Error, ValueError):
    """The channel, sender, receiver, lease or message was closed (or sent, or released)
    by this process, and cannot be used any more."""


class CudaError(Error):
    """A CUDA driver call failed, or there is no CUDA driver here."""
