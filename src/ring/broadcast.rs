//! A broadcast ring (work in progress for issue 38, not yet used by channels): one
//! producer, up to `max_readers` readers, each reading every element published after it
//! joined, in order, with no copy per reader.
//!
//! Positions are `u64` counters as in the other rings. The producer keeps `tail` (the
//! next position it writes) and publishes it with a Release store. Each reader owns a
//! *cursor* (the next position it reads; [`FREE`] when the slot of the table is unused),
//! stored with Release after it has read the cells before it. The producer may write
//! position `p` (overwriting `p - capacity`) only when every cursor is above
//! `p - capacity`: the slowest reader holds it back (the blocking policy; nothing is lost).
//! It keeps the minimum it last computed and recomputes it only when that says "full".
//!
//! Joining races the producer: a reader stores its cursor at the `tail` it read, and the
//! producer may have computed its minimum without it. Both sides use a SeqCst fence
//! between their store and their load (the producer's last `tail` store, then the fence,
//! then the cursors; the reader's cursor store, then the fence, then `tail`), so either the
//! producer's minimum counts the new cursor, or the reader's `tail` load sees a `tail` at
//! least as new as the one the minimum was computed under (and a minimum is never above
//! the `tail` it was computed under). The reader starts at that second `tail`, which is
//! safe in both cases; what was published between its two loads is not its to read.

use std::sync::Arc;

use bytemuck::Pod;

use crate::layout::SpscCell;
use crate::sync::{AtomicU64, Ordering, fence};

/// A cursor slot that no reader holds.
pub const FREE: u64 = u64::MAX;

#[derive(Debug)]
struct Inner<T> {
    tail: AtomicU64,
    cursors: Box<[AtomicU64]>,
    cells: Box<[SpscCell<T>]>,
}

// SAFETY: a cell is written only by the producer, and only once every cursor has passed
// the element it held (the readers' Release cursor stores, read with Acquire); readers read
// only positions below the `tail` they loaded with Acquire. `T: Send`: values cross threads.
unsafe impl<T: Send> Sync for Inner<T> {}

/// The writing end. Not `Clone`: one producer.
#[derive(Debug)]
pub struct Producer<T> {
    inner: Arc<Inner<T>>,
    /// The next position to write (this producer's own copy of `tail`).
    tail: u64,
    /// A lower bound of every cursor, as last computed.
    min: u64,
}

/// Makes readers of a ring (see [`Producer::subscriber`]).
#[derive(Debug, Clone)]
pub struct Subscriber<T> {
    inner: Arc<Inner<T>>,
}

impl<T: Pod + Send> Subscriber<T> {
    /// A new reader (see [`Producer::subscribe`]).
    pub fn subscribe(&self) -> Option<Reader<T>> {
        Reader::join(&self.inner)
    }
}

/// A reading end; dropping it frees its cursor.
#[derive(Debug)]
pub struct Reader<T> {
    inner: Arc<Inner<T>>,
    index: usize,
    /// The next position to read (this reader's own copy of its cursor).
    cursor: u64,
}

/// A ring of `capacity` cells (a power of two, at least 1) for up to `max_readers`
/// readers at once.
///
/// # Panics
///
/// If `capacity` is not a power of two in `1..=2^24` or `max_readers` is 0.
pub fn with_capacity<T: Pod + Send>(capacity: usize, max_readers: usize) -> Producer<T> {
    assert!(capacity.is_power_of_two() && capacity <= 1 << 24, "capacity {capacity}");
    assert!(max_readers > 0, "a broadcast ring needs room for a reader");
    let inner = Inner {
        tail: AtomicU64::new(0),
        cursors: (0..max_readers).map(|_| AtomicU64::new(FREE)).collect(),
        cells: (0..capacity).map(|_| SpscCell::new()).collect(),
    };
    Producer { inner: Arc::new(inner), tail: 0, min: 0 }
}

impl<T: Pod + Send> Producer<T> {
    /// A new reader, which reads what is published from now on; `None` when
    /// `max_readers` readers hold cursors.
    pub fn subscribe(&self) -> Option<Reader<T>> {
        Reader::join(&self.inner)
    }

    /// A handle that makes readers from any thread while this producer pushes.
    pub fn subscriber(&self) -> Subscriber<T> {
        Subscriber { inner: self.inner.clone() }
    }

    /// Publishes `value` if every reader has room for it; never blocks. With no reader,
    /// the element goes nowhere (and is never read).
    ///
    /// # Errors
    ///
    /// `Err(value)` when the slowest reader is a whole ring behind.
    pub fn try_push(&mut self, value: T) -> Result<(), T> {
        let capacity = self.inner.cells.len() as u64;
        if self.tail - self.min >= capacity {
            self.min = self.slowest();
            if self.tail - self.min >= capacity {
                return Err(value);
            }
        }
        let cell = &self.inner.cells[(self.tail & (capacity - 1)) as usize];
        // SAFETY: every cursor is above `tail - capacity` (the Acquire loads in `slowest`
        // saw the readers' Release stores made after they read that cell's previous
        // element), and no reader reads position `tail` before the store below.
        cell.value.with_mut(|p| unsafe { p.write(value) });
        self.tail += 1;
        // Release: pairs with the readers' Acquire loads of `tail` (the cell is written).
        self.inner.tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// The lowest cursor of the readers present, or `tail` when there is none.
    fn slowest(&self) -> u64 {
        // SeqCst: orders our last `tail` store before the cursor loads against a joining
        // reader's cursor store and `tail` load (see the module docs).
        fence(Ordering::SeqCst);
        // Acquire: pairs with each reader's Release cursor store (its reads are done).
        let cursors = self.inner.cursors.iter().map(|c| c.load(Ordering::Acquire));
        cursors.filter(|&c| c != FREE).fold(self.tail, u64::min)
    }

    /// Readers present now (a snapshot).
    pub fn readers(&self) -> usize {
        // Relaxed: a diagnostic.
        self.inner.cursors.iter().filter(|c| c.load(Ordering::Relaxed) != FREE).count()
    }
}

impl<T: Pod + Send> Reader<T> {
    fn join(inner: &Arc<Inner<T>>) -> Option<Self> {
        // Relaxed: a first value for the cursor; it is raised below after the fence.
        let at = inner.tail.load(Ordering::Relaxed);
        let index = inner.cursors.iter().position(|c| {
            // Relaxed: the slot is taken by this CAS; the fence below orders it.
            c.compare_exchange(FREE, at, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        })?;
        // SeqCst: our cursor store before the `tail` load below, against the producer's
        // `tail` store and cursor loads (see the module docs).
        fence(Ordering::SeqCst);
        // Acquire: pairs with the producer's Release `tail` store. Either the producer's
        // minimum counts our cursor `at`, or it was computed under a `tail` no newer than
        // this one: starting here, at or above that minimum, is safe in both cases (what
        // was published in between is not ours: a reader starts with what comes next).
        let tail = inner.tail.load(Ordering::Acquire);
        if tail != at {
            // Relaxed: a raise of our own cursor; a producer that read the lower value
            // only held back more than it had to.
            inner.cursors[index].store(tail, Ordering::Relaxed);
        }
        Some(Self { inner: inner.clone(), index, cursor: tail })
    }

    /// The next element published since this reader joined, if there is one; never
    /// blocks.
    pub fn try_read(&mut self) -> Option<T> {
        // Acquire: pairs with the producer's Release `tail` store.
        if self.cursor == self.inner.tail.load(Ordering::Acquire) {
            return None;
        }
        let capacity = self.inner.cells.len() as u64;
        let cell = &self.inner.cells[(self.cursor & (capacity - 1)) as usize];
        // SAFETY: the position is below `tail` (the element is written) and our cursor
        // keeps the producer from rewriting it until the store below. `T: Pod`.
        let value = cell.value.with(|p| unsafe { p.read() });
        self.cursor += 1;
        // Release: pairs with the producer's Acquire cursor loads (our read is done).
        self.inner.cursors[self.index].store(self.cursor, Ordering::Release);
        Some(value)
    }
}

impl<T> Drop for Reader<T> {
    fn drop(&mut self) {
        // Release: pairs with the producer's Acquire cursor loads (our reads are done).
        self.inner.cursors[self.index].store(FREE, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::with_capacity;

    #[test]
    fn every_reader_gets_every_element_in_order_and_the_slowest_holds_the_producer() {
        let mut tx = with_capacity::<u64>(4, 3);
        let mut a = tx.subscribe().unwrap();
        let mut b = tx.subscribe().unwrap();
        for v in 0..4 {
            tx.try_push(v).unwrap();
        }
        assert_eq!(tx.try_push(4), Err(4), "a ring ahead of the slowest reader");
        assert_eq!((0..4).map(|_| a.try_read().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(tx.try_push(4), Err(4), "b has read nothing yet");
        assert_eq!(b.try_read(), Some(0));
        tx.try_push(4).unwrap();
        assert_eq!(a.try_read(), Some(4));
        assert_eq!(a.try_read(), None);
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
        assert!(tx.subscribe().is_none(), "one cursor");
        assert_eq!(r.try_read(), None);
        tx.try_push(2).unwrap();
        assert_eq!(r.try_read(), Some(2));
        drop(r);
        assert!(tx.subscribe().is_some(), "its cursor free again");
    }

    #[test]
    fn threads_read_every_element_exactly_once_in_order() {
        let mut tx = with_capacity::<u64>(8, 4);
        let n = 20_000;
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let mut r = tx.subscribe().unwrap();
                std::thread::spawn(move || {
                    let mut next = 0;
                    while next < n {
                        match r.try_read() {
                            Some(v) => {
                                assert_eq!(v, next, "in order, none missed, none twice");
                                next += 1;
                            }
                            None => std::thread::yield_now(),
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
