"""Objects that hold tensors, as one message: :meth:`Sender.send_object` and
:meth:`Message.object`, and what ``Queue`` puts and gets.

Every torch tensor and numpy array inside the object (in tuples, lists, dicts,
dataclasses, any picklable object) is copied into one slot of the sender's pool, 256-byte
aligned, one after another; the rest of the object is pickled (protocol 5) with each of
them replaced by a small reference (kind, dtype, shape, offset, device). The pickle travels
in the slot's header, host memory beside the slot (4096 bytes; a longer pickle goes at the
end of the slot and the header says where). So a whole state dict is one message: one
descriptor, one ready signal, one release.

The receiver unpickles the header; each reference becomes a view of the slot (zero-copy,
holding the slot until every view is gone) or part of one copy of the whole payload, on
the device it left from. A
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

from ._gpuring import SLOT_HEADER_SIZE
from .errors import Corrupted, CudaError, PicklingError, TooLarge

# The first four bytes of an object message's header: the pickle follows (inline), or
# it lies in the slot at (offset, length) given by two little-endian u64 (spilled).
_INLINE = b"GRO1"
_SPILLED = b"GRS1"
_ALIGN = 256

# Reference kinds, the first item of each persistent id.
_NDARRAY = 0
_TENSOR = 1


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Packer(pickle.Pickler):
    """Pickles an object with each tensor and array replaced by a reference to its place
    in the slot; collects (object, offset) to copy once the slot is leased."""

    def __init__(self, file, device):
        super().__init__(file, protocol=5)
        self.device = device  # the channel's GPU, or None for host slots
        self.parts = []  # (tensor or array, offset, nbytes)
        self.seen = {}  # id(obj) -> reference, for a tensor met twice
        self.end = 0
        self.torch = sys.modules.get("torch")
        self.numpy = sys.modules.get("numpy")

    def _place(self, obj, nbytes):
        off = _align(self.end)
        self.end = off + nbytes
        self.parts.append((obj, off, nbytes))
        return off

    def persistent_id(self, obj):
        ref = self.seen.get(id(obj))
        if ref is not None:
            return ref
        torch, np = self.torch, self.numpy
        if torch is not None and isinstance(obj, torch.Tensor):
            ref = self._tensor(obj, torch)
        elif np is not None and type(obj) is np.ndarray and not obj.dtype.hasobject:
            off = self._place(obj, obj.nbytes)
            ref = (_NDARRAY, obj.dtype, obj.shape, off)
        else:
            return None
        if ref is not None:
            # `parts` keeps the object alive while its id is a key here.
            self.seen[id(obj)] = ref
        return ref

    def _tensor(self, t, torch):
        if t.layout != torch.strided or t.is_quantized or t.device.type not in ("cpu", "cuda"):
            return None  # torch pickles these itself (their bytes inside the pickle)
        if t.device.type == "cuda":
            dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
            if self.device is not None and dev != self.device:
                raise CudaError(
                    "a tensor of the object is on cuda:%d, the channel's slots on cuda:%d: "
                    "move it there first" % (dev, self.device)
                )
        else:
            dev = -1
        nbytes = t.numel() * t.element_size()
        off = self._place(t, nbytes)
        param = isinstance(t, torch.nn.Parameter)
        return (_TENSOR, t.dtype, tuple(t.shape), off, dev, bool(t.requires_grad), param)


def _pickle(obj, device):
    buf = io.BytesIO()
    p = _Packer(buf, device)
    try:
        p.dump(obj)
    except (CudaError, TooLarge):
        raise
    except Exception as e:  # pickle raises many kinds (TypeError, AttributeError, ...)
        raise PicklingError("the object cannot be pickled: %s: %s" % (type(e).__name__, e)) from e
    return buf.getvalue(), p.parts, p.end


def _bytes_of_ndarray(np, a):
    a = np.ascontiguousarray(a)
    if not a.flags.writeable:
        a = a.copy()  # torch.from_numpy wants a writable array
    return a.reshape(-1).view(np.uint8)


class Packed:
    """An object pickled for one slot: its pickle, the tensors and arrays to copy (with
    their offsets), and the bytes the slot must hold."""

    __slots__ = ("data", "parts", "header", "total", "spill", "device")

    def __init__(self, obj, device):
        self.device = device
        self.data, self.parts, end = _pickle(obj, device)
        if len(self.data) + 4 <= SLOT_HEADER_SIZE:
            self.header, self.total, self.spill = _INLINE + self.data, end, None
        else:
            self.spill = _align(end)
            self.total = self.spill + len(self.data)
            self.header = _SPILLED + struct.pack("<QQ", self.spill, len(self.data))

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
            _fill(lease, self.parts, self.data, self.spill, self.device)
            lease.header = self.header
            lease.send(timeout)
        except BaseException:
            lease.cancel()
            raise


def send(tx, obj, timeout=None, tag=0, device=None):
    """Packs ``obj`` into one slot of ``tx``'s pool and sends it (see the module's doc).
    ``device``: the channel's GPU (None: host slots)."""
    Packed(obj, device).send(tx, timeout, tag)


def _fill(lease, parts, data, spill, device):
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    tbase = nbase = None
    if device is not None:
        tbase = lease.torch()  # a CUDA uint8 view, on torch's current stream
    dsts, srcs = [], []
    for obj, off, n in parts:
        if n == 0:
            continue
        if torch is not None and isinstance(obj, torch.Tensor):
            if tbase is None:
                tbase = lease.torch()
            dsts.append(tbase[off : off + n].view(obj.dtype).view(obj.shape))
            srcs.append(obj)
            continue
        # A numpy array.
        if device is None:
            if nbase is None:
                nbase = np.from_dlpack(lease)
            np.copyto(nbase[off : off + n], _bytes_of_ndarray(np, obj))
        else:
            dsts.append(tbase[off : off + n])
            srcs.append(torch.from_numpy(_bytes_of_ndarray(np, obj)))
    if dsts:
        with torch.no_grad():
            if len(dsts) == 1:
                dsts[0].copy_(srcs[0])
            else:
                torch._foreach_copy_(dsts, srcs)  # one call (and launch, where it can) for all
    if spill is not None:
        raw = bytearray(data)
        if device is None and (np is not None or torch is None):
            import numpy

            if nbase is None:
                nbase = numpy.from_dlpack(lease)
            nbase[spill : spill + len(raw)] = numpy.frombuffer(raw, dtype=numpy.uint8)
        else:
            if tbase is None:
                tbase = lease.torch()
            tbase[spill : spill + len(raw)].copy_(torch.frombuffer(raw, dtype=torch.uint8))


class _Loader(pickle.Unpickler):
    """Unpickles an object message's pickle; each reference becomes a view of the slot or
    a copy, on the device it left from."""

    def __init__(self, file, msg, copy):
        super().__init__(file)
        self.msg = msg
        self.copy = copy
        self.tbase = None
        self.nbase = None
        self.made = {}  # reference -> object, for a tensor met twice

    # With ``copy``, the whole payload is copied once (one copy, however many parts) and
    # the parts are views of that copy.
    def _torch_base(self):
        if self.tbase is None:
            if self.copy and self.msg.device is None and "numpy" in sys.modules:
                import torch

                self.tbase = torch.from_numpy(self._numpy_base())
            else:
                self.tbase = self.msg.torch()
                if self.copy:
                    self.tbase = self.tbase.clone()
        return self.tbase

    def _numpy_base(self):
        if self.nbase is None:
            import numpy

            self.nbase = numpy.from_dlpack(self.msg)
            if self.copy:
                self.nbase = self.nbase.copy()
        return self.nbase

    def persistent_load(self, ref):
        made = self.made.get(ref)
        if made is not None:
            return made
        if not isinstance(ref, tuple) or not ref or ref[0] not in (_NDARRAY, _TENSOR):
            raise Corrupted("an object message holds an unknown reference")
        out = self._tensor(ref) if ref[0] == _TENSOR else self._ndarray(ref)
        self.made[ref] = out
        return out

    def _span(self, off, n):
        if not (isinstance(off, int) and 0 <= off and off + n <= self.msg.nbytes):
            raise Corrupted("an object message names bytes outside its slot")
        return off, off + n

    def _ndarray(self, ref):
        import numpy as np

        _, dtype, shape, off = ref
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        a, b = self._span(off, n)
        if self.msg.device is None:
            return self._numpy_base()[a:b].view(dtype).reshape(shape)
        # Sent through GPU slots: back to host memory.
        return self._torch_base()[a:b].cpu().numpy().view(dtype).reshape(shape)

    def _tensor(self, ref):
        import torch

        _, dtype, shape, off, dev, requires_grad, param = ref
        numel = 1
        for d in shape:
            numel *= d
        n = numel * dtype.itemsize
        a, b = self._span(off, n)
        v = self._torch_base()[a:b].view(dtype).view(shape)
        if self.msg.device is None and dev >= 0:
            v = v.to("cuda:%d" % dev)  # a host queue carried a CUDA tensor
        elif self.msg.device is not None and dev < 0:
            v = v.cpu()  # a CPU tensor carried through GPU slots
        if param:
            return torch.nn.Parameter(v, requires_grad=requires_grad)
        if requires_grad and v.is_floating_point():
            v.requires_grad_(True)
        return v


def load(msg, copy=False):
    """The object an object message carries (see the module's doc). ``copy``: tensors and
    arrays are copies (the slot may go back at once) instead of views of the slot."""
    header = msg.header
    kind = header[:4]
    if kind == _INLINE:
        data = memoryview(header)[4:]
    elif kind == _SPILLED and len(header) == 20:
        off, n = struct.unpack_from("<QQ", header, 4)
        if off + n > msg.nbytes:
            raise Corrupted("an object message's pickle lies outside its slot")
        if msg.device is None and "torch" not in sys.modules:
            import numpy

            data = numpy.from_dlpack(msg)[off : off + n].tobytes()
        else:
            data = msg.torch()[off : off + n].cpu().numpy().tobytes()
    else:
        raise Corrupted("the message is not an object message (its header is not one)")
    return _Loader(io.BytesIO(data), msg, copy).load()
