//! Channels: a descriptor ring tied to slot pools, the API most users touch.
//!
//! A channel is one shared-memory segment holding a pool table and a descriptor ring
//! (SPSC or MPMC). Each [`Sender`] owns a pool of preallocated slots in its own segment and
//! registers it in the table. The producer leases a slot, writes it in place, and sends
//! it: only a 384-byte descriptor travels through the ring. The receiver validates the
//! descriptor against the pool table, maps the pool on first sight, and reads the slot in
//! place; dropping the [`Message`] returns the slot.
//!
//! | file | what lives there |
//! |---|---|
//! | `mod.rs` | [`Channel`], [`Flavor`] |
//! | `builder.rs` | [`ChannelBuilder`]: options, create, open |
//! | `table.rs` | the channel segment and its pool table; [`PoolInfo`] |
//! | `backend.rs` | where slots live, as a type: [`Backend`], [`Host`] |
//! | `sender.rs` | [`Sender`], [`Lease`] |
//! | `receiver.rs` | [`Receiver`], [`Message`] |
//! | `gpu.rs` | the `Cuda` backend: device leases and messages in stream order |
//! | `staging.rs` | host channels and the GPU: pinned pools, stream-ordered copies into and out of host slots |
//! | `select.rs` | waiting on several receivers (or ring consumers) at once, async and blocking (feature `async`) |
//! | `error.rs` | [`ChannelError`], [`SendError`], [`RecvError`] |
//!
//! ## Lifetimes of names
//!
//! The channel's creator unlinks the channel name when it drops; processes that opened it
//! keep working. A pool's name outlives its sender while any of its slots is in flight:
//! the sender marks the pool closed, and whoever then sees it closed with every slot free
//! (the sender itself, or the receiver returning the last slot) unlinks it. So a sender may
//! send and exit at once, and its messages still reach a receiver that has the channel
//! open.

use std::sync::Arc;

mod backend;
mod builder;
mod error;
#[cfg(feature = "cuda")]
mod gpu;
mod receiver;
#[cfg(feature = "async")]
mod select;
mod sender;
#[cfg(feature = "cuda")]
mod staging;
mod table;

pub use backend::{Backend, Host};
pub use builder::ChannelBuilder;
pub use error::{ChannelError, RecvError, SendError};
#[cfg(feature = "cuda")]
pub use gpu::{Cuda, DeviceView, GpuReady};
#[cfg(feature = "async")]
pub use receiver::Messages;
pub use receiver::{Message, Receiver};
#[cfg(feature = "async")]
pub use select::{Selected, select, select_async, select_timeout};
#[cfg(all(feature = "async", feature = "cuda"))]
pub use select::{SelectedOn, select_on, select_on_async};
pub use sender::{Lease, Sender};
pub use table::{MAX_CHANNEL_NAME, PoolInfo, PoolState};
pub(crate) use table::{channel_layout, remove_pools_of};

use backend::sealed;
use table::ChannelSegment;

/// One sender and one receiver, or any number of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// One sender, one receiver: an SPSC descriptor ring, roles claimed in the segment.
    Spsc,
    /// Any number of senders (each with its own pool) and receivers: an MPMC ring.
    Mpmc,
}

/// A channel segment, created or opened; makes [`Sender`]s and [`Receiver`]s. Cloning the
/// handle shares the one mapping.
///
/// The creating handle unlinks the channel name when it and everything made from it are
/// dropped.
///
/// ```no_run
/// use gpuring::{Channel, TensorMeta};
///
/// // Process A: create the channel, 8 slots of 1 MiB per sender, and send.
/// let ch = Channel::builder("frames").capacity(64).slots(8, 1 << 20).create()?;
/// let tx = ch.sender()?;
/// let mut lease = tx.acquire()?;
/// lease[..5].copy_from_slice(b"hello");
/// tx.send(lease, TensorMeta::bytes(5))?;
///
/// // Process B: open it (checks owner, mode, size, magic, version) and receive.
/// let ch = Channel::builder("frames").open()?;
/// let rx = ch.receiver()?;
/// let msg = rx.recv()?;
/// assert_eq!(&msg[..], b"hello");
/// drop(msg); // the slot goes back to A's pool
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Channel<B: Backend = Host> {
    inner: Arc<ChannelSegment<B>>,
}

impl<B: Backend> Clone for Channel<B> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

impl<B: Backend> core::fmt::Debug for Channel<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Channel")
            .field("name", &self.name())
            .field("flavor", &self.inner.flavor)
            .field("backend", &<B as sealed::Backend>::NAME)
            .finish_non_exhaustive()
    }
}

impl Channel<Host> {
    /// Options for channel `name` (host slots; `.cuda(&ctx)` for device slots).
    pub fn builder(name: impl Into<String>) -> ChannelBuilder {
        ChannelBuilder::new(name)
    }
}

impl<B: Backend> Channel<B> {
    /// SPSC or MPMC.
    pub fn flavor(&self) -> Flavor {
        self.inner.flavor
    }

    /// Descriptor ring cells.
    pub fn capacity(&self) -> usize {
        self.inner.ring.capacity()
    }

    /// Each sender's pool: (slot count, bytes per slot).
    pub fn slots(&self) -> (u32, u64) {
        (self.inner.slot_count, self.inner.slot_size)
    }

    /// Pool table entries.
    pub fn max_senders(&self) -> u32 {
        self.inner.max_pools()
    }

    /// The channel segment's object name, with its leading `/`.
    pub fn name(&self) -> &str {
        self.inner.segment.name()
    }

    /// The pool table's entries in use (a snapshot, for diagnostics).
    pub fn pools(&self) -> Vec<PoolInfo> {
        self.inner.pools()
    }
}
