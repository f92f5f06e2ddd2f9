//! `gpuring.Sender` and `gpuring.Lease`: copying a tensor into a slot and sending it, or
//! leasing a slot to fill in place.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cudarc::driver::CudaStream;
use gpuring::{
    AcquireTimeoutError, Backend, Cuda, Host, Lease, Pinned, SendTimeoutError, Sender, TensorMeta,
    TryAcquireError, TrySendError, WaitPolicy,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};

use crate::blocking::{Step, Until, lock_for, wait};
use crate::channel::AnyChannel;
use crate::dlpack::{self, DEVICE_CPU, DEVICE_CUDA, Place, Source};
use crate::dtypes;
use crate::errors::{Class, ClassOf, Raised, closed, raise, tag_arg};
use crate::gpu::{self, Dir, Gpu};

/// Reads `obj` (a tensor or array) for a copy, a CUDA one in the order of torch's current
/// stream on its device; with that stream's raw handle where one was asked for.
fn read_source<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Source<'py>, Option<usize>)> {
    let mut asked: Option<usize> = None;
    let src = Source::read(obj, &mut |device| {
        let raw = gpu::current_stream(py, device)?;
        asked = Some(raw);
        Ok(gpu::dlpack_stream(raw))
    })?;
    Ok((src, asked))
}

/// Copies `src` (a CUDA one read in the order of stream `asked` where given, else of
/// torch's current stream on its device) into
/// `lease` at byte `offset`, which the caller checked it fits at: a host copy; device to
/// host by the driver (done when the call returns: into pageable memory by the driver's
/// staging, into a pinned slot by a wait here); into a GPU slot, on the lease's stream
/// after the source's.
pub(crate) fn copy_into(
    py: Python<'_>,
    tx: &TxShared,
    lease: &mut AnyLease,
    offset: u64,
    src: &Source<'_>,
    asked: Option<usize>,
) -> PyResult<()> {
    let (ptr, n) = (src.ptr as u64, src.meta.nbytes() as usize);
    match (lease, src.place) {
        (AnyLease::Cuda(l, _), place) => {
            let g = tx.gpu.as_ref().expect("a GPU lease comes from a GPU channel");
            let dir = match place {
                Place::Cuda(d) if d != g.ordinal => return Err(wrong_gpu(py, d, g)),
                Place::Cuda(_) => Dir::DeviceToDevice,
                Place::Host => Dir::HostToDevice,
            };
            if let Place::Cuda(d) = place {
                // Read in the order of the stream it was asked for on, or torch's current
                // one (no-op when that is the lease's).
                let raw = match asked {
                    Some(raw) => raw,
                    None => gpu::current_stream(py, d)?,
                };
                g.join(l.cuda_stream(), &g.stream(raw)).map_err(|e| e.err(py))?;
            }
            g.copy(dir, l.device_ptr() + offset, ptr, n, l.cuda_stream()).map_err(|e| e.err(py))
        }
        (host, Place::Host) => {
            let dst = host.host_ptr().expect("host memory") as usize + offset as usize;
            // SAFETY: `n` bytes at `ptr` belong to the source, which `src` keeps alive; the
            // slot holds `offset + n` bytes (checked by the caller) and is ours alone, so the
            // two do not overlap.
            py.detach(|| unsafe {
                std::ptr::copy_nonoverlapping(ptr as usize as *const u8, dst as *mut u8, n)
            });
            Ok(())
        }
        (host, Place::Cuda(d)) => {
            let dst = host.host_ptr().expect("host memory") as u64 + offset;
            let pinned = matches!(host, AnyLease::Pinned(_));
            let g = tx.source_gpu(py, d)?;
            let raw = match asked {
                Some(raw) => raw,
                None => gpu::current_stream(py, d)?,
            };
            let stream = g.stream(raw);
            g.copy(Dir::DeviceToHost, dst, ptr, n, &stream).map_err(|e| e.err(py))?;
            if pinned {
                g.synchronize(&stream).map_err(|e| e.err(py))?;
            }
            Ok(())
        }
    }
}

/// Copies the CUDA sources of the GPU slot's device among `parts` (each fits the lease at
/// its offset: the caller checked) into `lease` by one kernel launch per 64, after the
/// work queued on `raw` (torch's current stream on that device, which they were read in
/// the order of): true when it did (the caller copies the others), false when it did
/// nothing (a host lease, fewer than two such sources, or a driver that refuses the
/// kernel: the caller copies them one by one).
pub(crate) fn gather_into<'a, 'py: 'a>(
    py: Python<'_>,
    tx: &TxShared,
    lease: &AnyLease,
    parts: impl Iterator<Item = (&'a Source<'py>, u64)>,
    raw: usize,
) -> PyResult<bool> {
    let (AnyLease::Cuda(l, _), Some(g)) = (lease, &tx.gpu) else { return Ok(false) };
    let base = l.device_ptr();
    let copies: Vec<_> = parts
        .filter(|(s, _)| s.place == Place::Cuda(g.ordinal))
        .map(|(s, off)| (s.ptr as u64, base + off, s.meta.nbytes()))
        .collect();
    if copies.len() < 2 {
        return Ok(false);
    }
    g.join(l.cuda_stream(), &g.stream(raw)).map_err(|e| e.err(py))?;
    g.gather(&copies, l.cuda_stream()).map_err(|e| e.err(py))
}

/// `CudaError`: a tensor on GPU `d`, for a channel whose slots are on `g`.
fn wrong_gpu(py: Python<'_>, d: i32, g: &Gpu) -> PyErr {
    gpu_mismatch(py, d, g.ordinal)
}

/// `CudaError`: a tensor on GPU `d`, for a channel whose slots are on GPU `slots`.
pub(crate) fn gpu_mismatch(py: Python<'_>, d: i32, slots: i32) -> PyErr {
    let msg = format!(
        "the tensor is on cuda:{d}, the channel's slots on cuda:{slots}: move it there first"
    );
    raise(py, Class::CudaError, msg)
}

/// `gpuring._objects.send`, looked up once.
static OBJECTS_SEND: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A sender of any backend (a GPU sender's device is `TxShared::gpu`).
pub(crate) enum AnySender {
    Host(Sender<Host>),
    Pinned(Sender<Pinned>),
    Cuda(Sender<Cuda>),
}

/// Runs `$body` with `$s` bound to the sender of whatever backend `$any` holds.
macro_rules! each_sender {
    ($any:expr, $s:ident => $body:expr) => {
        match $any {
            AnySender::Host($s) => $body,
            AnySender::Pinned($s) => $body,
            AnySender::Cuda($s) => $body,
        }
    };
}

/// What a Python sender, its leases and their exported views share: the Rust sender,
/// which (with its pool) lives until the last of them is gone.
pub(crate) struct TxShared {
    tx: Mutex<AnySender>,
    /// GPU channels: the channel's device (`Some` exactly for `AnySender::Cuda`; read
    /// without the lock).
    pub(crate) gpu: Option<Arc<Gpu>>,
    pub(crate) slot_bytes: u64,
    /// Host channels: the GPU a CUDA tensor handed to `send` is on (copied out of it).
    source_gpu: Mutex<Option<Arc<Gpu>>>,
}

impl TxShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, AnySender> {
        self.tx.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `TooLarge` unless `n` bytes fit in a slot (checked before waiting for one).
    fn check_fits(&self, py: Python<'_>, n: u64) -> PyResult<()> {
        if n <= self.slot_bytes {
            return Ok(());
        }
        Err(raise(
            py,
            Class::TooLarge,
            format!(
                "the tensor spans {n} bytes, a slot holds {}: make the channel with a larger \
                 slot_bytes (Channel.create(..., slot_bytes=...), Queue(slot_bytes=...))",
                self.slot_bytes
            ),
        ))
    }

    fn source_gpu(&self, py: Python<'_>, device: i32) -> PyResult<Arc<Gpu>> {
        let mut g = self.source_gpu.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(g) = g.as_ref().filter(|g| g.ordinal == device) {
            return Ok(g.clone());
        }
        let made = Gpu::new(device).map_err(|e| e.err(py))?;
        *g = Some(made.clone());
        Ok(made)
    }
}

/// A leased slot of any backend, with the streams of CUDA views made on other streams
/// than the lease's (the send waits for their writes).
pub(crate) enum AnyLease {
    Host(Lease<Host>),
    Pinned(Lease<Pinned>),
    Cuda(Lease<Cuda>, Vec<Arc<CudaStream>>),
}

impl AnyLease {
    fn set_tag(&mut self, tag: u64) {
        match self {
            AnyLease::Host(l) => l.set_tag(tag),
            AnyLease::Pinned(l) => l.set_tag(tag),
            AnyLease::Cuda(l, _) => l.set_tag(tag),
        }
    }

    /// Writes the header the message carries (host memory beside the slot).
    pub(crate) fn set_header(&mut self, py: Python<'_>, bytes: &[u8]) -> PyResult<()> {
        let r = match self {
            AnyLease::Host(l) => l.set_header(bytes),
            AnyLease::Pinned(l) => l.set_header(bytes),
            AnyLease::Cuda(l, _) => l.set_header(bytes),
        };
        r.map_err(|e| raise(py, Class::TooLarge, e.to_string()))
    }

    /// The header set so far.
    fn header(&mut self) -> Vec<u8> {
        fn of<B: Backend>(l: &mut Lease<B>) -> Vec<u8> {
            let n = l.header_len();
            l.header_mut()[..n].to_vec()
        }
        match self {
            AnyLease::Host(l) => of(l),
            AnyLease::Pinned(l) => of(l),
            AnyLease::Cuda(l, _) => of(l),
        }
    }

    /// The slot's bytes, for a lease of host memory.
    fn host_ptr(&mut self) -> Option<*mut u8> {
        match self {
            AnyLease::Host(l) => Some(l.as_mut_ptr()),
            AnyLease::Pinned(l) => Some(l.as_mut_ptr()),
            AnyLease::Cuda(..) => None,
        }
    }
}

/// One slice of a lease's wait on sender `s`: `None` when it ran out.
fn lease_slice<B: Backend>(
    s: &Sender<B>,
    slice: Option<Duration>,
) -> Option<Result<Lease<B>, Raised>> {
    let Some(slice) = slice else {
        return match s.try_acquire() {
            Err(TryAcquireError::Exhausted) => None,
            r => Some(r.map_err(|e| e.raised())),
        };
    };
    match s.acquire_timeout(slice) {
        Err(AcquireTimeoutError::Timeout) => None,
        r => Some(r.map_err(|e| e.raised())),
    }
}

/// Leases a slot, waiting (in slices, the GIL released) until `until`. For a GPU
/// channel, on the stream with raw handle `raw`.
pub(crate) fn acquire(
    py: Python<'_>,
    tx: &TxShared,
    until: Until,
    raw: usize,
) -> PyResult<AnyLease> {
    let stream = tx.gpu.as_ref().map(|g| g.stream(raw));
    let step = |(), slice: Option<Duration>, _| {
        let Some(mut guard) = lock_for(&tx.tx, slice) else { return Step::Again(()) };
        let got = match (&mut *guard, &stream) {
            (AnySender::Host(s), _) => lease_slice(s, slice).map(|r| r.map(AnyLease::Host)),
            (AnySender::Pinned(s), _) => lease_slice(s, slice).map(|r| r.map(AnyLease::Pinned)),
            (AnySender::Cuda(s), Some(stream)) => {
                if s.cuda_stream().cu_stream() != stream.cu_stream() {
                    s.set_cuda_stream(stream);
                }
                lease_slice(s, slice).map(|r| r.map(|l| AnyLease::Cuda(l, Vec::new())))
            }
            (AnySender::Cuda(_), None) => unreachable!("a GPU sender has its device"),
        };
        got.map_or(Step::Again(()), Step::Done)
    };
    match wait(py, until, (), step)? {
        Ok(r) => r.map_err(|e| e.into_err(py)),
        Err(()) => Err(raise(py, Class::Timeout, "timed out waiting for a free slot")),
    }
}

/// One slice of a send of `lease` on sender `s`: the lease back when the slice ran out.
fn send_slice<B: Backend>(
    s: &Sender<B>,
    lease: Lease<B>,
    meta: TensorMeta,
    slice: Option<Duration>,
) -> Result<(), Result<Lease<B>, Raised>> {
    let Some(slice) = slice else {
        return s.try_send(lease, meta).map_err(|e| match e {
            TrySendError::Full(l) => Ok(l),
            e => Err(e.raised()),
        });
    };
    s.send_timeout(lease, meta, slice).map_err(|e| match e {
        SendTimeoutError::Timeout(l) => Ok(l),
        e => Err(e.raised()),
    })
}

/// Sends `lease` as a tensor of `meta` with `tag`, waiting for room in the ring.
pub(crate) fn send_lease(
    py: Python<'_>,
    tx: &TxShared,
    until: Until,
    mut lease: AnyLease,
    meta: TensorMeta,
    tag: u64,
) -> PyResult<()> {
    lease.set_tag(tag);
    if let (AnyLease::Cuda(l, foreign), Some(g)) = (&mut lease, &tx.gpu) {
        // The ready event is recorded on the lease's stream: make it follow the writes
        // queued on the other streams views were made on.
        for s in foreign.drain(..) {
            g.join(l.cuda_stream(), &s).map_err(|e| e.err(py))?;
        }
    }
    let step = |lease: AnyLease, slice: Option<Duration>, _| {
        let Some(guard) = lock_for(&tx.tx, slice) else { return Step::Again(lease) };
        let r = match (&*guard, lease) {
            (AnySender::Host(s), AnyLease::Host(l)) => {
                send_slice(s, l, meta, slice).map_err(|e| e.map(AnyLease::Host))
            }
            (AnySender::Pinned(s), AnyLease::Pinned(l)) => {
                send_slice(s, l, meta, slice).map_err(|e| e.map(AnyLease::Pinned))
            }
            (AnySender::Cuda(s), AnyLease::Cuda(l, f)) => {
                send_slice(s, l, meta, slice).map_err(|e| e.map(|l| AnyLease::Cuda(l, f)))
            }
            _ => unreachable!("a lease is sent by the sender it came from"),
        };
        match r {
            Ok(()) => Step::Done(Ok(())),
            Err(Ok(lease)) => Step::Again(lease),
            Err(Err(e)) => Step::Done(Err(e)),
        }
    };
    match wait(py, until, lease, step)? {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.into_err(py)),
        Err(_lease) => Err(raise(py, Class::Timeout, "timed out waiting for room in the ring")),
    }
}

/// The sending end of a channel, with its own pool of slots.
///
/// :meth:`send` copies a tensor or array into a slot and sends it (one copy, no pickle);
/// :meth:`lease` hands out a slot to fill in place (no copy at all). Safe to share
/// between threads. The sender leaves the channel at :meth:`close` (or when garbage
/// collected) once no lease of it is left.
#[pyclass(module = "gpuring._gpuring", name = "Sender", frozen)]
pub(crate) struct PySender {
    shared: Mutex<Option<Arc<TxShared>>>,
}

impl PySender {
    /// A sender of `ch` whose pool has `slots` (count, bytes each).
    pub(crate) fn new(
        py: Python<'_>,
        ch: AnyChannel,
        policy: WaitPolicy,
        (count, size): (u32, u64),
    ) -> PyResult<Self> {
        let made = py.detach(|| match &ch {
            AnyChannel::Host(c) => {
                c.sender_with_slots(count, size).map(AnySender::Host).map_err(|e| e.raised())
            }
            AnyChannel::Pinned(c, _) => {
                c.sender_with_slots(count, size).map(AnySender::Pinned).map_err(|e| e.raised())
            }
            AnyChannel::Cuda(c, _) => {
                c.sender_with_slots(count, size).map(AnySender::Cuda).map_err(|e| e.raised())
            }
        });
        let mut tx = made.map_err(|e| e.into_err(py))?;
        let slot_bytes = each_sender!(&mut tx, s => {
            s.set_wait_policy(policy);
            s.slot_size()
        });
        let gpu = match &ch {
            AnyChannel::Cuda(_, g) => Some(g.clone()),
            _ => None,
        };
        let shared = TxShared {
            tx: Mutex::new(tx),
            gpu,
            slot_bytes: slot_bytes as u64,
            source_gpu: Mutex::new(None),
        };
        Ok(PySender { shared: Mutex::new(Some(Arc::new(shared))) })
    }

    fn shared(&self, py: Python<'_>) -> PyResult<Arc<TxShared>> {
        let s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        s.clone().ok_or_else(|| closed(py, "sender"))
    }
}

#[pymethods]
impl PySender {
    /// Copies ``tensor`` (a torch tensor on the CPU or a GPU, a numpy array, or anything
    /// with ``__dlpack__``) into a free slot and sends it; returns once it is in the ring.
    ///
    /// Waits up to ``timeout`` seconds (``None``: as long as it takes; ``0``: not at all)
    /// for a free slot and for room in the ring. ``tag`` is any 64-bit number the
    /// receiver reads back. A tensor that is not C-contiguous is made contiguous first
    /// (one more copy, by its own library).
    ///
    /// GPU channels: the copy is device to device, queued on torch's current stream (the
    /// receiver's stream waits for it on the GPU; this call does not wait for the GPU).
    /// The tensor may be freed or reused at once in torch's stream order. A host tensor
    /// into a GPU channel is copied across. A CUDA tensor into a host channel: one
    /// device-to-host copy into the slot queued on torch's current stream, and the
    /// message is published when that copy is done (this call does not wait for the GPU;
    /// into a channel opened with ``pinned=True`` the copy is asynchronous DMA, into a
    /// plain one the driver makes it synchronous).
    ///
    /// ``header``: up to 4096 bytes that travel beside the tensor, in host memory for
    /// every channel (GPU ones too); the receiver reads them as ``msg.header`` without
    /// touching the payload.
    ///
    /// A :class:`Lease` of this sender is sent as it is, as ``lease.send(timeout)`` would
    /// (``header`` and a non-zero ``tag`` replace its own); another sender's raises
    /// ``ConfigError``.
    ///
    /// Raises ``Timeout``, ``TooLarge``, ``DTypeError``, ``Disconnected`` (every receiver
    /// left), ``PeerDead``, ``Corrupted``, ``CudaError``, ``Closed``.
    #[pyo3(signature = (tensor, timeout=None, tag=0, header=None))]
    fn send(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        #[pyo3(from_py_with = tag_arg)] tag: u64,
        header: Option<&[u8]>,
    ) -> PyResult<()> {
        let until = Until::new(py, timeout)?;
        let tx = self.shared(py)?;
        if let Ok(lease) = tensor.cast::<PyLease>() {
            // A lease of ours goes as it is (no copy into another slot, which would leave it
            // holding its own); another sender's is not ours to send.
            let l = lease.get();
            if !Arc::ptr_eq(&l.tx, &tx) {
                let msg = "the lease is another sender's: send it with lease.send()";
                return Err(raise(py, Class::ConfigError, msg));
            }
            if let Some(h) = header {
                l.set_header(py, h)?;
            }
            if tag != 0 {
                l.set_tag(tag);
            }
            return l.send(py, timeout);
        }
        let channel_gpu = tx.gpu.clone();
        // The stream the tensor is read in order of: torch's current one on its device
        // (asked once: by the DLPack path, or below).
        let (src, asked) = read_source(py, tensor)?;
        let n = src.meta.nbytes();
        tx.check_fits(py, n)?;
        let meta = src.meta;
        // The copy's stream: torch's current one on the tensor's device, or for a host
        // tensor into device slots, on the channel's device.
        let raw_stream = match (asked, src.place, &channel_gpu) {
            (Some(raw), _, _) => raw,
            (None, Place::Cuda(d), _) => gpu::current_stream(py, d)?,
            (None, Place::Host, Some(g)) => gpu::current_stream(py, g.ordinal)?,
            (None, Place::Host, None) => 0,
        };
        match (&channel_gpu, src.place) {
            (Some(g), Place::Cuda(d)) if d != g.ordinal => return Err(wrong_gpu(py, d, g)),
            _ => {}
        }
        if let Some(h) = header
            && h.len() > gpuring::SLOT_HEADER_SIZE
        {
            // Refused before a slot is taken or anything copied.
            return Err(raise(
                py,
                Class::TooLarge,
                gpuring::HeaderTooLarge { len: h.len() }.to_string(),
            ));
        }
        let mut lease = acquire(py, &tx, until, raw_stream)?;
        if let Some(h) = header {
            lease.set_header(py, h)?;
        }
        if let (AnyLease::Pinned(_), Place::Cuda(d)) = (&lease, src.place) {
            // One asynchronous DMA copy into the pinned slot on torch's stream, published by
            // a lane thread when it is done: no host wait.
            let AnyLease::Pinned(mut l) = lease else { unreachable!("matched above") };
            let s = tx.source_gpu(py, d)?.stream(raw_stream);
            let ptr = src.ptr as u64;
            l.set_tag(tag);
            let tx_ref: &TxShared = &tx;
            let sent = py.detach(move || {
                let guard = tx_ref.lock();
                let AnySender::Pinned(sender) = &*guard else {
                    unreachable!("a pinned lease comes from a pinned sender")
                };
                // SAFETY: `n` bytes at `ptr` belong to the CUDA tensor, read in the order of
                // torch's current stream `s`, after which torch may reuse its memory (the
                // copy is queued there first).
                unsafe { sender.send_from_device_on(l, ptr, meta, &s) }
                    .map_err(|e| SendTimeoutError::from(e).raised())
            });
            drop(src);
            return sent.map_err(|e| e.into_err(py));
        }
        // The lease is on `raw_stream`, which a CUDA source was read in the order of.
        copy_into(py, &tx, &mut lease, 0, &src, Some(raw_stream))?;
        drop(src);
        send_lease(py, &tx, until, lease, meta, tag)
    }

    /// Sends ``obj``, any picklable object holding torch tensors (CPU or CUDA) and numpy
    /// arrays anywhere inside it (tuples, lists, dicts, dataclasses, ...), as one
    /// message: every tensor and array is copied into one slot, the rest is pickled
    /// beside it (the receiver's :meth:`Message.object` rebuilds it). A whole state dict
    /// is one message, one wait and one release. The slot must hold the tensors
    /// together (each 256-byte aligned): ``TooLarge`` otherwise, before anything is sent.
    ///
    /// A *plain* object (``None``, bools, 64-bit ints, floats, strings, bytes, tuples,
    /// lists and dicts of them, with torch tensors as leaves: ``(time.time(), t)``, a
    /// dict of tensors and ints) whose description fits the header's 4096 bytes is not
    /// pickled at all: the extension writes it, in one call, as the header beside the
    /// tensors (several times faster; ``msg.header[:4] == b"GRT1"``). Anything else (a
    /// dataclass, a numpy array, a namedtuple or ``OrderedDict``, a list met twice) is
    /// pickled as above; both arrive the same way.
    ///
    /// GPU channels: CUDA tensors (of the channel's GPU) are copied device to device on
    /// torch's current stream, CPU tensors and arrays across; a CUDA tensor of another
    /// GPU raises ``CudaError``. Host channels: CUDA tensors are copied to the host.
    ///
    /// Raises ``PicklingError`` (nothing sent), ``TooLarge``, ``Timeout``,
    /// ``Disconnected``, ``PeerDead``, ``CudaError``, ``Closed``.
    #[pyo3(signature = (obj, timeout=None, tag=0))]
    fn send_object(
        slf: &Bound<'_, Self>,
        obj: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        #[pyo3(from_py_with = tag_arg)] tag: u64,
    ) -> PyResult<()> {
        let py = slf.py();
        let tx = slf.get().shared(py)?;
        if crate::tree::send(py, &tx, obj, Until::new(py, timeout)?, tag)? {
            return Ok(());
        }
        let device = tx.gpu.as_ref().map(|g| g.ordinal);
        drop(tx);
        let send = OBJECTS_SEND.get_or_try_init(py, || {
            py.import("gpuring._objects")?.getattr("send").map(Bound::unbind)
        })?;
        send.bind(py).call1((slf, obj, timeout, tag, device))?;
        Ok(())
    }

    /// Leases a free slot for a tensor of ``shape`` and ``dtype`` (a name such as
    /// ``"float32"``, a numpy dtype or a torch dtype) to fill in place: zero copies.
    ///
    /// The lease supports DLPack: ``torch.from_dlpack(lease)`` or ``np.from_dlpack(lease)``
    /// is a writable view of the slot. Used as a context manager, it is sent when the
    /// block exits normally (and given back unsent on an exception)::
    ///
    ///     with tx.lease((3, 224, 224), "float32") as buf:
    ///         torch.from_dlpack(buf).copy_(x)
    ///
    /// Views must not be used after the lease is sent. GPU channels: the slot is leased
    /// on torch's current stream (``stream=`` to choose), which waits on the GPU until
    /// the slot's last reader is done.
    ///
    /// Raises ``Timeout``, ``TooLarge``, ``DTypeError``, ``Disconnected``, ``PeerDead``,
    /// ``Closed``.
    #[pyo3(signature = (shape, dtype, timeout=None, tag=0, stream=None))]
    fn lease(
        &self,
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        #[pyo3(from_py_with = tag_arg)] tag: u64,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyLease> {
        let until = Until::new(py, timeout)?;
        let tx = self.shared(py)?;
        let meta = dtypes::meta(shape, dtypes::from_py(dtype)?)?;
        tx.check_fits(py, meta.nbytes())?;
        let device = tx.gpu.as_ref().map(|g| g.ordinal);
        let raw = match device {
            Some(d) => gpu::stream_handle(py, stream, d)?,
            None => 0,
        };
        let mut lease = acquire(py, &tx, until, raw)?;
        let (ptr, place) = match &mut lease {
            AnyLease::Cuda(l, _) => (l.device_ptr() as usize, (DEVICE_CUDA, device.unwrap_or(0))),
            host => (host.host_ptr().expect("host memory") as usize, (DEVICE_CPU, 0)),
        };
        Ok(PyLease {
            tx,
            lease: Mutex::new(Some(lease)),
            meta,
            ptr,
            place,
            tag: AtomicU64::new(tag),
        })
    }

    /// Leaves the channel once no lease of this sender is left (its pool goes once every
    /// message sent from it is received). Further calls raise ``Closed``.
    fn close(&self) {
        let taken = self.shared.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(taken);
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    /// Bytes in one slot: the largest tensor it sends.
    #[getter]
    fn slot_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.shared(py)?.slot_bytes)
    }

    /// Slots free in this sender's pool now.
    #[getter]
    fn free_slots(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(each_sender!(&*self.shared(py)?.lock(), s => s.free_slots()))
    }

    /// Slots in this sender's pool.
    #[getter]
    fn slot_count(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(each_sender!(&*self.shared(py)?.lock(), s => s.slot_count()))
    }

    /// Slots of this sender's pool that receivers hold now (received, not yet released).
    #[getter]
    fn held_slots(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(each_sender!(&*self.shared(py)?.lock(), s => s.held_slots()))
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        let s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        match s.as_ref() {
            None => "Sender(closed)".to_owned(),
            Some(tx) => match &*tx.lock() {
                AnySender::Cuda(s) => {
                    let d = tx.gpu.as_ref().map_or(-1, |g| g.ordinal);
                    format!("Sender(pool {:?}, cuda:{d})", s.pool_name())
                }
                host => each_sender!(host, s => format!("Sender(pool {:?}, host)", s.pool_name())),
            },
        }
    }
}

/// A leased slot, to fill in place and send (see :meth:`Sender.lease`). Supports DLPack
/// (``torch.from_dlpack(lease)``, ``np.from_dlpack(lease)``: writable views of the slot).
#[pyclass(module = "gpuring._gpuring", name = "Lease", frozen)]
pub(crate) struct PyLease {
    tx: Arc<TxShared>,
    lease: Mutex<Option<AnyLease>>,
    meta: TensorMeta,
    ptr: usize,
    place: (i32, i32),
    tag: AtomicU64,
}

impl PyLease {
    /// `TooLarge` unless `n` bytes at `offset` lie within the lease.
    fn fits(&self, py: Python<'_>, offset: u64, n: u64) -> PyResult<()> {
        if offset.checked_add(n).is_none_or(|end| end > self.meta.nbytes()) {
            let msg = format!(
                "{n} bytes at offset {offset} go past the lease's {} bytes",
                self.meta.nbytes()
            );
            return Err(raise(py, Class::TooLarge, msg));
        }
        Ok(())
    }

    fn take(&self, py: Python<'_>) -> PyResult<AnyLease> {
        let l = self.lease.lock().unwrap_or_else(PoisonError::into_inner).take();
        l.ok_or_else(|| closed(py, "lease (sent or cancelled)"))
    }

    /// A DLPack capsule of a writable view of the slot. GPU channels: writes queued on
    /// stream `raw` (a raw handle; `None`: the lease's own) come after the slot's last
    /// reader, and the send waits for them.
    fn export<'py>(
        &self,
        py: Python<'py>,
        raw: Option<usize>,
        versioned: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.write_on(py, raw)?;
        dlpack::export(py, self.ptr, self.place, &self.meta, versioned, Box::new(self.tx.clone()))
    }

    /// Readies views that write on stream `raw` (a raw handle; `None`: the lease's own):
    /// `raw` waits for the lease's stream (the slot's last reader), and the send will wait
    /// for `raw`. `Closed` once the lease was sent or cancelled.
    fn write_on(&self, py: Python<'_>, raw: Option<usize>) -> PyResult<()> {
        let mut guard = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(lease) = guard.as_mut() else {
            return Err(closed(py, "lease (sent or cancelled)"));
        };
        if let AnyLease::Cuda(l, foreign) = lease
            && let Some(raw) = raw
            && raw != l.cuda_stream().cu_stream() as usize
            && let Some(g) = &self.tx.gpu
        {
            let s = g.stream(raw);
            g.join(&s, l.cuda_stream()).map_err(|e| e.err(py))?;
            foreign.push(s);
        }
        Ok(())
    }

    /// Torch's current stream on the channel's GPU (`None` for host slots).
    fn current_stream(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        match &self.tx.gpu {
            Some(g) => gpu::current_stream(py, g.ordinal).map(Some),
            None => Ok(None),
        }
    }
}

#[pymethods]
impl PyLease {
    /// Sends the slot as a tensor of the lease's shape and dtype, waiting up to
    /// ``timeout`` seconds for room in the ring. Raises ``Timeout`` (the slot goes back
    /// to the pool), ``Disconnected``, ``PeerDead``, ``Closed``.
    #[pyo3(signature = (timeout=None))]
    fn send(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let until = Until::new(py, timeout)?;
        let lease = self.take(py)?;
        send_lease(py, &self.tx, until, lease, self.meta, self.tag.load(Ordering::Relaxed))
    }

    /// Copies ``src`` (a tensor or array, anything with ``__dlpack__``) into the slot at
    /// byte ``offset``: how several tensors share one slot. As :meth:`Sender.send` copies:
    /// a CUDA source is read in the order of torch's current stream and, into a GPU slot,
    /// copied device to device in the order of the lease's stream (which waits for the
    /// source's); into a host slot, the driver's copy is done when the call returns. A
    /// non-contiguous source is made contiguous first.
    ///
    /// Raises ``TooLarge`` (past the lease's bytes), ``DTypeError``, ``CudaError``
    /// (a CUDA tensor of another GPU than the channel's), ``Closed``.
    #[pyo3(signature = (src, offset=0))]
    fn copy_in(&self, py: Python<'_>, src: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        let (source, asked) = read_source(py, src)?;
        self.fits(py, offset, source.meta.nbytes())?;
        let mut guard = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        let lease = guard.as_mut().ok_or_else(|| closed(py, "lease (sent or cancelled)"))?;
        copy_into(py, &self.tx, lease, offset, &source, asked)?;
        drop(source);
        Ok(())
    }

    /// Copies each ``(src, offset)`` of ``parts`` into the slot, as :meth:`copy_in` copies
    /// one, in one call: into a GPU slot, the CUDA tensors of its device by one kernel
    /// launch (per 64 tensors) in the order of torch's current stream, where a copy each
    /// costs some 5-7 µs of CPU (how a state dict's tensors go in). Raises as
    /// :meth:`copy_in` does, before anything is copied.
    fn copy_in_many(&self, py: Python<'_>, parts: &Bound<'_, PyList>) -> PyResult<()> {
        let mut read = Vec::with_capacity(parts.len());
        for item in parts.iter() {
            let (src, offset): (Bound<'_, PyAny>, u64) = item.extract()?;
            let (source, asked) = read_source(py, &src)?;
            self.fits(py, offset, source.meta.nbytes())?;
            read.push((source, offset, asked));
        }
        let mut guard = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        let lease = guard.as_mut().ok_or_else(|| closed(py, "lease (sent or cancelled)"))?;
        let mut gathered = None;
        if let (Some(g), AnyLease::Cuda(..)) = (&self.tx.gpu, &*lease) {
            let raw = gpu::current_stream(py, g.ordinal)?;
            if gather_into(py, &self.tx, lease, read.iter().map(|(s, off, _)| (s, *off)), raw)? {
                gathered = Some(g.ordinal);
            }
        }
        for (source, offset, asked) in &read {
            if gathered.is_some_and(|d| source.place == Place::Cuda(d)) {
                continue;
            }
            copy_into(py, &self.tx, lease, *offset, source, *asked)?;
        }
        drop(read);
        Ok(())
    }

    /// Up to 4096 bytes that travel beside the slot (host memory, GPU channels too): the
    /// receiver reads them as ``msg.header``. Empty unless set.
    #[getter]
    fn header(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        let mut guard = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        let lease = guard.as_mut().ok_or_else(|| closed(py, "lease (sent or cancelled)"))?;
        Ok(lease.header())
    }

    #[setter]
    fn set_header(&self, py: Python<'_>, bytes: &[u8]) -> PyResult<()> {
        let mut guard = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        let lease = guard.as_mut().ok_or_else(|| closed(py, "lease (sent or cancelled)"))?;
        lease.set_header(py, bytes)
    }

    /// Gives the slot back unsent.
    fn cancel(&self) {
        let taken = self.lease.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(taken);
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Sends the slot when the block exits normally; gives it back on an exception.
    #[pyo3(signature = (exc_type, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let sent = self.lease.lock().unwrap_or_else(PoisonError::into_inner).is_none();
        if exc_type.is_some_and(|e| !e.is_none()) {
            self.cancel();
        } else if !sent {
            self.send(py, None)?;
        }
        Ok(false)
    }

    /// A DLPack capsule of a writable view of the slot (the DLPack protocol; torch and
    /// numpy call it). GPU channels: writes queued on ``stream`` come after the slot's
    /// last reader, and the send waits for them.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        dlpack::check_request(self.place, dl_device, copy)?;
        let versioned = dlpack::wants_versioned(max_version)?;
        self.export(py, dlpack::stream_arg(stream)?, versioned)
    }

    /// The slot as a writable torch tensor: the same zero-copy view as
    /// ``torch.from_dlpack(lease)``, ordered on torch's current stream, made without the
    /// stream look-ups of ``torch.from_dlpack``'s protocol path (as :meth:`Message.torch`).
    /// Imports torch. The view must not be used after the lease is sent.
    fn torch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let capsule = self.export(py, self.current_stream(py)?, false)?;
        crate::receiver::torch_from_capsule(py, capsule)
    }

    /// Writable torch tensors viewing ``parts`` of the slot, a list of ``(byte offset,
    /// dtype, shape)``: several tensors of one slot in one call, each ordered as
    /// :meth:`torch` is (writes on torch's current stream come after the slot's last
    /// reader, and the send waits for them). They must not be used after the lease is
    /// sent. Raises ``Corrupted`` for a part past the lease's bytes, ``DTypeError``,
    /// ``Closed``.
    fn torch_views<'py>(
        &self,
        py: Python<'py>,
        parts: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.write_on(py, self.current_stream(py)?)?;
        let at = (self.ptr, self.meta.nbytes(), self.place);
        crate::receiver::views_at(py, at, parts, &|| Box::new(self.tx.clone()))
    }

    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        dlpack::device_tuple(py, self.place)
    }

    /// The tensor's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        dtypes::shape_tuple(py, &self.meta)
    }

    /// The element type's name (``"float32"``, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        dtypes::name(self.meta.dtype())
    }

    /// Bytes the tensor spans.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.meta.nbytes()
    }

    /// The tag sent with it (settable until sent).
    #[getter]
    fn get_tag(&self) -> u64 {
        self.tag.load(Ordering::Relaxed)
    }

    #[setter]
    fn set_tag(&self, tag: u64) {
        self.tag.store(tag, Ordering::Relaxed);
    }

    /// Whether the lease was sent or cancelled.
    #[getter]
    fn done(&self) -> bool {
        self.lease.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    fn __repr__(&self) -> String {
        format!("Lease(shape={:?}, dtype={})", self.meta.shape(), dtypes::name(self.meta.dtype()))
    }
}
