//! Slot pools: a fixed set of equal, preallocated slots, a free-slot ring, and leases that
//! carry a generation number.
//!
//! A pool belongs to one sender. Every slot has a [`SlotRecord`] whose state word packs the
//! slot's *generation* (bumped each time the slot is leased) and where the slot is:
//!
//! ```text
//!   FREE(g) --lease--> LEASED(g+1) --send--> SENT(g+1) --receive--> HELD(g+1) --release--> FREE(g+1)
//!                          |                                                       ^
//!                          +---------------------- cancel (never sent) -----------+
//! ```
//!
//! A HELD state also names its holder: the receiver's participant entry in the pool's
//! free ring, plus one (0: unknown, e.g. heap pools), in bits 8..16 of the state. A slot
//! held by a receiver whose process died (its liveness lock gone) is taken back by
//! [`PoolCore::reclaim_dead`], which the sender runs while it waits for slots.
//!
//! Free slots sit in the free ring, an MPMC ring of slot indices (several receivers return
//! slots at once; the sender takes them). Each transition that hands a slot on is a
//! compare-and-swap from the exact state expected, so a slot is returned to the free ring
//! only by the one party that holds it, and a descriptor whose generation is stale, or whose
//! slot is not in flight, is refused without touching the pool.
//!
//! [`PoolCore`] is the protocol over any ring storage (heap storage for loom and unit tests).
//! The host backend puts the records, the free ring and the slots in one shared-memory
//! segment (see [`PoolLayout`](crate::layout::PoolLayout)); the channel describes it in its
//! pool table so that receivers can map it.

use std::ops::Deref;
use std::time::Duration;

use crate::layout::{MpmcCell, SlotRecord};
use crate::ring::{Corrupted, Heap, PopError, Storage, TryPopError, mpmc};
use crate::sync::Ordering;

const FREE: u32 = 0;
const LEASED: u32 = 1;
const SENT: u32 = 2;
const HELD: u32 = 3;

const fn pack(generation: u32, state: u32) -> u64 {
    ((generation as u64) << 32) | state as u64
}

/// (generation, state) of a state word; the state without its holder (see [`holder`]).
const fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32 & 0xff)
}

/// The holder recorded in a HELD state word: participant entry + 1, or 0 for unknown.
const fn holder(word: u64) -> u32 {
    (word as u32 >> 8) & 0xff
}

/// HELD by `holder` (participant entry + 1, or 0).
const fn held_by(holder: u32) -> u32 {
    HELD | (holder & 0xff) << 8
}

/// A slot and the generation it was leased at: what a descriptor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef {
    /// Slot index.
    pub slot: u32,
    /// Generation of this lease.
    pub generation: u32,
}

/// Why no slot was leased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// `try_acquire`: every slot is in use.
    Exhausted,
    /// The deadline passed with every slot still in use.
    Timeout,
    /// The pool's shared state is impossible.
    Corrupted(Corrupted),
    /// Enqueueing the wait for the slot's release failed, or a host call on a GPU channel
    /// (`WrongBackend`).
    Cuda(crate::cuda::CudaError),
    /// Every slot is in use and every receiver that took slots from this pool has died
    /// (their liveness locks are gone), so none will come back.
    PeerDead,
}

impl core::fmt::Display for AcquireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AcquireError::Exhausted => f.write_str("every slot of the pool is in use"),
            AcquireError::Timeout => f.write_str("timed out waiting for a free slot"),
            AcquireError::Corrupted(c) => c.fmt(f),
            AcquireError::Cuda(e) => e.fmt(f),
            AcquireError::PeerDead => {
                f.write_str("every slot is in use and every receiver holding them has died")
            }
        }
    }
}

impl std::error::Error for AcquireError {}

/// The lease protocol: slot records plus the free ring, over any storage.
///
/// `R` gives the records (a slice of [`SlotRecord`]); `S` holds the free ring.
#[derive(Debug)]
pub struct PoolCore<R, S: Storage<Cell = MpmcCell<u32>>> {
    records: R,
    free_tx: mpmc::Producer<u32, S>,
    free_rx: mpmc::Consumer<u32, S>,
}

/// A pool in this process's heap (loom models, unit tests).
pub type HeapPool = PoolCore<std::sync::Arc<[SlotRecord]>, Heap<MpmcCell<u32>>>;

/// A heap pool of `slot_count` free slots (records and free ring only: the slots' bytes
/// are the caller's business).
///
/// # Panics
///
/// If `slot_count` is 0 or above 2^24.
pub fn heap_pool(slot_count: u32) -> HeapPool {
    let n = slot_count as usize;
    let storage = Heap::new(n.next_power_of_two().max(2), |i| {
        if i < n { MpmcCell::written(i as u64, i as u32) } else { MpmcCell::new(i as u64) }
    });
    // Relaxed: nobody else holds the storage yet.
    storage.control().tail.store(n as u64, Ordering::Relaxed);
    let records: std::sync::Arc<[SlotRecord]> = (0..n).map(|_| SlotRecord::new()).collect();
    PoolCore::new(records, storage).expect("a fresh ring is consistent")
}

impl<R: Deref<Target = [SlotRecord]>, S: Storage<Cell = MpmcCell<u32>>> PoolCore<R, S> {
    /// The protocol over `records` and the free ring in `free`.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the free ring's positions are impossible.
    pub fn new(records: R, free: S) -> Result<Self, Corrupted>
    where
        S: Clone,
    {
        let free_tx = mpmc::Producer::new(free.clone())?;
        let free_rx = mpmc::Consumer::new(free)?;
        Ok(Self { records, free_tx, free_rx })
    }

    /// Number of slots.
    pub fn slot_count(&self) -> u32 {
        self.records.len() as u32
    }

    /// Slots now free (a snapshot: exact when nothing moves).
    pub fn free_slots(&self) -> usize {
        self.records
            .iter()
            // Relaxed: a diagnostic count.
            .filter(|r| unpack(r.state.load(Ordering::Relaxed)).1 == FREE)
            .count()
    }

    /// Whether every slot is free, read with SeqCst (see [`release`](Self::release)).
    pub fn all_free(&self) -> bool {
        self.records
            .iter()
            // SeqCst: pairs with the SeqCst CAS in `release` and the caller's SeqCst store of
            // its "closed" flag, so that of a closer and the last releaser at least one
            // sees both the flag and every slot free.
            .all(|r| unpack(r.state.load(Ordering::SeqCst)).1 == FREE)
    }

    /// Leases a free slot without waiting.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Exhausted`], or [`AcquireError::Corrupted`] when the free ring hands
    /// out a slot index out of range or a slot that is not free.
    pub fn try_lease(&self) -> Result<SlotRef, AcquireError> {
        self.try_lease_via(&self.free_rx)
    }

    /// Leases a free slot, waiting (spin, then futex) up to `timeout` (`None`: forever) for
    /// a receiver to return one.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Timeout`], [`AcquireError::Corrupted`].
    pub fn lease(&self, timeout: Option<Duration>) -> Result<SlotRef, AcquireError> {
        self.lease_via(&self.free_rx, timeout)
    }

    /// A handle on the free ring's taking side, to lease through with a wait policy of
    /// its own ([`try_lease_via`](Self::try_lease_via), [`lease_via`](Self::lease_via)).
    pub fn free_consumer(&self) -> mpmc::Consumer<u32, S>
    where
        S: Clone,
    {
        self.free_rx.clone()
    }

    /// [`try_lease`](Self::try_lease) through `free` (from
    /// [`free_consumer`](Self::free_consumer)).
    ///
    /// # Errors
    ///
    /// As [`try_lease`](Self::try_lease).
    pub fn try_lease_via(&self, free: &mpmc::Consumer<u32, S>) -> Result<SlotRef, AcquireError> {
        match free.try_pop() {
            Ok(slot) => self.lease_popped(slot),
            Err(TryPopError::Empty) => Err(AcquireError::Exhausted),
            Err(TryPopError::Corrupted(c)) => Err(AcquireError::Corrupted(c)),
        }
    }

    /// [`lease`](Self::lease) through `free` (from [`free_consumer`](Self::free_consumer)).
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    pub fn lease_via(
        &self,
        free: &mpmc::Consumer<u32, S>,
        timeout: Option<Duration>,
    ) -> Result<SlotRef, AcquireError> {
        let popped = match timeout {
            None => free.pop(),
            Some(t) => free.pop_timeout(t),
        };
        match popped {
            Ok(slot) => self.lease_popped(slot),
            Err(PopError::Timeout) => Err(AcquireError::Timeout),
            Err(PopError::PeerDead) => Err(AcquireError::PeerDead),
            Err(PopError::Corrupted(c)) => Err(AcquireError::Corrupted(c)),
        }
    }

    fn lease_popped(&self, slot: u32) -> Result<SlotRef, AcquireError> {
        let record = self.records.get(slot as usize).ok_or(AcquireError::Corrupted(Corrupted {
            what: "free ring holds a slot index out of range",
        }))?;
        // Relaxed: the slot's bytes are handed over by the free ring (Release push by the
        // returner, Acquire pop above); this word only guards against double returns.
        let word = record.state.load(Ordering::Relaxed);
        let (generation, state) = unpack(word);
        let next = SlotRef { slot, generation: generation.wrapping_add(1) };
        if state != FREE
            || record
                .state
                .compare_exchange(
                    word,
                    pack(next.generation, LEASED),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return Err(AcquireError::Corrupted(Corrupted {
                what: "free ring handed out a slot that is not free",
            }));
        }
        Ok(next)
    }

    /// Marks a leased slot as sent; call just before publishing its descriptor (whose
    /// Release publish orders this store).
    pub fn mark_sent(&self, lease: SlotRef) {
        if let Some(r) = self.records.get(lease.slot as usize) {
            // Relaxed: published to receivers by the descriptor ring's Release push.
            r.state.store(pack(lease.generation, SENT), Ordering::Relaxed);
        }
    }

    /// Takes back a `mark_sent` whose descriptor could not be published.
    pub fn unmark_sent(&self, lease: SlotRef) {
        let sent = pack(lease.generation, SENT);
        if let Some(r) = self.records.get(lease.slot as usize) {
            // Relaxed: nobody else saw the descriptor; the CAS only refuses to overwrite a
            // state a peer forged meanwhile.
            let _ = r.state.compare_exchange(
                sent,
                pack(lease.generation, LEASED),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// Returns a leased slot that was never sent; `false` if it was not leased at that
    /// generation (then nothing is returned).
    pub fn cancel(&self, lease: SlotRef) -> bool {
        self.give_back(lease, LEASED)
    }

    /// Claims a sent slot for the receiver of a descriptor naming `slot` at `generation`.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] naming what was wrong: the slot is out of range, the generation is not
    /// the slot's current one, or the slot is not in flight (already received, or never
    /// sent). The pool is not touched.
    pub fn receive(&self, slot: u32, generation: u64) -> Result<SlotRef, Corrupted> {
        let record = self
            .records
            .get(slot as usize)
            .ok_or(Corrupted { what: "descriptor names a slot out of range" })?;
        let Ok(generation) = u32::try_from(generation) else {
            return Err(Corrupted { what: "descriptor carries a stale slot generation" });
        };
        // Relaxed: the slot's bytes were published by the descriptor ring (Release push,
        // Acquire pop); this CAS only makes the receiver the slot's one holder.
        let mine = pack(generation, self.held_state());
        match record.state.compare_exchange(
            pack(generation, SENT),
            mine,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(SlotRef { slot, generation }),
            Err(found) if unpack(found).0 != generation => {
                Err(Corrupted { what: "descriptor carries a stale slot generation" })
            }
            // Held by a receiver that died before the descriptor left the ring (an SPSC
            // receiver takes the slot first, then moves `head`): the message was never
            // returned to it, so it is ours now. A probe of the holder's lock: this case only.
            Err(found)
                if unpack(found).1 == HELD
                    && found != mine
                    && holder(found) != 0
                    && self.free_tx.storage().dead_participant(holder(found) - 1).is_some()
                    && record
                        .state
                        .compare_exchange(found, mine, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok() =>
            {
                Ok(SlotRef { slot, generation })
            }
            Err(_) => Err(Corrupted { what: "descriptor names a slot that is not in flight" }),
        }
    }

    /// Returns a received slot to the free ring (and wakes a sender waiting for one).
    /// Returns `false` if the slot was not held at that generation (a forged state word):
    /// then nothing is returned, so no slot is ever in the free ring twice.
    pub fn release(&self, held: SlotRef) -> bool {
        self.give_back(held, self.held_state())
    }

    /// The HELD state this process's receives record: HELD by our participant entry.
    fn held_state(&self) -> u32 {
        held_by(self.free_tx.storage().participant().map_or(0, |i| i + 1))
    }

    /// Takes back every slot held by a receiver whose process died (and for which
    /// `exited(pid)` agrees), returning them to the free ring; returns how many. A few
    /// syscalls per held slot (the holder's liveness lock is probed): call it while
    /// waiting, not per message.
    ///
    /// `queued(slot, generation)` says whether a descriptor naming the slot is still in
    /// the channel's ring: then its dead holder took the slot without consuming the
    /// descriptor, and the next receiver takes the slot over with it (see `receive`), so
    /// it is left alone.
    pub fn reclaim_dead(
        &self,
        exited: impl Fn(u32) -> bool,
        queued: impl Fn(u32, u32) -> bool,
    ) -> u32 {
        let storage = self.free_tx.storage();
        let mut reclaimed = 0;
        for (slot, record) in self.records.iter().enumerate() {
            // Relaxed: the CAS in `give_back` decides; a stale read only skips a slot.
            let word = record.state.load(Ordering::Relaxed);
            let (generation, state) = unpack(word);
            let h = holder(word);
            if state == HELD
                && h != 0
                && storage.dead_participant(h - 1).is_some_and(&exited)
                && !queued(slot as u32, generation)
            {
                let lease = SlotRef { slot: slot as u32, generation };
                if self.give_back(lease, held_by(h)) {
                    reclaimed += 1;
                }
            }
        }
        reclaimed
    }

    /// Whether every receiver that attached to this pool has died.
    pub fn receivers_dead(&self) -> bool {
        self.free_rx.storage().peers_dead(crate::ring::Side::Producers)
    }

    fn give_back(&self, lease: SlotRef, from: u32) -> bool {
        let Some(record) = self.records.get(lease.slot as usize) else {
            return false;
        };
        // SeqCst: pairs with the SeqCst loads in `all_free` (see there). The slot's bytes
        // are handed to the next leaser by the free ring's Release push below.
        if record
            .state
            .compare_exchange(
                pack(lease.generation, from),
                pack(lease.generation, FREE),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        match self.free_tx.push(lease.slot) {
            Ok(()) => true,
            // The free ring holds at most `slot_count` entries and has room for all: a full
            // or broken ring is corruption, and the slot cannot be returned.
            Err(_) => false,
        }
    }

    /// Threads asleep waiting for a free slot (a diagnostic snapshot).
    pub fn sleepers(&self) -> u32 {
        self.free_rx.storage().control().not_empty.sleepers()
    }
}

#[cfg(not(loom))]
pub(crate) use host::PoolSegment;

#[cfg(not(loom))]
mod host {
    use std::ptr::NonNull;
    use std::sync::Arc;
    use std::time::Duration;

    use super::{PoolCore, SlotRecord};
    use crate::layout::{
        BACKEND_CUDA, BACKEND_HOST, CudaPoolInfo, MpmcCell, PoolHeader, PoolLayout, SegmentKind,
        SlotEvents,
    };
    use crate::named::{RingSegment, ShmStorage};
    use crate::ring::Corrupted;
    use crate::shm::{Role, Segment, ShmError};
    use crate::sync::Ordering;

    /// The slot records of a mapped pool segment.
    #[derive(Debug)]
    pub(crate) struct ShmRecords {
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
    pub(crate) struct PoolSegment {
        pub(crate) core: PoolCore<ShmRecords, ShmStorage<MpmcCell<u32>>>,
        segment: Arc<Segment>,
        layout: PoolLayout,
        backend: u32,
        // Host backend only: slot 0's bytes.
        data: Option<NonNull<u8>>,
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
            init: impl FnOnce(&Segment, &PoolLayout) -> Result<(), ShmError>,
        ) -> Result<Self, ShmError> {
            let layout = PoolLayout::for_backend(backend, slot_count, slot_size)
                .ok_or(ShmError::InvalidPool { slot_count, slot_size })?;
            let n = slot_count as usize;
            let mut segment = Segment::create(name, kind(backend), layout.total_size, |seg| {
                // SAFETY: offsets from `layout`, which sized the segment; ours alone until
                // `create` publishes it.
                let header = unsafe { seg.at::<PoolHeader>(layout.header).as_ref() };
                // Relaxed: published by the Release store of `init` in `Segment::create`.
                header.slot_count.store(slot_count, Ordering::Relaxed);
                header.backend.store(backend, Ordering::Relaxed);
                header.slot_size.store(slot_size, Ordering::Relaxed);
                header.owner_pid.store(std::process::id(), Ordering::Relaxed);
                // Records are zero (free, generation 0) in a fresh object. The free ring
                // starts full: cell i holds slot i, written at position i.
                RingSegment::init_in::<u32, MpmcCell<u32>>(seg, &layout.free_ring, |i| {
                    if i < n {
                        MpmcCell::written(i as u64, i as u32)
                    } else {
                        MpmcCell::new(i as u64)
                    }
                });
                // SAFETY: as above.
                let control = unsafe {
                    seg.at::<crate::layout::RingControl>(layout.free_ring.control).as_ref()
                };
                control.tail.store(n as u64, Ordering::Relaxed);
                init(seg, &layout)
            })?;
            segment.keep_name();
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
        ) -> Result<Self, ShmError> {
            let segment = Segment::open(name, kind(backend), timeout)?;
            let layout = PoolLayout::for_backend(backend, slot_count, slot_size)
                .ok_or(ShmError::InvalidPool { slot_count, slot_size })?;
            if segment.len() != layout.total_size {
                return Err(ShmError::SizeMismatch {
                    expected: layout.total_size as u64,
                    found: segment.len() as u64,
                });
            }
            // SAFETY: inside the mapping (its size equals the layout's); atomics only.
            let header = unsafe { segment.at::<PoolHeader>(layout.header).as_ref() };
            // Relaxed: `Segment::open` synchronised with the creator through `init`.
            let found = (
                header.slot_count.load(Ordering::Relaxed),
                header.slot_size.load(Ordering::Relaxed),
                header.backend.load(Ordering::Relaxed),
            );
            if found != (slot_count, slot_size, backend) {
                return Err(ShmError::Corrupted(Corrupted {
                    what: "pool header disagrees with the channel's pool table",
                }));
            }
            RingSegment::check_in::<u32>(&segment, &layout.free_ring)?;
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
        ) -> Result<Self, ShmError> {
            // SAFETY: offsets from the layout that sized the segment (`at` checks bounds
            // and alignment).
            let records = unsafe { segment.at::<SlotRecord>(layout.records) };
            // SAFETY: as above; host pools end with their slots.
            let data = (backend == BACKEND_HOST).then(|| unsafe { segment.at::<u8>(layout.data) });
            let records =
                ShmRecords { _segment: segment.clone(), ptr: records, len: layout.slot_count };
            let ring = RingSegment::view(segment.clone(), layout.free_ring, true);
            let core = PoolCore::new(records, ring.attached_storage::<MpmcCell<u32>>(role)?)?;
            Ok(Self { core, segment, layout, backend, data })
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

        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        /// Distance between slots.
        pub(crate) fn stride(&self) -> usize {
            self.layout.stride
        }

        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        /// Device pools: the allocation's handle and device.
        ///
        /// # Panics
        ///
        /// On a host pool.
        pub(crate) fn cuda_info(&self) -> &CudaPoolInfo {
            assert_eq!(self.backend, BACKEND_CUDA, "a device pool");
            // SAFETY: offset from the checked device-pool layout; atomics only.
            unsafe { self.segment.at::<CudaPoolInfo>(self.layout.cuda_info).as_ref() }
        }

        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        /// Device pools: every slot's event handles.
        ///
        /// # Panics
        ///
        /// On a host pool.
        pub(crate) fn slot_events(&self) -> &[SlotEvents] {
            assert_eq!(self.backend, BACKEND_CUDA, "a device pool");
            let first = self.layout.slot_events;
            // Checks the last record's bounds (and the first's alignment).
            // SAFETY: `at` checks bounds; atomics only.
            let _ = unsafe {
                self.segment.at::<SlotEvents>(
                    first + (self.layout.slot_count - 1) * size_of::<SlotEvents>(),
                )
            };
            // SAFETY: `slot_count` records from `first` lie inside the mapping (checked just
            // above), aligned; atomics only, valid for any bytes.
            unsafe {
                std::slice::from_raw_parts(
                    self.segment.at::<SlotEvents>(first).as_ptr(),
                    self.layout.slot_count,
                )
            }
        }

        /// Usable bytes per slot.
        pub(crate) fn slot_size(&self) -> usize {
            self.layout.slot_size
        }

        /// The segment's name.
        pub(crate) fn name(&self) -> &str {
            self.segment.name()
        }

        fn header(&self) -> &PoolHeader {
            // SAFETY: offset from the checked layout; atomics only.
            unsafe { self.segment.at::<PoolHeader>(self.layout.header).as_ref() }
        }

        /// The sender is gone: mark the pool closed, and unlink it if nothing is in flight.
        pub(crate) fn close(&self) {
            // SeqCst: pairs with the SeqCst load in `unlink_if_drained` and the SeqCst
            // slot CAS in `PoolCore::release` (a store-load handshake: of the closer and
            // the last releaser, at least one sees the pool closed and drained).
            self.header().closed.store(1, Ordering::SeqCst);
            self.unlink_if_drained();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_send_receive_release() {
        let pool = heap_pool(3);
        assert_eq!(pool.free_slots(), 3);
        let a = pool.try_lease().unwrap();
        assert_eq!(a, SlotRef { slot: 0, generation: 1 });
        pool.mark_sent(a);
        assert_eq!(pool.free_slots(), 2);
        let held = pool.receive(a.slot, a.generation as u64).unwrap();
        assert!(pool.receive(a.slot, a.generation as u64).is_err(), "received once only");
        assert!(pool.release(held));
        assert!(!pool.release(held), "returned once only");
        assert_eq!(pool.free_slots(), 3);
        assert!(pool.all_free());
    }

    #[test]
    fn exhaustion_and_generations() {
        let pool = heap_pool(2);
        let a = pool.try_lease().unwrap();
        let b = pool.try_lease().unwrap();
        assert_eq!(pool.try_lease(), Err(AcquireError::Exhausted));
        assert_eq!(pool.lease(Some(Duration::from_millis(5))), Err(AcquireError::Timeout));
        pool.cancel(a);
        let c = pool.try_lease().unwrap();
        assert_eq!((c.slot, c.generation), (a.slot, a.generation + 1), "reuse bumps");
        pool.mark_sent(b);
        pool.unmark_sent(b);
        pool.cancel(b);
        assert_eq!(pool.free_slots(), 1);
    }

    #[test]
    fn forged_receives_leave_the_pool_alone() {
        let pool = heap_pool(4);
        let a = pool.try_lease().unwrap();
        pool.mark_sent(a);
        let g = a.generation as u64;
        let what = |r: Result<SlotRef, Corrupted>| r.unwrap_err().what;
        assert_eq!(what(pool.receive(9, g)), "descriptor names a slot out of range");
        assert_eq!(what(pool.receive(a.slot, g + 1)), "descriptor carries a stale slot generation");
        assert_eq!(
            what(pool.receive(a.slot, u64::MAX)),
            "descriptor carries a stale slot generation"
        );
        assert_eq!(what(pool.receive(1, 0)), "descriptor names a slot that is not in flight");
        assert_eq!(pool.free_slots(), 3);
        let held = pool.receive(a.slot, g).expect("the real one still goes through");
        assert!(pool.release(held));
        assert_eq!(pool.free_slots(), 4);
    }
}
