//! A thread waiting on several words at once (the blocking `select`): `futex_waitv` on
//! every source's word and the close events.

use super::*;

/// Close events of every segment the watcher thread watches: a thread in
/// [`block_on_any`] sleeps on it too, so that a peer's death wakes it to probe.
pub(super) static CLOSE_EVENTS: StdAtomicU32 = StdAtomicU32::new(0);

/// Set once `futex_waitv` was refused (before Linux 5.16).
static NO_WAITV: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Most sources [`block_on_any`] sleeps on (`futex_waitv` takes 128 words; one is
/// [`CLOSE_EVENTS`]).
pub(crate) const MAX_ANY: usize = 127;

/// [`block_on_any`] cannot serve this wait: more than [`MAX_ANY`] sources, or no
/// `futex_waitv` (before Linux 5.16). The caller waits through the waiter threads instead.
#[derive(Debug)]
pub(crate) struct Unsupported;

/// One try of each of `sources` (`Deadline::Now`: no wait, no syscall), in the order
/// `order(k)` gives: the first that has something, and its index.
pub(crate) fn try_each<S: ?Sized, O>(
    sources: &mut [&mut S],
    order: impl Fn(usize) -> usize,
    take: &mut impl FnMut(&mut S, Deadline) -> Option<O>,
) -> Option<(usize, O)> {
    (0..sources.len()).map(order).find_map(|i| take(sources[i], Deadline::Now).map(|o| (i, o)))
}

/// Takes from whichever of `sources` has something first, sleeping *this* thread on all
/// their words at once, as a blocking call sleeps on one: one wake-up from a publisher to
/// this thread, where a future's takes two (the waiter thread's, then the task's).
///
/// `take(source, d)` tries once (`Deadline::Now`), or once with its blocking form's tick
/// work (`Deadline::Tick`: probe the peers, repair); `None` when there is nothing now.
/// `park(source)` says where it sleeps. Sources are tried in the order `order(k)` gives,
/// `k = 0..n`. `None` once `deadline` has passed.
///
/// One sleep: every word's `sleepers += 1` and one heavy barrier, a last try of each, then
/// `futex_waitv` on every word and [`CLOSE_EVENTS`]. A source's peers are probed, as a
/// future's are, when its segment saw a close since its last probe that found nothing
/// (or, where inotify watches nothing, every [`UNWATCHED_TICK`]).
pub(crate) fn block_on_any<S: ?Sized, O>(
    sources: &mut [&mut S],
    order: impl Fn(usize) -> usize,
    deadline: Option<Instant>,
    mut take: impl FnMut(&mut S, Deadline) -> Option<O>,
    park: impl Fn(&S) -> Park,
) -> Result<Option<(usize, O)>, Unsupported> {
    let n = sources.len();
    // Relaxed: a cached answer of the kernel; a stale `false` costs one refused call.
    if n > MAX_ANY || NO_WAITV.load(StdOrdering::Relaxed) {
        return Err(Unsupported);
    }
    let parks: Vec<Park> = sources.iter().map(|s| park(s)).collect();
    let mut probes: Vec<Parked> = (0..n).map(|_| Parked::default()).collect();
    let mut epochs = Vec::with_capacity(n);
    let mut waits = [futex::Wait::new(); MAX_ANY + 1];
    loop {
        // Acquire: pairs with the Release bump of the watcher thread; read before the
        // probes below, so that a close after them wakes the sleep.
        let closes_seen = CLOSE_EVENTS.load(StdOrdering::Acquire);
        for k in 0..n {
            let i = order(k);
            if let Some(clear) = probes[i].probe_due(&parks[i]) {
                if let Some(o) = take(sources[i], Deadline::Tick) {
                    return Ok(Some((i, o)));
                }
                if let Some(count) = clear {
                    // Relaxed: see `Parked::probe_due`.
                    parks[i].clear_at.store(count, StdOrdering::Relaxed);
                }
            }
        }
        let bounded = WaitWord::register_all(parks.iter().map(Park::word), &mut epochs);
        let found = try_each(sources, &order, &mut take);
        let mut refused = false;
        if found.is_none() && deadline.is_none_or(|at| Instant::now() < at) {
            let unwatched = probes.iter().filter_map(|p| p.next_probe).min();
            let wake_at = [deadline, bounded.then(|| Instant::now() + DEGRADED_RECHECK), unwatched]
                .into_iter()
                .flatten()
                .min();
            waits[0] = private_wait(&CLOSE_EVENTS, closes_seen);
            for (w, (p, &epoch)) in waits[1..].iter_mut().zip(parks.iter().zip(&epochs)) {
                *w = word_wait(p.word(), epoch);
            }
            // Any outcome but ENOSYS (a word moved, the timeout, EAGAIN, EINTR) leads to
            // the same tries at the top of the loop. The words' mappings live in `parks`.
            let waited = futex::waitv(
                &waits[..=n],
                futex::WaitvFlags::empty(),
                wake_at.map(monotonic).as_ref(),
                rustix::time::ClockId::Monotonic,
            );
            refused = waited == Err(rustix::io::Errno::NOSYS);
        }
        parks.iter().for_each(|p| p.word().unregister());
        if found.is_some() {
            return Ok(found);
        }
        if refused {
            // Relaxed: see above.
            NO_WAITV.store(true, StdOrdering::Relaxed);
            return Err(Unsupported);
        }
        if let Some(found) = try_each(sources, &order, &mut take) {
            return Ok(Some(found));
        }
        if deadline.is_some_and(|at| Instant::now() >= at) {
            return Ok(None);
        }
    }
}

/// The close events of a segment so far, read from `word` (a [`Closes::word`]) before a
/// probe, so that a sleep on them ([`sleep_or_close`]) wakes at any close after it; `None`
/// where the kernel has no `futex_waitv` (the wait probes by time instead).
pub(crate) fn close_events(word: &StdAtomicU32) -> Option<u32> {
    // Relaxed: a cached answer of the kernel; a stale `false` costs one refused call.
    if NO_WAITV.load(StdOrdering::Relaxed) {
        return None;
    }
    // Acquire: pairs with the Release bump of the watcher thread.
    Some(word.load(StdOrdering::Acquire))
}

/// Sleeps until `word`'s epoch moves from `epoch`, the close events `closes` move from
/// `seen`, or `timeout` passes (or a signal): one `futex_waitv`, whose outcome it returns
/// (a word moved, the timeout, EAGAIN and EINTR all lead back to the caller's re-check).
/// `None` when the kernel has no `futex_waitv`: nothing waited, the caller sleeps on `word`
/// alone.
pub(crate) fn sleep_or_close(
    word: &WaitWord,
    epoch: u32,
    (closes, seen): (&StdAtomicU32, u32),
    timeout: Option<Duration>,
) -> Option<Result<(), rustix::io::Errno>> {
    let waits = [word_wait(word, epoch), private_wait(closes, seen)];
    let at = timeout.and_then(|t| Instant::now().checked_add(t)).map(monotonic);
    let waited = futex::waitv(
        &waits,
        futex::WaitvFlags::empty(),
        at.as_ref(),
        rustix::time::ClockId::Monotonic,
    );
    if waited == Err(rustix::io::Errno::NOSYS) {
        // Relaxed: see `close_events`.
        NO_WAITV.store(true, StdOrdering::Relaxed);
        return None;
    }
    Some(waited.map(drop))
}
