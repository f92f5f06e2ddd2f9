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
//! Slices: [`Producer::try_push_slice`] and [`Consumer::try_pop_into`] claim a *run* of
//! cells that are ready in a row (up to [`MAX_RUN`]) with one compare-and-swap, so the
//! contended `tail` / `head` lines move once per run instead of once per element. A single
//! push or pop is a run of one.
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
//! rings) gives each endpoint a [`Claims`] line, where it records
//! every run of positions it wins (one position, or a slice's run), right after winning the
//! compare-and-swap and before touching the cells. A word names a position only if its
//! endpoint won it, so when the cell at that position is still unfinished and the endpoint
//! is dead, nobody else will finish it. Every liveness tick, a blocked endpoint:
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
    Blocked, Corrupted, Hints, PopError, PushError, Side, Storage, TryPopError, TryPushError,
    block_on, cell_at, deadline_after, demote, prefetch, prefetch_write,
};
use crate::layout::{Claims, MAX_CLAIM_RUN, MpmcCell, STAMP_ADOPTED, STAMP_FLAGS, STAMP_SKIPPED};
use crate::sync::{AtomicU64, Ordering, spin_hint};
use crate::wait::{WaitPolicy, barrier_mode, notify};
use std::sync::atomic::Ordering::Relaxed;

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
    /// A blocking `pop` of this handle adopted a dead consumer's cell at its last tick, so
    /// more of that consumer's run may be waiting: the next `pop` that finds the ring empty
    /// looks for them at once instead of a tick later. Local to this handle.
    adopting: std::sync::atomic::AtomicBool,
    _elem: PhantomData<fn() -> T>,
}

impl<T, S: Clone> Clone for Producer<T, S> {
    fn clone(&self) -> Self {
        Self { storage: self.storage.clone(), ..*self }
    }
}

impl<T, S: Clone> Clone for Consumer<T, S> {
    fn clone(&self) -> Self {
        Self {
            storage: self.storage.clone(),
            capacity: self.capacity,
            policy: self.policy,
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

/// The longest run of cells one push or pop claims with one compare-and-swap (a slice
/// longer than this moves in several runs). No longer than the span one repair looks at,
/// so that one liveness tick repairs the whole run of an endpoint that died holding it.
pub const MAX_RUN: usize = 64;
const _: () = assert!(MAX_RUN as u64 <= REPAIR_SCAN);
const _: () = assert!(MAX_RUN as u64 <= MAX_CLAIM_RUN);

/// Which side of the ring a run is claimed for.
#[derive(Clone, Copy)]
enum Turn {
    /// Producers: a cell is ready at `p` when its stamp is `p` (free, no flag).
    Write,
    /// Consumers: a cell is ready at `p` when its stamp is `p + 1` (written or skipped).
    Read,
}

/// A run of cells claimed (or found ready) from `first`: `n` cells; bit `i` of `skipped`
/// set when the cell at `first + i` is stamped skipped (consumers only: its producer died
/// before writing it). `n` ≤ [`MAX_RUN`] = 64, so the mask fits.
#[derive(Clone, Copy)]
struct Claimed {
    first: u64,
    n: u64,
    skipped: u64,
}

/// What a look at the cells from a position found.
enum Run {
    /// The first `n` (≥ 1) cells are ready for this side; bit `i` of the mask: the cell at
    /// `pos + i` is stamped skipped.
    Ready(u64, u64),
    /// The first cell is not ready yet: the ring is full (producers) or empty (consumers).
    Wait,
    /// The first cell was already taken by another endpoint: the position counter has moved
    /// on, to this.
    Moved(u64),
}

/// Looks at up to `want` cells from `pos` (which the caller read from its side's position
/// counter) and says how many in a row are ready for `turn`. Each stamp is read with
/// Acquire: pairs with the Release stamp store of the other side (a consumer's free, read
/// by producers, orders its read of the old element before our write; a producer's
/// publish, read by consumers, makes the element visible), or of a repairer or adopter.
#[inline(always)]
fn ready_run<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    counter: &AtomicU64,
    pos: u64,
    want: u64,
    turn: Turn,
) -> Result<Run, Corrupted> {
    let (offset, bad_flags, flagged, behind, ahead) = match turn {
        Turn::Write => (
            0,
            STAMP_FLAGS,
            "flagged stamp on a cell free for a producer",
            "cell stamp more than one lap behind tail",
            "cell stamp ahead of tail",
        ),
        Turn::Read => (
            1,
            STAMP_ADOPTED,
            "adopted stamp on a cell not yet taken",
            "cell stamp more than one lap behind head",
            "cell stamp ahead of head",
        ),
    };
    let mut n = 0;
    let mut skipped = 0;
    while n < want {
        let at = pos.wrapping_add(n);
        // Acquire: see above.
        let raw = cell_at(storage, capacity, at).stamp.load(Ordering::Acquire);
        let lag = (raw & !STAMP_FLAGS).wrapping_sub(at.wrapping_add(offset)) as i64;
        if lag == 0 {
            if raw & bad_flags != 0 {
                return Err(Corrupted { what: flagged });
            }
            // Producers never get here with the flag (it is in `bad_flags`).
            skipped |= u64::from(raw & STAMP_SKIPPED != 0) << n;
            n += 1;
        } else if lag < -(capacity as i64) {
            return Err(Corrupted { what: behind });
        } else if n > 0 {
            // The run ends here (not yet ready, or already taken: the CAS will tell).
            break;
        } else if lag < 0 {
            // Producers: the cell still holds the previous lap's element (stamp p - capacity
            // + 1), or that lap's producer has won it and not yet written it (p - capacity).
            // Consumers: not yet written for this lap (stamp p), or the previous lap's
            // consumer has won it and not yet freed it (p - capacity + 1).
            return Ok(Run::Wait);
        } else {
            // Another endpoint of this side won `pos` and already stamped it, so the
            // counter has moved on. Acquire: as the first load in `claim_run`.
            let current = counter.load(Ordering::Acquire);
            if current == pos {
                // The Acquire stamp load above saw a store made after the counter passed
                // `pos`, so it cannot still read `pos`: the stamp is forged.
                return Err(Corrupted { what: ahead });
            }
            return Ok(Run::Moved(current));
        }
    }
    Ok(Run::Ready(n, skipped))
}

/// Claims a run of up to `want` (≥ 1) cells ready for `turn` from the side's position
/// counter, records it in the endpoint's claim line, and returns it; `None` when the first
/// cell is not ready (full / empty).
#[inline(always)]
fn claim_run<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    want: u64,
    turn: Turn,
) -> Result<Option<Claimed>, Corrupted> {
    let control = storage.control();
    let counter = match turn {
        Turn::Write => &control.tail,
        Turn::Read => &control.head,
    };
    // Acquire: pairs with the Release CAS of the endpoint that moved the counter here (a
    // release sequence: every earlier winner's CAS too). So whatever each winner saw of its
    // cells before winning, this endpoint sees as well, and a stamp more than a lap behind
    // the position read here is truly impossible, never a stale view (`ready_run`).
    let mut pos = counter.load(Ordering::Acquire);
    loop {
        let (n, skipped) = match ready_run(storage, capacity, counter, pos, want, turn)? {
            Run::Ready(n, skipped) => (n, skipped),
            Run::Wait => return Ok(None),
            Run::Moved(current) => {
                pos = current;
                spin_hint();
                continue;
            }
        };
        // Ownership of the cells is handed over by their stamps, not by the counter. A
        // cell of the run cannot change under us before the CAS: only the winner of its
        // position (which moves the counter past it, failing our CAS) or a repair of a cell
        // of an earlier, dead winner (never a ready one) touches it. Release on success,
        // Acquire on failure: pairs with the counter loads above and in `ready_run` (the
        // stamps this endpoint read before winning are visible to whoever reads the new
        // position).
        match counter.compare_exchange_weak(
            pos,
            pos.wrapping_add(n),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                if let Some(claims) = storage.claims() {
                    let line = match turn {
                        Turn::Write => &claims.push,
                        Turn::Read => &claims.pop,
                    };
                    // Relaxed: read only by a repairer after this process died (its
                    // liveness lock gone); nothing is published through it.
                    line.store(Claims::word(pos, n), Ordering::Relaxed);
                }
                return Ok(Some(Claimed { first: pos, n, skipped }));
            }
            Err(current) => pos = current,
        }
    }
}

/// Pushes up to [`MAX_RUN`] of `values` (from the front) into the run of free cells at
/// `tail`, with one compare-and-swap. Returns how many (0: full).
#[inline(always)]
fn try_push_in<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    hints: Hints,
    values: &[T],
) -> Result<usize, Corrupted> {
    let want = values.len().min(MAX_RUN) as u64;
    if want == 0 {
        return Ok(0);
    }
    let Some(Claimed { first, n, .. }) = claim_run(storage, capacity, want, Turn::Write)? else {
        return Ok(0);
    };
    crate::fault::point("push_after_claim");
    if hints.prefetch {
        // All of the run's lines at once (see `spsc`'s push).
        for i in 0..n {
            prefetch_write(cell_at(storage, capacity, first.wrapping_add(i)));
        }
    }
    for (i, value) in (0..n).zip(values) {
        let pos = first.wrapping_add(i);
        let cell = cell_at(storage, capacity, pos);
        // SAFETY: winning the CAS over the run with stamp == pos for each of its cells
        // makes this producer the only writer of the cell until it stores the next stamp;
        // no consumer reads it before that store.
        cell.value.with_mut(|p| unsafe { p.write(*value) });
        crate::fault::point("push_before_publish");
        // Release: pairs with the consumer's Acquire stamp load in `ready_run`.
        cell.stamp.store(pos.wrapping_add(1), Ordering::Release);
        if hints.demote {
            // Toward the shared cache, where any consumer reads it.
            demote(cell);
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
fn try_pop_in<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    want: u64,
    mut each: impl FnMut(T),
) -> Result<Option<usize>, Corrupted> {
    let control = storage.control();
    loop {
        let Some(Claimed { first, n, skipped }) = claim_run(storage, capacity, want, Turn::Read)?
        else {
            return Ok(None);
        };
        crate::fault::point("pop_after_claim");
        let cells = (0..n)
            .map(|i| (first.wrapping_add(i), cell_at(storage, capacity, first.wrapping_add(i))));
        if n > 1 {
            cells.clone().for_each(|(_, cell)| prefetch(cell));
        }
        let mut seen = 0;
        for (i, (_, cell)) in cells.clone().enumerate() {
            if skipped >> i & 1 != 0 {
                continue; // its producer died before writing it: nothing to pass on
            }
            // SAFETY: winning the CAS over the run with stamp == pos + 1 for each cell
            // makes this consumer the only reader of the cell, and no producer writes it
            // before the free below. `T: Pod`: any bytes form a valid `T`.
            each(cell.value.with(|p| unsafe { p.read() }));
            seen += 1;
        }
        for (pos, cell) in cells {
            // Release: pairs with the producer's Acquire stamp load in `ready_run`.
            cell.stamp.store(pos.wrapping_add(capacity), Ordering::Release);
        }
        if seen > 0 {
            return Ok(Some(seen));
        }
        // Only skipped cells: wake producers waiting for room, and look again.
        notify(&control.not_full);
    }
}

/// Writes the elements it is given into `out`, front to back (callers pass at most
/// `out.len()`: a run or an adoption no longer than `out`).
fn fill<T>(out: &mut [T]) -> impl FnMut(T) + '_ {
    let mut slots = out.iter_mut();
    move |v| *slots.next().expect("no more elements than `out` holds") = v
}

/// How far one repair or adoption looks (from `head`, or from the oldest cell producers
/// wait for).
const REPAIR_SCAN: u64 = 64;

/// Adopts the elements of up to `max` cells whose consumer won them and died before
/// freeing them: takes each cell (stamp `| STAMP_ADOPTED`, a CAS from the exact stalled
/// stamp), runs `each` on its element, frees the cell. Looks at the first [`REPAIR_SCAN`]
/// positions from `tail - capacity` below `head`. Returns how many elements `each` saw (a
/// skipped cell among them is freed and not counted).
fn try_adopt_in<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
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
        let values = std::slice::from_ref(&value);
        match try_push_in(&self.storage, self.capacity, self.hints, values)
            .map_err(TryPushError::Corrupted)?
        {
            0 => Err(TryPushError::Full(value)),
            _ => {
                notify(&self.storage.control().not_empty);
                Ok(())
            }
        }
    }

    /// Pushes as many of `values` as there are free cells for in a row at `tail`, from the
    /// front and at most [`MAX_RUN`], claiming them with one compare-and-swap (a stream
    /// moves far faster in slices: the contended `tail` line moves once per slice, not
    /// once per element); never blocks. Returns how many were pushed (0: full). The
    /// elements of a slice stay together and in order. Wakes sleeping consumers.
    ///
    /// ```
    /// let (tx, rx) = gpuring::ring::mpmc::with_capacity::<u64>(4);
    /// assert_eq!(tx.try_push_slice(&[1, 2, 3, 4, 5]), Ok(4));
    /// let mut out = [0; 8];
    /// assert_eq!(rx.try_pop_into(&mut out), Ok(4));
    /// assert_eq!(out[..4], [1, 2, 3, 4]);
    /// ```
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when a cell's stamp is impossible.
    pub fn try_push_slice(&self, values: &[T]) -> Result<usize, Corrupted> {
        let n = try_push_in(&self.storage, self.capacity, self.hints, values)?;
        if n > 0 {
            notify(&self.storage.control().not_empty);
        }
        Ok(n)
    }

    /// Pushes all of `values`, in runs as room appears (see
    /// [`try_push_slice`](Self::try_push_slice)), waiting as the [`WaitPolicy`] says. Other
    /// producers' elements may fall between two runs.
    ///
    /// # Errors
    ///
    /// [`PushError::PeerDead`] with how many were pushed, when the ring stays full and
    /// every consumer has died; [`PushError::Corrupted`]. Never `Timeout`.
    pub fn push_slice(&self, values: &[T]) -> Result<(), PushError<usize>> {
        let mut done = 0;
        while done < values.len() {
            done += self
                .push_run_until(&values[done..], None)
                .map_err(|b| PushError::from_blocked(b, done))?;
        }
        Ok(())
    }

    /// Pushes `value`, waiting for room as the [`WaitPolicy`] says, for ever.
    ///
    /// # Errors
    ///
    /// [`PushError::PeerDead`] when the ring stays full and every consumer has died;
    /// [`PushError::Corrupted`]. Never `Timeout`.
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
        self.push_run_until(std::slice::from_ref(&value), deadline)
            .map(drop)
            .map_err(|b| PushError::from_blocked(b, value))
    }

    /// Pushes one run of `values` (at least one element), waiting for room as the
    /// [`WaitPolicy`] says until `deadline`, running the producer-side repair at every
    /// liveness tick. Returns how many were pushed.
    fn push_run_until(
        &self,
        values: &[T],
        deadline: Option<std::time::Instant>,
    ) -> Result<usize, Blocked> {
        let control = self.storage.control();
        block_on(
            &self.storage,
            Side::Consumers,
            &control.not_full,
            &control.not_empty,
            self.policy,
            deadline,
            || {
                try_push_in(&self.storage, self.capacity, self.hints, values)
                    .map(|n| (n > 0).then_some(n))
            },
            || {
                repair(&self.storage);
                None
            },
        )
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
        let adopting = std::sync::atomic::AtomicBool::new(false);
        Ok(Self { storage, capacity, policy: WaitPolicy::default(), adopting, _elem: PhantomData })
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
        let mut then = Some(then);
        let mut r = None;
        let each = |v| r = then.take().map(|f| f(v));
        match try_pop_in(&self.storage, self.capacity, 1, each).map_err(TryPopError::Corrupted)? {
            None => Err(TryPopError::Empty),
            Some(_) => {
                notify(&self.storage.control().not_full);
                Ok(r.expect("a run of one element ran `then` once"))
            }
        }
    }

    /// Pops the run of published elements at `head` into `out`, oldest first, up to
    /// `out.len()` and [`MAX_RUN`], claiming them with one compare-and-swap; never blocks.
    /// Returns how many (0: empty). The elements of one run were pushed in this order, and
    /// each producer's own elements keep theirs. Wakes sleeping producers.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when a cell's stamp is impossible.
    pub fn try_pop_into(&self, out: &mut [T]) -> Result<usize, Corrupted> {
        let n = self.pop_run(out)?;
        if n > 0 {
            notify(&self.storage.control().not_full);
        }
        Ok(n)
    }

    /// Pops at least one and up to `out.len()` elements into `out` (see
    /// [`try_pop_into`](Self::try_pop_into)), waiting for the first as the [`WaitPolicy`]
    /// says, at most `timeout` (`None`: for ever). Returns how many. While it waits, it
    /// adopts the elements of dead consumers, up to `out.len()` each liveness tick.
    ///
    /// # Errors
    ///
    /// As [`pop_timeout`](Self::pop_timeout).
    pub fn pop_into(&self, out: &mut [T], timeout: Option<Duration>) -> Result<usize, PopError> {
        if out.is_empty() {
            return Ok(0);
        }
        let out = std::cell::RefCell::new(out);
        self.block_pop(
            timeout.and_then(deadline_after),
            || self.pop_run(&mut out.borrow_mut()).map(|n| (n > 0).then_some(n)),
            || {
                let mut out = out.borrow_mut();
                let n = try_adopt_in(&self.storage, self.capacity, out.len(), fill(&mut out));
                (n > 0).then_some(n)
            },
        )
    }

    /// One run into `out` (no wake-up).
    fn pop_run(&self, out: &mut [T]) -> Result<usize, Corrupted> {
        let want = out.len().min(MAX_RUN) as u64;
        if want == 0 {
            return Ok(0);
        }
        Ok(try_pop_in(&self.storage, self.capacity, want, fill(out))?.unwrap_or(0))
    }

    /// Waits as the [`WaitPolicy`] says until `attempt` gives something, running the
    /// repairs and then `adopt` at every liveness tick.
    fn block_pop<R>(
        &self,
        deadline: Option<std::time::Instant>,
        attempt: impl FnMut() -> Result<Option<R>, Corrupted>,
        mut adopt: impl FnMut() -> Option<R>,
    ) -> Result<R, PopError> {
        let control = self.storage.control();
        block_on(
            &self.storage,
            Side::Producers,
            &control.not_empty,
            &control.not_full,
            self.policy,
            deadline,
            attempt,
            || {
                repair(&self.storage);
                adopt()
            },
        )
        .map_err(PopError::from)
    }

    /// Takes the element of a cell whose consumer died before freeing it (see the module's
    /// "Repair"), running `then` on it; `None` when there is none. Blocking pops call
    /// this every liveness tick; it probes locks, so it is not for the fast path.
    ///
    #[doc(hidden)]
    pub fn try_adopt_then<R>(&self, then: impl FnOnce(T) -> R) -> Option<R> {
        let mut then = Some(then);
        let mut r = None;
        try_adopt_in(&self.storage, self.capacity, 1, |v| r = then.take().map(|f| f(v)));
        r
    }

    /// Pops the oldest element, waiting for one as the [`WaitPolicy`] says, for ever.
    ///
    /// # Errors
    ///
    /// [`PopError::PeerDead`] once every producer has died and all they published is
    /// taken; [`PopError::Corrupted`]. Never `Timeout`.
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
            timeout.and_then(deadline_after),
            || {
                let mut r = None;
                let popped = try_pop_in(&self.storage, self.capacity, 1, |v| r = Some(run(v)))?;
                // Relaxed: as in `adopt_one`.
                if popped.is_none() && self.adopting.load(Relaxed) {
                    return Ok(adopt_one());
                }
                Ok(popped.and(r))
            },
            adopt_one,
        )
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

    /// Slices: producers push runs of 1 to 7 (blocking `push_slice`) beside a producer
    /// pushing one at a time; consumers take runs into buffers of 1 to 5 (and some single
    /// pops). Every element exactly once, each producer's in order.
    #[test]
    fn slices_exactly_once_and_per_producer_order() {
        let (tx, rx) = with_capacity::<u64>(8);
        let per: u64 = if cfg!(miri) { 60 } else { 30_000 };
        let mut handles = Vec::new();
        for p in 0..3u64 {
            let tx = tx.clone();
            handles.push(std::thread::spawn(move || {
                let mut i = 0;
                while i < per {
                    let len = if p == 0 { 1 } else { 1 + (i % 7) }.min(per - i);
                    let slice: Vec<u64> = (i..i + len).map(|k| (p << 32) | k).collect();
                    if p == 0 {
                        tx.push(slice[0]).unwrap();
                    } else {
                        tx.push_slice(&slice).unwrap();
                    }
                    i += len;
                }
            }));
        }
        drop(tx);
        let total = 3 * per;
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut consumers = Vec::new();
        for c in 0..2u64 {
            let (rx, taken) = (rx.clone(), taken.clone());
            consumers.push(std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0u64; 5];
                let mut k = 0;
                while taken.load(std::sync::atomic::Ordering::Relaxed) < total {
                    k += 1;
                    let len = 1 + (k + c as usize) % 5;
                    if len == 5 && c == 1 {
                        if let Ok(v) = rx.try_pop() {
                            taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            got.push(v);
                        }
                        continue;
                    }
                    if let Ok(n) = rx.pop_into(&mut buf[..len], Some(Duration::from_millis(10))) {
                        assert!((1..=len).contains(&n), "{n} from a buffer of {len}");
                        taken.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                        got.extend_from_slice(&buf[..n]);
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
            let mut last = [None::<u64>; 3];
            for v in c.join().unwrap() {
                let (p, i) = ((v >> 32) as usize, v & 0xffff_ffff);
                assert!(last[p].is_none_or(|l| l < i), "producer {p}: {i} after {last:?}");
                last[p] = Some(i);
                assert!(all.insert(v), "duplicate {v:#x}");
            }
        }
        assert_eq!(all.len() as u64, total);
    }

    /// A run is cut at the first cell not ready: a full ring takes part of a slice, and a
    /// pop into a long buffer takes only what is published; runs longer than `MAX_RUN`
    /// move in several claims.
    #[test]
    fn runs_stop_at_the_ring_edges_and_at_max_run() {
        let (tx, rx) = with_capacity::<u64>(4);
        assert_eq!(tx.try_push_slice(&[]), Ok(0));
        assert_eq!(tx.try_push_slice(&[1, 2, 3]), Ok(3));
        assert_eq!(tx.try_push_slice(&[4, 5, 6]), Ok(1));
        assert_eq!(tx.try_push_slice(&[5]), Ok(0));
        let mut out = [0; 3];
        assert_eq!(rx.try_pop_into(&mut out), Ok(3));
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(rx.try_pop_into(&mut out), Ok(1));
        assert_eq!(out[0], 4);
        assert_eq!(rx.try_pop_into(&mut out), Ok(0));
        assert_eq!(rx.pop_into(&mut out, Some(Duration::from_millis(1))), Err(PopError::Timeout));

        let (tx, rx) = with_capacity::<u64>(256);
        let values: Vec<u64> = (0..200).collect();
        assert_eq!(tx.try_push_slice(&values), Ok(MAX_RUN));
        tx.push_slice(&values[MAX_RUN..]).unwrap();
        let mut out = vec![0; 256];
        let mut got = Vec::new();
        while got.len() < 200 {
            let n = rx.try_pop_into(&mut out).unwrap();
            assert!((1..=MAX_RUN).contains(&n));
            got.extend_from_slice(&out[..n]);
        }
        assert_eq!(got, values);
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
