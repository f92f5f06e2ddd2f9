//! What a select waits on ([`Selectable`]), the wait of an async operation, and the
//! counts of the waiting machinery.

use super::*;

/// What [`select`](crate::select) and its forms (and `select_async`, feature `async`) can
/// wait on, several at once: a channel's [`Receiver`](crate::Receiver) of any backend
/// (each take a `Result<Message<B>, RecvError<B>>`), an
/// [`SpscConsumer`](crate::SpscConsumer) or [`MpmcConsumer`](crate::MpmcConsumer) of a
/// ring (each take a `Result<T, PopError>`). Sealed: the crate implements it.
///
/// A list of one type selects as it is; SPSC and MPMC consumers of the same element type
/// mix as trait objects:
///
/// ```no_run
/// use gpuring::{MpmcRing, PopError, Selectable, SpscRing, select};
/// let (a, b) = (SpscRing::<u64>::builder("ticks").open()?, MpmcRing::<u64>::builder("jobs").open()?);
/// let (mut a, mut b) = (a.consumer()?, b.consumer()?);
/// let mut live: Vec<&mut dyn Selectable<Output = Result<u64, PopError>>> = vec![&mut a, &mut b];
/// while !live.is_empty() {
///     match select(&mut live) {
///         (i, Ok(v)) => println!("from {i}: {v}"),
///         (i, Err(_)) => drop(live.remove(i)), // its producers have gone
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Selectable: sealed::Selectable {}

impl<S: sealed::Selectable + ?Sized> Selectable for S {}

pub(crate) mod sealed {
    use super::{Deadline, Park};

    /// How a select takes from a source. See [`Selectable`](super::Selectable).
    pub trait Selectable {
        /// What one take gives: an item, or a final error.
        type Output;

        /// One attempt (`Deadline::Now`: no wait, no syscall), or one attempt with the
        /// blocking form's tick work (`Deadline::Tick`: probe the peers, repair): `None`
        /// when there is nothing now.
        fn take(&mut self, deadline: Deadline) -> Option<Self::Output>;

        /// Where the source's waits sleep (its ring's `not_empty` word).
        fn park(&self) -> Park;
    }
}

/// Waits for `op` on the endpoint `end` without blocking the thread: polls it (see
/// [`Parked::poll`]) until it is done. The future holds `end` as `&mut`, so that it is
/// `Send` whenever the endpoint is.
#[cfg(feature = "async")]
pub(crate) async fn wait<E: ?Sized, R>(
    end: &mut E,
    at: impl Fn(&E) -> Park,
    mut op: impl FnMut(&mut E, Deadline) -> Option<R>,
) -> R {
    let mut parked = Parked::default();
    std::future::poll_fn(|cx| parked.poll(cx, &mut *end, &at, &mut op)).await
}

/// The async waiting machinery of this process, as counts (feature `async`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaiterStats {
    /// Waiter threads started (one per 127 futures parked at once, at the most ever).
    pub threads: usize,
    /// Futures parked now (each wakes when its wait word moves, or its peers' segment
    /// sees a close).
    pub parked: usize,
    /// Segments whose closes inotify watches for parked futures now.
    pub watched_segments: usize,
}

/// How many waiter threads this process runs, and how many futures are parked on them.
///
/// ```
/// let s = gpuring::internal::waiter_stats();
/// assert!(s.parked <= s.threads * 127);
/// ```
pub fn waiter_stats() -> WaiterStats {
    let registry = lock(&REGISTRY);
    let parked = registry.iter().map(|s| lock(&s.entries).iter().flatten().count()).sum();
    let watcher = *lock(&WATCHER);
    let watched_segments = watcher
        .map(|w| lock(&w.watches).values().filter(|c| c.strong_count() > 0).count())
        .unwrap_or(0);
    WaiterStats { threads: registry.len(), parked, watched_segments }
}
