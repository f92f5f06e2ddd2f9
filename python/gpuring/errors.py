"""gpuring's exceptions: one base class, :class:`Error`, and one subclass per kind of failure.

The classes are defined by the extension (``gpuring._gpuring``), which raises them
directly; this module names them. Each carries the message of the Rust error it stands
for. Where a built-in exception means the same, the class is also one of those, so code
that catches ``TimeoutError``, ``FileNotFoundError``, ``ValueError`` or ``TypeError`` keeps
working::

    try:
        msg = rx.recv(timeout=0.5)
    except gpuring.Timeout:          # also a TimeoutError
        ...
    except gpuring.Disconnected:     # every sender left and everything was received
        ...
"""

from ._gpuring import (
    AlreadyExists,
    AttachError,
    Closed,
    ConfigError,
    Corrupted,
    CudaError,
    Disconnected,
    DTypeError,
    Empty,
    Error,
    Full,
    Lagged,
    NoSpace,
    NotFound,
    PeerDead,
    PicklingError,
    SenderGone,
    ShmError,
    Timeout,
    TooLarge,
    WrongBackend,
)

__all__ = [
    "Error",
    "Timeout",
    "Empty",
    "Full",
    "PeerDead",
    "Disconnected",
    "SenderGone",
    "Lagged",
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
    "PicklingError",
]
