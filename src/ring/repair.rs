//! Repairs of MPMC cells whose winner died.
//!
//! An endpoint that wins a cell and dies before stamping it would stall the ring there for
//! ever: a producer's unwritten cell looks empty to every consumer, a consumer's unfreed
//! cell looks full to every producer a lap later. Two things let others finish such cells:
//!
//! - **Reservations.** The winner of a position reserves its cell before touching it (see
//!   [`MpmcCell`]: `p | STAMP_WRITING`, `(p + 1) | STAMP_READING`). A won cell that is not
//!   reserved has not been touched, so anyone may take it away: a winner that was merely
//!   slow fails its reservation and tries again (a producer pushes at a later position, a
//!   consumer leaves the cell to the one that took it). This covers the winner that dies
//!   between its winning compare-and-swap and its claim store, which no claim can name.
//! - **Claims.** Storage that tracks its endpoints (rings in shared memory) gives each a
//!   [`Claims`] line, where it records every run of positions it wins, right after winning
//!   and before reserving any cell. A reserved cell is finished by another endpoint only
//!   when a dead endpoint's claim names it.
//!
//! Every liveness tick, a blocked endpoint:
//! - stamps a producer's unwritten cell *skipped*, `(p + 1) | STAMP_SKIPPED` ([`repair`];
//!   producers and consumers both do): unreserved, or reserved by a dead claimant.
//!   Consumers pass it, freeing it, without returning anything (nothing was published
//!   there, so nothing published is lost, and every producer's order is unchanged);
//! - adopts a consumer's unfreed cell (consumers only), unreserved or reserved by a dead
//!   claimant: `| STAMP_ADOPTED`, read the element, run the consumer's work on it, free the
//!   cell. Consumers run their work before freeing a cell (`Consumer::pop_then_until`), so
//!   a dead one never returned the element, and it arrives exactly once, later than the
//!   elements behind it. A consumer's blocking wait, which adopts at its ticks, is written
//!   here (`Consumer::pop_then_ticking`).
//!
//! Each is a compare-and-swap from the exact stalled stamp, so it can only ever replace a
//! stamp that the winner would have written or reserved. What is not covered: two threads
//! sharing one endpoint (a clone of a handle) whose process dies with both holding reserved
//! cells (the later claim overwrote the earlier); a consumer that dies while adopting.
//! Those cells stay stalled.

use bytemuck::Pod;

use super::mpmc::{Consumer, Producer, try_pop_in};
use super::{PopTimeoutError, Storage, cell_at, wait_for};
use crate::layout::{
    Claims, Corrupted, MpmcCell, RingControl, STAMP_ADOPTED, STAMP_FLAGS, STAMP_READING,
    STAMP_SKIPPED, STAMP_WRITING,
};
use crate::liveness::{Role, Tick, Watch};
use crate::sync::{AtomicU64, Ordering};
use crate::wait::{Deadline, notify};
use std::sync::atomic::Ordering::Relaxed;

/// How far one repair or adoption looks (from `head`, or from the oldest cell producers
/// wait for).
pub(super) const REPAIR_SCAN: u64 = 64;

/// Adopts the elements of up to `max` cells whose consumer won them and died before
/// freeing them: takes each cell (stamp `| STAMP_ADOPTED`, a CAS from the exact stalled
/// stamp), runs `each` on its element, frees the cell. Looks at the first [`REPAIR_SCAN`]
/// positions from `tail - capacity` below `head`. Returns how many elements `each` saw (a
/// skipped cell among them is freed and not counted).
pub(super) fn try_adopt_in<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    max: usize,
    mut each: impl FnMut(T),
) -> usize {
    let control = storage.control();
    // Relaxed: a window to look at; the stamp CAS decides. The two loads are not one
    // snapshot: while others push and pop, the window can look impossible (head moved on
    // between the loads). That is no evidence of corruption (the operations themselves
    // check the positions), so this only gives up until the next tick.
    let tail = control.tail.load(Ordering::Relaxed);
    let head = control.head.load(Ordering::Relaxed);
    if tail.wrapping_sub(head) > capacity || (tail | head) & STAMP_FLAGS != 0 {
        return 0;
    }
    let oldest = tail.saturating_sub(capacity);
    let mut seen = 0;
    for pos in (0..(head - oldest).min(REPAIR_SCAN)).map(|i| oldest + i) {
        if seen == max {
            break;
        }
        let cell = cell_at(storage, capacity, pos);
        // Relaxed: a candidate; the CAS below decides.
        let raw = cell.stamp.load(Ordering::Relaxed);
        let won = pos.wrapping_add(1);
        // Below `head`, so won by a consumer: unreserved (its winner has not got to it, or
        // died before recording its claim: a live one fails its reservation and tries
        // again), or reserved by a winner that is dead.
        let orphaned = match raw & !STAMP_SKIPPED {
            stamp if stamp == won => true,
            stamp if stamp == won | STAMP_READING => {
                storage.watch().claimant_dead(Role::Consumer, pos)
            }
            _ => false,
        };
        if !orphaned {
            continue;
        }
        // Acquire on success: pairs with the producer's Release stamp store (the element's
        // bytes are visible). The flag keeps producers out (the cell is not free) and every
        // other adopter (the stamp is no longer the stalled one).
        if cell
            .stamp
            .compare_exchange(raw, raw | STAMP_ADOPTED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        if let Some(claims) = storage.watch().claims() {
            // Relaxed: as in `claim_run`.
            claims.pop.store(Claims::word(pos, 1), Ordering::Relaxed);
        }
        if raw & STAMP_SKIPPED == 0 {
            // SAFETY: the CAS made this consumer the cell's only user: its winner is dead,
            // producers wait for the free below, other adopters saw the stamp change.
            // `T: Pod`: any bytes form a valid `T`.
            each(cell.value.with(|p| unsafe { p.read() }));
            seen += 1;
        }
        // Release: pairs with the producer's Acquire stamp load in `ready_run`.
        cell.stamp.store(pos.wrapping_add(capacity), Ordering::Release);
        notify(&control.not_full);
    }
    seen
}

/// Stamps the cell of position `pos` skipped if it still holds `stamp == pos`: won (the
/// caller knows `pos` is below `tail`) and not reserved by its producer, which then fails
/// its reservation and pushes again, having written nothing. Any endpoint may do it.
/// Returns whether it did.
pub(crate) fn skip_unreserved(stamp: &AtomicU64, pos: u64) -> bool {
    // Release on success: pairs with the consumer's Acquire stamp load in `ready_run`
    // (nothing is published with it; the consumer only learns the cell is passable).
    stamp
        .compare_exchange(
            pos,
            pos.wrapping_add(1) | STAMP_SKIPPED,
            Ordering::Release,
            Ordering::Relaxed,
        )
        .is_ok()
}

/// Stamps the cell of position `pos` skipped if its producer never published it, reserved
/// (`pos | STAMP_WRITING`) or not (`pos`). Call only once that producer is known dead (see
/// "Repair" above). Returns whether it did.
pub(crate) fn skip_unwritten(stamp: &AtomicU64, pos: u64) -> bool {
    // Release on success: as in `skip_unreserved`.
    skip_unreserved(stamp, pos)
        || stamp
            .compare_exchange(
                pos | STAMP_WRITING,
                pos.wrapping_add(1) | STAMP_SKIPPED,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
}

/// Skips the cells that stall an MPMC ring because the producer that won them died before
/// writing them (see the module docs): among the first `REPAIR_SCAN` (64) positions from
/// `head`, each still stamped unwritten whose winner the storage's
/// [`Watch::claimant_dead`] says is dead. Wakes consumers if it skipped any; returns how
/// many. Not for the fast path: it reads up to 64 stamps and may probe locks. Blocked
/// endpoints run it every liveness tick.
pub fn repair<T: Pod, S: Storage<Cell = MpmcCell<T>>>(storage: &S) -> u32 {
    let control = storage.control();
    let capacity = storage.cells().len() as u64;
    // Relaxed: a window to look at; every repair is a CAS on a stamp, which decides.
    let tail = control.tail.load(Ordering::Relaxed);
    let head = control.head.load(Ordering::Relaxed);
    let queued = tail.wrapping_sub(head);
    if queued > capacity || (tail | head) & STAMP_FLAGS != 0 {
        // Not one snapshot: head may have moved on between the loads (or the positions
        // are forged, which the operations report). Look again next tick.
        return 0;
    }
    let mut skipped = 0;
    // Positions won by producers (below `tail`) and not yet written: stamp == pos, not
    // reserved (any winner: a live one fails its reservation and pushes again), or
    // `pos | STAMP_WRITING` by a winner that is dead.
    for pos in (0..queued.min(REPAIR_SCAN)).map(|i| head.wrapping_add(i)) {
        let stamp = &cell_at(storage, capacity, pos).stamp;
        // Relaxed: a candidate; the CASes decide.
        let raw = stamp.load(Ordering::Relaxed);
        let stalled = (raw == pos && skip_unreserved(stamp, pos))
            || (raw == pos | STAMP_WRITING
                && storage.watch().claimant_dead(Role::Producer, pos)
                && skip_unwritten(stamp, pos));
        skipped += u32::from(stalled);
    }
    if skipped > 0 {
        notify(&control.not_empty);
    }
    skipped
}

impl<T: Pod, S: Storage<Cell = MpmcCell<T>>> Producer<T, S> {
    /// Whether an element still in a cell (published and not yet freed: queued, being
    /// popped, or adopted) satisfies `pred` (see [`any_unfreed_in`]).
    #[cfg_attr(loom, allow(dead_code))] // used by pools in shared memory
    pub(crate) fn any_unfreed(&self, pred: impl FnMut(&T) -> bool) -> bool {
        any_unfreed_in(self.storage.control(), self.storage.cells(), pred)
    }
}

/// Whether an element still in one of `cells` (published and not yet freed: queued, being
/// popped, or adopted) satisfies `pred`. Reads up to `capacity` cells: for slow paths only.
/// Each value is read seqlock-style: used only if its cell's stamp is the same after the
/// read as before (a cell freed and rewritten meanwhile is skipped), so anyone may ask.
#[cfg_attr(loom, allow(dead_code))] // used by channels and pools, which loom builds leave out
pub(crate) fn any_unfreed_in<T: Pod>(
    control: &RingControl,
    cells: &[MpmcCell<T>],
    mut pred: impl FnMut(&T) -> bool,
) -> bool {
    let capacity = cells.len() as u64;
    // Relaxed: a window to look at; each cell's stamp decides.
    let tail = control.tail.load(Ordering::Relaxed);
    let oldest = tail.saturating_sub(capacity);
    (oldest..tail).any(|pos| {
        let cell = &cells[(pos & (capacity - 1)) as usize];
        // Acquire: pairs with the producer's Release stamp store (the value is there).
        let before = cell.stamp.load(Ordering::Acquire);
        if before & !STAMP_FLAGS != pos.wrapping_add(1) || before & STAMP_SKIPPED != 0 {
            return false;
        }
        // SAFETY: a volatile read of a `Pod` (any bytes are a valid `T`) inside `cells`. A
        // producer may rewrite the cell if it is freed meanwhile; the stamp check below then
        // discards what was read.
        let value = cell.value.with(|p| unsafe { p.read_volatile() });
        // Acquire: orders the read above before this load (a later free and rewrite shows
        // as a changed stamp).
        crate::sync::fence(Ordering::Acquire);
        let after = cell.stamp.load(Ordering::Relaxed);
        before == after && pred(&value)
    })
}

impl<T: Pod, S: Storage<Cell = MpmcCell<T>>> Consumer<T, S> {
    /// As [`pop_then_until`](Self::pop_then_until); at each liveness tick, after this
    /// ring's own repairs, runs `tick` too (a pool's sender takes back the slots of dead
    /// receivers there; a channel receiver takes over the messages of dead ones), and ends
    /// the wait with what it gives (`Tick::Done`), looks again at once when it says it
    /// changed something (`Tick::Retry`), or ends the wait when it says the pop cannot
    /// succeed (`Tick::Stop`).
    #[cfg_attr(loom, allow(dead_code))] // used by pools in shared memory
    pub(crate) fn pop_then_ticking<R>(
        &self,
        deadline: Deadline,
        then: impl FnOnce(T) -> R,
        mut tick: impl FnMut() -> Tick<R>,
    ) -> Result<R, PopTimeoutError> {
        // `then` runs once: only a successful pop or adoption calls it, and that ends the
        // wait.
        let then = std::cell::Cell::new(Some(then));
        let run = |v| then.take().map(|f| f(v));
        // One adoption; remembers whether it found one (see `adopting`).
        let adopt_one = || {
            let mut r = None;
            try_adopt_in(&self.storage, self.capacity, 1, |v| r = Some(run(v)));
            // Relaxed: a hint local to this handle.
            self.adopting.store(r.is_some(), Relaxed);
            r
        };
        self.block_pop(
            deadline,
            || {
                let mut r = None;
                let popped = try_pop_in(&self.storage, self.capacity, 1, |v| r = Some(run(v)))?;
                // Relaxed: as in `adopt_one`.
                if popped.is_none() && self.adopting.load(Relaxed) {
                    return Ok(adopt_one());
                }
                Ok(popped.and(r))
            },
            || match adopt_one() {
                Some(r) => Tick::Done(r),
                None => match tick() {
                    Tick::Done(r) => Tick::Done(Some(r)),
                    Tick::Retry => Tick::Retry,
                    Tick::Idle => Tick::Idle,
                    Tick::Stop(why) => Tick::Stop(why),
                },
            },
        )
        .map(|r| r.expect("then runs on the one successful pop"))
    }

    /// Waits as the [`WaitPolicy`] says until `attempt` gives something, running the
    /// producer-side repair and then `adopt` at every liveness tick.
    pub(super) fn block_pop<R>(
        &self,
        deadline: Deadline,
        attempt: impl FnMut() -> Result<Option<R>, Corrupted>,
        mut adopt: impl FnMut() -> Tick<R>,
    ) -> Result<R, PopTimeoutError> {
        let on_tick = || {
            repair(&self.storage);
            adopt()
        };
        wait_for(&self.storage, Role::Consumer, self.policy, deadline, attempt, on_tick)
            .map_err(PopTimeoutError::from)
    }

    /// Takes the element of a cell whose consumer died before freeing it, running `then`
    /// on it; `None` when there is none. Blocking pops call this every liveness tick; it
    /// probes locks, so it is not for the fast path.
    pub fn try_adopt_then<R>(&self, then: impl FnOnce(T) -> R) -> Option<R> {
        let mut then = Some(then);
        let mut r = None;
        try_adopt_in(&self.storage, self.capacity, 1, |v| r = then.take().map(|f| f(v)));
        r
    }
}
