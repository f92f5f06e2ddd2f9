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
//! Runs: an endpoint claims a *run* of cells that are ready in a row (up to [`MAX_RUN`])
//! with one compare-and-swap, so the contended `tail` / `head` lines move once per run
//! instead of once per element; a single push or pop is a run of one, and slices
//! (`slices.rs`) claim longer ones.
//!
//! Checks on shared values: a stamp more than one lap behind its position, or ahead of it
//! while the position counter has not moved, cannot happen in a healthy ring and is
//! [`Corrupted`]; so is a position at or above 2^62 (the stamps' flag bits).
//!
//! An endpoint that wins a cell and dies before stamping it would stall the ring there for
//! ever. Each endpoint names every run it is about to win in its `Claims` line, before its
//! CAS, and keeps its line's lock until the run is finished, so that a blocked endpoint
//! can tell such cells and repair them at its liveness ticks: `repair.rs`.

use std::marker::PhantomData;

use bytemuck::Pod;

use super::repair::repair;
use super::{
    Hint, Hints, PopTimeoutError, PushTimeoutError, Storage, TryPopError, TryPushError, cache_hint,
    cell_at, peers_gone, peers_left, wait_for,
};
use crate::layout::{Corrupted, MpmcCell, STAMP_FLAGS};
use crate::liveness::{Blocked, Role, Tick, Watch};
use crate::sync::Ordering;
use crate::wait::{Deadline, WaitPolicy, Waits, barrier_mode, notify};

/// An in-process MPMC ring of `capacity` elements (a power of two) on the heap. Clone the
/// handles for more producers or consumers.
///
/// # Panics
///
/// If `capacity` is not a power of two in `2..=2^24` (one cell cannot tell full from
/// empty in this algorithm).
pub fn with_capacity<T: Pod + Send>(capacity: usize) -> (HeapProducer<T>, HeapConsumer<T>) {
    assert!(capacity >= 2, "an MPMC ring needs at least 2 cells, got {capacity}");
    let ends = |a, b| Ok((Producer::new(a)?, Consumer::new(b)?));
    super::Heap::new(capacity, |i| MpmcCell::new(i as u64)).ends(ends)
}

/// A producer of an in-process ring made by [`with_capacity`].
pub type HeapProducer<T> = Producer<T, super::Heap<MpmcCell<T>>>;
/// A consumer of an in-process ring made by [`with_capacity`].
pub type HeapConsumer<T> = Consumer<T, super::Heap<MpmcCell<T>>>;

/// A writing end of an MPMC ring. `Clone` makes another producer.
#[derive(Debug)]
pub struct Producer<T, S> {
    pub(super) storage: S,
    pub(super) capacity: u64,
    pub(super) hints: Hints,
    pub(super) policy: Waits,
    _elem: PhantomData<fn(T)>,
}

/// A reading end of an MPMC ring. `Clone` makes another consumer.
#[derive(Debug)]
pub struct Consumer<T, S> {
    pub(super) storage: S,
    pub(super) capacity: u64,
    pub(super) policy: Waits,
    /// A blocking `pop` of this handle adopted a dead consumer's cell at its last tick, so
    /// more of that consumer's run may be waiting: the next `pop` that finds the ring empty
    /// looks for them at once instead of a tick later. Local to this handle.
    pub(super) adopting: std::sync::atomic::AtomicBool,
    _elem: PhantomData<fn() -> T>,
}

impl<T, S: Clone> Clone for Producer<T, S> {
    fn clone(&self) -> Self {
        Self { storage: self.storage.clone(), policy: self.policy.clone(), ..*self }
    }
}

impl<T, S: Clone> Clone for Consumer<T, S> {
    fn clone(&self) -> Self {
        Self {
            storage: self.storage.clone(),
            capacity: self.capacity,
            policy: self.policy.clone(),
            adopting: std::sync::atomic::AtomicBool::new(false),
            _elem: PhantomData,
        }
    }
}

fn check_positions<S: Storage>(storage: &S) -> Result<u64, Corrupted> {
    let capacity = storage.cells().len() as u64;
    // With one cell, "written at p" (stamp p + 1) and "free for p + 1" (stamp p + 1) are the
    // same stamp, so a producer would overwrite an unread element: two cells at least.
    if capacity < 2 {
        return Err(Corrupted { what: "an MPMC ring needs at least 2 cells" });
    }
    let control = storage.control();
    // Two loads are no snapshot: on a busy ring head can pass the tail read before it, or
    // tail run far ahead of the head read before it. So the window is judged only when
    // head did not move across the tail load (then tail ≤ head + capacity held throughout);
    // on a ring too busy for that, the operations' own stamp checks stand guard.
    // Acquire: pairs with the Release CASes of the endpoints that moved the counters
    // (`claim_run`), so the tail read here is no older than what the head read implies.
    for _ in 0..3 {
        let head = control.head.load(Ordering::Acquire);
        let tail = control.tail.load(Ordering::Acquire);
        if (tail | head) & STAMP_FLAGS != 0 {
            return Err(Corrupted { what: "ring position at or above 2^62" });
        }
        if control.head.load(Ordering::Acquire) == head {
            if tail.wrapping_sub(head) > capacity {
                return Err(Corrupted { what: "tail is more than capacity ahead of head" });
            }
            break;
        }
    }
    Ok(capacity)
}

/// Elements pushed and not yet popped: `tail - head` from a read of `head` that did not
/// move across the read of `tail` (two loads are no snapshot on a busy ring). A diagnostic:
/// `None` when the positions are impossible or kept moving.
fn queued<S: Storage>(storage: &S, capacity: u64) -> Option<usize> {
    let control = storage.control();
    (0..3).find_map(|_| {
        // Relaxed: a diagnostic snapshot; nothing is read on the strength of it.
        let head = control.head.load(Ordering::Relaxed);
        let tail = control.tail.load(Ordering::Relaxed);
        let n = tail.wrapping_sub(head);
        (control.head.load(Ordering::Relaxed) == head)
            .then_some((n <= capacity).then_some(n as usize))
    })?
}

pub use super::runs::MAX_RUN;
use super::runs::{Claimed, Turn, claim_run};

/// Pushes up to [`MAX_RUN`] of `values` (from the front) into the run of free cells at
/// `tail`, with one compare-and-swap. Returns how many (0: full).
#[inline(always)]
pub(super) fn try_push_in<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    hints: Hints,
    values: &[T],
) -> Result<usize, Corrupted> {
    let want = values.len().min(MAX_RUN) as u64;
    if want == 0 {
        return Ok(0);
    }
    let line = storage.watch().claims();
    // Held until the run's last stamp: while it lives, this endpoint's line names the run.
    let _turn = line.map(|l| l.lock.lock());
    let Some(Claimed { first, n, .. }) = claim_run(storage, capacity, want, Turn::Write, line)?
    else {
        return Ok(0);
    };
    crate::fault::point("push_after_claim");
    if hints.prefetch {
        // All of the run's lines at once (see `spsc`'s push).
        for i in 0..n {
            cache_hint(cell_at(storage, capacity, first.wrapping_add(i)), Hint::Write);
        }
    }
    for (i, value) in (0..n).zip(values) {
        let pos = first.wrapping_add(i);
        let cell = cell_at(storage, capacity, pos);
        // Winning the CAS over the run with stamp == pos for each of its cells makes this
        // producer the cell's only writer until it stores the next stamp: no consumer reads
        // it before that store, and no repairer touches it while this producer lives (its
        // claim line names it: see `ClaimLine`).
        let write = |p: *mut T| {
            // SAFETY: this producer is the cell's only writer (above); `p` is the cell's.
            unsafe { p.write(*value) }
        };
        cell.value.with_mut(write);
        crate::fault::point("push_before_publish");
        // Release: pairs with the consumer's Acquire stamp load in `ready_run`.
        cell.stamp.store(pos.wrapping_add(1), Ordering::Release);
        if hints.demote {
            // Toward the shared cache, where any consumer reads it.
            cache_hint(cell, Hint::Demote);
        }
    }
    Ok(n as usize)
}

/// Pops the run of up to `want` (≥ 1, ≤ [`MAX_RUN`]) published cells at `head` with one
/// compare-and-swap, running `each` on every element in order and freeing the cells only
/// after that (so that until `each` returns, a consumer that dies leaves the elements for
/// another to adopt). Cells skipped by a repair are freed and not passed on. Returns how
/// many elements `each` saw, or `None` when the ring is empty; if the whole run was
/// skipped cells, it looks again.
#[inline(always)]
pub(super) fn try_pop_in<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    want: u64,
    mut each: impl FnMut(T),
) -> Result<Option<usize>, Corrupted> {
    let control = storage.control();
    let line = storage.watch().claims();
    loop {
        // Held until the run's cells are freed: while it lives, this endpoint's line names
        // them, so no adopter takes them.
        let turn = line.map(|l| l.lock.lock());
        let Some(Claimed { first, n, skipped }) =
            claim_run(storage, capacity, want, Turn::Read, line)?
        else {
            return Ok(None);
        };
        crate::fault::point("pop_after_claim");
        let cells = (0..n)
            .map(|i| (first.wrapping_add(i), cell_at(storage, capacity, first.wrapping_add(i))));
        if n > 1 {
            cells.clone().for_each(|(_, cell)| cache_hint(cell, Hint::Read));
        }
        let mut seen = 0;
        for (i, (_, cell)) in cells.clone().enumerate() {
            if skipped >> i & 1 != 0 {
                continue; // its producer died before writing it: nothing to pass on
            }
            // SAFETY: winning the CAS over the run with stamp == pos + 1 for each cell (read
            // with Acquire: the producer's write is visible) makes this consumer its only
            // reader: no producer writes it before the free below, and no adopter takes it
            // while this consumer lives (its claim line names it: see `ClaimLine`).
            // `T: Pod`: any bytes form a valid `T`.
            each(cell.value.with(|p| unsafe { p.read() }));
            seen += 1;
        }
        for (pos, cell) in cells {
            // Release: pairs with the producer's Acquire stamp load in `ready_run`.
            cell.stamp.store(pos.wrapping_add(capacity), Ordering::Release);
        }
        drop(turn);
        if seen > 0 {
            return Ok(Some(seen));
        }
        // Only skipped cells: wake producers waiting for room, and look again.
        notify(&control.not_full);
    }
}

/// Writes the elements it is given into `out`, front to back (callers pass at most
/// `out.len()`: a run or an adoption no longer than `out`).
pub(super) fn fill<T>(out: &mut [T]) -> impl FnMut(T) + '_ {
    let mut slots = out.iter_mut();
    move |v| *slots.next().expect("no more elements than `out` holds") = v
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
        Ok(Self { storage, capacity, hints, policy: Waits::default(), _elem: PhantomData })
    }

    /// Pushes `value` if there is room; never blocks. Wakes sleeping consumers.
    ///
    /// # Errors
    ///
    /// [`TryPushError::Full`] with the value back ([`TryPushError::Disconnected`] when
    /// every consumer has also left); [`TryPushError::Corrupted`].
    #[inline]
    pub fn try_push(&self, value: T) -> Result<(), TryPushError<T>> {
        let values = std::slice::from_ref(&value);
        match try_push_in(&self.storage, self.capacity, self.hints, values)
            .map_err(TryPushError::Corrupted)?
        {
            0 if peers_left(&self.storage, Role::Consumer) => {
                Err(TryPushError::Disconnected(value))
            }
            0 => Err(TryPushError::Full(value)),
            _ => {
                notify(&self.storage.control().not_empty);
                Ok(())
            }
        }
    }

    /// Pushes `value`, waiting for room as the [`WaitPolicy`] says until `deadline`.
    pub(crate) fn push_until(
        &self,
        value: T,
        deadline: Deadline,
    ) -> Result<(), PushTimeoutError<T>> {
        self.push_some_until(std::slice::from_ref(&value), deadline)
            .map(drop)
            .map_err(|b| PushTimeoutError::from_blocked(b, value))
    }

    /// Pushes one run of `values` (at least one element), waiting for room as the
    /// [`WaitPolicy`] says until `deadline`, running the producer-side repair at every
    /// liveness tick. Returns how many were pushed.
    pub(crate) fn push_some_until(
        &self,
        values: &[T],
        deadline: Deadline,
    ) -> Result<usize, Blocked> {
        let attempt = || {
            try_push_in(&self.storage, self.capacity, self.hints, values)
                .map(|n| (n > 0).then_some(n))
        };
        let on_tick = || {
            repair(&self.storage);
            Tick::Idle
        };
        wait_for(&self.storage, Role::Producer, &self.policy, deadline, attempt, on_tick)
    }

    /// Sets how blocking pushes of this handle wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy.set(policy);
    }

    /// Whether every consumer is gone (see `ring::peers_gone`): for senders that refuse to
    /// push into a ring nobody reads.
    #[cfg_attr(loom, allow(dead_code))] // used by channels, which loom builds leave out
    pub(crate) fn consumers_gone(&self, probe: bool) -> Option<Blocked> {
        peers_gone(&self.storage, Role::Consumer, probe)
    }

    /// Elements queued (see `queued`).
    pub fn len(&self) -> Option<usize> {
        queued(&self.storage, self.capacity)
    }

    /// Whether the ring looks empty.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// Whether each push of this handle moves the written cell to the shared cache; see
    /// [`crate::SpscProducer::set_demote`].
    pub fn set_demote(&mut self, on: bool) {
        self.hints.demote = on;
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// The storage, for the layers above (a channel's sender asks its watch who it is).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn storage(&self) -> &S {
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
        let adopting = std::sync::atomic::AtomicBool::new(false);
        Ok(Self { storage, capacity, policy: Waits::default(), adopting, _elem: PhantomData })
    }

    /// Pops the oldest element if there is one; never blocks (and adopts nothing: blocking
    /// pops do, every liveness tick). Wakes sleeping producers.
    ///
    /// # Errors
    ///
    /// [`TryPopError::Empty`] ([`TryPopError::Disconnected`] when every producer has also
    /// left); [`TryPopError::Corrupted`].
    #[inline]
    pub fn try_pop(&self) -> Result<T, TryPopError> {
        let once = || {
            let mut r = None;
            try_pop_in(&self.storage, self.capacity, 1, |v| r = Some(v))
                .map_err(TryPopError::Corrupted)
                .map(|popped| popped.and(r))
        };
        let popped = match once()? {
            // What they published before leaving comes first: look once more.
            None if peers_left(&self.storage, Role::Producer) => {
                once()?.ok_or(TryPopError::Disconnected)?
            }
            None => return Err(TryPopError::Empty),
            Some(v) => v,
        };
        notify(&self.storage.control().not_full);
        Ok(popped)
    }

    /// Pops the oldest element, waiting for one as the [`WaitPolicy`] says until
    /// `deadline`, and runs `then` on it *before* its cell is freed: if this process dies
    /// inside `then`, another consumer adopts the element (a channel receiver takes its
    /// slot inside `then`, so that a crash never strands a slot). While it waits, it
    /// adopts the elements of dead consumers. `then` runs only on success.
    pub(crate) fn pop_then_until<R>(
        &self,
        deadline: Deadline,
        then: impl FnOnce(T) -> R,
    ) -> Result<R, PopTimeoutError> {
        self.pop_then_ticking(deadline, then, || Tick::Idle)
    }

    /// Pops the oldest element, waiting for one until `deadline`.
    pub(crate) fn pop_until(&self, deadline: Deadline) -> Result<T, PopTimeoutError> {
        self.pop_then_until(deadline, |v| v)
    }

    /// Sets how blocking pops of this handle wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy.set(policy);
    }

    /// How blocking pops of this handle wait.
    pub fn wait_policy(&self) -> WaitPolicy {
        self.policy.policy()
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Elements queued (see `queued`).
    pub fn len(&self) -> Option<usize> {
        queued(&self.storage, self.capacity)
    }

    /// Whether the ring looks empty.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// The storage, for the layers above (a pool's records ask its watch).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn storage(&self) -> &S {
        &self.storage
    }
}
