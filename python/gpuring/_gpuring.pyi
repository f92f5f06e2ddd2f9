"""Type stubs of the extension module (the classes are re-exported by ``gpuring``)."""

import builtins
import pickle
import queue
from types import TracebackType
from typing import Any, Iterator, Optional, Sequence, Tuple, Union, final

from typing_extensions import TypeAlias

__all__ = [
    "SLOT_HEADER_SIZE",
    "torch_views",
    "copies",
    "Channel",
    "Sender",
    "Lease",
    "Receiver",
    "Message",
    "cuda_available",
    "ipc_opens",
    "dtypes",
    "clean",
    "MAX_DIMS",
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

MAX_DIMS: int
SLOT_HEADER_SIZE: int

# A dtype argument: a name ("float32", "bfloat16", ...), a numpy dtype or scalar type, or a
# torch dtype.
_DTypeLike: TypeAlias = Any
# A shape argument: a sequence of ints, or one int.
_ShapeLike: TypeAlias = Union[int, Sequence[int]]
# A CUDA stream argument: None (torch's current stream if torch is imported, else the
# legacy default stream), a raw cudaStream_t as an int, or an object with `.cuda_stream`.
_StreamLike: TypeAlias = Any

def cuda_available() -> bool:
    """Whether a CUDA driver is present and initialises here."""

def ipc_opens() -> int:
    """CUDA IPC handles this process has opened: once per pool, never per message."""

def dtypes() -> list[str]:
    """The element type names gpuring carries."""

def clean(prefix: str, queued: bool = False, dry_run: bool = False) -> list[Tuple[str, str]]:
    """Removes the segments in ``/dev/shm`` that no process has open and whose names start
    with ``prefix`` (what ``gpuring clean`` does): channels left by a crash with nothing
    queued, their pools, pools whose channel is gone; with ``queued``, also channels
    nobody has open although messages wait in them (dropped). A segment in use is never
    removed. Returns ``(name, why)`` of each removed (or, with ``dry_run``, of each it
    would remove); ``why`` is ``"left-over"``, ``"queued"``, ``"orphaned-pool"``,
    ``"never-initialized"``, ``"other-version"`` or ``"unreadable"``."""

def torch_views(base: Any, parts: list[Tuple[int, Any, Any]]) -> list[Any]:
    """Torch tensors viewing ``parts`` (byte offset, dtype, shape) of tensor ``base``."""

def copies(msgs: Sequence[Message]) -> list[Any]:
    """Torch copies of the payloads of GPU messages (received on torch's current stream),
    made by one kernel launch: views of one new allocation of torch's current stream;
    release the messages after."""

@final
class Channel:
    """A named channel: a descriptor ring in shared memory and one slot pool per sender."""

    @staticmethod
    def create(
        name: str,
        capacity: int = 256,
        slots: int = 8,
        slot_bytes: int = ...,
        device: Optional[int] = None,
        mpmc: bool = False,
        max_senders: Optional[int] = None,
        redeliver: bool = True,
        replace_stale: bool = False,
        pinned: bool = False,
        ready: Optional[str] = None,
        broadcast: bool = False,
        lagging: bool = False,
    ) -> Channel:
        """Creates channel ``name`` (exclusively). ``device=None``: host slots.
        ``broadcast``: one sender, and receivers that each get every message sent while
        they are attached, reading the one slot in place (a slot goes back once every one
        of them released it; the slowest holds the sender back). ``lagging``: broadcast
        channels; the sender never waits for a receiver that is behind (it reuses the
        slot of the oldest message nobody holds; such a receiver gets :class:`Lagged`, then
        the oldest message left).
        ``redeliver``: a message whose receiver died holding it goes to the next receiver,
        marked :attr:`Message.redelivered` (``False``: it is dropped).
        ``pinned``: host channels; this process's pools are registered with CUDA, so that
        copies between CUDA tensors and slots are asynchronous DMA. ``ready``: GPU
        channels; how this process's senders signal a sent tensor: ``"flag"`` (a flag in
        shared memory written by the sender's stream; ``recv`` returns once the receiving
        CPU has seen it), ``"event"`` (the receiver's stream waits on an IPC event), or
        ``None`` (the default: ``"flag"`` where the GPU can). Defaults: 8 slots of 1 MiB
        per sender, as in Rust; bigger tensors need a bigger ``slot_bytes``."""

    @staticmethod
    def open_or_create(
        name: str,
        capacity: int = 256,
        slots: int = 8,
        slot_bytes: int = ...,
        device: Optional[int] = None,
        mpmc: bool = False,
        max_senders: Optional[int] = None,
        redeliver: bool = True,
        pinned: bool = False,
        ready: Optional[str] = None,
        broadcast: bool = False,
        lagging: bool = False,
    ) -> Channel:
        """Opens channel ``name`` if it exists (with what waits in it, its creator dead or
        alive), else creates it with these options: what a process that may be restarted
        calls. Of several callers at once, one creates it."""

    @staticmethod
    def open(
        name: str,
        device: Optional[int] = None,
        timeout: Optional[float] = 1.0,
        pinned: bool = False,
        ready: Optional[str] = None,
    ) -> Channel:
        """Opens channel ``name``, waiting up to ``timeout`` s for it (default 1; None: as
        long as it takes). ``pinned``, ``ready``: as for :meth:`create`, for this process."""

    def sender(
        self,
        spins: Optional[int] = None,
        yields: Optional[int] = None,
        *,
        slots: Optional[int] = None,
        slot_bytes: Optional[int] = None,
    ) -> Sender:
        """A new sender, with its own slot pool (``spins`` / ``yields``: how it waits;
        ``slots`` / ``slot_bytes``: its pool's, where not the channel's)."""

    def receiver(self, spins: Optional[int] = None, yields: Optional[int] = None) -> Receiver:
        """A new receiver; a wait spins ``spins`` times (default: 2048 or 30 µs of them,
        whichever ends first), yields ``yields`` times (default 8), then sleeps
        (``spins=2**32 - 1``: never); after waits that slept longer than 100 µs it spins a
        quarter as much, down to 64, until a shorter one earns the spins back. A receive from a
        ``ready="flag"`` sender waits for the flag the same way, spinning at least 4096
        times, then napping (4 µs naps at first) instead of sleeping."""

    def close(self) -> None:
        """Lets go of this handle."""

    def __len__(self) -> int:
        """Messages sent and not yet received, now (a snapshot)."""

    @property
    def closed(self) -> bool: ...
    @property
    def name(self) -> str: ...
    @property
    def device(self) -> Optional[int]: ...
    @property
    def mpmc(self) -> bool: ...
    @property
    def broadcast(self) -> bool: ...
    @property
    def lagging(self) -> bool: ...
    @property
    def capacity(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def max_senders(self) -> int: ...
    @property
    def redelivers(self) -> bool:
        """Whether a message whose receiver died holding it is delivered again."""
    @property
    def ready(self) -> Optional[str]:
        """``"event"`` or ``"flag"``: how this process's senders signal (None: host)."""
    def __enter__(self) -> Channel: ...
    def __exit__(self, *args: object) -> bool: ...

@final
class Sender:
    """The sending end of a channel, with its own pool of slots."""

    def send(
        self,
        tensor: Any,
        timeout: Optional[float] = None,
        tag: int = 0,
        header: Optional[bytes] = None,
    ) -> None:
        """Copies ``tensor`` (anything with ``__dlpack__``) into a slot and sends it, with
        ``header`` (up to ``SLOT_HEADER_SIZE`` bytes) beside it."""

    def send_object(self, obj: Any, timeout: Optional[float] = None, tag: int = 0) -> None:
        """Sends any picklable object as one message: its tensors and arrays in one slot,
        the rest beside them (tuples, lists, dicts and scalars described by the extension,
        anything else pickled; :meth:`Message.object` rebuilds it)."""

    def lease(
        self,
        shape: _ShapeLike,
        dtype: _DTypeLike,
        timeout: Optional[float] = None,
        tag: int = 0,
        stream: _StreamLike = None,
    ) -> Lease:
        """Leases a slot to fill in place (zero-copy); sent when its ``with`` block exits."""

    def close(self) -> None:
        """Leaves the channel once no lease of this sender is left."""

    @property
    def closed(self) -> bool: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def free_slots(self) -> int: ...
    @property
    def slot_count(self) -> int: ...
    @property
    def held_slots(self) -> int: ...
    def __enter__(self) -> Sender: ...
    def __exit__(self, *args: object) -> bool: ...

@final
class Lease:
    """A leased slot: a writable DLPack view, sent by ``send()`` or at the end of ``with``."""

    def send(self, timeout: Optional[float] = None) -> None: ...
    def cancel(self) -> None: ...
    def copy_in(self, src: Any, offset: int = 0) -> None:
        """Copies ``src`` (anything with ``__dlpack__``) into the slot at byte ``offset``."""

    def copy_in_many(self, parts: list[tuple[Any, int]]) -> None:
        """Copies each ``(src, offset)`` into the slot (CUDA tensors into a GPU slot: one
        kernel launch per 64)."""

    def __enter__(self) -> Lease: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        _exc: Optional[BaseException] = None,
        _tb: Optional[TracebackType] = None,
    ) -> bool: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def torch(self) -> Any:
        """The slot as a writable torch tensor (a zero-copy view, as
        ``torch.from_dlpack(lease)``, ordered on torch's current stream), at a fraction of
        the cost. Not to be used after the lease is sent."""

    def torch_views(self, parts: list[Tuple[int, Any, Any]]) -> list[Any]:
        """Writable torch tensors viewing ``parts`` (byte offset, dtype, shape) of the slot."""

    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    tag: int
    header: bytes
    @property
    def done(self) -> bool: ...

@final
class Receiver:
    """The receiving end of a channel; iterating receives until every sender left."""

    def recv(self, timeout: Optional[float] = None, stream: _StreamLike = None) -> Message:
        """Receives a message: a zero-copy view of the sender's slot."""

    def recv_ready(self, max: int) -> list[Message]:
        """The messages already waiting, up to ``max``, taken without waiting."""

    def requeue(self, msg: Message) -> None:
        """Puts ``msg`` (received here, no views alive) back in the channel: the next
        receive of any receiver gets it first, marked ``redelivered``."""

    def __iter__(self) -> Iterator[Message]: ...
    def __next__(self) -> Message: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Receiver: ...
    def __exit__(self, *args: object) -> bool: ...

@final
class Message:
    """A received tensor: ``torch.from_dlpack(msg)`` / ``np.from_dlpack(msg)`` view it."""

    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def torch(self) -> Any:
        """The payload as a torch tensor (a zero-copy view, as ``torch.from_dlpack(msg)``,
        ordered on the stream the message was received on), at a sixth of the cost."""

    def torch_views(self, parts: list[Tuple[int, Any, Any]]) -> list[Any]:
        """Torch tensors viewing ``parts`` (byte offset, dtype, shape) of the payload."""

    def object(self, copy: bool = False) -> Any:
        """The object a :meth:`Sender.send_object` message carries, its tensors and arrays
        views of the slot (or copies)."""

    def release(self) -> None:
        """Lets go of the slot (it goes back once no view of it is left). Nothing waits
        for the GPU here: the sender's next write of the slot comes after the reads queued
        on the stream the message was received on (a broadcast channel's: after every
        receiver's)."""

    def __enter__(self) -> Message: ...
    def __exit__(self, *args: builtins.object) -> bool: ...
    @property
    def released(self) -> bool: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def tag(self) -> int: ...
    @property
    def redelivered(self) -> bool:
        """Whether a receiver that died holding this message had it before."""
    @property
    def header(self) -> bytes: ...
    @property
    def device(self) -> Optional[int]: ...

# The exceptions (re-exported by ``gpuring.errors``; see there for what each means).
class Error(Exception): ...
class Timeout(Error, TimeoutError): ...
class Empty(Timeout, queue.Empty): ...
class Full(Timeout, queue.Full): ...
class PeerDead(Error): ...
class Disconnected(Error): ...
class SenderGone(Error): ...

class Lagged(Error):
    missed: int

class Corrupted(Error): ...
class ShmError(Error, OSError): ...
class NotFound(ShmError, FileNotFoundError): ...
class AlreadyExists(ShmError, FileExistsError): ...
class NoSpace(ShmError): ...
class AttachError(Error): ...
class ConfigError(Error, ValueError): ...
class WrongBackend(ConfigError): ...
class DTypeError(Error, TypeError): ...
class TooLarge(Error, ValueError): ...
class Closed(Error, ValueError): ...
class CudaError(Error): ...
class PicklingError(Error, pickle.PicklingError): ...
