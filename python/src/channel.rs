//! `gpuring.Channel`: create or open a named channel, make its senders and receivers.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpuring::{
    Backend, Channel, ChannelBuilder, ChannelError, Cuda, Flavor, GpuReady, Host, Pinned, ShmError,
    WaitPolicy,
};
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::blocking::{Step, Until, wait_polling};
use crate::errors::{
    Class, ClassOf, Raised, capacity_arg, closed, opt_max_senders_arg, opt_spins_arg,
    opt_yields_arg, raise, slot_bytes_arg, slots_arg,
};
use crate::gpu::Gpu;
use crate::receiver::PyReceiver;
use crate::sender::PySender;

/// What `__reduce__` gives pickle: `Channel.open` and its arguments (name, device,
/// timeout, pinned, ready).
type Reduced<'py> =
    (Bound<'py, PyAny>, (String, Option<i32>, Option<f64>, bool, Option<&'static str>));

/// A channel of any backend.
#[derive(Clone)]
pub(crate) enum AnyChannel {
    /// A host channel.
    Host(Channel<Host>),
    /// A host channel whose pools this process pins (``pinned=True``), with the GPU whose
    /// driver pins them.
    Pinned(Channel<Pinned>, Arc<Gpu>),
    /// A GPU channel, and its device.
    Cuda(Channel<Cuda>, Arc<Gpu>),
}

/// Runs `$body` with `$c` bound to the channel of whatever backend `$any` holds.
macro_rules! each_channel {
    ($any:expr, $c:ident => $body:expr) => {
        match $any {
            AnyChannel::Host($c) => $body,
            AnyChannel::Pinned($c, _) => $body,
            AnyChannel::Cuda($c, _) => $body,
        }
    };
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
    broadcast: bool,
    capacity: usize,
    slots: u32,
    slot_bytes: u64,
    max_senders: u32,
    redelivers: bool,
    lagging: bool,
    /// How this process's senders of a GPU channel signal a send, as `ready=` asked
    /// (`None`: the default, or a host channel).
    ready: Option<GpuReady>,
}

impl PyChannel {
    fn new(ch: AnyChannel, ready: Option<GpuReady>) -> Self {
        let (name, flavor, capacity, (slots, slot_bytes), max_senders, redelivers, lagging) = each_channel!(&ch, c => (
            c.name().to_owned(),
            c.flavor(),
            c.capacity(),
            c.slots(),
            c.max_senders(),
            c.redelivers(),
            c.is_lagging(),
        ));
        let device = match &ch {
            AnyChannel::Cuda(_, g) => Some(g.ordinal),
            _ => None,
        };
        PyChannel {
            ch: Mutex::new(Some(ch)),
            name,
            device,
            mpmc: flavor == Flavor::Mpmc,
            broadcast: flavor == Flavor::Broadcast,
            capacity,
            slots,
            slot_bytes,
            max_senders,
            redelivers,
            lagging,
            ready,
        }
    }

    fn get(&self, py: Python<'_>) -> PyResult<AnyChannel> {
        let ch = self.ch.lock().unwrap_or_else(PoisonError::into_inner);
        ch.clone().ok_or_else(|| closed(py, "channel"))
    }
}

/// A wait policy from the Python arguments (the Rust defaults where not given; spins given
/// are a count, with no time limit).
fn policy(spins: Option<u32>, yields: Option<u32>) -> WaitPolicy {
    let d = WaitPolicy::default();
    let p = WaitPolicy::spin_then_sleep(spins.unwrap_or(d.spins()), yields.unwrap_or(d.yields()));
    match (spins, d.spin_limit()) {
        (None, Some(limit)) => p.spinning_at_most(limit),
        _ => p,
    }
}

fn gpu(py: Python<'_>, device: Option<i32>) -> PyResult<Option<Arc<Gpu>>> {
    device.map(|d| Gpu::new(d).map_err(|e| e.err(py))).transpose()
}

/// The GPU whose driver pins a host channel's pools (`pinned=True`: device 0; pinning is
/// portable to every device), or `None`.
fn pinning(py: Python<'_>, pinned: bool, device: Option<i32>) -> PyResult<Option<Arc<Gpu>>> {
    match (pinned, device) {
        (false, _) => Ok(None),
        (true, None) => gpu(py, Some(0)),
        (true, Some(_)) => Err(raise(
            py,
            Class::ConfigError,
            "pinned=True is for host channels (device=None): device slots need no pinning",
        )),
    }
}

/// The `ready=` argument: how this process's senders of a GPU channel signal a send
/// (`None`: gpuring's default, host flags where the GPU can). Giving one for a host
/// channel is an error.
fn ready(py: Python<'_>, device: Option<i32>, ready: Option<&str>) -> PyResult<Option<GpuReady>> {
    match (device, ready) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(raise(
            py,
            Class::ConfigError,
            "ready= is for GPU channels (device=N): host slots are ready when send returns",
        )),
        (Some(_), None) => Ok(None),
        (Some(_), Some("event")) => Ok(Some(GpuReady::Event)),
        (Some(_), Some("flag")) => Ok(Some(GpuReady::HostFlag)),
        (Some(_), Some(other)) => Err(raise(
            py,
            Class::ConfigError,
            format!("ready={other:?}: expected \"event\" or \"flag\""),
        )),
    }
}

/// The name `ready=` takes for `r`.
fn ready_name(r: GpuReady) -> &'static str {
    match r {
        GpuReady::Event => "event",
        GpuReady::HostFlag => "flag",
    }
}

/// How [`make`] gets the channel.
#[derive(Clone, Copy)]
enum Make {
    Create,
    Open,
    OpenOrCreate,
}

impl Make {
    fn of<B: Backend>(self, b: ChannelBuilder<B>) -> Result<Channel<B>, ChannelError<B>> {
        match self {
            Make::Create => b.create(),
            Make::Open => b.open(),
            Make::OpenOrCreate => b.open_or_create(),
        }
    }
}

/// Makes the channel of `b`'s options for this process's setup (host, pinned by `pin`, or
/// on `gpu` with its senders signalling by `ready`), as `how` says: the error as what to
/// raise, or `None` for a name not there (yet).
fn make(
    b: ChannelBuilder<Host>,
    pin: &Option<Arc<Gpu>>,
    gpu: &Option<Arc<Gpu>>,
    ready: Option<GpuReady>,
    how: Make,
) -> Result<AnyChannel, Option<Raised>> {
    fn done<B: Backend>(
        r: Result<Channel<B>, ChannelError<B>>,
        wrap: impl FnOnce(Channel<B>) -> AnyChannel,
    ) -> Result<AnyChannel, Option<Raised>> {
        r.map(wrap).map_err(|e| match e {
            ChannelError::Segment(ShmError::NotFound { .. } | ShmError::NotInitialized { .. }) => {
                None
            }
            e => Some(e.raised()),
        })
    }
    match (pin, gpu) {
        (_, Some(g)) => {
            // The channel handle's stream: the legacy default one; each call sets its own.
            let b = b.cuda(&g.stream(0));
            let b = match ready {
                Some(r) => b.ready(r),
                None => b,
            };
            done(how.of(b), |c| AnyChannel::Cuda(c, g.clone()))
        }
        (Some(g), None) => {
            let b = b.pinned(&g.ctx);
            done(how.of(b), |c| AnyChannel::Pinned(c, g.clone()))
        }
        (None, None) => done(how.of(b), AnyChannel::Host),
    }
}

/// The options of `create` and `open_or_create` besides the builder's.
struct Options<'a> {
    device: Option<i32>,
    mpmc: bool,
    broadcast: bool,
    max_senders: Option<u32>,
    redeliver: bool,
    lagging: bool,
    pinned: bool,
    ready: Option<&'a str>,
}

impl Options<'_> {
    /// Makes the channel of `b` and these options, as `how` says (not `Open`: that one
    /// waits in slices).
    fn make(self, py: Python<'_>, b: ChannelBuilder<Host>, how: Make) -> PyResult<PyChannel> {
        let signal = ready(py, self.device, self.ready)?;
        let pin = pinning(py, self.pinned, self.device)?;
        let gpu = gpu(py, self.device)?;
        if self.mpmc && self.broadcast {
            return Err(raise(py, Class::ConfigError, "a channel is mpmc or broadcast, not both"));
        }
        let b = if self.mpmc { b.mpmc() } else { b };
        let b = if self.broadcast { b.broadcast() } else { b };
        let b = match self.max_senders {
            Some(n) => b.max_senders(n),
            None => b,
        };
        let b = b.redeliver(self.redeliver).lagging(self.lagging);
        let made = py.detach(|| make(b, &pin, &gpu, signal, how));
        made.map(|c| PyChannel::new(c, signal)).map_err(|e| {
            e.map_or_else(|| raise(py, Class::NotFound, "the channel vanished"), |e| e.into_err(py))
        })
    }
}

#[pymethods]
impl PyChannel {
    /// Creates channel ``name`` (exclusively, mode 0600) and returns it.
    ///
    /// ``capacity``: descriptor ring cells, a power of two. ``slots`` × ``slot_bytes``:
    /// each sender's pool (made when the sender is), reserved in ``/dev/shm`` for host
    /// channels (``device=None``) or allocated on GPU ``device``. ``mpmc``: any number of
    /// senders and receivers (else one of each). ``broadcast``: one sender, and up to 63
    /// receivers that each get every message sent while they are attached, all reading the
    /// one slot in place; a slot goes back once every receiver it went to has released its
    /// message; the slowest receiver holds the sender back, and one that dies or leaves
    /// stops holding it within a liveness tick (no message is delivered again: ``redeliver``
    /// does not apply). ``lagging``: broadcast channels only; the sender never waits for a
    /// receiver that is behind: with no free slot it reuses the slot of the oldest message
    /// no receiver holds, and a receiver that had not read it gets ``Lagged`` (its
    /// ``missed`` attribute says how many), then the oldest message still there; the sender
    /// waits only while every slot holds a message some receiver has in hand (received,
    /// not yet released). ``max_senders``: pool table entries
    /// (default 4, or 16 for MPMC). ``redeliver``: a message whose receiver died holding
    /// it (killed after ``recv`` returned it, before it was released) is delivered again
    /// to the next receiver, with :attr:`Message.redelivered` set, so that nothing sent is
    /// lost to a receiver's crash (at least once); ``False``: it is dropped (at most once),
    /// for streams where a late duplicate is worse than a gap. ``replace_stale``: replace a channel of this name
    /// that no process has open (left by a crash). ``pinned``: host channels only; this
    /// process's pools are registered with CUDA (page-locked), so that copies between
    /// CUDA tensors and slots are asynchronous DMA (see :meth:`Sender.send` and
    /// :meth:`Message.release`). Each process chooses it for itself (``open`` too).
    ///
    /// ``ready``: GPU channels only; how this process's senders tell a receiver that a
    /// sent tensor's writes are done. ``None`` (the default): ``"flag"`` where the GPU has
    /// 64-bit stream memory operations, else ``"event"``. ``"flag"``: the sender's stream
    /// writes a flag in shared memory after the tensor, and ``recv`` returns once the
    /// receiving CPU has seen it: the tensor is then complete for every stream, no GPU
    /// waits on another process's work (without CUDA MPS that spares each hand-off a GPU
    /// context switch), and the GPU is spared an event record and a wait per message. A
    /// ``recv`` that has taken a message waits for its flag however long the sender's GPU
    /// work takes (its ``timeout`` does not bound that part, nor does Ctrl-C), or until the
    /// sender closes its pool or its process exits (then ``SenderGone``: dropped unread).
    /// ``"event"``: an interprocess CUDA event, which the receiver's stream waits on;
    /// ``recv`` never waits for the GPU (choose it when the receiving thread has other work
    /// while the sender's kernels run, or ``timeout`` must bound every ``recv``).
    /// Receivers follow each sender's choice; each process chooses for its own senders
    /// (``open`` too; a pickled channel keeps it). :meth:`sender` raises ``CudaError`` for
    /// ``"flag"`` where the GPU lacks 64-bit stream memory operations.
    ///
    /// Raises ``AlreadyExists``, ``NoSpace``, ``ConfigError`` (also for a ``ready`` that is
    /// not ``"event"`` or ``"flag"``, or one given with ``device=None``), ``CudaError``.
    #[staticmethod]
    #[pyo3(signature = (name, capacity=256, slots=8, slot_bytes=1 << 20, device=None, mpmc=false, max_senders=None, redeliver=true, replace_stale=false, pinned=false, ready=None, broadcast=false, lagging=false))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        name: String,
        #[pyo3(from_py_with = capacity_arg)] capacity: u64,
        #[pyo3(from_py_with = slots_arg)] slots: u32,
        #[pyo3(from_py_with = slot_bytes_arg)] slot_bytes: u64,
        device: Option<i32>,
        mpmc: bool,
        #[pyo3(from_py_with = opt_max_senders_arg)] max_senders: Option<u32>,
        redeliver: bool,
        replace_stale: bool,
        pinned: bool,
        ready: Option<&str>,
        broadcast: bool,
        lagging: bool,
    ) -> PyResult<Self> {
        let b = Channel::builder(name)
            .capacity(capacity)
            .slots(slots, slot_bytes)
            .replace_stale(replace_stale);
        let opts =
            Options { device, mpmc, broadcast, max_senders, redeliver, lagging, pinned, ready };
        opts.make(py, b, Make::Create)
    }

    /// Opens channel ``name`` if it exists, and creates it (with these options, as
    /// :meth:`create`) where it does not: what a process that may be restarted calls,
    /// producer or consumer. A channel whose creator died (killed before any consumer
    /// came, say) is attached to as it is, with the messages that wait in it; a restarted
    /// sender is a new sender of it. Of several processes calling this at once, one
    /// creates the channel and the others open it. An existing channel keeps its
    /// creator's options (capacity, slots); ``mpmc=True`` asks that it be MPMC,
    /// ``broadcast=True`` a broadcast channel.
    ///
    /// Raises what :meth:`open` and :meth:`create` raise.
    #[staticmethod]
    #[pyo3(signature = (name, capacity=256, slots=8, slot_bytes=1 << 20, device=None, mpmc=false, max_senders=None, redeliver=true, pinned=false, ready=None, broadcast=false, lagging=false))]
    #[allow(clippy::too_many_arguments)]
    fn open_or_create(
        py: Python<'_>,
        name: String,
        #[pyo3(from_py_with = capacity_arg)] capacity: u64,
        #[pyo3(from_py_with = slots_arg)] slots: u32,
        #[pyo3(from_py_with = slot_bytes_arg)] slot_bytes: u64,
        device: Option<i32>,
        mpmc: bool,
        #[pyo3(from_py_with = opt_max_senders_arg)] max_senders: Option<u32>,
        redeliver: bool,
        pinned: bool,
        ready: Option<&str>,
        broadcast: bool,
        lagging: bool,
    ) -> PyResult<Self> {
        let b = Channel::builder(name).capacity(capacity).slots(slots, slot_bytes);
        let opts =
            Options { device, mpmc, broadcast, max_senders, redeliver, lagging, pinned, ready };
        opts.make(py, b, Make::OpenOrCreate)
    }

    /// Opens channel ``name``, waiting up to ``timeout`` seconds for it to exist (default 1,
    /// as in Rust; ``None``: as long as it takes, interruptible; ``0``: not at all). ``device``: the GPU this
    /// process uses for a GPU channel's slots (``None`` for a host channel). ``pinned``:
    /// as for :meth:`create`, for this process's pools and mappings. ``ready``: as for
    /// :meth:`create`, for this process's senders.
    ///
    /// Raises ``NotFound`` (also a ``FileNotFoundError``), ``WrongBackend``,
    /// ``ShmError`` (not a gpuring channel, another layout version, ...), ``CudaError``,
    /// ``ValueError`` (``ready``).
    #[staticmethod]
    #[pyo3(signature = (name, device=None, timeout=1.0, pinned=false, ready=None))]
    fn open(
        py: Python<'_>,
        name: String,
        device: Option<i32>,
        timeout: Option<f64>,
        pinned: bool,
        ready: Option<&str>,
    ) -> PyResult<Self> {
        let signal = self::ready(py, device, ready)?;
        let until = Until::new(py, timeout)?;
        let pin = pinning(py, pinned, device)?;
        let gpu = gpu(py, device)?;
        let builder = Channel::builder(name.clone());
        let step = |(), slice: Option<Duration>, _| match make(
            builder.clone().open_timeout(slice.unwrap_or_default()),
            &pin,
            &gpu,
            signal,
            Make::Open,
        ) {
            Err(None) => Step::Again(()),
            r => Step::Done(r),
        };
        match wait_polling(py, until, (), step)? {
            Ok(Ok(c)) => Ok(PyChannel::new(c, signal)),
            Ok(Err(e)) => Err(e.map_or_else(
                || raise(py, Class::NotFound, format!("no channel {name:?}")),
                |e| e.into_err(py),
            )),
            Err(()) => Err(raise(py, Class::NotFound, format!("no channel {name:?} (timed out)"))),
        }
    }

    /// A new sender, with its own slot pool (made now). SPSC channels have one live
    /// sender at a time. ``spins`` / ``yields``: how its waits wait (see
    /// :meth:`receiver`). ``slots`` / ``slot_bytes``: this sender's pool, where it needs
    /// other slots than the channel's (larger items, fewer slots); receivers take each
    /// sender's messages from its own pool. Raises ``AttachError``, ``ConfigError`` (the
    /// pool table is full, or slots out of range), ``NoSpace``, ``CudaError``, ``Closed``.
    #[pyo3(signature = (spins=None, yields=None, *, slots=None, slot_bytes=None))]
    fn sender(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = opt_spins_arg)] spins: Option<u32>,
        #[pyo3(from_py_with = opt_yields_arg)] yields: Option<u32>,
        slots: Option<u32>,
        slot_bytes: Option<u64>,
    ) -> PyResult<PySender> {
        let ch = self.get(py)?;
        let (count, size) = each_channel!(&ch, c => c.slots());
        let own = (slots.unwrap_or(count), slot_bytes.unwrap_or(size));
        PySender::new(py, ch, policy(spins, yields), own)
    }

    /// A new receiver. SPSC channels have one live receiver at a time.
    ///
    /// A wait first spins ``spins`` times with a CPU pause between tries (each some
    /// 10–70 ns), then yields the CPU ``yields`` times, then sleeps on a futex (default
    /// 2048 spins or 30 µs of them, whichever ends first, and 8 yields; spins given here
    /// are a count, with no time limit). A receiver whose waits keep ending in sleeps
    /// longer than 100 µs spins a quarter as much each time, down to 64 spins, until a
    /// wait answered within a shorter sleep earns them all back. A receiver whose messages
    /// come further apart than that answers faster spinning longer (e.g.
    /// ``spins=100_000``, some 1.5–4 ms), at the cost of a busy core while it waits; the
    /// GIL is released all the while. A receive from a
    /// ``ready="flag"`` sender waits for the flag the same way: at least 4096 spins, the
    /// yields, then 4 µs naps at a timer slack of 1 µs for 0.5 ms, then naps doubling to
    /// 1 ms; ``spins=2**32 - 1`` never sleeps.
    ///
    /// Raises ``AttachError``, ``Closed``.
    #[pyo3(signature = (spins=None, yields=None))]
    fn receiver(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = opt_spins_arg)] spins: Option<u32>,
        #[pyo3(from_py_with = opt_yields_arg)] yields: Option<u32>,
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

    /// Messages sent and not yet received, now (a snapshot, as ``Queue.qsize()``).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(match self.get(py)? {
            AnyChannel::Host(c) => c.len(),
            AnyChannel::Pinned(c, _) => c.len(),
            AnyChannel::Cuda(c, _) => c.len(),
        })
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

    /// Whether every receiver gets every message (one sender; see :meth:`create`).
    #[getter]
    fn broadcast(&self) -> bool {
        self.broadcast
    }

    /// Whether the sender never waits for a receiver that is behind (a lagging broadcast
    /// channel; see :meth:`create`).
    #[getter]
    fn lagging(&self) -> bool {
        self.lagging
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

    /// Whether a message whose receiver died holding it is delivered again (the
    /// creator's ``redeliver``).
    #[getter]
    fn redelivers(&self) -> bool {
        self.redelivers
    }

    /// How this process's senders signal a sent tensor, as ``ready=`` asked: ``"event"``
    /// or ``"flag"`` (see :meth:`create`); ``None`` for the default, or a host channel.
    #[getter]
    fn ready(&self) -> Option<&'static str> {
        self.ready.map(ready_name)
    }

    fn __repr__(&self) -> String {
        let place = self.device.map_or("host".to_owned(), |d| format!("cuda:{d}"));
        let flavor = match (self.mpmc, self.broadcast) {
            (true, _) => "mpmc",
            (_, true) => "broadcast",
            _ => "spsc",
        };
        let ready = match self.ready {
            Some(GpuReady::HostFlag) => ", ready=\"flag\"",
            Some(GpuReady::Event) => ", ready=\"event\"",
            None => "",
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
        // Pinning is each process's choice (a CPU-only child needs no CUDA): not pickled.
        Ok((open, (this.name.clone(), this.device, None, false, this.ready.map(ready_name))))
    }
}
