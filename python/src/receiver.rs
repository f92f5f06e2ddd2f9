//! `gpuring.Receiver` and `gpuring.Message`: receiving, and zero-copy views of a
//! received slot through DLPack.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cudarc::driver::CudaStream;
use gpuring::{
    Backend, Cuda, Host, Message, Pinned, Receiver, RecvTimeoutError, TensorMeta, TryRecvError,
    WaitPolicy,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::blocking::{Step, Until, lock_for, wait};
use crate::channel::AnyChannel;
use crate::dlpack::{self, DEVICE_CPU, DEVICE_CUDA};
use crate::dtypes;
use crate::errors::{Class, ClassOf, Raised, closed, raise};
use crate::gpu::{self, Gpu};

/// A receiver of any backend (a GPU receiver's device is `PyReceiver::gpu`).
enum AnyReceiver {
    Host(Receiver<Host>),
    Pinned(Receiver<Pinned>),
    Cuda(Receiver<Cuda>),
}

/// A received message of any backend.
enum AnyMessage {
    Host(Message<Host>),
    Pinned(PinnedMessage),
    Cuda(Message<Cuda>, Arc<Gpu>),
}

/// A message of a pinned receiver: its slot goes back in the order of the CUDA stream
/// current when it was received (torch's, if torch is imported; else the legacy default
/// stream, which follows every blocking stream), so that a copy out of the slot queued
/// there (`torch.from_dlpack(msg).to("cuda", non_blocking=True)`) completes before the
/// sender can overwrite it.
struct PinnedMessage {
    msg: Option<Message<Pinned>>,
    after: Arc<CudaStream>,
}

impl PinnedMessage {
    fn get(&self) -> &Message<Pinned> {
        self.msg.as_ref().expect("taken only by drop")
    }
}

impl Drop for PinnedMessage {
    fn drop(&mut self) {
        if let Some(m) = self.msg.take() {
            // On a failed enqueue this waits for the stream, then returns the slot.
            let _ = m.release_on(&self.after);
        }
    }
}

/// Why a receive gave no message: the channel's end (every sender left), or another error.
struct RecvFailed {
    disconnected: bool,
    raised: Raised,
}

impl<B: Backend> From<RecvTimeoutError<B>> for RecvFailed {
    fn from(e: RecvTimeoutError<B>) -> Self {
        RecvFailed { disconnected: matches!(e, RecvTimeoutError::Disconnected), raised: e.raised() }
    }
}

impl<B: Backend> From<TryRecvError<B>> for RecvFailed {
    fn from(e: TryRecvError<B>) -> Self {
        RecvFailed { disconnected: matches!(e, TryRecvError::Disconnected), raised: e.raised() }
    }
}

/// One step of a receive on `r` (a try, or a slice: see `blocking::wait`; a slice after the
/// first does not spin): `None` when there was nothing.
fn recv_slice<B: Backend>(
    r: &mut Receiver<B>,
    slice: Option<Duration>,
    again: bool,
) -> Option<Result<Message<B>, RecvFailed>> {
    let Some(slice) = slice else {
        return match r.try_recv() {
            Err(TryRecvError::Empty) => None,
            got => Some(got.map_err(RecvFailed::from)),
        };
    };
    // A policy that never sleeps was asked for: it spins in every slice. A zero slice
    // (`timeout=0`) has no time to spin either.
    let policy = r.wait_policy();
    let sleep = (again || slice.is_zero()) && !policy.never_sleeps();
    if sleep {
        r.set_wait_policy(WaitPolicy::SLEEP);
    }
    let got = r.recv_timeout(slice);
    if sleep {
        r.set_wait_policy(policy);
    }
    match got {
        Err(RecvTimeoutError::Timeout) => None,
        got => Some(got.map_err(RecvFailed::from)),
    }
}

/// One step of a receive on any receiver (see [`recv_slice`]); `stream`: for GPU and pinned
/// receivers, their device and the stream the message is received on (or whose work the
/// slot's return follows).
fn step_any(
    rx: &mut AnyReceiver,
    stream: Option<&(&Arc<Gpu>, Arc<CudaStream>)>,
    slice: Option<Duration>,
    again: bool,
) -> Option<Result<AnyMessage, RecvFailed>> {
    match (rx, stream) {
        (AnyReceiver::Host(r), _) => recv_slice(r, slice, again).map(|r| r.map(AnyMessage::Host)),
        (AnyReceiver::Pinned(r), Some((_, s))) => recv_slice(r, slice, again).map(|r| {
            r.map(|m| AnyMessage::Pinned(PinnedMessage { msg: Some(m), after: s.clone() }))
        }),
        (AnyReceiver::Cuda(r), Some((g, s))) => {
            if r.cuda_stream().cu_stream() != s.cu_stream() {
                r.set_cuda_stream(s);
            }
            recv_slice(r, slice, again).map(|r| r.map(|m| AnyMessage::Cuda(m, Arc::clone(g))))
        }
        (_, None) => unreachable!("a GPU or pinned receiver has its device"),
    }
}

/// The receiving end of a channel. Safe to share between threads; iterating over it
/// receives until every sender has left and everything was received.
#[pyclass(module = "gpuring._gpuring", name = "Receiver", frozen)]
pub(crate) struct PyReceiver {
    rx: Mutex<Option<Arc<Mutex<AnyReceiver>>>>,
    /// GPU channels: the channel's device; pinned host channels: the device whose streams
    /// order the slots' return (read without the receiver's lock).
    gpu: Option<Arc<Gpu>>,
    /// An error a [`recv_ready`](PyReceiver::recv_ready) met after it had taken messages:
    /// raised by the next receive instead (a dropped descriptor is reported once).
    stash: Mutex<Option<RecvFailed>>,
    /// Whether `stash` may hold an error: one load on every receive, the lock only then.
    stashed: AtomicBool,
}

impl PyReceiver {
    pub(crate) fn new(py: Python<'_>, ch: AnyChannel, policy: WaitPolicy) -> PyResult<Self> {
        let made = py.detach(|| match &ch {
            AnyChannel::Host(c) => c.receiver().map(AnyReceiver::Host).map_err(|e| e.raised()),
            AnyChannel::Pinned(c, _) => {
                c.receiver().map(AnyReceiver::Pinned).map_err(|e| e.raised())
            }
            AnyChannel::Cuda(c, _) => c.receiver().map(AnyReceiver::Cuda).map_err(|e| e.raised()),
        });
        let mut rx = made.map_err(|e| e.into_err(py))?;
        match &mut rx {
            AnyReceiver::Host(r) => r.set_wait_policy(policy),
            AnyReceiver::Pinned(r) => r.set_wait_policy(policy),
            AnyReceiver::Cuda(r) => r.set_wait_policy(policy),
        }
        let gpu = match &ch {
            AnyChannel::Host(_) => None,
            AnyChannel::Pinned(_, g) | AnyChannel::Cuda(_, g) => Some(g.clone()),
        };
        let rx = Mutex::new(Some(Arc::new(Mutex::new(rx))));
        Ok(PyReceiver { rx, gpu, stash: Mutex::new(None), stashed: AtomicBool::new(false) })
    }

    /// The error `recv_ready` kept for the next receive, if any (taken).
    fn take_stashed(&self) -> Option<RecvFailed> {
        // Relaxed: see where it is set.
        if !self.stashed.load(Ordering::Relaxed) {
            return None;
        }
        self.stashed.store(false, Ordering::Relaxed);
        self.stash.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    fn get(&self, py: Python<'_>) -> PyResult<Arc<Mutex<AnyReceiver>>> {
        let rx = self.rx.lock().unwrap_or_else(PoisonError::into_inner);
        rx.clone().ok_or_else(|| closed(py, "receiver"))
    }

    /// Receives, waiting in slices with the GIL released.
    fn receive(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Result<PyMessage, RecvFailed>> {
        if let Some(failed) = self.take_stashed() {
            return Ok(Err(failed));
        }
        let until = Until::new(py, timeout)?;
        let rx = self.get(py)?;
        // The stream the message is received on (GPU channels), or the one the slot's
        // return follows (pinned host channels), wrapped once for the whole wait.
        let stream = match &self.gpu {
            None => None,
            Some(g) => Some((g, g.stream(gpu::stream_handle(py, stream, g.ordinal)?))),
        };
        let step = |(), slice: Option<Duration>, again: bool| {
            let Some(mut guard) = lock_for(&rx, slice) else { return Step::Again(()) };
            step_any(&mut guard, stream.as_ref(), slice, again).map_or(Step::Again(()), Step::Done)
        };
        Ok(match wait(py, until, (), step)? {
            Ok(r) => r.map(PyMessage::new),
            Err(()) => Err(RecvFailed {
                disconnected: false,
                raised: Raised::new(Class::Timeout, "timed out waiting for a message"),
            }),
        })
    }
}

#[pymethods]
impl PyReceiver {
    /// Receives a message, waiting up to ``timeout`` seconds (``None``: as long as it
    /// takes, interruptible; ``0``: not at all).
    ///
    /// The :class:`Message` is a zero-copy view of the sender's slot, which stays this
    /// receiver's until the message and every view of it are gone (``release()`` or a
    /// ``with`` block lets go at once). GPU channels: ``stream`` (``None``: torch's
    /// current stream if torch is imported, else the legacy default stream; an int or a
    /// ``torch.cuda.Stream``) waits on the GPU for the sender's writes; the CPU does not.
    /// Host channels opened with ``pinned=True``: the slot is pinned memory (a
    /// ``non_blocking`` copy to the GPU is asynchronous DMA), and it goes back only after
    /// the work queued on ``stream`` (chosen as above) by the time the message is released,
    /// so that such a copy completes first.
    ///
    /// Raises ``Timeout``, ``Disconnected`` (every sender left and everything was
    /// received), ``PeerDead``, ``SenderGone`` (GPU: the sender left with the memory),
    /// ``Corrupted`` (a bad descriptor, dropped: the next call carries on), ``CudaError``,
    /// ``Closed``.
    #[pyo3(signature = (timeout=None, stream=None))]
    fn recv(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyMessage> {
        self.receive(py, timeout, stream)?.map_err(|e| e.raised.into_err(py))
    }

    /// The messages already waiting in the channel, up to ``max``, taken without waiting
    /// (an empty list when there are none): what a consumer that has fallen behind a
    /// stream takes in one call, each as :meth:`recv` would return it (GPU channels:
    /// received on torch's current stream). It stops at the first receive that gives no
    /// message; an error there is raised now if it took none, else by the next receive.
    fn recv_ready(&self, py: Python<'_>, max: usize) -> PyResult<Vec<PyMessage>> {
        if let Some(failed) = self.take_stashed() {
            return Err(failed.raised.into_err(py));
        }
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        let rx = self.get(py)?;
        let stream = match &self.gpu {
            None => None,
            Some(g) => Some((g, g.stream(gpu::current_stream(py, g.ordinal)?))),
        };
        // Another thread's receive holds the receiver: what waits is that one's.
        let Some(mut guard) = lock_for(&rx, None) else { return Ok(out) };
        let failed = loop {
            if out.len() == max {
                break None;
            }
            let got = step_any(&mut guard, stream.as_ref(), None, false);
            match got {
                None => break None,
                Some(Ok(m)) => out.push(PyMessage::new(m)),
                Some(Err(e)) => break Some(e),
            }
        };
        drop(guard);
        match failed {
            Some(e) if out.is_empty() => Err(e.raised.into_err(py)),
            Some(e) => {
                *self.stash.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                // Relaxed: the error itself goes through the lock; a receive that misses
                // the flag raises it at the next one.
                self.stashed.store(true, Ordering::Relaxed);
                Ok(out)
            }
            None => Ok(out),
        }
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// The next message; the iteration ends once every sender has left and everything
    /// they sent was received (``PeerDead`` is raised if one died).
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyMessage>> {
        match self.receive(py, None, None)? {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.disconnected => Ok(None),
            Err(e) => Err(e.raised.into_err(py)),
        }
    }

    /// Puts ``msg``, a message this receiver received, back in the channel as if this
    /// receiver had died holding it: the next receive of any receiver of the channel
    /// (this one too) gets it before what is queued, with ``redelivered`` true. GPU and
    /// pinned channels: waits for the reads queued on the message's stream (the one its
    /// release is ordered after) first. ``msg`` is
    /// released here. Raises ``BufferError`` while views of it are alive, ``ConfigError``
    /// on a channel made with ``redeliver=False`` (or a broadcast one) or for another
    /// receiver's message (nothing changes then), ``Closed`` for a released message.
    fn requeue(&self, py: Python<'_>, msg: &Bound<'_, PyMessage>) -> PyResult<()> {
        let rx = self.get(py)?;
        let m = msg.get();
        // Taken out under the message's lock, which is not held past this (another thread
        // may wait for it with the GIL while this one waits without).
        let held = {
            let mut slot = m.held.lock().unwrap_or_else(PoisonError::into_inner);
            let held = slot.take().ok_or_else(|| closed(py, "message (released)"))?;
            match Arc::try_unwrap(held) {
                Ok(h) => h,
                Err(held) => {
                    *slot = Some(held);
                    let why = "the message has views in use: free them before requeue()";
                    return Err(pyo3::exceptions::PyBufferError::new_err(why));
                }
            }
        };
        let Held(any) = held;
        let gpu = self.gpu.clone();
        // Without the GIL: a receive of another thread holds the receiver for a slice at
        // most, and a GPU message waits for its stream.
        let back = py.detach(move || {
            let mut guard = rx.lock().unwrap_or_else(PoisonError::into_inner);
            match (&mut *guard, any) {
                (AnyReceiver::Host(r), AnyMessage::Host(m)) => r
                    .requeue(m)
                    .map_err(|e| Box::new((e.raised(), AnyMessage::Host(e.into_message())))),
                (AnyReceiver::Cuda(r), AnyMessage::Cuda(m, g)) => r
                    .requeue(m)
                    .map_err(|e| Box::new((e.raised(), AnyMessage::Cuda(e.into_message(), g)))),
                (AnyReceiver::Pinned(r), AnyMessage::Pinned(mut p)) => {
                    // Its reads were queued on `after` (its drop returns the slot after
                    // them): done before another receiver may take the slot over.
                    let gpu = gpu.expect("a pinned receiver has its GPU");
                    if let Err(e) = gpu.synchronize(&p.after) {
                        return Err(Box::new((e.raised(), AnyMessage::Pinned(p))));
                    }
                    let after = p.after.clone();
                    let m = p.msg.take().expect("taken only here and by drop");
                    r.requeue(m).map_err(|e| {
                        let raised = e.raised();
                        let msg = Some(e.into_message());
                        Box::new((raised, AnyMessage::Pinned(PinnedMessage { msg, after })))
                    })
                }
                (_, any) => {
                    let why = "the message was received by another receiver";
                    Err(Box::new((Raised::new(Class::ConfigError, why), any)))
                }
            }
        });
        match back {
            Ok(()) => Ok(()),
            Err(failed) => {
                let (raised, any) = *failed;
                *m.held.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(Held(any)));
                Err(raised.into_err(py))
            }
        }
    }

    /// Leaves the channel (messages already received stay valid). Further calls raise
    /// ``Closed``.
    fn close(&self) {
        let taken = self.rx.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(taken);
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.rx.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }
}

static TORCH_FROM_DLPACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A torch tensor over a DLPack capsule of ours (imports torch). Given a capsule,
/// `torch.from_dlpack` only wraps it: the caller has ordered the streams already. Its C
/// half, `torch._C._from_dlpack`, is called where torch has it (what `torch.from_dlpack`
/// ends in, without its Python wrapper: this runs once per tensor received).
pub(crate) fn torch_from_capsule<'py>(
    py: Python<'py>,
    capsule: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let from_dlpack = TORCH_FROM_DLPACK.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let c = torch.getattr("_C")?.getattr("_from_dlpack");
        c.or_else(|_| torch.getattr("from_dlpack")).map(Bound::unbind)
    })?;
    from_dlpack.bind(py).call1((capsule,))
}

/// Torch tensors viewing `parts` (a list of (byte offset, dtype, shape)) of the `len`
/// bytes at `ptr` on `place`, each keeping what `keep()` makes alive: a message's several
/// tensors in one call, without torch's slicing and re-viewing per tensor.
pub(crate) fn views_at<'py>(
    py: Python<'py>,
    (ptr, len, place): (usize, u64, (i32, i32)),
    parts: &Bound<'py, PyList>,
    keep: &dyn Fn() -> dlpack::Keep,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for item in parts.iter() {
        let (offset, dtype, shape): (u64, Bound<'py, PyAny>, Bound<'py, PyAny>) = item.extract()?;
        let meta = dtypes::meta(&shape, dtypes::from_py(&dtype)?)?;
        if offset.checked_add(meta.nbytes()).is_none_or(|end| end > len) {
            return Err(raise(py, Class::Corrupted, "a part lies outside the payload"));
        }
        let capsule = dlpack::export(py, ptr + offset as usize, place, &meta, false, keep())?;
        out.append(torch_from_capsule(py, capsule)?)?;
    }
    Ok(out)
}

/// Torch tensors viewing `parts` (a list of (byte offset, dtype name, shape)) of the
/// contiguous tensor ``base``, which they keep alive (how ``Message.object(copy=True)``
/// views its one copy of a payload).
#[pyfunction]
pub(crate) fn torch_views<'py>(
    base: &Bound<'py, PyAny>,
    parts: &Bound<'py, PyList>,
) -> PyResult<Bound<'py, PyList>> {
    let py = base.py();
    // C accessors of the tensor, names interned: no torch.device made.
    let ptr: usize = base.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let len: u64 = base.getattr(intern!(py, "nbytes"))?.extract()?;
    let place = if base.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
        (DEVICE_CUDA, base.call_method0(intern!(py, "get_device"))?.extract::<i32>()?)
    } else {
        (DEVICE_CPU, 0)
    };
    let owner = base.clone().unbind();
    views_at(py, (ptr, len, place), parts, &|| Box::new(owner.clone_ref(py)))
}

/// Where each payload starts in the allocation [`copies`] makes: every part 16-byte
/// aligned (the gather kernel's wide copies) and at a whole number of elements of any
/// dtype.
const COPY_ALIGN: u64 = 256;

/// Copies of the payloads of the GPU messages ``msgs`` (of one receiver, received on
/// torch's current stream), made by one kernel launch: torch tensors with each message's
/// dtype, shape and strides, views of one new allocation on the receiving device made on
/// torch's current stream (torch's rules for memory of a stream apply to them: use
/// ``record_stream`` to read one on another stream). The messages stay held: release
/// them once the copies are made (their slots then go back after the copy, which their
/// streams are made to follow). How a ``Queue`` getter that fell behind copies several
/// items at the cost of one GPU submission. Raises ``Closed`` (a message released),
/// ``DTypeError`` (a host message, or messages of two devices), ``CudaError``.
#[pyfunction]
pub(crate) fn copies<'py>(
    py: Python<'py>,
    msgs: Vec<Bound<'py, PyMessage>>,
) -> PyResult<Bound<'py, PyList>> {
    let mut held = Vec::with_capacity(msgs.len());
    let mut gpu: Option<Arc<Gpu>> = None;
    let mut total = 0u64;
    for m in &msgs {
        let this = m.get();
        let h = this.held.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let h = h.ok_or_else(|| closed(py, "message (released)"))?;
        let AnyMessage::Cuda(_, g) = &h.0 else {
            return Err(raise(py, Class::DTypeError, "copies() takes GPU messages"));
        };
        if gpu.as_ref().is_some_and(|have| have.ordinal != g.ordinal) {
            return Err(raise(py, Class::DTypeError, "copies() takes messages of one device"));
        }
        gpu.get_or_insert_with(|| g.clone());
        let off = total.div_ceil(COPY_ALIGN) * COPY_ALIGN;
        total = off + this.meta.nbytes();
        held.push((h, off));
    }
    let out = PyList::empty(py);
    let Some(g) = gpu else { return Ok(out) };
    let torch = py.import(intern!(py, "torch"))?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item(intern!(py, "dtype"), torch.getattr(intern!(py, "uint8"))?)?;
    kwargs.set_item(intern!(py, "device"), g.ordinal)?;
    // A whole number of COPY_ALIGN units: viewable as any dtype.
    let size = total.div_ceil(COPY_ALIGN).max(1) * COPY_ALIGN;
    let block = torch.getattr(intern!(py, "empty"))?.call((size,), Some(&kwargs))?;
    let base: u64 = block.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let stream = g.stream(gpu::current_stream(py, g.ordinal)?);
    let mut parts = Vec::with_capacity(held.len());
    for (h, off) in &held {
        let AnyMessage::Cuda(m, _) = &h.0 else { unreachable!("checked above") };
        // A message received on another stream: ours waits for what that one was told to.
        g.join(&stream, m.cuda_stream()).map_err(|e| e.err(py))?;
        let n = m.meta().nbytes();
        if n > 0 {
            parts.push((m.device_ptr(), base + off, n));
        }
    }
    if !g.gather(&parts, &stream).map_err(|e| e.err(py))? {
        for &(src, dst, n) in &parts {
            g.copy(gpu::Dir::DeviceToDevice, dst, src, n as usize, &stream)
                .map_err(|e| e.err(py))?;
        }
    }
    // The messages' slots go back in the order of their own streams: those wait for ours.
    for (h, _) in &held {
        let AnyMessage::Cuda(m, _) = &h.0 else { unreachable!("checked above") };
        g.join(m.cuda_stream(), &stream).map_err(|e| e.err(py))?;
    }
    // torch's own views of the block (not DLPack imports): they share its storage, so
    // `record_stream` on one reaches the allocator's block.
    let mut typed: Vec<(gpuring::DType, Bound<'py, PyAny>)> = Vec::new();
    for (m, (_, off)) in msgs.iter().zip(&held) {
        let meta = &m.get().meta;
        let dtype = meta.dtype();
        let whole = match typed.iter().find(|(d, _)| *d == dtype) {
            Some((_, t)) => t.clone(),
            None => {
                let name = pyo3::types::PyString::intern(py, dtypes::name(dtype));
                let t = block.call_method1(intern!(py, "view"), (torch.getattr(name)?,))?;
                typed.push((dtype, t.clone()));
                t
            }
        };
        let strides = PyTuple::new(py, meta.strides())?;
        let at = off / dtype.itemsize();
        let view = whole.call_method1(
            intern!(py, "as_strided"),
            (dtypes::shape_tuple(py, meta)?, strides, at),
        )?;
        out.append(view)?;
    }
    Ok(out)
}

/// `gpuring._objects.load`, looked up once.
static OBJECTS_LOAD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// What a message and its exported views share: the Rust message, whose slot goes back
/// when the last of them is gone.
struct Held(AnyMessage);

/// A view exported on another CUDA stream than the message's: when the consumer lets go
/// of it, the message's stream is made to wait for the reads queued on that stream, so
/// the release event (recorded on the message's stream) comes after them.
struct ForeignView {
    held: Arc<Held>,
    stream: Arc<CudaStream>,
}

impl Drop for ForeignView {
    fn drop(&mut self) {
        if let AnyMessage::Cuda(m, g) = &self.held.0
            && g.join(m.cuda_stream(), &self.stream).is_err()
        {
            // Without the join the slot could be written under pending reads: wait for
            // them instead (a failed driver call; never the normal path).
            let _ = g.synchronize(&self.stream);
        }
    }
}

/// A received tensor: a zero-copy view of the sender's slot.
///
/// ``torch.from_dlpack(msg)`` or ``np.from_dlpack(msg)`` makes a tensor or array of it
/// without copying. The slot goes back to the sender when the message has been released
/// (``release()``, the end of a ``with`` block, or garbage collection) and every such
/// view is gone. GPU messages: the consumer's stream (torch passes its current one) waits
/// on the GPU for the sender's writes, and the slot goes back only after the reads
/// queued on it. A view read on yet another stream must be ordered by its user (as
/// with torch's ``record_stream``).
#[pyclass(module = "gpuring._gpuring", name = "Message", frozen)]
pub(crate) struct PyMessage {
    held: Mutex<Option<Arc<Held>>>,
    meta: TensorMeta,
    seq: u64,
    tag: u64,
    redelivered: bool,
    place: (i32, i32),
    ptr: usize,
    /// The header the sender wrote, copied out (empty: no allocation).
    header: Vec<u8>,
}

impl PyMessage {
    fn new(m: AnyMessage) -> Self {
        let header = match &m {
            AnyMessage::Host(m) => m.header().to_vec(),
            AnyMessage::Pinned(p) => p.get().header().to_vec(),
            AnyMessage::Cuda(m, _) => m.header().to_vec(),
        };
        let redelivered = match &m {
            AnyMessage::Host(m) => m.redelivered(),
            AnyMessage::Pinned(p) => p.get().redelivered(),
            AnyMessage::Cuda(m, _) => m.redelivered(),
        };
        let (meta, seq, tag, place, ptr) = match &m {
            AnyMessage::Host(m) => {
                (*m.meta(), m.seq(), m.tag(), (DEVICE_CPU, 0), m.as_ptr() as usize)
            }
            AnyMessage::Pinned(p) => {
                let m = p.get();
                (*m.meta(), m.seq(), m.tag(), (DEVICE_CPU, 0), m.as_ptr() as usize)
            }
            AnyMessage::Cuda(m, g) => {
                (*m.meta(), m.seq(), m.tag(), (DEVICE_CUDA, g.ordinal), m.device_ptr() as usize)
            }
        };
        let held = Mutex::new(Some(Arc::new(Held(m))));
        PyMessage { held, meta, seq, tag, redelivered, place, ptr, header }
    }
}

#[pymethods]
impl PyMessage {
    /// A DLPack capsule of a view of the payload (the DLPack protocol: torch and numpy
    /// call it). GPU messages: ``stream`` waits for the sender's writes (``-1``: the
    /// consumer orders its reads itself).
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
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let held = held.ok_or_else(|| closed(py, "message (released)"))?;
        let keep: dlpack::Keep = match &held.0 {
            AnyMessage::Cuda(m, g) => match dlpack::stream_arg(stream)? {
                Some(raw) if raw != m.cuda_stream().cu_stream() as usize => {
                    let s = g.stream(raw);
                    m.wait_on(&s).map_err(|e| e.err(py))?;
                    Box::new(ForeignView { held: held.clone(), stream: s })
                }
                _ => Box::new(held.clone()),
            },
            AnyMessage::Host(_) | AnyMessage::Pinned(_) => Box::new(held.clone()),
        };
        let versioned = dlpack::wants_versioned(max_version)?;
        dlpack::export(py, self.ptr, self.place, &self.meta, versioned, keep)
    }

    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        dlpack::device_tuple(py, self.place)
    }

    /// The payload as a torch tensor: the same zero-copy view as
    /// ``torch.from_dlpack(msg)``, ordered on the stream the message was received on (for
    /// ``recv()`` without ``stream=``, torch's current stream then), made without the
    /// stream look-ups of ``torch.from_dlpack``'s protocol path (a sixth of its cost).
    /// Imports torch.
    fn torch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let held = held.ok_or_else(|| closed(py, "message (released)"))?;
        let capsule = dlpack::export(py, self.ptr, self.place, &self.meta, false, Box::new(held))?;
        torch_from_capsule(py, capsule)
    }

    /// The object of a message sent by :meth:`Sender.send_object` (or ``Queue.put``),
    /// rebuilt: each tensor and array a view of the slot (``copy=False``: zero-copy; the
    /// slot goes back once the message is released and every view is gone) or a copy
    /// (``copy=True``; release the message after to give the slot back at once), on the
    /// device it was sent from (a CPU tensor through GPU slots comes back to the CPU, a
    /// CUDA tensor through host slots to its GPU; those are copies either way).
    ///
    /// A plain object (see :meth:`Sender.send_object`) is read by the extension, every
    /// value checked; the others are unpickled. Unpickling runs code the sender chose:
    /// only processes that can open the channel (the same user) can send into it, as with
    /// ``multiprocessing``'s queues.
    ///
    /// Raises ``Corrupted`` (not an object message, a description that does not hold
    /// together, or a part outside the slot), ``Closed``, and what unpickling raises.
    #[pyo3(signature = (copy=false))]
    fn object<'py>(slf: &Bound<'py, Self>, copy: bool) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if this.header.starts_with(crate::tree::MAGIC) {
            // A plain tree (no pickle): read here.
            let held = this.held.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let held = held.ok_or_else(|| closed(py, "message (released)"))?;
            let payload = crate::tree::Payload {
                ptr: this.ptr,
                len: this.meta.nbytes(),
                place: this.place,
                keep: &|| Box::new(held.clone()),
                whole: &|| this.torch(py),
                message: slf.as_any(),
            };
            return crate::tree::decode(py, &this.header, &payload, copy);
        }
        let load = OBJECTS_LOAD.get_or_try_init(py, || {
            py.import("gpuring._objects")?.getattr("load").map(Bound::unbind)
        })?;
        load.bind(py).call1((slf, copy))
    }

    /// Torch tensors viewing ``parts`` of the payload, a list of ``(byte offset, dtype,
    /// shape)``: several tensors of one slot in one call (zero-copy, each ordered as
    /// :meth:`torch` is, each holding the slot). Raises ``Corrupted`` for a part outside
    /// the payload, ``DTypeError``, ``Closed``.
    fn torch_views<'py>(
        &self,
        py: Python<'py>,
        parts: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let held = held.ok_or_else(|| closed(py, "message (released)"))?;
        let at = (self.ptr, self.meta.nbytes(), self.place);
        views_at(py, at, parts, &|| Box::new(held.clone()))
    }

    /// Lets go of the slot (it goes back once no view of it is left). Further DLPack
    /// exports raise ``Closed``.
    fn release(&self) {
        let taken = self.held.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(taken);
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.release();
        false
    }

    /// Whether :meth:`release` was called.
    #[getter]
    fn released(&self) -> bool {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).is_none()
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

    /// Bytes of payload.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.meta.nbytes()
    }

    /// The sender's sequence number (per sender, from 0).
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }

    /// The tag the sender gave.
    #[getter]
    fn tag(&self) -> u64 {
        self.tag
    }

    /// Whether this message was delivered before, to a receiver that died holding it
    /// (that receiver may have acted on it): see ``redeliver`` in :meth:`Channel.create`.
    #[getter]
    fn redelivered(&self) -> bool {
        self.redelivered
    }

    /// The header the sender wrote beside the payload (``send(..., header=)``,
    /// ``lease.header``): ``b""`` if none. Readable after the message is released.
    #[getter]
    fn header<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.header)
    }

    /// The GPU the payload is on, or ``None`` for host memory.
    #[getter]
    fn device(&self) -> Option<i32> {
        (self.place.0 == DEVICE_CUDA).then_some(self.place.1)
    }

    fn __repr__(&self) -> String {
        let place = self.device().map_or("host".to_owned(), |d| format!("cuda:{d}"));
        format!(
            "Message(seq={}, tag={}, shape={:?}, dtype={}, {place})",
            self.seq,
            self.tag,
            self.meta.shape(),
            dtypes::name(self.meta.dtype())
        )
    }
}
