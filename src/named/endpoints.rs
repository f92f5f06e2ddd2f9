//! The endpoints of named rings: thin handles over the algorithms in [`crate::ring`], each
//! operation in its non-blocking form (`try_x`) and its three blocking forms (`x`,
//! `x_timeout`, `x_deadline`, all made by `wait::blocking!` from one deadline form).
//!
//! SPSC and MPMC ends offer the same operations; only their receivers differ (an SPSC end
//! is used through `&mut self`, by one thread; an MPMC end through `&self`, and clones of it
//! share the ring). One macro per side writes the operations for both.

use bytemuck::Pod;

use crate::descriptor::Descriptor;
use crate::layout::{Corrupted, MpmcCell, SpscCell};
use crate::liveness::Role;
use crate::ring::{
    PopError, PopTimeoutError, PushError, PushTimeoutError, ShmStorage, TryPopError, TryPushError,
    mpmc, spsc,
};
use crate::wait::{WaitPolicy, blocking, receive_iter};
#[cfg(feature = "async")]
use crate::{liveness::Blocked, wait::reactor::wait};

/// What every end tells of its ring.
macro_rules! end_ops {
    () => {
        /// Number of cells.
        pub fn capacity(&self) -> usize {
            self.inner.capacity()
        }

        /// Elements pushed and not yet popped (a snapshot that may change at once; `None`
        /// when the ring's positions are impossible).
        pub fn len(&self) -> Option<usize> {
            self.inner.len()
        }

        /// Whether the ring looks empty (see [`len`](Self::len)).
        pub fn is_empty(&self) -> bool {
            self.inner.is_empty()
        }
    };
}

/// The operations of a producer end; `mut` for SPSC ends (`&mut self`).
macro_rules! producer_ops {
    ($($mut:tt)?) => {
        /// Pushes `value` if there is room; never blocks.
        ///
        /// # Errors
        ///
        /// [`TryPushError::Full`] with the value back ([`TryPushError::Disconnected`] when
        /// every consumer has also left); [`TryPushError::Corrupted`].
        #[inline]
        pub fn try_push(&$($mut)? self, value: T) -> Result<(), TryPushError<T>> {
            self.inner.try_push(value)
        }

        blocking! {
            /// Pushes `value`, waiting for room as the [`WaitPolicy`] says.
            ///
            /// # Errors
            ///
            /// [`PushError::Disconnected`] with the value back when the ring stays full and
            /// every consumer has left ([`PushError::PeerDead`] when one of them died);
            /// [`PushError::Corrupted`].
            pub fn push -> PushError<T>, push_timeout, push_deadline -> PushTimeoutError<T>;
                (&$($mut)? self, value: T) -> () => inner.push_until;
        }

        /// Pushes `value`, waiting for room without blocking the thread (feature `async`):
        /// the task parks on the same wait word as [`push`](Self::push), and this
        /// process's waiter thread wakes it (docs/DESIGN.md, "Async waits"). Works under
        /// any executor. Returns at once, with no syscall, when there is room.
        ///
        /// Cancel-safe: a future dropped before it completes has pushed nothing.
        ///
        /// # Errors
        ///
        /// As [`push`](Self::push).
        #[cfg(feature = "async")]
        pub async fn push_async(&$($mut)? self, value: T) -> Result<(), PushError<T>> {
            let mut end = &$($mut)? self.inner;
            wait(&mut end, |e| e.storage().park(Role::Producer), |e, d| match e.push_until(value, d) {
                Err(PushTimeoutError::Timeout(_)) => None,
                done => Some(done.map_err(PushError::from_timeout)),
            })
            .await
        }

        /// Pushes as many of `values` as there is room for, from the front, publishing
        /// them together (SPSC: one store; MPMC: one compare-and-swap for up to 64 cells in
        /// a row): a stream of small elements moves far faster in slices. Never blocks.
        /// Returns how many were pushed (0: full); they stay together and in order.
        ///
        /// # Errors
        ///
        /// [`Corrupted`] when the ring's positions or stamps are impossible.
        pub fn try_push_slice(&$($mut)? self, values: &[T]) -> Result<usize, Corrupted> {
            self.inner.try_push_slice(values)
        }

        blocking! {
            /// Pushes all of `values`, in slices as room appears (MPMC: other producers'
            /// elements may fall between two of them).
            ///
            /// # Errors
            ///
            /// [`PushError::PeerDead`] with how many were pushed, when the ring stays
            /// full and every consumer has died; [`PushError::Corrupted`]. A `Timeout`
            /// carries how many were pushed.
            pub fn push_slice -> PushError<usize>,
                push_slice_timeout, push_slice_deadline -> PushTimeoutError<usize>;
                (&$($mut)? self, values: &[T]) -> () => inner.push_slice_until;
        }

        /// Pushes all of `values` as [`push_slice`](Self::push_slice) does, waiting for
        /// room without blocking the thread (feature `async`; parked as
        /// [`push_async`](Self::push_async)). Returns at once, with no syscall, when all of
        /// it fits.
        ///
        /// **Not cancel-safe**, as tokio's `write_all` is not: a future dropped before it
        /// completes may already have pushed a prefix of `values`, and how long a prefix is
        /// lost with it. Where the future may be dropped (a `select!` branch, a timeout),
        /// use [`push_slice_some_async`](Self::push_slice_some_async), which is.
        ///
        /// # Errors
        ///
        /// As [`push_slice`](Self::push_slice): the error carries how many were pushed.
        #[cfg(feature = "async")]
        pub async fn push_slice_async(&$($mut)? self, values: &[T]) -> Result<(), PushError<usize>> {
            let mut done = 0;
            while done < values.len() {
                done += self
                    .push_slice_some_async(&values[done..])
                    .await
                    .map_err(|e| e.map(|n| done + n))?;
            }
            Ok(())
        }

        /// Pushes at least one and as many of `values` as there is room for, from the
        /// front, waiting for room without blocking the thread (feature `async`). Returns
        /// how many were pushed (0 only for an empty `values`); they stay together and in
        /// order (SPSC: one store; MPMC: one claim for each run of up to 64 cells).
        ///
        /// Cancel-safe: a future dropped before it completes has pushed nothing.
        ///
        /// # Errors
        ///
        /// As [`push_slice`](Self::push_slice), each carrying 0: nothing was pushed.
        #[cfg(feature = "async")]
        pub async fn push_slice_some_async(&$($mut)? self, values: &[T]) -> Result<usize, PushError<usize>> {
            if values.is_empty() {
                return Ok(0);
            }
            let mut end = &$($mut)? self.inner;
            wait(&mut end, |e| e.storage().park(Role::Producer), |e, d| match e.push_some_until(values, d) {
                Err(Blocked::Timeout) => None,
                Err(b) => Some(Err(PushError::from_timeout(PushTimeoutError::from_blocked(b, 0)))),
                Ok(n) => Some(Ok(n)),
            })
            .await
        }

        /// Sets how blocking pushes of this handle wait.
        pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
            self.inner.set_wait_policy(policy);
        }

        /// Whether each push of this handle moves the written cell to the shared cache
        /// (`cldemote`, x86; a no-op elsewhere). Off by default, or on when
        /// `GPURING_DEMOTE=1`.
        ///
        /// Turn it on for hand-offs that go one at a time (request/response, a consumer
        /// that waits for each message): the consumer then reads the cell from the shared
        /// cache instead of snooping this core. Leave it off for streams, which it slows
        /// (docs/BENCHMARKS.md has the figures).
        pub fn set_demote(&mut self, on: bool) {
            self.inner.set_demote(on);
        }

        end_ops!();
    };
}

/// The operations of a consumer end; `mut` for SPSC ends (`&mut self`).
macro_rules! consumer_ops {
    ($($mut:tt)?) => {
        /// Pops the oldest element if there is one; never blocks.
        ///
        /// # Errors
        ///
        /// [`TryPopError::Empty`] ([`TryPopError::Disconnected`] when every producer has
        /// also left); [`TryPopError::Corrupted`].
        #[inline]
        pub fn try_pop(&$($mut)? self) -> Result<T, TryPopError> {
            self.inner.try_pop()
        }

        blocking! {
            /// Pops the oldest element, waiting for one as the [`WaitPolicy`] says.
            ///
            /// # Errors
            ///
            /// [`PopError::Disconnected`] once every producer has left and all they
            /// published is taken ([`PopError::PeerDead`] when one of them died);
            /// [`PopError::Corrupted`].
            pub fn pop -> PopError, pop_timeout, pop_deadline -> PopTimeoutError;
                (&$($mut)? self) -> T => inner.pop_until;
        }

        /// Pops the oldest element, waiting for one without blocking the thread (feature
        /// `async`): the task parks on the same wait word as [`pop`](Self::pop), and this
        /// process's waiter thread wakes it. Works under any executor. Returns at once,
        /// with no syscall, when an element is there.
        ///
        /// Cancel-safe: a future dropped before it completes has taken nothing (use it
        /// in `select!` freely).
        ///
        /// # Errors
        ///
        /// As [`pop`](Self::pop).
        #[cfg(feature = "async")]
        pub async fn pop_async(&$($mut)? self) -> Result<T, PopError> {
            let mut end = &$($mut)? self.inner;
            wait(&mut end, |e| e.storage().park(Role::Consumer), |e, d| match e.pop_until(d) {
                Err(PopTimeoutError::Timeout) => None,
                done => Some(done.map_err(PopError::from_timeout)),
            })
            .await
        }

        /// The elements as they arrive, until every producer has left and all they
        /// published is taken ([`PopError::Disconnected`] ends it quietly). Any other
        /// error is yielded, and ends it.
        pub fn iter(&$($mut)? self) -> impl Iterator<Item = Result<T, PopError>> + '_ {
            receive_iter(move || self.pop(), |e| matches!(e, PopError::Disconnected), |_| false)
        }

        /// The elements there now: ends quietly when the ring is empty or every producer
        /// has left; any other error is yielded, and ends it.
        pub fn try_iter(&$($mut)? self) -> impl Iterator<Item = Result<T, TryPopError>> + '_ {
            receive_iter(
                move || self.try_pop(),
                |e| matches!(e, TryPopError::Empty | TryPopError::Disconnected),
                |_| false,
            )
        }

        /// Pops up to `out.len()` elements into `out`, oldest first, taking them together
        /// (SPSC: one store; MPMC: one compare-and-swap for up to 64 cells); never blocks.
        /// Returns how many (0: empty).
        ///
        /// # Errors
        ///
        /// [`Corrupted`] when the ring's positions or stamps are impossible.
        pub fn try_pop_into(&$($mut)? self, out: &mut [T]) -> Result<usize, Corrupted> {
            self.inner.try_pop_into(out)
        }

        blocking! {
            /// Pops at least one and up to `out.len()` elements into `out`, oldest first,
            /// waiting for the first as the [`WaitPolicy`] says. Returns how many (0 only
            /// for an empty `out`).
            ///
            /// # Errors
            ///
            /// As [`pop`](Self::pop).
            pub fn pop_into -> PopError, pop_into_timeout, pop_into_deadline -> PopTimeoutError;
                (&$($mut)? self, out: &mut [T]) -> usize => inner.pop_into_until;
        }

        /// Pops at least one and up to `out.len()` elements into `out`, as
        /// [`pop_into`](Self::pop_into) does, waiting for the first without blocking the
        /// thread (feature `async`; parked as [`pop_async`](Self::pop_async)). Returns at
        /// once, with no syscall, when an element is there; how many were taken (0 only
        /// for an empty `out`).
        ///
        /// Cancel-safe: a future dropped before it completes has taken nothing.
        ///
        /// # Errors
        ///
        /// As [`pop`](Self::pop).
        #[cfg(feature = "async")]
        pub async fn pop_into_async(&$($mut)? self, out: &mut [T]) -> Result<usize, PopError> {
            if out.is_empty() {
                return Ok(0);
            }
            let mut end = &$($mut)? self.inner;
            wait(&mut end, |e| e.storage().park(Role::Consumer), |e, d| match e.pop_into_until(out, d) {
                Err(PopTimeoutError::Timeout) => None,
                done => Some(done.map_err(PopError::from_timeout)),
            })
            .await
        }

        /// Sets how blocking pops of this handle wait.
        pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
            self.inner.set_wait_policy(policy);
        }

        end_ops!();
    };
}

/// The producer end of an [`SpscRing`](crate::SpscRing): the one process that pushes.
///
/// Pushes publish with one store and wake a sleeping consumer; while nobody sleeps they
/// make no syscall. Blocking calls spin, yield, then sleep as the [`WaitPolicy`] says, and
/// notice within [`LIVENESS_TICK`](crate::LIVENESS_TICK) of waiting that the consumer died.
///
/// ```no_run
/// use gpuring::{Descriptor, DType, SpscRing, TensorMeta};
/// let ring = SpscRing::<Descriptor>::builder("frames").capacity(1024).create()?;
/// let mut tx = ring.producer()?;
/// let meta = TensorMeta::contiguous(DType::F16, &[3, 224, 224])?;
/// tx.push(Descriptor::new(0, &meta).with_tag(7))?; // waits while the ring is full
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SpscProducer<T = Descriptor> {
    pub(super) inner: spsc::Producer<T, ShmStorage<SpscCell<T>>>,
}

impl<T: Pod + Send> SpscProducer<T> {
    producer_ops!(mut);
}

/// The consumer end of an [`SpscRing`](crate::SpscRing): the one process that pops.
///
/// ```no_run
/// use std::time::Duration;
/// use gpuring::{Descriptor, SpscRing};
/// let ring = SpscRing::<Descriptor>::builder("frames").open()?;
/// let mut rx = ring.consumer()?;
/// let d = rx.pop_timeout(Duration::from_secs(1))?;
/// let meta = d.meta()?; // every field checked: peers are untrusted
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SpscConsumer<T = Descriptor> {
    pub(super) inner: spsc::Consumer<T, ShmStorage<SpscCell<T>>>,
}

impl<T: Pod + Send> SpscConsumer<T> {
    consumer_ops!(mut);
}

/// A producer end of an [`MpmcRing`](crate::MpmcRing). `Clone` makes another producer
/// (one per thread, or share one: it is `Sync`); all push into the same ring, each
/// producer's elements in order. A blocked push skips the cells of producers that died
/// holding them.
///
/// ```no_run
/// use gpuring::MpmcRing;
/// let ring = MpmcRing::<u64>::builder("work").open()?;
/// let tx = ring.producer()?;
/// let workers: Vec<_> = (0..4u64)
///     .map(|w| {
///         let tx = tx.clone();
///         std::thread::spawn(move || tx.push(w))
///     })
///     .collect();
/// for w in workers {
///     w.join().unwrap()?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct MpmcProducer<T = Descriptor> {
    pub(super) inner: mpmc::Producer<T, ShmStorage<MpmcCell<T>>>,
}

impl<T: Pod + Send> MpmcProducer<T> {
    producer_ops!();
}

/// A consumer end of an [`MpmcRing`](crate::MpmcRing). `Clone` makes another consumer;
/// every element goes to exactly one of them.
///
/// A consumer that dies holding an element it has claimed does not lose it: a blocked
/// consumer adopts it at its next liveness tick.
///
/// ```no_run
/// use gpuring::MpmcRing;
/// let ring = MpmcRing::<u64>::builder("work").open()?;
/// let rx = ring.consumer()?;
/// let mut batch = [0u64; 32];
/// let n = rx.pop_into(&mut batch)?; // at least one, up to 32, in one claim
/// # let _ = n;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct MpmcConsumer<T = Descriptor> {
    pub(super) inner: mpmc::Consumer<T, ShmStorage<MpmcCell<T>>>,
}

impl<T: Pod + Send> MpmcConsumer<T> {
    consumer_ops!();
}

/// Ring consumers in a [`select`](crate::select): each take is a pop.
macro_rules! selectable_consumer {
    ($($end:ident),*) => {$(
        impl<T: Pod + Send> crate::wait::reactor::sealed::Selectable for $end<T> {
            type Output = Result<T, PopError>;

            fn take(&mut self, deadline: crate::wait::Deadline) -> Option<Self::Output> {
                match self.inner.pop_until(deadline) {
                    Err(PopTimeoutError::Timeout) => None,
                    done => Some(done.map_err(PopError::from_timeout)),
                }
            }

            fn park(&self) -> crate::wait::reactor::Park {
                self.inner.storage().park(Role::Consumer)
            }
        }
    )*};
}
selectable_consumer!(SpscConsumer, MpmcConsumer);
