//! A pool in shared memory: the slot records and the free ring of [`PoolCore`], then the
//! slots themselves (host pools) or the CUDA handles of a device allocation (device pools:
//! typed views of them here, the driver calls in `crate::cuda`). See [`PoolLayout`].
//!
//! The sender creates the segment; receivers open it. Its handles do not remove it when
//! they drop: the sender marks it closed, and whoever sees it closed with every slot free
//! (the sender itself, or the receiver returning the last slot in flight) unlinks it. The
//! pools that a crash left behind go with their channel: the channel's last user out
//! removes their names, even where a message kept past its channel still maps one.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::lease::PoolCore;
use crate::descriptor::Descriptor;
use crate::layout::{
    BACKEND_CUDA, BACKEND_HOST, Corrupted, CudaPoolInfo, Mapping, MpmcCell, PoolHeader, PoolLayout,
    PoolView, RingView, SegmentKind, SlotEvents, SlotRecord, view, view_slice,
};
use crate::liveness::keeper::Vigil;
use crate::liveness::{AttachError, Role};
use crate::ring::{RingSegment, ShmStorage};
use crate::shm::{Segment, ShmError};
use crate::sync::Ordering;

/// The slot records of a mapped pool segment.
#[derive(Debug)]
pub struct ShmRecords {
    // Keeps the mapping alive.
    _segment: Arc<Segment>,
    ptr: NonNull<SlotRecord>,
    len: usize,
}

impl std::ops::Deref for ShmRecords {
    type Target = [SlotRecord];
    fn deref(&self) -> &[SlotRecord] {
        // SAFETY: `len` records start at `ptr`, inside the mapping that `segment` keeps
        // alive (placed by a checked `PoolLayout`); records are atomics, valid for any
        // bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: a view of shared memory made only of atomics; nothing ties it to a thread.
unsafe impl Send for ShmRecords {}
// SAFETY: as above.
unsafe impl Sync for ShmRecords {}

/// A pool's shared-memory segment: records and free ring, then the slots (host
/// backend) or the CUDA IPC handles of the allocation and of each slot's events (CUDA
/// backend).
///
/// The sender creates it; receivers open it. Its name is not unlinked on drop: the
/// sender marks it closed, and whoever sees it closed with every slot free (the sender
/// itself, or the receiver returning the last slot in flight) unlinks it.
#[derive(Debug)]
pub struct PoolSegment {
    pub(crate) core: PoolCore<ShmRecords, ShmStorage<MpmcCell<u32>>>,
    segment: Arc<Segment>,
    layout: PoolLayout,
    backend: u32,
    // Host backend only: slot 0's bytes.
    data: Option<NonNull<u8>>,
    // Slot 0's header (every backend).
    headers: NonNull<u8>,
    // Slot 0's sent copy (every backend).
    sent: NonNull<Descriptor>,
}

// SAFETY: `data` points into the mapping `segment` keeps alive; slot bytes are only
// handed out under the lease protocol.
unsafe impl Send for PoolSegment {}
// SAFETY: as above.
unsafe impl Sync for PoolSegment {}

fn kind(backend: u32) -> SegmentKind {
    if backend == BACKEND_CUDA { SegmentKind::CudaPool } else { SegmentKind::HostPool }
}

impl PoolSegment {
    /// Creates pool segment `name` for `backend`: `slot_count` free slots of
    /// `slot_size` bytes. `init` writes the backend's part (CUDA handles) before the
    /// segment is published.
    pub(crate) fn create(
        name: &str,
        backend: u32,
        slot_count: u32,
        slot_size: u64,
        init: impl FnOnce(&Segment, &PoolLayout),
    ) -> Result<Self, PoolSegmentError> {
        let layout = PoolLayout::for_backend(backend, slot_count, slot_size)
            .expect("pool parameters are checked when the channel is created or opened");
        let n = slot_count as usize;
        let segment = Segment::create(name, kind(backend), layout.total_size, false, |seg| {
            // Ours alone until `create` publishes it; `layout` sized the segment.
            let header = PoolView::of(seg, &layout).expect("sized by its layout").header;
            // Relaxed: published by the Release store of `init` in `Segment::create`.
            header.slot_count.store(slot_count, Ordering::Relaxed);
            header.backend.store(backend, Ordering::Relaxed);
            header.slot_size.store(slot_size, Ordering::Relaxed);
            header.owner_pid.store(std::process::id(), Ordering::Relaxed);
            // Records are zero (free, generation 0) in a fresh object. The free ring
            // starts full: cell i holds slot i, written at position i.
            RingSegment::init_in::<u32, MpmcCell<u32>>(seg, &layout.free_ring, |i| {
                if i < n { MpmcCell::written(i as u64, i as u32) } else { MpmcCell::new(i as u64) }
            });
            let free_ring = RingView::at(seg, layout.free_ring.ring_header);
            let control = free_ring.expect("sized by its layout").control;
            control.tail.store(n as u64, Ordering::Relaxed);
            init(seg, &layout);
            Ok::<_, ShmError>(())
        })?;
        Self::new(Arc::new(segment), layout, backend, Role::Consumer)
    }

    /// Opens pool segment `name`, which must hold `slot_count` slots of `slot_size`
    /// bytes (what the channel's pool table says).
    pub(crate) fn open(
        name: &str,
        backend: u32,
        slot_count: u32,
        slot_size: u64,
        timeout: Duration,
    ) -> Result<Self, PoolSegmentError> {
        Self::open_as(name, backend, (slot_count, slot_size), timeout, true)
    }

    /// Closes pool `name` whose sender is gone, for a sender registering in its channel:
    /// marks free the slots that would never come back ([`PoolCore::abandon`], with
    /// `sender_dead`, `exited`, `queued` and `redeliver` as there), marks the pool closed (a device
    /// pool of a sender that died also retired: its memory went with its process, so
    /// receivers refuse what is still queued), and unlinks it if that left every slot
    /// free; otherwise the last slot to come back unlinks it. Maps the pool without
    /// touching its slots. A pool that is gone already is fine.
    pub(crate) fn close_orphaned(
        name: &str,
        backend: u32,
        (slot_count, slot_size): (u32, u64),
        sender_dead: bool,
        exited: impl Fn(u32) -> bool,
        queued: impl Fn(u32, u32) -> bool,
        redeliver: bool,
    ) -> Result<(), PoolSegmentError> {
        let params = (slot_count, slot_size);
        let pool = match Self::open_as(name, backend, params, Duration::ZERO, false) {
            Err(PoolSegmentError::Segment(ShmError::NotFound { .. })) => return Ok(()),
            opened => opened?,
        };
        // A device pool of a dead sender refuses its messages: nothing to deliver again.
        let retired = sender_dead && backend == BACKEND_CUDA;
        if retired {
            pool.retire();
        }
        pool.core.abandon(sender_dead, exited, queued, redeliver && !retired);
        pool.close();
        Ok(())
    }

    /// `open`, faulting the mapping in (`populate`: for a receiver, which reads the slots)
    /// or not.
    fn open_as(
        name: &str,
        backend: u32,
        (slot_count, slot_size): (u32, u64),
        timeout: Duration,
        populate: bool,
    ) -> Result<Self, PoolSegmentError> {
        let segment = Segment::open(name, kind(backend), timeout)?;
        let layout = PoolLayout::for_backend(backend, slot_count, slot_size)
            .ok_or(Corrupted { what: "pool table entry holds impossible slot parameters" })?;
        if segment.len() != layout.total_size {
            return Err(PoolSegmentError::Segment(ShmError::SizeMismatch {
                expected: layout.total_size as u64,
                found: segment.len() as u64,
            }));
        }
        let header = PoolView::of(&segment, &layout).expect("its size is the layout's").header;
        // Relaxed: `Segment::open` synchronised with the creator through `init`.
        let found = (
            header.slot_count.load(Ordering::Relaxed),
            header.slot_size.load(Ordering::Relaxed),
            header.backend.load(Ordering::Relaxed),
        );
        if found != (slot_count, slot_size, backend) {
            return Err(
                Corrupted { what: "pool header disagrees with the channel's pool table" }.into()
            );
        }
        RingSegment::check_in::<u32>(&segment, &layout.free_ring)?;
        if populate {
            segment.populate();
        }
        Self::new(Arc::new(segment), layout, backend, Role::Producer)
    }

    /// `role` in the free ring: the sender (creator) takes slots out, a receiver
    /// (opener) puts them back; the participant entry lets a sender that waits for
    /// slots learn that every receiver holding them has died.
    fn new(
        segment: Arc<Segment>,
        layout: PoolLayout,
        backend: u32,
        role: Role,
    ) -> Result<Self, PoolSegmentError> {
        let records = view_slice::<SlotRecord>(&*segment, layout.records, layout.slot_count)
            .expect("the layout sized the segment");
        let records = NonNull::from(records).cast::<SlotRecord>();
        // SAFETY: as above; host pools end with their slots.
        let data = (backend == BACKEND_HOST).then(|| unsafe { segment.at::<u8>(layout.data) });
        // SAFETY: as above; the headers lie inside the mapping the layout sized.
        let headers = unsafe { segment.at::<u8>(layout.headers) };
        // SAFETY: as above; the sent copies lie inside the mapping the layout sized, at an
        // offset aligned for a descriptor (128, of a page-aligned base).
        let sent = unsafe { segment.at::<Descriptor>(layout.sent) };
        let records =
            ShmRecords { _segment: segment.clone(), ptr: records, len: layout.slot_count };
        let ring = RingSegment::view(segment.clone(), layout.free_ring, true);
        let core = PoolCore::new(records, ring.attached_storage::<MpmcCell<u32>>(role)?)?;
        Ok(Self { core, segment, layout, backend, data, headers, sent })
    }

    /// The bytes of slot `slot` (`slot < slot_count`, checked by the caller's lease).
    ///
    /// # Panics
    ///
    /// On a device pool (its bytes are not here), or a slot out of range.
    pub(crate) fn slot_ptr(&self, slot: u32) -> NonNull<u8> {
        assert!((slot as usize) < self.layout.slot_count, "slot index checked by the lease");
        let data = self.data.expect("host slots live in host pools only");
        // SAFETY: slot < slot_count, so the slot lies inside the mapping.
        unsafe { data.add(self.layout.slot_offset(slot as usize) - self.layout.data) }
    }

    /// Slot `slot`'s header: [`SLOT_HEADER_SIZE`](crate::layout::SLOT_HEADER_SIZE) bytes
    /// of host memory, every backend.
    ///
    /// # Panics
    ///
    /// On a slot out of range.
    pub(crate) fn header_ptr(&self, slot: u32) -> NonNull<u8> {
        assert!((slot as usize) < self.layout.slot_count, "slot index checked by the caller");
        // SAFETY: slot < slot_count, so its header lies inside the mapping.
        unsafe { self.headers.add(self.layout.header_offset(slot as usize) - self.layout.headers) }
    }

    /// Records `d` as slot `slot`'s sent copy: the sender does, before publishing `d`
    /// (whose Release push orders these writes for the receiver, and through its Release
    /// take of the slot, for whoever takes the slot over from it; see
    /// [`PoolCore::adopt`]).
    ///
    /// # Panics
    ///
    /// On a slot out of range.
    pub(crate) fn write_sent(&self, slot: u32, d: &Descriptor) {
        assert!((slot as usize) < self.layout.slot_count, "slot index checked by the lease");
        // SAFETY: slot < slot_count, so its copy lies inside the mapping, aligned. A
        // volatile write of plain data: only a forger writes it concurrently, and what a
        // reader makes of it is checked as any descriptor.
        unsafe { self.sent.add(slot as usize).write_volatile(*d) }
    }

    /// Slot `slot`'s sent copy, for a receiver that took the slot over from a holder that
    /// died ([`PoolCore::adopt`]): untrusted, checked as any descriptor by the caller.
    ///
    /// # Panics
    ///
    /// On a slot out of range.
    pub(crate) fn read_sent(&self, slot: u32) -> Descriptor {
        assert!((slot as usize) < self.layout.slot_count, "slot index checked by the caller");
        // SAFETY: as in `write_sent`; any bytes are a valid `Descriptor` (`Pod`).
        unsafe { self.sent.add(slot as usize).read_volatile() }
    }

    /// The host slots' pages, from slot 0 to the end of the mapping (whose last page is
    /// mapped whole), and the mapping they are in: what registering a host pool with a
    /// device driver covers.
    ///
    /// # Panics
    ///
    /// On a device pool.
    pub(crate) fn slot_pages(&self) -> (NonNull<u8>, usize, &Arc<Segment>) {
        let data = self.data.expect("host slots live in host pools only");
        let page = rustix::param::page_size();
        let len = (self.segment.len() - self.layout.data).next_multiple_of(page);
        (data, len, &self.segment)
    }

    /// The whole mapping, its length rounded up to whole pages, and the offset in it of
    /// slot 0's ready word (records are `size_of::<SlotRecord>()` apart): what a device
    /// pool signalled by host ready flags registers with its driver.
    pub(crate) fn mapping(&self) -> (NonNull<u8>, usize, usize, &Arc<Segment>) {
        let base = Mapping::base(&*self.segment);
        let len = self.segment.len().next_multiple_of(rustix::param::page_size());
        let ready = self.layout.records + std::mem::offset_of!(SlotRecord, ready);
        (base, len, ready, &self.segment)
    }

    /// Slot `slot`'s record (`slot` checked by the caller).
    ///
    /// # Panics
    ///
    /// On a slot out of range.
    pub(crate) fn record(&self, slot: u32) -> &SlotRecord {
        &self.core.records()[slot as usize]
    }

    /// Device pools: the allocation's handle and device.
    ///
    /// # Panics
    ///
    /// On a host pool.
    pub(crate) fn cuda_info(&self) -> &CudaPoolInfo {
        self.view().cuda_info.expect("a device pool")
    }

    /// Device pools: every slot's event handles.
    ///
    /// # Panics
    ///
    /// On a host pool.
    pub(crate) fn slot_events(&self) -> &[SlotEvents] {
        assert_eq!(self.backend, BACKEND_CUDA, "a device pool");
        self.view().slot_events
    }

    /// The pool's layout (checked when the segment was made or opened).
    pub(crate) fn layout(&self) -> &PoolLayout {
        &self.layout
    }

    /// Usable bytes per slot.
    pub(crate) fn slot_size(&self) -> usize {
        self.layout.slot_size
    }

    /// The segment's name.
    pub(crate) fn name(&self) -> &str {
        self.segment.name()
    }

    /// The process that made the pool, as its header says (untrusted: a pid only).
    #[allow(dead_code)] // device pools' receives watch it
    pub(crate) fn owner_pid(&self) -> u32 {
        // Relaxed: written before the segment was published; a pid, nothing guarded.
        self.header().owner_pid.load(Ordering::Relaxed)
    }

    fn header(&self) -> &PoolHeader {
        view(&*self.segment, self.layout.header)
            .expect("the layout was checked against the mapping")
    }

    /// The pool's structures, as the checked layout places them.
    fn view(&self) -> PoolView<'_> {
        PoolView::of(&*self.segment, &self.layout)
            .expect("the layout was checked against the mapping")
    }

    /// The sender is gone: mark the pool closed, and unlink it if nothing is in flight.
    pub(crate) fn close(&self) {
        // SeqCst: pairs with the SeqCst load in `unlink_if_drained` and the SeqCst
        // slot CAS in `PoolCore::release` (a store-load handshake: of the closer and
        // the last releaser, at least one sees the pool closed and drained).
        self.header().closed.store(1, Ordering::SeqCst);
        self.unlink_if_drained();
    }

    /// Device pools: the slots in flight are given up for lost (their sender's process
    /// leaves, or has died, and the device memory with it): from now on receivers refuse
    /// them. Called by a departing sender, and by whoever closes a dead sender's pool.
    pub(crate) fn retire(&self) {
        // SeqCst: pairs with the fence in `retired` (a store-load handshake with a receiver
        // that has just taken a slot: of the two, at least one sees the other).
        self.header().retired.store(1, Ordering::SeqCst);
    }

    /// Whether the sender has given its slots in flight up for lost (see `retire`). Called
    /// after taking a slot, so that a retiring sender that then finds no slot held knows
    /// that no receiver reads.
    #[allow(dead_code)] // device pools' receives ask
    pub(crate) fn retired(&self) -> bool {
        // SeqCst fence: orders the caller's slot CAS before this load, against the SeqCst
        // store in `retire` followed by the sender's SeqCst loads in
        // `PoolCore::none_held`.
        crate::sync::fence(Ordering::SeqCst);
        self.header().retired.load(Ordering::SeqCst) != 0
    }

    /// For the sender that made the pool: has the kernel mark the header's `owner_word`
    /// when this process dies (`liveness::keeper`), until the returned value drops. `None`
    /// when this process cannot keep a robust list (the word stays 0: not watched).
    pub(crate) fn watch_owner(&self) -> Option<Vigil> {
        let header = self.header();
        // SAFETY: both words lie in the header of this mapping, which the `Arc<Segment>`
        // given along keeps mapped at the same address.
        unsafe { Vigil::watch(&header.keeper_link, &header.owner_word, self.segment.clone()) }
    }

    /// Whether the process that made the pool has died, as the kernel marked its
    /// `owner_word` (no system call; see `liveness::keeper`). `false` while it lives, after
    /// it left cleanly, or when it was not watched.
    pub(crate) fn owner_died(&self) -> bool {
        Vigil::died(&self.header().owner_word)
    }

    /// Whether the process that made the pool is known to live: its `owner_word` is
    /// watched (it holds the keeper's id) and the kernel has not marked it (one load).
    /// `false` when it died, left, or was never watched: then only a lock probe can tell.
    pub(crate) fn owner_alive(&self) -> bool {
        Vigil::alive(&self.header().owner_word)
    }

    /// Whether the pool is marked closed (its sender is gone and it was closed for it).
    pub(crate) fn is_closed(&self) -> bool {
        // SeqCst: as in `unlink_if_drained` (a flag only: nothing read after depends on it).
        self.header().closed.load(Ordering::SeqCst) != 0
    }

    /// Whether this handle is a forked child's copy (see `Segment::inherited`): its drops
    /// return no slot and close nothing.
    pub(crate) fn inherited(&self) -> bool {
        self.segment.inherited()
    }

    /// After a release: if the sender is gone and every slot is free, nothing can
    /// refer to the pool any more, so remove its name.
    pub(crate) fn unlink_if_drained(&self) {
        // SeqCst: see `close`.
        if self.header().closed.load(Ordering::SeqCst) == 1 && self.core.all_free() {
            // Two parties may both get here; the second unlink finds nothing.
            let _ = Segment::unlink(self.segment.name());
        }
    }
}

/// Why a pool segment could not be made or mapped.
#[derive(Debug)]
pub enum PoolSegmentError {
    /// Creating or opening the segment failed.
    Segment(ShmError),
    /// Attaching to its free ring failed.
    Attach(AttachError),
    /// The segment's contents are impossible.
    Corrupted(Corrupted),
}

error_from!(PoolSegmentError { Segment(ShmError), Attach(AttachError), Corrupted(Corrupted) });
