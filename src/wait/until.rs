//! The wait loop ([`wait_until`]): spinning as an endpoint's recent waits earned, then
//! sleeping as a registered [`Sleeper`].
//!
//! **Spins earned.** A [`WaitPolicy`]'s spins answer a peer that is about to publish (a few
//! µs away) without a futex wake-up; for a peer that publishes much later they are CPU
//! burnt in vain, once per wait: on a Xeon of 2026 a `pause` costs some 40 cycles, and the
//! default 2,048 spins with their checks take 30–140 µs. An endpoint therefore keeps, beside
//! its policy, the spins its waits have *earned* ([`Waits`]):
//!
//! - a wait that went to sleep and was woken within [`SHORT_SLEEP`], or within the time
//!   the policy's spins take where that is longer (spinning longer would have caught it),
//!   earns the policy's spins back, all of them;
//! - one that slept longer (spinning longer would not have helped) spins a quarter as much
//!   next time, down to [`FLOOR`]; one that slept more than [`LONG_SLEEP`], and ten times
//!   what the policy's spins take, spins only [`FLOOR`] times next time (its peer publishes
//!   a step a millisecond or less often: no spinning it can afford would catch that);
//! - one answered while yielding, just after its spins ran out, earns them all back too;
//! - one answered while spinning changes nothing.
//!
//! So a stream whose messages come close together spins as the policy says (its waits never
//! sleep, or sleep briefly), and an endpoint left idle, or fed a step every millisecond,
//! stops spinning in vain after a few waits. Only a wait's first step spins (its later
//! liveness chunks sleep at once, as before), and a policy that never sleeps is never cut.
//! The budget is this endpoint's own (a process-local atomic, not in shared memory): any
//! value is safe, it only moves CPU time and wake-up latency.
//!
//! **One registration a wait.** A wait registers as a sleeper (with the heavy barrier, or
//! a fence where every publisher of its word fences: [`Registration`]) at its first sleep
//! and stays registered until it ends ([`Sleeper`]).

use std::sync::atomic::{AtomicU32 as LocalU32, Ordering as LocalOrdering};
use std::time::Duration;

use super::{DEGRADED_RECHECK, Deadline, TimedOut, WaitPolicy, WaitWord, sleep};
use crate::sync::Ordering;

/// A sleep shorter than this means the wait would have been answered by spinning longer
/// (or than the policy's spins take, where that is longer: [`spins_take`]).
pub(crate) const SHORT_SLEEP: Duration = Duration::from_micros(100);

/// A sleep longer than this (and than ten times what the policy's spins take) cuts the
/// next wait's spins to [`FLOOR`] at once.
pub(crate) const LONG_SLEEP: Duration = Duration::from_millis(1);

/// About how long `spins` spins take on this machine: the time of one `pause`, measured
/// once a process (over 1,024 of them, some 15–40 µs, at the first sleep that asks), times
/// `spins`. A lower bound (a spin also runs its check).
fn spins_take(spins: u32) -> Duration {
    static PAUSE_PS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let pause_ps = *PAUSE_PS.get_or_init(|| {
        let start = std::time::Instant::now();
        for _ in 0..1024 {
            std::hint::spin_loop();
        }
        (start.elapsed().as_nanos() as u64).saturating_mul(1000) / 1024
    });
    Duration::from_nanos(pause_ps.saturating_mul(u64::from(spins)) / 1000)
}

/// The fewest spins a policy's waits are cut to (about 1–3 µs).
pub(crate) const FLOOR: u32 = 64;

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

/// An endpoint's wait policy, the spins its recent waits earned (module docs), and how its
/// waits register as sleepers.
#[derive(Debug)]
pub(crate) struct Waits {
    policy: WaitPolicy,
    registration: Registration,
    /// How many times the policy's spins were cut by 4 since a wait last earned them all
    /// back: kept when the policy is set (a Python receive sets `SLEEP` for its later
    /// slices, then its policy again), so what the waits learnt outlives such a switch.
    cuts: LocalU32,
}

/// The most cuts counted (2,048 spins reach the floor after 3).
const MAX_CUTS: u32 = 15;

impl Clone for Waits {
    fn clone(&self) -> Self {
        Self::new(self.policy).registering(self.registration)
    }
}

impl Default for Waits {
    fn default() -> Self {
        Self::new(WaitPolicy::default())
    }
}

impl Waits {
    /// `policy`, with all its spins earned.
    pub(crate) const fn new(policy: WaitPolicy) -> Self {
        Self { policy, registration: Registration::Barrier, cuts: LocalU32::new(0) }
    }

    /// These waits, registering as `registration` says.
    pub(crate) const fn registering(mut self, registration: Registration) -> Self {
        self.registration = registration;
        self
    }

    /// The policy as set.
    pub(crate) const fn policy(&self) -> WaitPolicy {
        self.policy
    }

    /// Sets the policy; the cuts the waits earned stay.
    pub(crate) fn set(&mut self, policy: WaitPolicy) {
        self.policy = policy;
    }

    /// Whether the policy's spins are never cut (it never sleeps, or spins no more than
    /// the floor): its waits have nothing to learn.
    const fn fixed(&self) -> bool {
        self.policy.never_sleeps() || self.policy.spins <= FLOOR
    }

    /// The policy the next wait's first step runs under: the spins earned.
    pub(crate) fn now(&self) -> WaitPolicy {
        let policy = self.policy;
        if self.fixed() {
            return policy;
        }
        // Relaxed: a hint of this endpoint's own; any value is safe.
        let cuts = self.cuts.load(LocalOrdering::Relaxed).min(MAX_CUTS);
        WaitPolicy { spins: (policy.spins >> (2 * cuts)).max(FLOOR), yields: policy.yields }
    }

    /// A wait that spun as [`now`](Self::now) said in vain, then slept for `slept`.
    pub(crate) fn slept(&self, slept: Duration) {
        if self.fixed() {
            return;
        }
        let full = self.policy.spins;
        // Relaxed: as in `now`; two threads sharing an endpoint may lose one's update.
        let cuts = self.cuts.load(LocalOrdering::Relaxed).min(MAX_CUTS);
        let take = spins_take(full);
        let next = if slept < SHORT_SLEEP || slept < take {
            0
        } else if slept > LONG_SLEEP && slept > take * 10 {
            MAX_CUTS
        } else {
            (cuts + 1).min(MAX_CUTS)
        };
        if next != cuts {
            self.cuts.store(next, LocalOrdering::Relaxed);
        }
    }
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
        Self { word, registration: waits.registration, bounded: None, learn: None }
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
    let spun =
        spin_only(now.spins, || attempt().map(Ok), || deadline.passed().then_some(Err(TimedOut)));
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

/// The spinning and yielding steps of a wait, as `policy` says, spinning at least
/// `min_spins` times: `attempt` is called before each spin and after each yield, and
/// `now_and_then` once every 1024 spins (what a policy that never sleeps must still check).
/// Returns what either returned first, or `None` once both steps are spent.
#[inline]
pub(crate) fn spin_then_yield<R>(
    policy: WaitPolicy,
    min_spins: u32,
    mut attempt: impl FnMut() -> Option<R>,
    now_and_then: impl FnMut() -> Option<R>,
) -> Option<R> {
    spin_only(policy.spins.max(min_spins), &mut attempt, now_and_then)
        .or_else(|| yield_then_try(policy.yields, attempt))
}

/// The spinning step: `attempt` before each of `spins` spins and once after them,
/// `now_and_then` once every 1024 spins.
#[inline]
fn spin_only<R>(
    spins: u32,
    mut attempt: impl FnMut() -> Option<R>,
    mut now_and_then: impl FnMut() -> Option<R>,
) -> Option<R> {
    let mut spun = 0u32;
    loop {
        if let Some(r) = attempt() {
            return Some(r);
        }
        if spun >= spins {
            return None;
        }
        spun += 1;
        std::hint::spin_loop();
        if spun % 1024 == 0 {
            if let Some(r) = now_and_then() {
                return Some(r);
            }
        }
    }
}

/// The yielding step: `attempt` after each of `yields` `sched_yield`s.
fn yield_then_try<R>(yields: u32, mut attempt: impl FnMut() -> Option<R>) -> Option<R> {
    (0..yields).find_map(|_| {
        std::thread::yield_now();
        attempt()
    })
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
        let closed = sleep(sleeper.word, epoch, left, closes);
        // Woken (or timed out, or spurious, or a close): look before sleeping again; a wait
        // whose deadline has passed (a blocked endpoint's liveness tick) or that a close
        // ended (its caller probes, then comes back) ends here, still registered.
        if let Some(r) = attempt() {
            return Ok(r);
        }
        if closed || deadline.passed() {
            return Err(TimedOut);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::wait::notify;
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
    fn long_sleeps_cut_the_spins_to_the_floor_and_a_short_one_earns_them_back() {
        let waits = Waits::default();
        let full = WaitPolicy::default().spins();
        // Longer than both what counts as short and what the full spins take here.
        let long = SHORT_SLEEP.max(spins_take(full)) * 2;
        assert_eq!(waits.now().spins(), full);
        waits.slept(long);
        assert_eq!(waits.now().spins(), full / 4);
        for _ in 0..10 {
            waits.slept(long * 1000);
        }
        assert_eq!(waits.now().spins(), FLOOR);
        assert_eq!(waits.now().yields(), WaitPolicy::default().yields(), "yields are kept");
        waits.slept(SHORT_SLEEP / 5);
        assert_eq!(waits.now().spins(), full);
        // A sleep of more than a millisecond (and ten times the spins): the floor at once.
        waits.slept(LONG_SLEEP.max(spins_take(full) * 10) * 2);
        assert_eq!(waits.now().spins(), FLOOR);
    }

    #[test]
    fn a_wait_that_spun_in_vain_tells_its_endpoint_how_long_it_slept_when_it_ends() {
        let (word, waits) = (WaitWord::new(), Waits::default());
        let full = WaitPolicy::default().spins();
        let long = SHORT_SLEEP.max(spins_take(full)) * 2;
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
        let cut = if start.elapsed() > LONG_SLEEP.max(spins_take(full) * 10) {
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
    #[cfg_attr(miri, ignore)] // times `pause`: Miri's clock is not the CPU's
    fn a_long_spinning_policy_earns_its_spins_back_within_the_time_they_take() {
        let spins = 100_000;
        let waits = Waits::new(WaitPolicy::spin_then_sleep(spins, 8));
        let take = spins_take(spins);
        assert!(take > Duration::from_micros(100), "100,000 pauses take {take:?}");
        waits.slept(take * 4);
        assert_eq!(waits.now().spins(), spins / 4);
        // A wait answered after a sleep shorter than the full spins would have taken.
        waits.slept(take / 2);
        assert_eq!(waits.now().spins(), spins);
    }

    #[test]
    fn policies_that_never_sleep_or_barely_spin_are_never_cut() {
        let busy = Waits::new(WaitPolicy::spin_then_sleep(u32::MAX, 0));
        busy.slept(Duration::from_secs(100));
        assert!(busy.now().never_sleeps());
        let few = Waits::new(WaitPolicy::spin_then_sleep(10, 2));
        few.slept(Duration::from_secs(1));
        assert_eq!(few.now(), WaitPolicy::spin_then_sleep(10, 2));
        let mut set = Waits::default();
        set.slept(SHORT_SLEEP.max(spins_take(WaitPolicy::default().spins())) * 2);
        set.set(WaitPolicy::SLEEP);
        assert_eq!(set.now(), WaitPolicy::SLEEP);
        assert_eq!(set.policy(), WaitPolicy::SLEEP);
        // As a Python receive's later slices do: the cut outlives the switch and back.
        set.set(WaitPolicy::default());
        assert_eq!(set.now().spins(), WaitPolicy::default().spins() / 4);
    }
}
