"""gpuring: hand torch tensors and numpy arrays from one process to another on the same
machine, with no pickle and at most one copy (none with a lease).

A lock-free ring in POSIX shared memory carries a 384-byte descriptor per message; the
payload sits in a slot of the sender's pool (host shared memory, or GPU memory shared by
CUDA IPC), and the receiver gets a zero-copy view of it through DLPack::

    import gpuring, torch

    # producer process
    ch = gpuring.Channel.create("frames", slots=8, slot_bytes=64 << 20, device=0)
    tx = ch.sender()
    tx.send(torch.randn(3, 1024, 1024, device="cuda"))       # one device-to-device copy

    # consumer process
    ch = gpuring.Channel.open("frames", device=0)
    rx = ch.receiver()
    with rx.recv() as msg:
        t = torch.from_dlpack(msg)                            # zero-copy, stream-ordered
        print(t.sum())

:class:`Queue` (and :class:`SimpleQueue`) is a drop-in for ``torch.multiprocessing.Queue``:
any picklable object, its tensors and arrays carried in slots, the rest beside them
(containers and scalars without pickle, other objects pickled). Errors are
subclasses of :class:`gpuring.Error` (module :mod:`gpuring.errors`). numpy and torch are
optional: gpuring imports neither unless handed their objects.
"""

from . import errors
from ._gpuring import (
    MAX_DIMS,
    SLOT_HEADER_SIZE,
    Channel,
    Lease,
    Message,
    Receiver,
    Sender,
    clean,
    copies,
    cuda_available,
    dtypes,
    ipc_opens,
)
from ._queue import Queue, SimpleQueue
from .errors import *  # noqa: F403 (the exception classes: errors.__all__)

__version__ = "0.1.0"

__all__ = [
    "MAX_DIMS",
    "SLOT_HEADER_SIZE",
    "Channel",
    "Sender",
    "Receiver",
    "Lease",
    "Message",
    "Queue",
    "SimpleQueue",
    "clean",
    "copies",
    "cuda_available",
    "dtypes",
    "ipc_opens",
    "errors",
]
__all__ += errors.__all__
