//! Typed views of a mapped segment: the one place where an offset into shared memory
//! becomes a reference. A view is made from a [`Mapping`] (what `shm::Segment` is) and a
//! layout derived from checked parameters; it hands out `&` references to [`Shared`]
//! structures only, whose every field is an atomic, so reading them needs no `unsafe` at
//! the call site and a peer's writes can make a value wrong, never a read unsound.

use core::ptr::NonNull;

use super::{
    ChannelHeader, ChannelLayout, CudaPoolInfo, Participants, PoolEntry, PoolHeader, PoolLayout,
    RingControl, RingHeader, SegmentHeader, SlotEvents, SlotRecord,
};
use crate::sync::Ordering;

/// A structure that may be viewed in shared memory.
///
/// # Safety
///
/// The type is `#[repr(C)]` and made only of atomics (or arrays and structures of them):
/// every bit pattern a peer may write is a valid value, nothing in it points anywhere, and
/// every access to it is an atomic operation.
pub(crate) unsafe trait Shared {}

// SAFETY: each is `#[repr(C)]` and made of atomics only (see their definitions).
unsafe impl Shared for SegmentHeader {}
// SAFETY: as above.
unsafe impl Shared for ChannelHeader {}
// SAFETY: as above.
unsafe impl Shared for PoolEntry {}
// SAFETY: as above.
unsafe impl Shared for PoolHeader {}
// SAFETY: as above.
unsafe impl Shared for SlotRecord {}
// SAFETY: as above.
unsafe impl Shared for CudaPoolInfo {}
// SAFETY: as above.
unsafe impl Shared for SlotEvents {}
// SAFETY: as above.
unsafe impl Shared for RingHeader {}
// SAFETY: as above.
unsafe impl Shared for RingControl {}
// SAFETY: as above.
unsafe impl Shared for Participants {}

/// A mapped segment, as the views read it.
///
/// # Safety
///
/// `base()..base() + len()` is mapped read-write for as long as the value lives, `base()`
/// is page-aligned, and the two never change.
pub(crate) unsafe trait Mapping {
    /// The first byte of the mapping.
    fn base(&self) -> NonNull<u8>;
    /// Its length in bytes.
    fn len(&self) -> usize;
}

/// The `n` values of `U` from `offset` in `m`, or `None` where they do not fit in the
/// mapping or are misaligned (a layout from checked parameters never is: `None` means the
/// mapping is shorter than its parameters say).
pub(crate) fn view_slice<U: Shared>(m: &impl Mapping, offset: usize, n: usize) -> Option<&[U]> {
    let end = size_of::<U>().checked_mul(n)?.checked_add(offset)?;
    if end > m.len() || offset % align_of::<U>() != 0 {
        return None;
    }
    // SAFETY: `offset..end` lies inside the mapping, which lives as long as `m` is borrowed
    // (`Mapping`'s contract), and is aligned for `U` (the base is page-aligned); `U` is
    // valid for any bytes and read only atomically (`Shared`'s contract).
    Some(unsafe { core::slice::from_raw_parts(m.base().add(offset).cast::<U>().as_ptr(), n) })
}

/// The `U` at `offset` in `m` (see [`view_slice`]).
pub(crate) fn view<U: Shared>(m: &impl Mapping, offset: usize) -> Option<&U> {
    view_slice(m, offset, 1).map(|s| &s[0])
}

/// The header every segment starts with (a mapping is at least a header long: every
/// create and open checks).
///
/// # Panics
///
/// On a mapping shorter than a header.
pub(crate) fn header(m: &impl Mapping) -> &SegmentHeader {
    view(m, 0).expect("a segment is at least a header long")
}

/// A channel segment's header and pool table, and its layout (with a one-cell ring: the
/// ring's offsets do not depend on its capacity unless the layout given says so).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChannelView<'a> {
    pub(crate) header: &'a ChannelHeader,
    pub(crate) entries: &'a [PoolEntry],
    pub(crate) layout: ChannelLayout,
}

impl<'a> ChannelView<'a> {
    /// The channel in `m`, its table size read once from its header: `None` when that size
    /// is out of range, or the table and the ring's header do not fit in the mapping.
    pub(crate) fn read(m: &'a impl Mapping) -> Option<Self> {
        let header: &ChannelHeader = view(m, size_of::<SegmentHeader>())?;
        // Relaxed: a value the creator published before `init`; read once, then checked.
        let layout = ChannelLayout::new(header.max_pools.load(Ordering::Relaxed), 1, 0)?;
        (layout.ring.cells <= m.len()).then_some(())?;
        Self::with_layout(m, layout)
    }

    /// The channel in `m` as `layout` (from checked parameters) places it.
    pub(crate) fn with_layout(m: &'a impl Mapping, layout: ChannelLayout) -> Option<Self> {
        Some(Self {
            header: view(m, layout.header)?,
            entries: view_slice(m, layout.pools, layout.max_pools)?,
            layout,
        })
    }

    /// Table entry `index` (checked by the caller against the table's size).
    ///
    /// # Panics
    ///
    /// On an index beyond the table.
    pub(crate) fn entry(&self, index: u32) -> &'a PoolEntry {
        &self.entries[index as usize]
    }
}

/// A ring's header, control words and participant table, where a ring or channel segment
/// has them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingView<'a> {
    pub(crate) header: &'a RingHeader,
    pub(crate) control: &'a RingControl,
    pub(crate) participants: &'a Participants,
}

impl<'a> RingView<'a> {
    /// The ring whose [`RingHeader`] sits at `base` in `m` (`None` when it does not fit).
    pub(crate) fn at(m: &'a impl Mapping, base: usize) -> Option<Self> {
        let control = base + size_of::<RingHeader>();
        let participants = control + size_of::<RingControl>();
        Some(Self {
            header: view(m, base)?,
            control: view(m, control)?,
            participants: view(m, participants)?,
        })
    }

    /// Elements waiting (a snapshot; `None` when the positions are impossible).
    pub(crate) fn queued(&self) -> Option<u64> {
        // Relaxed: a snapshot.
        let (head, tail) =
            (self.control.head.load(Ordering::Relaxed), self.control.tail.load(Ordering::Relaxed));
        tail.checked_sub(head).filter(|&d| d <= self.header.capacity.load(Ordering::Relaxed))
    }
}

/// A pool segment's header and slot records, and a device pool's CUDA handles.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolView<'a> {
    pub(crate) header: &'a PoolHeader,
    pub(crate) records: &'a [SlotRecord],
    /// Device pools: the allocation's handle, device and ordering.
    pub(crate) cuda_info: Option<&'a CudaPoolInfo>,
    /// Device pools: every slot's event handles (empty for host pools).
    pub(crate) slot_events: &'a [SlotEvents],
}

impl<'a> PoolView<'a> {
    /// The pool in `m` as `layout` places it: `None` when the mapping is not of the
    /// layout's size.
    pub(crate) fn of(m: &'a impl Mapping, layout: &PoolLayout) -> Option<Self> {
        if m.len() != layout.total_size {
            return None;
        }
        let device = layout.cuda_info != 0;
        Some(Self {
            header: view(m, layout.header)?,
            records: view_slice(m, layout.records, layout.slot_count)?,
            cuda_info: if device { Some(view(m, layout.cuda_info)?) } else { None },
            slot_events: if device {
                view_slice(m, layout.slot_events, layout.slot_count)?
            } else {
                &[]
            },
        })
    }
}

/// The first bytes of a segment's object, read from its file (no mapping): what `list`
/// tells of every object in `/dev/shm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeaderBytes {
    pub(crate) magic: u64,
    pub(crate) version: u32,
    pub(crate) kind: u32,
    pub(crate) creator_pid: u32,
    pub(crate) init: u32,
}

impl HeaderBytes {
    /// How many bytes [`parse`](Self::parse) reads.
    pub(crate) const LEN: usize = core::mem::offset_of!(SegmentHeader, init) + 4;

    /// The header fields in `bytes` (the object's first [`LEN`](Self::LEN) bytes; the
    /// platform is little-endian, as every process that maps the segment is).
    pub(crate) fn parse(bytes: &[u8; Self::LEN]) -> Self {
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        Self {
            magic: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            version: word(core::mem::offset_of!(SegmentHeader, version)),
            kind: word(core::mem::offset_of!(SegmentHeader, kind)),
            creator_pid: word(core::mem::offset_of!(SegmentHeader, creator_pid)),
            init: word(core::mem::offset_of!(SegmentHeader, init)),
        }
    }
}
