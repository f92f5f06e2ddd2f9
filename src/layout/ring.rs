//! A ring segment: [`RingHeader`], [`RingControl`], the [`Participants`] table with its
//! MPMC [`Claims`] lines, and the cells ([`SpscCell`] or [`MpmcCell`]).
//!
//! | offset | what |
//! |---|---|
//! | 0 | [`SegmentHeader`](super::SegmentHeader) |
//! | 128 | [`RingHeader`]: capacity, element size and alignment, SPSC role claims, attach counts |
//! | 256 | [`RingControl`]: tail, head and the two wait words, each on its own 128-byte line |
//! | 768 | [`Participants`]: who is attached, and the MPMC positions each last claimed |
//! | 9472 | `capacity` cells |
//!
//! The same ring sits at another offset inside channel and pool segments
//! ([`RingLayout::at`]).

use super::{Padded, SegmentHeader};
use crate::sync::{AtomicU32, AtomicU64, UnsafeCell};
use crate::wait::WaitWord;

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
    /// SPSC: the [`ParticipantId`] of the endpoint holding the producer role, 0 when free.
    pub producer_claim: AtomicU32,
    /// SPSC: the [`ParticipantId`] of the endpoint holding the consumer role, 0 when free.
    pub consumer_claim: AtomicU32,
    /// Endpoints attached now, per side (`[producers, consumers]`, see [`side`]): one more
    /// at each attach, one fewer at each clean detach. A killed endpoint never takes itself
    /// off, so the count can only overstate. It is the hint by which one side sees at once
    /// that the other has left; the liveness locks confirm it before it is believed.
    pub attached: [AtomicU32; 2],
    /// Per side, 1 once an endpoint of that side has attached (never cleared): "every
    /// producer has left" needs one to have come.
    pub joined: [AtomicU32; 2],
    /// Counts registrations in the [`Participants`] table: each one's serial, so that an
    /// identity ([`ParticipantId`]) names one registration, never a later one of its entry.
    pub registrations: AtomicU32,
    /// Broadcast rings: bit `i` set while the endpoint at participant entry `i` is a
    /// reader, whose cursor (the next position it reads) is that entry's
    /// [`Claims::pop`] word (a broadcast ring has no claims). The producer holds back for
    /// every reader the mask names (`ring::broadcast`). 0 in other rings.
    pub readers: AtomicU64,
    /// Broadcast rings: 1 when the producer never waits for readers (a reader that falls
    /// a ring behind is told how many it missed), 0 when the slowest holds it back. Set at
    /// creation.
    pub lagging: AtomicU32,
}

/// The index of a side in [`RingHeader::attached`] and [`RingHeader::joined`]: 0 for
/// producers ([`PARTICIPANT_PRODUCER`]), 1 for consumers.
pub const fn side(participant_role: u32) -> usize {
    (participant_role == PARTICIPANT_CONSUMER) as usize
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

/// Who is attached to a ring. Entry `i` is [`entry_value`]`(role, serial, pid)`
/// ([`PARTICIPANT_PRODUCER`] or [`PARTICIPANT_CONSUMER`]; the registration's serial; the
/// process, for reports), or 0 when free; it counts only while some process holds the
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
    /// Entry `i`'s claims, 128 bytes per entry (written by its holder only, on every MPMC
    /// push and pop, so that no two endpoints share a line, nor a pair of lines that the
    /// adjacent-line prefetcher moves together).
    pub claims: [Claims; MAX_PARTICIPANTS],
}

/// The run of MPMC positions one endpoint last claimed, as a claim word ([`Claims::word`]),
/// or 0 for none.
///
/// An endpoint names the run it is about to win (one position, or a run of them for a
/// slice) here, in one store, *before* its compare-and-swap of `tail` (`push`) or `head`
/// (`pop`), rewriting it on every retry, and the clones of one endpoint take turns with
/// the line until each has finished its cells (a process-local lock). So a live
/// endpoint's line names every cell it has won and not finished, and an unfinished cell
/// that a dead endpoint's word names while no live one's does was won by that dead
/// endpoint, which will never finish it: it can be repaired (`ring::repair`) with no
/// risk of racing a live writer. A dead word may name positions its holder never won
/// (it lost the CAS, or died before it): the live winner's word names them too.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct Claims {
    /// The run of `tail` positions last claimed.
    pub push: AtomicU64,
    /// The run of `head` positions last claimed.
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

/// Bits of a registration serial kept in entries and identities.
pub const SERIAL_BITS: u32 = 22;
const SERIAL_MASK: u32 = (1 << SERIAL_BITS) - 1;

/// A [`Participants`] entry's value: `role << 56 | serial << 32 | pid` (serial: its low
/// [`SERIAL_BITS`] bits).
pub const fn entry_value(role: u32, serial: u32, pid: u32) -> u64 {
    (role as u64) << 56 | ((serial & SERIAL_MASK) as u64) << 32 | pid as u64
}

/// The role code of an entry's value.
pub const fn entry_role(value: u64) -> u32 {
    (value >> 56) as u32
}

/// The registration serial of an entry's value.
pub const fn entry_serial(value: u64) -> u32 {
    (value >> 32) as u32 & SERIAL_MASK
}

/// The process that wrote an entry's value (reports only: pids are reused, and differ
/// between pid namespaces).
pub const fn entry_pid(value: u64) -> u32 {
    value as u32
}

/// Who an endpoint is, in one ring's participant table, in 29 bits: its entry and the
/// serial of its registration, `serial << 7 | (entry + 1)`; never 0. It names that one
/// registration: once the endpoint is gone (its entry cleared or its lock dropped) it names
/// nobody alive, whatever process or entry reuse follows, and whatever pid a new endpoint
/// has (pids are reused, and repeat across pid namespaces). Recorded as the holder of an
/// SPSC role and of a pool's slot.
pub type ParticipantId = u32;

/// The identity of registration `serial` at entry `index`.
pub const fn participant_id(index: usize, serial: u32) -> ParticipantId {
    (serial & SERIAL_MASK) << 7 | (index as u32 + 1)
}

/// The entry and serial an identity names, or `None` for one that names no entry.
pub const fn participant_of(id: ParticipantId) -> Option<(usize, u32)> {
    let entry = (id & 0x7f) as usize;
    if entry == 0 || entry > MAX_PARTICIPANTS || id >> (7 + SERIAL_BITS) != 0 {
        return None;
    }
    Some((entry - 1, id >> 7))
}

/// [`Participants`] role code of a producer (sender) endpoint.
pub const PARTICIPANT_PRODUCER: u32 = 1;
/// [`Participants`] role code of a consumer (receiver) endpoint.
pub const PARTICIPANT_CONSUMER: u32 = 2;

/// A cell of an SPSC ring: just the element. Which side owns it follows from head and tail.
///
/// (A stamp per cell, polled by the consumer instead of `tail`, was tried and dropped: a
/// consumer that has caught up then spins on the very line the producer writes next, which
/// slows a stream down; docs/DESIGN.md, "The rings".)
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
/// and another consumer has taken over the element (it frees the cell when done; should
/// it die first, the next adopter takes the cell over in turn).
///
/// A won cell is finished only by its winner while that lives: a repair touches an
/// unfinished cell only when a dead endpoint's claim names it and no live one's does (see
/// [`Claims`]).
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

    /// The stamp word, for models and tests that build a state a death leaves behind.
    #[doc(hidden)]
    pub fn stamp_word(&self) -> &AtomicU64 {
        &self.stamp
    }

    /// A cell holding `value`, written at position `pos` and ready for its consumer (how a
    /// ring that starts full, like a pool's free ring, is initialised).
    pub fn written(pos: u64, value: T) -> Self {
        Self { stamp: AtomicU64::new(pos + 1), value: UnsafeCell::new(value) }
    }
}

/// The bit of an MPMC stamp that marks a cell skipped (see [`MpmcCell`]).
pub const STAMP_SKIPPED: u64 = 1 << 63;
/// The bit of an MPMC stamp that marks a cell being adopted: its consumer died before
/// freeing it, and another consumer is taking its element (see [`MpmcCell`]).
pub const STAMP_ADOPTED: u64 = 1 << 62;
/// Bits of an MPMC stamp that no cell carries: a stamp with one set is forged.
pub const STAMP_UNUSED: u64 = 0b11 << 60;
/// Every flag bit; positions stay below them (2^60 elements: centuries at any rate this
/// ring reaches).
pub const STAMP_FLAGS: u64 = STAMP_SKIPPED | STAMP_ADOPTED | STAMP_UNUSED;

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

#[cfg(not(loom))]
const _: () = {
    assert!(size_of::<RingHeader>() == 128);
    assert!(size_of::<RingControl>() == 512);
    assert!(size_of::<Participants>() == 512 + 64 * 128);
    assert!(size_of::<Claims>() == 128);
    assert!(size_of::<WaitWord>() == 8);
    assert!(size_of::<SpscCell<u64>>() == 8);
    assert!(size_of::<SpscCell<crate::descriptor::Descriptor>>() == 384);
    assert!(size_of::<MpmcCell<u64>>() == 64);
    assert!(size_of::<MpmcCell<crate::descriptor::Descriptor>>() == 448);
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
