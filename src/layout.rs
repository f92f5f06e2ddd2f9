//! `#[repr(C)]` shared-memory structures and their sizes: pure data, no syscalls.
//!
//! A ring segment is laid out as
//!
//! | offset | what |
//! |---|---|
//! | 0 | [`SegmentHeader`]: magic, layout version, segment kind, total size, init word |
//! | 128 | [`RingHeader`]: capacity, element size and alignment, role claims |
//! | 256 | [`RingControl`]: tail, head and the two wait words, each on its own 128-byte line |
//! | 768 | [`Participants`]: who is attached, each entry backed by a liveness lock, and the MPMC position each last claimed |
//! | 5376 | `capacity` cells: [`SpscCell`]s or [`MpmcCell`]s |
//!
//! Everything a peer can write is an atomic (or sits in a cell that the ring protocol hands
//! from one side to the other), and everything read from here is untrusted: the modules
//! above read each value once and check it. Offsets are derived from the header's
//! parameters by [`RingLayout::new`], never stored, so there is no offset to forge.
//!
//! Changing any of these types changes [`LAYOUT_VERSION`].

use crate::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell};
use crate::wait::WaitWord;

/// `"GPURING\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPURING\0");

/// Bumped whenever a shared-memory type changes shape or meaning.
pub const LAYOUT_VERSION: u32 = 4;

/// The value of [`SegmentHeader::init`] once the creator has finished writing the segment.
pub const INIT_READY: u32 = 0x5244_5952; // "RYDR"

/// What a segment holds.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    /// A single-producer single-consumer ring.
    SpscRing = 1,
    /// A multi-producer multi-consumer ring.
    MpmcRing = 2,
    /// A single-sender single-receiver channel: pool table and descriptor ring.
    SpscChannel = 3,
    /// A multi-sender multi-receiver channel: pool table and descriptor ring.
    MpmcChannel = 4,
    /// A slot pool whose slots are host shared memory: slot records, free ring, slots.
    HostPool = 5,
    /// A slot pool whose slots are device memory: slot records, free ring, CUDA IPC
    /// handles of the allocation and of each slot's events.
    CudaPool = 6,
}

impl SegmentKind {
    /// Decodes a kind read from shared memory.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::SpscRing),
            2 => Some(Self::MpmcRing),
            3 => Some(Self::SpscChannel),
            4 => Some(Self::MpmcChannel),
            5 => Some(Self::HostPool),
            6 => Some(Self::CudaPool),
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
}

/// Parameters of a ring, after the segment header.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct RingHeader {
    /// Number of cells, a power of two.
    pub capacity: AtomicU64,
    /// `size_of` the element type.
    pub elem_size: AtomicU32,
    /// `align_of` the element type.
    pub elem_align: AtomicU32,
    /// SPSC: pid of the process holding the producer role, 0 when free.
    pub producer_claim: AtomicU32,
    /// SPSC: pid of the process holding the consumer role, 0 when free.
    pub consumer_claim: AtomicU32,
}

/// The moving parts of a ring, each on its own line.
///
/// Positions count up from 0 and never wrap in practice (2^64 operations); the cell of
/// position `p` is `p % capacity`. In an SPSC ring `tail` is written by the producer only and
/// `head` by the consumer only. In an MPMC ring producers race on `tail` and consumers on
/// `head` with compare-and-swap, and each cell's stamp says whose turn it is.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RingControl {
    /// The next position to write.
    pub tail: Padded<AtomicU64>,
    /// The next position to read.
    pub head: Padded<AtomicU64>,
    /// Consumers sleep here when the ring is empty.
    pub not_empty: Padded<WaitWord>,
    /// Producers sleep here when the ring is full.
    pub not_full: Padded<WaitWord>,
}

/// Entries in a ring's [`Participants`] table: endpoints (processes' producer and consumer
/// handles) attached at once.
pub const MAX_PARTICIPANTS: usize = 64;

/// Who is attached to a ring. Entry `i` is `role << 32 | pid` ([`PARTICIPANT_PRODUCER`] or
/// [`PARTICIPANT_CONSUMER`]), or 0 when free; it counts only while some process holds the
/// open-file-description lock on byte `1 + i` of the segment's object (see `shm`), which
/// the kernel drops when the holder dies. An entry is written only by the holder of its
/// lock; what a reader finds here is a claim to check against the lock, never proof.
///
/// `claims[i]` is what endpoint `i` last claimed in an MPMC ring (see [`Claims`]): the
/// evidence by which a cell won by an endpoint that then died is repaired.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct Participants {
    /// The entries.
    pub entries: [AtomicU64; MAX_PARTICIPANTS],
    /// Entry `i`'s claims, one 64-byte line per entry (written by its holder only, on every
    /// MPMC push and pop, so that no two endpoints share a line).
    pub claims: [Claims; MAX_PARTICIPANTS],
}

/// The run of MPMC positions one endpoint last won, as a claim word ([`Claims::word`]), or
/// 0 for none.
///
/// An endpoint that wins the compare-and-swap of `tail` (`push`) or `head` (`pop`), for one
/// position or a run of them (a slice), stores the run here at once, in one store, before
/// touching the cells. A word names a position only if its endpoint won it, so a cell
/// still unfinished at a position that a *dead* endpoint's word names was won by that
/// endpoint, which will never finish it: the cell can be repaired (`ring::mpmc`, "Repair")
/// with no risk of racing a live writer.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Claims {
    /// The run of `tail` positions last won.
    pub push: AtomicU64,
    /// The run of `head` positions last won.
    pub pop: AtomicU64,
}

/// Bits of a claim word that hold the first position of the run (modulo 2^56).
const CLAIM_POS_BITS: u32 = 56;
const CLAIM_POS_MASK: u64 = (1 << CLAIM_POS_BITS) - 1;

/// The longest run one claim word can name.
pub const MAX_CLAIM_RUN: u64 = 255;

impl Claims {
    /// No claims.
    pub fn new() -> Self {
        Self { push: AtomicU64::new(0), pop: AtomicU64::new(0) }
    }

    /// The claim word naming the `count` positions from `first`: the count in the top 8
    /// bits, `first` modulo 2^56 below (never 0, since `count` is at least 1). Positions
    /// a claim is compared with lie within one lap (≤ 2^24) of each other, so the modulus
    /// never makes two of them alike.
    ///
    /// # Panics
    ///
    /// In debug builds, if `count` is not in `1..=MAX_CLAIM_RUN`.
    #[inline(always)]
    pub const fn word(first: u64, count: u64) -> u64 {
        debug_assert!(count >= 1 && count <= MAX_CLAIM_RUN);
        (count << CLAIM_POS_BITS) | (first & CLAIM_POS_MASK)
    }

    /// Whether the claim `word` names position `pos`. A forged word names at most 255
    /// positions somewhere; every repair it leads to is still a CAS from the exact stalled
    /// stamp of a cell whose claimant is dead.
    pub const fn names(word: u64, pos: u64) -> bool {
        let count = word >> CLAIM_POS_BITS;
        count != 0 && (pos.wrapping_sub(word) & CLAIM_POS_MASK) < count
    }

    /// The positions `word` names, given that they lie within one lap below `end` (the
    /// `tail` for a push claim, the `head` for a pop claim) of a ring of `capacity` cells;
    /// positions at or above `end` or more than a lap below it are dropped (a stale or
    /// forged word).
    pub fn positions(word: u64, end: u64, capacity: u64) -> impl Iterator<Item = u64> {
        let count = word >> CLAIM_POS_BITS;
        // The full position of the run's first cell: `end` less the distance back to it.
        let first = end.wrapping_sub(end.wrapping_sub(word) & CLAIM_POS_MASK);
        (0..count)
            .map(move |i| first.wrapping_add(i))
            .filter(move |&pos| end.wrapping_sub(pos).wrapping_sub(1) < capacity)
    }
}

impl Default for Claims {
    fn default() -> Self {
        Self::new()
    }
}

/// [`Participants`] role code of a producer (sender) endpoint.
pub const PARTICIPANT_PRODUCER: u32 = 1;
/// [`Participants`] role code of a consumer (receiver) endpoint.
pub const PARTICIPANT_CONSUMER: u32 = 2;

/// A cell of an SPSC ring: just the element. Which side owns it follows from head and tail.
///
/// (A stamp per cell, polled by the consumer instead of `tail`, was measured and dropped: a
/// consumer that has caught up then spins on the very line the producer writes next, and
/// streaming slowed by 3x on the 16-core GPU host; see docs/BENCHMARKS.md.)
#[repr(transparent)]
#[derive(Debug)]
pub struct SpscCell<T> {
    pub(crate) value: UnsafeCell<T>,
}

impl<T: bytemuck::Zeroable> SpscCell<T> {
    /// An empty cell (zeroed element).
    pub fn new() -> Self {
        Self { value: UnsafeCell::new(T::zeroed()) }
    }
}

impl<T: bytemuck::Zeroable> Default for SpscCell<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A cell of an MPMC ring: a stamp and the element, on its own 64-byte line(s).
///
/// Stamp protocol (positions `p` with `p % capacity` = this cell): `stamp == p` means free
/// for the producer of position `p`; `stamp == p + 1` means written, ready for the consumer
/// of `p`; the consumer then sets `p + capacity`, freeing it for the next lap.
/// `(p + 1) | STAMP_SKIPPED` means that the producer that won `p` died before writing
/// it: consumers pass it by, freeing it, without returning an element.
/// `(p + 1) | STAMP_ADOPTED` means that the consumer that won `p` died before freeing it,
/// and another consumer has taken over the element (it frees the cell when done).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct MpmcCell<T> {
    pub(crate) stamp: AtomicU64,
    pub(crate) value: UnsafeCell<T>,
}

impl<T: bytemuck::Zeroable> MpmcCell<T> {
    /// A cell free for the producer of position `stamp`.
    pub fn new(stamp: u64) -> Self {
        Self { stamp: AtomicU64::new(stamp), value: UnsafeCell::new(T::zeroed()) }
    }

    /// A cell holding `value`, written at position `pos` and ready for its consumer (how a
    /// ring that starts full, like a pool's free ring, is initialised).
    pub fn written(pos: u64, value: T) -> Self {
        Self { stamp: AtomicU64::new(pos + 1), value: UnsafeCell::new(value) }
    }
}

impl<T> MpmcCell<T> {
    /// The stamp word (for `ring::mpmc::repair` over storage outside this crate: models
    /// and tests).
    #[doc(hidden)]
    pub fn stamp(&self) -> &AtomicU64 {
        &self.stamp
    }
}

/// The bit of an MPMC stamp that marks a cell skipped (see [`MpmcCell`]).
pub const STAMP_SKIPPED: u64 = 1 << 63;
/// The bit of an MPMC stamp that marks a cell being adopted: its consumer died before
/// freeing it, and another consumer is taking its element (see [`MpmcCell`]).
pub const STAMP_ADOPTED: u64 = 1 << 62;
/// Both flag bits; positions stay below them (2^62 elements: centuries at any rate this
/// ring reaches).
pub const STAMP_FLAGS: u64 = STAMP_SKIPPED | STAMP_ADOPTED;

/// Byte offsets and size of a ring segment, derived from its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Offset of the [`RingHeader`].
    pub ring_header: usize,
    /// Offset of the [`RingControl`].
    pub control: usize,
    /// Offset of the [`Participants`] table.
    pub participants: usize,
    /// Offset of the first cell.
    pub cells: usize,
    /// Size of one cell.
    pub cell_size: usize,
    /// Number of cells.
    pub capacity: usize,
    /// Size of the whole segment.
    pub total_size: usize,
}

/// Largest ring capacity accepted (2^24 cells): a bound on what a forged header can make
/// an opener map.
pub const MAX_CAPACITY: u64 = 1 << 24;

impl RingLayout {
    /// The layout of a ring of `capacity` cells of `cell_size` bytes, or `None` when the
    /// capacity is not a power of two in `1..=MAX_CAPACITY` or the size overflows.
    pub const fn new(capacity: u64, cell_size: usize) -> Option<Self> {
        Self::at(size_of::<SegmentHeader>(), capacity, cell_size)
    }

    /// The layout of a ring whose [`RingHeader`] sits at `base` (a multiple of 128) inside
    /// a larger segment; `total_size` is then the offset of the ring's end.
    pub const fn at(base: usize, capacity: u64, cell_size: usize) -> Option<Self> {
        if capacity == 0 || !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
            return None;
        }
        if base % 128 != 0 || base < size_of::<SegmentHeader>() {
            return None;
        }
        let ring_header = base;
        let control = ring_header + size_of::<RingHeader>();
        let participants = control + size_of::<RingControl>();
        let cells = participants + size_of::<Participants>();
        let Some(body) = (capacity as usize).checked_mul(cell_size) else {
            return None;
        };
        let Some(total_size) = cells.checked_add(body) else {
            return None;
        };
        Some(Self {
            ring_header,
            control,
            participants,
            cells,
            cell_size,
            capacity: capacity as usize,
            total_size,
        })
    }
}

/// Most pools one channel's table describes.
pub const MAX_POOLS: u32 = 1024;
/// Most slots in one pool.
pub const MAX_SLOTS: u32 = 1 << 20;
/// Largest slot, in bytes (256 GiB).
pub const MAX_SLOT_SIZE: u64 = 1 << 38;
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
}

/// Pool backend code: host shared memory.
pub const BACKEND_HOST: u32 = 1;
/// Pool backend code: CUDA device memory.
pub const BACKEND_CUDA: u32 = 2;

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

/// [`PoolEntry::state`]: nobody uses the entry.
pub const ENTRY_EMPTY: u32 = 0;
/// [`PoolEntry::state`]: a sender is setting the entry up.
pub const ENTRY_CLAIMED: u32 = 1;
/// [`PoolEntry::state`]: the pool is live; its sender may send from it.
pub const ENTRY_ACTIVE: u32 = 2;
/// [`PoolEntry::state`]: the sender is gone; slots still in flight drain back to the pool.
pub const ENTRY_CLOSED: u32 = 3;

/// One row of a channel's pool table: which pool, where to find it.
///
/// The sender writes every field, then `state = ENTRY_ACTIVE` with Release. The segment
/// name is derivable from the channel name, index and instance; a receiver checks that
/// the stored one matches rather than opening whatever a peer wrote here.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct PoolEntry {
    /// `ENTRY_EMPTY`, `ENTRY_CLAIMED`, `ENTRY_ACTIVE` or `ENTRY_CLOSED`.
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

/// Parameters of a pool, after the segment header.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct PoolHeader {
    /// Number of slots.
    pub slot_count: AtomicU32,
    /// 1: host shared memory.
    pub backend: AtomicU32,
    /// Bytes per slot.
    pub slot_size: AtomicU64,
    /// Set (1) when the owning sender is gone: the last slot returned unlinks the pool.
    pub closed: AtomicU32,
    /// The owning process (diagnostics).
    pub owner_pid: AtomicU32,
}

/// Per-slot state, one 64-byte line each so that slots in use by different processes do
/// not share a line.
///
/// `state` packs the slot's generation (high 32 bits) and where it is (low 32 bits): free,
/// leased to the sender, sent, held by a receiver. See [`crate::pool`].
#[repr(C, align(64))]
#[derive(Debug)]
pub struct SlotRecord {
    /// Generation << 32 | state.
    pub state: AtomicU64,
}

impl SlotRecord {
    /// A free slot of generation 0.
    pub fn new() -> Self {
        Self { state: AtomicU64::new(0) }
    }
}

impl Default for SlotRecord {
    fn default() -> Self {
        Self::new()
    }
}

/// The CUDA side of a device pool, after its free ring: what a receiver needs to import
/// the allocation.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct CudaPoolInfo {
    /// `CUipcMemHandle` of the pool's one allocation.
    pub mem_handle: [AtomicU64; 8],
    /// UUID of the device holding it.
    pub device_uuid: [AtomicU64; 2],
    /// Its ordinal in the creating process (diagnostics: ordinals differ between processes).
    pub device_ordinal: AtomicU32,
    /// Reserved, zero.
    pub reserved: AtomicU32,
    /// Distance between slots in the allocation.
    pub stride: AtomicU64,
}

/// One slot's interprocess events: `ready` (recorded by the sender after its writes,
/// waited on by the receiver) and `release` (recorded by the receiver after its reads,
/// waited on by the next lease).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct SlotEvents {
    /// `CUipcEventHandle` of the ready event.
    pub ready: [AtomicU64; 8],
    /// `CUipcEventHandle` of the release event.
    pub release: [AtomicU64; 8],
}

/// Distance between slots of a device pool: slot size rounded up to 2 MiB.
pub const CUDA_SLOT_ALIGN: u64 = 2 << 20;

/// Byte offsets and size of a host pool segment.
///
/// | offset | what |
/// |---|---|
/// | 0 | [`SegmentHeader`] |
/// | 128 | [`PoolHeader`] |
/// | 256 | `slot_count` × [`SlotRecord`] |
/// | next 128 | the free ring: an MPMC ring of `u32` slot indices ([`RingLayout::at`]) |
/// | next page | the slots, `stride` bytes apart (256-byte aligned, 4096 when ≥ a page) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLayout {
    /// Offset of the [`PoolHeader`].
    pub header: usize,
    /// Offset of the first [`SlotRecord`].
    pub records: usize,
    /// Number of slots.
    pub slot_count: usize,
    /// Usable bytes per slot.
    pub slot_size: usize,
    /// The free ring (capacity: `slot_count` rounded up to a power of two).
    pub free_ring: RingLayout,
    /// Host pools: offset of slot 0's bytes. Device pools: 0 (no bytes here).
    pub data: usize,
    /// Distance between slots (in the segment, or in the device allocation).
    pub stride: usize,
    /// Device pools: offset of the [`CudaPoolInfo`]; host pools: 0.
    pub cuda_info: usize,
    /// Device pools: offset of the first [`SlotEvents`]; host pools: 0.
    pub slot_events: usize,
    /// Size of the whole segment.
    pub total_size: usize,
}

impl PoolLayout {
    /// The layout of `slot_count` slots (`1..=MAX_SLOTS`) of `slot_size` bytes
    /// (`1..=MAX_SLOT_SIZE`), or `None` when out of range or too large to map.
    pub const fn new(slot_count: u32, slot_size: u64) -> Option<Self> {
        Self::build(slot_count, slot_size, BACKEND_HOST)
    }

    /// The layout of a device pool of `slot_count` slots of `slot_size` bytes: the same
    /// records and free ring, then a [`CudaPoolInfo`] and one [`SlotEvents`] per slot; the
    /// slots themselves live in device memory, `stride` (2 MiB multiples) apart.
    pub const fn cuda(slot_count: u32, slot_size: u64) -> Option<Self> {
        Self::build(slot_count, slot_size, BACKEND_CUDA)
    }

    /// The layout for `backend` ([`BACKEND_HOST`] or [`BACKEND_CUDA`]).
    pub const fn for_backend(backend: u32, slot_count: u32, slot_size: u64) -> Option<Self> {
        match backend {
            BACKEND_HOST | BACKEND_CUDA => Self::build(slot_count, slot_size, backend),
            _ => None,
        }
    }

    const fn build(slot_count: u32, slot_size: u64, backend: u32) -> Option<Self> {
        if slot_count == 0 || slot_count > MAX_SLOTS || slot_size == 0 || slot_size > MAX_SLOT_SIZE
        {
            return None;
        }
        let header = size_of::<SegmentHeader>();
        let records = header + size_of::<PoolHeader>();
        let ring_base =
            (records + slot_count as usize * size_of::<SlotRecord>()).next_multiple_of(128);
        // At least 2: an MPMC ring of one cell cannot tell full from empty (see `mpmc`).
        let cap = if slot_count < 2 { 2 } else { (slot_count as u64).next_power_of_two() };
        let Some(free_ring) = RingLayout::at(ring_base, cap, size_of::<MpmcCell<u32>>()) else {
            return None;
        };
        if backend == BACKEND_CUDA {
            let cuda_info = free_ring.total_size.next_multiple_of(128);
            let slot_events = cuda_info + size_of::<CudaPoolInfo>();
            let total_size = slot_events + slot_count as usize * size_of::<SlotEvents>();
            let stride = slot_size.next_multiple_of(CUDA_SLOT_ALIGN) as usize;
            if stride.checked_mul(slot_count as usize).is_none() {
                return None;
            }
            return Some(Self {
                header,
                records,
                slot_count: slot_count as usize,
                slot_size: slot_size as usize,
                free_ring,
                data: 0,
                stride,
                cuda_info,
                slot_events,
                total_size,
            });
        }
        let data = free_ring.total_size.next_multiple_of(4096);
        let align = if slot_size >= 4096 { 4096 } else { 256 };
        let stride = (slot_size as usize).next_multiple_of(align);
        let Some(body) = stride.checked_mul(slot_count as usize) else {
            return None;
        };
        let Some(total_size) = data.checked_add(body) else {
            return None;
        };
        if total_size as u64 > 1 << 40 {
            return None;
        }
        Some(Self {
            header,
            records,
            slot_count: slot_count as usize,
            slot_size: slot_size as usize,
            free_ring,
            data,
            stride,
            cuda_info: 0,
            slot_events: 0,
            total_size,
        })
    }

    /// Offset of slot `slot`'s first byte (`slot < slot_count`).
    pub const fn slot_offset(&self, slot: usize) -> usize {
        self.data + slot * self.stride
    }
}

#[cfg(not(loom))]
const _: () = {
    assert!(size_of::<SegmentHeader>() == 128);
    assert!(size_of::<RingHeader>() == 128);
    assert!(size_of::<RingControl>() == 512);
    assert!(size_of::<Participants>() == 512 + 64 * 64);
    assert!(size_of::<Claims>() == 64);
    assert!(size_of::<WaitWord>() == 8);
    assert!(size_of::<SpscCell<u64>>() == 8);
    assert!(size_of::<SpscCell<crate::Descriptor>>() == 384);
    assert!(size_of::<MpmcCell<u64>>() == 64);
    assert!(size_of::<MpmcCell<crate::Descriptor>>() == 448);
    assert!(size_of::<ChannelHeader>() == 128);
    assert!(size_of::<PoolEntry>() == 512);
    assert!(size_of::<PoolHeader>() == 128);
    assert!(size_of::<SlotRecord>() == 64);
    assert!(size_of::<CudaPoolInfo>() == 128);
    assert!(size_of::<SlotEvents>() == 128);
    // Cells start on a 128-byte boundary, so every cell type is aligned.
    assert!(
        (size_of::<SegmentHeader>()
            + size_of::<RingHeader>()
            + size_of::<RingControl>()
            + size_of::<Participants>())
            % 128
            == 0
    );
};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn claim_words_name_their_run_and_nothing_else() {
        assert!(!Claims::names(0, 0), "0 names nothing");
        let w = Claims::word(10, 3);
        assert!((10..13).all(|p| Claims::names(w, p)));
        assert!(!Claims::names(w, 9) && !Claims::names(w, 13));
        // Positions compare modulo 2^56: a run across that boundary still names its cells.
        let first = (1u64 << 56) - 2;
        let w = Claims::word(first, 4);
        assert!((first..first + 4).all(|p| Claims::names(w, p)));
        assert!(!Claims::names(w, first + 4));
        // Back to full positions, below `end` and within a lap; the rest is dropped.
        let w = Claims::word(100, 5);
        assert_eq!(Claims::positions(w, 105, 16).collect::<Vec<_>>(), [100, 101, 102, 103, 104]);
        assert_eq!(Claims::positions(w, 103, 16).collect::<Vec<_>>(), [100, 101, 102]);
        assert_eq!(Claims::positions(w, 117, 16).collect::<Vec<_>>(), [101, 102, 103, 104]);
        assert_eq!(Claims::positions(w, 100, 16).count(), 0);
        assert_eq!(Claims::positions(0, 100, 16).count(), 0);
        let w = Claims::word(first, 4);
        assert_eq!(
            Claims::positions(w, first + 4, 8).collect::<Vec<_>>(),
            [first, first + 1, first + 2, first + 3]
        );
    }

    #[test]
    fn layout_rejects_bad_capacity() {
        assert!(RingLayout::new(0, 8).is_none());
        assert!(RingLayout::new(3, 8).is_none());
        assert!(RingLayout::new(MAX_CAPACITY * 2, 8).is_none());
        assert!(RingLayout::new(4, usize::MAX / 2).is_none(), "overflow is None");
    }

    #[test]
    fn layout_offsets() {
        let l = RingLayout::new(1024, 384).unwrap();
        assert_eq!((l.ring_header, l.control, l.participants, l.cells), (128, 256, 768, 5376));
        assert_eq!(l.total_size, 5376 + 1024 * 384);
    }

    #[test]
    fn channel_and_pool_layouts() {
        let c = ChannelLayout::new(4, 64, 384).unwrap();
        assert_eq!((c.header, c.pools, c.ring.ring_header), (128, 256, 256 + 4 * 512));
        assert_eq!(c.total_size, c.ring.cells + 64 * 384);
        assert!(ChannelLayout::new(0, 64, 384).is_none());
        assert!(ChannelLayout::new(MAX_POOLS + 1, 64, 384).is_none());
        assert!(ChannelLayout::new(4, 3, 384).is_none());

        let p = PoolLayout::new(3, 1000).unwrap();
        assert_eq!(p.records, 256);
        assert_eq!(p.free_ring.ring_header, 512, "records end at 448, rounded up to 128");
        assert_eq!(p.free_ring.capacity, 4);
        assert_eq!(p.data % 4096, 0);
        assert!(p.data >= p.free_ring.total_size);
        assert_eq!(p.stride, 1024, "small slots are 256-byte aligned");
        assert_eq!(p.total_size, p.data + 3 * 1024);
        assert_eq!(PoolLayout::new(2, 5000).unwrap().stride, 8192, "big slots page aligned");
        assert!(PoolLayout::new(0, 64).is_none());
        assert!(PoolLayout::new(4, 0).is_none());
        assert!(PoolLayout::new(MAX_SLOTS + 1, 64).is_none());
        assert!(PoolLayout::new(MAX_SLOTS, MAX_SLOT_SIZE).is_none(), "too large to map");

        let g = PoolLayout::cuda(3, 1000).unwrap();
        assert_eq!((g.records, g.free_ring, g.data), (p.records, p.free_ring, 0));
        assert_eq!(g.cuda_info % 128, 0);
        assert!(g.cuda_info >= g.free_ring.total_size);
        assert_eq!(g.slot_events, g.cuda_info + 128);
        assert_eq!(g.total_size, g.slot_events + 3 * 128);
        assert_eq!(g.stride, 2 << 20, "device slots 2 MiB apart");
        assert_eq!(PoolLayout::cuda(1, (2 << 20) + 1).unwrap().stride, 4 << 20);
        assert_eq!(PoolLayout::for_backend(BACKEND_HOST, 3, 1000), Some(p));
        assert_eq!(PoolLayout::for_backend(9, 3, 1000), None);
    }

    #[test]
    fn kind_round_trip() {
        for k in [
            SegmentKind::SpscRing,
            SegmentKind::MpmcRing,
            SegmentKind::SpscChannel,
            SegmentKind::MpmcChannel,
            SegmentKind::HostPool,
            SegmentKind::CudaPool,
        ] {
            assert_eq!(SegmentKind::from_raw(k as u32), Some(k));
        }
        assert_eq!(SegmentKind::from_raw(0), None);
        assert_eq!(SegmentKind::from_raw(77), None);
    }
}
