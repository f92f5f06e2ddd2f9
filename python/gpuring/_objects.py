"""Objects that hold tensors, as one message: :meth:`Sender.send_object` and
:meth:`Message.object`, and what ``Queue`` puts and gets.

Every torch tensor and numpy array inside the object (in tuples, lists, dicts,
dataclasses, any picklable object) is copied into one slot of the sender's pool, 256-byte
aligned, one after another; the rest of the object is pickled (protocol 5) with each of
them replaced by its index in a table (kind, offset, dtype, shape, device), pickled beside
it. Both travel in the slot's header, host memory beside the slot (4096 bytes; longer ones
go at the end of the slot and the header says where). So a whole state dict is one message: one
descriptor, one ready signal, one release.

The receiver unpickles the header; each reference becomes a view of the slot (zero-copy,
holding the slot until every view is gone) or part of one copy of the whole payload: a
CUDA tensor through host slots on the device index it left from, through GPU slots on the
receiver's GPU (which may be another than the sender's: it reads the slot over the link);
a CPU tensor or an array in host memory. A
tensor that appears twice in the object (tied weights) travels once and comes back as
one tensor.

Unpickling runs code the sender chose: only processes that can open the channel (the same
user, as ``/dev/shm`` permissions say) can send into it, the trust ``multiprocessing``'s
queues ask for too.
"""

import io
import pickle
import struct
import sys

from ._gpuring import SLOT_HEADER_SIZE, DTypeError, torch_views
from ._gpuring import dtypes as _dtype_names
from .errors import Corrupted, CudaError, PicklingError, TooLarge

# The first four bytes of an object message's header: what follows is the blob (inline),
# or two little-endian u64, where the blob lies in the slot and its length (spilled). The
# blob: a little-endian u32 n, n bytes of the object's pickle, then the table's pickle.
_INLINE = b"GRO2"
# A plain tree's header (tuples, lists, dicts, scalars and tensors only: no pickle; the
# extension's tree.rs writes and reads it).
_TREE = b"GRT1"
_SPILLED = b"GRS2"
_ALIGN = 256

# Table entries: (_TENSOR, offset, dtype, shape, device (-1: CPU), requires_grad,
# is a Parameter) and (_NDARRAY, offset, numpy dtype, shape). A tensor's dtype is its name
# where gpuring carries it (views made in one call), else the torch dtype itself.
_NDARRAY = 0
_TENSOR = 1

# Types pickle handles itself, skipped at once by the reference hook.
_PLAIN = frozenset((str, int, float, bool, type(None), tuple, list, dict, bytes, complex))
_names = {}


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _torch_name(torch, dtype):
    """gpuring's name of a torch dtype, or None where gpuring does not carry it."""
    if not _names:
        for n in _dtype_names():
            d = getattr(torch, n, None)
            if d is not None:
                _names[d] = n
    return _names.get(dtype)


class _Packer(pickle.Pickler):
    """Pickles an object with each tensor and array replaced by its index in the table;
    collects (object, offset, bytes) to copy once the slot is leased."""

    def __init__(self, file, device):
        super().__init__(file, protocol=5)
        self.device = device  # the channel's GPU, or None for host slots
        self.parts = []  # (tensor or array, offset, nbytes)
        self.table = []
        self.index = {}  # id(obj) -> its index, for a tensor met twice
        self.end = 0
        self.torch = sys.modules.get("torch")
        self.numpy = sys.modules.get("numpy")

    def _place(self, obj, nbytes):
        off = _align(self.end)
        self.end = off + nbytes
        self.parts.append((obj, off, nbytes))
        return off

    def persistent_id(self, obj):
        if type(obj) in _PLAIN:
            return None
        k = self.index.get(id(obj))
        if k is not None:
            return k
        torch, np = self.torch, self.numpy
        if torch is not None and isinstance(obj, torch.Tensor):
            entry = self._tensor(obj, torch)
        elif np is not None and type(obj) is np.ndarray and not obj.dtype.hasobject:
            entry = (_NDARRAY, self._place(obj, obj.nbytes), obj.dtype, obj.shape)
        else:
            return None
        if entry is None:
            return None
        k = len(self.table)
        self.table.append(entry)
        self.index[id(obj)] = k  # `parts` keeps obj alive while its id is a key here
        return k

    def _tensor(self, t, torch):
        # Properties and methods in C only (no torch.device made): this runs per tensor.
        if t.layout is not torch.strided or t.is_quantized:
            return None  # torch pickles these itself (their bytes inside the pickle)
        if t.is_cuda:
            dev = t.get_device()
            if self.device is not None and dev != self.device:
                raise CudaError(
                    "a tensor of the object is on cuda:%d, the channel's slots on cuda:%d: "
                    "move it there first" % (dev, self.device)
                )
        elif t.is_cpu:
            dev = -1
        else:
            return None  # another device: torch pickles it
        off = self._place(t, t.nbytes)
        dt = t.dtype
        dtype = _torch_name(torch, dt) or dt
        param = type(t) is not torch.Tensor and isinstance(t, torch.nn.Parameter)
        return (_TENSOR, off, dtype, tuple(t.shape), dev, t.requires_grad, param)


class Packed:
    """An object pickled for one slot: the header, the tensors and arrays to copy (with
    their offsets), and the bytes the slot must hold."""

    __slots__ = ("blob", "parts", "header", "total", "spill", "device")

    def __init__(self, obj, device):
        self.device = device
        buf = io.BytesIO()
        buf.write(b"\0\0\0\0")
        p = _Packer(buf, device)
        try:
            p.dump(obj)
            n = buf.tell() - 4
            buf.write(pickle.dumps(p.table, protocol=5))
        except (CudaError, TooLarge):
            raise
        except Exception as e:  # pickle raises many kinds (TypeError, AttributeError, ...)
            raise PicklingError(
                "the object cannot be pickled: %s: %s" % (type(e).__name__, e)
            ) from e
        blob = buf.getbuffer()
        struct.pack_into("<I", blob, 0, n)
        self.parts = p.parts
        if len(blob) + 4 <= SLOT_HEADER_SIZE:
            self.header, self.total, self.spill, self.blob = _INLINE + blob, p.end, None, None
        else:
            self.spill = _align(p.end)
            self.total = self.spill + len(blob)
            self.header = _SPILLED + struct.pack("<QQ", self.spill, len(blob))
            self.blob = bytes(blob)

    def send(self, tx, timeout=None, tag=0):
        """Leases a slot of ``tx``, copies the parts into it and sends it."""
        if self.total > tx.slot_bytes:
            raise TooLarge(
                "the object needs %d bytes (its tensors and arrays%s), a slot holds %d: "
                "make the channel with a larger slot_bytes"
                % (
                    self.total,
                    " and its pickle" if self.spill is not None else "",
                    tx.slot_bytes,
                )
            )
        lease = tx.lease((self.total,), "uint8", timeout=timeout, tag=tag)
        try:
            _fill(lease, self.parts, self.blob, self.spill, self.device)
            lease.header = self.header
            lease.send(timeout)
        except BaseException:
            lease.cancel()
            raise


def send(tx, obj, timeout=None, tag=0, device=None):
    """Packs ``obj`` into one slot of ``tx``'s pool and sends it (see the module's doc).
    ``device``: the channel's GPU (None: host slots)."""
    Packed(obj, device).send(tx, timeout, tag)


def _bytes_of_ndarray(np, a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _fill(lease, parts, blob, spill, device=None):
    """Copies each part into the lease at its offset, and the spilled pickle after them.
    Into GPU slots (``device``), the CUDA tensors go in one ``copy_in_many`` call (one
    kernel launch per 64 of those on the slot's device, against a driver copy of some 5 µs
    of CPU each); the rest one ``copy_in`` each."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    many = []  # (tensor, offset): CUDA tensors for the one call
    for obj, off, n in parts:
        if n == 0:
            continue
        if torch is not None and isinstance(obj, torch.Tensor):
            if device is not None and obj.is_cuda and _torch_name(torch, obj.dtype) is not None:
                many.append((obj, off))
            else:
                _copy_tensor(lease, obj, off, n, torch)
        else:
            lease.copy_in(_bytes_of_ndarray(np, obj), off)
    if many:
        lease.copy_in_many(many)
    if spill is not None:
        if np is not None:
            lease.copy_in(np.frombuffer(blob, dtype=np.uint8), spill)
        else:
            lease.copy_in(torch.frombuffer(bytearray(blob), dtype=torch.uint8), spill)


def _copy_tensor(lease, t, off, n, torch):
    """One tensor into the lease: one driver copy, or torch's for a dtype DLPack does not
    carry (as bytes of the slot)."""
    try:
        lease.copy_in(t, off)
    except DTypeError:
        view = lease.torch()[off : off + n].view(t.dtype).view(t.shape)
        with torch.no_grad():
            view.copy_(t)


class _Loader(pickle.Unpickler):
    """Unpickles an object message's pickle, each index in the table its tensor or array."""

    def __init__(self, file, made):
        super().__init__(file)
        self.made = made

    def persistent_load(self, k):
        if type(k) is not int or not 0 <= k < len(self.made):
            raise Corrupted("an object message holds an unknown reference")
        return self.made[k]


def _payload_bytes(msg, off, n):
    if msg.device is None and "torch" not in sys.modules:
        import numpy

        return numpy.from_dlpack(msg)[off : off + n].tobytes()
    return msg.torch_views([(off, "uint8", (n,))])[0].cpu().numpy().tobytes()


def _rebuild(msg, table, copy):
    """Each table entry as a tensor or array of the message (views, or views of one copy
    of the payload), on the device it was sent from."""
    if type(table) is not list:
        raise Corrupted("an object message's table is not a list")
    made = [None] * len(table)
    fast, fast_at, slow_at, arrays_at = [], [], [], []
    for k, e in enumerate(table):
        if type(e) is not tuple or not e or e[0] not in (_NDARRAY, _TENSOR):
            raise Corrupted("an object message's table holds an unknown entry")
        if type(e[1]) is not int or e[1] < 0:
            raise Corrupted("an object message's table holds a bad offset")
        if e[0] == _NDARRAY:
            arrays_at.append(k)
        elif type(e[2]) is str:
            fast.append((e[1], e[2], e[3]))
            fast_at.append(k)
        else:
            slow_at.append(k)
    host = msg.device is None
    tbase = nbase = None
    if arrays_at and host:
        import numpy

        nbase = numpy.from_dlpack(msg)
        if copy:
            nbase = nbase.copy()
    if fast or slow_at:
        import torch

        if copy:
            # One copy of the whole payload; the parts are views of it.
            if host and nbase is not None:
                tbase = torch.from_numpy(nbase)
            else:
                tbase = msg.torch().clone()
        views = torch_views(tbase, fast) if copy else msg.torch_views(fast)
        for k, v in zip(fast_at, views):
            made[k] = _settle(torch, v, table[k], host)
        for k in slow_at:
            _, off, dtype, shape = table[k][:4]
            base = tbase if tbase is not None else msg.torch()
            n = 1
            for d in shape:
                n *= d
            n *= dtype.itemsize
            if off + n > msg.nbytes:
                raise Corrupted("an object message names bytes outside its slot")
            v = base[off : off + n].view(dtype).view(shape)
            made[k] = _settle(torch, v, table[k], host)
    for k in arrays_at:
        _, off, dtype, shape = table[k]
        n = dtype.itemsize
        for d in shape:
            n *= d
        if off + n > msg.nbytes:
            raise Corrupted("an object message names bytes outside its slot")
        if host:
            made[k] = nbase[off : off + n].view(dtype).reshape(shape)
        else:
            raw = msg.torch_views([(off, "uint8", (n,))])[0].cpu().numpy()
            made[k] = raw.view(dtype).reshape(shape)  # through GPU slots: back to the host
    return made


def _settle(torch, v, entry, host):
    """A tensor view moved to the device it was sent from, its autograd flags restored."""
    _, _, _, _, dev, requires_grad, param = entry
    if host and dev >= 0:
        v = v.to("cuda:%d" % dev)  # a host queue carried a CUDA tensor
    elif not host and dev < 0:
        v = v.cpu()  # a CPU tensor carried through GPU slots
    if param:
        return torch.nn.Parameter(v, requires_grad=requires_grad)
    if requires_grad and v.is_floating_point():
        v.requires_grad_(True)
    return v


def load(msg, copy=False):
    """The object an object message carries (see the module's doc). ``copy``: tensors and
    arrays are views of one copy of the payload (the slot may go back at once) instead of
    views of the slot."""
    header = msg.header
    kind = header[:4]
    if kind == _TREE:
        return msg.object(copy)  # the form without pickle, read by the extension
    if kind == _INLINE:
        blob = memoryview(header)[4:]
    elif kind == _SPILLED and len(header) == 20:
        off, n = struct.unpack_from("<QQ", header, 4)
        if off + n > msg.nbytes:
            raise Corrupted("an object message's pickle lies outside its slot")
        blob = memoryview(_payload_bytes(msg, off, n))
    else:
        raise Corrupted("the message is not an object message (its header is not one)")
    if len(blob) < 4:
        raise Corrupted("an object message's header is cut short")
    (n,) = struct.unpack_from("<I", blob, 0)
    if 4 + n > len(blob):
        raise Corrupted("an object message's header is cut short")
    made = _rebuild(msg, pickle.loads(blob[4 + n :]), copy)
    return _Loader(io.BytesIO(blob[4 : 4 + n]), made).load()
