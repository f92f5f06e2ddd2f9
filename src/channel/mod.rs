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
//! | `producer.rs` | a channel ring's producer end, as a sender holds it |
//! | `backend.rs` | where slots live, as a type: [`Backend`], [`HostMemory`], [`Host`] |
//! | `lease.rs` | [`Lease`] |
//! | `error.rs` | [`ChannelError`], [`PoolError`], and each operation's errors per call form |
//! | `table.rs` | the channel segment and its pool table; [`PoolInfo`] |
//! | `builder.rs` | [`ChannelBuilder`]: options, create, open |
//! | `message.rs` | [`Message`] |
//! | `parts.rs` | several tensors in one slot: [`PartsWriter`], [`Message::parts`] |
//! | `sender.rs` | [`Sender`] |
//! | `receiver.rs` | [`Receiver`] |
//! | `select.rs` | waiting on several receivers (or ring consumers) at once |
//!
//! Each file imports only the files above it (`tests/layers.rs` checks it).
//!
//! The generic code here knows nothing of CUDA: the GPU backends (`crate::cuda`) plug in
//! through the sealed [`Backend`] trait.
//!
//! ## Lifetimes of names
//!
//! A channel lives while any process has it open, or a message waits in it; the last user
//! out removes it (and its pools). A pool's name outlives its sender while any of its slots
//! is in flight: the sender marks the pool closed, and whoever then sees it closed with
//! every slot free (the sender itself, or the receiver returning the last slot) unlinks it.
//! So a sender may send and exit at once, and its messages still reach a receiver that
//! opens the channel later.

use std::sync::Arc;

pub(crate) mod backend;
mod builder;
mod error;
mod lease;
mod message;
mod parts;
pub(crate) mod producer;
mod receiver;
mod select;
mod sender;
mod table;

pub use backend::{Backend, Host, HostMemory};
pub use builder::ChannelBuilder;
pub use error::{
    AcquireError, AcquireTimeoutError, ChannelError, PoolError, RecvError, RecvTimeoutError,
    SendError, SendTimeoutError, TryAcquireError, TryRecvError, TrySendError,
};
pub use lease::{HeaderTooLarge, Lease};
pub use message::{Message, RequeueError};
pub use parts::{PART_ALIGN, Part, PartError, PartsWriter};
#[cfg(feature = "async")]
pub use receiver::Messages;
pub use receiver::Receiver;
#[cfg(feature = "async")]
pub use select::select_async;
pub use select::{select, select_deadline, select_timeout, try_select};
pub use sender::Sender;
pub(crate) use table::ChannelSegment;
pub use table::{MAX_CHANNEL_NAME, PoolInfo, PoolState};
pub(crate) use table::{channel_layout, remove_pools_of};

use backend::sealed;

/// One sender and one receiver, or any number of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// One sender, one receiver: an SPSC descriptor ring, roles claimed in the segment.
    Spsc,
    /// Any number of senders (each with its own pool) and receivers: an MPMC ring.
    Mpmc,
    /// One sender, and receivers that each get every message (see
    /// [`ChannelBuilder::broadcast`]): a broadcast ring.
    Broadcast,
}

/// A channel segment, created or opened; makes [`Sender`]s and [`Receiver`]s. Cloning the
/// handle shares the one mapping.
///
/// The channel lives while any process has it open or a message waits in it, whoever
/// created it: the last user out removes it, with its pools.
///
/// ```
/// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-clone");
/// use gpuring::{Channel, TensorMeta};
///
/// // Process A: create the channel, 8 slots of 1 MiB per sender, and send.
/// let ch = Channel::builder("doc-mod-clone").capacity(64).slots(8, 1 << 20).create()?;
/// let tx = ch.sender()?;
/// let mut lease = tx.acquire()?;
/// lease[..5].copy_from_slice(b"hello");
/// tx.send(lease, TensorMeta::bytes(5))?;
///
/// // Process B: open it (checks owner, mode, size, magic, version) and receive.
/// let ch = Channel::builder("doc-mod-clone").open()?;
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
    /// Options for channel `name` (host slots; `.cuda(&stream)` for device slots, feature
    /// `cuda`).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-builder");
    /// let ch = gpuring::Channel::builder("doc-mod-builder").capacity(64).slots(8, 1 << 20).create()?;
    /// # drop(ch);
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn builder(name: impl Into<String>) -> ChannelBuilder {
        ChannelBuilder::new(name)
    }
}

impl<B: Backend> Channel<B> {
    /// SPSC or MPMC.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-flavor");
    /// use gpuring::{Channel, Flavor};
    /// let ch = Channel::builder("doc-mod-flavor").mpmc().create()?;
    /// assert_eq!(ch.flavor(), Flavor::Mpmc);
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn flavor(&self) -> Flavor {
        self.inner.flavor
    }

    /// Whether a message whose receiver died holding it is delivered again (as its
    /// creator chose: [`ChannelBuilder::redeliver`]).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-redelivers");
    /// let ch = gpuring::Channel::builder("doc-mod-redelivers").create()?;
    /// assert!(ch.redelivers(), "the default");
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn redelivers(&self) -> bool {
        self.inner.redeliver
    }

    /// Broadcast channels: whether the sender never waits for a receiver that is behind
    /// (as its creator chose: [`ChannelBuilder::lagging`]).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-lagging");
    /// let ch = gpuring::Channel::builder("doc-mod-lagging").broadcast().create()?;
    /// assert!(!ch.is_lagging(), "the default: the slowest receiver holds the sender back");
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn is_lagging(&self) -> bool {
        self.inner.flavor == Flavor::Broadcast && self.inner.ring.is_lagging()
    }

    /// Descriptor ring cells.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-capacity");
    /// let ch = gpuring::Channel::builder("doc-mod-capacity").capacity(64).create()?;
    /// assert_eq!(ch.capacity(), 64);
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.inner.ring.capacity()
    }

    /// Messages sent and not yet received, now (a snapshot, as `multiprocessing`'s
    /// `qsize`: exact when nothing moves; a message being received counts until its
    /// receiver has taken it).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-len");
    /// let ch = gpuring::Channel::builder("doc-mod-len").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// assert!(ch.is_empty());
    /// tx.send(tx.acquire()?, gpuring::TensorMeta::bytes(0))?;
    /// assert_eq!(ch.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        // Impossible positions (a corrupt segment) read as nothing queued here; receives
        // report them.
        self.inner.ring.queued().unwrap_or(0)
    }

    /// Whether no message waits now (a snapshot: see [`len`](Self::len)).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-is-empty");
    /// let ch = gpuring::Channel::builder("doc-mod-is-empty").create()?;
    /// assert!(ch.is_empty());
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slots of the pool [`sender`](Self::sender) makes: (slot count, bytes per slot).
    /// A sender may have slots of its own ([`sender_with_slots`](Self::sender_with_slots)).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-slots");
    /// let ch = gpuring::Channel::builder("doc-mod-slots").slots(4, 4096).create()?;
    /// assert_eq!(ch.slots(), (4, 4096));
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn slots(&self) -> (u32, u64) {
        (self.inner.slot_count, self.inner.slot_size)
    }

    /// Pool table entries: how many senders may have pools at once.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-max-senders");
    /// let ch = gpuring::Channel::builder("doc-mod-max-senders").mpmc().max_senders(8).create()?;
    /// assert_eq!(ch.max_senders(), 8);
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn max_senders(&self) -> u32 {
        self.inner.max_pools()
    }

    /// The channel segment's object name, with its leading `/`.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-name");
    /// let ch = gpuring::Channel::builder("doc-mod-name").create()?;
    /// assert_eq!(ch.name(), "/doc-mod-name");
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn name(&self) -> &str {
        self.inner.segment.name()
    }

    /// The pool table's entries in use (a snapshot, for diagnostics).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-mod-pools");
    /// let ch = gpuring::Channel::builder("doc-mod-pools").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// assert_eq!(format!("/{}", ch.pools()[0].name), tx.pool_name());
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn pools(&self) -> Vec<PoolInfo> {
        self.inner.pools()
    }
}
