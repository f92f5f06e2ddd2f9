//! A ring placed in a mapped segment: a whole ring segment (named rings), the descriptor
//! ring of a channel, or the free ring of a pool.
//!
//! [`RingSegment`] is the ring's view of the segment (header, control block, cells, and
//! the participant table through [`crate::liveness`]); [`ShmStorage`] is the [`Storage`]
//! an endpoint runs the algorithms over, holding the endpoint's [`Attachment`] (its
//! participant entry and, for SPSC, its role) for as long as the endpoint lives.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;

use super::{Storage, broadcast, mpmc, spsc};
use crate::layout::{
    Claims, Corrupted, MpmcCell, RingControl, RingHeader, RingLayout, RingView, STAMP_ADOPTED,
    STAMP_SKIPPED, SpscCell,
};
use crate::liveness::{AttachAs, AttachError, Attachment, ParticipantTable, RingParts, Role};
use crate::shm::Segment;
use crate::sync::{AtomicU64, Ordering};

/// A ring's cells and control block inside a mapped segment, with the attachment of the
/// endpoint that uses them.
#[derive(Debug)]
pub(crate) struct ShmStorage<C> {
    ring: Arc<RingSegment>,
    // Released when the last clone drops (SPSC endpoints are never cloned).
    attachment: Arc<Attachment>,
    /// The close count of the segment at which this endpoint's async waits last probed
    /// their peers and found nothing (`u64::MAX`: never); shared by clones, which play the
    /// same role.
    clear_at: Arc<std::sync::atomic::AtomicU64>,
    _cell: PhantomData<C>,
}

impl<C> Clone for ShmStorage<C> {
    fn clone(&self) -> Self {
        // A sole endpoint's claim turns take no lock: a clone would share its line.
        assert!(!self.attachment.is_sole(), "a sole ring endpoint is never cloned");
        Self {
            ring: self.ring.clone(),
            attachment: self.attachment.clone(),
            clear_at: self.clear_at.clone(),
            _cell: PhantomData,
        }
    }
}

// SAFETY: `RingSegment::view` checked that the layout ends inside the segment, whose
// parameters the caller checked (a power-of-two capacity of cells of `C`'s size, asserted
// in `storage`); the mapping lives as long as the `Arc<RingSegment>` that every clone
// holds. Cells were initialised by the creator before `init` was published.
unsafe impl<C> Storage for ShmStorage<C> {
    type Cell = C;
    type Watch = Attachment;
    fn control(&self) -> &RingControl {
        self.ring.control()
    }
    fn cells(&self) -> &[C] {
        // SAFETY: `capacity` cells of `C` start at `cells`, inside the mapping; C is a cell
        // type (atomics and UnsafeCell<Pod>), valid for any bytes.
        unsafe {
            std::slice::from_raw_parts(self.ring.cells.cast().as_ptr(), self.ring.layout.capacity)
        }
    }
    #[inline(always)]
    fn watch(&self) -> &Attachment {
        &self.attachment
    }
}

// SAFETY: the readers mask is in the ring header and the cursors in the participant
// table, inside the mapping that the `Arc<RingSegment>` keeps alive.
unsafe impl<C> super::broadcast::Cursors for ShmStorage<C> {
    fn readers(&self) -> &AtomicU64 {
        &self.ring.header().readers
    }
    fn cursor(&self, index: usize) -> &AtomicU64 {
        self.ring.table.cursor(index)
    }
    fn lagging(&self) -> bool {
        self.ring.is_lagging()
    }
    fn drop_if_gone(&self, index: usize, also: &dyn Fn(usize)) -> bool {
        let readers = &self.ring.header().readers;
        self.ring.table.while_unheld(index, || {
            // Release: as a reader's own clearing of its bit (nothing of its is read after).
            readers.fetch_and(!(1 << index), Ordering::Release);
            also(index);
        })
    }
}

impl<C> ShmStorage<C> {
    /// Where an async wait (or a select) of the endpoint playing `me` parks: the word its blocking form
    /// sleeps on (producers on `not_full`, consumers on `not_empty`), kept mapped by the
    /// ring's segment, whose closes tell of peers that may have died.
    pub(crate) fn park(&self, me: Role) -> crate::wait::reactor::Park {
        let c = self.ring.control();
        let word = match me {
            Role::Producer => &c.not_full,
            Role::Consumer => &c.not_empty,
        };
        let closes = self.ring.segment.closes().clone();
        let clear_at = self.clear_at.clone();
        // SAFETY: the word is inside the mapping of `self.ring`'s segment, which the
        // `Arc<RingSegment>` keeps alive.
        unsafe { crate::wait::reactor::Park::new(word, self.ring.clone(), closes, clear_at) }
    }
}

// SAFETY: the storage is a view of shared memory whose cells are accessed only under the
// ring protocol, and `C` holds `Pod` values; nothing in it is tied to a thread.
unsafe impl<C: Send> Send for ShmStorage<C> {}
// SAFETY: as above.
unsafe impl<C: Send> Sync for ShmStorage<C> {}

/// A ring inside a mapped segment: a whole ring segment, or the ring part of a channel or
/// pool segment.
#[derive(Debug)]
pub(crate) struct RingSegment {
    segment: Arc<Segment>,
    layout: RingLayout,
    control: NonNull<RingControl>,
    cells: NonNull<u8>,
    /// Whether the cells are `MpmcCell`s (a stamp first), whose dead claims are settled.
    stamped: bool,
    table: Arc<ParticipantTable>,
}

// SAFETY: pointers into the mapping owned by `segment`; see `ShmStorage`.
unsafe impl Send for RingSegment {}
// SAFETY: as above.
unsafe impl Sync for RingSegment {}

impl RingSegment {
    /// The ring at `layout` inside `segment`, whose parameters the caller has checked.
    /// `stamped`: the cells are `MpmcCell`s.
    ///
    /// # Panics
    ///
    /// If the ring does not fit in the segment (a bug in the caller's checks).
    pub(crate) fn view(segment: Arc<Segment>, layout: RingLayout, stamped: bool) -> Arc<Self> {
        assert!(layout.total_size <= segment.len(), "ring outside its segment");
        // SAFETY: offsets from a layout that ends inside the mapping (`at` checks each).
        let (control, cells) =
            unsafe { (segment.at::<RingControl>(layout.control), segment.at::<u8>(layout.cells)) };
        let table = ParticipantTable::new(segment.clone(), layout.ring_header, layout.participants);
        Arc::new(Self { segment, layout, control, cells, stamped, table })
    }

    /// Whether the endpoint that `id` names in this ring's participant table is gone (see
    /// `ParticipantTable::id_gone`). Probes a lock.
    pub(crate) fn id_gone(&self, id: crate::layout::ParticipantId) -> Option<Option<u32>> {
        self.table.id_gone(id)
    }

    /// The segment the ring lives in.
    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    /// Number of cells.
    pub(crate) fn capacity(&self) -> usize {
        self.layout.capacity
    }

    /// Whether the header marks the ring lagging (broadcast rings: its producer never waits
    /// for readers).
    pub(crate) fn is_lagging(&self) -> bool {
        // Relaxed: set by the creator before the segment was published.
        self.header().lagging.load(Ordering::Relaxed) != 0
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: offset from the checked layout; RingHeader is atomics only.
        unsafe { self.segment.at::<RingHeader>(self.layout.ring_header).as_ref() }
    }

    fn control(&self) -> &RingControl {
        // SAFETY: offset from the checked layout, in bounds and aligned; RingControl is
        // atomics only, valid for any bytes.
        unsafe { self.control.as_ref() }
    }

    /// Elements pushed and not yet popped (a snapshot, as `inspect` reads it: `None` when
    /// the positions are impossible).
    pub(crate) fn queued(&self) -> Option<usize> {
        RingView::at(&*self.segment, self.layout.ring_header)?.queued().map(|n| n as usize)
    }

    /// Whether an element still in the ring satisfies `pred`: SPSC, one in `[head, tail)`
    /// (for the ring's producer or consumer only: nobody else can tell those cells are not
    /// being rewritten); MPMC, one published and not yet freed (anyone: each value is read
    /// seqlock-style, see `mpmc::Producer::any_unfreed`). Impossible SPSC positions answer
    /// `true` (nothing is given up on a forged word). Reads up to `capacity` cells: slow
    /// paths only.
    pub(crate) fn any_in_ring<T: Pod>(&self, pred: impl FnMut(&T) -> bool) -> bool {
        let capacity = self.layout.capacity as u64;
        if self.stamped {
            assert_eq!(self.layout.cell_size, size_of::<MpmcCell<T>>());
            // SAFETY: `capacity` cells of this size start at `cells`, inside the mapping
            // (checked layout); `MpmcCell<T>` is atomics and an `UnsafeCell<T: Pod>`, valid
            // for any bytes.
            let cells: &[MpmcCell<T>] = unsafe {
                std::slice::from_raw_parts(self.cells.cast().as_ptr(), capacity as usize)
            };
            return super::repair::any_unfreed_in(self.control(), cells, pred);
        }
        assert_eq!(self.layout.cell_size, size_of::<SpscCell<T>>());
        // SAFETY: as above, for `SpscCell<T>`.
        let cells: &[SpscCell<T>] =
            unsafe { std::slice::from_raw_parts(self.cells.cast().as_ptr(), capacity as usize) };
        spsc::any_queued_in(self.control(), cells, pred)
    }

    /// Threads asleep waiting for an element, and for room (a diagnostic snapshot).
    pub(crate) fn sleepers(&self) -> (u32, u32) {
        let c = self.control();
        (c.not_empty.sleepers(), c.not_full.sleepers())
    }

    /// The stamp word of position `pos`'s cell (stamped rings only: an `MpmcCell` starts
    /// with its stamp).
    fn stamp(&self, pos: u64) -> &AtomicU64 {
        debug_assert!(self.stamped);
        let index = (pos & (self.layout.capacity as u64 - 1)) as usize;
        // SAFETY: index < capacity, so the cell lies inside the cell array of the checked
        // layout; an `MpmcCell` is `repr(C)` with its `AtomicU64` stamp first and is
        // 64-byte aligned, as the cell array is.
        unsafe { &*self.cells.as_ptr().add(index * self.layout.cell_size).cast() }
    }

    /// Settles the claims of a participant entry whose lock a registering endpoint has just
    /// taken (so its previous holder, if any, is dead), before the entry is reused: a cell
    /// it won as a producer and left unwritten is skipped. Returns `false`, leaving the
    /// claims alone, when its pop claim names a cell won (or adopted) and not yet freed:
    /// either it won that cell and died (the element waits for a consumer to adopt it,
    /// which needs this evidence) or a live consumer won it and is finishing it; the entry
    /// is not reused
    /// yet. A position that `live_names` (a live endpoint's line names it) is left alone:
    /// the dead word may name a position it never won (see `ClaimLine`).
    fn settle(&self, claims: &Claims, live_names: &dyn Fn(Role, u64) -> bool) -> bool {
        if !self.stamped {
            return true;
        }
        let capacity = self.layout.capacity as u64;
        let control = self.control();
        // Acquire: pairs with the Release CASes of the winners that moved the counters, so
        // a live winner's claim (stored before its CAS) is seen by `live_names`.
        let (tail, head) =
            (control.tail.load(Ordering::Acquire), control.head.load(Ordering::Acquire));
        // Relaxed: the previous holder is dead; the stamp CASes decide.
        let (push, pop) = (claims.push.load(Ordering::Relaxed), claims.pop.load(Ordering::Relaxed));
        // A word names positions below tail (push) or head (pop) within a lap that its
        // holder won or was about to; anything else is stale or forged and ignored.
        for pos in Claims::positions(pop, head, capacity) {
            // Relaxed: a snapshot; only a free changes it for good. Adopted or not: an
            // adopter that died leaves the cell to the next one, which needs this
            // evidence as much as the first did.
            let stamp = self.stamp(pos).load(Ordering::Relaxed) & !(STAMP_SKIPPED | STAMP_ADOPTED);
            if stamp == pos.wrapping_add(1) {
                return false;
            }
        }
        let mut skipped = false;
        for pos in Claims::positions(push, tail, capacity) {
            if !live_names(Role::Producer, pos) {
                skipped |= super::repair::skip_unwritten(self.stamp(pos), pos);
            }
        }
        if skipped {
            crate::wait::notify(&control.not_empty);
        }
        true
    }

    /// Attaches an endpoint of `role`; with `spsc`, claiming the role too; `counted`, in
    /// its side's attach count (see `liveness::AttachAs`).
    fn attach(
        self: &Arc<Self>,
        role: Role,
        spsc: bool,
        counted: bool,
    ) -> Result<Attachment, AttachError> {
        self.attach_as(AttachAs { role, spsc, counted, sole: false })
    }

    fn attach_as(self: &Arc<Self>, how: AttachAs) -> Result<Attachment, AttachError> {
        let ring = RingParts { header: NonNull::from(self.header()), control: self.control };
        Attachment::take(&self.table, how, ring, &|claims, live| self.settle(claims, live))
    }

    /// The SPSC producer end, claiming the producer role.
    pub(crate) fn spsc_producer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<spsc::Producer<T, ShmStorage<SpscCell<T>>>, AttachError> {
        let storage = self.storage(self.attach(Role::Producer, true, true)?);
        // SAFETY: the claim makes this the only producer until it is dropped with the
        // endpoint's storage (a holder whose role was taken over is dead).
        Ok(unsafe { spsc::Producer::new(storage) }?)
    }

    /// The SPSC consumer end, claiming the consumer role.
    pub(crate) fn spsc_consumer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<spsc::Consumer<T, ShmStorage<SpscCell<T>>>, AttachError> {
        let storage = self.storage(self.attach(Role::Consumer, true, true)?);
        // SAFETY: the claim makes this the only consumer until it is dropped with the
        // endpoint's storage (a holder whose role was taken over is dead).
        Ok(unsafe { spsc::Consumer::new(storage) }?)
    }

    /// The broadcast producer end, claiming the producer role (one producer).
    pub(crate) fn broadcast_producer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<broadcast::Producer<T, ShmStorage<SpscCell<T>>>, AttachError> {
        let storage = self.storage(self.attach(Role::Producer, true, true)?);
        let own = storage.attachment.participant_index();
        Ok(broadcast::Producer::new(storage, own)?)
    }

    /// A broadcast reader end: its place in the readers mask is its participant entry.
    pub(crate) fn broadcast_reader<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<broadcast::Reader<T, ShmStorage<SpscCell<T>>>, AttachError> {
        let storage = self.storage(self.attach(Role::Consumer, false, true)?);
        let index = storage.attachment.participant_index().expect("a registered endpoint");
        Ok(broadcast::Reader::join(storage, index)?)
    }

    /// An MPMC producer end; `sole`: one that is never cloned and is used by one thread
    /// at a time (its claim turns take no lock: `ClaimLock`).
    pub(crate) fn mpmc_producer<T: Pod + Send>(
        self: &Arc<Self>,
        sole: bool,
    ) -> Result<mpmc::Producer<T, ShmStorage<MpmcCell<T>>>, AttachError> {
        let how = AttachAs { role: Role::Producer, spsc: false, counted: true, sole };
        Ok(mpmc::Producer::new(self.storage(self.attach_as(how)?))?)
    }

    /// An MPMC consumer end; `sole` as for [`mpmc_producer`](Self::mpmc_producer).
    pub(crate) fn mpmc_consumer<T: Pod + Send>(
        self: &Arc<Self>,
        sole: bool,
    ) -> Result<mpmc::Consumer<T, ShmStorage<MpmcCell<T>>>, AttachError> {
        let how = AttachAs { role: Role::Consumer, spsc: false, counted: true, sole };
        Ok(mpmc::Consumer::new(self.storage(self.attach_as(how)?))?)
    }

    /// Storage for a ring that one process uses in both directions (a pool's free ring),
    /// registered in the participant table as `role`, and not counted (its departure means
    /// nothing to the other side).
    pub(crate) fn attached_storage<C>(
        self: &Arc<Self>,
        role: Role,
    ) -> Result<ShmStorage<C>, AttachError> {
        Ok(self.storage(self.attach(role, false, false)?))
    }

    fn storage<C>(self: &Arc<Self>, attachment: Attachment) -> ShmStorage<C> {
        // The layout was computed for one cell type; a view with another would mis-stride.
        assert_eq!(size_of::<C>(), self.layout.cell_size, "cell type does not match the layout");
        ShmStorage {
            ring: self.clone(),
            attachment: Arc::new(attachment),
            clear_at: Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
            _cell: PhantomData,
        }
    }

    /// Whether the ring at `layout` in `seg` holds no element: `tail == head`, each read
    /// once. Positions a peer made impossible count as not drained (the segment then stays
    /// for someone to look at). For the last user out of a segment.
    pub(crate) fn drained_in(seg: &Segment, layout: &RingLayout) -> bool {
        // SAFETY: offset from a checked layout inside the mapping (`at` checks the bounds);
        // atomics only.
        let control = unsafe { seg.at::<RingControl>(layout.control).as_ref() };
        // Acquire: pairs with the Release stores of the positions by the last endpoints, so
        // that what they did before leaving is seen.
        control.tail.load(Ordering::Acquire) == control.head.load(Ordering::Acquire)
    }

    /// Writes a fresh ring (header and cells) at `layout` into `seg`, which is being
    /// created: call it from the `init` closure of `Segment::create`.
    pub(crate) fn init_in<T: Pod, C>(
        seg: &Segment,
        layout: &RingLayout,
        init_cell: impl Fn(usize) -> C,
    ) {
        assert_eq!(size_of::<C>(), layout.cell_size, "cell type does not match the layout");
        // SAFETY: offsets from `layout`, which sized the segment (`at` checks the bounds);
        // the memory is ours alone until `Segment::create` publishes it.
        let header = unsafe { seg.at::<RingHeader>(layout.ring_header).as_ref() };
        // Relaxed: published by the Release store of `init` in `Segment::create`.
        header.capacity.store(layout.capacity as u64, Ordering::Relaxed);
        header.elem_size.store(size_of::<T>() as u32, Ordering::Relaxed);
        header.elem_align.store(align_of::<T>() as u32, Ordering::Relaxed);
        for i in 0..layout.capacity {
            // SAFETY: cell i lies inside the cell array of `layout`; nobody else has the
            // segment yet, so a plain write is fine.
            unsafe { seg.at::<C>(layout.cells + i * layout.cell_size).write(init_cell(i)) };
        }
    }

    /// Marks the new ring at `layout` in `seg` (not yet published) lagging: its producer
    /// will never wait for readers (`ring::broadcast`).
    pub(crate) fn set_lagging_in(seg: &Segment, layout: &RingLayout) {
        // SAFETY: the header's offset from `layout`, which sized the segment (`at` checks
        // the bounds); atomics only, and nobody else has the segment yet.
        let header = unsafe { seg.at::<RingHeader>(layout.ring_header).as_ref() };
        // Relaxed: published by the Release store of `init` in `Segment::create`.
        header.lagging.store(1, Ordering::Relaxed);
    }

    /// The element size and alignment, and the capacity, that the ring header at `base`
    /// of an opened segment states (read once each; the caller checks them).
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the header does not fit in the segment.
    pub(crate) fn read_params(seg: &Segment, base: usize) -> Result<((u32, u32), u64), Corrupted> {
        if base.checked_add(size_of::<RingHeader>()).is_none_or(|end| end > seg.len()) {
            return Err(Corrupted { what: "segment too small for its ring header" });
        }
        // SAFETY: inside the mapping (checked just above; `at` checks again); atomics only.
        let header = unsafe { seg.at::<RingHeader>(base).as_ref() };
        // Relaxed: `Segment::open` already synchronised with the creator through `init`.
        let elem =
            (header.elem_size.load(Ordering::Relaxed), header.elem_align.load(Ordering::Relaxed));
        Ok((elem, header.capacity.load(Ordering::Relaxed)))
    }

    /// Checks the ring header at `layout.ring_header` of an opened channel or pool
    /// segment: elements of `T`, and exactly `layout.capacity` cells (which the enclosing
    /// segment's parameters implied). Both are fixed by what the segment is, so a mismatch
    /// is corruption.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] naming which disagrees.
    pub(crate) fn check_in<T: Pod>(seg: &Segment, layout: &RingLayout) -> Result<(), Corrupted> {
        let (elem, capacity) = Self::read_params(seg, layout.ring_header)?;
        if elem != (size_of::<T>() as u32, align_of::<T>() as u32) {
            return Err(Corrupted { what: "ring element size disagrees with the segment's kind" });
        }
        if capacity != layout.capacity as u64 {
            return Err(Corrupted {
                what: "ring capacity disagrees with the segment's parameters",
            });
        }
        Ok(())
    }
}
