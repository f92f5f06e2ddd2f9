//! A broadcast ring on the heap ([`with_capacity`], [`with_policy`]): for tests and
//! models, where one process's threads are the readers.

use std::sync::Arc;

use bytemuck::Pod;

use super::{Cursors, MAX_READERS, Producer, Reader};
use crate::layout::{RingControl, SpscCell};
use crate::liveness::Unwatched;
use crate::ring::Storage;
use crate::sync::{AtomicU64, Ordering};

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
// protocol (`ring::broadcast`'s docs). `T: Send`: values cross threads.
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
