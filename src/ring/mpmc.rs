//! Bounded multi-producer multi-consumer ring with a stamp per cell.
//!
//! Producers race for `tail` and consumers for `head` with compare-and-swap. A cell's stamp
//! says whose turn it is (see [`MpmcCell`]): for position `p`, stamp `p` means "free for
//! the producer of `p`", `p + 1` means "written, for the consumer of `p`", and the consumer
//! sets `p + capacity` to free the cell for the next lap. A winner of the CAS owns the cell
//! until it stores the next stamp, so the element copy needs no further synchronisation.
//!
//! Order: elements leave in the order their producers won `tail`, so each producer's own
//! elements stay in order.
//!
//! Checks on shared values: a stamp more than one lap behind its position, or ahead of it
//! while the position counter has not moved, cannot happen in a healthy ring and is
//! [`Corrupted`]; so is a position at or above 2^62 (the stamps' flag bits).
//!
//! # Repair
//!
//! An endpoint that wins a cell and dies before stamping it would stall the ring there for
//! ever: a producer's unwritten cell looks empty to every consumer, a consumer's unfreed
//! cell looks full to every producer a lap later. Storage that tracks its endpoints (named
//! rings) gives each endpoint a [`Claims`](crate::layout::Claims) line, where it records
//! every position it wins, right after winning the compare-and-swap and before touching the
//! cell. A word names a position only if its endpoint won it, so when the cell at that
//! position is still unfinished and the endpoint is dead, nobody else will finish it. Every
//! liveness tick, a blocked endpoint:
//! - stamps a dead producer's unwritten cell *skipped*, `(p + 1) | STAMP_SKIPPED`
//!   ([`repair`]; producers and consumers both do): consumers pass it, freeing it, without
//!   returning anything (nothing was published there, so nothing published is lost, and
//!   every producer's order is unchanged);
//! - adopts a dead consumer's unfreed cell (consumers only): `| STAMP_ADOPTED`, read the
//!   element, run the consumer's work on it, free the cell. Consumers run their work before
//!   freeing a cell ([`Consumer::pop_then`]), so the dead one never returned the element,
//!   and it arrives exactly once, later than the elements behind it.
//!
//! Each is a compare-and-swap from the exact stalled stamp, so it can only ever replace a
//! stamp that the dead winner would have written. What is not covered: an endpoint killed
//! in the two instructions between its winning CAS and its claim store; two threads sharing
//! one endpoint (a clone of a handle) whose process dies with both mid-operation (the later
//! claim overwrote the earlier); a consumer that dies while adopting. Those cells stay
//! stalled.

use std::marker::PhantomData;
use std::time::Duration;

use bytemuck::Pod;

use super::{
    Corrupted, Hints, PopError, PushError, Side, Storage, TryPopError, TryPushError, block_on,
    cell_at, deadline_after, demote,
};
use crate::layout::{MpmcCell, STAMP_ADOPTED, STAMP_FLAGS, STAMP_SKIPPED};
use crate::sync::{AtomicU64, Ordering, spin_hint};
use crate::wait::{WaitPolicy, barrier_mode, notify};

/// An in-process MPMC ring of `capacity` elements (a power of two) on the heap. Clone the
/// handles for more producers or consumers.
///
/// ```
/// let (tx, rx) = gpuring::ring::mpmc::with_capacity::<u64>(8);
/// let tx2 = tx.clone();
/// tx.try_push(1).unwrap();
/// tx2.try_push(2).unwrap();
/// assert_eq!((rx.try_pop().unwrap(), rx.try_pop().unwrap()), (1, 2));
/// ```
///
/// # Panics
///
/// If `capacity` is not a power of two in `2..=2^24` (one cell cannot tell full from
/// empty in this algorithm).
pub fn with_capacity<T: Pod + Send>(capacity: usize) -> (HeapProducer<T>, HeapConsumer<T>) {
    assert!(capacity >= 2, "an MPMC ring needs at least 2 cells, got {capacity}");
    let storage = super::Heap::new(capacity, |i| MpmcCell::new(i as u64));
    let tx = Producer::new(storage.clone()).expect("a new ring is consistent");
    let rx = Consumer::new(storage).expect("a new ring is consistent");
    (tx, rx)
}

/// A producer of an in-process ring made by [`with_capacity`].
pub type HeapProducer<T> = Producer<T, super::Heap<MpmcCell<T>>>;
/// A consumer of an in-process ring made by [`with_capacity`].
pub type HeapConsumer<T> = Consumer<T, super::Heap<MpmcCell<T>>>;

/// A writing end of an MPMC ring. `Clone` makes another producer.
#[derive(Debug)]
pub struct Producer<T, S> {
    storage: S,
    capacity: u64,
    hints: Hints,
    policy: WaitPolicy,
    _elem: PhantomData<fn(T)>,
}

/// A reading end of an MPMC ring. `Clone` makes another consumer.
#[derive(Debug)]
pub struct Consumer<T, S> {
    storage: S,
    capacity: u64,
    policy: WaitPolicy,
    _elem: PhantomData<fn() -> T>,
}

impl<T, S: Clone> Clone for Producer<T, S> {
    fn clone(&self) -> Self {
        Self { storage: self.storage.clone(), ..*self }
    }
}

impl<T, S: Clone> Clone for Consumer<T, S> {
    fn clone(&self) -> Self {
        Self { storage: self.storage.clone(), ..*self }
    }
}

fn check_positions<S: Storage>(storage: &S) -> Result<u64, Corrupted> {
    let capacity = storage.cells().len() as u64;
    // With one cell, "written at p" (stamp p + 1) and "free for p + 1" (stamp p + 1) are the
    // same stamp, so a producer would overwrite an unread element: two cells at least.
    if capacity < 2 {
        return Err(Corrupted { what: "an MPMC ring needs at least 2 cells" });
    }
    // Relaxed: only a consistency check at attach; every element access is guarded by the
    // cell stamps, read with Acquire.
    let tail = storage.control().tail.load(Ordering::Relaxed);
    let head = storage.control().head.load(Ordering::Relaxed);
    if tail.wrapping_sub(head) > capacity {
        return Err(Corrupted { what: "tail is more than capacity ahead of head" });
    }
    if (tail | head) & STAMP_FLAGS != 0 {
        return Err(Corrupted { what: "ring position at or above 2^62" });
    }
    Ok(capacity)
}

fn try_push_in<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    hints: Hints,
    value: T,
) -> Result<(), TryPushError<T>> {
    let control = storage.control();
    // Relaxed: a starting guess; the stamp (Acquire) and the CAS decide.
    let mut pos = control.tail.load(Ordering::Relaxed);
    loop {
        let cell = cell_at(storage, capacity, pos);
        // Acquire: pairs with the consumer's Release stamp store in `try_pop_in` (its read
        // of the old element happens before our write), or an adopter's in `try_adopt_in`.
        let raw = cell.stamp.load(Ordering::Acquire);
        let lag = (raw & !STAMP_FLAGS).wrapping_sub(pos) as i64;
        if lag == 0 {
            if raw & STAMP_FLAGS != 0 {
                return Err(TryPushError::Corrupted(Corrupted {
                    what: "flagged stamp on a cell free for a producer",
                }));
            }
            // Relaxed CAS: ownership of the cell is handed over by the stamps, not by tail.
            match control.tail.compare_exchange_weak(
                pos,
                pos.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if let Some(claims) = storage.claims() {
                        // Relaxed: read only by a repairer after this process died (its
                        // liveness lock gone); nothing is published through it.
                        claims.push.store(pos.wrapping_add(1), Ordering::Relaxed);
                    }
                    crate::fault::point("push_after_claim");
                    // SAFETY: winning the CAS at `pos` with stamp == pos makes this producer
                    // the only writer of the cell until it stores the next stamp; no
                    // consumer reads it before that store.
                    cell.value.with_mut(|p| unsafe { p.write(value) });
                    crate::fault::point("push_before_publish");
                    // Release: pairs with the consumer's Acquire stamp load in `try_pop_in`.
                    cell.stamp.store(pos.wrapping_add(1), Ordering::Release);
                    if hints.demote {
                        // Toward the shared cache, where any consumer reads it.
                        demote(cell);
                    }
                    return Ok(());
                }
                Err(current) => pos = current,
            }
        } else if lag < 0 {
            // The cell still holds the element of the previous lap (stamp p - capacity + 1),
            // or that lap's producer has claimed it and not yet stamped it (p - capacity).
            if lag < -(capacity as i64) {
                return Err(TryPushError::Corrupted(Corrupted {
                    what: "cell stamp more than one lap behind tail",
                }));
            }
            return Err(TryPushError::Full(value));
        } else {
            // Another producer won `pos` and already stamped it, so tail has moved on.
            let current = control.tail.load(Ordering::Relaxed);
            if current == pos {
                // The Acquire stamp load above saw a store made after tail passed `pos`, so
                // tail cannot still read `pos`: the stamp is forged.
                return Err(TryPushError::Corrupted(Corrupted {
                    what: "cell stamp ahead of tail",
                }));
            }
            pos = current;
            spin_hint();
        }
    }
}

/// Pops the element at `head`, running `then` on it before the cell is freed (so that
/// until `then` returns, a consumer that dies leaves the element for another to adopt).
#[inline(always)]
fn try_pop_in<T: Pod, S: Storage<Cell = MpmcCell<T>>, R>(
    storage: &S,
    capacity: u64,
    then: impl FnOnce(T) -> R,
) -> Result<R, TryPopError> {
    let control = storage.control();
    // Relaxed: a starting guess; the stamp (Acquire) and the CAS decide.
    let mut pos = control.head.load(Ordering::Relaxed);
    loop {
        let cell = cell_at(storage, capacity, pos);
        // Acquire: pairs with the producer's Release stamp store in `try_push_in` (or a
        // repairer's in `skip_unwritten`).
        let raw = cell.stamp.load(Ordering::Acquire);
        let lag = (raw & !STAMP_FLAGS).wrapping_sub(pos.wrapping_add(1)) as i64;
        if lag == 0 {
            if raw & STAMP_ADOPTED != 0 {
                return Err(TryPopError::Corrupted(Corrupted {
                    what: "adopted stamp on a cell not yet taken",
                }));
            }
            // Relaxed CAS: ownership of the cell is handed over by the stamps.
            match control.head.compare_exchange_weak(
                pos,
                pos.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if let Some(claims) = storage.claims() {
                        // Relaxed: as for `push` in `try_push_in`.
                        claims.pop.store(pos.wrapping_add(1), Ordering::Relaxed);
                    }
                    crate::fault::point("pop_after_claim");
                    if raw & STAMP_SKIPPED != 0 {
                        // Its producer died before writing it: nothing to return. Free it
                        // (Release: pairs with the producer's Acquire stamp load) and go on.
                        cell.stamp.store(pos.wrapping_add(capacity), Ordering::Release);
                        notify(&control.not_full);
                        pos = control.head.load(Ordering::Relaxed);
                        continue;
                    }
                    // SAFETY: winning the CAS at `pos` with stamp == pos + 1 makes this
                    // consumer the only reader of the cell, and no producer writes it before
                    // the stamp below. `T: Pod`: any bytes form a valid `T`.
                    let value = then(cell.value.with(|p| unsafe { p.read() }));
                    // Release: pairs with the producer's Acquire stamp load in `try_push_in`.
                    cell.stamp.store(pos.wrapping_add(capacity), Ordering::Release);
                    return Ok(value);
                }
                Err(current) => pos = current,
            }
        } else if lag < 0 {
            // Not yet written for this lap (stamp p), or the previous lap's consumer has
            // won it and not yet freed it (stamp p - capacity + 1): empty for us.
            if lag < -(capacity as i64) {
                return Err(TryPopError::Corrupted(Corrupted {
                    what: "cell stamp more than one lap behind head",
                }));
            }
            return Err(TryPopError::Empty);
        } else {
            // Another consumer won `pos`, so head has moved on.
            let current = control.head.load(Ordering::Relaxed);
            if current == pos {
                return Err(TryPopError::Corrupted(Corrupted { what: "cell stamp ahead of head" }));
            }
            pos = current;
            spin_hint();
        }
    }
}

/// How far one repair or adoption looks (from `head`, or from the oldest cell producers
/// wait for).
const REPAIR_SCAN: u64 = 64;

/// Adopts the element of a cell whose consumer won it and died before freeing it: takes
/// the cell (stamp `| STAMP_ADOPTED`, a CAS from the exact stalled stamp), runs `then` on
/// the element, frees the cell. Looks at the first [`REPAIR_SCAN`] positions from
/// `tail - capacity` below `head`. `None`: nothing adopted.
fn try_adopt_in<T: Pod, S: Storage<Cell = MpmcCell<T>>, R>(
    storage: &S,
    capacity: u64,
    then: impl FnOnce(T) -> R,
) -> Option<R> {
    let control = storage.control();
    // Relaxed: a window to look at; the stamp CAS decides. The two loads are not one
    // snapshot: while others push and pop, the window can look impossible (head moved on
    // between the loads). That is no evidence of corruption (the operations themselves
    // check the positions), so this only gives up until the next tick.
    let tail = control.tail.load(Ordering::Relaxed);
    let head = control.head.load(Ordering::Relaxed);
    if tail.wrapping_sub(head) > capacity || (tail | head) & STAMP_FLAGS != 0 {
        return None;
    }
    let oldest = tail.saturating_sub(capacity);
    for pos in (0..(head - oldest).min(REPAIR_SCAN)).map(|i| oldest + i) {
        let cell = cell_at(storage, capacity, pos);
        // Relaxed: a candidate; the CAS below decides.
        let raw = cell.stamp.load(Ordering::Relaxed);
        if raw & !STAMP_SKIPPED != pos.wrapping_add(1)
            || !storage.claimant_dead(Side::Consumers, pos)
        {
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
        if let Some(claims) = storage.claims() {
            // Relaxed: as in `try_pop_in`.
            claims.pop.store(pos.wrapping_add(1), Ordering::Relaxed);
        }
        let taken = (raw & STAMP_SKIPPED == 0).then(|| {
            // SAFETY: the CAS made this consumer the cell's only user: its winner is dead,
            // producers wait for the free below, other adopters saw the stamp change.
            // `T: Pod`: any bytes form a valid `T`.
            then(cell.value.with(|p| unsafe { p.read() }))
        });
        // Release: pairs with the producer's Acquire stamp load in `try_push_in`.
        cell.stamp.store(pos.wrapping_add(capacity), Ordering::Release);
        notify(&control.not_full);
        return taken; // `None` for a skipped cell: nothing in it; the next tick looks again
    }
    None
}

/// Stamps the cell of position `pos` skipped if it still holds `stamp == pos`: the
/// producer that won `pos` never wrote it. Call only once that producer is known dead (see
/// "Repair" above). Returns whether it did.
pub(crate) fn skip_unwritten(stamp: &AtomicU64, pos: u64) -> bool {
    // Release on success: pairs with the consumer's Acquire stamp load in `try_pop_in`
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
/// writing them (see "Repair" above): among the first [`REPAIR_SCAN`] positions from
/// `head`, each still stamped unwritten whose winner [`Storage::claimant_dead`] says is
/// dead. Wakes consumers if it skipped any; returns how many. Not for the fast path: it
/// reads up to [`REPAIR_SCAN`] stamps and may probe locks. Blocked endpoints run it every
/// liveness tick.
#[doc(hidden)]
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
    // Positions won by producers and not yet written: stamp == pos.
    for pos in (0..queued.min(REPAIR_SCAN)).map(|i| head.wrapping_add(i)) {
        let stamp = &cell_at(storage, capacity, pos).stamp;
        // Relaxed: a candidate; `skip_unwritten`'s CAS decides.
        if stamp.load(Ordering::Relaxed) == pos
            && storage.claimant_dead(Side::Producers, pos)
            && skip_unwritten(stamp, pos)
        {
            skipped += 1;
        }
    }
    if skipped > 0 {
        notify(&control.not_empty);
    }
    skipped
}

impl<T: Pod, S: Storage<Cell = MpmcCell<T>>> Producer<T, S> {
    /// Wraps `storage` as a producer. Any number may exist.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the stored positions are inconsistent.
    pub fn new(storage: S) -> Result<Self, Corrupted> {
        let capacity = check_positions(&storage)?;
        barrier_mode(); // registers for membarrier now, not on the first publish
        let hints = Hints::from_env();
        Ok(Self { storage, capacity, hints, policy: WaitPolicy::default(), _elem: PhantomData })
    }

    /// Pushes `value` if there is room; never blocks. Wakes sleeping consumers.
    ///
    /// # Errors
    ///
    /// [`TryPushError::Full`] with the value back; [`TryPushError::Corrupted`].
    #[inline]
    pub fn try_push(&self, value: T) -> Result<(), TryPushError<T>> {
        try_push_in(&self.storage, self.capacity, self.hints, value)?;
        notify(&self.storage.control().not_empty);
        Ok(())
    }

    /// Pushes `value`, waiting for room as the [`WaitPolicy`] says, for ever.
    ///
    /// # Errors
    ///
    /// [`PushError::Corrupted`] (never `Timeout`).
    pub fn push(&self, value: T) -> Result<(), PushError<T>> {
        self.push_until(value, None)
    }

    /// Pushes `value`, waiting at most `timeout` for room.
    ///
    /// # Errors
    ///
    /// [`PushError::Timeout`] with the value back; [`PushError::Corrupted`].
    pub fn push_timeout(&self, value: T, timeout: Duration) -> Result<(), PushError<T>> {
        self.push_until(value, deadline_after(timeout))
    }

    fn push_until(
        &self,
        value: T,
        deadline: Option<std::time::Instant>,
    ) -> Result<(), PushError<T>> {
        let control = self.storage.control();
        block_on(
            &self.storage,
            Side::Consumers,
            &control.not_full,
            &control.not_empty,
            self.policy,
            deadline,
            || {
                try_push_in(&self.storage, self.capacity, self.hints, value)
                    .map(Some)
                    .or_else(TryPushError::retry)
            },
            || {
                repair(&self.storage);
                None
            },
        )
        .map_err(|b| PushError::from_blocked(b, value))
    }

    /// Whether an element still in a cell (published and not yet freed: queued, being
    /// popped, or adopted) satisfies `pred`. Reads up to `capacity` cells: for slow paths
    /// only. Each value is read seqlock-style: used only if its cell's stamp is the same
    /// after the read as before (a cell freed and rewritten meanwhile is skipped).
    #[cfg_attr(loom, allow(dead_code))] // used by channels, which loom builds leave out
    pub(crate) fn any_unfreed(&self, mut pred: impl FnMut(&T) -> bool) -> bool {
        // Relaxed: a window to look at; each cell's stamp decides.
        let tail = self.storage.control().tail.load(Ordering::Relaxed);
        let oldest = tail.saturating_sub(self.capacity);
        (oldest..tail).any(|pos| {
            let cell = cell_at(&self.storage, self.capacity, pos);
            // Acquire: pairs with the producer's Release stamp store (the value is there).
            let before = cell.stamp.load(Ordering::Acquire);
            if before & !STAMP_FLAGS != pos.wrapping_add(1) || before & STAMP_SKIPPED != 0 {
                return false;
            }
            // SAFETY: in bounds (`cell_at`); a volatile read of a `Pod` (any bytes are a
            // valid `T`). A producer may rewrite the cell if it is freed meanwhile; the
            // stamp check below then discards what was read.
            let value = cell.value.with(|p| unsafe { p.read_volatile() });
            // Acquire: orders the read above before this load (a later free and rewrite
            // shows as a changed stamp).
            crate::sync::fence(Ordering::Acquire);
            let after = cell.stamp.load(Ordering::Relaxed);
            before == after && pred(&value)
        })
    }

    /// Sets how blocking pushes of this handle wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy = policy;
    }

    /// Whether each push of this handle moves the written cell to the shared cache; see
    /// [`spsc::Producer::set_demote`](super::spsc::Producer::set_demote).
    pub fn set_demote(&mut self, on: bool) {
        self.hints.demote = on;
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// The storage, for the layers above.
    pub fn storage(&self) -> &S {
        &self.storage
    }
}

impl<T: Pod, S: Storage<Cell = MpmcCell<T>>> Consumer<T, S> {
    /// Wraps `storage` as a consumer. Any number may exist.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the stored positions are inconsistent.
    pub fn new(storage: S) -> Result<Self, Corrupted> {
        let capacity = check_positions(&storage)?;
        barrier_mode(); // registers for membarrier now, not on the first publish
        Ok(Self { storage, capacity, policy: WaitPolicy::default(), _elem: PhantomData })
    }

    /// Pops the oldest element if there is one; never blocks. Wakes sleeping producers.
    ///
    /// # Errors
    ///
    /// [`TryPopError::Empty`]; [`TryPopError::Corrupted`].
    #[inline]
    pub fn try_pop(&self) -> Result<T, TryPopError> {
        self.try_pop_then(|v| v)
    }

    /// As [`try_pop`](Self::try_pop), running `then` on the element *before* its cell is
    /// freed: if this process dies inside `then`, another consumer adopts the element (a
    /// channel receiver takes its slot inside `then`, so that a crash never strands a
    /// slot). `try_pop_then` does not adopt; blocking pops do, every liveness tick.
    ///
    /// # Errors
    ///
    /// As [`try_pop`](Self::try_pop); `then` is not called then.
    #[inline]
    pub fn try_pop_then<R>(&self, then: impl FnOnce(T) -> R) -> Result<R, TryPopError> {
        let r = try_pop_in(&self.storage, self.capacity, then)?;
        notify(&self.storage.control().not_full);
        Ok(r)
    }

    /// Takes the element of a cell whose consumer died before freeing it (see the module's
    /// "Repair"), running `then` on it; `None` when there is none. Blocking pops call
    /// this every liveness tick; it probes locks, so it is not for the fast path.
    ///
    #[doc(hidden)]
    pub fn try_adopt_then<R>(&self, then: impl FnOnce(T) -> R) -> Option<R> {
        try_adopt_in(&self.storage, self.capacity, then)
    }

    /// Pops the oldest element, waiting for one as the [`WaitPolicy`] says, for ever.
    ///
    /// # Errors
    ///
    /// [`PopError::Corrupted`] (never `Timeout`).
    pub fn pop(&self) -> Result<T, PopError> {
        self.pop_then(None, |v| v)
    }

    /// Pops the oldest element, waiting at most `timeout` for one.
    ///
    /// # Errors
    ///
    /// [`PopError::Timeout`]; [`PopError::Corrupted`].
    pub fn pop_timeout(&self, timeout: Duration) -> Result<T, PopError> {
        self.pop_then(Some(timeout), |v| v)
    }

    /// As [`pop`](Self::pop) (`timeout` `None`) or [`pop_timeout`](Self::pop_timeout),
    /// running `then` on the element before its cell is freed; see
    /// [`try_pop_then`](Self::try_pop_then). While it waits, it adopts the elements of dead
    /// consumers.
    ///
    /// # Errors
    ///
    /// As [`pop_timeout`](Self::pop_timeout); `then` is not called then.
    pub fn pop_then<R>(
        &self,
        timeout: Option<Duration>,
        then: impl FnOnce(T) -> R,
    ) -> Result<R, PopError> {
        let deadline = timeout.and_then(deadline_after);
        let control = self.storage.control();
        // `then` runs once: only a successful pop or adoption calls it, and that ends the
        // wait.
        let then = std::cell::Cell::new(Some(then));
        let run = |v| then.take().map(|f| f(v));
        block_on(
            &self.storage,
            Side::Producers,
            &control.not_empty,
            &control.not_full,
            self.policy,
            deadline,
            || try_pop_in(&self.storage, self.capacity, run).map(Some).or_else(TryPopError::retry),
            || {
                repair(&self.storage);
                try_adopt_in(&self.storage, self.capacity, run)
            },
        )
        .map_err(PopError::from)
        .map(|r| r.expect("then runs on the one successful pop"))
    }

    /// Sets how blocking pops of this handle wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy = policy;
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// The storage, for the layers above.
    pub fn storage(&self) -> &S {
        &self.storage
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::Heap;
    use std::collections::HashSet;

    /// Found by the `ring_model` fuzz target: with one cell, a push into the full ring saw
    /// the stamp of "free for the next position" and overwrote the unread element.
    #[test]
    fn one_cell_is_refused_and_two_cells_tell_full_from_empty() {
        let one = Heap::new(1, |i| MpmcCell::<u64>::new(i as u64));
        assert!(matches!(Producer::<u64, _>::new(one.clone()), Err(Corrupted { .. })));
        assert!(matches!(Consumer::<u64, _>::new(one), Err(Corrupted { .. })));
        assert!(std::panic::catch_unwind(|| with_capacity::<u64>(1)).is_err());
        let (tx, rx) = with_capacity::<u64>(2);
        for lap in 0..4 {
            tx.try_push(lap * 2).unwrap();
            tx.try_push(lap * 2 + 1).unwrap();
            assert_eq!(tx.try_push(99), Err(TryPushError::Full(99)));
            assert_eq!(rx.try_pop(), Ok(lap * 2));
            assert_eq!(rx.try_pop(), Ok(lap * 2 + 1));
            assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
        }
    }

    #[test]
    fn fifo_single_thread_many_laps() {
        let (tx, rx) = with_capacity::<u64>(4);
        let n = if cfg!(miri) { 50 } else { 10_000 };
        let mut next = 0;
        for i in 0..n {
            tx.try_push(i).unwrap();
            if i % 4 == 3 {
                assert!(matches!(tx.try_push(99), Err(TryPushError::Full(99))));
                while let Ok(v) = rx.try_pop() {
                    assert_eq!(v, next);
                    next += 1;
                }
            }
        }
        while let Ok(v) = rx.try_pop() {
            assert_eq!(v, next);
            next += 1;
        }
        assert_eq!(next, n);
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
    }

    #[test]
    fn threads_exactly_once_and_per_producer_order() {
        let (tx, rx) = with_capacity::<u64>(16);
        let producers = 3u64;
        let per: u64 = if cfg!(miri) { 40 } else { 50_000 };
        let mut handles = Vec::new();
        for p in 0..producers {
            let tx = tx.clone();
            handles.push(std::thread::spawn(move || {
                for i in 0..per {
                    tx.push((p << 32) | i).unwrap();
                }
            }));
        }
        drop(tx);
        let total = producers * per;
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut consumers = Vec::new();
        for _ in 0..2 {
            let (rx, taken) = (rx.clone(), taken.clone());
            consumers.push(std::thread::spawn(move || {
                let mut got = Vec::new();
                while taken.load(std::sync::atomic::Ordering::Relaxed) < total {
                    if let Ok(v) = rx.pop_timeout(Duration::from_millis(10)) {
                        taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        got.push(v);
                    }
                }
                got
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
        let mut all = HashSet::new();
        for c in consumers {
            let got = c.join().unwrap();
            let mut last = [None::<u64>; 3];
            for v in got {
                let (p, i) = ((v >> 32) as usize, v & 0xffff_ffff);
                // Within one consumer, a producer's elements come in order.
                assert!(last[p].is_none_or(|l| l < i), "producer {p}: {i} after {last:?}");
                last[p] = Some(i);
                assert!(all.insert(v), "duplicate {v:#x}");
            }
        }
        assert_eq!(all.len() as u64, producers * per);
    }

    #[test]
    fn forged_stamps_are_corrupted_not_a_hang() {
        let storage = Heap::new(4, |i| MpmcCell::<u64>::new(i as u64));
        let tx = Producer::new(storage.clone()).unwrap();
        let rx = Consumer::new(storage.clone()).unwrap();
        // Stamp far ahead of tail: a producer would chase it for ever without the check.
        storage.cells()[0].stamp.store(1 << 50, Ordering::Relaxed);
        assert!(matches!(tx.try_push(1), Err(TryPushError::Corrupted(_))));
        assert!(matches!(rx.try_pop(), Err(TryPopError::Corrupted(_))));
        // Stamp far behind.
        storage.cells()[0].stamp.store(0u64.wrapping_sub(100), Ordering::Relaxed);
        assert!(matches!(tx.try_push(1), Err(TryPushError::Corrupted(_))));
        assert!(matches!(rx.try_pop(), Err(TryPopError::Corrupted(_))));
        // Positions apart by more than capacity.
        storage.control().tail.store(1000, Ordering::Relaxed);
        assert!(Producer::<u64, _>::new(storage.clone()).is_err());
    }
}
