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
use std::sync::Arc;

use bytemuck::Pod;

use super::spsc::push_retry;
use super::{PushTimeoutError, ReadTimeoutError, Storage, TryPushError, TryReadError, wait_for};
use crate::layout::{Corrupted, MAX_PARTICIPANTS, RingControl, SpscCell};
use crate::liveness::{Role, Tick, Unwatched};
use crate::sync::{AtomicU64, Ordering, fence};
use crate::wait::{Deadline, WaitPolicy, notify};

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
    /// Clears bit `index` if no endpoint holds that reader's place any more (it died), so
    /// that no new reader can take the place meanwhile; whether it did. Slow paths only
    /// (the producer's liveness ticks).
    fn drop_if_gone(&self, index: usize) -> bool {
        let _ = index;
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
    policy: WaitPolicy,
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
    policy: WaitPolicy,
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
        Ok(Self { storage, local, policy: WaitPolicy::default(), _elem: PhantomData })
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
        let Self { storage, local, policy, .. } = self;
        let storage = &*storage;
        let attempt = || try_push_in(storage, local, value).map(Some).or_else(push_retry);
        let on_tick = || {
            // Relaxed: which places to look at; each drop decides under its entry's lock.
            let mask = storage.readers().load(Ordering::Relaxed);
            let dropped = bits(mask).filter(|&i| storage.drop_if_gone(i)).count();
            if dropped > 0 { Tick::Retry } else { Tick::Idle }
        };
        wait_for(storage, Role::Producer, *policy, deadline, attempt, on_tick)
            .map_err(|b| PushTimeoutError::from_blocked(b, value))
    }

    /// The storage, for the layers above (async waits park on its wait word).
    #[cfg_attr(any(loom, not(feature = "async")), allow(dead_code))]
    pub(crate) fn storage(&self) -> &S {
        &self.storage
    }

    /// Readers counted now (a snapshot).
    pub fn readers(&self) -> usize {
        // Relaxed: a diagnostic.
        (self.storage.readers().load(Ordering::Relaxed) & !self.local.own).count_ones() as usize
    }

    /// Sets how blocking pushes wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy = policy;
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.local.capacity as usize
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
    // SAFETY: blocking: every counted cursor is above `tail - capacity` (the Acquire loads
    // in `slowest` saw the readers' Release stores made after they read that cell's
    // previous element), and no reader reads position `tail` before the store below.
    // Lagging: a reader may be copying the cell's previous element meanwhile; its copy is
    // volatile and dropped when `head` shows this write (see the module docs).
    cell.value.with_mut(|p| unsafe { p.write_volatile(value) });
    local.tail = local.tail.wrapping_add(1);
    // Release: pairs with the readers' Acquire loads of `tail` (the cell is written).
    storage.control().tail.store(local.tail, Ordering::Release);
    notify(&storage.control().not_empty);
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

/// The indices of the bits set in `mask`, below [`MAX_READERS`].
fn bits(mask: u64) -> impl Iterator<Item = usize> {
    (0..MAX_READERS).filter(move |&i| mask & (1 << i) != 0)
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
            policy: WaitPolicy::default(),
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

    /// The next element, waiting for it until `deadline`; once the producer has gone and
    /// everything it published was read, `Disconnected` (`PeerDead` if it died).
    pub(crate) fn read_until(&mut self, deadline: Deadline) -> Result<T, ReadTimeoutError> {
        let Self { storage, index, cursor, capacity, policy, lagging, .. } = self;
        let storage = &*storage;
        let mut missed = None;
        let attempt = || match read_in(storage, *index, cursor, *capacity, *lagging) {
            Ok(v) => Ok(Some(v)),
            Err(TryReadError::Empty | TryReadError::Disconnected | TryReadError::PeerDead) => {
                Ok(None)
            }
            Err(TryReadError::Lagged(n)) => {
                // Ends the wait: told once, then the next read goes on.
                missed = Some(n);
                Err(Corrupted { what: "lagged" })
            }
            Err(TryReadError::Corrupted(c)) => Err(c),
        };
        let read = wait_for(storage, Role::Consumer, *policy, deadline, attempt, || Tick::Idle);
        read.map_err(|b| match missed {
            Some(n) => ReadTimeoutError::Lagged(n),
            None => ReadTimeoutError::from(b),
        })
    }

    /// The storage, for the layers above (async waits park on its wait word).
    #[cfg_attr(any(loom, not(feature = "async")), allow(dead_code))]
    pub(crate) fn storage(&self) -> &S {
        &self.storage
    }

    /// Sets how blocking reads wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy = policy;
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

/// A broadcast ring on the heap, shared by `Arc` between the endpoints of one process.
#[derive(Debug)]
pub struct HeapCursors<T> {
    inner: Arc<HeapBroadcast<T>>,
}

impl<T> Clone for HeapCursors<T> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

#[derive(Debug)]
struct HeapBroadcast<T> {
    control: RingControl,
    cells: Box<[SpscCell<T>]>,
    readers: AtomicU64,
    /// The places readers hold (a heap ring has no participant table).
    taken: AtomicU64,
    max_readers: usize,
    lagging: bool,
    cursors: Box<[AtomicU64]>,
}

// SAFETY: the cells hold `Pod` values behind `UnsafeCell`, accessed only under the ring
// protocol (see the module docs). `T: Send`: values cross threads.
unsafe impl<T: Send> Sync for HeapBroadcast<T> {}

// SAFETY: the control block, cells and cursors live as long as the `Arc`; the capacity is
// asserted a power of two at construction and never changes.
unsafe impl<T> Storage for HeapCursors<T> {
    type Cell = SpscCell<T>;
    type Watch = Unwatched;
    fn control(&self) -> &RingControl {
        &self.inner.control
    }
    fn cells(&self) -> &[SpscCell<T>] {
        &self.inner.cells
    }
    fn watch(&self) -> &Unwatched {
        &Unwatched
    }
}

// SAFETY: the mask and the cursors live as long as the `Arc`.
unsafe impl<T> Cursors for HeapCursors<T> {
    fn readers(&self) -> &AtomicU64 {
        &self.inner.readers
    }
    fn cursor(&self, index: usize) -> &AtomicU64 {
        &self.inner.cursors[index]
    }
    fn left(&self, index: usize) {
        // Relaxed: a place of this process's heap ring; the next join orders the rest.
        self.inner.taken.fetch_and(!(1 << index), Ordering::Relaxed);
    }
    fn lagging(&self) -> bool {
        self.inner.lagging
    }
}

/// A heap broadcast ring of `capacity` cells (a power of two, at least 1) for up to
/// `max_readers` readers at once, and its producer.
///
/// # Panics
///
/// If `capacity` is not a power of two in `1..=2^24` or `max_readers` is not in
/// `1..=MAX_READERS`.
pub fn with_capacity<T: Pod + Send>(
    capacity: usize,
    max_readers: usize,
) -> Producer<T, HeapCursors<T>> {
    with_policy(capacity, max_readers, false)
}

/// As [`with_capacity`], `lagging` saying whether the producer never waits for readers.
///
/// # Panics
///
/// As [`with_capacity`].
pub fn with_policy<T: Pod + Send>(
    capacity: usize,
    max_readers: usize,
    lagging: bool,
) -> Producer<T, HeapCursors<T>> {
    assert!(capacity.is_power_of_two() && capacity <= 1 << 24, "capacity {capacity}");
    assert!((1..=MAX_READERS).contains(&max_readers), "max_readers {max_readers}");
    let inner = HeapBroadcast {
        control: RingControl::default(),
        cells: (0..capacity).map(|_| SpscCell::new()).collect(),
        readers: AtomicU64::new(0),
        taken: AtomicU64::new(0),
        max_readers,
        lagging,
        cursors: (0..MAX_READERS).map(|_| AtomicU64::new(0)).collect(),
    };
    let storage = HeapCursors { inner: Arc::new(inner) };
    Producer::new(storage, None).expect("a new ring is consistent")
}

/// Makes readers of a heap ring (see [`Producer::subscriber`]).
#[derive(Debug, Clone)]
pub struct Subscriber<T> {
    storage: HeapCursors<T>,
}

impl<T: Pod + Send> Subscriber<T> {
    /// A new reader, which reads what is published from now on; `None` when
    /// `max_readers` readers are there.
    pub fn subscribe(&self) -> Option<Reader<T, HeapCursors<T>>> {
        let inner = &self.storage.inner;
        let index = (0..inner.max_readers).find(|&i| {
            // Relaxed: a place of this process's heap ring; the join orders the rest.
            inner.taken.fetch_or(1 << i, Ordering::Relaxed) & (1 << i) == 0
        })?;
        let reader = Reader::join(self.storage.clone(), index).expect("a heap ring is consistent");
        Some(reader)
    }
}

impl<T: Pod + Send> Producer<T, HeapCursors<T>> {
    /// A new reader (see [`Subscriber::subscribe`]).
    pub fn subscribe(&self) -> Option<Reader<T, HeapCursors<T>>> {
        self.subscriber().subscribe()
    }

    /// A handle that makes readers from any thread while this producer pushes.
    pub fn subscriber(&self) -> Subscriber<T> {
        Subscriber { storage: self.storage.clone() }
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
    // SAFETY: the position is below `tail` (the element is written). Blocking: our cursor
    // keeps the producer from rewriting it until the store below. Lagging: the producer
    // may be rewriting it; a volatile copy of a `Pod` (any bytes are a valid `T`), dropped
    // below if `head` shows a rewrite began.
    let value = cell.value.with(|p| unsafe { p.read_volatile() });
    if lagging {
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
    }
    *cursor = cursor.wrapping_add(1);
    // Release: pairs with the producer's Acquire cursor loads (our read is done).
    storage.cursor(index).store(*cursor, Ordering::Release);
    notify(&control.not_full);
    Ok(value)
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
mod tests {
    use super::{TryPushError, TryReadError, with_capacity, with_policy};

    #[test]
    fn every_reader_gets_every_element_in_order_and_the_slowest_holds_the_producer() {
        let mut tx = with_capacity::<u64>(4, 3);
        let mut a = tx.subscribe().unwrap();
        let mut b = tx.subscribe().unwrap();
        for v in 0..4 {
            tx.try_push(v).unwrap();
        }
        assert!(
            matches!(tx.try_push(4), Err(TryPushError::Full(4))),
            "a ring ahead of the slowest"
        );
        assert_eq!((0..4).map(|_| a.try_read().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(matches!(tx.try_push(4), Err(TryPushError::Full(4))), "b has read nothing yet");
        assert_eq!(b.try_read().unwrap(), 0);
        tx.try_push(4).unwrap();
        assert_eq!(a.try_read().unwrap(), 4);
        assert!(matches!(a.try_read(), Err(TryReadError::Empty)));
        assert_eq!((0..4).map(|_| b.try_read().unwrap()).collect::<Vec<_>>(), [1, 2, 3, 4]);
        drop(b);
        for v in 5..9 {
            tx.try_push(v).unwrap(); // b's cursor gone: only a counts
        }
        assert_eq!(tx.readers(), 1);
    }

    #[test]
    fn a_reader_that_joins_later_starts_with_the_next_element() {
        let mut tx = with_capacity::<u64>(2, 1);
        tx.try_push(1).unwrap();
        let mut r = tx.subscribe().unwrap();
        assert!(tx.subscribe().is_none(), "one place");
        assert!(matches!(r.try_read(), Err(TryReadError::Empty)));
        tx.try_push(2).unwrap();
        assert_eq!(r.try_read().unwrap(), 2);
        drop(r);
        assert!(tx.subscribe().is_some(), "its place free again");
    }

    #[test]
    fn a_forged_cursor_ahead_of_tail_holds_nothing_back() {
        use super::Cursors;
        let mut tx = with_capacity::<u64>(2, 2);
        let r = tx.subscribe().unwrap();
        r.storage.cursor(r.index).store(1000, crate::sync::Ordering::Relaxed);
        for v in 0..5 {
            tx.try_push(v).unwrap();
        }
    }

    #[test]
    fn a_reader_overrun_says_corrupted_and_reads_nothing() {
        use super::Cursors;
        let mut tx = with_capacity::<u64>(2, 1);
        let mut r = tx.subscribe().unwrap();
        // A producer that ignored the reader (a forged mask): three ahead of a ring of two.
        r.storage.readers().store(0, crate::sync::Ordering::Relaxed);
        for v in 0..3 {
            tx.try_push(v).unwrap();
        }
        assert!(matches!(r.try_read(), Err(TryReadError::Corrupted(_))));
    }

    #[test]
    fn a_lagging_producer_never_waits_and_a_reader_behind_is_told_what_it_missed() {
        let mut tx = with_policy::<u64>(4, 2, true);
        let (mut slow, mut fast) = (tx.subscribe().unwrap(), tx.subscribe().unwrap());
        for v in 0..10 {
            tx.try_push(v).unwrap(); // never full
            assert_eq!(fast.try_read().unwrap(), v, "a reader that keeps up misses nothing");
        }
        // `slow` read nothing: 0..6 were overwritten; 6..10 are still there.
        assert!(matches!(slow.try_read(), Err(TryReadError::Lagged(6))));
        assert_eq!((0..4).map(|_| slow.try_read().unwrap()).collect::<Vec<_>>(), [6, 7, 8, 9]);
        assert!(matches!(slow.try_read(), Err(TryReadError::Empty)));
    }

    #[test]
    fn a_lagging_reader_drops_a_copy_whose_cell_is_being_rewritten() {
        let mut tx = with_policy::<u64>(2, 1, true);
        let mut r = tx.subscribe().unwrap();
        tx.try_push(0).unwrap();
        tx.try_push(1).unwrap();
        // The producer has begun writing position 2 (over position 0's cell), as it would
        // mid-push: `head` says so before the cell changes.
        use super::Storage;
        r.storage.control().head.store(3, crate::sync::Ordering::Relaxed);
        assert!(matches!(r.try_read(), Err(TryReadError::Lagged(1))), "0 may be torn: dropped");
        assert_eq!(r.try_read().unwrap(), 1);
    }

    #[test]
    fn threads_read_every_element_exactly_once_in_order() {
        let mut tx = with_capacity::<u64>(8, 4);
        let n = if cfg!(miri) { 50 } else { 20_000 };
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let mut r = tx.subscribe().unwrap();
                std::thread::spawn(move || {
                    let mut next = 0;
                    while next < n {
                        match r.try_read() {
                            Ok(v) => {
                                assert_eq!(v, next, "in order, none missed, none twice");
                                next += 1;
                            }
                            Err(_) => std::thread::yield_now(),
                        }
                    }
                })
            })
            .collect();
        for v in 0..n {
            while tx.try_push(v).is_err() {
                std::thread::yield_now();
            }
        }
        readers.into_iter().for_each(|t| t.join().unwrap());
    }
}
