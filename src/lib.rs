//! # gpuring
//!
//! Zero-copy hand-off of GPU tensors and host buffers between processes on one machine.
//! A lock-free ring in POSIX shared memory carries fixed-size [`Descriptor`]s; the data
//! stays where it was written. Blocking waits spin, then sleep on a shared futex, and the
//! fast path makes no syscall while nobody sleeps.
//!
//! ```no_run
//! use gpuring::{Descriptor, DType, SpscRing, TensorMeta};
//!
//! // Producer process.
//! let ring = SpscRing::<Descriptor>::create("frames", 1024)?;
//! let mut tx = ring.producer()?;
//! let meta = TensorMeta::contiguous(DType::F16, &[3, 224, 224])?;
//! tx.push(Descriptor::new(0, &meta))?;
//!
//! // Consumer process.
//! let ring = SpscRing::<Descriptor>::open("frames")?;
//! let mut rx = ring.consumer()?;
//! let d = rx.pop()?;
//! assert_eq!(d.meta()?.shape(), &[3, 224, 224]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Modules, bottom to top
//!
//! | module | what lives there |
//! |---|---|
//! | `sync` (private) | the one import of atomics and `UnsafeCell`; loom's under `--cfg loom` |
//! | [`layout`] | `#[repr(C)]` shared-memory structures and their sizes |
//! | [`descriptor`] | [`Descriptor`], [`DType`], [`TensorMeta`] |
//! | [`wait`] | spin → yield → shared futex, with a sleeper count |
//! | [`ring`] | the SPSC and MPMC algorithms, generic over storage; heap storage |
//! | [`shm`] | named segments: exclusive create, checked open, unlink |
//! | [`named`] | [`SpscRing`] / [`MpmcRing`]: rings in named shared memory |
//! | [`pool`] | slot pools: generation leases over a free-slot ring; the host backend |
//! | [`cuda`] | the CUDA backend (feature `cuda`): device pools, IPC handles, stream-ordered hand-off |
//! | [`inspect`] | reading segments from outside: `inspect`, `list`, `clean` (the CLI's) |
//! | [`channel`] | [`Channel`], [`Sender`] / [`Lease`], [`Receiver`] / [`Message`]: zero-copy buffers |
//!
//! ## Safety
//!
//! Shared memory is writable by every process that maps it, so gpuring treats it as
//! untrusted input: every position, stamp, size and descriptor field read from it is read
//! once into a local and checked before use, and cell indices are masked with the capacity
//! this process validated at attach. A bad value is an error ([`ring::Corrupted`],
//! [`ShmError`], [`MetaError`]), never an out-of-bounds access. Elements are
//! [`bytemuck::Pod`], valid for any bytes. Segments are created 0600 and `open` refuses one
//! of another owner or mode.
//!
//! Slot bytes are handed out as `&mut [u8]` ([`Lease`]) and `&[u8]` ([`Message`]) while
//! the lease protocol makes this process the slot's only legitimate user. A hostile process
//! that maps the pool can still write them meanwhile; it can garble the bytes it was
//! given, not reach outside the mapping.
//!
//! One limit remains (see `docs/RELIABILITY.md` once written): a segment truncated by a
//! hostile process after we mapped it raises `SIGBUS` on access.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(not(loom))]
mod bus_guard;
mod fault;
mod sync;

pub mod descriptor;
pub mod layout;
pub mod pool;
pub mod ring;
pub mod wait;

#[cfg(not(loom))]
pub mod channel;
pub mod cuda;
#[cfg(not(loom))]
pub mod inspect;
#[cfg(not(loom))]
pub mod named;
#[cfg(not(loom))]
pub mod shm;

#[cfg(not(loom))]
pub use channel::{
    Channel, ChannelBuilder, Flavor, Lease, Message, PoolInfo, PoolState, Receiver, RecvError,
    SendError, Sender,
};
#[cfg(all(feature = "cuda", not(loom)))]
pub use channel::{DeviceView, GpuLease, GpuMessage};
pub use cuda::CudaError;
pub use descriptor::{DType, Descriptor, MetaError, TensorMeta};
#[cfg(not(loom))]
pub use named::{
    MpmcConsumer, MpmcProducer, MpmcRing, RingOptions, SpscConsumer, SpscProducer, SpscRing,
};
pub use pool::AcquireError;
pub use ring::{Corrupted, PopError, PushError, TryPopError, TryPushError};
#[cfg(not(loom))]
pub use shm::{Role, ShmError};
pub use wait::{BarrierMode, WaitPolicy, WaitStats, barrier_mode, wait_stats};

/// The README's examples, compiled as doctests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
