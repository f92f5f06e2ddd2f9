//! `gpuring.Channel`: create or open a named channel, make its senders and receivers.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpuring::{
    Channel, ChannelBuilder, ChannelError, Cuda, Flavor, GpuReady, Host, ShmError, WaitPolicy,
};
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::blocking::{Step, Until, wait};
use crate::errors::{self, closed};
use crate::gpu::Gpu;
use crate::receiver::PyReceiver;
use crate::sender::PySender;

/// What `__reduce__` gives pickle: `Channel.open` and its arguments (name, device,
/// timeout, pinned, ready).
type Reduced<'py> =
    (Bound<'py, PyAny>, (String, Option<i32>, Option<f64>, bool, Option<&'static str>));

/// A channel of either kind.
#[derive(Clone)]
pub(crate) enum AnyChannel {
    /// A host channel, and the GPU whose driver pins its pools in this process
    /// (``pinned=True``).
    Host(Channel<Host>, Option<Arc<Gpu>>),
    Cuda(Channel<Cuda>, Arc<Gpu>),
}

/// A named channel: a ring of descriptors in shared memory, and one slot pool per sender
/// (host shared memory, or device memory of one GPU).
///
/// Make one with :meth:`Channel.create` (exclusive; the first process) or
/// :meth:`Channel.open` (the others), then take a :meth:`sender` or a :meth:`receiver`.
/// A channel lives while any process has it open or a message waits in it; the last one
/// out removes it. Channels pickle by name: an unpickled channel opens the same one.
#[pyclass(module = "gpuring._gpuring", name = "Channel", frozen)]
pub(crate) struct PyChannel {
    ch: Mutex<Option<AnyChannel>>,
    name: String,
    device: Option<i32>,
    mpmc: bool,
    capacity: usize,
    slots: u32,
    slot_bytes: u64,
    max_senders: u32,
    /// How this process's senders of a GPU channel signal a send (`None`: a host channel).
    ready: Option<GpuReady>,
}

impl PyChannel {
    fn new(ch: AnyChannel, ready: Option<GpuReady>) -> Self {
        let (name, device, flavor, capacity, (slots, slot_bytes), max_senders) = match &ch {
            AnyChannel::Host(c, _) => {
                (c.name().to_owned(), None, c.flavor(), c.capacity(), c.slots(), c.max_senders())
            }
            AnyChannel::Cuda(c, g) => (
                c.name().to_owned(),
                Some(g.ordinal),
                c.flavor(),
                c.capacity(),
                c.slots(),
                c.max_senders(),
            ),
        };
        let mpmc = flavor == Flavor::Mpmc;
        PyChannel {
            ch: Mutex::new(Some(ch)),
            name,
            device,
            mpmc,
            capacity,
            slots,
            slot_bytes,
            max_senders,
            ready,
        }
    }

    fn get(&self, py: Python<'_>) -> PyResult<AnyChannel> {
        let ch = self.ch.lock().unwrap_or_else(PoisonError::into_inner);
        ch.clone().ok_or_else(|| closed(py, "channel"))
    }
}

/// A wait policy from the Python arguments (the Rust defaults where not given).
fn policy(spins: Option<u32>, yields: Option<u32>) -> WaitPolicy {
    let d = WaitPolicy::default();
    WaitPolicy::spin_then_sleep(spins.unwrap_or(d.spins()), yields.unwrap_or(d.yields()))
}

fn gpu(py: Python<'_>, device: Option<i32>) -> PyResult<Option<Arc<Gpu>>> {
    device.map(|d| Gpu::new(d).map_err(|e| errors::cuda(py, e))).transpose()
}

/// The GPU whose driver pins a host channel's pools (`pinned=True`: device 0; pinning is
/// portable to every device), or `None`.
fn pinning(py: Python<'_>, pinned: bool, device: Option<i32>) -> PyResult<Option<Arc<Gpu>>> {
    match (pinned, device) {
        (false, _) => Ok(None),
        (true, None) => gpu(py, Some(0)),
        (true, Some(_)) => Err(pyo3::exceptions::PyValueError::new_err(
            "pinned=True is for host channels (device=None): device slots need no pinning",
        )),
    }
}

/// The `ready=` argument: how this process's senders of a GPU channel signal a send.
/// `None` for a host channel (where giving one is an error), else the event by default.
fn ready(device: Option<i32>, ready: Option<&str>) -> PyResult<Option<GpuReady>> {
    match (device, ready) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(pyo3::exceptions::PyValueError::new_err(
            "ready= is for GPU channels (device=N): host slots are ready when send returns",
        )),
        (Some(_), None | Some("event")) => Ok(Some(GpuReady::Event)),
        (Some(_), Some("flag")) => Ok(Some(GpuReady::HostFlag)),
        (Some(_), Some(other)) => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "ready={other:?}: expected \"event\" or \"flag\""
        ))),
    }
}

/// The name `ready=` takes for `r`.
fn ready_name(r: GpuReady) -> &'static str {
    match r {
        GpuReady::Event => "event",
        GpuReady::HostFlag => "flag",
    }
}

/// A GPU channel's builder from `b`: on `g`'s context, its senders signalling by `ready`.
fn cuda(b: ChannelBuilder<Host>, g: &Gpu, ready: Option<GpuReady>) -> ChannelBuilder<Cuda> {
    b.cuda(&g.ctx).ready(ready.unwrap_or_default())
}

/// A host channel from `b`, its pools pinned with `pin`'s driver if given.
fn host(
    b: ChannelBuilder<Host>,
    pin: &Option<Arc<Gpu>>,
    make: impl FnOnce(ChannelBuilder<Host>) -> Result<Channel<Host>, ChannelError>,
) -> Result<AnyChannel, ChannelError> {
    let b = match pin {
        Some(g) => b.pinned(&g.ctx),
        None => b,
    };
    make(b).map(|c| AnyChannel::Host(c, pin.clone()))
}

#[pymethods]
impl PyChannel {
    /// Creates channel ``name`` (exclusively, mode 0600) and returns it.
    ///
    /// ``capacity``: descriptor ring cells, a power of two. ``slots`` × ``slot_bytes``:
    /// each sender's pool (made when the sender is), reserved in ``/dev/shm`` for host
    /// channels (``device=None``) or allocated on GPU ``device``. ``mpmc``: any number of
    /// senders and receivers (else one of each). ``max_senders``: pool table entries
    /// (default 4, or 16 for MPMC). ``replace_stale``: replace a channel of this name
    /// that no process has open (left by a crash). ``pinned``: host channels only; this
    /// process's pools are registered with CUDA (page-locked), so that copies between
    /// CUDA tensors and slots are asynchronous DMA (see :meth:`Sender.send` and
    /// :meth:`Message.release`). Each process chooses it for itself (``open`` too).
    ///
    /// ``ready``: GPU channels only; how this process's senders tell a receiver that a
    /// sent tensor's writes are done. ``"event"`` (the default): an interprocess CUDA
    /// event, which the receiver's stream waits on; ``recv`` never waits for the GPU.
    /// ``"flag"``: the sender's stream writes a flag in shared memory after the tensor,
    /// and ``recv`` returns once the receiving CPU has seen it: the tensor is then
    /// complete for every stream, and the GPU is spared an event record and a wait per
    /// message (on an H100, 2–3.4× the tensors per second of events; docs/GPU.md). A
    /// ``recv`` that has taken a message waits for its flag however long the sender's
    /// GPU work takes (its ``timeout`` does not bound that part, nor does Ctrl-C), or
    /// until the sender closes its pool (``SenderGone``) or its process exits
    /// (``PeerDead``). Receivers follow each sender's choice; each process chooses for its
    /// own senders (``open`` too; a pickled channel keeps it). :meth:`sender` raises
    /// ``CudaError`` where the GPU lacks 64-bit stream memory operations.
    ///
    /// Raises ``AlreadyExists``, ``NoSpace``, ``ConfigError``, ``CudaError``, and
    /// ``ValueError`` for a ``ready`` that is not ``"event"`` or ``"flag"``, or one given
    /// with ``device=None``.
    #[staticmethod]
    #[pyo3(signature = (name, capacity=64, slots=8, slot_bytes=64 << 20, device=None, mpmc=false, max_senders=None, replace_stale=false, pinned=false, ready=None))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        name: String,
        capacity: u64,
        slots: u32,
        slot_bytes: u64,
        device: Option<i32>,
        mpmc: bool,
        max_senders: Option<u32>,
        replace_stale: bool,
        pinned: bool,
        ready: Option<&str>,
    ) -> PyResult<Self> {
        let signal = self::ready(device, ready)?;
        let pin = pinning(py, pinned, device)?;
        let gpu = gpu(py, device)?;
        let mut b = Channel::builder(name)
            .capacity(capacity)
            .slots(slots, slot_bytes)
            .replace_stale(replace_stale);
        if mpmc {
            b = b.mpmc();
        }
        if let Some(n) = max_senders {
            b = b.max_senders(n);
        }
        let made = py.detach(|| match &gpu {
            None => host(b, &pin, |b| b.create()),
            Some(g) => cuda(b, g, signal).create().map(|c| AnyChannel::Cuda(c, g.clone())),
        });
        made.map(|c| PyChannel::new(c, signal)).map_err(|e| errors::channel(py, e))
    }

    /// Opens channel ``name``, waiting up to ``timeout`` seconds for it to exist (``None``:
    /// as long as it takes, interruptible; ``0``: not at all). ``device``: the GPU this
    /// process uses for a GPU channel's slots (``None`` for a host channel). ``pinned``:
    /// as for :meth:`create`, for this process's pools and mappings. ``ready``: as for
    /// :meth:`create`, for this process's senders.
    ///
    /// Raises ``NotFound`` (also a ``FileNotFoundError``), ``WrongBackend``,
    /// ``ShmError`` (not a gpuring channel, another layout version, ...), ``CudaError``,
    /// ``ValueError`` (``ready``).
    #[staticmethod]
    #[pyo3(signature = (name, device=None, timeout=None, pinned=false, ready=None))]
    fn open(
        py: Python<'_>,
        name: String,
        device: Option<i32>,
        timeout: Option<f64>,
        pinned: bool,
        ready: Option<&str>,
    ) -> PyResult<Self> {
        let signal = self::ready(device, ready)?;
        let until = Until::new(py, timeout)?;
        let pin = pinning(py, pinned, device)?;
        let gpu = gpu(py, device)?;
        let builder = Channel::builder(name);
        let step = |_: Option<ChannelError>, slice: Duration| {
            let b: ChannelBuilder<Host> = builder.clone().open_timeout(slice);
            let r = match &gpu {
                None => host(b, &pin, |b| b.open()),
                Some(g) => cuda(b, g, signal).open().map(|c| AnyChannel::Cuda(c, g.clone())),
            };
            match r {
                Err(
                    e @ ChannelError::Segment(
                        ShmError::NotFound { .. } | ShmError::NotInitialized { .. },
                    ),
                ) => Step::Again(Some(e)),
                r => Step::Done(r),
            }
        };
        match wait(py, until, None, step)? {
            Ok(r) => r.map(|c| PyChannel::new(c, signal)).map_err(|e| errors::channel(py, e)),
            Err(last) => Err(errors::channel(
                py,
                last.unwrap_or(ChannelError::InvalidConfig { reason: "no channel of this name" }),
            )),
        }
    }

    /// A new sender, with its own slot pool (made now). SPSC channels have one live
    /// sender at a time. ``spins`` / ``yields``: how its waits wait (see
    /// :meth:`receiver`). Raises ``AttachError``, ``ConfigError`` (the pool table is
    /// full), ``NoSpace``, ``CudaError``, ``Closed``.
    #[pyo3(signature = (spins=None, yields=None))]
    fn sender(
        &self,
        py: Python<'_>,
        spins: Option<u32>,
        yields: Option<u32>,
    ) -> PyResult<PySender> {
        let ch = self.get(py)?;
        PySender::new(py, ch, policy(spins, yields))
    }

    /// A new receiver. SPSC channels have one live receiver at a time.
    ///
    /// A wait first spins ``spins`` times with a CPU pause between tries (each some
    /// 10–40 ns), then yields the CPU ``yields`` times, then sleeps on a futex (default
    /// 2048 and 8: a few µs of spinning). A receiver whose messages come tens of µs apart
    /// answers faster spinning longer (e.g. ``spins=100_000``, some 1–4 ms), at the cost
    /// of a busy core while it waits; the GIL is released all the while. A receive from a
    /// ``ready="flag"`` sender waits for the flag the same way: at least 4096 spins, the
    /// yields, then 4 µs naps at a timer slack of 1 µs for 0.5 ms, then naps doubling to
    /// 1 ms; ``spins=2**32 - 1`` never sleeps.
    ///
    /// Raises ``AttachError``, ``Closed``.
    #[pyo3(signature = (spins=None, yields=None))]
    fn receiver(
        &self,
        py: Python<'_>,
        spins: Option<u32>,
        yields: Option<u32>,
    ) -> PyResult<PyReceiver> {
        let ch = self.get(py)?;
        PyReceiver::new(py, ch, policy(spins, yields))
    }

    /// Lets go of this handle (senders and receivers made from it stay usable). The
    /// channel goes away once no process has it open and no message waits in it.
    fn close(&self) {
        let taken = self.ch.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(taken);
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.ch.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }

    /// The channel's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The GPU whose memory holds the slots, or ``None`` for host slots.
    #[getter]
    fn device(&self) -> Option<i32> {
        self.device
    }

    /// Whether any number of senders and receivers may attach.
    #[getter]
    fn mpmc(&self) -> bool {
        self.mpmc
    }

    /// Descriptor ring cells.
    #[getter]
    fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots in each sender's pool.
    #[getter]
    fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes in one slot: the largest tensor a message carries.
    #[getter]
    fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Pool table entries: senders that may have pools at once.
    #[getter]
    fn max_senders(&self) -> u32 {
        self.max_senders
    }

    /// How this process's senders signal a sent tensor: ``"event"`` or ``"flag"`` (see
    /// :meth:`create`); ``None`` for a host channel.
    #[getter]
    fn ready(&self) -> Option<&'static str> {
        self.ready.map(ready_name)
    }

    fn __repr__(&self) -> String {
        let place = self.device.map_or("host".to_owned(), |d| format!("cuda:{d}"));
        let flavor = if self.mpmc { "mpmc" } else { "spsc" };
        let ready = match self.ready {
            Some(GpuReady::HostFlag) => ", ready=\"flag\"",
            _ => "",
        };
        format!(
            "Channel({:?}, {flavor}, {place}, capacity={}, slots={}, slot_bytes={}{ready})",
            self.name, self.capacity, self.slots, self.slot_bytes
        )
    }

    /// Pickles by name: the copy opens the same channel, on the same device, its senders
    /// signalling as this process's do (``ready``).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let this = slf.get();
        let open = slf.get_type().cast_into::<PyType>()?.getattr("open")?;
        Ok((open, (this.name.clone(), this.device, None, false, this.ready.map(ready_name))))
    }
}
