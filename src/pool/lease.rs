//! Slot pools: a fixed set of equal, preallocated slots, a free-slot ring, and leases that
//! carry a generation number.
//!
//! A pool belongs to one sender. Every slot has a [`SlotRecord`] whose state word packs the
//! slot's *generation* (bumped each time the slot is leased) and where the slot is:
//!
//! ```text
//!   FREE(g) --lease--> LEASED(g+1) --send--> SENT(g+1) --receive--> HELD(g+1) --release--> RETURNING(g+1)
//!                          |                                                                   ^  |
//!                          +-------------------------- cancel (never sent) ------------------+  |
//!   RETURNING(g) --lease--> LEASED(g+1)  <----------------------------------------------------------+
//! ```
//!
//! HELD and RETURNING also name a party, by its identity in the pool's free ring
//! ([`ParticipantId`](crate::layout::ParticipantId): entry and registration serial, never
//! a pid, so that neither entry reuse nor pid reuse makes a dead party look alive): the
//! receiver holding the slot, and whoever is putting it back on the free ring. Giving a
//! slot back takes two steps, the state (HELD or LEASED → RETURNING) and then the push of
//! its index on the free ring, and a party can die between them: a slot RETURNING by a
//! party that is gone and not in the free ring is pushed again by the sender (at its
//! waiting ticks, where it is the free ring's only taker, so a scan of the ring is exact).
//! A slot HELD by a receiver that is gone is taken back the same way
//! ([`PoolCore::reclaim_dead`]). Leasing takes FREE and RETURNING slots alike.
//!
//! [`PoolCore`] is the protocol over any ring storage (heap storage for loom and unit
//! tests); `segment.rs` puts it in shared memory.

use std::ops::Deref;

use crate::layout::{Corrupted, MpmcCell, SlotRecord};
use crate::liveness::{Blocked, Tick, Watch};
use crate::ring::{Heap, PopTimeoutError, Storage, mpmc};
use crate::sync::Ordering;
use crate::wait::Deadline;

mod reclaim;
mod shared;

const FREE: u32 = 0;
const LEASED: u32 = 1;
const SENT: u32 = 2;
const HELD: u32 = 3;
const RETURNING: u32 = 4;
/// Bits of the state; the party (a `ParticipantId`, 29 bits) is above them.
const STATE_BITS: u32 = 3;

const fn pack(generation: u32, state: u32) -> u64 {
    ((generation as u64) << 32) | state as u64
}

/// (generation, state) of a state word; the state without its party (see [`party`]).
const fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32 & ((1 << STATE_BITS) - 1))
}

/// The party recorded in a HELD or RETURNING state word (0: none).
const fn party(word: u64) -> u32 {
    word as u32 >> STATE_BITS
}

/// `state` (HELD or RETURNING) by `party`.
const fn by(state: u32, party: u32) -> u32 {
    state | party << STATE_BITS
}

/// Whether a slot in `state` may be leased: it is free, or on its way back.
const fn leasable(state: u32) -> bool {
    state == FREE || state == RETURNING
}

/// Where a slot stands, for reports ([`phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Free, or on its way back to the free ring.
    Free,
    /// Leased to the sender.
    Leased,
    /// Sent, not yet received.
    Sent,
    /// Held by a receiver.
    Held,
}

/// Where the slot whose record holds `word` stands (tools; anything unknown is `Held`).
pub(crate) const fn phase(word: u64) -> Phase {
    match unpack(word).1 {
        FREE | RETURNING => Phase::Free,
        LEASED => Phase::Leased,
        SENT => Phase::Sent,
        _ => Phase::Held,
    }
}

/// What [`PoolCore::reclaim_dead`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Slots it put back on the free ring.
    pub back: u32,
    /// Slots held by receivers that died, left to be delivered again.
    pub orphans: u32,
}

/// A slot and the generation it was leased at: what a descriptor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef {
    /// Slot index.
    pub slot: u32,
    /// Generation of this lease.
    pub generation: u32,
}

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
    // Twice the slots, as in shared memory (`PoolLayout`).
    let storage = Heap::new((2 * n).next_power_of_two(), |i| {
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

    /// The slot records.
    pub(crate) fn records(&self) -> &[SlotRecord] {
        &self.records
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
            .filter(|r| leasable(unpack(r.state.load(Ordering::Relaxed)).1))
            .count()
    }

    /// Slots now held by receivers (received, not yet given back; a snapshot).
    pub fn held_slots(&self) -> usize {
        self.records
            .iter()
            // Relaxed: a diagnostic count.
            .filter(|r| unpack(r.state.load(Ordering::Relaxed)).1 == HELD)
            .count()
    }

    /// Whether every slot is free, read with SeqCst (see [`release`](Self::release)).
    pub fn all_free(&self) -> bool {
        self.records
            .iter()
            // SeqCst: pairs with the SeqCst CAS in `release` and the caller's SeqCst store of
            // its "closed" flag, so that of a closer and the last releaser at least one
            // sees both the flag and every slot free.
            .all(|r| leasable(unpack(r.state.load(Ordering::SeqCst)).1))
    }

    /// Whether no slot is held by a receiver, read with SeqCst (pairs with the SeqCst CAS in
    /// [`receive`](Self::receive), against a retiring sender's SeqCst flag: of the two, at
    /// least one sees the other).
    pub fn none_held(&self) -> bool {
        // SeqCst: see above.
        self.records.iter().all(|r| unpack(r.state.load(Ordering::SeqCst)).1 != HELD)
    }

    /// Leases a free slot without waiting (models and tests; channels lease through
    /// [`lease_until`](Self::lease_until)): `None` when every slot is in use.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the free ring hands out a slot index out of range or a slot
    /// that is not free.
    pub fn try_lease(&self) -> Result<Option<SlotRef>, Corrupted> {
        match self.lease_until(&self.free_rx, Deadline::Now, || Ok(false)) {
            Ok(slot) => Ok(Some(slot)),
            Err(PopTimeoutError::Corrupted(c)) => Err(c),
            Err(_) => Ok(None),
        }
    }

    /// A handle on the free ring's taking side, to lease through with a wait policy of
    /// its own ([`lease_until`](Self::lease_until)).
    pub fn free_consumer(&self) -> mpmc::Consumer<u32, S>
    where
        S: Clone,
    {
        self.free_rx.clone()
    }

    /// Leases a free slot through `free` (from [`free_consumer`](Self::free_consumer)),
    /// waiting (spin, then futex) until `deadline` for a receiver to return one. At each
    /// liveness tick of the wait, `tick` may take slots back (the sender's
    /// [`reclaim_dead`](Self::reclaim_dead)) and says whether it did, or ends the wait
    /// (`Err`: the sender's channel has no receiver left).
    ///
    /// # Errors
    ///
    /// As the free ring's pop: `Timeout` (also for nothing free with [`Deadline::Now`]),
    /// `PeerDead` (every slot out, every receiver holding them dead), `Disconnected`,
    /// `Corrupted` (also for a slot index out of range, or a slot that is not free).
    pub(crate) fn lease_until(
        &self,
        free: &mpmc::Consumer<u32, S>,
        deadline: Deadline,
        mut tick: impl FnMut() -> Result<bool, Blocked>,
    ) -> Result<SlotRef, PopTimeoutError> {
        let slot = free.pop_then_ticking(
            deadline,
            |slot| slot,
            || match tick() {
                Ok(true) => Tick::Retry,
                Ok(false) => Tick::Idle,
                Err(why) => Tick::Stop(why),
            },
        )?;
        self.lease_popped(slot).map_err(PopTimeoutError::Corrupted)
    }

    fn lease_popped(&self, slot: u32) -> Result<SlotRef, Corrupted> {
        let record = self
            .records
            .get(slot as usize)
            .ok_or(Corrupted { what: "free ring holds a slot index out of range" })?;
        // Relaxed: the slot's bytes are handed over by the free ring (Release push by the
        // returner, Acquire pop above); this word only guards against double returns.
        let word = record.state.load(Ordering::Relaxed);
        let (generation, state) = unpack(word);
        let next = SlotRef { slot, generation: generation.wrapping_add(1) };
        if !leasable(state)
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
            return Err(Corrupted { what: "free ring handed out a slot that is not free" });
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
        // Release: pairs with the Acquire CAS of `adopt`, by which a receiver takes the slot
        // over should this one die holding it: the slot's bytes and its sent copy, published
        // to us by the descriptor ring (Release push, Acquire pop), reach that receiver too.
        // Relaxed on failure: nothing is read on the strength of it.
        let mine = pack(generation, self.held_state());
        match record.state.compare_exchange(
            pack(generation, SENT),
            mine,
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(SlotRef { slot, generation }),
            Err(found) if unpack(found).0 != generation => {
                Err(Corrupted { what: "descriptor carries a stale slot generation" })
            }
            // Held by a receiver that died before the descriptor left the ring (an SPSC
            // receiver takes the slot first, then moves `head`): the message was never
            // returned to it, so it is ours now. A probe of the holder's lock: this case only.
            // Release: as above.
            Err(found)
                if unpack(found).1 == HELD
                    && found != mine
                    && self.free_rx.storage().watch().id_gone(party(found)).is_some()
                    && record
                        .state
                        .compare_exchange(found, mine, Ordering::Release, Ordering::Relaxed)
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

    /// Gives up a slot this endpoint holds, unreturned, for another receiver to take over
    /// as it takes over a dead receiver's ([`adopt`](Self::adopt)): HELD by nobody (party
    /// 0, which names no entry, so every look finds it gone). False when this endpoint
    /// does not hold it. For a message put back in its channel (`Receiver::requeue`);
    /// shared-memory pools only (a heap pool's own identity is 0 already).
    pub fn give_up(&self, held: SlotRef) -> bool {
        let Some(record) = self.records.get(held.slot as usize) else {
            return false;
        };
        // Release: pairs with the AcqRel CAS of `adopt`: the slot's bytes and its sent
        // copy, which this endpoint acquired when it took the slot, reach the adopter.
        // Relaxed on failure: nothing is read on the strength of it.
        record
            .state
            .compare_exchange(
                pack(held.generation, self.held_state()),
                pack(held.generation, by(HELD, 0)),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// This endpoint's identity in the free ring (0 for heap pools, which watch nobody).
    fn me(&self) -> u32 {
        self.free_rx.storage().watch().id().unwrap_or(0)
    }

    /// The HELD state this endpoint's receives record: HELD by its identity.
    fn held_state(&self) -> u32 {
        by(HELD, self.me())
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
                pack(lease.generation, by(RETURNING, self.me())),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        // A death here leaves the slot RETURNING by a party that is gone, off the free
        // ring: `reclaim_dead` pushes it again.
        crate::fault::point("release_marked");
        self.push_free(lease.slot)
    }

    /// Pushes `slot`, marked RETURNING by this endpoint, on the free ring (and wakes a
    /// sender waiting for one).
    fn push_free(&self, slot: u32) -> bool {
        match self.free_tx.push_until(slot, Deadline::Never) {
            Ok(()) => true,
            // The free ring has room for every slot and every cell a dead returner left
            // (see `PoolLayout`): a full or broken ring is corruption, and the slot cannot
            // be returned.
            Err(_) => false,
        }
    }

    /// Threads asleep waiting for a free slot (a diagnostic snapshot).
    pub fn sleepers(&self) -> u32 {
        self.free_rx.storage().control().not_empty.sleepers()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_send_receive_release() {
        let pool = heap_pool(3);
        assert_eq!(pool.free_slots(), 3);
        let a = pool.try_lease().unwrap().unwrap();
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
        let a = pool.try_lease().unwrap().unwrap();
        let b = pool.try_lease().unwrap().unwrap();
        assert_eq!(pool.try_lease(), Ok(None));
        let soon = Deadline::after(std::time::Duration::from_millis(5));
        assert_eq!(
            pool.lease_until(&pool.free_rx, soon, || Ok(false)),
            Err(PopTimeoutError::Timeout)
        );
        pool.cancel(a);
        let c = pool.try_lease().unwrap().unwrap();
        assert_eq!((c.slot, c.generation), (a.slot, a.generation + 1), "reuse bumps");
        pool.mark_sent(b);
        pool.unmark_sent(b);
        pool.cancel(b);
        assert_eq!(pool.free_slots(), 1);
    }

    #[test]
    fn forged_receives_leave_the_pool_alone() {
        let pool = heap_pool(4);
        let a = pool.try_lease().unwrap().unwrap();
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
