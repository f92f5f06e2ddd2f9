//! Repairs of MPMC cells whose winner died.
//!
//! An endpoint that wins a cell and dies before stamping it would stall the ring there for
//! ever: a producer's unwritten cell looks empty to every consumer, a consumer's unfreed
//! cell looks full to every producer a lap later. Storage that tracks its endpoints (rings
//! in shared memory) gives each a claim line ([`ClaimLine`](crate::liveness::ClaimLine)),
//! where it names every run of positions it is about to win, before its compare-and-swap,
//! and keeps that line (its clones take turns with it) until the run is finished. So an
//! unfinished cell that a dead endpoint's line names and no live one's does
//! ([`Watch::orphaned`]) will never be finished by its winner.
//!
//! Every liveness tick, a blocked endpoint:
//! - stamps such a producer's unwritten cell *skipped*, `(p + 1) | STAMP_SKIPPED`
//!   ([`repair`]; producers and consumers both do). Consumers pass it, freeing it,
//!   without returning anything (nothing was published there, so nothing published is
//!   lost, and every producer's order is unchanged);
//! - adopts such a consumer's unfreed cell (consumers only): `| STAMP_ADOPTED`, read the
//!   element, run the consumer's work on it, free the cell. Consumers run their work
//!   before freeing a cell (`Consumer::pop_then_until`), so a dead one never returned the
//!   element, and it arrives exactly once, later than the elements behind it. An adopter
//!   names the cell in its own claim line first, so an adopter that dies before freeing
//!   the cell leaves it to the next one in turn (`adopt_cell`). A consumer's blocking
//!   wait, which adopts at its ticks, is written here (`Consumer::pop_then_ticking`).
//!
//! Each is a compare-and-swap from the exact stalled stamp, so it can only ever replace a
//! stamp that the winner would have written (stamps only grow: a finished cell never
//! shows the stalled stamp again). The position counter is read with Acquire before the
//! lines: it pairs with the winners' Release CASes, so the claim a live winner stored
//! before its CAS is seen.

use bytemuck::Pod;

use super::mpmc::{Consumer, Producer, try_pop_in};
use super::{PopTimeoutError, Storage, cell_at, wait_for};
use crate::layout::{
    Claims, Corrupted, MpmcCell, RingControl, STAMP_ADOPTED, STAMP_FLAGS, STAMP_SKIPPED,
};
use crate::liveness::{ClaimLine, Role, Tick, Watch};
use crate::sync::{AtomicU64, Ordering};
use crate::wait::{Deadline, notify};
use std::sync::atomic::Ordering::Relaxed;

/// How far one repair or adoption looks (from `head`, or from the oldest cell producers
/// wait for).
pub(super) const REPAIR_SCAN: u64 = 64;

/// Adopts the elements of up to `max` cells whose consumer won them and died before
/// freeing them, or whose adopter died before freeing them: takes each cell
/// ([`adopt_cell`]), runs `each` on its element, frees the cell. Looks at the first
/// [`REPAIR_SCAN`] positions from `tail - capacity` below `head`. Returns how many elements
/// `each` saw (a skipped cell among them is freed and not counted).
pub(super) fn try_adopt_in<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    max: usize,
    mut each: impl FnMut(T),
) -> usize {
    let control = storage.control();
    // Relaxed for `tail`: a bound for the window. Acquire for `head`: pairs with the
    // Release CASes of the consumers that moved it, so the claim a live winner of a cell
    // below it stored before its CAS is seen by `orphaned_but_mine`. The two loads are not
    // one snapshot: while others push and pop, the window can look impossible (head moved
    // on between the loads). That is no evidence of corruption (the operations themselves
    // check the positions), so this only gives up until the next tick.
    let tail = control.tail.load(Ordering::Relaxed);
    let head = control.head.load(Ordering::Acquire);
    let Some(line) = storage.watch().claims() else { return 0 };
    if tail.wrapping_sub(head) > capacity || (tail | head) & STAMP_FLAGS != 0 {
        return 0;
    }
    // Held across every adoption: no clone of this endpoint is mid-run while its line
    // names a cell it adopts, so that line can be left out of the check (`adopt_cell`).
    let _turn = line.lock.lock();
    let oldest = tail.saturating_sub(capacity);
    let mut seen = 0;
    for pos in (0..(head - oldest).min(REPAIR_SCAN)).map(|i| oldest + i) {
        if seen == max {
            break;
        }
        let cell = cell_at(storage, capacity, pos);
        // Relaxed: a candidate (below `head`, so won by a consumer, and not yet freed);
        // `adopt_cell` looks again after its claim.
        if cell.stamp.load(Ordering::Relaxed) & !ADOPTABLE != pos.wrapping_add(1) {
            continue;
        }
        let Some(raw) = adopt_cell(storage, line, cell, pos) else { continue };
        crate::fault::point("adopt_won");
        let adopted = raw | STAMP_ADOPTED;
        if raw & STAMP_SKIPPED == 0 {
            // `adopt_cell` made this consumer the cell's only user: its winner and any
            // earlier adopter are dead, producers wait for the free below, and every other
            // adopter sees this one's claim (or its stamp) and leaves the cell alone. Read
            // volatile, seqlock-style: should the winner not be dead after all (judged
            // done with its code a moment early), it may free the cell and a producer
            // rewrite it meanwhile, which the stamp check below sees (the value is dropped).
            // SAFETY: a read inside the cell array of a `Pod` (any bytes form a valid `T`).
            let value = cell.value.with(|p| unsafe { p.read_volatile() });
            // Acquire: orders the read above before the stamp load below.
            crate::sync::fence(Ordering::Acquire);
            // Relaxed: after the fence; only our own stamp says the value is the element.
            if cell.stamp.load(Ordering::Relaxed) != adopted {
                continue; // freed by its winner, which delivered it: nothing to free
            }
            each(value);
            seen += 1;
        }
        // Release: pairs with the producer's Acquire stamp load in `ready_run`. A CAS from
        // our own stamp: a winner alive after all that freed the cell is not undone.
        let freed = pos.wrapping_add(capacity);
        let _ = cell.stamp.compare_exchange(adopted, freed, Ordering::Release, Ordering::Relaxed);
        notify(&control.not_full);
    }
    seen
}

/// The flags a consumer cell that is won and not yet freed may carry: skipped by a repair,
/// adopted by a consumer that may since have died.
const ADOPTABLE: u64 = STAMP_SKIPPED | STAMP_ADOPTED;

/// Takes the unfreed cell `cell` at position `pos` (below `head`) for this consumer if
/// nobody alive will finish it: its winner died, and any adopter since died too. Returns the
/// stamp it found (with `STAMP_SKIPPED` if the cell was skipped), or `None`, leaving the
/// cell alone and the line cleared. The caller holds `line`'s lock.
///
/// The protocol, for each adopter: name `pos` in its own line, a SeqCst fence, then read
/// the stamp and the other lines, and take the cell (a CAS from the stamp it read, setting
/// `STAMP_ADOPTED`) only if a dead line names it and no live one does. Of two adopters, the
/// one whose fence comes later in the SeqCst order sees the other's claim (stored before
/// the other's fence) and leaves the cell; so while an adopter lives, nobody else takes its
/// cell, and once it dies (its line dead, naming the cell), the next one can: an adopter
/// killed mid-adoption stalls nothing. The CAS also fails if the cell was freed meanwhile
/// (stamps only grow).
fn adopt_cell<T, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    line: ClaimLine<'_>,
    cell: &MpmcCell<T>,
    pos: u64,
) -> Option<u64> {
    // Relaxed: the fence below orders it before this adopter's loads.
    line.line.pop.store(Claims::word(pos, 1), Ordering::Relaxed);
    // SeqCst: pairs with the same fence of every other adopter (see above).
    crate::sync::fence(Ordering::SeqCst);
    // Acquire: pairs with the producer's Release stamp store (the element is visible) and
    // with an earlier adopter's Release CAS below.
    let raw = cell.stamp.load(Ordering::Acquire);
    let taken = raw & !ADOPTABLE == pos.wrapping_add(1)
        && storage.watch().orphaned_but_mine(pos)
        // AcqRel: acquires as the load above; releases this claim to later adopters.
        && cell
            .stamp
            .compare_exchange(raw, raw | STAMP_ADOPTED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
    if !taken {
        // Relaxed: clearing a word that names no cell of ours is never unsafe (and a
        // claim left here would keep the cell from the next adopter while we live).
        line.line.pop.store(0, Ordering::Relaxed);
    }
    taken.then_some(raw)
}

/// Stamps the cell of position `pos` skipped if its producer never published it (stamp
/// `pos`). Call only once that producer is known dead (see the module docs). Returns
/// whether it did.
pub(crate) fn skip_unwritten(stamp: &AtomicU64, pos: u64) -> bool {
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

/// Skips the cells that stall an MPMC ring because the producer that won them died before
/// writing them (see the module docs): among the first `REPAIR_SCAN` (64) positions from
/// `head`, each still stamped unwritten that the storage's [`Watch::orphaned`] says a
/// dead endpoint won. Wakes consumers if it skipped any; returns how
/// many. Not for the fast path: it reads up to 64 stamps and may probe locks. Blocked
/// endpoints run it every liveness tick.
pub fn repair<T: Pod, S: Storage<Cell = MpmcCell<T>>>(storage: &S) -> u32 {
    let control = storage.control();
    let capacity = storage.cells().len() as u64;
    // Acquire for `tail`: pairs with the Release CASes of the producers that moved it, so
    // the claim a live winner of a cell below it stored before its CAS is seen by
    // `orphaned`. Relaxed for `head`: a bound; every repair is a CAS on a stamp.
    let tail = control.tail.load(Ordering::Acquire);
    let head = control.head.load(Ordering::Relaxed);
    let queued = tail.wrapping_sub(head);
    if queued > capacity || (tail | head) & STAMP_FLAGS != 0 {
        // Not one snapshot: head may have moved on between the loads (or the positions
        // are forged, which the operations report). Look again next tick.
        return 0;
    }
    let mut skipped = 0;
    // Positions won by producers (below `tail`) and not yet written (stamp == pos), by a
    // winner that is dead.
    for pos in (0..queued.min(REPAIR_SCAN)).map(|i| head.wrapping_add(i)) {
        let stamp = &cell_at(storage, capacity, pos).stamp;
        // Relaxed: a candidate; the CAS decides.
        let stalled = stamp.load(Ordering::Relaxed) == pos
            && storage.watch().orphaned(Role::Producer, pos)
            && skip_unwritten(stamp, pos);
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
        wait_for(&self.storage, Role::Consumer, &self.policy, deadline, attempt, on_tick)
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
