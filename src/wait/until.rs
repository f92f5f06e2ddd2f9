//! The wait loop ([`wait_until`]): spinning as an endpoint's recent waits earned
//! ([`spins`](super::spins)), then sleeping as a registered [`Sleeper`].
//!
//! **One registration a wait.** A wait registers as a sleeper (with the heavy barrier, or
//! a fence where every publisher of its word fences: [`Registration`]) at its first sleep
//! and stays registered until it ends ([`Sleeper`]).

use std::time::Duration;

use super::spins::{Waits, spin_only, yield_then_try};
use super::{DEGRADED_RECHECK, Deadline, Slept, TimedOut, WaitWord, sleep};
use crate::sync::Ordering;

/// How a wait registers as a sleeper on its word, after what the word's publishers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Registration {
    /// With the heavy barrier (`membarrier`): the word's publishers run `notify`, whose
    /// barrier is a compiler fence.
    Barrier,
    /// With a `SeqCst` fence: every publisher of the word runs `notify_fenced` (a broadcast
    /// ring's `not_empty`).
    Fenced,
}

/// A thread's registration as a sleeper on a wait word for one blocking wait: made, with
/// its heavy barrier, before the wait's first sleep, and kept until the wait ends (the
/// value's drop), through every later sleep of the wait (its liveness chunks, its spurious
/// wake-ups) and the ticks between them.
///
/// Once the barrier has run, a publisher's load of `sleepers` sees this registration for as
/// long as it stands (nothing takes it off the count before the drop), so a later sleep
/// needs no barrier of its own: it reads the epoch (Acquire), re-checks, and sleeps on that
/// epoch, and a publication after the re-check bumps the epoch and wakes it. On a VM of
/// 16 cores the barrier (`membarrier`) costs 20–180 µs of CPU, so an idle receiver that
/// registered anew at each tick paid it once a second. While registered between sleeps (a
/// tick's probe), a publisher makes one needless wake syscall at most.
pub(crate) struct Sleeper<'a> {
    word: &'a WaitWord,
    registration: Registration,
    /// Whether sleeps are bounded by `DEGRADED_RECHECK`, once registered.
    bounded: Option<bool>,
    /// The endpoint's spins, when this wait spun in vain, and when it first went to sleep:
    /// told how long the wait slept when it ends.
    learn: Option<(&'a Waits, Option<std::time::Instant>)>,
}

impl<'a> Sleeper<'a> {
    /// Not registered yet: nothing is done until the first sleep, which registers as
    /// `waits` says.
    pub(crate) const fn of(word: &'a WaitWord, waits: &Waits) -> Self {
        Self { word, registration: waits.registration(), bounded: None, learn: None }
    }

    /// Registers if not yet (as its `Registration` says), then the epoch to sleep on and
    /// whether the sleep is bounded.
    fn register(&mut self) -> (u32, bool) {
        if let Some((_, asleep @ None)) = &mut self.learn {
            *asleep = Some(std::time::Instant::now());
        }
        match self.bounded {
            Some(bounded) => {
                // Acquire: pairs with the Release bump in `wake_all`.
                (self.word.epoch.load(Ordering::Acquire), bounded)
            }
            None => {
                let (epoch, bounded) = match self.registration {
                    Registration::Barrier => self.word.register(),
                    Registration::Fenced => (self.word.register_light(), false),
                };
                self.bounded = Some(bounded);
                (epoch, bounded)
            }
        }
    }
}

impl Drop for Sleeper<'_> {
    fn drop(&mut self) {
        if self.bounded.is_some() {
            self.word.unregister();
        }
        if let Some((waits, Some(asleep))) = self.learn {
            waits.slept(asleep.elapsed());
        }
    }
}

/// The spins and yields at a wait's start, as many as `waits` earned (a policy that never
/// sleeps: until `deadline`, checked now and then). `None` when they were spent in vain:
/// the sleeper then times the wait's sleeps, for `waits` (`Waits::slept`, at its end).
fn spin<'a, R>(
    sleeper: &mut Sleeper<'a>,
    waits: &'a Waits,
    deadline: Deadline,
    attempt: &mut impl FnMut() -> Option<R>,
) -> Option<Result<R, TimedOut>> {
    let now = waits.now();
    // A policy that never sleeps spins until the deadline, whatever its limit.
    let limit = if now.never_sleeps() { None } else { now.spin_limit };
    let spun = spin_only(
        now.spins,
        limit,
        || attempt().map(Ok),
        || deadline.passed().then_some(Err(TimedOut)),
    );
    if spun.is_some() {
        return spun;
    }
    if let Some(r) = yield_then_try(now.yields, &mut *attempt) {
        // Just after the spins ran out: more of them would have caught it.
        waits.slept(Duration::ZERO);
        return Some(Ok(r));
    }
    if !waits.fixed() && sleeper.learn.is_none() {
        sleeper.learn = Some((waits, None));
    }
    None
}

/// Runs `attempt` until it returns `Some`, spinning, yielding ([`spin`]) and then sleeping
/// on the sleeper's word, until `deadline`; with `spin_first` false (a wait's later steps),
/// sleeping at once unless the policy never sleeps.
///
/// With `closes` (a segment's close-event word and its value when the caller last probed
/// its peers, see `reactor::close_events`), the sleep also ends when the segment sees a
/// close (a peer may have died), and the wait returns `TimedOut` then, before `deadline`:
/// the caller probes and comes back.
///
/// `attempt` must be the whole check: after a wake-up it is simply called again, so
/// spurious wake-ups and `EINTR` are harmless.
pub(crate) fn wait_until<'a, R>(
    sleeper: &mut Sleeper<'a>,
    waits: &'a Waits,
    spin_first: bool,
    deadline: Deadline,
    closes: Option<(&std::sync::atomic::AtomicU32, u32)>,
    mut attempt: impl FnMut() -> Option<R>,
) -> Result<R, TimedOut> {
    if matches!(deadline, Deadline::Now | Deadline::Tick) {
        return attempt().ok_or(TimedOut);
    }
    // A policy that never sleeps spins in every step of the wait.
    if spin_first || waits.policy().never_sleeps() {
        if let Some(outcome) = spin(sleeper, waits, deadline, &mut attempt) {
            return outcome;
        }
    }
    sleep_until(sleeper, deadline, closes, attempt)
}

/// [`wait_until`]'s sleeps, after its spins and yields.
fn sleep_until<R>(
    sleeper: &mut Sleeper<'_>,
    deadline: Deadline,
    closes: Option<(&std::sync::atomic::AtomicU32, u32)>,
    mut attempt: impl FnMut() -> Option<R>,
) -> Result<R, TimedOut> {
    loop {
        let (epoch, bounded) = sleeper.register();
        let found = attempt();
        let left = deadline.remaining();
        if found.is_some() || left == Some(Duration::ZERO) {
            return found.ok_or(TimedOut);
        }
        let left = if bounded {
            Some(left.map_or(DEGRADED_RECHECK, |l| l.min(DEGRADED_RECHECK)))
        } else {
            left
        };
        let slept = sleep(sleeper.word, epoch, left, closes);
        // Woken (or timed out, or spurious, or a close, or a signal): look before sleeping
        // again; a wait whose deadline has passed (a blocked endpoint's liveness tick), that
        // a close ended (its caller probes, then comes back) or, with a deadline, a signal
        // inside `interruptible` ends here, still registered.
        if let Some(r) = attempt() {
            return Ok(r);
        }
        let signalled = slept == Slept::Interrupted && deadline != Deadline::Never;
        if slept == Slept::Closed || signalled || deadline.passed() {
            return Err(TimedOut);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::wait::WaitPolicy;
    use crate::wait::notify;
    use crate::wait::spins::{CLOCK_EVERY, FLOOR, LONG_SLEEP, SHORT_SLEEP};
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// A wait of its own from its start (spins first), with no deadline.
    fn whole_wait(
        word: &WaitWord,
        waits: &Waits,
        attempt: impl FnMut() -> Option<()>,
    ) -> Result<(), TimedOut> {
        wait_until(&mut Sleeper::of(word, waits), waits, true, Deadline::Never, None, attempt)
    }

    #[test]
    fn a_wait_stays_registered_across_its_sleeps_and_is_still_woken() {
        let word = Arc::new(WaitWord::new());
        let flag = Arc::new(AtomicBool::new(false));
        let (w, f) = (word.clone(), flag.clone());
        let (done, finished) = std::sync::mpsc::channel();
        let (first_over, first_is_over) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let waits = Waits::new(WaitPolicy::SLEEP);
            let mut sleeper = Sleeper::of(&w, &waits);
            let check = || f.load(Ordering::Acquire).then_some(());
            // A first chunk that times out (as a liveness tick's does) leaves it registered.
            let first = wait_until(
                &mut sleeper,
                &waits,
                true,
                Deadline::after(Duration::from_millis(5)),
                None,
                check,
            );
            assert_eq!(first, Err(TimedOut));
            assert_eq!(w.sleepers(), 1, "registered between the wait's sleeps");
            first_over.send(()).unwrap();
            // The second sleep has no deadline: only the wake below can end it.
            let second = wait_until(&mut sleeper, &waits, false, Deadline::Never, None, check);
            drop(sleeper);
            done.send((second, w.sleepers())).unwrap();
        });
        // Once the first chunk is over (and the second sleep most likely begun), publish and
        // notify: the registration made before still counts.
        first_is_over.recv_timeout(Duration::from_secs(10)).expect("the first chunk ended");
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::Release);
        notify(&word);
        let (second, sleepers) =
            finished.recv_timeout(Duration::from_secs(10)).expect("the second sleep was woken");
        assert_eq!(second, Ok(()));
        assert_eq!(sleepers, 0, "the wait's end takes it off the count");
    }

    /// A ping-pong of two threads that sleep at once, on words whose waits register with a
    /// fence and whose publishers run `notify_fenced`: a lost wake-up leaves a side asleep
    /// past its deadline. And no wait of either ran the heavy barrier.
    #[test]
    #[cfg_attr(miri, ignore)] // 20,000 sleeps
    fn fenced_sleepers_and_fenced_publishers_never_lose_a_wake_up() {
        use crate::sync::AtomicU64;
        use crate::wait::notify_fenced;
        const ROUNDS: u64 = 20_000;
        let words = Arc::new([WaitWord::new(), WaitWord::new()]);
        let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let side = |me: usize| {
            let (words, counts) = (words.clone(), counts.clone());
            std::thread::spawn(move || {
                let waits = Waits::new(WaitPolicy::SLEEP).registering(Registration::Fenced);
                let heavy = super::super::heavy_barriers();
                for round in 0..ROUNDS {
                    // Side 0 waits for side 1's count to reach `round`, and the other way.
                    let want = round + u64::from(me == 0);
                    let seen = || (counts[1 - me].load(Ordering::Acquire) >= want).then_some(());
                    let deadline = Deadline::after(Duration::from_secs(10));
                    let mut sleeper = Sleeper::of(&words[me], &waits);
                    let got = wait_until(&mut sleeper, &waits, true, deadline, None, seen);
                    assert_eq!(got, Ok(()), "side {me} left asleep at round {round}");
                    drop(sleeper);
                    counts[me].store(round + 1, Ordering::Release);
                    notify_fenced(&words[1 - me]);
                }
                assert_eq!(super::super::heavy_barriers(), heavy, "no heavy barrier ran");
            })
        };
        let (a, b) = (side(0), side(1));
        a.join().unwrap();
        b.join().unwrap();
        assert!(words.iter().all(|w| w.sleepers() == 0));
    }

    #[test]
    fn a_wait_that_spun_in_vain_tells_its_endpoint_how_long_it_slept_when_it_ends() {
        let (word, waits) = (WaitWord::new(), Waits::default());
        let full = WaitPolicy::default().spins();
        let long = SHORT_SLEEP.max(waits.spins_take(full)) * 2;
        let mut sleeper = Sleeper::of(&word, &waits);
        let start = std::time::Instant::now();
        let r: Result<(), _> =
            wait_until(&mut sleeper, &waits, true, Deadline::after(long), None, || None);
        assert_eq!(r, Err(TimedOut));
        // A later step of the same wait (a liveness chunk) neither spins nor learns apart.
        let r: Result<(), _> =
            wait_until(&mut sleeper, &waits, false, Deadline::after(long), None, || None);
        assert_eq!(r, Err(TimedOut));
        assert_eq!(waits.now().spins(), full, "told at the wait's end, not before");
        drop(sleeper);
        // Two sleeps of `long`; a VM's late timer wake-ups can make them a long sleep.
        let cut = if start.elapsed() > LONG_SLEEP.max(waits.spins_take(full) * 10) {
            vec![full / 4, FLOOR]
        } else {
            vec![full / 4]
        };
        let now = waits.now().spins();
        assert!(cut.contains(&now), "a wait that slept {long:?} twice and more: {now} spins");
        // One answered at once (within the spins) changes nothing.
        assert_eq!(whole_wait(&word, &waits, || Some(())), Ok(()));
        assert_eq!(waits.now().spins(), now);
    }

    #[test]
    #[cfg_attr(miri, ignore)] // a long sleep is judged against timed `pause`s (Miri's clock)
    fn a_wait_answered_while_yielding_earns_the_spins_back() {
        let (word, waits) = (WaitWord::new(), Waits::default());
        waits.slept(Duration::from_secs(1));
        assert_eq!(waits.now().spins(), FLOOR);
        // Tried before each of the 64 spins and once after them: answered at the 2nd yield.
        let mut tries = 0;
        let r = whole_wait(&word, &waits, || {
            tries += 1;
            (tries == FLOOR + 3).then_some(())
        });
        assert_eq!(r, Ok(()));
        assert_eq!(waits.now().spins(), WaitPolicy::default().spins());
    }

    #[test]
    fn the_default_policy_spins_within_its_limit_and_a_never_sleeping_one_ignores_it() {
        assert_eq!(WaitPolicy::default().spin_limit(), Some(crate::wait::DEFAULT_SPIN_LIMIT));
        // What a slept wait is judged against: the limit itself, whatever a `pause` takes
        // here (none is timed for it).
        let waits = Waits::default();
        assert_eq!(waits.spins_take(u32::MAX - 1), crate::wait::DEFAULT_SPIN_LIMIT);
        assert_eq!(waits.spins_take(1), crate::wait::DEFAULT_SPIN_LIMIT);
        // A policy that never sleeps spins until its deadline, whatever its limit.
        let busy =
            Waits::new(WaitPolicy::spin_then_sleep(u32::MAX, 0).spinning_at_most(Duration::ZERO));
        let word = WaitWord::new();
        let mut sleeper = Sleeper::of(&word, &busy);
        let mut tries = 0u32;
        let r: Option<Result<(), _>> =
            spin(&mut sleeper, &busy, Deadline::after(Duration::from_millis(5)), &mut || {
                tries += 1;
                None
            });
        assert_eq!(r, Some(Err(TimedOut)));
        assert!(tries > CLOCK_EVERY + 1, "{tries} tries");
    }
}
