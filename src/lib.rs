//! # gpuring
//!
//! Zero-copy hand-off of GPU tensors and host buffers between processes on one machine
//! (Linux). A sender leases a preallocated slot, writes its tensor in place and sends it;
//! a lock-free ring in POSIX shared memory carries only a fixed-size 384-byte
//! [`Descriptor`]; the receiver reads the slot in place, and dropping the message returns
//! it. Blocking waits spin, then sleep on a shared futex, and the fast path makes no
//! syscall while nobody sleeps.
//!
//! ```text
//! cargo add gpuring
//! ```
//!
//! ```no_run
//! use std::time::Duration;
//! use gpuring::{Channel, DType, TensorMeta};
//!
//! // Producer process: a channel whose senders each own 8 slots of 64 MB.
//! let ch = Channel::builder("frames").capacity(64).slots(8, 64 << 20).create()?;
//! let tx = ch.sender()?;
//! let mut lease = tx.acquire()?; // waits while every slot is in use
//! let meta = TensorMeta::contiguous(DType::F32, &[3, 2160, 2080])?;
//! lease[..4].copy_from_slice(&1.5f32.to_le_bytes()); // write the tensor in place
//! tx.send(lease, meta)?; // a descriptor travels, not the bytes
//! drop((tx, ch)); // the producer may exit now: the message waits for its receiver
//!
//! // Consumer process (it may start first: `open` waits up to its timeout for the name).
//! let ch = Channel::builder("frames").open_timeout(Duration::from_secs(10)).open()?;
//! let rx = ch.receiver()?;
//! for msg in rx.iter() {
//!     let msg = msg?; // validated against the pool table
//!     assert_eq!(msg.meta().shape(), &[3, 2160, 2080]);
//! } // every sender has left and everything was received: the loop ends
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Lifetimes.** A channel (or ring) lives while any process has it open or a message
//! waits in it: whoever leaves last removes it, with its pools. A receiver gets
//! everything that was sent, then [`RecvError::Disconnected`] once every sender has left
//! (`PeerDead` if one died); a sender whose receivers have all left gets
//! [`SendError::Disconnected`] with its lease back. Creating checks that `/dev/shm` can
//! hold the slots and reserves them ([`ShmError::NoSpace`] otherwise). `gpuring list`
//! and `gpuring clean` (the `gpuring-cli` crate) show and remove what a crash left.
//!
//! GPU tensors (feature `cuda`): `Channel::builder(..).cuda(&ctx)` makes a
//! `Channel<Cuda>`, whose slots are device memory handed off in stream order
//! (`Cuda` has an example). [`SpscRing`] and [`MpmcRing`] are the rings under the
//! channels, usable on their own for any `Pod` element.
//!
//! ## The API at a glance
//!
//! | what | types |
//! |---|---|
//! | channels of slots | [`Channel`], [`ChannelBuilder`], [`Sender`] / [`Lease`], [`Receiver`] / [`Message`], [`Host`], `Cuda` |
//! | rings of `Pod` values | [`Ring`]: [`SpscRing`], [`MpmcRing`]; [`RingOptions`], their producer and consumer ends |
//! | what travels | [`Descriptor`], [`TensorMeta`], [`DType`] |
//! | waiting | [`WaitPolicy`], [`LIVENESS_TICK`], [`wait_stats`], [`barrier_mode`]; async (feature `async`): `recv_async`, `send_async`, `push_async`, ..., `Messages`, `select_async`, `select`, `waiter_stats` |
//! | errors | [`ChannelError`], [`AcquireError`], [`SendError`], [`RecvError`]; [`RingError`], [`AttachError`], [`PushError`], [`PopError`], ...; [`ShmError`], [`Corrupted`] |
//! | tools | [`inspect`] (`inspect`, `list`, `clean`, `remove`), `cuda` (contexts, counters) |
//!
//! Every blocking operation comes in four forms that mean the same on every type:
//! `try_x` (never waits), `x` (waits as long as it takes), `x_timeout(.., Duration)` and
//! `x_deadline(.., Instant)`. A wait gives up with a `Disconnected` error once every peer
//! it waits for has left (seen at once), or `PeerDead` once they have died (noticed within
//! a [`LIVENESS_TICK`]); receivers and ring consumers have `iter()` / `try_iter()`, which
//! end there. With the `async` feature (on by default) each wait also has an `x_async`
//! form for any executor: the task parks on the same shared wait word, and one waiter
//! thread per process wakes it (docs/DESIGN.md, "Async waits").
//!
//! ## Modules, bottom to top
//!
//! Private; each imports only the rows above its own (`tests/layers.rs` checks it), and
//! two modules of one row do not know each other. `liveness` is asked by the rings, pools,
//! channels and tools, and asks none of them.
//!
//! | module | what lives there |
//! |---|---|
//! | `sync`, `fault` | the one import of atomics (loom's under `--cfg loom`); crash-test kill points |
//! | `descriptor`, `wait` | [`Descriptor`], [`DType`], [`TensorMeta`]; spin → yield → shared futex, the one deadline type, the `blocking!` forms; async waits (parked futures, waiter threads), one thread asleep on many words (the blocking `select`), `Selectable` |
//! | `layout`, `bus_guard` | `#[repr(C)]` shared-memory structures, one file per segment kind, [`Corrupted`]; the SIGBUS guard for segments truncated under us |
//! | `shm` | named segments: exclusive create (space checked and reserved), checked open, who has them open and removal by the last one out, byte locks; [`ShmError`] |
//! | `liveness` | participants and their locks, SPSC roles, the process probe, the tick loop; [`AttachError`] |
//! | `ring` | the SPSC and MPMC algorithms over any storage; slices; MPMC repair; rings placed in segments |
//! | `named`, `pool` | [`SpscRing`] / [`MpmcRing`] and their endpoints, [`RingError`]; the lease protocol, pools in shared memory, device pools, [`AcquireError`], [`CudaError`] |
//! | `channel` | [`Channel`], builder, pool table, senders, receivers, the GPU backend; channel errors |
//! | [`inspect`] | reading segments from outside, for tools |
//!
//! ## Safety
//!
//! Shared memory is writable by every process that maps it, so gpuring treats it as
//! untrusted input: every position, stamp, size and descriptor field read from it is read
//! once into a local and checked before use, and cell indices are masked with the capacity
//! this process validated at attach. A bad value is an error ([`Corrupted`] inside
//! [`PopError`], [`RecvError`], ...; [`ShmError`] at open), never an out-of-bounds access.
//! Elements are [`bytemuck::Pod`], valid for any bytes. Segments are created 0600 and
//! `open` refuses one of another owner or mode.
//!
//! Slot bytes are handed out as `&mut [u8]` ([`Lease`]) and `&[u8]` ([`Message`]) while
//! the lease protocol makes this process the slot's only legitimate user. A hostile process
//! that maps the pool can still write them meanwhile; it can garble the bytes it was
//! given, not reach outside the mapping. A segment truncated by another process after we
//! mapped it reads as zeros past its new end, and blocked endpoints report it as
//! [`Corrupted`] (docs/RELIABILITY.md lists what is covered and what is not).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
// Loom builds only the algorithms (its atomics cannot live in a mapping): what serves the
// shared-memory layers alone is unused there.
#![cfg_attr(loom, allow(dead_code, unused_imports, unused_macros))]

/// Writes `From<Inner> for Outer` for each `Variant(Inner)` listed: how `?` carries a lower
/// layer's error into this layer's.
macro_rules! error_from {
    ($outer:ident { $($variant:ident($inner:ty)),+ $(,)? }) => {
        $(
            impl From<$inner> for $outer {
                fn from(e: $inner) -> Self {
                    $outer::$variant(e)
                }
            }
        )+
    };
}

#[cfg(not(loom))]
mod bus_guard;
mod descriptor;
mod fault;
mod layout;
mod liveness;
mod pool;
mod ring;
mod sync;
mod wait;

#[cfg(not(loom))]
mod channel;
#[cfg(not(loom))]
pub mod inspect;
#[cfg(not(loom))]
mod named;
#[cfg(not(loom))]
mod shm;

pub use descriptor::{DType, Descriptor, DlDataType, MAX_DIMS, MetaError, TensorMeta};
pub use layout::{
    Corrupted, MAX_CAPACITY, MAX_PARTICIPANTS, MAX_POOLS as MAX_SENDERS, MAX_SLOT_SIZE, MAX_SLOTS,
};
pub use liveness::{AttachError, LIVENESS_TICK, Role};
pub use pool::{AcquireError, CudaError};
pub use ring::{PopError, PushError, TryPopError, TryPushError};
#[cfg(all(feature = "async", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use wait::reactor::{Selectable, WaiterStats, waiter_stats};
pub use wait::{BarrierMode, WaitPolicy, WaitStats, barrier_mode, wait_stats};

#[cfg(not(loom))]
pub use channel::{
    Backend, Channel, ChannelBuilder, ChannelError, Flavor, Host, Lease, MAX_CHANNEL_NAME, Message,
    PoolInfo, PoolState, Receiver, RecvError, SendError, Sender,
};
#[cfg(all(feature = "cuda", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use channel::{Cuda, DeviceView, GpuReady};
#[cfg(all(feature = "async", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use channel::{Messages, Selected, select, select_async, select_timeout};
#[cfg(all(feature = "async", feature = "cuda", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "async", feature = "cuda"))))]
pub use channel::{SelectedOn, select_on, select_on_async};
#[cfg(not(loom))]
pub use named::{
    Mpmc, MpmcConsumer, MpmcProducer, MpmcRing, Ring, RingError, RingFlavor, RingOptions, Spsc,
    SpscConsumer, SpscProducer, SpscRing,
};
#[cfg(not(loom))]
pub use shm::{DEFAULT_OPEN_TIMEOUT, ShmError};

/// CUDA helpers (feature `cuda`): a context for a device, whether a driver is present, the
/// count of IPC handles this process has opened, and where two processes' GPU work meets
/// ([`device_info`](cuda::device_info), [`GpuPath`](cuda::GpuPath): one GPU time-sliced
/// between the processes, one GPU under CUDA MPS, or two GPUs; docs/GPU.md says what each
/// costs). cudarc loads the driver at run time, so this builds everywhere and says
/// [`CudaError::Unavailable`] where there is no driver.
///
/// ```no_run
/// let ctx = gpuring::cuda::context(0)?; // the primary context of device 0
/// let stream = ctx.new_stream()?;
/// # let _ = stream;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(all(feature = "cuda", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda {
    pub use crate::pool::CudaError;
    pub use crate::pool::cuda::{CudaContext, CudaStream, available, context, ipc_opens};
    pub use crate::pool::pinned::{host_registered, host_registrations};
    pub use crate::pool::setup::{DeviceInfo, GpuPath, MPS_HINT, device_info};
}

/// Not API: what the crate's own tests, fuzz targets and benchmarks need of its insides.
/// No stability promise of any kind.
#[doc(hidden)]
pub mod internal {
    pub use crate::layout::*;
    pub use crate::liveness::{Gone, ProcessState, Unwatched, Watch, process_state};
    pub use crate::pool::{HeapPool, PoolCore, SlotRef, heap_pool};
    pub use crate::ring::{Heap, Storage, mpmc, repair, spsc};

    #[cfg(not(loom))]
    pub use crate::shm::Segment;

    /// The segment an SPSC ring lives in.
    #[cfg(not(loom))]
    pub fn ring_segment<T: bytemuck::Pod + Send>(ring: &crate::SpscRing<T>) -> &Segment {
        ring.segment()
    }

    /// Pushes a raw descriptor into a channel's ring, bypassing the sender's pool: what
    /// tests and fuzz targets use to see what receivers do with forged descriptors.
    ///
    /// # Errors
    ///
    /// As a blocking push.
    #[cfg(not(loom))]
    pub fn push_raw<B: crate::Backend>(
        tx: &crate::Sender<B>,
        d: crate::Descriptor,
    ) -> Result<(), crate::PushError<()>> {
        tx.push_raw(d)
    }
}

/// The README's examples, compiled as doctests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
