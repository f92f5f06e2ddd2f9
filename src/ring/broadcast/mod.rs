//! The broadcast ring: one producer, up to [`MAX_READERS`] readers, each reading every
//! element published after it joined, in order, with no copy per reader. Generic over where
//! it lives ([`Cursors`]): on the heap ([`with_capacity`], for tests and models) or in a
//! named segment (`named::BroadcastRing`), where the readers are participants of the ring.
//!
//! Positions are `u64` counters as in the other rings. The producer keeps `tail` (the
//! next position it writes) and publishes it with a Release store. Reader `i` owns a
//! *cursor* (the next position it reads), stored with Release after it has read the cells
//! before it, and counts while bit `i` of the *readers* mask is set. The producer may write
//! position `p` (overwriting `p - capacity`) only when every counted cursor is above
//! `p - capacity`: the slowest reader holds it back (nothing is lost). It keeps the minimum
//! it last computed and recomputes it only when that says "full" (storing it as `head`,
//! for reports: no endpoint reads it).
//!
//! Joining races the producer: a reader stores its cursor at the `tail` it read and sets
//! its bit, and the producer may have computed its minimum without it. Both sides use a
//! SeqCst fence between their stores and their loads (the producer's last `tail` store,
//! then the fence, then the mask and the cursors; the reader's cursor and bit, then the
//! fence, then `tail`), so either the producer's minimum counts the new cursor, or the
//! reader's `tail` load sees a `tail` at least as new as the one the minimum was computed
//! under (and a minimum is never above the `tail` it was computed under). The reader
//! starts at that second `tail`, which is safe in both cases; what was published between
//! its two loads is not its to read. A cursor the producer reads before the reader's own
//! store (a stale value of its entry) is lower than any it will store: it only holds the
//! producer back longer.
//!
//! A reader that leaves clears its bit. One that dies leaves it set: the producer, blocked
//! at a liveness tick, clears the bit of every reader whose entry nobody holds any more
//! ([`Cursors::drop_if_gone`]), so a dead reader holds it back for a tick at most.
//!
//! *Lagging* rings ([`Cursors::lagging`]): the producer never looks at the cursors and
//! never waits. Before it writes position `p` it stores `p + 1` in `head` (the position
//! being written, plus one) and issues a Release fence; then it writes the cell and
//! publishes `tail`. A reader reads its cell as a seqlock reader does (a volatile copy,
//! an Acquire fence, then `head`): if `head` says the producer has begun writing position
//! `cursor + capacity` or later, which overwrites the cell, the copy is dropped; the
//! reader moves on to the oldest element still intact and says how many it missed
//! ([`TryReadError::Lagged`]). Cursors then only report where each reader is.

use std::marker::PhantomData;

use bytemuck::Pod;

use super::spsc::push_retry;
use super::{PushTimeoutError, ReadTimeoutError, Storage, TryPushError, TryReadError, wait_for};
use crate::layout::{Corrupted, MAX_PARTICIPANTS, SpscCell};
use crate::liveness::{Role, Tick};
use crate::sync::{AtomicU64, Ordering, fence};
use crate::wait::{Deadline, Registration, WaitPolicy, Waits, notify, notify_fenced};

mod dead;
mod heap;
pub(crate) use dead::ReaderDropped;
use dead::{bits, drop_gone_readers};
pub use heap::{HeapCursors, Subscriber, with_capacity, with_policy};

/// Readers of one broadcast ring at once (one bit each of the readers mask).
pub const MAX_READERS: usize = MAX_PARTICIPANTS;

/// Where a broadcast ring's readers mask and cursors live, beside its cells.
///
/// # Safety
///
/// As [`Storage`]; and `readers()` and `cursor(i)` (for every `i < MAX_READERS`) always
/// return the same memory, shared only with the ring's other endpoints.
pub unsafe trait Cursors {
    /// Bit `i` set while reader `i`'s cursor counts.
    fn readers(&self) -> &AtomicU64;
    /// Reader `i`'s cursor: the next position it reads.
    fn cursor(&self, index: usize) -> &AtomicU64;
    /// Clears bit `index` if no endpoint holds that reader's place any more (it died), and
    /// runs `also(index)` (a broadcast channel clears the reader's holds on its slots),
    /// both while no new reader can take the place; whether it did. Slow paths only (the
    /// producer's liveness ticks).
    fn drop_if_gone(&self, index: usize, also: &dyn Fn(usize)) -> bool {
        let _ = (index, also);
        false
    }
    /// Reader `index` has left (its bit is clear): its place is free again.
    fn left(&self, index: usize) {
        let _ = index;
    }
    /// Whether the producer never waits for readers (see the module docs).
    fn lagging(&self) -> bool;
}

/// The writing end.
#[derive(Debug)]
pub struct Producer<T, S> {
    storage: S,
    local: Local,
    policy: Waits,
    /// Run with the index of each dead reader dropped at a tick, under its place's lock.
    on_drop: Option<ReaderDropped>,
    _elem: PhantomData<fn(T) -> T>,
}

/// The producer's own positions.
#[derive(Debug, Clone, Copy)]
struct Local {
    /// The next position to write (this producer's own copy of `tail`).
    tail: u64,
    /// A lower bound of every counted cursor, as last computed.
    min: u64,
    capacity: u64,
    /// The producer's own place in the mask (0 if it has none): never a reader's, whatever
    /// the mask says.
    own: u64,
    /// Whether it never waits for readers.
    lagging: bool,
}

/// A reading end; dropping it takes its cursor out of the mask.
#[derive(Debug)]
pub struct Reader<T, S: Cursors> {
    storage: S,
    lagging: bool,
    index: usize,
    /// The next position to read (this reader's own copy of its cursor).
    cursor: u64,
    capacity: u64,
    policy: Waits,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Pod + Send, S: Storage<Cell = SpscCell<T>> + Cursors> Producer<T, S> {
    /// The producer of the ring in `storage`, writing from the ring's `tail` on. `own`: the
    /// producer's place in the mask, if it has one (a participant entry), which no reader
    /// holds while it does.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the ring's capacity is not a power of two.
    pub(crate) fn new(storage: S, own: Option<usize>) -> Result<Self, Corrupted> {
        let capacity = storage.cells().len() as u64;
        if !capacity.is_power_of_two() {
            return Err(Corrupted { what: "broadcast ring capacity is not a power of two" });
        }
        let own = own.filter(|&i| i < MAX_READERS).map_or(0, |i| 1 << i);
        // Relaxed: our own entry, whose bit a dead reader before us may have left (our
        // `slowest` ignores it anyway; cleared for reports).
        storage.readers().fetch_and(!own, Ordering::Relaxed);
        // Acquire: pairs with the Release store of the producer before us, if any.
        let tail = storage.control().tail.load(Ordering::Acquire);
        let min = slowest(&storage, tail, own);
        let local = Local { tail, min, capacity, own, lagging: storage.lagging() };
        Ok(Self { storage, local, policy: Waits::default(), on_drop: None, _elem: PhantomData })
    }

    /// Runs `f` with the index of each dead reader dropped at a tick, while no new reader
    /// can take its place (see [`Cursors::drop_if_gone`]).
    #[cfg_attr(loom, allow(dead_code))] // used by channels
    pub(crate) fn on_reader_dropped(&mut self, f: ReaderDropped) {
        self.on_drop = Some(f);
    }

    /// Publishes `value` if every reader has room for it; never blocks. With no reader,
    /// the element goes nowhere (and is never read).
    ///
    /// # Errors
    ///
    /// [`TryPushError::Full`] when the slowest reader is a whole ring behind.
    pub fn try_push(&mut self, value: T) -> Result<(), TryPushError<T>> {
        try_push_in(&self.storage, &mut self.local, value)
    }

    /// Publishes `value`, waiting for the slowest reader until `deadline`. At each
    /// liveness tick of the wait, the readers that died stop counting.
    pub(crate) fn push_until(
        &mut self,
        value: T,
        deadline: Deadline,
    ) -> Result<(), PushTimeoutError<T>> {
        let Self { storage, local, policy, on_drop, .. } = self;
        let storage = &*storage;
        let attempt = || try_push_in(storage, local, value).map(Some).or_else(push_retry);
        let on_tick = || {
            let dropped = drop_gone_readers(storage, on_drop.as_ref(), 0);
            if dropped > 0 { Tick::Retry } else { Tick::Idle }
        };
        wait_for(storage, Role::Producer, policy, deadline, attempt, on_tick)
            .map_err(|b| PushTimeoutError::from_blocked(b, value))
    }

    /// The storage, for the layers above (async waits park on its wait word).
    #[cfg_attr(any(loom, not(feature = "async")), allow(dead_code))]
    pub(crate) fn storage(&self) -> &S {
        &self.storage
    }

    /// The position the next push writes.
    pub fn next_position(&self) -> u64 {
        self.local.tail
    }

    /// A lower bound of every counted reader's cursor, computed now (see [`slowest_now`]).
    pub fn slowest(&self) -> u64 {
        slowest(&self.storage, self.local.tail, self.local.own)
    }

    /// Drops every reader in the readers mask or in `held` (places a broadcast channel's
    /// slots name as holders) whose place nobody holds any more, with this producer's
    /// [`on_reader_dropped`](Self::on_reader_dropped) run under each place's lock; how
    /// many. Slow paths (ticks): a lock probe per place.
    #[cfg_attr(loom, allow(dead_code))] // used by channels
    pub(crate) fn drop_gone_readers(&self, held: u64) -> usize {
        drop_gone_readers(&self.storage, self.on_drop.as_ref(), held)
    }

    /// Whether every reader is gone, and how (see `ring::peers_gone`).
    #[cfg_attr(loom, allow(dead_code))] // used by channels
    pub(crate) fn consumers_gone(&self, probe: bool) -> Option<crate::liveness::Blocked> {
        super::peers_gone(&self.storage, Role::Consumer, probe)
    }

    /// Whether an element some counted reader has yet to read (between the slowest cursor
    /// and `tail`) satisfies `f`. Reads every such cell: slow paths only.
    #[cfg_attr(loom, allow(dead_code))] // used by channels
    pub(crate) fn any_unread(&self, mut f: impl FnMut(&T) -> bool) -> bool {
        let (tail, min) = (self.local.tail, self.slowest());
        (0..tail.wrapping_sub(min).min(self.local.capacity)).any(|i| {
            let cell =
                &self.storage.cells()[(min.wrapping_add(i) & (self.local.capacity - 1)) as usize];
            // SAFETY: this producer is the cells' only writer, and it is not writing now;
            // `T: Pod`.
            f(&cell.value.with(|p| unsafe { p.read() }))
        })
    }

    /// Readers counted now (a snapshot).
    pub fn readers(&self) -> usize {
        // Relaxed: a diagnostic.
        (self.storage.readers().load(Ordering::Relaxed) & !self.local.own).count_ones() as usize
    }

    /// Sets how blocking pushes wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy.set(policy);
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.local.capacity as usize
    }

    /// Whether the ring is lagging (as read when this producer attached).
    pub fn is_lagging(&self) -> bool {
        self.local.lagging
    }
}

/// [`Producer::try_push`] over the producer's parts.
fn try_push_in<T: Pod, S: Storage<Cell = SpscCell<T>> + Cursors>(
    storage: &S,
    local: &mut Local,
    value: T,
) -> Result<(), TryPushError<T>> {
    if local.lagging {
        // Relaxed, then a Release fence: a reader that sees any byte of the write below
        // sees this store too (its Acquire fence after its copy), and drops its copy.
        storage.control().head.store(local.tail.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    } else if local.tail.wrapping_sub(local.min) >= local.capacity {
        local.min = slowest(storage, local.tail, local.own);
        // Relaxed: for reports only (`inspect`): where the slowest reader was last seen.
        storage.control().head.store(local.min, Ordering::Relaxed);
        if local.tail.wrapping_sub(local.min) >= local.capacity {
            return Err(TryPushError::Full(value));
        }
    }
    let cell = &storage.cells()[(local.tail & (local.capacity - 1)) as usize];
    if local.lagging {
        // A reader may be copying the cell's previous element meanwhile: its copy is
        // volatile, and dropped once it sees `head` announce this write (module docs).
        // SAFETY: a write inside the cell array; only such volatile copies race it.
        cell.value.with_mut(|p| unsafe { p.write_volatile(value) });
    } else {
        // Every counted cursor is above `tail - capacity`: the Acquire loads in `slowest`
        // saw the readers' Release stores made after they read the cell's previous element.
        // SAFETY: so no reader reads the cell until the `tail` store below publishes it.
        cell.value.with_mut(|p| unsafe { p.write(value) });
    }
    local.tail = local.tail.wrapping_add(1);
    // Release: pairs with the readers' Acquire loads of `tail` (the cell is written).
    storage.control().tail.store(local.tail, Ordering::Release);
    // Fenced: the readers register as sleepers with a fence, not the heavy barrier (an idle
    // fan-out's receivers would each interrupt every CPU running a registered process).
    notify_fenced(&storage.control().not_empty);
    Ok(())
}

/// The lowest counted cursor (the producer's `own` place is never a reader's), as a
/// position at most `tail`: `tail` when no reader counts.
/// A cursor above `tail` (a forged one: no reader is ahead of what was published) holds
/// nothing back; one more than a ring behind (a reader joining, whose first value was
/// stale) holds the producer back until the reader raises it.
fn slowest<S: Cursors>(storage: &S, tail: u64, own: u64) -> u64 {
    // SeqCst: orders our last `tail` store before the loads below against a joining
    // reader's cursor and bit stores and its `tail` load (see the module docs).
    fence(Ordering::SeqCst);
    // Acquire: pairs with each reader's Release stores (its reads are done).
    let mask = storage.readers().load(Ordering::Acquire) & !own;
    let behind = bits(mask)
        // Acquire: as above.
        .map(|i| tail.wrapping_sub(storage.cursor(i).load(Ordering::Acquire)))
        // Ahead of `tail` (wrapped: more than half the counter behind): holds nothing.
        .map(|b| if b > u64::MAX / 2 { 0 } else { b })
        .max()
        .unwrap_or(0);
    tail.wrapping_sub(behind)
}

/// A lower bound of every counted reader's cursor, for an endpoint other than the producer
/// (a broadcast channel's reader reclaiming a slot): no reader whose cursor it did not count
/// reads a position below it. `tail` is read first, then the fence in `slowest`, as the
/// producer's own `tail` store comes before its fence: a reader joining meanwhile starts at
/// that `tail` or later (module docs).
pub fn slowest_now<S: Storage + Cursors>(storage: &S) -> u64 {
    // Acquire: pairs with the producer's Release `tail` store.
    let tail = storage.control().tail.load(Ordering::Acquire);
    slowest(storage, tail, 0)
}

impl<T: Pod + Send, S: Storage<Cell = SpscCell<T>> + Cursors> Reader<T, S> {
    /// Joins the ring in `storage` as reader `index` (a place nobody else holds): it reads
    /// what is published from now on.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the ring's capacity is not a power of two.
    pub(crate) fn join(storage: S, index: usize) -> Result<Self, Corrupted> {
        assert!(index < MAX_READERS, "a reader's place is below MAX_READERS");
        let capacity = storage.cells().len() as u64;
        if !capacity.is_power_of_two() {
            return Err(Corrupted { what: "broadcast ring capacity is not a power of two" });
        }
        let tail = &storage.control().tail;
        // Relaxed: a first value for the cursor; it is raised below after the fence.
        let at = tail.load(Ordering::Relaxed);
        // Relaxed, both: ordered before the `tail` load below by the fence.
        storage.cursor(index).store(at, Ordering::Relaxed);
        storage.readers().fetch_or(1 << index, Ordering::Relaxed);
        // SeqCst: our cursor and bit before the `tail` load below, against the producer's
        // `tail` store and its loads of the mask and cursors (see the module docs).
        fence(Ordering::SeqCst);
        // Acquire: pairs with the producer's Release `tail` store. Either the producer's
        // minimum counts our cursor `at`, or it was computed under a `tail` no newer than
        // this one: starting here, at or above that minimum, is safe in both cases.
        let now = tail.load(Ordering::Acquire);
        if now != at {
            // Relaxed: a raise of our own cursor; a producer that read the lower value
            // only held back more than it had to.
            storage.cursor(index).store(now, Ordering::Relaxed);
        }
        Ok(Self {
            lagging: storage.lagging(),
            storage,
            index,
            cursor: now,
            capacity,
            // Every publication on `not_empty` is followed by `notify_fenced` (the push's,
            // and a departing endpoint's).
            policy: Waits::default().registering(Registration::Fenced),
            _elem: PhantomData,
        })
    }

    /// The next element published since this reader joined, if there is one; never
    /// blocks.
    ///
    /// # Errors
    ///
    /// [`TryReadError::Empty`]; [`TryReadError::Lagged`] (lagging rings: the next read
    /// goes on with the oldest element still there); [`TryReadError::Corrupted`] when
    /// `tail` is more than a ring ahead of this reader of a blocking ring.
    pub fn try_read(&mut self) -> Result<T, TryReadError> {
        read_in(&self.storage, self.index, &mut self.cursor, self.capacity, self.lagging)
    }

    /// [`try_read`](Self::try_read), running `then` on the element's position and value
    /// before this reader's cursor passes it (a broadcast channel takes its hold there).
    ///
    /// # Errors
    ///
    /// As [`try_read`](Self::try_read).
    pub fn try_read_then<R>(&mut self, then: impl FnOnce(u64, T) -> R) -> Result<R, TryReadError> {
        let Self { storage, index, cursor, capacity, lagging, .. } = self;
        read_then_in(&*storage, *index, cursor, *capacity, *lagging, then)
    }

    /// Where this reader's cursor and the ring live (what [`slowest_now`] reads).
    pub fn cursors(&self) -> &S {
        &self.storage
    }

    /// The next element, waiting for it until `deadline`; once the producer has gone and
    /// everything it published was read, `Disconnected` (`PeerDead` if it died).
    pub(crate) fn read_until(&mut self, deadline: Deadline) -> Result<T, ReadTimeoutError> {
        let Self { storage, index, cursor, capacity, policy, lagging, .. } = self;
        let storage = &*storage;
        // A lag ends the wait as an outcome of its own (told once; the next read goes on).
        let attempt = || match read_in(storage, *index, cursor, *capacity, *lagging) {
            Ok(v) => Ok(Some(Ok(v))),
            Err(TryReadError::Lagged(n)) => Ok(Some(Err(n))),
            Err(TryReadError::Empty | TryReadError::Disconnected | TryReadError::PeerDead) => {
                Ok(None)
            }
            Err(TryReadError::Corrupted(c)) => Err(c),
        };
        match wait_for(storage, Role::Consumer, policy, deadline, attempt, || Tick::Idle) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(missed)) => Err(ReadTimeoutError::Lagged(missed)),
            Err(b) => Err(ReadTimeoutError::from(b)),
        }
    }

    /// The next element, waiting for it until `deadline`, with `then` run on its position
    /// and value before the cursor passes it (see `read_then_in`); at each liveness tick
    /// of the wait, `tick` as in the other rings' `pop_then_ticking`. A lag (lagging rings)
    /// ends the wait with `lagged(missed)`, or is `Corrupted` where that gives `None`.
    #[cfg_attr(loom, allow(dead_code))] // used by channels
    pub(crate) fn read_then_ticking<R>(
        &mut self,
        deadline: Deadline,
        then: impl FnOnce(u64, T) -> R,
        mut lagged: impl FnMut(u64) -> Option<R>,
        mut tick: impl FnMut() -> Tick<R>,
    ) -> Result<R, super::PopTimeoutError> {
        let Self { storage, index, cursor, capacity, policy, lagging, .. } = self;
        let storage = &*storage;
        let mut then = Some(then);
        // `then` runs once: only a successful read calls it, and that ends the wait.
        let attempt = || {
            let each = |pos, v| then.take().map(|f| f(pos, v));
            match read_then_in(storage, *index, cursor, *capacity, *lagging, each) {
                Ok(r) => Ok(r),
                Err(TryReadError::Empty | TryReadError::Disconnected | TryReadError::PeerDead) => {
                    Ok(None)
                }
                Err(TryReadError::Lagged(missed)) => match lagged(missed) {
                    Some(r) => Ok(Some(r)),
                    None => Err(Corrupted { what: "a broadcast channel's ring lagged a reader" }),
                },
                Err(TryReadError::Corrupted(c)) => Err(c),
            }
        };
        // (`then` taken already cannot be: its one successful read ended the wait.)
        wait_for(storage, Role::Consumer, policy, deadline, attempt, &mut tick)
            .map_err(super::PopTimeoutError::from)
    }

    /// How blocking reads wait.
    pub fn wait_policy(&self) -> WaitPolicy {
        self.policy.policy()
    }

    /// Whether the ring is lagging (as read when this reader joined).
    pub fn is_lagging(&self) -> bool {
        self.lagging
    }

    /// Takes this reader's cursor out of the mask now (its drop does too): the producer no
    /// longer waits for it.
    #[cfg_attr(loom, allow(dead_code))] // used by channels
    pub(crate) fn leave(&self) {
        // Release: pairs with the producer's Acquire mask load (our reads are done).
        self.storage.readers().fetch_and(!(1 << self.index), Ordering::Release);
    }

    /// This reader's place in the readers mask.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The storage, for the layers above (async waits park on its wait word).
    #[cfg_attr(any(loom, not(feature = "async")), allow(dead_code))]
    pub(crate) fn storage(&self) -> &S {
        &self.storage
    }

    /// Sets how blocking reads wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy.set(policy);
    }

    /// Elements published and not yet read by this reader (a snapshot).
    pub fn len(&self) -> usize {
        // Relaxed: a diagnostic snapshot.
        let tail = self.storage.control().tail.load(Ordering::Relaxed);
        tail.wrapping_sub(self.cursor).min(self.capacity) as usize
    }

    /// Whether this reader has read everything published (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T, S: Cursors> Drop for Reader<T, S> {
    fn drop(&mut self) {
        // Release: pairs with the producer's Acquire mask load (our reads are done).
        self.storage.readers().fetch_and(!(1 << self.index), Ordering::Release);
        self.storage.left(self.index);
    }
}

/// [`Reader::try_read`] over the reader's parts.
fn read_in<T: Pod, S: Storage<Cell = SpscCell<T>> + Cursors>(
    storage: &S,
    index: usize,
    cursor: &mut u64,
    capacity: u64,
    lagging: bool,
) -> Result<T, TryReadError> {
    read_then_in(storage, index, cursor, capacity, lagging, |_, v| v)
}

/// [`read_in`], running `then` on the element's position and value before the cursor
/// passes it (a broadcast channel's reader takes its hold on the message's slot there, so
/// that a sender seeing the cursor past the message also sees the hold).
fn read_then_in<T: Pod, S: Storage<Cell = SpscCell<T>> + Cursors, R>(
    storage: &S,
    index: usize,
    cursor: &mut u64,
    capacity: u64,
    lagging: bool,
    then: impl FnOnce(u64, T) -> R,
) -> Result<R, TryReadError> {
    let control = storage.control();
    // Acquire: pairs with the producer's Release `tail` store.
    let tail = control.tail.load(Ordering::Acquire);
    let ahead = tail.wrapping_sub(*cursor);
    if ahead == 0 {
        return Err(TryReadError::Empty);
    }
    if ahead > capacity {
        if !lagging || ahead > u64::MAX / 2 {
            return Err(TryReadError::Corrupted(Corrupted {
                what: "broadcast ring tail more than a ring ahead of a reader",
            }));
        }
        // Overwritten already: on with the oldest element published and still there.
        return Err(lagged(storage, index, cursor, tail.wrapping_sub(capacity)));
    }
    let cell = &storage.cells()[(*cursor & (capacity - 1)) as usize];
    let done = if lagging {
        // The producer may be rewriting the cell: a volatile copy, dropped below if `head`
        // shows that a rewrite began.
        // SAFETY: a read inside the cell array of a `Pod` (any bytes are a valid `T`).
        let value = cell.value.with(|p| unsafe { p.read_volatile() });
        // Acquire: orders the copy above before the `head` load below (the producer's
        // Release fence orders its `head` store before its write of the cell).
        fence(Ordering::Acquire);
        // Relaxed: after the fence.
        let writing = control.head.load(Ordering::Relaxed);
        let overwrites = writing.wrapping_sub(*cursor);
        if overwrites > capacity && overwrites <= u64::MAX / 2 {
            // The rewrite of this cell (position cursor + capacity) has begun.
            return Err(lagged(storage, index, cursor, writing.wrapping_sub(capacity)));
        }
        then(*cursor, value)
    } else {
        // The position is below `tail` (the element is written), and our cursor keeps the
        // producer from rewriting it until the store below. Read straight into `then`'s
        // argument (one copy of the element, not two).
        // SAFETY: so the cell holds the element, unchanged; `T: Pod`.
        then(*cursor, cell.value.with(|p| unsafe { p.read() }))
    };
    *cursor = cursor.wrapping_add(1);
    // Release: pairs with the producer's Acquire cursor loads (our read is done), and with
    // the Acquire loads of a broadcast channel's reclaimer (`then`'s hold is visible).
    storage.cursor(index).store(*cursor, Ordering::Release);
    if !lagging {
        // A lagging producer never waits: nobody to wake.
        notify(&control.not_full);
    }
    Ok(done)
}

/// A lagging reader's jump to `oldest` (the oldest element still intact): how many it
/// missed.
fn lagged<S: Cursors>(storage: &S, index: usize, cursor: &mut u64, oldest: u64) -> TryReadError {
    let missed = oldest.wrapping_sub(*cursor);
    *cursor = oldest;
    // Release: as a read's (a report of where this reader is).
    storage.cursor(index).store(oldest, Ordering::Release);
    TryReadError::Lagged(missed)
}

#[cfg(all(test, not(loom)))]
mod tests;
