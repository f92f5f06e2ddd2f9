//! A channel segment: [`ChannelHeader`], the pool table ([`PoolEntry`] rows), then the
//! descriptor ring.
//!
//! | offset | what |
//! |---|---|
//! | 0 | [`SegmentHeader`] |
//! | 128 | [`ChannelHeader`] |
//! | 256 | `max_pools` × [`PoolEntry`] |
//! | after | the descriptor ring ([`RingLayout::at`]) |

use super::{ParticipantId, RingLayout, SegmentHeader};
use crate::sync::{AtomicU32, AtomicU64};

/// Most pools one channel's table describes.
pub const MAX_POOLS: u32 = 1024;
/// Bytes reserved for a pool's segment name in its [`PoolEntry`].
pub const POOL_NAME_BYTES: usize = 448;

/// Parameters of a channel, after the segment header.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct ChannelHeader {
    /// Entries in the pool table.
    pub max_pools: AtomicU32,
    /// Slots in each sender's pool.
    pub slot_count: AtomicU32,
    /// Bytes in each slot.
    pub slot_size: AtomicU64,
    /// Counts pool registrations; each one's instance number (so a reused table entry
    /// never looks like the pool it replaced).
    pub registrations: AtomicU32,
    /// Chosen by the creator, part of every pool segment name, so that pools of an earlier
    /// channel of the same name never collide with this one's.
    pub nonce: AtomicU32,
    /// Where every sender's slots live: [`BACKEND_HOST`] or [`BACKEND_CUDA`].
    pub backend: AtomicU32,
    /// 1: a message whose receiver died holding it is delivered again; 0: it is dropped
    /// (its slot taken back). Anything else is corrupt. Set at create.
    pub redeliver: AtomicU32,
    /// A hint, set (1) by a sender that found messages whose receiver died holding them:
    /// receivers read it on every receive (one load) and then look for such messages to
    /// deliver again. Whoever looks clears it first.
    pub orphans: AtomicU32,
}

/// Pool backend code: host shared memory.
pub const BACKEND_HOST: u32 = 1;
/// Pool backend code: CUDA device memory.
pub const BACKEND_CUDA: u32 = 2;

/// One row of a channel's pool table: which pool, where to find it, and whose it is.
///
/// The sender claims the row (`CLAIMED` by its identity), records the instance, makes
/// the pool, writes the other fields, then stores `ACTIVE` by its identity with Release.
/// The segment name is derivable from the channel name, index and instance; a receiver
/// checks that the stored one matches rather than opening whatever a peer wrote here.
///
/// `state` packs a code ([`EMPTY`](Self::EMPTY), [`CLAIMED`](Self::CLAIMED),
/// [`ACTIVE`](Self::ACTIVE), [`CLOSED`](Self::CLOSED)) in its low [`CODE_BITS`](Self::CODE_BITS)
/// and, while `CLAIMED` or `ACTIVE`, the owner above them: the sender's
/// [`ParticipantId`] in the channel's ring, so that one word says both what the row is and
/// who may be dead holding it (by the owner's lock, never by pid).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct PoolEntry {
    /// A code and, while `CLAIMED` or `ACTIVE`, its owner ([`PoolEntry::state`]).
    pub state: AtomicU32,
    /// Which registration this is (from [`ChannelHeader::registrations`]), low 16 bits.
    pub instance: AtomicU32,
    /// 1: host shared memory.
    pub backend: AtomicU32,
    /// Slots in the pool.
    pub slot_count: AtomicU32,
    /// Bytes per slot.
    pub slot_size: AtomicU64,
    /// The sending process (diagnostics: pids are reused).
    pub owner_pid: AtomicU32,
    /// Bytes used in `name`.
    pub name_len: AtomicU32,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 4],
    /// The pool segment's name, packed little-endian.
    pub name: [AtomicU64; POOL_NAME_BYTES / 8],
}

impl PoolEntry {
    /// [`state`](Self::state) code: nobody uses the entry.
    pub const EMPTY: u32 = 0;
    /// A sender (the owner) is setting the entry up.
    pub const CLAIMED: u32 = 1;
    /// The pool is live; its sender (the owner) may send from it.
    pub const ACTIVE: u32 = 2;
    /// The sender is gone; slots still in flight drain back to the pool, and the last one
    /// back unlinks it.
    pub const CLOSED: u32 = 3;
    /// Low bits of [`state`](Self::state) that hold its code.
    pub const CODE_BITS: u32 = 3;

    /// The code of a `state` word.
    pub const fn code(state: u32) -> u32 {
        state & ((1 << Self::CODE_BITS) - 1)
    }

    /// The owner a `state` word names (0: none).
    pub const fn owner(state: u32) -> ParticipantId {
        state >> Self::CODE_BITS
    }

    /// A `state` word: `code` owned by `owner` (a [`ParticipantId`] fits in the 29 bits
    /// above the code).
    pub const fn state(code: u32, owner: ParticipantId) -> u32 {
        code | owner << Self::CODE_BITS
    }
}

/// Byte offsets and size of a channel segment.
///
/// | offset | what |
/// |---|---|
/// | 0 | [`SegmentHeader`] |
/// | 128 | [`ChannelHeader`] |
/// | 256 | `max_pools` × [`PoolEntry`] |
/// | after | the descriptor ring ([`RingLayout::at`]) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLayout {
    /// Offset of the [`ChannelHeader`].
    pub header: usize,
    /// Offset of the first [`PoolEntry`].
    pub pools: usize,
    /// Entries in the pool table.
    pub max_pools: usize,
    /// The descriptor ring.
    pub ring: RingLayout,
    /// Size of the whole segment.
    pub total_size: usize,
}

impl ChannelLayout {
    /// The layout for `max_pools` table entries (`1..=MAX_POOLS`) and a ring of `capacity`
    /// cells of `cell_size` bytes, or `None` when a parameter is out of range.
    pub const fn new(max_pools: u32, capacity: u64, cell_size: usize) -> Option<Self> {
        if max_pools == 0 || max_pools > MAX_POOLS {
            return None;
        }
        let header = size_of::<SegmentHeader>();
        let pools = header + size_of::<ChannelHeader>();
        let base = pools + max_pools as usize * size_of::<PoolEntry>();
        let Some(ring) = RingLayout::at(base, capacity, cell_size) else {
            return None;
        };
        Some(Self {
            header,
            pools,
            max_pools: max_pools as usize,
            ring,
            total_size: ring.total_size,
        })
    }
}

#[cfg(not(loom))]
const _: () = {
    assert!(size_of::<ChannelHeader>() == 128);
    assert!(size_of::<PoolEntry>() == 512);
};
