//! # gpuring
//!
//! Zero-copy hand-off of GPU tensors and host buffers between processes on one machine
//! (Linux). A sender leases a preallocated slot, writes its tensor in place and sends it;
//! a lock-free ring in POSIX shared memory carries only a fixed-size 384-byte
//! [`Descriptor`]; the receiver reads the slot in place, and dropping the message returns
//! it. Blocking waits spin, then sleep on a shared futex, and the fast path makes no
//! syscall while nobody sleeps.
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
//! GPU tensors (feature `cuda`): `Channel::builder(..).cuda(&stream)` makes a
//! `Channel<Cuda>`, whose slots are device memory handed off in the order of each
//! endpoint's CUDA stream (`Cuda` has an example); `.pinned(&ctx)` a `Channel<Pinned>`,
//! host slots registered with CUDA for stream-ordered copies. The same calls serve every
//! backend. [`SpscRing`] and [`MpmcRing`] are the rings under the channels, usable on their
//! own for any `Pod` element, made the same way (`SpscRing::<T>::builder(name)`).
//!
//! ## The API at a glance
//!
//! | what | types |
//! |---|---|
//! | channels of slots | [`Channel`], [`ChannelBuilder`], [`Sender`] / [`Lease`], [`Receiver`] / [`Message`]; backends [`Host`], `Cuda`, `Pinned` |
//! | rings of `Pod` values | [`Ring`]: [`SpscRing`], [`MpmcRing`]; [`RingBuilder`], their producer and consumer ends |
//! | what travels | [`Descriptor`], [`TensorMeta`], [`DType`] |
//! | waiting | [`WaitPolicy`], [`DEFAULT_SPIN_LIMIT`], [`LIVENESS_TICK`]; several sources at once: [`select`], [`try_select`], [`select_timeout`], [`select_deadline`]; async (feature `async`): `recv_async`, `send_async`, `push_async`, ..., `Messages`, `select_async` |
//! | errors | one type per call form: [`RecvError`] / [`TryRecvError`] / [`RecvTimeoutError`], the same for [`SendError`], [`AcquireError`], [`PushError`], [`PopError`]; [`ChannelError`], [`RingError`], [`AttachError`], [`ShmError`], [`Corrupted`] |
//! | tools | [`inspect`] (`inspect`, `list`, `clean`, `remove`), `cuda` (contexts, counters, where two processes' GPU work meets) |
//!
//! Every blocking operation comes in four forms that mean the same on every type:
//! `try_x` (never waits), `x` (waits as long as it takes), `x_timeout(.., Duration)` and
//! `x_deadline(.., Instant)`; each returns an error type with the variants it can produce
//! (`recv` never says `Timeout`, `try_recv` says `Empty`, `recv_timeout` says `Timeout`). A wait gives up with a `Disconnected` error once every peer
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
//! | `layout`, `bus_guard` | `#[repr(C)]` shared-memory structures, one file per segment kind, their typed views, [`Corrupted`]; the SIGBUS guard for segments truncated under us |
//! | `shm` | named segments: exclusive create (space checked and reserved), checked open, who has them open and removal by the last one out, byte locks; [`ShmError`] |
//! | `liveness` | participants and their locks, SPSC roles, the process probe, the tick loop; [`AttachError`] |
//! | `ring` | the SPSC and MPMC algorithms over any storage; slices; MPMC repair; rings placed in segments |
//! | `named`, `pool` | [`SpscRing`] / [`MpmcRing`], their builder and endpoints, [`RingError`]; the lease protocol, pools in shared memory and the typed views of their parts |
//! | `channel` | [`Channel`], builder, pool table, senders, receivers, the [`Backend`] trait and [`Host`]; channel errors. Nothing of CUDA |
//! | `cuda`, [`inspect`] | the GPU wing (feature `cuda`): device pools, events and flags, pinned registration and lanes, the `Cuda` and `Pinned` backends, `CudaError`; reading segments from outside, for tools |
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
// Without the GPU wing (feature `cuda`), the seams it plugs into go unused; the default
// build, which has it, is the one whose dead code the lints check.
#![cfg_attr(all(not(feature = "cuda"), not(loom)), allow(dead_code))]

/// Writes `From<Inner> for Outer` for each `Variant(Inner)` listed: how `?` carries a lower
/// layer's error into this layer's.
macro_rules! error_from {
    ($outer:ident<$g:ident: $bound:path> { $($variant:ident($inner:ty)),+ $(,)? }) => {
        $(
            impl<$g: $bound> From<$inner> for $outer<$g> {
                fn from(e: $inner) -> Self {
                    $outer::$variant(e)
                }
            }
        )+
    };
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

/// `Error::source` for error types whose one wrapped cause is an `Io { op, source }`
/// variant that their `Display` shows: the cause's own source, not the cause (a report that
/// walks the chain then prints it once).
macro_rules! io_error_source {
    ($($ty:ident),+) => {
        $(
            impl std::error::Error for $ty {
                fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                    match self {
                        $ty::Io { source, .. } => source.source(),
                        _ => None,
                    }
                }
            }
        )+
    };
}

/// Writes the error types of one blocking operation from one list of its failures, so that
/// each call form returns a type with exactly the variants it can produce:
///
/// - `$base`, for the form that waits as long as it takes (`x`, `x_async`): the failures;
/// - `$timeout`, for the forms with a deadline (`x_timeout`, `x_deadline`): the failures,
///   and `Timeout` (carrying back what the call was given, where it takes something);
/// - optionally `$try`, for the form that does not wait (`try_x`): the failures, and the
///   variant that says nothing could be done now (`Empty`, `Full`, `Exhausted`).
///
/// A wait is written once, returning `$timeout` (its "nothing now" of `Deadline::Now` said
/// as `Timeout`); each form converts with `from_timeout`. Every variant's message is
/// written once; `source` gives a variant's `Error::source` (the cause it wraps and does not
/// display, or the source of the cause it displays), `None` where not given.
macro_rules! wait_errors {
    (
        generics $decl:tt $params:tt $args:tt;
        derive $derive:tt;
        $(#[$base_meta:meta])* base $base:ident;
        $(#[$timeout_meta:meta])* timeout $timeout:ident $timeout_variant:tt
        $($(#[$try_meta:meta])* try $try:ident $try_variant:tt)?
        fmt |$f:ident|;
        variants $variants:tt
    ) => {
        wait_errors! {
            @type $decl $params $args $derive $base $timeout;
            $(#[$base_meta])* $base {} fmt |$f|; $variants
        }
        wait_errors! {
            @type $decl $params $args $derive $base $timeout;
            $(#[$timeout_meta])* $timeout $timeout_variant fmt |$f|; $variants
        }
        wait_errors! { @from $params $args $base $timeout }
        $(
            wait_errors! {
                @type $decl $params $args $derive $base $timeout;
                $(#[$try_meta])* $try $try_variant fmt |$f|; $variants
            }
            wait_errors! { @from $params $args $base $try }
        )?
    };
    (@from [$($params:tt)*] [$($args:tt)*] $base:ident $name:ident) => {
        impl<$($params)*> From<$base<$($args)*>> for $name<$($args)*> {
            fn from(e: $base<$($args)*>) -> Self {
                Self::from_base(e)
            }
        }
    };
    // One type: the failures, and at most one more variant (`Timeout`, `Empty`, ...). Its
    // `from_timeout` turns the deadline forms' outcome into it (their `Timeout` into its
    // own extra variant; a type without one never sees it), `from_base` the failures.
    (
        @type [$($decl:tt)*] [$($params:tt)*] [$($args:tt)*] ($($derive:path),*)
            $base:ident $timeout:ident;
        $(#[$meta:meta])* $name:ident {
            $($(#[$x_meta:meta])* $x_variant:ident $(($x_bind:ident: $x_ty:ty))? => $x_msg:expr)?
        }
        fmt |$f:ident|;
        {
            $(
                $(#[$v_meta:meta])*
                $variant:ident $(($bind:ident: $ty:ty))?
                    $({ $($(#[$f_meta:meta])* $field:ident: $field_ty:ty),* $(,)? })?
                    => $msg:expr $(, source $source:expr)?;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive($($derive),*)]
        #[non_exhaustive]
        pub enum $name<$($decl)*> {
            $($(#[$x_meta])* $x_variant $(($x_ty))?,)?
            $($(#[$v_meta])* $variant $(($ty))? $({ $($(#[$f_meta])* $field: $field_ty),* })?,)*
        }

        impl<$($params)*> core::fmt::Display for $name<$($args)*> {
            #[allow(unused_variables)]
            fn fmt(&self, $f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self {
                    $(Self::$x_variant $(($x_bind))? => $x_msg,)?
                    $(Self::$variant $(($bind))? $({ $($field),* })? => $msg,)*
                }
            }
        }

        impl<$($params)*> std::error::Error for $name<$($args)*> where Self: core::fmt::Debug {
            #[allow(unused_variables, unreachable_code)]
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                match self {
                    $(Self::$x_variant $(($x_bind))? => None,)?
                    $(Self::$variant $(($bind))? $({ $($field),* })? => {
                        $(return $source;)?
                        None
                    })*
                }
            }
        }

        impl<$($params)*> $name<$($args)*> {
            /// The outcome of a wait (written once, with a deadline) in this form's terms.
            #[allow(dead_code, unused_variables)]
            pub(crate) fn from_timeout(e: $timeout<$($args)*>) -> Self {
                match e {
                    t @ $timeout::Timeout { .. } => {
                        $(if let $timeout::Timeout $(($x_bind))? = t {
                            return Self::$x_variant $(($x_bind))?;
                        })?
                        unreachable!("a wait without a deadline ends only in success or failure")
                    }
                    $($timeout::$variant $(($bind))? $({ $($field),* })?
                        => Self::$variant $(($bind))? $({ $($field),* })?,)*
                }
            }

            /// One of the failures every form shares.
            #[allow(dead_code)]
            pub(crate) fn from_base(e: $base<$($args)*>) -> Self {
                match e {
                    $($base::$variant $(($bind))? $({ $($field),* })?
                        => Self::$variant $(($bind))? $({ $($field),* })?,)*
                }
            }
        }
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
#[cfg(all(feature = "cuda", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda;
#[cfg(not(loom))]
pub mod inspect;
#[cfg(not(loom))]
mod named;
#[cfg(not(loom))]
mod shm;

pub use descriptor::{DType, Descriptor, DlDataType, MAX_DIMS, MetaError, TensorMeta};
pub use layout::{
    Corrupted, MAX_CAPACITY, MAX_PARTICIPANTS, MAX_POOLS as MAX_SENDERS, MAX_SLOT_SIZE, MAX_SLOTS,
    SLOT_HEADER_SIZE,
};
pub use liveness::{AttachError, IDLE_TICK, LIVENESS_TICK, Role};
pub use ring::{
    PopError, PopTimeoutError, PushError, PushTimeoutError, ReadError, ReadTimeoutError,
    TryPopError, TryPushError, TryReadError,
};
#[cfg(not(loom))]
pub use wait::interruptible;
#[cfg(not(loom))]
pub use wait::reactor::Selectable;
pub use wait::{DEFAULT_SPIN_LIMIT, WaitPolicy};

#[cfg(not(loom))]
pub use channel::{
    AcquireError, AcquireTimeoutError, Backend, Channel, ChannelBuilder, ChannelError, Flavor,
    HeaderTooLarge, Host, HostMemory, Lease, MAX_CHANNEL_NAME, Message, PART_ALIGN, Part,
    PartError, PartsWriter, PoolError, PoolInfo, PoolState, Receiver, RecvError, RecvTimeoutError,
    RequeueError, SendError, SendTimeoutError, Sender, TryAcquireError, TryRecvError, TrySendError,
    select, select_deadline, select_timeout, try_select,
};
#[cfg(all(feature = "async", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use channel::{Messages, select_async};
#[cfg(all(feature = "cuda", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use cuda::{Cuda, CudaError, DeviceView, GpuReady, Pinned};
#[cfg(not(loom))]
pub use named::{
    Broadcast, BroadcastProducer, BroadcastReader, BroadcastRing, Mpmc, MpmcConsumer, MpmcProducer,
    MpmcRing, Ring, RingBuilder, RingError, RingFlavor, Spsc, SpscConsumer, SpscProducer, SpscRing,
};
#[cfg(not(loom))]
pub use shm::{DEFAULT_OPEN_TIMEOUT, ShmError};

/// Not API: what the crate's own tests, fuzz targets and benchmarks need of its insides,
/// and the counters they read. No stability promise of any kind.
#[doc(hidden)]
pub mod internal {
    pub use crate::layout::*;
    pub use crate::liveness::{
        ClaimLine, ClaimLock, Gone, ProcessState, Unwatched, Watch, process_state,
    };
    pub use crate::pool::{HeapPool, PoolCore, SlotRef, heap_pool};
    pub use crate::ring::{Heap, Storage, broadcast, mpmc, repair, spsc};
    #[cfg(not(loom))]
    pub use crate::wait::reactor::{WaiterStats, waiter_stats};
    pub use crate::wait::{BarrierMode, WaitStats, barrier_mode, wait_stats};

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
        tx.push_raw(d).map_err(crate::PushError::from_timeout)
    }

    /// For the API's examples: removes the channel `name` (with its pools and whatever
    /// waits in it) now, if a failed run left it, and when dropped, once no handle of it
    /// is left, so that an example leaves `/dev/shm` as it found it.
    #[cfg(not(loom))]
    #[derive(Debug)]
    pub struct RemoveOnDrop(&'static str);

    #[cfg(not(loom))]
    impl RemoveOnDrop {
        /// Removes what a failed run left under `name`; removes it again when dropped.
        pub fn new(name: &'static str) -> Self {
            let _ = crate::inspect::remove(name);
            Self(name)
        }
    }

    #[cfg(not(loom))]
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = crate::inspect::remove(self.0);
        }
    }

    /// For the API's examples: host channel `name` (4 slots of 4 KiB) holding `messages`
    /// messages from a sender that has left: each an `f32` tensor of shape `[2, 3]` (its
    /// bytes 0, 1, 2, ...), tagged with its index. The channel stays while the returned
    /// handle lives, and is removed with what still waits in it when it drops.
    ///
    /// # Errors
    ///
    /// What creating the channel, leasing and sending return.
    #[cfg(not(loom))]
    pub fn doc_channel(
        name: &'static str,
        messages: u64,
    ) -> Result<(crate::Channel, RemoveOnDrop), Box<dyn std::error::Error>> {
        let clean = RemoveOnDrop::new(name);
        let ch = crate::Channel::builder(name).slots(4, 4096).create()?;
        let tx = ch.sender()?;
        let meta = crate::TensorMeta::contiguous(crate::DType::F32, &[2, 3])?;
        for i in 0..messages {
            let mut lease = tx.acquire()?;
            for (b, v) in lease[..24].iter_mut().zip(0u8..) {
                *b = v;
            }
            lease.set_tag(i);
            tx.send(lease, meta)?;
        }
        Ok((ch, clean))
    }
}

/// The README's examples, compiled as doctests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
