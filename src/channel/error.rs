//! The channel's errors, one per operation family: setting a channel up
//! ([`ChannelError`]: create, open, `sender()`, `receiver()`), sending ([`SendError`]) and
//! receiving ([`RecvError`]). Leasing a slot is the pool's ([`AcquireError`]).
//!
//! [`AcquireError`]: crate::AcquireError

use crate::layout::Corrupted;
use crate::liveness::AttachError;
use crate::pool::{CudaError, PoolError};
use crate::shm::ShmError;

use super::Lease;

/// Why a channel, or a sender or receiver of it, could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum ChannelError {
    /// The channel's segment (or, for `sender()`, the sender's pool segment) could not be
    /// created or opened: no such name, not ours, not a gpuring segment, another kind, a
    /// dead creator, ...
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
    /// `create`: a pool of `slot_count` slots of `slot_size` bytes is out of range
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
    /// builder opened a GPU channel (use `ChannelBuilder::cuda(&ctx)`), or the other way
    /// round.
    WrongBackend {
        /// Where the channel's slots are (`"host"` or `"cuda"`).
        channel: &'static str,
        /// Where the builder asked for them.
        asked: &'static str,
    },
    /// Setting up a device pool failed.
    Cuda(CudaError),
    /// A value in the channel's segment is impossible.
    Corrupted(Corrupted),
}

impl core::fmt::Display for ChannelError {
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
                "a pool of {slot_count} slots of {slot_size} bytes is out of range \
                 (1..=1048576 slots of 1 byte..=256 GiB, at most 1 TiB in all)"
            ),
            ChannelError::InvalidConfig { reason } => write!(f, "invalid channel option: {reason}"),
            ChannelError::PoolTableFull { max_pools } => write!(
                f,
                "all {max_pools} pool table entries are in use (raise max_senders, or wait \
                 for messages of departed senders to drain)"
            ),
            ChannelError::WrongBackend { channel: "cuda", .. } if !cfg!(feature = "cuda") => {
                f.write_str("the channel keeps its slots in CUDA device memory, and this build of gpuring has no `cuda` feature")
            }
            ChannelError::WrongBackend { channel, asked } => write!(
                f,
                "the channel keeps its slots in {channel} memory, the builder asked for {asked} \
                 (GPU channels are opened with ChannelBuilder::cuda(&ctx))"
            ),
            ChannelError::Cuda(e) => e.fmt(f),
            ChannelError::Corrupted(c) => c.fmt(f),
        }
    }
}

impl std::error::Error for ChannelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ChannelError::Segment(e) => Some(e),
            ChannelError::Attach(e) => Some(e),
            ChannelError::Cuda(e) => Some(e),
            ChannelError::Corrupted(c) => Some(c),
            _ => None,
        }
    }
}

error_from!(ChannelError {
    Segment(ShmError),
    Attach(AttachError),
    Corrupted(Corrupted),
    Cuda(CudaError),
});

impl From<PoolError> for ChannelError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Segment(e) => ChannelError::Segment(e),
            PoolError::Attach(e) => ChannelError::Attach(e),
            PoolError::Corrupted(c) => ChannelError::Corrupted(c),
        }
    }
}

/// Why a send did not happen. Variants that carry the lease (`L`: a [`Lease`] of the
/// channel's backend) give it back, contents intact.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendError<L = Lease> {
    /// `try_send`: the ring is full.
    Full(L),
    /// The ring stayed full until the deadline.
    Timeout(L),
    /// The metadata spans more bytes than a slot holds.
    TooLarge {
        /// The lease, back.
        lease: L,
        /// Bytes the metadata spans.
        len: u64,
        /// Bytes in a slot.
        capacity: u64,
    },
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
    /// Recording the slot's ready event failed (the slot went back to the pool).
    Cuda(CudaError),
    /// The ring is full and every receiver that attached has died (noticed within
    /// [`LIVENESS_TICK`](crate::LIVENESS_TICK) of waiting); the lease, back.
    PeerDead(L),
    /// Every receiver of the channel has left (cleanly, seen at once): nobody would read
    /// it; the lease, back. Not for ever: a receiver that attaches later makes sending
    /// work again.
    Disconnected(L),
}

impl<L> core::fmt::Display for SendError<L> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SendError::Full(_) => f.write_str("ring is full"),
            SendError::Timeout(_) => f.write_str("timed out waiting for room in the ring"),
            SendError::TooLarge { len, capacity, .. } => {
                write!(f, "tensor spans {len} bytes, a slot holds {capacity}")
            }
            SendError::Corrupted(c) => c.fmt(f),
            SendError::Cuda(e) => e.fmt(f),
            SendError::PeerDead(_) => f.write_str("the ring is full and every receiver has died"),
            SendError::Disconnected(_) => f.write_str("every receiver of the channel has left"),
        }
    }
}

impl<L: core::fmt::Debug> std::error::Error for SendError<L> {}

/// Why nothing was received.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecvError {
    /// `try_recv`: the ring is empty.
    Empty,
    /// Nothing arrived before the deadline.
    Timeout,
    /// The ring is corrupt, or the descriptor popped was invalid (unknown pool, slot out of
    /// range, stale generation, length beyond the slot, bad metadata, handles that do not
    /// match the pool); `what` says which. An invalid descriptor is dropped and the pool
    /// left as it was; the next receive carries on.
    Corrupted(Corrupted),
    /// The descriptor's pool could not be mapped (e.g. out of file descriptors, or every
    /// participant entry of its free ring held).
    Pool(ChannelError),
    /// A CUDA call failed (importing the pool, or enqueueing the wait).
    Cuda(CudaError),
    /// Every sender that attached has died and everything they sent has been received
    /// (noticed within [`LIVENESS_TICK`](crate::LIVENESS_TICK) of waiting).
    PeerDead,
    /// Every sender that attached has left cleanly and everything they sent has been
    /// received (seen at once): the channel's end, as `std::sync::mpsc` reports it. Not for
    /// ever: a sender that attaches later makes receiving work again.
    Disconnected,
    /// GPU channels: the message's sender has left, and its device memory with it (device
    /// memory cannot outlive its process): the message was dropped unread. The next
    /// receive carries on.
    SenderGone,
}

impl core::fmt::Display for RecvError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RecvError::Empty => f.write_str("ring is empty"),
            RecvError::Timeout => f.write_str("timed out waiting for a message"),
            RecvError::Corrupted(c) => c.fmt(f),
            RecvError::Pool(e) => write!(f, "cannot map the message's pool: {e}"),
            RecvError::Cuda(e) => e.fmt(f),
            RecvError::PeerDead => {
                f.write_str("every sender has died, and all they sent was received")
            }
            RecvError::Disconnected => {
                f.write_str("every sender has left, and all they sent was received")
            }
            RecvError::SenderGone => f.write_str(
                "the message's sender has left, and its device memory with it: dropped unread",
            ),
        }
    }
}

impl std::error::Error for RecvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecvError::Corrupted(c) => Some(c),
            RecvError::Pool(e) => Some(e),
            RecvError::Cuda(e) => Some(e),
            _ => None,
        }
    }
}

error_from!(RecvError { Corrupted(Corrupted) });

/// A descriptor refused by the receiver's checks: `what` names the check.
pub(super) fn corrupt(what: &'static str) -> RecvError {
    RecvError::Corrupted(Corrupted { what })
}
