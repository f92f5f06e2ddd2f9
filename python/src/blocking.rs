//! Blocking from Python: every wait runs in Rust with the GIL released, in slices, checking
//! for signals between them, so that Ctrl-C raises `KeyboardInterrupt` and other Python
//! threads run meanwhile. An endpoint's wait ([`wait`]) sleeps in slices of [`SLICE`] inside
//! `gpuring::interruptible`: the terminal's `SIGINT` goes to the main thread, whose sleep it
//! interrupts, so the slice ends then and the signal is handled at once. A wait that
//! polls instead of sleeping (opening a channel that is not there yet: [`wait_polling`])
//! checks between slices of [`POLL_SLICE`] growing to [`POLL_SLICE_MAX`].

use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::errors::{Class, raise};

/// An endpoint's wait's slice without the GIL. A signal that interrupts its sleep ends it at
/// once; one that arrives while the thread is not asleep (spinning at the start of a wait)
/// is handled when the slice ends. Each slice costs an idle receiver a wake-up and a new
/// start of its Rust wait (a registration as a sleeper, a fence): long slices keep an idle
/// Python receiver near the Rust wait's own cost (BENCHMARKS.md, idle receivers' CPU).
pub(crate) const SLICE: Duration = Duration::from_secs(2);

/// A polling wait's first slice without the GIL, before it checks for signals; each next
/// slice is twice as long, up to [`POLL_SLICE_MAX`].
pub(crate) const POLL_SLICE: Duration = Duration::from_millis(50);

/// A polling wait's longest slice: Ctrl-C is handled within that long.
pub(crate) const POLL_SLICE_MAX: Duration = Duration::from_millis(250);

/// A Python `timeout=` argument: `None` waits as long as it takes, `0` tries once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Until(Option<Instant>);

impl Until {
    /// # Errors
    ///
    /// `ConfigError` (a `ValueError`) for a negative or non-finite number of seconds.
    pub(crate) fn new(py: Python<'_>, timeout: Option<f64>) -> PyResult<Self> {
        match timeout {
            None => Ok(Until(None)),
            Some(t) if t.is_finite() && t >= 0.0 => {
                let d = Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX);
                Ok(Until(Instant::now().checked_add(d)))
            }
            Some(t) => Err(raise(
                py,
                Class::ConfigError,
                format!("timeout {t} is not a number of seconds >= 0"),
            )),
        }
    }

    /// The next slice to wait: up to `longest`, never past the deadline (zero once it
    /// passed: one more try).
    pub(crate) fn slice(&self, longest: Duration) -> Duration {
        match self.0 {
            None => longest,
            Some(end) => end.saturating_duration_since(Instant::now()).min(longest),
        }
    }

    /// Whether the deadline has passed.
    pub(crate) fn passed(&self) -> bool {
        self.0.is_some_and(|end| Instant::now() >= end)
    }
}

/// An endpoint's lock for one step of a wait. The first try (`slice` `None`) runs with
/// the GIL held, so it does not wait for the lock: another thread may hold it through a
/// whole slice of its own wait, and every Python thread would stall meanwhile; nor does a
/// zero slice (`timeout=0`: an answer now). A slice (without the GIL) waits for it up to
/// the slice or [`POLL_SLICE_MAX`], whichever is shorter, looking every millisecond, so that
/// the caller's deadline and signals are seen meanwhile. `None`: taken; try again.
pub(crate) fn lock_for<T>(m: &Mutex<T>, slice: Option<Duration>) -> Option<MutexGuard<'_, T>> {
    let end = slice.filter(|d| !d.is_zero()).map(|d| Instant::now() + d.min(POLL_SLICE_MAX));
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => {}
        }
        let left = end?.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::sleep(left.min(Duration::from_millis(1)));
    }
}

/// What one slice of a wait gave.
pub(crate) enum Step<T, S> {
    /// Finished (a result or an error other than running out of time).
    Done(T),
    /// The slice ran out; the state to try again with (a lease, ...).
    Again(S),
}

/// Runs `step` once at once, then in slices until it is done or `until` passes, the GIL
/// released during each slice and signals checked between them. `Ok(Err(state))`: the
/// deadline passed. For an endpoint's wait, whose sleeps a signal interrupts: slices of
/// [`SLICE`], each inside `gpuring::interruptible`.
///
/// `step(state, None, _)` is one try, with the GIL held: no wait, no spin, no probe of the
/// peers (the Rust API's `try_` form), so that what is ready (a free slot, a queued
/// message) is taken without letting go of the GIL, and what is not costs a fraction of a
/// microsecond. `step(state, Some(slice), again)` waits up to `slice` (the `_timeout`
/// form: it sleeps, and probes the peers at its liveness ticks); `again` is false for the
/// first slice only, the one whose start may spin as the endpoint's wait policy says (a
/// wait already a slice long gains nothing by spinning at each slice's start). A zero
/// `timeout` gets one zero slice after the try, so that it still learns of a dead peer.
///
/// # Errors
///
/// What a signal handler raised (`KeyboardInterrupt`); `state` is dropped then.
pub(crate) fn wait<T: Send, S: Send>(
    py: Python<'_>,
    until: Until,
    state: S,
    step: impl Fn(S, Option<Duration>, bool) -> Step<T, S> + Sync,
) -> PyResult<Result<T, S>> {
    sliced(py, until, state, (SLICE, SLICE), |s, slice, again| match slice {
        None => step(s, None, again), // the try: nothing sleeps
        Some(_) => gpuring::interruptible(|| step(s, slice, again)),
    })
}

/// [`wait`] for a step that polls (sleeps a signal does not end): slices of [`POLL_SLICE`]
/// doubling to [`POLL_SLICE_MAX`].
///
/// # Errors
///
/// As [`wait`].
pub(crate) fn wait_polling<T: Send, S: Send>(
    py: Python<'_>,
    until: Until,
    state: S,
    step: impl Fn(S, Option<Duration>, bool) -> Step<T, S> + Sync,
) -> PyResult<Result<T, S>> {
    sliced(py, until, state, (POLL_SLICE, POLL_SLICE_MAX), step)
}

/// The loop of [`wait`]: slices from `first`, doubling up to `longest`.
fn sliced<T: Send, S: Send>(
    py: Python<'_>,
    until: Until,
    mut state: S,
    (first, longest): (Duration, Duration),
    step: impl Fn(S, Option<Duration>, bool) -> Step<T, S> + Sync,
) -> PyResult<Result<T, S>> {
    match step(state, None, false) {
        Step::Done(t) => return Ok(Ok(t)),
        Step::Again(s) => state = s,
    }
    let mut again = false;
    let mut next = first;
    loop {
        let slice = until.slice(next);
        next = (next * 2).min(longest);
        match py.detach(|| step(state, Some(slice), again)) {
            Step::Done(t) => return Ok(Ok(t)),
            Step::Again(s) if until.passed() => return Ok(Err(s)),
            Step::Again(s) => {
                state = s;
                again = true;
                py.check_signals()?;
            }
        }
    }
}
