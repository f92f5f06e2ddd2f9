//! Single-producer single-consumer ring (Lamport, with cached peer positions).
//!
//! The producer alone stores `tail`, the consumer alone stores `head`. Each keeps its own
//! position locally (never re-reading it from shared memory) and a cached copy of the
//! other's, refreshed only when the ring looks full (producer) or empty (consumer), so a
//! steady stream touches the peer's line once per batch rather than once per element.
//!
//! Handles made from shared memory claim their role in the segment
//! ([`crate::named::SpscRing::producer`]), so the "one producer, one consumer" contract holds
//! by construction; [`with_capacity`] makes an in-process pair.

use std::marker::PhantomData;
use std::time::Duration;

use bytemuck::Pod;

use super::{
    Corrupted, Hints, PopError, PushError, Side, Storage, TryPopError, TryPushError, block_on,
    cell_at, deadline_after, demote, prefetch, prefetch_write,
};
use crate::layout::SpscCell;
use crate::sync::Ordering;
use crate::wait::{WaitPolicy, barrier_mode, notify};

/// An in-process SPSC ring of `capacity` elements (a power of two) on the heap.
///
/// ```
/// let (mut tx, mut rx) = gpuring::ring::spsc::with_capacity::<u64>(4);
/// tx.try_push(7).unwrap();
/// assert_eq!(rx.try_pop().unwrap(), 7);
/// ```
///
/// # Panics
///
/// If `capacity` is not a power of two in `1..=2^24`.
pub fn with_capacity<T: Pod + Send>(capacity: usize) -> (HeapProducer<T>, HeapConsumer<T>) {
    let storage = super::Heap::new(capacity, |_| SpscCell::new());
    // SAFETY: the storage is new and these are its only two endpoints.
    unsafe {
        let tx = Producer::new(storage.clone()).expect("a new ring is consistent");
        let rx = Consumer::new(storage).expect("a new ring is consistent");
        (tx, rx)
    }
}

/// A producer of an in-process ring made by [`with_capacity`].
pub type HeapProducer<T> = Producer<T, super::Heap<SpscCell<T>>>;
/// A consumer of an in-process ring made by [`with_capacity`].
pub type HeapConsumer<T> = Consumer<T, super::Heap<SpscCell<T>>>;

/// The local half of an endpoint: its own position and a cached copy of the peer's.
#[derive(Debug)]
struct Local {
    /// Our position: `tail` for the producer, `head` for the consumer.
    pos: u64,
    /// Last value read of the peer's position.
    peer: u64,
    capacity: u64,
    /// Which cache hints this endpoint gives.
    hints: Hints,
}

impl Local {
    /// Reads our position (stored by the previous holder of this role) and the peer's, and
    /// checks that they are consistent: `head <= tail <= head + capacity`.
    fn load<S: Storage>(storage: &S, producer: bool) -> Result<Self, Corrupted> {
        let capacity = storage.cells().len() as u64;
        let c = storage.control();
        // Acquire on both: pairs with the Release stores of the previous holders, so that
        // what they wrote into the cells is visible to us.
        let tail = c.tail.load(Ordering::Acquire);
        let head = c.head.load(Ordering::Acquire);
        if tail.wrapping_sub(head) > capacity {
            return Err(Corrupted { what: "tail is more than capacity ahead of head" });
        }
        let (pos, peer) = if producer { (tail, head) } else { (head, tail) };
        Ok(Self { pos, peer, capacity, hints: Hints::from_env() })
    }

    /// Producer: re-reads `head` into `peer`; returns the cells free to write.
    #[inline(always)]
    fn refresh_head<S: Storage>(&mut self, storage: &S) -> Result<u64, Corrupted> {
        // Acquire: pairs with the consumer's Release store of `head` in `try_pop_in` (and
        // `try_pop_into_in`), so its reads of the cells it freed happen before we overwrite
        // them.
        let head = storage.control().head.load(Ordering::Acquire);
        let used = self.pos.wrapping_sub(head);
        if used > self.capacity {
            return Err(Corrupted {
                what: "head is behind tail by more than capacity, or ahead of it",
            });
        }
        self.peer = head;
        Ok(self.capacity - used)
    }

    /// Consumer: re-reads `tail` into `peer`; returns the cells ready to read.
    #[inline(always)]
    fn refresh_tail<S: Storage>(&mut self, storage: &S) -> Result<u64, Corrupted> {
        // Acquire: pairs with the producer's Release store of `tail` in `try_push_in` (and
        // `try_push_slice_in`): the cells below it are written.
        let tail = storage.control().tail.load(Ordering::Acquire);
        let ready = tail.wrapping_sub(self.pos);
        if ready > self.capacity {
            return Err(Corrupted {
                what: "tail is more than capacity ahead of head, or behind it",
            });
        }
        self.peer = tail;
        Ok(ready)
    }
}

/// The writing end of an SPSC ring.
#[derive(Debug)]
pub struct Producer<T, S> {
    storage: S,
    local: Local,
    policy: WaitPolicy,
    _elem: PhantomData<fn(T)>,
}

/// The reading end of an SPSC ring.
#[derive(Debug)]
pub struct Consumer<T, S> {
    storage: S,
    local: Local,
    policy: WaitPolicy,
    _elem: PhantomData<fn() -> T>,
}

fn try_push_in<T: Pod, S: Storage<Cell = SpscCell<T>>>(
    storage: &S,
    local: &mut Local,
    value: T,
) -> Result<(), TryPushError<T>> {
    if local.pos.wrapping_sub(local.peer) >= local.capacity {
        match local.refresh_head(storage) {
            Ok(0) => return Err(TryPushError::Full(value)),
            Ok(_) => {}
            Err(c) => return Err(TryPushError::Corrupted(c)),
        }
    }
    let cell = cell_at(storage, local.capacity, local.pos);
    if local.hints.prefetch {
        // Ask for all of the cell's lines (which the consumer read last) at once: the
        // stores alone fetch them one miss after another.
        prefetch_write(cell);
    }
    // SAFETY: the cell at `pos` belongs to the producer: the consumer has moved past it
    // (pos - head < capacity, checked above) and will not read it until `tail` passes it.
    cell.value.with_mut(|p| unsafe { p.write(value) });
    crate::fault::point("push_after_write");
    local.pos = local.pos.wrapping_add(1);
    // Release: pairs with the consumer's Acquire load of `tail` in `try_pop_in`; the cell
    // write above is visible to a consumer that sees the new tail.
    storage.control().tail.store(local.pos, Ordering::Release);
    if local.hints.demote {
        // Push the cell out of this core's private caches, so the consumer's reads are
        // served by the shared L3 instead of snooping this core. (Demoting `tail` too,
        // which the next push rewrites, cut throughput by 2.5x on the GPU host.)
        demote(cell);
    }
    Ok(())
}

/// Pushes as many of `values` as fit, from the front, with one publication of `tail`.
fn try_push_slice_in<T: Pod, S: Storage<Cell = SpscCell<T>>>(
    storage: &S,
    local: &mut Local,
    values: &[T],
) -> Result<usize, Corrupted> {
    let mut free = local.capacity - local.pos.wrapping_sub(local.peer).min(local.capacity);
    if (free as usize) < values.len() {
        free = local.refresh_head(storage)?;
    }
    let n = values.len().min(free as usize);
    if local.hints.prefetch {
        // Ask for every cell of the slice at once, so that the lines the consumer last
        // read come over in parallel rather than one store miss at a time.
        for i in 0..n as u64 {
            prefetch_write(cell_at(storage, local.capacity, local.pos.wrapping_add(i)));
        }
    }
    for (i, value) in values[..n].iter().enumerate() {
        let cell = cell_at(storage, local.capacity, local.pos.wrapping_add(i as u64));
        // SAFETY: as in `try_push_in`: positions pos..pos + n are below head + capacity
        // (n <= free), so these cells belong to the producer until `tail` passes them.
        cell.value.with_mut(|p| unsafe { p.write(*value) });
    }
    if n > 0 {
        local.pos = local.pos.wrapping_add(n as u64);
        // Release: as in `try_push_in`; publishes all n cells at once.
        storage.control().tail.store(local.pos, Ordering::Release);
    }
    Ok(n)
}

/// Pops up to `out.len()` elements into `out`, with one publication of `head`.
fn try_pop_into_in<T: Pod, S: Storage<Cell = SpscCell<T>>>(
    storage: &S,
    local: &mut Local,
    out: &mut [T],
) -> Result<usize, Corrupted> {
    let mut ready = local.peer.wrapping_sub(local.pos).min(local.capacity);
    if (ready as usize) < out.len() {
        ready = local.refresh_tail(storage)?;
    }
    let n = out.len().min(ready as usize);
    if local.hints.prefetch {
        // Every cell of the slice is published: ask for them all at once.
        for i in 0..n as u64 {
            prefetch(cell_at(storage, local.capacity, local.pos.wrapping_add(i)));
        }
    }
    for (i, slot) in out[..n].iter_mut().enumerate() {
        let pos = local.pos.wrapping_add(i as u64);
        let cell = cell_at(storage, local.capacity, pos);
        // SAFETY: as in `try_pop_in`: positions pos..pos + n are below tail (n <= ready),
        // published, and the producer does not write them until `head` passes them.
        *slot = cell.value.with(|p| unsafe { p.read() });
    }
    if n > 0 {
        local.pos = local.pos.wrapping_add(n as u64);
        // Release: as in `try_pop_in`; frees all n cells at once.
        storage.control().head.store(local.pos, Ordering::Release);
    }
    Ok(n)
}

/// Pops the element at `head`, running `then` on it before `head` moves on (so that until
/// `then` returns, the element is still in the ring for whoever consumes after us).
#[inline(always)]
fn try_pop_in<T: Pod, S: Storage<Cell = SpscCell<T>>, R>(
    storage: &S,
    local: &mut Local,
    then: impl FnOnce(T) -> R,
) -> Result<R, TryPopError> {
    if local.pos == local.peer {
        match local.refresh_tail(storage) {
            Ok(0) => return Err(TryPopError::Empty),
            Ok(_) => {}
            Err(c) => return Err(TryPopError::Corrupted(c)),
        }
    }
    let cell = cell_at(storage, local.capacity, local.pos);
    // SAFETY: the cell at `pos` belongs to the consumer: the producer published it (tail >
    // pos) and will not write it again until `head` passes it. `T: Pod`, so whatever bytes
    // a misbehaving peer left there form a valid `T`.
    let value = then(cell.value.with(|p| unsafe { p.read() }));
    local.pos = local.pos.wrapping_add(1);
    // While a batch is known to be published, pull a later cell toward this core so a
    // stream does not pay one cross-core miss per cache line, in series. Only published
    // cells: prefetching one the producer is writing would steal its lines.
    let ahead = local.pos.wrapping_add(PREFETCH_AHEAD);
    if local.hints.prefetch && local.peer.wrapping_sub(ahead) as i64 > 0 {
        prefetch(cell_at(storage, local.capacity, ahead));
    }
    // Release: pairs with the producer's Acquire load of `head` in `try_push_in`; our read
    // of the cell happens before the producer reuses it.
    storage.control().head.store(local.pos, Ordering::Release);
    Ok(value)
}

/// How many cells ahead the consumer prefetches within a published batch.
const PREFETCH_AHEAD: u64 = 4;

impl<T: Pod, S: Storage<Cell = SpscCell<T>>> Producer<T, S> {
    /// Wraps `storage` as its producer.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the stored positions are inconsistent.
    ///
    /// # Safety
    ///
    /// No other producer of this ring may exist, in any process, while this one lives.
    pub unsafe fn new(storage: S) -> Result<Self, Corrupted> {
        let local = Local::load(&storage, true)?;
        barrier_mode(); // registers for membarrier now, not on the first publish
        Ok(Self { storage, local, policy: WaitPolicy::default(), _elem: PhantomData })
    }

    /// Pushes `value` if there is room; never blocks. Wakes a sleeping consumer.
    ///
    /// # Errors
    ///
    /// [`TryPushError::Full`] with the value back; [`TryPushError::Corrupted`].
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), TryPushError<T>> {
        try_push_in(&self.storage, &mut self.local, value)?;
        notify(&self.storage.control().not_empty);
        Ok(())
    }

    /// Pushes `value`, waiting for room as the [`WaitPolicy`] says, for ever.
    ///
    /// # Errors
    ///
    /// [`PushError::PeerDead`] when the ring stays full and its consumer has died;
    /// [`PushError::Corrupted`]. Never `Timeout`.
    pub fn push(&mut self, value: T) -> Result<(), PushError<T>> {
        self.push_until(value, None)
    }

    /// Pushes `value`, waiting at most `timeout` for room.
    ///
    /// # Errors
    ///
    /// [`PushError::Timeout`] with the value back; [`PushError::Corrupted`].
    pub fn push_timeout(&mut self, value: T, timeout: Duration) -> Result<(), PushError<T>> {
        self.push_until(value, deadline_after(timeout))
    }

    fn push_until(
        &mut self,
        value: T,
        deadline: Option<std::time::Instant>,
    ) -> Result<(), PushError<T>> {
        let Self { storage, local, policy, .. } = self;
        let control = storage.control();
        block_on(
            &*storage,
            Side::Consumers,
            &control.not_full,
            &control.not_empty,
            *policy,
            deadline,
            || try_push_in(storage, local, value).map(Some).or_else(TryPushError::retry),
            || None,
        )
        .map_err(|b| PushError::from_blocked(b, value))
    }

    /// Pushes as many of `values` as there is room for, from the front, publishing them
    /// with one store (a stream of small elements moves far faster in slices); never
    /// blocks. Returns how many were pushed (0: full). Wakes a sleeping consumer.
    ///
    /// ```
    /// let (mut tx, mut rx) = gpuring::ring::spsc::with_capacity::<u64>(4);
    /// assert_eq!(tx.try_push_slice(&[1, 2, 3, 4, 5]), Ok(4));
    /// let mut out = [0; 8];
    /// assert_eq!(rx.try_pop_into(&mut out), Ok(4));
    /// assert_eq!(out[..4], [1, 2, 3, 4]);
    /// ```
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the consumer's position is impossible.
    pub fn try_push_slice(&mut self, values: &[T]) -> Result<usize, Corrupted> {
        let n = try_push_slice_in(&self.storage, &mut self.local, values)?;
        if n > 0 {
            notify(&self.storage.control().not_empty);
        }
        Ok(n)
    }

    /// Pushes all of `values`, in slices as room appears, waiting as the [`WaitPolicy`]
    /// says.
    ///
    /// # Errors
    ///
    /// [`PushError::Corrupted`]; [`PushError::PeerDead`] with how many were pushed, when
    /// the ring stays full and its consumer has died.
    pub fn push_slice(&mut self, values: &[T]) -> Result<(), PushError<usize>> {
        let mut done = 0;
        while done < values.len() {
            let Self { storage, local, policy, .. } = self;
            let control = storage.control();
            let rest = &values[done..];
            done += block_on(
                &*storage,
                Side::Consumers,
                &control.not_full,
                &control.not_empty,
                *policy,
                None,
                || try_push_slice_in(storage, local, rest).map(|n| (n > 0).then_some(n)),
                || None,
            )
            .map_err(|b| PushError::from_blocked(b, done))?;
        }
        Ok(())
    }

    /// Sets how blocking pushes wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy = policy;
    }

    /// Whether each push moves the written cell to the shared cache (`cldemote`, x86;
    /// a no-op elsewhere). Off by default, or on when `GPURING_DEMOTE=1`.
    ///
    /// Turn it on for hand-offs that go one at a time (request/response, a consumer that
    /// waits for each message): on the 16-core GPU host the spinning one-way latency fell
    /// from about 1.65x to 1.2x the cost of moving the bare descriptor. Leave it off for
    /// streams: there it cut throughput by half or more (docs/BENCHMARKS.md).
    pub fn set_demote(&mut self, on: bool) {
        self.local.hints.demote = on;
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.local.capacity as usize
    }

    /// Elements pushed and not yet popped (a snapshot; `None` if the consumer's position is
    /// impossible).
    pub fn len(&self) -> Option<usize> {
        // Relaxed: a diagnostic snapshot, nothing is read on the strength of it.
        let head = self.storage.control().head.load(Ordering::Relaxed);
        let used = self.local.pos.wrapping_sub(head);
        (used <= self.local.capacity).then_some(used as usize)
    }

    /// Whether the ring looks empty (see [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// The storage, for the layers above (wait words, diagnostics).
    pub fn storage(&self) -> &S {
        &self.storage
    }
}

impl<T: Pod, S: Storage<Cell = SpscCell<T>>> Producer<T, S> {
    /// Whether an element still in the ring (pushed, not yet popped) satisfies `pred`.
    /// Reads every queued cell: for slow paths only. An impossible `head` answers `true`
    /// (the caller then leaves things as they are).
    #[cfg_attr(loom, allow(dead_code))] // used by channels, which loom builds leave out
    pub(crate) fn any_queued(&self, mut pred: impl FnMut(&T) -> bool) -> bool {
        // Acquire: pairs with the consumer's Release store of `head` in `try_pop_in`: cells
        // below it are done with, cells from it on are still to be read.
        let head = self.storage.control().head.load(Ordering::Acquire);
        let queued = self.local.pos.wrapping_sub(head);
        if queued > self.local.capacity {
            return true;
        }
        (0..queued).any(|i| {
            let cell = cell_at(&self.storage, self.local.capacity, head.wrapping_add(i));
            // SAFETY: cells in [head, tail) were published by this producer, the only
            // writer of cells, which does not write them again until `head` passes them;
            // the consumer only reads them. `T: Pod`: any bytes are a valid `T`.
            let value = cell.value.with(|p| unsafe { p.read() });
            pred(&value)
        })
    }
}

impl<T: Pod, S: Storage<Cell = SpscCell<T>>> Consumer<T, S> {
    /// Wraps `storage` as its consumer.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the stored positions are inconsistent.
    ///
    /// # Safety
    ///
    /// No other consumer of this ring may exist, in any process, while this one lives.
    pub unsafe fn new(storage: S) -> Result<Self, Corrupted> {
        let local = Local::load(&storage, false)?;
        barrier_mode(); // registers for membarrier now, not on the first publish
        Ok(Self { storage, local, policy: WaitPolicy::default(), _elem: PhantomData })
    }

    /// Pops the oldest element if there is one; never blocks. Wakes a sleeping producer.
    ///
    /// # Errors
    ///
    /// [`TryPopError::Empty`]; [`TryPopError::Corrupted`].
    #[inline]
    pub fn try_pop(&mut self) -> Result<T, TryPopError> {
        self.try_pop_then(|v| v)
    }

    /// As [`try_pop`](Self::try_pop), running `then` on the element *before* it leaves the
    /// ring: if this process dies inside `then`, the element is still there for the next
    /// consumer (a channel receiver takes its slot inside `then`, so that a crash never
    /// strands a slot between the ring and the receiver).
    ///
    /// # Errors
    ///
    /// As [`try_pop`](Self::try_pop); `then` is not called then.
    #[inline]
    pub fn try_pop_then<R>(&mut self, then: impl FnOnce(T) -> R) -> Result<R, TryPopError> {
        let r = try_pop_in(&self.storage, &mut self.local, then)?;
        notify(&self.storage.control().not_full);
        Ok(r)
    }

    /// Pops the oldest element, waiting for one as the [`WaitPolicy`] says, for ever.
    ///
    /// # Errors
    ///
    /// [`PopError::PeerDead`] once the producer has died and all it published is taken;
    /// [`PopError::Corrupted`]. Never `Timeout`.
    pub fn pop(&mut self) -> Result<T, PopError> {
        self.pop_then(None, |v| v)
    }

    /// Pops the oldest element, waiting at most `timeout` for one.
    ///
    /// # Errors
    ///
    /// [`PopError::Timeout`]; [`PopError::Corrupted`].
    pub fn pop_timeout(&mut self, timeout: Duration) -> Result<T, PopError> {
        self.pop_then(Some(timeout), |v| v)
    }

    /// As [`pop`](Self::pop) (`timeout` `None`) or [`pop_timeout`](Self::pop_timeout),
    /// running `then` on the element before it leaves the ring; see
    /// [`try_pop_then`](Self::try_pop_then).
    ///
    /// # Errors
    ///
    /// As [`pop_timeout`](Self::pop_timeout); `then` is not called then.
    pub fn pop_then<R>(
        &mut self,
        timeout: Option<Duration>,
        then: impl FnOnce(T) -> R,
    ) -> Result<R, PopError> {
        let deadline = timeout.and_then(deadline_after);
        let Self { storage, local, policy, .. } = self;
        let control = storage.control();
        let mut then = Some(then);
        block_on(
            &*storage,
            Side::Producers,
            &control.not_empty,
            &control.not_full,
            *policy,
            deadline,
            || {
                // `then` runs once: only a successful pop calls it, and that ends the wait.
                try_pop_in(storage, local, |v| then.take().map(|f| f(v)))
                    .map(Some)
                    .or_else(TryPopError::retry)
            },
            || None,
        )
        .map_err(PopError::from)
        .map(|r| r.expect("then runs on the one successful pop"))
    }

    /// Pops up to `out.len()` elements into `out`, oldest first, freeing them with one
    /// store; never blocks. Returns how many (0: empty). Wakes a sleeping producer.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the producer's position is impossible.
    pub fn try_pop_into(&mut self, out: &mut [T]) -> Result<usize, Corrupted> {
        let n = try_pop_into_in(&self.storage, &mut self.local, out)?;
        if n > 0 {
            notify(&self.storage.control().not_full);
        }
        Ok(n)
    }

    /// Pops at least one and up to `out.len()` elements into `out`, waiting for the first
    /// as the [`WaitPolicy`] says, at most `timeout` (`None`: for ever). Returns how many.
    ///
    /// # Errors
    ///
    /// As [`pop_timeout`](Self::pop_timeout).
    pub fn pop_into(
        &mut self,
        out: &mut [T],
        timeout: Option<Duration>,
    ) -> Result<usize, PopError> {
        if out.is_empty() {
            return Ok(0);
        }
        let Self { storage, local, policy, .. } = self;
        let control = storage.control();
        block_on(
            &*storage,
            Side::Producers,
            &control.not_empty,
            &control.not_full,
            *policy,
            timeout.and_then(deadline_after),
            || try_pop_into_in(storage, local, out).map(|n| (n > 0).then_some(n)),
            || None,
        )
        .map_err(PopError::from)
    }

    /// Sets how blocking pops wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy = policy;
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.local.capacity as usize
    }

    /// Elements ready to pop (a snapshot; `None` if the producer's position is impossible).
    pub fn len(&self) -> Option<usize> {
        // Relaxed: a diagnostic snapshot, nothing is read on the strength of it.
        let tail = self.storage.control().tail.load(Ordering::Relaxed);
        let ready = tail.wrapping_sub(self.local.pos);
        (ready <= self.local.capacity).then_some(ready as usize)
    }

    /// Whether the ring looks empty (see [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// The storage, for the layers above (wait words, diagnostics).
    pub fn storage(&self) -> &S {
        &self.storage
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::Heap;

    #[test]
    fn fifo_through_many_laps() {
        let (mut tx, mut rx) = with_capacity::<u64>(4);
        let n = if cfg!(miri) { 50 } else { 10_000 };
        let mut next = 0;
        for i in 0..n {
            tx.try_push(i).unwrap();
            if i % 3 == 2 {
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
    }

    #[test]
    fn slices_fifo_across_laps_and_partial_batches() {
        let (mut tx, mut rx) = with_capacity::<u64>(8);
        let rounds = if cfg!(miri) { 20 } else { 2_000 };
        let (mut next_in, mut next_out) = (0u64, 0u64);
        let mut out = [0u64; 5];
        for r in 0..rounds {
            let batch: Vec<u64> = (next_in..next_in + (r % 7) + 1).collect();
            let n = tx.try_push_slice(&batch).unwrap();
            assert!(n <= batch.len());
            next_in += n as u64;
            let got = rx.try_pop_into(&mut out[..(r as usize % 5) + 1]).unwrap();
            for &v in &out[..got] {
                assert_eq!(v, next_out);
                next_out += 1;
            }
        }
        loop {
            let got = rx.try_pop_into(&mut out).unwrap();
            if got == 0 {
                break;
            }
            for &v in &out[..got] {
                assert_eq!(v, next_out);
                next_out += 1;
            }
        }
        assert_eq!(next_out, next_in);
        // Full: nothing pushed; empty output: nothing popped.
        assert_eq!(tx.try_push_slice(&[0; 8]), Ok(8));
        assert_eq!(tx.try_push_slice(&[9]), Ok(0));
        assert_eq!(rx.try_pop_into(&mut []), Ok(0));
        assert_eq!(rx.pop_into(&mut out, Some(Duration::from_millis(1))), Ok(5));
        tx.push_slice(&[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(rx.pop_into(&mut [0; 16], None), Ok(8));
        assert_eq!(rx.pop_into(&mut out, Some(Duration::from_millis(1))), Err(PopError::Timeout));
    }

    #[test]
    fn pop_then_runs_before_the_element_leaves_the_ring() {
        let (mut tx, mut rx) = with_capacity::<u32>(4);
        tx.try_push(1).unwrap();
        tx.try_push(2).unwrap();
        let seen = rx.try_pop_then(|v| {
            // Still queued while `then` runs: a receiver that dies here leaves it.
            assert_eq!(tx.len(), Some(2));
            assert!(tx.any_queued(|&x| x == v));
            v * 10
        });
        assert_eq!(seen, Ok(10));
        assert!(!tx.any_queued(|&x| x == 1), "gone once `then` returned");
        assert!(tx.any_queued(|&x| x == 2));
        assert_eq!(rx.pop_then(Some(Duration::from_millis(5)), |v| v + 1), Ok(3));
        assert_eq!(rx.pop_then(Some(Duration::from_millis(5)), |v| v), Err(PopError::Timeout));
        assert_eq!(
            rx.try_pop_then(|_| unreachable!("not called when empty")),
            Err::<(), _>(TryPopError::Empty)
        );
    }

    #[test]
    fn full_gives_the_value_back_and_empty_is_empty() {
        let (mut tx, mut rx) = with_capacity::<u32>(2);
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
        tx.try_push(1).unwrap();
        tx.try_push(2).unwrap();
        assert_eq!(tx.try_push(3), Err(TryPushError::Full(3)));
        assert_eq!(tx.len(), Some(2));
        assert_eq!(rx.try_pop(), Ok(1));
        tx.try_push(3).unwrap();
        assert_eq!((rx.try_pop(), rx.try_pop()), (Ok(2), Ok(3)));
        assert!(rx.is_empty());
    }

    #[test]
    fn timeouts_hand_the_value_back() {
        let (mut tx, mut rx) = with_capacity::<u8>(1);
        tx.try_push(1).unwrap();
        assert_eq!(tx.push_timeout(2, Duration::from_millis(5)), Err(PushError::Timeout(2)));
        assert_eq!(rx.pop_timeout(Duration::from_millis(5)), Ok(1));
        assert_eq!(rx.pop_timeout(Duration::from_millis(5)), Err(PopError::Timeout));
    }

    #[test]
    fn scribbled_positions_are_corrupted_not_a_panic() {
        let storage = Heap::new(4, |_| SpscCell::<u64>::new());
        storage.control().tail.store(100, Ordering::Relaxed);
        // SAFETY: sole producer/consumer of a fresh storage.
        unsafe {
            assert!(Producer::<u64, _>::new(storage.clone()).is_err());
            assert!(Consumer::<u64, _>::new(storage.clone()).is_err());
        }
        storage.control().tail.store(0, Ordering::Relaxed);
        // SAFETY: as above.
        let (mut tx, mut rx) = unsafe {
            (
                Producer::<u64, _>::new(storage.clone()).unwrap(),
                Consumer::<u64, _>::new(storage.clone()).unwrap(),
            )
        };
        for i in 0..4 {
            tx.try_push(i).unwrap();
        }
        // A hostile peer moves head backwards past what is possible.
        storage.control().head.store(u64::MAX - 5, Ordering::Relaxed);
        assert!(matches!(tx.try_push(9), Err(TryPushError::Corrupted(_))));
        // ... and the tail far ahead of the consumer.
        rx.try_pop().unwrap();
        rx.try_pop().unwrap();
        rx.try_pop().unwrap();
        rx.try_pop().unwrap();
        storage.control().tail.store(1 << 40, Ordering::Relaxed);
        assert!(matches!(rx.try_pop(), Err(TryPopError::Corrupted(_))));
        assert!(matches!(rx.pop_timeout(Duration::ZERO), Err(PopError::Corrupted(_))));
    }

    #[test]
    fn threads_hand_off_in_order_with_blocking_calls() {
        let (mut tx, mut rx) = with_capacity::<u64>(8);
        let n: u64 = if cfg!(miri) { 200 } else { 200_000 };
        let t = std::thread::spawn(move || {
            for i in 0..n {
                tx.push(i).unwrap();
            }
        });
        for i in 0..n {
            assert_eq!(rx.pop().unwrap(), i);
        }
        t.join().unwrap();
    }
}
