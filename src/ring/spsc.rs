//! Single-producer single-consumer ring (Lamport, with cached peer positions).
//!
//! The producer alone stores `tail`, the consumer alone stores `head`. Each keeps its own
//! position locally (never re-reading it from shared memory) and a cached copy of the
//! other's, refreshed only when the ring looks full (producer) or empty (consumer), so a
//! steady stream touches the peer's line once per batch rather than once per element.
//!
//! Handles made from shared memory claim their role in the segment
//! ([`crate::SpscRing::producer`]), so the "one producer, one consumer" contract holds by
//! construction; [`with_capacity`] makes an in-process pair. Slices: `slices.rs`.

use std::marker::PhantomData;

use bytemuck::Pod;

use super::{
    Hint, Hints, PopTimeoutError, PushTimeoutError, Storage, TryPopError, TryPushError, cache_hint,
    cell_at, peers_gone, peers_left, wait_for,
};
use crate::layout::{Corrupted, SpscCell};
use crate::liveness::{Blocked, Role, Tick};
use crate::sync::Ordering;
use crate::wait::{Deadline, WaitPolicy, Waits, barrier_mode, notify};

/// An in-process SPSC ring of `capacity` elements (a power of two) on the heap.
///
/// # Panics
///
/// If `capacity` is not a power of two in `1..=2^24`.
pub fn with_capacity<T: Pod + Send>(capacity: usize) -> (HeapProducer<T>, HeapConsumer<T>) {
    // SAFETY: the storage is new and these are its only two endpoints.
    let ends = |a, b| unsafe { Ok((Producer::new(a)?, Consumer::new(b)?)) };
    super::Heap::new(capacity, |_| SpscCell::new()).ends(ends)
}

/// A producer of an in-process ring made by [`with_capacity`].
pub type HeapProducer<T> = Producer<T, super::Heap<SpscCell<T>>>;
/// A consumer of an in-process ring made by [`with_capacity`].
pub type HeapConsumer<T> = Consumer<T, super::Heap<SpscCell<T>>>;

/// The local half of an endpoint: its own position and a cached copy of the peer's.
#[derive(Debug)]
pub(super) struct Local {
    /// Our position: `tail` for the producer, `head` for the consumer.
    pub(super) pos: u64,
    /// Last value read of the peer's position.
    pub(super) peer: u64,
    pub(super) capacity: u64,
    /// Which cache hints this endpoint gives.
    pub(super) hints: Hints,
}

impl Local {
    /// Reads our position (stored by the previous holder of this role) and the peer's, and
    /// checks that they are consistent: `head <= tail <= head + capacity`. Registers this
    /// process for `membarrier` now, not on the first publish.
    fn load<S: Storage>(storage: &S, producer: bool) -> Result<Self, Corrupted> {
        barrier_mode();
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
    pub(super) fn refresh_head<S: Storage>(&mut self, storage: &S) -> Result<u64, Corrupted> {
        // Acquire: pairs with the consumer's Release store of `head` in `try_pop_in` (and
        // `slices::try_pop_into_in`), so its reads of the cells it freed happen before we
        // overwrite them.
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
    pub(super) fn refresh_tail<S: Storage>(&mut self, storage: &S) -> Result<u64, Corrupted> {
        // Acquire: pairs with the producer's Release store of `tail` in `try_push_in` (and
        // `slices::try_push_slice_in`): the cells below it are written.
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
    pub(super) storage: S,
    pub(super) local: Local,
    pub(super) policy: Waits,
    _elem: PhantomData<fn(T)>,
}

/// The reading end of an SPSC ring.
#[derive(Debug)]
pub struct Consumer<T, S> {
    pub(super) storage: S,
    pub(super) local: Local,
    pub(super) policy: Waits,
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
        cache_hint(cell, Hint::Write);
    }
    // SAFETY: the cell at `pos` belongs to the producer: the consumer has moved past it
    // (pos - head < capacity, checked above) and will not read it until `tail` passes it.
    cell.value.with_mut(|p| unsafe { p.write(value) });
    crate::fault::point("push_after_write");
    local.pos = local.pos.wrapping_add(1);
    // Release: pairs with the consumer's Acquire load of `tail` in `refresh_tail`; the
    // cell write above is visible to a consumer that sees the new tail.
    storage.control().tail.store(local.pos, Ordering::Release);
    if local.hints.demote {
        // Push the cell out of this core's private caches, so the consumer's reads are
        // served by the shared L3 instead of snooping this core. (Demoting `tail` too,
        // which the next push rewrites, slowed streams further: docs/DESIGN.md.)
        cache_hint(cell, Hint::Demote);
    }
    Ok(())
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
        cache_hint(cell_at(storage, local.capacity, ahead), Hint::Read);
    }
    // Release: pairs with the producer's Acquire load of `head` in `refresh_head`; our
    // read of the cell happens before the producer reuses it.
    storage.control().head.store(local.pos, Ordering::Release);
    Ok(value)
}

/// How many cells ahead the consumer prefetches within a published batch.
const PREFETCH_AHEAD: u64 = 4;

/// For [`block_on`]: `Full` means wait.
pub(super) fn push_retry<T>(e: TryPushError<T>) -> Result<Option<()>, Corrupted> {
    match e {
        TryPushError::Full(_) | TryPushError::Disconnected(_) => Ok(None),
        TryPushError::Corrupted(c) => Err(c),
    }
}

/// For [`block_on`]: `Empty` means wait.
pub(super) fn pop_retry<R>(e: TryPopError) -> Result<Option<R>, Corrupted> {
    match e {
        TryPopError::Empty | TryPopError::Disconnected => Ok(None),
        TryPopError::Corrupted(c) => Err(c),
    }
}

/// The constructor of an end (`Producer`, `Consumer`): the same fields, the same checks.
macro_rules! end_new {
    ($end:literal, $producer:literal) => {
        #[doc = concat!("Wraps `storage` as its ", $end, ".")]
        ///
        /// # Errors
        ///
        /// [`Corrupted`] when the stored positions are inconsistent.
        ///
        /// # Safety
        ///
        #[doc = concat!("No other ", $end, " of this ring may exist, in any process, while this one lives.")]
        pub unsafe fn new(storage: S) -> Result<Self, Corrupted> {
            Ok(Self {
                local: Local::load(&storage, $producer)?,
                storage,
                policy: Waits::default(),
                _elem: PhantomData,
            })
        }
    };
}

impl<T: Pod, S: Storage<Cell = SpscCell<T>>> Producer<T, S> {
    end_new!("producer", true);

    /// Pushes `value` if there is room; never blocks. Wakes a sleeping consumer.
    ///
    /// # Errors
    ///
    /// [`TryPushError::Full`] with the value back ([`TryPushError::Disconnected`] when
    /// every consumer has also left); [`TryPushError::Corrupted`].
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), TryPushError<T>> {
        match try_push_in(&self.storage, &mut self.local, value) {
            Ok(()) => {
                notify(&self.storage.control().not_empty);
                Ok(())
            }
            Err(TryPushError::Full(v)) if peers_left(&self.storage, Role::Consumer) => {
                Err(TryPushError::Disconnected(v))
            }
            Err(e) => Err(e),
        }
    }

    /// Pushes `value`, waiting for room as the [`WaitPolicy`] says until `deadline`.
    pub(crate) fn push_until(
        &mut self,
        value: T,
        deadline: Deadline,
    ) -> Result<(), PushTimeoutError<T>> {
        let Self { storage, local, policy, .. } = self;
        let attempt = || try_push_in(storage, local, value).map(Some).or_else(push_retry);
        wait_for(&*storage, Role::Producer, policy, deadline, attempt, || Tick::Idle)
            .map_err(|b| PushTimeoutError::from_blocked(b, value))
    }

    /// Sets how blocking pushes wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy.set(policy);
    }

    /// Whether every consumer is gone (see `ring::peers_gone`): for senders that refuse to
    /// push into a ring nobody reads.
    #[cfg_attr(loom, allow(dead_code))] // used by channels, which loom builds leave out
    pub(crate) fn consumers_gone(&self, probe: bool) -> Option<Blocked> {
        peers_gone(&self.storage, Role::Consumer, probe)
    }

    /// Whether each push moves the written cell to the shared cache (`cldemote`, x86; a
    /// no-op elsewhere); see [`crate::SpscProducer::set_demote`].
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

    /// The storage, for the layers above (a channel's sender asks its watch who it is).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn storage(&self) -> &S {
        &self.storage
    }

    /// Whether an element still in the ring (pushed, not yet popped) satisfies `pred`.
    /// Reads every queued cell: for slow paths only. An impossible `head` answers `true`
    /// (the caller then leaves things as they are).
    #[cfg_attr(loom, allow(dead_code))] // used by channels, which loom builds leave out
    pub(crate) fn any_queued(&self, pred: impl FnMut(&T) -> bool) -> bool {
        any_queued_in(self.storage.control(), self.storage.cells(), pred)
    }
}

/// Whether an element in `[head, tail)` of an SPSC ring's `cells` satisfies `pred`; `true`
/// for impossible positions. For the ring's producer or consumer only: the producer is the
/// only writer of cells and rewrites none in `[head, tail)`, and only the consumer moves
/// `head` (a third party could read a cell being rewritten). Slow paths only.
#[cfg_attr(loom, allow(dead_code))] // used by channels, which loom builds leave out
pub(crate) fn any_queued_in<T: Pod>(
    control: &crate::layout::RingControl,
    cells: &[SpscCell<T>],
    mut pred: impl FnMut(&T) -> bool,
) -> bool {
    let capacity = cells.len() as u64;
    // Acquire: pairs with the consumer's Release store of `head` in `try_pop_in`: cells
    // below it are done with, cells from it on are still to be read.
    let head = control.head.load(Ordering::Acquire);
    // Acquire: pairs with the producer's Release store of `tail` (the cells below it are
    // written).
    let tail = control.tail.load(Ordering::Acquire);
    let queued = tail.wrapping_sub(head);
    if queued > capacity {
        return true;
    }
    (0..queued).any(|i| {
        let cell = &cells[(head.wrapping_add(i) & (capacity - 1)) as usize];
        // SAFETY: [head, tail) is published; the caller is the producer (the only writer,
        // which rewrites no cell until `head` passes it) or the consumer (which alone moves
        // `head`), so no cell read here is being written. `T: Pod`: any bytes are a `T`.
        let value = cell.value.with(|p| unsafe { p.read() });
        pred(&value)
    })
}

impl<T: Pod, S: Storage<Cell = SpscCell<T>>> Consumer<T, S> {
    end_new!("consumer", false);

    /// Pops the oldest element if there is one; never blocks. Wakes a sleeping producer.
    ///
    /// # Errors
    ///
    /// [`TryPopError::Empty`] ([`TryPopError::Disconnected`] when every producer has also
    /// left); [`TryPopError::Corrupted`].
    #[inline]
    pub fn try_pop(&mut self) -> Result<T, TryPopError> {
        let v = match try_pop_in(&self.storage, &mut self.local, |v| v) {
            Err(TryPopError::Empty) if peers_left(&self.storage, Role::Producer) => {
                // What they published before leaving comes first: look once more.
                match try_pop_in(&self.storage, &mut self.local, |v| v) {
                    Err(TryPopError::Empty) => return Err(TryPopError::Disconnected),
                    popped => popped?,
                }
            }
            popped => popped?,
        };
        notify(&self.storage.control().not_full);
        Ok(v)
    }

    /// Pops the oldest element, waiting for one as the [`WaitPolicy`] says until
    /// `deadline`, and runs `then` on it *before* it leaves the ring: if this process dies
    /// inside `then`, the element is still there for the next consumer (a channel receiver
    /// takes its slot inside `then`, so that a crash never strands a slot between the ring
    /// and the receiver). `then` runs only on success.
    pub(crate) fn pop_then_until<R>(
        &mut self,
        deadline: Deadline,
        then: impl FnOnce(T) -> R,
    ) -> Result<R, PopTimeoutError> {
        self.pop_then_ticking(deadline, then, || Tick::Idle)
    }

    /// As [`pop_then_until`](Self::pop_then_until); at each liveness tick runs `tick` too
    /// (a channel receiver closes the pools of senders that died there, and takes over
    /// the messages of receivers that died), and ends the wait with what it gives
    /// (`Tick::Done`), looks again at once when it says it changed something
    /// (`Tick::Retry`), or ends the wait when it says the pop cannot succeed
    /// (`Tick::Stop`).
    #[cfg_attr(loom, allow(dead_code))] // used by channels
    pub(crate) fn pop_then_ticking<R>(
        &mut self,
        deadline: Deadline,
        then: impl FnOnce(T) -> R,
        mut tick: impl FnMut() -> Tick<R>,
    ) -> Result<R, PopTimeoutError> {
        let Self { storage, local, policy, .. } = self;
        let mut then = Some(then);
        // `then` runs once: only a successful pop calls it, and that ends the wait.
        let attempt = || {
            try_pop_in(storage, local, |v| then.take().map(|f| f(v))).map(Some).or_else(pop_retry)
        };
        let on_tick = || match tick() {
            Tick::Done(r) => Tick::Done(Some(r)),
            Tick::Retry => Tick::Retry,
            Tick::Idle => Tick::Idle,
            Tick::Stop(why) => Tick::Stop(why),
        };
        wait_for(&*storage, Role::Consumer, policy, deadline, attempt, on_tick)
            .map_err(PopTimeoutError::from)
            .map(|r| r.expect("then runs on the one successful pop"))
    }

    /// Pops the oldest element, waiting for one until `deadline`.
    pub(crate) fn pop_until(&mut self, deadline: Deadline) -> Result<T, PopTimeoutError> {
        self.pop_then_until(deadline, |v| v)
    }

    /// The storage, for the layers above (async waits park on its wait word).
    #[cfg_attr(any(loom, not(feature = "async")), allow(dead_code))]
    pub(crate) fn storage(&self) -> &S {
        &self.storage
    }

    /// Sets how blocking pops wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.policy.set(policy);
    }

    /// How blocking pops wait.
    pub fn wait_policy(&self) -> WaitPolicy {
        self.policy.policy()
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
}
