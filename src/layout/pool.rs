//! A slot pool segment: [`PoolHeader`], one [`SlotRecord`] per slot, the free ring, then
//! the slots (host pools) or the CUDA IPC handles of the allocation and of every slot's
//! events (device pools).
//!
//! | offset | what |
//! |---|---|
//! | 0 | [`SegmentHeader`] |
//! | 128 | [`PoolHeader`] |
//! | 256 | `slot_count` × [`SlotRecord`] |
//! | next 128 | the free ring: an MPMC ring of `u32` slot indices ([`RingLayout::at`]) |
//! | next 128 | device pools: [`CudaPoolInfo`], then `slot_count` × [`SlotEvents`] |
//! | next 128 | `slot_count` sent copies: the descriptor each slot was last sent with ([`SENT_COPY_SIZE`] bytes) |
//! | next page | `slot_count` slot headers of [`SLOT_HEADER_SIZE`] bytes (host memory, every backend) |
//! | next page | host pools: the slots, `stride` bytes apart (256-byte aligned, 4096 when ≥ a page) |

use super::{BACKEND_CUDA, BACKEND_HOST, Corrupted, MpmcCell, RingLayout, SegmentHeader};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Most slots in one pool.
pub const MAX_SLOTS: u32 = 1 << 20;
/// Largest slot, in bytes (256 GiB).
pub const MAX_SLOT_SIZE: u64 = 1 << 38;
/// Bytes of host memory beside each slot, for every backend: a message's header (bytes the
/// sender writes and the receiver reads on the CPU, e.g. the table of several tensors in
/// one slot, or a pickled object whose tensors sit in the slot). One page, so that a pool's
/// unused headers cost no memory.
pub const SLOT_HEADER_SIZE: usize = 4096;
/// Bytes of each slot's sent copy: the descriptor the sender last published for it,
/// written before the publish, so that a message whose receiver died holding it can be
/// delivered again (read only then, and checked as any descriptor).
pub const SENT_COPY_SIZE: usize = size_of::<crate::descriptor::Descriptor>();

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
    /// Device pools: set (1) when the sender has given its slots up for lost (its process
    /// leaves, and device memory cannot outlive it): receivers refuse the messages still
    /// queued, unread.
    pub retired: AtomicU32,
    /// The sender process's entry in the robust-futex list of its keeper thread
    /// (`liveness::keeper`): an address in that process, written there and read by its
    /// kernel when the process dies; gpuring never reads it.
    pub keeper_link: AtomicU64,
    /// Whether the sending process lives, written by the kernel when it dies: the id of
    /// its keeper thread while it lives (`liveness::keeper`), `OWNER_DIED` (bit 30) set
    /// by the kernel at its death, 0 when not watched (the sender left, or could not
    /// start a keeper). Read by receivers without a system call.
    pub owner_word: AtomicU32,
}

/// Where `PoolHeader::owner_word` lies from `PoolHeader::keeper_link`: the robust-futex
/// list's `futex_offset` (the same for every pool).
pub const KEEPER_FUTEX_OFFSET: isize = (core::mem::offset_of!(PoolHeader, owner_word)
    - core::mem::offset_of!(PoolHeader, keeper_link))
    as isize;

/// Per-slot state, one 64-byte line each so that slots in use by different processes do
/// not share a line.
///
/// `state` packs the slot's generation (high 32 bits) and where it is (low 32 bits): free,
/// leased to the sender, sent, held by a receiver. See the lease protocol
/// (`pool/lease.rs`).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct SlotRecord {
    /// Generation << 32 | state.
    pub state: AtomicU64,
    /// Device pools ordered by host ready flags ([`CudaPoolInfo::ordering`] 1): the
    /// generation of the slot's last send whose writes are done, written by the sender's
    /// stream (`cuStreamWriteValue64`, this line pinned and mapped for the device). Zero
    /// and unused otherwise.
    pub ready: AtomicU64,
    /// Broadcast channels: bit `i` set while reader `i` (its place in the ring's readers
    /// mask) holds the slot's message. Set by the reader before its cursor passes the
    /// message, cleared when it drops it. Zero and unused otherwise.
    pub holders: AtomicU64,
    /// Broadcast channels: the ring position of the slot's last message, written by the
    /// sender before it publishes it. Zero and unused otherwise.
    pub sent_at: AtomicU64,
}

impl SlotRecord {
    /// A free slot of generation 0.
    pub fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            ready: AtomicU64::new(0),
            holders: AtomicU64::new(0),
            sent_at: AtomicU64::new(0),
        }
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
    /// How a receiver learns that a slot's writes are done: 0, its ready event (a stream
    /// waits on it); 1, its record's ready flag ([`SlotRecord::ready`], the receiver's CPU
    /// waits for it). Anything else is corrupt.
    pub ordering: AtomicU32,
    /// Distance between slots in the allocation.
    pub stride: AtomicU64,
}

impl CudaPoolInfo {
    /// Writes [`ordering`](Self::ordering): host ready flags, or ready events. The creator
    /// does, before the segment is published (Relaxed: published with its init word).
    pub fn set_host_flags(&self, host_flags: bool) {
        self.ordering.store(u32::from(host_flags), Ordering::Relaxed);
    }

    /// Whether [`ordering`](Self::ordering) says host ready flags (`false`: ready events).
    ///
    /// # Errors
    ///
    /// [`Corrupted`] for any other value.
    pub fn host_flags(&self) -> Result<bool, Corrupted> {
        // Relaxed: written before the segment was published; checked here like any value
        // read from shared memory.
        match self.ordering.load(Ordering::Relaxed) {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Corrupted { what: "device pool names an unknown ready ordering" }),
        }
    }
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
/// | next 128 | device pools: [`CudaPoolInfo`], then `slot_count` × [`SlotEvents`] |
/// | next 128 | `slot_count` sent copies, [`SENT_COPY_SIZE`] bytes each |
/// | next page | `slot_count` slot headers, [`SLOT_HEADER_SIZE`] bytes each |
/// | next page | host pools: the slots, `stride` bytes apart (256-byte aligned, 4096 when ≥ a page) |
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
    /// The free ring (capacity: `2 * slot_count` rounded up to a power of two).
    pub free_ring: RingLayout,
    /// Host pools: offset of slot 0's bytes. Device pools: 0 (no bytes here).
    pub data: usize,
    /// Distance between slots (in the segment, or in the device allocation).
    pub stride: usize,
    /// Device pools: offset of the [`CudaPoolInfo`]; host pools: 0.
    pub cuda_info: usize,
    /// Device pools: offset of the first [`SlotEvents`]; host pools: 0.
    pub slot_events: usize,
    /// Offset of slot 0's sent copy ([`SENT_COPY_SIZE`] bytes per slot).
    pub sent: usize,
    /// Offset of slot 0's header ([`SLOT_HEADER_SIZE`] bytes per slot, page aligned).
    pub headers: usize,
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
        // Room for every slot and as many cells again: a receiver that died returning a
        // slot leaves the cell it won (unwritten, then skipped) taking a position until the
        // sender passes it, and its slot is pushed again meanwhile. Such cells not yet
        // passed name distinct slots (a slot pushed again is leased only after the sender
        // passed every cell before it), so `2 * slot_count` positions never fill and a
        // return never waits for room. (At least 2 anyway: see `mpmc`.)
        let cap = (2 * slot_count as u64).next_power_of_two();
        let Some(free_ring) = RingLayout::at(ring_base, cap, size_of::<MpmcCell<u32>>()) else {
            return None;
        };
        if backend == BACKEND_CUDA {
            let cuda_info = free_ring.total_size.next_multiple_of(128);
            let slot_events = cuda_info + size_of::<CudaPoolInfo>();
            let sent =
                (slot_events + slot_count as usize * size_of::<SlotEvents>()).next_multiple_of(128);
            let headers = (sent + slot_count as usize * SENT_COPY_SIZE).next_multiple_of(4096);
            let total_size = headers + slot_count as usize * SLOT_HEADER_SIZE;
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
                sent,
                headers,
                total_size,
            });
        }
        let sent = free_ring.total_size.next_multiple_of(128);
        let headers = (sent + slot_count as usize * SENT_COPY_SIZE).next_multiple_of(4096);
        let data = headers + slot_count as usize * SLOT_HEADER_SIZE;
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
            sent,
            headers,
            total_size,
        })
    }

    /// Offset of slot `slot`'s first byte (`slot < slot_count`).
    pub const fn slot_offset(&self, slot: usize) -> usize {
        self.data + slot * self.stride
    }

    /// Offset of slot `slot`'s sent copy (`slot < slot_count`).
    pub const fn sent_offset(&self, slot: usize) -> usize {
        self.sent + slot * SENT_COPY_SIZE
    }

    /// Offset of slot `slot`'s header (`slot < slot_count`).
    pub const fn header_offset(&self, slot: usize) -> usize {
        self.headers + slot * SLOT_HEADER_SIZE
    }
}

#[cfg(not(loom))]
const _: () = {
    assert!(size_of::<PoolHeader>() == 128);
    assert!(size_of::<SlotRecord>() == 64);
    assert!(size_of::<CudaPoolInfo>() == 128);
    assert!(size_of::<SlotEvents>() == 128);
    assert!(SENT_COPY_SIZE % 64 == 0);
};
