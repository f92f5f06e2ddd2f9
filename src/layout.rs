//! `#[repr(C)]` shared-memory structures and their sizes: pure data, no syscalls.
//!
//! A ring segment is laid out as
//!
//! | offset | what |
//! |---|---|
//! | 0 | [`SegmentHeader`]: magic, layout version, segment kind, total size, init word |
//! | 128 | [`RingHeader`]: capacity, element size and alignment, role claims |
//! | 256 | [`RingControl`]: tail, head and the two wait words, each on its own 128-byte line |
//! | 768 | `capacity` cells: [`SpscCell`]s or [`MpmcCell`]s |
//!
//! Everything a peer can write is an atomic (or sits in a cell that the ring protocol hands
//! from one side to the other), and everything read from here is untrusted: the modules
//! above read each value once and check it. Offsets are derived from the header's
//! parameters by [`RingLayout::new`], never stored, so there is no offset to forge.
//!
//! Changing any of these types changes [`LAYOUT_VERSION`].

use crate::sync::{AtomicU32, AtomicU64, UnsafeCell};
use crate::wait::WaitWord;

/// `"GPURING\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPURING\0");

/// Bumped whenever a shared-memory type changes shape or meaning.
pub const LAYOUT_VERSION: u32 = 1;

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
}

impl SegmentKind {
    /// Decodes a kind read from shared memory.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::SpscRing),
            2 => Some(Self::MpmcRing),
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
}

/// Byte offsets and size of a ring segment, derived from its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Offset of the [`RingHeader`].
    pub ring_header: usize,
    /// Offset of the [`RingControl`].
    pub control: usize,
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
        if capacity == 0 || !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
            return None;
        }
        let ring_header = size_of::<SegmentHeader>();
        let control = ring_header + size_of::<RingHeader>();
        let cells = control + size_of::<RingControl>();
        let Some(body) = (capacity as usize).checked_mul(cell_size) else {
            return None;
        };
        let Some(total_size) = cells.checked_add(body) else {
            return None;
        };
        Some(Self {
            ring_header,
            control,
            cells,
            cell_size,
            capacity: capacity as usize,
            total_size,
        })
    }
}

#[cfg(not(loom))]
const _: () = {
    assert!(size_of::<SegmentHeader>() == 128);
    assert!(size_of::<RingHeader>() == 128);
    assert!(size_of::<RingControl>() == 512);
    assert!(size_of::<WaitWord>() == 8);
    assert!(size_of::<SpscCell<u64>>() == 8);
    assert!(size_of::<SpscCell<crate::Descriptor>>() == 384);
    assert!(size_of::<MpmcCell<u64>>() == 64);
    assert!(size_of::<MpmcCell<crate::Descriptor>>() == 448);
    // Cells start on a 128-byte boundary, so every cell type is aligned.
    assert!(
        (size_of::<SegmentHeader>() + size_of::<RingHeader>() + size_of::<RingControl>()) % 128
            == 0
    );
};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

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
        assert_eq!((l.ring_header, l.control, l.cells), (128, 256, 768));
        assert_eq!(l.total_size, 768 + 1024 * 384);
    }

    #[test]
    fn kind_round_trip() {
        for k in [SegmentKind::SpscRing, SegmentKind::MpmcRing] {
            assert_eq!(SegmentKind::from_raw(k as u32), Some(k));
        }
        assert_eq!(SegmentKind::from_raw(0), None);
        assert_eq!(SegmentKind::from_raw(77), None);
    }
}
