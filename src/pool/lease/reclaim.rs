//! Recovery from parties that are gone: the slots a dead receiver held or was returning
//! ([`PoolCore::reclaim_dead`], [`PoolCore::adopt`] for redelivery) and the slots of a pool
//! whose sender is gone ([`PoolCore::abandon`]). Slow paths: each probes locks.

use std::ops::Deref;

use super::{HELD, LEASED, PoolCore, RETURNING, Reclaimed, SENT, SlotRef, by, pack, party, unpack};
use crate::layout::{MpmcCell, SlotRecord};
use crate::liveness::Watch;
use crate::ring::Storage;
use crate::sync::Ordering;

impl<R: Deref<Target = [SlotRecord]>, S: Storage<Cell = MpmcCell<u32>>> PoolCore<R, S> {
    /// Takes back every slot that a party which is gone left behind (and for which
    /// `exited(pid)` agrees, given the pid its entry recorded if it still does): slots
    /// HELD by a receiver that died, and slots RETURNING by a party that died before its
    /// push on the free ring. Returns how many. A few syscalls per such slot (the party's
    /// lock is probed): call it while waiting, not per message, and only from the free
    /// ring's one taker (the sender's thread, or whoever has taken over a dead sender's
    /// pool), whose scan of the free ring nobody else's pops can change.
    ///
    /// `queued(slot, generation)` says whether a descriptor naming the slot is still in
    /// the channel's ring: then its dead holder took the slot without consuming the
    /// descriptor, and the next receiver takes the slot over with it (see `receive`), so
    /// it is left alone.
    ///
    /// With `redeliver`, a slot HELD by a receiver that died (and not `queued`) is a
    /// message to deliver again: it is left for a receiver to [`adopt`](Self::adopt), and
    /// counted in [`Reclaimed::orphans`].
    pub fn reclaim_dead(
        &self,
        exited: impl Fn(u32) -> bool,
        queued: impl Fn(u32, u32) -> bool,
        redeliver: bool,
    ) -> Reclaimed {
        let gone = |word: u64| self.party_gone(word, &exited);
        let mut found = Reclaimed::default();
        for (slot, record) in self.records.iter().enumerate() {
            // Relaxed: the CAS in `give_back` decides; a stale read only skips a slot.
            let word = record.state.load(Ordering::Relaxed);
            let (generation, state) = unpack(word);
            let lease = SlotRef { slot: slot as u32, generation };
            match state {
                HELD if gone(word) && !queued(lease.slot, generation) => {
                    if redeliver {
                        found.orphans += 1;
                    } else {
                        found.back += u32::from(self.give_back(lease, word as u32));
                    }
                }
                RETURNING => {
                    found.back += u32::from(gone(word) && self.push_again(lease, word as u32));
                }
                _ => {}
            }
        }
        found
    }

    /// Takes over one message whose receiver died holding it, for a receiver that will
    /// deliver it again: a slot HELD by a party that is gone (and for which `exited`
    /// agrees, as in [`reclaim_dead`](Self::reclaim_dead)) and not `queued` (a descriptor
    /// still in the ring goes to its next receiver with the slot: see `receive`) becomes
    /// HELD by this endpoint. Of several such slots, the one whose `age(slot)` is least
    /// (the sent copy's sequence number: the oldest message, so that messages given back
    /// together come back in the order they were sent, whatever their slots); of several
    /// adopters one wins the slot (a CAS from the dead holder's word, which never comes
    /// back), and the others look again. Returns the slot, or `None` when there is none.
    /// Probes the holders' locks: slow paths only.
    ///
    /// What the message was is the slot's sent copy (`PoolSegment::read_sent`), written by
    /// the sender before it published the message; the caller checks it as any descriptor
    /// (`age` reads it unchecked: a forged one changes only which orphan comes first).
    pub fn adopt(
        &self,
        exited: impl Fn(u32) -> bool,
        queued: impl Fn(u32, u32) -> bool,
        age: impl Fn(u32) -> u64,
    ) -> Option<SlotRef> {
        let mine = self.held_state();
        // The last party probed and whether it was gone: holders are few, slots many.
        let mut probed: Option<(u32, bool)> = None;
        // Bounded, as `retire_oldest`: a peer that scribbles state words could fail every CAS.
        for _ in 0..self.slot_count().saturating_mul(4).max(64) {
            // The oldest slot HELD by a party that is gone: (age, slot, its state word).
            let mut oldest: Option<(u64, usize, u64)> = None;
            for (slot, record) in self.records.iter().enumerate() {
                // Relaxed: the CAS below decides (and acquires); a stale read only skips a
                // slot or fails that CAS.
                let word = record.state.load(Ordering::Relaxed);
                let (generation, state) = unpack(word);
                if state != HELD || word as u32 == mine {
                    continue;
                }
                let gone = match probed {
                    Some((p, gone)) if p == party(word) => gone,
                    _ => {
                        let gone = self.party_gone(word, &exited);
                        probed = Some((party(word), gone));
                        gone
                    }
                };
                if !gone || queued(slot as u32, generation) {
                    continue;
                }
                let a = age(slot as u32);
                if oldest.is_none_or(|(o, ..)| a < o) {
                    oldest = Some((a, slot, word));
                }
            }
            let (_, slot, word) = oldest?;
            // AcqRel: acquires the dead holder's Release take of the slot (`receive`, or an
            // earlier adopter's CAS here), so the slot's bytes and its sent copy are visible;
            // releases them in turn to whoever adopts the slot should this endpoint die.
            let generation = unpack(word).0;
            if self.records[slot]
                .state
                .compare_exchange(word, pack(generation, mine), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(SlotRef { slot: slot as u32, generation });
            }
            // Another adopter took it (or the word changed): look again.
        }
        None
    }

    /// Whether the party a HELD or RETURNING state `word` names is gone (its registration
    /// is, and `exited` agrees given the pid its entry recorded, if it still does). Probes a
    /// lock.
    fn party_gone(&self, word: u64, exited: &impl Fn(u32) -> bool) -> bool {
        let watch = self.free_rx.storage().watch();
        watch.id_gone(party(word)).is_some_and(|pid| pid.is_none_or(exited))
    }

    /// For whoever closes the pool of a sender that is gone (see
    /// `PoolSegment::close_orphaned`): marks free every slot that would otherwise never
    /// come back, so that the pool can drain and unlink itself. Those are the slots held by
    /// a receiver that is gone (HELD, not `queued`; as in
    /// [`reclaim_dead`](Self::reclaim_dead), with `exited`) and, when the sender died
    /// (`sender_dead`; a sender that left may have left a lease alive behind it), the slots
    /// it leased and never sent (LEASED) or sent but never published (SENT with no
    /// descriptor `queued`: it died between the two). A slot SENT and queued comes back
    /// through the receiver that takes it; one HELD by a live receiver, when it is
    /// released; one RETURNING already counts as free. Nothing goes on the free ring:
    /// nobody leases from a closed pool. Returns how many slots it marked.
    ///
    /// A receiver taking a SENT slot meanwhile moves it to HELD before its descriptor
    /// leaves the ring, so the CAS from SENT fails if it did, whatever the scan saw.
    ///
    /// With `redeliver`, slots HELD by a receiver that is gone are messages to deliver
    /// again: left for a receiver to [`adopt`](Self::adopt) (the pool unlinks itself once
    /// that one drops them).
    pub fn abandon(
        &self,
        sender_dead: bool,
        exited: impl Fn(u32) -> bool,
        queued: impl Fn(u32, u32) -> bool,
        redeliver: bool,
    ) -> u32 {
        let gone = |word: u64| self.party_gone(word, &exited);
        let returning = by(RETURNING, self.me());
        let mut marked = 0;
        for (slot, record) in self.records.iter().enumerate() {
            // Relaxed: the CAS below decides; a stale read only skips a slot.
            let word = record.state.load(Ordering::Relaxed);
            let (generation, state) = unpack(word);
            let orphan = match state {
                LEASED => sender_dead,
                SENT => sender_dead && !queued(slot as u32, generation),
                HELD => !redeliver && gone(word) && !queued(slot as u32, generation),
                _ => false,
            };
            // SeqCst: pairs with the SeqCst loads in `all_free`, as in `give_back`.
            marked += u32::from(
                orphan
                    && record
                        .state
                        .compare_exchange(
                            word,
                            pack(generation, returning),
                            Ordering::SeqCst,
                            Ordering::Relaxed,
                        )
                        .is_ok(),
            );
        }
        marked
    }

    /// A slot RETURNING by a party that is gone: this endpoint takes the return over (a
    /// CAS, so of several takers one does) and pushes the slot unless it is on the free
    /// ring already (the party died after its push).
    ///
    /// The push never waits: the caller is the free ring's one taker, so waiting for room
    /// would wait for itself. (The ring has room for every slot and every cell a dead
    /// returner left: see `PoolLayout`. Before it had, the storms hung a sender here: the
    /// dead returner's own cell took the position its slot needed.) Should it find no room
    /// (a forged count), the return goes back to the dead party, for the next tick.
    fn push_again(&self, lease: SlotRef, from: u32) -> bool {
        let record = &self.records[lease.slot as usize];
        let (dead, mine) =
            (pack(lease.generation, from), pack(lease.generation, by(RETURNING, self.me())));
        // Relaxed: the free ring hands the slot on (Release push below); the CAS only makes
        // this endpoint the one that finishes the return.
        let took = record.state.compare_exchange(dead, mine, Ordering::Relaxed, Ordering::Relaxed);
        if took.is_err() || self.free_tx.any_unfreed(|&s| s == lease.slot) {
            return false;
        }
        if self.free_tx.try_push(lease.slot).is_ok() {
            return true;
        }
        // Relaxed: as above; nobody else moves a slot RETURNING by a live party.
        let _ = record.state.compare_exchange(mine, dead, Ordering::Relaxed, Ordering::Relaxed);
        false
    }
}
