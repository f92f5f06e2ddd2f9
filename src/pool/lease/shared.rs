//! Slots of a broadcast channel: one message, read in place by every reader that was there
//! when it was sent, and back in the free ring once the last of them has dropped it.
//!
//! A sent slot stays `SENT(g)` while its message is out; its record's `holders` mask has
//! bit `i` set while reader `i` holds it, and `sent_at` names the ring position of the
//! message. A reader sets its bit *before* its cursor passes the message
//! ([`hold_shared`](PoolCore::hold_shared), then the cursor's Release store) and clears it
//! when it drops the message ([`release_shared`](PoolCore::release_shared), Release). So
//! once every counted cursor is past `sent_at` (read with Acquire), every reader that will
//! ever hold the message has set its bit, and `holders == 0` (Acquire) means all of them
//! are done with it: [`reclaim_sent`](PoolCore::reclaim_sent) then moves the slot
//! `SENT(g) → RETURNING` and pushes it on the free ring, as any return does (a death
//! between the two is what [`reclaim_dead`](PoolCore::reclaim_dead) already repairs). The
//! last reader to drop the message tries that; the sender tries it for every sent slot when
//! it finds no free slot, when asked how many are free, and at its liveness ticks (where a dead reader's bits are cleared
//! first, [`clear_holder`](PoolCore::clear_holder)).
//!
//! *Lagging* channels (the sender never waits for a reader that is behind): a sender with
//! no free slot *retires* the oldest sent slot nobody holds, whatever the cursors say
//! ([`retire_oldest`](PoolCore::retire_oldest)): `SENT(g) → RETURNING`, a SeqCst fence,
//! then `holders` (Acquire); if a bit is set, the state goes back to `SENT(g)` and the
//! slot stays. A reader's hold ([`hold_retirable`](PoolCore::hold_retirable)) sets its bit,
//! issues a SeqCst fence, then reads the state: of the two fences one comes first, so
//! either the sender sees the bit (and keeps the slot), or the reader sees the slot no
//! longer `SENT(g)` (and clears its bit: it missed that message). A slot is never rewritten
//! under a reader that holds it (loom model `a_retired_slot_is_never_rewritten_under_a_reader`).

use std::ops::Deref;

use super::{PoolCore, RETURNING, SENT, SlotRef, by, pack, unpack};
use crate::layout::{Corrupted, MpmcCell, SlotRecord};
use crate::ring::Storage;
use crate::sync::{Ordering, fence};

/// Whether every cursor at or above `min` is past position `pos` (`min > pos`, wrapping).
const fn passed(pos: u64, min: u64) -> bool {
    let ahead = min.wrapping_sub(pos);
    ahead != 0 && ahead <= u64::MAX / 2
}

impl<R: Deref<Target = [SlotRecord]>, S: Storage<Cell = MpmcCell<u32>>> PoolCore<R, S> {
    /// Records that the message in leased slot `lease` goes out at ring position `pos`
    /// (before [`mark_sent`](Self::mark_sent), whose publish orders it).
    pub fn set_sent_at(&self, lease: SlotRef, pos: u64) {
        if let Some(r) = self.records.get(lease.slot as usize) {
            // Relaxed: published by the descriptor ring's Release push.
            r.sent_at.store(pos, Ordering::Relaxed);
        }
    }

    /// Reader `bit`'s hold on the message in slot `slot` at `generation`, taken before its
    /// cursor passes the message.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] (nothing changed) when the slot is out of range, the generation is not
    /// its current one, the slot is not sent, or this reader holds it already.
    pub fn hold_shared(&self, slot: u32, generation: u64, bit: u64) -> Result<SlotRef, Corrupted> {
        self.hold(slot, generation, bit, false)?
            .ok_or(Corrupted { what: "descriptor names a slot that is not in flight" })
    }

    /// [`hold_shared`](Self::hold_shared) in a lagging channel, whose sender may have
    /// retired the slot (module docs): `None` when it did (the reader missed the message).
    ///
    /// # Errors
    ///
    /// As [`hold_shared`](Self::hold_shared), for what no retirement explains (a
    /// generation ahead of the slot's, a slot leased but never sent at it).
    pub fn hold_retirable(
        &self,
        slot: u32,
        generation: u64,
        bit: u64,
    ) -> Result<Option<SlotRef>, Corrupted> {
        self.hold(slot, generation, bit, true)
    }

    fn hold(
        &self,
        slot: u32,
        generation: u64,
        bit: u64,
        lagging: bool,
    ) -> Result<Option<SlotRef>, Corrupted> {
        let record = self
            .records
            .get(slot as usize)
            .ok_or(Corrupted { what: "descriptor names a slot out of range" })?;
        let stale = Corrupted { what: "descriptor carries a stale slot generation" };
        let generation = u32::try_from(generation).map_err(|_| stale)?;
        // The bit first, then the state in the same line, now this core's: one transfer of
        // the line from the sender, not two (a read, then an upgrade for the write).
        // Relaxed: ordered before our cursor's Release store (see the module docs).
        if record.holders.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
            return Err(Corrupted { what: "a reader was handed the same slot twice" });
        }
        if lagging {
            // SeqCst: our bit before the state load, against a retiring sender's state CAS
            // before its fence and its `holders` load (`retire`): one of us sees the other.
            fence(Ordering::SeqCst);
        }
        // Relaxed: the descriptor ring's Acquire read published the sender's SENT store;
        // the slot cannot be leased again before our cursor passes the message (blocking
        // channels), or before the sender has seen our bit clear (lagging ones: above).
        let (now, state) = unpack(record.state.load(Ordering::Relaxed));
        if now == generation && state == SENT {
            return Ok(Some(SlotRef { slot, generation }));
        }
        // Not ours to hold: the bit goes again. Relaxed: nothing was read under it.
        record.holders.fetch_and(!bit, Ordering::Relaxed);
        // Retired: going back (`RETURNING` at its generation), or leased since (a later one).
        let later = now.wrapping_sub(generation);
        if lagging && ((later == 0 && state == RETURNING) || (1..=u32::MAX / 2).contains(&later)) {
            return Ok(None);
        }
        Err(if now != generation {
            stale
        } else {
            Corrupted { what: "descriptor names a slot that is not in flight" }
        })
    }

    /// Lagging channels: retires the sent slot nobody holds whose message went out first
    /// (the lowest `sent_at` below `next`, the ring position the sender writes next) and puts
    /// it on the free ring, whatever the cursors say; whether one went.
    pub fn retire_oldest(&self, next: u64) -> bool {
        // A reader may take its hold on the one chosen meanwhile (or, missing it, set and
        // clear its bit): then the next oldest, while there is one (bounded, against a
        // peer that scribbles bits).
        for _ in 0..self.slot_count().saturating_mul(4).max(64) {
            let oldest = self
                .records
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    // Relaxed: a choice; `retire` decides.
                    unpack(r.state.load(Ordering::Relaxed)).1 == SENT
                        && r.holders.load(Ordering::Relaxed) == 0
                })
                // Relaxed: as above (the sender wrote it).
                .max_by_key(|(_, r)| next.wrapping_sub(r.sent_at.load(Ordering::Relaxed)));
            match oldest {
                None => return false,
                Some((slot, _)) if self.retire(slot as u32) => return true,
                Some(_) => {}
            }
        }
        false
    }

    /// Retires sent slot `slot` if no reader holds it (module docs); whether it did.
    fn retire(&self, slot: u32) -> bool {
        let Some(record) = self.records.get(slot as usize) else {
            return false;
        };
        // Relaxed: the CAS below decides.
        let sent = record.state.load(Ordering::Relaxed);
        let (generation, state) = unpack(sent);
        let going = pack(generation, by(RETURNING, self.me()));
        // SeqCst: as `give_back`'s (against `all_free`); the fence below orders it before
        // the `holders` load.
        if state != SENT
            || record
                .state
                .compare_exchange(sent, going, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        // SeqCst: pairs with the fence of a reader's `hold` (between its bit and its state
        // load): either it sees `going`, or we see its bit.
        fence(Ordering::SeqCst);
        // Acquire: pairs with the Release clears of readers done with the slot.
        if record.holders.load(Ordering::Acquire) != 0 {
            // Held: it stays. Relaxed: nobody rewrote the slot; a reader that saw `going`
            // meanwhile counted the message as missed.
            let _ =
                record.state.compare_exchange(going, sent, Ordering::Relaxed, Ordering::Relaxed);
            return false;
        }
        crate::fault::point("retire_marked");
        self.push_free(slot)
    }

    /// Drops reader `bit`'s hold on `held`; the holders left (`None`: it held none, a
    /// forged record).
    pub fn release_shared(&self, held: SlotRef, bit: u64) -> Option<u64> {
        let record = self.records.get(held.slot as usize)?;
        // Release: pairs with the Acquire load in `reclaim_sent` (our reads are done).
        let before = record.holders.fetch_and(!bit, Ordering::Release);
        (before & bit != 0).then_some(before & !bit)
    }

    /// Drops reader `bit`'s hold on `held` and, if it was the last holder, puts the slot
    /// back when every cursor is past its message (`min` computes their lower bound:
    /// `ring::broadcast::slowest_now`). Whether the slot went back.
    pub fn release_shared_then_reclaim(
        &self,
        held: SlotRef,
        bit: u64,
        min: impl FnOnce() -> u64,
    ) -> bool {
        self.release_shared(held, bit) == Some(0) && self.reclaim_sent(held.slot, min())
    }

    /// Puts sent slot `slot` back on the free ring if its message is done with: every
    /// counted cursor is at or above `min` (from `ring::broadcast::slowest_now`, or the
    /// sender's own minimum) and past the message, and nobody holds it. Whether it did.
    pub fn reclaim_sent(&self, slot: u32, min: u64) -> bool {
        let Some(record) = self.records.get(slot as usize) else {
            return false;
        };
        // Relaxed: the CAS in `give_back` decides; `sent_at` was published with the state.
        let word = record.state.load(Ordering::Relaxed);
        let (generation, state) = unpack(word);
        // Relaxed: see above.
        if state != SENT || !passed(record.sent_at.load(Ordering::Relaxed), min) {
            return false;
        }
        // Acquire: pairs with the readers' Release clears in `release_shared`.
        if record.holders.load(Ordering::Acquire) != 0 {
            return false;
        }
        self.give_back(SlotRef { slot, generation }, SENT)
    }

    /// [`reclaim_sent`](Self::reclaim_sent) for every slot; how many went back.
    pub fn reclaim_all_sent(&self, min: u64) -> u32 {
        (0..self.slot_count()).map(|slot| u32::from(self.reclaim_sent(slot, min))).sum()
    }

    /// Clears reader `index`'s holds on every slot (it died: its place is locked meanwhile,
    /// so no new reader sets that bit).
    pub fn clear_holder(&self, index: usize) {
        for r in self.records.iter() {
            // Release: as the reader's own clear.
            r.holders.fetch_and(!(1 << index), Ordering::Release);
        }
    }

    /// Every reader holding some slot (bit `i`: reader `i`).
    pub fn holders(&self) -> u64 {
        // Relaxed: which places to look at; each is settled under its lock.
        self.records.iter().fold(0, |m, r| m | r.holders.load(Ordering::Relaxed))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::pool::heap_pool;

    #[test]
    fn a_slot_comes_back_once_every_reader_dropped_it_and_every_cursor_passed() {
        let pool = heap_pool(2);
        let core = &pool;
        let lease = core.try_lease().unwrap().unwrap();
        core.set_sent_at(lease, 5);
        core.mark_sent(lease);
        let a = core.hold_shared(lease.slot, lease.generation.into(), 1).unwrap();
        let b = core.hold_shared(lease.slot, lease.generation.into(), 4).unwrap();
        assert!(core.hold_shared(lease.slot, lease.generation.into(), 4).is_err(), "twice");
        assert!(!core.reclaim_sent(lease.slot, 6), "held by two");
        assert_eq!(core.release_shared(a, 1), Some(4));
        assert_eq!(core.release_shared(a, 1), None, "released twice");
        assert!(!core.reclaim_sent(lease.slot, 6), "held by one");
        assert_eq!(core.release_shared(b, 4), Some(0));
        assert!(!core.reclaim_sent(lease.slot, 5), "a cursor still at the message");
        assert_eq!(core.free_slots(), 1);
        assert!(core.reclaim_sent(lease.slot, 6));
        assert!(!core.reclaim_sent(lease.slot, 6), "once");
        assert_eq!(core.free_slots(), 2);
    }

    #[test]
    fn retiring_takes_the_oldest_unheld_message_and_its_reader_is_told() {
        let pool = heap_pool(3);
        let core = &pool;
        let sent: Vec<_> = (0..3)
            .map(|pos| {
                let lease = core.try_lease().unwrap().unwrap();
                core.set_sent_at(lease, pos);
                core.mark_sent(lease);
                lease
            })
            .collect();
        let g = |i: usize| u64::from(sent[i].generation);
        // Reader 1 holds message 0: the oldest unheld one, message 1, goes.
        let held = core.hold_retirable(sent[0].slot, g(0), 2).unwrap().expect("held");
        assert!(core.retire_oldest(3));
        assert_eq!(core.free_slots(), 1);
        assert_eq!(core.hold_retirable(sent[1].slot, g(1), 1), Ok(None), "retired: missed");
        let again = core.try_lease().unwrap().unwrap();
        assert_eq!(again.slot, sent[1].slot);
        assert_eq!(core.hold_retirable(sent[1].slot, g(1), 1), Ok(None), "leased again: missed");
        assert!(core.hold_retirable(sent[1].slot, g(1) + 1, 1).is_err(), "never sent at it");
        assert!(core.hold_retirable(sent[2].slot, g(2) + 1, 1).is_err(), "a generation ahead");
        assert!(core.hold_shared(sent[2].slot, g(2) - 1, 1).is_err(), "blocking: no retirement");
        // Held messages never go; the next unheld one does.
        assert!(core.retire_oldest(3));
        assert_eq!(core.hold_retirable(sent[2].slot, g(2), 1), Ok(None));
        assert!(!core.retire_oldest(3), "only a held message is left");
        assert_eq!(core.release_shared(held, 2), Some(0));
        assert!(core.retire_oldest(3));
        assert_eq!(core.holders(), 0, "every bit of a refused hold went again");
    }

    #[test]
    fn a_dead_readers_holds_are_cleared() {
        let pool = heap_pool(2);
        let core = &pool;
        let lease = core.try_lease().unwrap().unwrap();
        core.set_sent_at(lease, 0);
        core.mark_sent(lease);
        core.hold_shared(lease.slot, lease.generation.into(), 1 << 3).unwrap();
        assert_eq!(core.holders(), 1 << 3);
        assert_eq!(core.reclaim_all_sent(1), 0);
        core.clear_holder(3);
        assert_eq!(core.reclaim_all_sent(1), 1);
        assert!(core.hold_shared(lease.slot, lease.generation.into(), 1).is_err(), "not sent");
    }
}
