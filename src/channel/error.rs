//! The channel's errors, one family per operation: setting a channel up
//! ([`ChannelError`]: create, open, `sender()`, `receiver()`), leasing a slot
//! ([`AcquireError`]), sending ([`SendError`]) and receiving ([`RecvError`]). Each blocking
//! operation has one type per call form, with the variants that form can produce: `x` and
//! `x_async` return the base type (no `Timeout`), `x_timeout` and `x_deadline` its
//! `...TimeoutError`, `try_x` its `Try...Error` (which says "nothing now" as `Exhausted`,
//! `Full` or `Empty`).
//!
//! Every type is generic over the channel's [`Backend`] (default [`Host`]): its `Device`
//! variant carries the backend's own error, [`Infallible`](std::convert::Infallible) for host
//! memory (so host signatures carry no CUDA type, and the variant cannot occur).
//!
//! A wrapper either displays its cause or returns it from `source()`, never both, so that
//! error reports print each cause once.

use super::backend::{Backend, Host, Refused, Unmade};
use super::lease::Lease;
use crate::layout::Corrupted;
use crate::liveness::AttachError;
use crate::pool::PoolSegmentError;
use crate::shm::ShmError;

/// Why a channel, or a sender or receiver of it, could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum ChannelError<B: Backend = Host> {
    /// The channel's segment (or, for `sender()`, the sender's pool segment) could not be
    /// created or opened: no such name, not ours, not a gpuring segment, another kind, ...
    Segment(ShmError),
    /// The sender or receiver could not attach to the channel's ring (another live
    /// endpoint holds the SPSC role, or every participant entry is held), or to a pool's
    /// free ring.
    Attach(AttachError),
    /// `create`: a ring capacity that is not a power of two in `1..=2^24` (`2..` for MPMC).
    InvalidCapacity {
        /// The capacity asked for.
        capacity: u64,
    },
    /// `create` or `sender_with_slots`: a pool of `slot_count` slots of `slot_size` bytes is out of range
    /// (1..=2^20 slots of 1 byte..=256 GiB, at most 1 TiB in all).
    InvalidPool {
        /// Slots asked for.
        slot_count: u32,
        /// Bytes per slot asked for.
        slot_size: u64,
    },
    /// `create`: another option is out of range.
    InvalidConfig {
        /// What is wrong.
        reason: &'static str,
    },
    /// `sender()`: every entry of the channel's pool table is in use (raise
    /// `max_senders`, or wait for messages of departed senders to drain).
    PoolTableFull {
        /// Entries in the table.
        max_pools: u32,
    },
    /// `open`: the channel keeps its slots elsewhere than the builder asked for: a host
    /// builder opened a GPU channel (use `ChannelBuilder::cuda(&stream)`), or the other
    /// way round.
    WrongBackend {
        /// Where the channel's slots are (`"host"` or `"cuda"`).
        channel: &'static str,
        /// Where the builder asked for them.
        asked: &'static str,
    },
    /// The backend failed to set up its part (a device pool, a pinned registration).
    Device(B::Error),
    /// A value in the channel's segment is impossible.
    Corrupted(Corrupted),
}

impl<B: Backend> core::fmt::Display for ChannelError<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ChannelError::Segment(e) => e.fmt(f),
            ChannelError::Attach(e) => e.fmt(f),
            ChannelError::InvalidCapacity { capacity } => write!(
                f,
                "capacity {capacity} is not a power of two in 1..=16777216 (2.. for MPMC)"
            ),
            ChannelError::InvalidPool { slot_count, slot_size } => write!(
                f,
                "a pool of {slot_count} slot{} of {slot_size} byte{} is out of range \
                 (1..=1048576 slots of 1 byte..=256 GiB, at most 1 TiB in all)",
                if *slot_count == 1 { "" } else { "s" },
                if *slot_size == 1 { "" } else { "s" }
            ),
            ChannelError::InvalidConfig { reason } => write!(f, "invalid channel option: {reason}"),
            ChannelError::PoolTableFull { max_pools } => write!(
                f,
                "all {max_pools} pool table entries are in use (raise max_senders, or wait \
                 for messages of departed senders to drain)"
            ),
            ChannelError::WrongBackend { channel, asked } => write!(
                f,
                "the channel keeps its slots in {channel} memory, the builder asked for {asked} \
                 (GPU channels are opened with ChannelBuilder::cuda(&stream), feature `cuda`)"
            ),
            ChannelError::Device(e) => e.fmt(f),
            ChannelError::Corrupted(c) => c.fmt(f),
        }
    }
}

impl<B: Backend> std::error::Error for ChannelError<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // Each wrapped cause is displayed above: its own source, not itself.
        match self {
            ChannelError::Segment(e) => e.source(),
            ChannelError::Attach(e) => e.source(),
            ChannelError::Device(e) => e.source(),
            _ => None,
        }
    }
}

error_from!(ChannelError<B: Backend> { Segment(ShmError), Attach(AttachError), Corrupted(Corrupted) });

impl<B: Backend> From<PoolSegmentError> for ChannelError<B> {
    fn from(e: PoolSegmentError) -> Self {
        match e {
            PoolSegmentError::Segment(e) => ChannelError::Segment(e),
            PoolSegmentError::Attach(e) => ChannelError::Attach(e),
            PoolSegmentError::Corrupted(c) => ChannelError::Corrupted(c),
        }
    }
}

impl<B: Backend> From<Unmade<B::Error>> for ChannelError<B> {
    fn from(e: Unmade<B::Error>) -> Self {
        match e {
            Unmade::Pool(e) => e.into(),
            Unmade::Device(e) => ChannelError::Device(e),
        }
    }
}

/// Why a receiver could not map the pool a message lives in.
#[derive(Debug)]
#[non_exhaustive]
pub enum PoolError {
    /// The pool's segment could not be opened (e.g. out of file descriptors).
    Segment(ShmError),
    /// The receiver could not attach to the pool's free ring (every participant entry
    /// held).
    Attach(AttachError),
}

impl core::fmt::Display for PoolError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PoolError::Segment(e) => e.fmt(f),
            PoolError::Attach(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Segment(e) => e.source(),
            PoolError::Attach(e) => e.source(),
        }
    }
}

wait_errors! {
    generics [B: Backend = Host] [B: Backend] [B];
    derive(Debug, Clone, Copy, PartialEq, Eq);
    /// Why [`Sender::acquire`](crate::Sender::acquire) (and `acquire_async`) leased no
    /// slot.
    base AcquireError;
    /// Why [`Sender::acquire_timeout`](crate::Sender::acquire_timeout) (and
    /// `acquire_deadline`) leased no slot.
    timeout AcquireTimeoutError {
        /// The deadline passed with every slot still in use.
        Timeout => f.write_str("timed out waiting for a free slot")
    }
    /// Why [`Sender::try_acquire`](crate::Sender::try_acquire) leased no slot.
    try TryAcquireError {
        /// Every slot is in use.
        Exhausted => f.write_str("every slot of the pool is in use")
    }
    fmt |f|;
    variants {
        /// The pool's shared state is impossible.
        Corrupted(c: Corrupted) => c.fmt(f);
        /// The backend's part of the lease failed (GPU channels: enqueueing the wait for
        /// the slot's last reader on the sender's stream); the slot went back.
        Device(e: B::Error) => e.fmt(f), source e.source();
        /// Every slot is in use and every receiver that took slots from this pool has died
        /// (their liveness locks are gone), so none will come back.
        PeerDead => f.write_str("every slot is in use and every receiver holding one has died");
        /// Every receiver of the channel has left (cleanly): nobody would read what is
        /// sent. Not for ever: a receiver that attaches later makes leasing work again.
        Disconnected => f.write_str("every receiver of the channel has left");
    }
}

wait_errors! {
    generics [B: Backend = Host] [B: Backend] [B];
    derive(Debug);
    /// Why [`Sender::send`](crate::Sender::send) (and `send_async`) did not send. Variants
    /// that carry the lease give it back, contents intact.
    base SendError;
    /// Why [`Sender::send_timeout`](crate::Sender::send_timeout) (and `send_deadline`) did
    /// not send.
    timeout SendTimeoutError {
        /// The ring stayed full until the deadline; the lease, back.
        Timeout(lease: Lease<B>) => f.write_str("timed out waiting for room in the ring")
    }
    /// Why [`Sender::try_send`](crate::Sender::try_send) did not send.
    try TrySendError {
        /// The ring is full; the lease, back.
        Full(lease: Lease<B>) => f.write_str("the ring is full")
    }
    fmt |f|;
    variants {
        /// The metadata spans more bytes than a slot holds.
        TooLarge {
            /// The lease, back.
            lease: Lease<B>,
            /// Bytes the metadata spans.
            len: u64,
            /// Bytes in a slot.
            capacity: u64,
        } => write!(
            f,
            "the tensor spans {len} bytes, a slot holds {capacity} (slots are sized when the \
             channel is created: `.slots(count, bytes)`)"
        );
        /// The ring's shared state is impossible.
        Corrupted(c: Corrupted) => c.fmt(f);
        /// The backend's part of the send failed (GPU channels: signalling the slot's
        /// writes on the lease's stream); the slot went back to the pool.
        Device(e: B::Error) => e.fmt(f), source e.source();
        /// The ring is full and every receiver that attached has died (noticed within
        /// [`LIVENESS_TICK`](crate::LIVENESS_TICK) of waiting); the lease, back.
        PeerDead(lease: Lease<B>) => f.write_str("the ring is full and every receiver has died");
        /// Every receiver of the channel has left (cleanly, seen at once): nobody would
        /// read it; the lease, back. Not for ever: a receiver that attaches later makes
        /// sending work again.
        Disconnected(lease: Lease<B>) => f.write_str("every receiver of the channel has left");
    }
}

wait_errors! {
    generics [B: Backend = Host] [B: Backend] [B];
    derive(Debug);
    /// Why [`Receiver::recv`](crate::Receiver::recv) (and `recv_async`, `iter`, the
    /// selects) received nothing.
    base RecvError;
    /// Why [`Receiver::recv_timeout`](crate::Receiver::recv_timeout) (and `recv_deadline`)
    /// received nothing.
    timeout RecvTimeoutError {
        /// Nothing arrived before the deadline.
        Timeout => f.write_str("timed out waiting for a message")
    }
    /// Why [`Receiver::try_recv`](crate::Receiver::try_recv) (and `try_iter`) received
    /// nothing.
    try TryRecvError {
        /// The ring is empty.
        Empty => f.write_str("the ring is empty")
    }
    fmt |f|;
    variants {
        /// The ring is corrupt, or the descriptor popped was invalid (unknown pool, slot out
        /// of range, stale generation, length beyond the slot, bad metadata, handles that
        /// do not match the pool); `what` says which. An invalid descriptor is dropped and
        /// the pool left as it was; the next receive carries on.
        Corrupted(c: Corrupted) => c.fmt(f);
        /// The message's pool could not be mapped; the next receive carries on.
        Pool(e: PoolError) => f.write_str("cannot map the message's pool"), source Some(e);
        /// The backend's part of the receive failed (GPU channels: importing the pool, or
        /// enqueueing the wait for the sender's writes).
        Device(e: B::Error) => e.fmt(f), source e.source();
        /// Every sender that attached has died and everything they sent has been received
        /// (noticed within [`LIVENESS_TICK`](crate::LIVENESS_TICK) of waiting).
        PeerDead => f.write_str("every sender has died, and all they sent was received");
        /// Every sender that attached has left cleanly and everything they sent has been
        /// received (seen at once): the channel's end, as `std::sync::mpsc` reports it. Not
        /// for ever: a sender that attaches later makes receiving work again.
        Disconnected => f.write_str("every sender has left, and all they sent was received");
        /// GPU channels: the message's sender has left or died, and its device memory with
        /// it (device memory cannot outlive its process): the message was dropped unread.
        /// The next receive carries on.
        SenderGone => f.write_str(
            "the message's sender has left or died, and its device memory with it: dropped unread",
        );
        /// Lagging broadcast channels ([`ChannelBuilder::lagging`](crate::ChannelBuilder::lagging)):
        /// this receiver fell behind and the sender, which never waits for it, reused the
        /// slots of this many messages before it read them. The next receive goes on with
        /// the oldest message still there.
        Lagged(missed: u64) => write!(
            f,
            "this receiver fell behind a lagging broadcast channel and missed {missed} messages"
        );
    }
}

error_from!(RecvTimeoutError<B: Backend> { Corrupted(Corrupted) });

impl<B: Backend> From<Refused<B::Error>> for RecvTimeoutError<B> {
    fn from(e: Refused<B::Error>) -> Self {
        match e {
            Refused::Corrupted(c) => RecvTimeoutError::Corrupted(c),
            Refused::Device(e) => RecvTimeoutError::Device(e),
            Refused::SenderGone => RecvTimeoutError::SenderGone,
            Refused::PeerDead => RecvTimeoutError::PeerDead,
        }
    }
}

/// A descriptor refused by the receiver's checks: `what` names the check.
pub(super) fn corrupt<B: Backend>(what: &'static str) -> RecvTimeoutError<B> {
    RecvTimeoutError::Corrupted(Corrupted { what })
}
