//! The future's side: where an endpoint parks ([`Park`]), and a future's parking
//! ([`Parked`]): the same steps as a blocking sleeper, then a waiter thread instead of
//! `futex_wait`.

use super::*;

/// What an async operation's future keeps between polls: where it is parked, and (on a
/// segment inotify cannot watch) when it probes its peers next.
///
/// `pub` only so that the sealed `Selectable` trait may name it: `wait` is a private
/// module, so no user can.
#[derive(Default)]
pub struct Parked {
    key: Option<Key>,
    pub(super) next_probe: Option<Instant>,
}

impl core::fmt::Debug for Parked {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Parked").field("parked", &self.key.is_some()).finish()
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            key.unpark();
        }
    }
}

/// What an async operation waits on: the word its blocking form sleeps on, what keeps its
/// mapping alive, the closes of the segment whose users it waits for, and the close count
/// at which the endpoint last probed them and found nothing to do (`u64::MAX`: never).
///
/// The count is the endpoint's, not the future's: peers found alive at count `n` are
/// alive while the count stays `n` (a death is a close), so the next future of the same
/// endpoint (a `recv_async` per message) parks without probing again.
///
/// `pub` only so that the sealed `Selectable` trait may name it (as [`Parked`]).
pub struct Park {
    word: *const WaitWord,
    keep: KeepAlive,
    closes: Arc<Closes>,
    pub(super) clear_at: Arc<AtomicU64>,
}

impl Park {
    /// # Safety
    ///
    /// `keep` keeps the memory of `word` alive (and at the same address) while it lives.
    pub(crate) unsafe fn new(
        word: &WaitWord,
        keep: KeepAlive,
        closes: Arc<Closes>,
        clear_at: Arc<AtomicU64>,
    ) -> Self {
        Self { word, keep, closes, clear_at }
    }

    /// This park, with the closes of `other`'s segment instead of its own (a sender's
    /// wait for a free slot watches the channel, where every receiver is, not the pool).
    #[cfg(feature = "async")]
    pub(crate) fn watching(self, other: Park) -> Self {
        Self { closes: other.closes, ..self }
    }

    pub(super) fn word(&self) -> &WaitWord {
        // SAFETY: `keep` keeps the word's memory alive (`new`'s contract).
        unsafe { &*self.word }
    }
}

impl Parked {
    /// Whether the peers should be probed now: the segment saw a close since the
    /// endpoint's last probe that found nothing (`Some(Some(count))`: record `count` if
    /// this one finds nothing either), or, unwatched, a tick has passed (`Some(None)`).
    pub(super) fn probe_due(&mut self, at: &Park) -> Option<Option<u64>> {
        if at.closes.watched() {
            // Acquire: pairs with the Release bump of the watcher thread.
            let count = u64::from(at.closes.events.load(StdOrdering::Acquire));
            // Relaxed: a cache of this endpoint's own probes; a stale value costs a probe.
            (at.clear_at.load(StdOrdering::Relaxed) != count).then_some(Some(count))
        } else {
            let now = Instant::now();
            let due = self.next_probe.is_none_or(|at| at <= now);
            if due {
                self.next_probe = Some(now + UNWATCHED_TICK);
            }
            due.then_some(None)
        }
    }

    /// One poll of an operation on the endpoint `end`: `op(end, Deadline::Now)` tries it
    /// (`Deadline::Tick`: tries it and does its blocking form's tick work: probes,
    /// repairs, reclaims) and returns `None` when it would wait; `at(end)` says where to
    /// park then.
    pub(crate) fn poll<E: ?Sized, R>(
        &mut self,
        cx: &mut Context<'_>,
        end: &mut E,
        at: impl FnOnce(&E) -> Park,
        mut op: impl FnMut(&mut E, Deadline) -> Option<R>,
    ) -> Poll<R> {
        if let Some(key) = &self.key {
            // Polled again before its word moved (a `select` over several, or a spurious
            // poll): nothing can have changed for it, and it stays parked.
            if key.still_parked(cx.waker()) {
                return Poll::Pending;
            }
            // Woken: whoever took the entry out gave its `sleepers` back.
            self.key = None;
        }
        if let Some(r) = op(end, Deadline::Now) {
            return Poll::Ready(r);
        }
        let at = at(end);
        if let Some(clear) = self.probe_due(&at) {
            if let Some(r) = op(end, Deadline::Tick) {
                return Poll::Ready(r);
            }
            if let Some(count) = clear {
                // Relaxed: see `probe_due`.
                at.clear_at.store(count, StdOrdering::Relaxed);
            }
        }
        // As a blocking sleeper: register (the heavy barrier, the epoch), one more look.
        let (expected, bounded) = at.word().register();
        if let Some(r) = op(end, Deadline::Now) {
            at.word().unregister();
            return Poll::Ready(r);
        }
        let recheck = bounded.then(|| Instant::now() + DEGRADED_RECHECK);
        let unwatched = !at.closes.watched();
        let wake_at = match (recheck, self.next_probe.filter(|_| unwatched)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Park { word, keep, closes, .. } = at;
        let entry = Entry {
            word,
            expected,
            waker: cx.waker().clone(),
            closes,
            wake_at,
            _keep: keep,
            ticket: TICKETS.fetch_add(1, StdOrdering::Relaxed),
        };
        match park(entry) {
            Ok(key) => {
                self.key = Some(key);
                Poll::Pending
            }
            Err(entry) => {
                // No waiter thread could be started: try again soon rather than never.
                entry.unregister();
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}
