//! Rings in named POSIX shared memory: the handles two processes use to talk.
//!
//! [`SpscRing`] and [`MpmcRing`] create or open a segment (through [`crate::shm`]), check
//! the ring parameters in it against the element type asked for, and hand out endpoints:
//! the [`ring`](crate::ring) algorithms over [`ShmStorage`].
//!
//! Every endpoint registers in the ring's participant table and holds an
//! open-file-description lock on its entry's byte of the segment for as long as it lives;
//! the kernel drops the lock when the process dies, so any peer can tell a live endpoint
//! from a dead one without trusting pids. A blocked endpoint checks, every
//! [`LIVENESS_TICK`](crate::ring::LIVENESS_TICK), whether the side it waits for is all dead,
//! and if so takes what they left and returns `PeerDead`. SPSC endpoints also claim their
//! role in the ring header (a second live producer gets [`ShmError::RoleTaken`]; the role
//! of a dead one is taken over) and give it back on drop.
//!
//! ```no_run
//! use gpuring::{Descriptor, SpscRing};
//! // process A
//! let ring = SpscRing::<Descriptor>::create("demo", 1024)?;
//! let mut tx = ring.producer()?;
//! tx.push(Descriptor::default())?;
//! // process B
//! let ring = SpscRing::<Descriptor>::open("demo")?;
//! let mut rx = ring.consumer()?;
//! let d = rx.pop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use bytemuck::Pod;

use crate::descriptor::Descriptor;
use crate::layout::{
    Claims, MAX_PARTICIPANTS, MpmcCell, PARTICIPANT_CONSUMER, PARTICIPANT_PRODUCER, Participants,
    RingControl, RingHeader, RingLayout, STAMP_SKIPPED, SegmentKind, SpscCell,
};
use crate::ring::{Side, Storage, mpmc, spsc};
use crate::shm::{Role, Segment, ShmError};
use crate::sync::{AtomicU32, Ordering};

/// The producer end of a shared-memory SPSC ring.
pub type SpscProducer<T = Descriptor> = spsc::Producer<T, ShmStorage<SpscCell<T>>>;
/// The consumer end of a shared-memory SPSC ring.
pub type SpscConsumer<T = Descriptor> = spsc::Consumer<T, ShmStorage<SpscCell<T>>>;
/// A producer end of a shared-memory MPMC ring.
pub type MpmcProducer<T = Descriptor> = mpmc::Producer<T, ShmStorage<MpmcCell<T>>>;
/// A consumer end of a shared-memory MPMC ring.
pub type MpmcConsumer<T = Descriptor> = mpmc::Consumer<T, ShmStorage<MpmcCell<T>>>;

/// How long `open` waits for a creator to finish initialising, by default.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(1);

/// A ring's cells and control block inside a mapped segment.
#[derive(Debug)]
pub struct ShmStorage<C> {
    ring: Arc<RingSegment>,
    // Released when the last clone drops (SPSC endpoints are never cloned).
    _attachment: Arc<Attachment>,
    /// The attachment's claim line, inside `ring`'s mapping.
    claims: NonNull<Claims>,
    _cell: PhantomData<C>,
}

impl<C> Clone for ShmStorage<C> {
    fn clone(&self) -> Self {
        Self {
            ring: self.ring.clone(),
            _attachment: self._attachment.clone(),
            claims: self.claims,
            _cell: PhantomData,
        }
    }
}

impl<C> ShmStorage<C> {
    /// The segment the ring lives in.
    pub fn segment(&self) -> &Segment {
        &self.ring.segment
    }
}

// SAFETY: `RingSegment::open`/`create` checked that the segment is exactly
// `layout.total_size` bytes for a power-of-two capacity of cells of `C`'s size, and the
// offsets come from that layout; the mapping lives as long as the `Arc<RingSegment>` that
// every clone holds. Cells were initialised by the creator before `init` was published.
unsafe impl<C> Storage for ShmStorage<C> {
    type Cell = C;
    const WATCHES_PEERS: bool = true;
    fn control(&self) -> &RingControl {
        self.ring.control()
    }
    fn peers_dead(&self, side: Side) -> bool {
        let role = match side {
            Side::Producers => Role::Producer,
            Side::Consumers => Role::Consumer,
        };
        // A probe that fails (it cannot, for an open descriptor) counts as "alive": waiting
        // on is the safe answer.
        self.ring.peers(role).is_ok_and(|p| p.live == 0 && p.dead > 0)
    }
    fn participant(&self) -> Option<u32> {
        Some(self._attachment.participant.index as u32)
    }
    fn dead_participant(&self, index: u32) -> Option<u32> {
        self.ring.entry_dead(index as usize).ok().flatten()
    }
    #[inline(always)]
    fn claims(&self) -> Option<&Claims> {
        // SAFETY: the attachment's entry of the participant table, inside the mapping that
        // `ring` keeps alive; atomics only.
        Some(unsafe { self.claims.as_ref() })
    }
    fn claimant_dead(&self, side: Side, pos: u64) -> bool {
        self.ring.claimant_dead(side, pos)
    }
    fn damaged(&self) -> Option<crate::ring::Corrupted> {
        self.ring.segment.truncated().then_some(crate::ring::Corrupted {
            what: "segment truncated by another process (pages past its end now read as zeros)",
        })
    }
    fn cells(&self) -> &[C] {
        // SAFETY: `capacity` cells of `C` start at `cells`, inside the mapping; C is a cell
        // type (atomics and UnsafeCell<Pod>), valid for any bytes.
        unsafe {
            std::slice::from_raw_parts(self.ring.cells.cast().as_ptr(), self.ring.layout.capacity)
        }
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
    /// Whether the cells are `MpmcCell`s (a stamp first), which `repair` fixes.
    stamped: bool,
    /// Participant entries this handle holds (bit `i`: entry `i`). Its locks are taken
    /// through `segment`'s descriptor, and a description never conflicts with itself, so
    /// this handle must neither take an entry it holds nor probe it.
    own: std::sync::Mutex<u64>,
}

/// Endpoints of one side of a ring, as the participant table and the liveness locks say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerCount {
    /// Entries whose lock is held: live endpoints.
    pub live: u32,
    /// Entries whose lock is gone: endpoints whose process died.
    pub dead: u32,
}

// SAFETY: pointers into the mapping owned by `segment`; see `ShmStorage`.
unsafe impl Send for RingSegment {}
// SAFETY: as above.
unsafe impl Sync for RingSegment {}

/// The participant table's code for `role`.
fn role_code(role: Role) -> u32 {
    match role {
        Role::Producer => PARTICIPANT_PRODUCER,
        Role::Consumer => PARTICIPANT_CONSUMER,
    }
}

/// An entry of the participant table, held (with its liveness lock) for the life of an
/// endpoint.
#[derive(Debug)]
pub(crate) struct Participant {
    ring: Arc<RingSegment>,
    index: usize,
}

impl Participant {
    fn register(ring: &Arc<RingSegment>, role: Role) -> Result<Self, ShmError> {
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        let code = role_code(role);
        let mut own = ring.own.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entries = &ring.participants().entries;
        // Free entries first, so that a dead endpoint's entry stays as evidence of its
        // death (its peers report `PeerDead` by it) until the table has no other room.
        let free_first = (0..MAX_PARTICIPANTS)
            // Relaxed: a hint for the order of tries; the lock decides.
            .filter(|&i| entries[i].load(Ordering::Relaxed) == 0)
            .chain((0..MAX_PARTICIPANTS).filter(|&i| entries[i].load(Ordering::Relaxed) != 0));
        for index in free_first {
            if *own & (1 << index) != 0 {
                continue;
            }
            // The lock first: holding it makes the entry ours, whatever it says (a free
            // entry, or a dead endpoint's).
            if ring.segment.lock_byte(1 + index as u64)? {
                // A dead endpoint's claims are the only evidence of cells it won and never
                // finished: settle them before they are overwritten, or leave the entry.
                if !ring.settle_claims_of(index) {
                    ring.segment.unlock_byte(1 + index as u64);
                    continue;
                }
                *own |= 1 << index;
                // Relaxed: the entry is a claim that readers check against the lock (a
                // syscall on both sides), not a publication of other data.
                ring.participants().entries[index]
                    .store(u64::from(code) << 32 | u64::from(pid), Ordering::Relaxed);
                return Ok(Self { ring: ring.clone(), index });
            }
        }
        Err(ShmError::TooManyParticipants { max: MAX_PARTICIPANTS as u32 })
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        let mut own = self.ring.own.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Every claim of a leaving endpoint is finished. Relaxed: as the entry below.
        let claims = &self.ring.participants().claims[self.index];
        claims.push.store(0, Ordering::Relaxed);
        claims.pop.store(0, Ordering::Relaxed);
        // Cleared before the lock goes, so a prober that finds the lock gone and then the
        // entry unchanged knows that the holder died rather than left. Relaxed: as in
        // `register`; the unlock syscall below orders it for other processes.
        self.ring.participants().entries[self.index].store(0, Ordering::Relaxed);
        self.ring.segment.unlock_byte(1 + self.index as u64);
        *own &= !(1 << self.index);
    }
}

/// What an endpoint holds in the segment: its participant entry and, for SPSC, its role.
#[derive(Debug)]
pub(crate) struct Attachment {
    role: Option<Role>,
    // Dropped after the role is given back (fields drop after `Drop::drop`).
    participant: Participant,
}

impl Attachment {
    /// Registers an endpoint of `role`; `spsc`: also claims the role, taking it over from
    /// a dead holder.
    fn take(ring: &Arc<RingSegment>, role: Role, spsc: bool) -> Result<Self, ShmError> {
        let participant = Participant::register(ring, role)?;
        if !spsc {
            return Ok(Self { role: None, participant });
        }
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        let word = ring.claim_word(role);
        let mut expected = 0;
        loop {
            // Acquire on success: pairs with the Release store in `drop` of the previous
            // holder (or the Relaxed-then-death of a dead one, whose last positions we
            // re-read from the control block anyway), so its last writes are visible.
            match word.compare_exchange(expected, pid, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(Self { role: Some(role), participant }),
                Err(0) => expected = 0,
                Err(holder_pid) => {
                    if ring.role_holder_alive(role, holder_pid)? {
                        return Err(ShmError::RoleTaken { role, holder_pid });
                    }
                    expected = holder_pid; // dead: take the role over
                }
            }
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        if let Some(role) = self.role {
            // Release: pairs with the Acquire CAS in `take` of the next holder.
            self.participant.ring.claim_word(role).store(0, Ordering::Release);
        }
    }
}

impl RingSegment {
    fn header(&self) -> &RingHeader {
        // SAFETY: offset from the checked layout; RingHeader is atomics only.
        unsafe { self.segment.at::<RingHeader>(self.layout.ring_header).as_ref() }
    }

    fn control(&self) -> &RingControl {
        // SAFETY: offset from the checked layout, in bounds and aligned; RingControl is
        // atomics only, valid for any bytes.
        unsafe { self.control.as_ref() }
    }

    /// Threads asleep waiting for an element, and for room.
    fn sleepers(&self) -> (u32, u32) {
        let c = self.control();
        (c.not_empty.sleepers(), c.not_full.sleepers())
    }

    fn participants(&self) -> &Participants {
        // SAFETY: offset from the checked layout, inside the mapping; Participants is
        // atomics only, valid for any bytes.
        unsafe { self.segment.at::<Participants>(self.layout.participants).as_ref() }
    }

    /// Entry `index` checked against its liveness lock: `None` when free, else its value
    /// and whether its holder lives. Entries this handle holds (`own`) live; another's
    /// lives while some description holds its byte; one whose lock is gone and whose
    /// value is unchanged after that was seen is dead (a leaving endpoint clears its entry
    /// before it unlocks). One `F_OFD_GETLK` per entry not ours.
    fn probe(&self, index: usize, own: u64) -> Result<Option<(u64, bool)>, ShmError> {
        let entry = &self.participants().entries[index];
        // Relaxed: a claim, checked against the lock.
        let value = entry.load(Ordering::Relaxed);
        if value == 0 {
            return Ok(None);
        }
        if own & (1 << index) != 0 || self.segment.byte_held_elsewhere(1 + index as u64)? {
            return Ok(Some((value, true)));
        }
        // Relaxed: as above.
        Ok((entry.load(Ordering::Relaxed) == value).then_some((value, false)))
    }

    fn own(&self) -> u64 {
        *self.own.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Live and dead endpoints of `role`, by the participant table checked against the
    /// liveness locks. A handful of syscalls: for blocked endpoints and tools only.
    pub(crate) fn peers(&self, role: Role) -> Result<PeerCount, ShmError> {
        let (code, own) = (u64::from(role_code(role)), self.own());
        let mut count = PeerCount::default();
        for index in 0..MAX_PARTICIPANTS {
            match self.probe(index, own)? {
                Some((value, true)) if value >> 32 == code => count.live += 1,
                Some((value, false)) if value >> 32 == code => count.dead += 1,
                _ => {}
            }
        }
        Ok(count)
    }

    /// If participant entry `index` is held by nobody although it names an endpoint (that
    /// endpoint's process died), the pid it recorded. `None` for entries this handle holds.
    pub(crate) fn entry_dead(&self, index: usize) -> Result<Option<u32>, ShmError> {
        if index >= MAX_PARTICIPANTS {
            return Ok(None);
        }
        Ok(match self.probe(index, self.own())? {
            Some((value, false)) => Some(value as u32),
            _ => None,
        })
    }

    /// Whether an endpoint of `role` recorded with `pid` is attached and alive.
    fn role_holder_alive(&self, role: Role, pid: u32) -> Result<bool, ShmError> {
        let wanted = u64::from(role_code(role)) << 32 | u64::from(pid);
        let own = self.own();
        for index in 0..MAX_PARTICIPANTS {
            if self.probe(index, own)? == Some((wanted, true)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The stamp word of position `pos`'s cell (stamped rings only: an `MpmcCell` starts
    /// with its stamp).
    fn stamp(&self, pos: u64) -> &crate::sync::AtomicU64 {
        debug_assert!(self.stamped);
        let index = (pos & (self.layout.capacity as u64 - 1)) as usize;
        // SAFETY: index < capacity, so the cell lies inside the cell array of the checked
        // layout; an `MpmcCell` is `repr(C)` with its `AtomicU64` stamp first and is
        // 64-byte aligned, as the cell array is.
        unsafe { &*self.cells.as_ptr().add(index * self.layout.cell_size).cast() }
    }

    /// Whether a dead endpoint's claim line names `pos` on `side`: a word names a position
    /// only after its endpoint won it, and the lock says whether that endpoint is dead.
    pub(crate) fn claimant_dead(&self, side: Side, pos: u64) -> bool {
        let own = self.own();
        let claims = &self.participants().claims;
        (0..MAX_PARTICIPANTS).any(|i| {
            let word = match side {
                Side::Producers => &claims[i].push,
                Side::Consumers => &claims[i].pop,
            };
            // Relaxed: see above; the probe that follows reads the lock.
            Claims::names(word.load(Ordering::Relaxed), pos)
                && matches!(self.probe(i, own), Ok(Some((_, false))))
        })
    }

    /// Settles the claims of entry `index`, whose lock this handle has just taken (so its
    /// previous holder, if any, is dead), before the entry is reused: a cell it won as a
    /// producer and left unwritten is skipped. Returns `false`, leaving the claims alone,
    /// when it won a cell as a consumer and never freed it: that element waits for a
    /// consumer to adopt it (which needs this evidence), so the entry is not reused yet.
    fn settle_claims_of(&self, index: usize) -> bool {
        let claims = &self.participants().claims[index];
        // Relaxed: the previous holder is dead; the stamp CASes decide.
        let (push, pop) = (claims.push.load(Ordering::Relaxed), claims.pop.load(Ordering::Relaxed));
        if self.stamped {
            let capacity = self.layout.capacity as u64;
            let control = self.control();
            // Relaxed: bounds for a forged word; the CASes decide.
            let (tail, head) =
                (control.tail.load(Ordering::Relaxed), control.head.load(Ordering::Relaxed));
            // A word names positions its holder won: below tail (push) or head (pop),
            // within a lap. Anything else is stale or forged and ignored.
            for pos in Claims::positions(pop, head, capacity) {
                // Relaxed: a snapshot; an adopter's CAS changes it, never back.
                if self.stamp(pos).load(Ordering::Relaxed) & !STAMP_SKIPPED == pos.wrapping_add(1) {
                    return false;
                }
            }
            let mut skipped = false;
            for pos in Claims::positions(push, tail, capacity) {
                skipped |= mpmc::skip_unwritten(self.stamp(pos), pos);
            }
            if skipped {
                crate::wait::notify(&control.not_empty);
            }
        }
        // Relaxed: the entry is ours; nobody reads these until we win a position.
        claims.push.store(0, Ordering::Relaxed);
        claims.pop.store(0, Ordering::Relaxed);
        true
    }

    fn claim_word(&self, role: Role) -> &AtomicU32 {
        match role {
            Role::Producer => &self.header().producer_claim,
            Role::Consumer => &self.header().consumer_claim,
        }
    }

    /// Writes a fresh ring (header and cells) at `layout` into `seg`, which is being
    /// created: call it from the `init` closure of [`Segment::create`].
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

    /// Checks the ring header at `layout.ring_header` of an opened segment: element `T`,
    /// and exactly `layout.capacity` cells (which the enclosing segment's parameters
    /// implied).
    pub(crate) fn check_in<T: Pod>(seg: &Segment, layout: &RingLayout) -> Result<(), ShmError> {
        // SAFETY: `at` checks the bounds; RingHeader is atomics only.
        let header = unsafe { seg.at::<RingHeader>(layout.ring_header).as_ref() };
        // Relaxed: `Segment::open` already synchronised with the creator through `init`.
        let found =
            (header.elem_size.load(Ordering::Relaxed), header.elem_align.load(Ordering::Relaxed));
        let expected = (size_of::<T>() as u32, align_of::<T>() as u32);
        if found != expected {
            return Err(ShmError::ElementMismatch { expected, found });
        }
        if header.capacity.load(Ordering::Relaxed) != layout.capacity as u64 {
            return Err(ShmError::Corrupted(crate::ring::Corrupted {
                what: "ring capacity disagrees with the segment's parameters",
            }));
        }
        Ok(())
    }

    fn create<T: Pod, C>(
        opts: &RingOptions,
        kind: SegmentKind,
        init_cell: impl Fn(usize) -> C,
    ) -> Result<Arc<Self>, ShmError> {
        let capacity = opts.capacity;
        let layout = RingLayout::new(capacity, size_of::<C>())
            .ok_or(ShmError::InvalidCapacity { capacity })?;
        let size = layout.total_size;
        let segment = Segment::create_with(&opts.name, kind, size, opts.replace_stale, |seg| {
            Self::init_in::<T, C>(seg, &layout, init_cell);
            Ok(())
        })?;
        Ok(Self::view(Arc::new(segment), layout, kind == SegmentKind::MpmcRing))
    }

    fn open<T: Pod, C>(opts: &RingOptions, kind: SegmentKind) -> Result<Arc<Self>, ShmError> {
        let mut segment = Segment::open(&opts.name, kind, opts.open_timeout)?;
        if !opts.allow_dead_owner {
            segment = segment.require_live_creator()?;
        }
        // The segment is at least a header long; the ring header follows it. Check that
        // there is room for it before reading.
        let min = RingLayout::new(1, 0).expect("valid").cells;
        if segment.len() < min {
            return Err(ShmError::SizeMismatch {
                expected: min as u64,
                found: segment.len() as u64,
            });
        }
        // SAFETY: inside the mapping (checked just above); atomics only.
        let header =
            unsafe { segment.at::<RingHeader>(size_of::<crate::layout::SegmentHeader>()).as_ref() };
        // Relaxed: `Segment::open` already synchronised with the creator through `init`.
        let capacity = header.capacity.load(Ordering::Relaxed);
        let found =
            (header.elem_size.load(Ordering::Relaxed), header.elem_align.load(Ordering::Relaxed));
        let expected = (size_of::<T>() as u32, align_of::<T>() as u32);
        if found != expected {
            return Err(ShmError::ElementMismatch { expected, found });
        }
        let layout = RingLayout::new(capacity, size_of::<C>()).ok_or(ShmError::Corrupted(
            crate::ring::Corrupted { what: "ring capacity is not a power of two in range" },
        ))?;
        if layout.total_size != segment.len() {
            return Err(ShmError::SizeMismatch {
                expected: layout.total_size as u64,
                found: segment.len() as u64,
            });
        }
        Ok(Self::view(Arc::new(segment), layout, kind == SegmentKind::MpmcRing))
    }

    /// The ring at `layout` inside `segment`, whose parameters the caller has checked.
    ///
    /// # Panics
    ///
    /// If the ring does not fit in the segment (a bug in the caller's checks).
    /// `stamped`: the cells are `MpmcCell`s.
    pub(crate) fn view(segment: Arc<Segment>, layout: RingLayout, stamped: bool) -> Arc<Self> {
        assert!(layout.total_size <= segment.len(), "ring outside its segment");
        // SAFETY: offsets from a layout that ends inside the mapping (`at` checks each).
        let (control, cells) =
            unsafe { (segment.at::<RingControl>(layout.control), segment.at::<u8>(layout.cells)) };
        let own = std::sync::Mutex::new(0);
        Arc::new(Self { segment, layout, control, cells, stamped, own })
    }

    /// The SPSC producer end, claiming the producer role.
    pub(crate) fn spsc_producer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<SpscProducer<T>, ShmError> {
        let claim = Attachment::take(self, Role::Producer, true)?;
        // SAFETY: the claim makes this the only producer until it is dropped with the
        // endpoint's storage (a holder whose role was taken over is dead).
        Ok(unsafe { spsc::Producer::new(self.storage(claim)) }?)
    }

    /// The SPSC consumer end, claiming the consumer role.
    pub(crate) fn spsc_consumer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<SpscConsumer<T>, ShmError> {
        let claim = Attachment::take(self, Role::Consumer, true)?;
        // SAFETY: the claim makes this the only consumer until it is dropped with the
        // endpoint's storage (a holder whose role was taken over is dead).
        Ok(unsafe { spsc::Consumer::new(self.storage(claim)) }?)
    }

    /// An MPMC producer end.
    pub(crate) fn mpmc_producer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<MpmcProducer<T>, ShmError> {
        Ok(mpmc::Producer::new(self.storage(Attachment::take(self, Role::Producer, false)?))?)
    }

    /// An MPMC consumer end.
    pub(crate) fn mpmc_consumer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<MpmcConsumer<T>, ShmError> {
        Ok(mpmc::Consumer::new(self.storage(Attachment::take(self, Role::Consumer, false)?))?)
    }

    /// Storage for a ring used by one process in both directions (a pool's free ring),
    /// registered in the participant table as `role`.
    pub(crate) fn attached_storage<C>(
        self: &Arc<Self>,
        role: Role,
    ) -> Result<ShmStorage<C>, ShmError> {
        Ok(self.storage(Attachment::take(self, role, false)?))
    }

    pub(crate) fn storage<C>(self: &Arc<Self>, attachment: Attachment) -> ShmStorage<C> {
        // The layout was computed for one cell type; a view with another would mis-stride.
        assert_eq!(size_of::<C>(), self.layout.cell_size, "cell type does not match the layout");
        let claims = NonNull::from(&self.participants().claims[attachment.participant.index]);
        ShmStorage {
            ring: self.clone(),
            _attachment: Arc::new(attachment),
            claims,
            _cell: PhantomData,
        }
    }
}

/// Options for creating or opening a ring: capacity and how long `open` waits.
///
/// ```no_run
/// use std::time::Duration;
/// use gpuring::{Descriptor, RingOptions};
/// let ring = RingOptions::new("jobs").capacity(4096).create_mpmc::<Descriptor>()?;
/// let peer = RingOptions::new("jobs").open_timeout(Duration::from_secs(5)).open_mpmc::<Descriptor>()?;
/// # Ok::<(), gpuring::ShmError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RingOptions {
    name: String,
    capacity: u64,
    open_timeout: Duration,
    replace_stale: bool,
    allow_dead_owner: bool,
}

impl RingOptions {
    /// Options for ring `name` (a shared-memory object name; a leading `/` is optional),
    /// capacity 1024, open timeout [`DEFAULT_OPEN_TIMEOUT`].
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            capacity: 1024,
            open_timeout: DEFAULT_OPEN_TIMEOUT,
            replace_stale: false,
            allow_dead_owner: false,
        }
    }

    /// `create`: replace a segment of this name whose creator has died (default: fail with
    /// [`ShmError::AlreadyExists`]). A live creator's segment is never replaced.
    pub fn replace_stale(mut self, yes: bool) -> Self {
        self.replace_stale = yes;
        self
    }

    /// `open`: attach to a segment whose creator has died, e.g. to drain what it sent
    /// (default: fail with [`ShmError::OwnerDead`]).
    pub fn allow_dead_owner(mut self, yes: bool) -> Self {
        self.allow_dead_owner = yes;
        self
    }

    /// Number of cells, a power of two in `1..=2^24` (checked by `create`).
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    /// How long `open` waits for the creator to finish initialising the segment.
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.open_timeout = timeout;
        self
    }

    /// Creates an SPSC ring. See [`SpscRing::create`].
    ///
    /// # Errors
    ///
    /// As [`SpscRing::create`].
    pub fn create_spsc<T: Pod + Send>(&self) -> Result<SpscRing<T>, ShmError> {
        let ring = RingSegment::create::<T, SpscCell<T>>(self, SegmentKind::SpscRing, |_| {
            SpscCell::new()
        })?;
        Ok(SpscRing { ring, _elem: PhantomData })
    }

    /// Opens an SPSC ring. See [`SpscRing::open`].
    ///
    /// # Errors
    ///
    /// As [`SpscRing::open`].
    pub fn open_spsc<T: Pod + Send>(&self) -> Result<SpscRing<T>, ShmError> {
        let ring = RingSegment::open::<T, SpscCell<T>>(self, SegmentKind::SpscRing)?;
        Ok(SpscRing { ring, _elem: PhantomData })
    }

    /// Creates an MPMC ring. See [`MpmcRing::create`].
    ///
    /// # Errors
    ///
    /// As [`MpmcRing::create`].
    pub fn create_mpmc<T: Pod + Send>(&self) -> Result<MpmcRing<T>, ShmError> {
        if self.capacity < 2 {
            return Err(ShmError::InvalidCapacity { capacity: self.capacity });
        }
        let ring = RingSegment::create::<T, MpmcCell<T>>(self, SegmentKind::MpmcRing, |i| {
            MpmcCell::new(i as u64)
        })?;
        Ok(MpmcRing { ring, _elem: PhantomData })
    }

    /// Opens an MPMC ring. See [`MpmcRing::open`].
    ///
    /// # Errors
    ///
    /// As [`MpmcRing::open`].
    pub fn open_mpmc<T: Pod + Send>(&self) -> Result<MpmcRing<T>, ShmError> {
        let ring = RingSegment::open::<T, MpmcCell<T>>(self, SegmentKind::MpmcRing)?;
        Ok(MpmcRing { ring, _elem: PhantomData })
    }
}

/// A single-producer single-consumer ring of `T` in named shared memory.
///
/// The creating handle unlinks the name when it and every endpoint made from it are
/// dropped; processes that opened the ring keep their mapping.
///
/// ```no_run
/// use gpuring::SpscRing;
/// let ring = SpscRing::<u64>::create("ticks", 256)?;
/// let mut tx = ring.producer()?;
/// assert!(ring.producer().is_err(), "one producer only");
/// tx.try_push(1)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SpscRing<T = Descriptor> {
    ring: Arc<RingSegment>,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Pod + Send> SpscRing<T> {
    /// Creates ring `name` with `capacity` cells (a power of two), mode 0600, exclusively.
    ///
    /// # Errors
    ///
    /// [`ShmError::InvalidName`], [`ShmError::InvalidCapacity`],
    /// [`ShmError::AlreadyExists`], [`ShmError::PermissionDenied`], [`ShmError::Io`].
    pub fn create(name: &str, capacity: u64) -> Result<Self, ShmError> {
        RingOptions::new(name).capacity(capacity).create_spsc()
    }

    /// Opens ring `name`, waiting up to [`DEFAULT_OPEN_TIMEOUT`] for its creator to finish.
    ///
    /// # Errors
    ///
    /// [`ShmError::NotFound`], [`ShmError::PermissionDenied`], [`ShmError::SizeMismatch`],
    /// [`ShmError::BadMagic`], [`ShmError::VersionMismatch`], [`ShmError::NotInitialized`],
    /// [`ShmError::KindMismatch`], [`ShmError::ElementMismatch`], [`ShmError::Corrupted`],
    /// [`ShmError::Io`].
    pub fn open(name: &str) -> Result<Self, ShmError> {
        RingOptions::new(name).open_spsc()
    }

    /// Claims the producer role and returns the producer end.
    ///
    /// # Errors
    ///
    /// [`ShmError::RoleTaken`] while another producer lives; [`ShmError::Corrupted`] when
    /// the ring's positions are impossible.
    pub fn producer(&self) -> Result<SpscProducer<T>, ShmError> {
        self.ring.spsc_producer()
    }

    /// Claims the consumer role and returns the consumer end.
    ///
    /// # Errors
    ///
    /// [`ShmError::RoleTaken`] while another consumer lives; [`ShmError::Corrupted`] when
    /// the ring's positions are impossible.
    pub fn consumer(&self) -> Result<SpscConsumer<T>, ShmError> {
        self.ring.spsc_consumer()
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.ring.layout.capacity
    }

    /// The segment the ring lives in.
    pub fn segment(&self) -> &Segment {
        &self.ring.segment
    }

    /// How many threads sleep waiting for an element and for room (a diagnostic snapshot).
    pub fn sleepers(&self) -> (u32, u32) {
        self.ring.sleepers()
    }
}

/// A multi-producer multi-consumer ring of `T` in named shared memory.
///
/// Any number of processes may open it and make producers and consumers; each consumer
/// sees each element exactly once, and each producer's elements leave in order.
///
/// ```no_run
/// use gpuring::MpmcRing;
/// let ring = MpmcRing::<u64>::create("work", 1024)?;
/// let (tx, rx) = (ring.producer()?, ring.consumer()?);
/// tx.push(5)?;
/// assert_eq!(rx.pop()?, 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MpmcRing<T = Descriptor> {
    ring: Arc<RingSegment>,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Pod + Send> MpmcRing<T> {
    /// Creates ring `name` with `capacity` cells (a power of two), mode 0600, exclusively.
    ///
    /// # Errors
    ///
    /// As [`SpscRing::create`].
    pub fn create(name: &str, capacity: u64) -> Result<Self, ShmError> {
        RingOptions::new(name).capacity(capacity).create_mpmc()
    }

    /// Opens ring `name`, waiting up to [`DEFAULT_OPEN_TIMEOUT`] for its creator to finish.
    ///
    /// # Errors
    ///
    /// As [`SpscRing::open`].
    pub fn open(name: &str) -> Result<Self, ShmError> {
        RingOptions::new(name).open_mpmc()
    }

    /// A producer end. Any number may exist.
    ///
    /// # Errors
    ///
    /// [`ShmError::Corrupted`] when the ring's positions are impossible.
    pub fn producer(&self) -> Result<MpmcProducer<T>, ShmError> {
        self.ring.mpmc_producer()
    }

    /// A consumer end. Any number may exist.
    ///
    /// # Errors
    ///
    /// [`ShmError::Corrupted`] when the ring's positions are impossible.
    pub fn consumer(&self) -> Result<MpmcConsumer<T>, ShmError> {
        self.ring.mpmc_consumer()
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.ring.layout.capacity
    }

    /// The segment the ring lives in.
    pub fn segment(&self) -> &Segment {
        &self.ring.segment
    }

    /// How many threads sleep waiting for an element and for room (a diagnostic snapshot).
    pub fn sleepers(&self) -> (u32, u32) {
        self.ring.sleepers()
    }
}
