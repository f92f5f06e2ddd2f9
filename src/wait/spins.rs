//! The spinning step of a wait, and the spins an endpoint's waits have earned ([`Waits`]).
//!
//! **Spins earned.** A [`WaitPolicy`]'s spins answer a peer that is about to publish (a few
//! µs away) without a futex wake-up; for a peer that publishes much later they are CPU
//! burnt in vain, once per wait: on a Xeon of 2026 a `pause` costs some 40 cycles, and the
//! default 2,048 spins with their checks would take 30–140 µs, were they not bounded by
//! [`DEFAULT_SPIN_LIMIT`](super::DEFAULT_SPIN_LIMIT). An endpoint therefore keeps, beside
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

use std::sync::atomic::{AtomicU32 as LocalU32, Ordering as LocalOrdering};
use std::time::Duration;

use super::WaitPolicy;
use super::until::Registration;

/// A sleep shorter than this means the wait would have been answered by spinning longer
/// (or than the policy's spins take, where that is longer: [`spins_take`]).
pub(crate) const SHORT_SLEEP: Duration = Duration::from_micros(100);

/// A sleep longer than this (and than ten times what the policy's spins take) cuts the
/// next wait's spins to [`FLOOR`] at once.
pub(crate) const LONG_SLEEP: Duration = Duration::from_millis(1);

/// About how long `spins` spins take on this machine: the time of one `pause`, measured
/// once a process (over 1,024 of them, 15–70 µs of CPU, at the first sleep that asks),
/// times `spins`. A lower bound (a spin also runs its check).
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

    /// How its waits register as sleepers.
    pub(super) const fn registration(&self) -> Registration {
        self.registration
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
    pub(super) const fn fixed(&self) -> bool {
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
        WaitPolicy { spins: (policy.spins >> (2 * cuts)).max(FLOOR), ..policy }
    }

    /// About how long `spins` of the policy's spins take: [`spins_take`], or its limit
    /// where that is shorter. A limit within [`SHORT_SLEEP`] (the default's) is taken as
    /// is, and no `pause` is timed: [`slept`](Self::slept) judges every take up to
    /// `SHORT_SLEEP` alike (a sleep is short below `SHORT_SLEEP`, long above `LONG_SLEEP`,
    /// ten times that), and the timing costs a process 15–70 µs of CPU at its first sleep.
    pub(super) fn spins_take(&self, spins: u32) -> Duration {
        match self.policy.spin_limit {
            Some(limit) if limit <= SHORT_SLEEP => limit,
            Some(limit) => spins_take(spins).min(limit),
            None => spins_take(spins),
        }
    }

    /// A wait that spun as [`now`](Self::now) said in vain, then slept for `slept`.
    pub(crate) fn slept(&self, slept: Duration) {
        if self.fixed() {
            return;
        }
        let full = self.policy.spins;
        // Relaxed: as in `now`; two threads sharing an endpoint may lose one's update.
        let cuts = self.cuts.load(LocalOrdering::Relaxed).min(MAX_CUTS);
        let take = self.spins_take(full);
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
    spin_only(policy.spins.max(min_spins), None, &mut attempt, now_and_then)
        .or_else(|| yield_then_try(policy.yields, attempt))
}

/// How often a spin with a time limit reads the clock (and when first: a wait answered
/// within these spins, some 1–10 µs, never reads it).
pub(super) const CLOCK_EVERY: u32 = 128;

/// The spinning step: `attempt` before each of `spins` spins and once after them,
/// `now_and_then` once every 1024 spins; with `limit`, the step also ends once the spins
/// have taken that long (timed from the first [`CLOCK_EVERY`] spins on, which the limit
/// then counts as taken at no time: it is a bound of a few µs rather than an exact one).
#[inline]
pub(super) fn spin_only<R>(
    spins: u32,
    limit: Option<Duration>,
    mut attempt: impl FnMut() -> Option<R>,
    mut now_and_then: impl FnMut() -> Option<R>,
) -> Option<R> {
    let mut spun = 0u32;
    let mut since: Option<std::time::Instant> = None;
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
        if let Some(limit) = limit {
            if spun % CLOCK_EVERY == 0 {
                let since = *since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= limit {
                    return attempt();
                }
            }
        }
    }
}

/// The yielding step: `attempt` after each of `yields` `sched_yield`s.
pub(super) fn yield_then_try<R>(yields: u32, mut attempt: impl FnMut() -> Option<R>) -> Option<R> {
    (0..yields).find_map(|_| {
        std::thread::yield_now();
        attempt()
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn long_sleeps_cut_the_spins_to_the_floor_and_a_short_one_earns_them_back() {
        let waits = Waits::default();
        let full = WaitPolicy::default().spins();
        // Longer than both what counts as short and what the full spins take here.
        let long = SHORT_SLEEP.max(waits.spins_take(full)) * 2;
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
        waits.slept(LONG_SLEEP.max(waits.spins_take(full) * 10) * 2);
        assert_eq!(waits.now().spins(), FLOOR);
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
        set.slept(SHORT_SLEEP.max(set.spins_take(WaitPolicy::default().spins())) * 2);
        set.set(WaitPolicy::SLEEP);
        assert_eq!(set.now(), WaitPolicy::SLEEP);
        assert_eq!(set.policy(), WaitPolicy::SLEEP);
        // As a Python receive's later slices do: the cut outlives the switch and back.
        set.set(WaitPolicy::default());
        assert_eq!(set.now().spins(), WaitPolicy::default().spins() / 4);
    }

    #[test]
    fn a_spin_limit_ends_the_spins_before_their_count() {
        // No limit: an attempt before each of the 1,000 spins and one after them.
        let mut tries = 0u32;
        let r: Option<()> = spin_only(
            1000,
            None,
            || {
                tries += 1;
                None
            },
            || None,
        );
        assert_eq!((r, tries), (None, 1001));
        // A limit of nothing: the first clock reading, after 128 spins, ends them.
        let mut tries = 0u32;
        let r: Option<()> = spin_only(
            1000,
            Some(Duration::ZERO),
            || {
                tries += 1;
                None
            },
            || None,
        );
        assert_eq!((r, tries), (None, CLOCK_EVERY + 1));
        // Spins that would take minutes end within their limit (the test returns at all).
        let mut tries = 0u64;
        let r: Option<()> = spin_only(
            u32::MAX - 1,
            Some(Duration::from_millis(1)),
            || {
                tries += 1;
                None
            },
            || None,
        );
        assert_eq!(r, None);
        assert!(tries < u64::from(u32::MAX - 1), "{tries} tries");
    }
}
