//! Blocking from Python: every wait runs in Rust with the GIL released, in slices of
//! [`SLICE`] growing to [`SLICE_MAX`], checking for signals between them, so that Ctrl-C
//! raises `KeyboardInterrupt` within about that long and other Python threads run meanwhile.

use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::errors::{Class, raise};

/// A wait's first slice without the GIL, before it checks for signals; each next slice is
/// twice as long, up to [`SLICE_MAX`].
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// The longest slice: a wait idle for half a second checks for signals four times a second.
/// Each slice costs an idle receiver a registration as a sleeper (a `membarrier`) and a
/// wake-up, some 50–250 µs of CPU on the VMs we measure on: eight receivers idle in 50 ms
/// slices used 11–18 ms of CPU a second together (16-core H200 VM), 20× the Rust wait's.
pub(crate) const SLICE_MAX: Duration = Duration::from_millis(250);

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
/// zero slice (`timeout=0`: an answer now). `None`: taken; try again in a slice (without
/// the GIL, where waiting for it is harmless).
pub(crate) fn lock_for<T>(m: &Mutex<T>, slice: Option<Duration>) -> Option<MutexGuard<'_, T>> {
    if slice.is_some_and(|d| !d.is_zero()) {
        return Some(m.lock().unwrap_or_else(PoisonError::into_inner));
    }
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
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
/// deadline passed.
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
    mut state: S,
    step: impl Fn(S, Option<Duration>, bool) -> Step<T, S> + Sync,
) -> PyResult<Result<T, S>> {
    match step(state, None, false) {
        Step::Done(t) => return Ok(Ok(t)),
        Step::Again(s) => state = s,
    }
    let mut again = false;
    let mut longest = SLICE;
    loop {
        let slice = until.slice(longest);
        longest = (longest * 2).min(SLICE_MAX);
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
