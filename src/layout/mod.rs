//! The shared-memory structures: `#[repr(C)]` data, their sizes and offsets, and the error
//! for an impossible value read from them ([`Corrupted`]). No syscalls, no algorithms.
//!
//! Every segment starts with a [`SegmentHeader`]; what follows depends on its
//! [`SegmentKind`], one file each:
//!
//! | file | segment |
//! |---|---|
//! | `ring.rs` | a ring: [`RingHeader`], [`RingControl`], [`Participants`], cells ([`RingLayout`]) |
//! | `channel.rs` | a channel: [`ChannelHeader`], the pool table, then a ring ([`ChannelLayout`]) |
//! | `pool.rs` | a slot pool: [`PoolHeader`], slot records, a free ring, slots or CUDA handles ([`PoolLayout`]) |
//! | `view.rs` | typed views of a mapped segment: where an offset becomes a reference |
//!
//! Everything a peer can write is an atomic (or sits in a cell that the ring protocol hands
//! from one side to the other), and everything read from here is untrusted: the modules
//! above read each value once and check it. Offsets are derived from the header's
//! parameters by the `*Layout::new` functions, never stored, so there is no offset to
//! forge. Code above reads a segment through the views of `view.rs` (or, for ring cells
//! and slot bytes, the raw pointers its ring and pool own), never by an offset of its own.
//!
//! Changing any of these types changes [`LAYOUT_VERSION`].

mod channel;
mod pool;
mod ring;
#[cfg(not(loom))]
mod view;

pub use channel::*;
pub use pool::*;
pub use ring::*;
#[cfg(not(loom))]
pub(crate) use view::{
    ChannelView, HeaderBytes, Mapping, PoolView, RingView, header, view, view_slice,
};

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// A value read from shared memory was impossible: the segment cannot be trusted there.
///
/// `what` names the value, e.g. `"tail is more than capacity ahead of head"`. Every layer
/// reports it as is (`PopError::Corrupted`, `RecvError::Corrupted`, ...): a peer that
/// writes garbage into a segment gets this error back from its partners, never undefined
/// behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupted {
    /// What was found wrong.
    pub what: &'static str,
}

impl core::fmt::Display for Corrupted {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "shared memory corrupted: {}", self.what)
    }
}

impl std::error::Error for Corrupted {}

/// `"GPURING\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPURING\0");

/// Bumped whenever a shared-memory type changes shape or meaning.
pub const LAYOUT_VERSION: u32 = 16;

/// The value of [`SegmentHeader::init`] once the creator has finished writing the segment.
pub const INIT_READY: u32 = 0x5244_5952; // "RYDR"

/// What a segment holds. The discriminants are the wire codes, 1 to 8 in order.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    /// A single-producer single-consumer ring.
    SpscRing = 1,
    /// A multi-producer multi-consumer ring.
    MpmcRing,
    /// A single-sender single-receiver channel: pool table and descriptor ring.
    SpscChannel,
    /// A multi-sender multi-receiver channel: pool table and descriptor ring.
    MpmcChannel,
    /// A slot pool whose slots are host shared memory: slot records, free ring, slots.
    HostPool,
    /// A slot pool whose slots are device memory: slot records, free ring, CUDA IPC
    /// handles of the allocation and of each slot's events.
    CudaPool,
    /// A broadcast ring: one producer, readers that each read every element.
    BroadcastRing,
    /// A broadcast channel: one sender's slots, every receiver reads every message.
    BroadcastChannel,
}

impl SegmentKind {
    /// Every kind, in wire-code order.
    pub const ALL: [Self; 8] = [
        Self::SpscRing,
        Self::MpmcRing,
        Self::SpscChannel,
        Self::MpmcChannel,
        Self::HostPool,
        Self::CudaPool,
        Self::BroadcastRing,
        Self::BroadcastChannel,
    ];

    /// Whether the segment is a channel (a pool table and a descriptor ring).
    pub fn is_channel(self) -> bool {
        matches!(self, Self::SpscChannel | Self::MpmcChannel | Self::BroadcastChannel)
    }

    /// Whether the segment has a ring of its own (rings and channels; not pools).
    pub fn is_ring_or_channel(self) -> bool {
        !matches!(self, Self::HostPool | Self::CudaPool)
    }

    /// The kind in words: "an SPSC ring", "an MPMC channel", "a host slot pool", ...
    pub fn describe(self) -> &'static str {
        match self {
            Self::SpscRing => "an SPSC ring",
            Self::MpmcRing => "an MPMC ring",
            Self::SpscChannel => "an SPSC channel",
            Self::MpmcChannel => "an MPMC channel",
            Self::HostPool => "a host slot pool (of a channel)",
            Self::CudaPool => "a GPU slot pool (of a channel)",
            Self::BroadcastRing => "a broadcast ring",
            Self::BroadcastChannel => "a broadcast channel",
        }
    }

    /// Decodes a kind read from shared memory.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1..=8 => Self::ALL.into_iter().find(|k| *k as u32 == raw),
            _ => None,
        }
    }
}

/// A value alone on a 128-byte line (two 64-byte lines: the adjacent-line prefetcher on x86
/// pulls pairs). Our own type rather than crossbeam's `CachePadded`, because its size is
/// part of the shared-memory layout and must not change with a dependency.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct Padded<T>(pub T);

impl<T> core::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The first bytes of every gpuring segment.
///
/// The creator writes every field, then `init = INIT_READY` with Release; an opener reads
/// `init` with Acquire before trusting anything else.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct SegmentHeader {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub version: AtomicU32,
    /// A [`SegmentKind`].
    pub kind: AtomicU32,
    /// The size the creator gave the segment, in bytes.
    pub total_size: AtomicU64,
    /// The creator's process id (diagnostics only: pids are reused).
    pub creator_pid: AtomicU32,
    /// [`INIT_READY`] once the creator is done; written last.
    pub init: AtomicU32,
    /// 1 once the last user (or a tool) has decided to remove the segment, just before its
    /// name is unlinked: an opener that finds it set looks the name up again.
    pub removed: AtomicU32,
}

/// Stores `bytes` into `words`, 8 bytes a word, little-endian, zero-padded.
///
/// # Panics
///
/// If `bytes` does not fit.
pub fn store_bytes(words: &[AtomicU64], bytes: &[u8]) {
    assert!(bytes.len() <= words.len() * 8, "{} bytes do not fit", bytes.len());
    for (i, word) in words.iter().enumerate() {
        let mut chunk = [0u8; 8];
        let start = (i * 8).min(bytes.len());
        let end = (start + 8).min(bytes.len());
        chunk[..end - start].copy_from_slice(&bytes[start..end]);
        // Relaxed: callers publish with a Release store of their own (a state word, or
        // the segment's init word).
        word.store(u64::from_le_bytes(chunk), Ordering::Relaxed);
    }
}

/// Loads the bytes of `words` into `out` (which is `words.len() * 8` long).
pub fn load_bytes(words: &[AtomicU64], out: &mut [u8]) {
    for (word, chunk) in words.iter().zip(out.chunks_exact_mut(8)) {
        // Relaxed: callers read after their own Acquire load.
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<SegmentHeader>() == 128);
// The wire codes: fixed once written.
const _: () = assert!(SegmentKind::SpscRing as u32 == 1 && SegmentKind::CudaPool as u32 == 6);

#[cfg(all(test, not(loom)))]
mod tests;
