//! Blocking: spin, then yield, then sleep on a *shared* futex.
//!
//! A [`WaitWord`] sits in shared memory beside each ring, one for "not empty" (consumers
//! sleep on it) and one for "not full" (producers sleep on it). The protocol keeps the fast
//! path free of syscalls *and* of store-load fences: a side that made progress calls
//! `notify`, which costs a compiler fence and one load, and enters the kernel only when
//! somebody registered as a sleeper.
//!
//! No lost wake-up, by a Dekker-style handshake whose expensive half is on the sleeper:
//!
//! - sleeper: `sleepers += 1`; **heavy barrier**; read `epoch`; re-check the ring;
//!   futex-wait on `epoch` (returns at once if it moved).
//! - waker: publish (store tail/head); **light barrier**; if `sleepers > 0`: `epoch += 1`;
//!   futex-wake all.
//!
//! Each side's store must be ordered before its load of the other's word. With
//! `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` available (Linux ≥ 4.16, and every process
//! that may publish registered for it), the heavy barrier is that syscall and the light one
//! a compiler fence: the syscall runs a full barrier on every CPU currently running a
//! registered process, so a waker either had its publication made visible before the
//! sleeper's re-check, or performs its load of `sleepers` after the barrier and sees the
//! sleeper. Going to sleep costs a few µs more; every publish saves an `mfence`, which on x86
//! waits for all pending stores (the ring cell's cache lines) to complete.
//!
//! Where `membarrier` is refused (old kernel, a seccomp filter), this process falls back to
//! `SeqCst` fences on both sides, and its sleepers re-check at least every
//! [`DEGRADED_RECHECK`], so that a waker in another process that relies on `membarrier`
//! cannot leave them asleep for longer than that. [`barrier_mode`] says which is in use;
//! `GPURING_BARRIER=symmetric` in the environment forces the fallback.
//!
//! The futex is shared (never `FUTEX_PRIVATE_FLAG`): the word lives in a `MAP_SHARED`
//! mapping that other processes map at other addresses.
//!
//! Every blocking call of the crate is written against one [`Deadline`] (at once, never,
//! or an instant), and its public forms (`x`, `x_timeout`, `x_deadline`) are made from that
//! one entry point by the `blocking!` macro (`forms.rs`), so that they mean the same on
//! every type.
//!
//! This module knows nothing about rings: it takes a closure that tries the operation.

use std::time::Duration;

use crate::sync::{AtomicU32, Ordering, fence};

mod forms;
#[cfg(not(loom))]
pub(crate) mod interrupt;
#[cfg(not(loom))]
pub mod reactor;
pub(crate) mod spins;
pub(crate) mod until;

pub(crate) use forms::{Deadline, TimedOut, blocking, receive_iter};
#[cfg(not(loom))]
pub use interrupt::interruptible;
pub(crate) use spins::Waits;
pub(crate) use until::{Registration, Sleeper, wait_until};

/// How often a sleeper re-checks when this process cannot use `membarrier`.
pub const DEGRADED_RECHECK: Duration = Duration::from_millis(1);

/// A futex word and a count of sleepers. `repr(C)`, lives in shared memory.
#[repr(C)]
#[derive(Debug, Default)]
pub struct WaitWord {
    /// Bumped by every wake; sleepers futex-wait on it.
    epoch: AtomicU32,
    /// How many threads (in any process) are between registering and leaving a sleep.
    sleepers: AtomicU32,
}

impl WaitWord {
    /// A word with no sleepers.
    pub fn new() -> Self {
        Self { epoch: AtomicU32::new(0), sleepers: AtomicU32::new(0) }
    }

    /// The sleeper's half of the handshake, up to the re-check: registers as a sleeper,
    /// runs the heavy barrier, and returns the epoch to sleep on and whether the sleep must
    /// be bounded by [`DEGRADED_RECHECK`]. The caller re-checks, then sleeps (or parks) on
    /// that epoch, and calls [`unregister`](Self::unregister) once it stops sleeping.
    fn register(&self) -> (u32, bool) {
        // SeqCst: the registration is ordered before the caller's re-check by the heavy
        // barrier. Partner: `light_barrier` in `notify`.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let bounded = heavy_barrier();
        // Acquire: pairs with the Release bump in `wake_all`.
        (self.epoch.load(Ordering::Acquire), bounded)
    }

    /// [`register`](Self::register) for a word whose every publisher runs a full fence
    /// before its load of `sleepers` ([`notify_fenced`]): `sleepers += 1` and a `SeqCst`
    /// fence, no heavy barrier, and the sleep is never bounded. Of the two stores, each side
    /// then loads the other's word after a `SeqCst` fence, so one of them sees the other's.
    fn register_light(&self) -> u32 {
        // SeqCst, and the fence: the registration before the caller's re-check. Partner: the
        // SeqCst fence in `notify_fenced`.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // Acquire: pairs with the Release bump in `wake_all`.
        self.epoch.load(Ordering::Acquire)
    }

    /// [`register`](Self::register) on several words at once, with one heavy barrier:
    /// every word's `sleepers += 1`, the barrier, then the epochs (into `epochs`, in
    /// order). Returns whether the sleep must be bounded by [`DEGRADED_RECHECK`]. The caller
    /// re-checks every word's operation, then sleeps on all of them, and unregisters each.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn register_all<'a>(
        words: impl Iterator<Item = &'a WaitWord> + Clone,
        epochs: &mut Vec<u32>,
    ) -> bool {
        for w in words.clone() {
            // SeqCst: as in `register`; the one barrier below orders all of them before
            // the caller's re-checks. Partner: `light_barrier` in `notify`.
            w.sleepers.fetch_add(1, Ordering::SeqCst);
        }
        let bounded = heavy_barrier();
        epochs.clear();
        // Acquire: pairs with the Release bump in `wake_all`.
        epochs.extend(words.map(|w| w.epoch.load(Ordering::Acquire)));
        bounded
    }

    /// Takes a sleeper registered by [`register`](Self::register) off the count.
    fn unregister(&self) {
        // Relaxed: the count is only a hint to wakers, and a stale non-zero costs them one
        // needless wake syscall, never a lost wake-up.
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
    }

    /// How many threads are registered as sleeping right now (a diagnostic: the value can
    /// change at once, and is untrusted when the word is in shared memory).
    pub fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::Relaxed)
    }
}

/// How long a blocking call spins and yields before it sleeps in the kernel.
///
/// Spinning answers fastest (≈ the cross-core cache latency) but burns a core; sleeping
/// costs a futex wake-up (a few µs to tens of µs in a VM) but frees it. The default spins
/// 2,048 times or for [`DEFAULT_SPIN_LIMIT`] (30 µs), whichever ends first, yields 8 times,
/// then sleeps: a `pause` takes 10–70 ns on current x86 CPUs, so a count alone spins 30 µs
/// on one machine and 140 µs on another, and spinning longer than a sleep and a wake-up
/// cost (30–60 µs of CPU in the VMs we measure on) cannot save CPU.
///
/// An endpoint spins as its policy says while its waits are answered soon; one whose waits
/// keep ending in sleeps longer than 100 µs spins a quarter as much each time, down to 64
/// spins, and earns them all back at its first wait answered within a shorter sleep. An
/// idle endpoint, or one fed a message every millisecond, thus stops burning CPU in vain; a
/// policy that never sleeps is never cut.
///
/// ```
/// use std::time::Duration;
/// use gpuring::WaitPolicy;
/// let busy = WaitPolicy::spin_then_sleep(u32::MAX, 0); // never sleeps
/// let frugal = WaitPolicy::SLEEP;                        // sleeps at the first miss
/// assert_ne!(busy, frugal);
/// // 10,000 spins, but no more than 200 µs of them, then 4 yields, then sleep.
/// let patient = WaitPolicy::spin_then_sleep(10_000, 4).spinning_at_most(Duration::from_micros(200));
/// assert_eq!(patient.spin_limit(), Some(Duration::from_micros(200)));
/// assert_eq!(WaitPolicy::default().spin_limit(), Some(gpuring::DEFAULT_SPIN_LIMIT));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    spins: u32,
    yields: u32,
    /// The longest the spins may take (`None`: as long as `spins` of them take).
    spin_limit: Option<Duration>,
}

/// The default policy's limit on the time a wait spins: about what going to sleep and
/// being woken cost the sleeper in CPU on the VMs we measure on, so that spinning in vain
/// never costs more than the sleep it tried to avoid.
pub const DEFAULT_SPIN_LIMIT: Duration = Duration::from_micros(30);

impl WaitPolicy {
    /// Sleep on the futex as soon as the operation cannot proceed.
    pub const SLEEP: Self = Self { spins: 0, yields: 0, spin_limit: None };

    /// Try `spins` times with a CPU pause in between, then `yields` times with a
    /// `sched_yield` in between, then sleep. `u32::MAX` spins means never sleep (the
    /// deadline is still honoured). No limit on the time the spins take: see
    /// [`spinning_at_most`](Self::spinning_at_most).
    pub const fn spin_then_sleep(spins: u32, yields: u32) -> Self {
        Self { spins, yields, spin_limit: None }
    }

    /// This policy, its spins stopped once they have taken `limit` (whichever of the count
    /// and the time ends first; the clock is read every 128 spins, so a wait answered
    /// within them never reads it). Ignored by a policy that never sleeps, and by a
    /// receive's wait for a host ready flag (which spins 4,096 times or the policy's count,
    /// whichever is more).
    pub const fn spinning_at_most(mut self, limit: Duration) -> Self {
        self.spin_limit = Some(limit);
        self
    }

    /// Tries with a CPU pause in between before yielding.
    pub const fn spins(&self) -> u32 {
        self.spins
    }

    /// Tries with a `sched_yield` in between before sleeping.
    pub const fn yields(&self) -> u32 {
        self.yields
    }

    /// The longest a wait's spins may take, if limited.
    pub const fn spin_limit(&self) -> Option<Duration> {
        self.spin_limit
    }

    /// Whether a wait under this policy never sleeps (`u32::MAX` spins).
    ///
    /// ```
    /// use gpuring::WaitPolicy;
    /// assert!(WaitPolicy::spin_then_sleep(u32::MAX, 0).never_sleeps());
    /// assert!(!WaitPolicy::default().never_sleeps());
    /// ```
    pub const fn never_sleeps(&self) -> bool {
        self.spins == u32::MAX
    }
}

impl Default for WaitPolicy {
    /// 2,048 spins or 30 µs of them ([`DEFAULT_SPIN_LIMIT`]), 8 yields, then sleep.
    fn default() -> Self {
        Self::spin_then_sleep(2048, 8).spinning_at_most(DEFAULT_SPIN_LIMIT)
    }
}

/// Counts of futex syscalls this process made (all rings together).
///
/// Used by tests to prove that a consumer really slept and that a busy ring makes no
/// syscall when nobody sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitStats {
    /// `FUTEX_WAIT` calls made.
    pub futex_waits: u64,
    /// `FUTEX_WAKE` calls made.
    pub futex_wakes: u64,
}

static FUTEX_WAITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static FUTEX_WAKES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The futex syscalls this process has made so far.
///
/// ```
/// let before = gpuring::internal::wait_stats();
/// // ... ring traffic with nobody asleep ...
/// assert_eq!(gpuring::internal::wait_stats().futex_wakes, before.futex_wakes);
/// ```
pub fn wait_stats() -> WaitStats {
    WaitStats {
        futex_waits: FUTEX_WAITS.load(std::sync::atomic::Ordering::Relaxed),
        futex_wakes: FUTEX_WAKES.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// How the two halves of the wake-up handshake are ordered in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierMode {
    /// Publishers use a compiler fence; sleepers call `membarrier(GLOBAL_EXPEDITED)`.
    Asymmetric,
    /// `membarrier` is not available: `SeqCst` fences on both sides, and sleepers re-check
    /// every millisecond (`DEGRADED_RECHECK`).
    Symmetric,
}

const MODE_UNKNOWN: u8 = 0;
const MODE_ASYMMETRIC: u8 = 1;
const MODE_SYMMETRIC: u8 = 2;
static MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(MODE_UNKNOWN);

/// The barrier mode of this process, registering for `membarrier` on first use.
///
/// Endpoints call this when they are made, so the registration syscall happens at setup,
/// never on the hot path.
pub fn barrier_mode() -> BarrierMode {
    // Relaxed: the mode is decided once; a racing first caller decides the same way.
    match MODE.load(std::sync::atomic::Ordering::Relaxed) {
        MODE_ASYMMETRIC => BarrierMode::Asymmetric,
        MODE_SYMMETRIC => BarrierMode::Symmetric,
        _ => decide_mode(),
    }
}

/// Environment variable that forces the symmetric mode when set to `symmetric` (e.g. in a
/// VM where the inter-processor interrupts of `membarrier` are costly).
pub const BARRIER_ENV: &str = "GPURING_BARRIER";

#[cold]
fn decide_mode() -> BarrierMode {
    let forced = std::env::var(BARRIER_ENV).is_ok_and(|v| v == "symmetric");
    let mode = if !forced && register_membarrier() { MODE_ASYMMETRIC } else { MODE_SYMMETRIC };
    // Relaxed: see `barrier_mode`.
    MODE.store(mode, std::sync::atomic::Ordering::Relaxed);
    if mode == MODE_ASYMMETRIC { BarrierMode::Asymmetric } else { BarrierMode::Symmetric }
}

#[cfg(all(not(loom), not(miri)))]
fn register_membarrier() -> bool {
    use rustix::thread::{MembarrierCommand, membarrier, membarrier_query};
    let q = membarrier_query();
    q.contains_command(MembarrierCommand::GlobalExpedited)
        && q.contains_command(MembarrierCommand::RegisterGlobalExpedited)
        && membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok()
}

#[cfg(any(loom, miri))]
fn register_membarrier() -> bool {
    false // loom models the symmetric fences; Miri has no membarrier
}

/// The publisher's half: orders the caller's publishing store before its load of
/// `sleepers`. Partner: `heavy_barrier` in `wait_until`.
#[inline(always)]
fn light_barrier() {
    if MODE.load(std::sync::atomic::Ordering::Relaxed) == MODE_ASYMMETRIC {
        // The sleeper's membarrier orders the CPU side; this stops the compiler from moving
        // the load of `sleepers` above the publishing store.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        // Partner: the SeqCst fence in `heavy_barrier`.
        fence(Ordering::SeqCst);
    }
}

/// The sleeper's half: orders `sleepers += 1` before the re-check of the ring. Returns
/// whether the sleep must be bounded by [`DEGRADED_RECHECK`].
#[cold]
fn heavy_barrier() -> bool {
    #[cfg(all(test, not(loom)))]
    HEAVY_BARRIERS.with(|n| n.set(n.get() + 1));
    // Partner: the fence in `light_barrier` (symmetric mode), and this process's own side
    // of the membarrier below.
    fence(Ordering::SeqCst);
    #[cfg(all(not(loom), not(miri)))]
    if barrier_mode() == BarrierMode::Asymmetric {
        use rustix::thread::{MembarrierCommand, membarrier};
        if membarrier(MembarrierCommand::GlobalExpedited).is_ok() {
            return false;
        }
    }
    true
}

#[cfg(all(test, not(loom)))]
thread_local! {
    /// Heavy barriers this thread ran (tests only).
    static HEAVY_BARRIERS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many heavy barriers this thread has run (tests only).
#[cfg(all(test, not(loom)))]
fn heavy_barriers() -> u64 {
    HEAVY_BARRIERS.with(std::cell::Cell::get)
}

/// Wakes every sleeper on `word` if there is one; otherwise a barrier and a load, no
/// syscall.
///
/// Call it after publishing the change the sleepers wait for.
#[inline]
pub(crate) fn notify(word: &WaitWord) {
    light_barrier();
    if word.sleepers.load(Ordering::Relaxed) != 0 {
        wake_all(word);
    }
}

/// [`notify`] with a full fence between the publication and the load of `sleepers`, for the
/// words whose sleepers register without the heavy barrier (a broadcast ring's `not_empty`:
/// its sleepers are the idle receivers a fan-out keeps, each of whose `membarrier`s
/// interrupts every CPU running a registered process). Also the form for a departure, a
/// rare path that may publish on such a word.
#[inline]
pub(crate) fn notify_fenced(word: &WaitWord) {
    // SeqCst: the caller's publication before the load of `sleepers`. Partner: the fence in
    // `WaitWord::register_light` (and, in the symmetric mode, in `heavy_barrier`).
    fence(Ordering::SeqCst);
    if word.sleepers.load(Ordering::Relaxed) != 0 {
        wake_all(word);
    }
}

#[cold]
fn wake_all(word: &WaitWord) {
    // Release: a sleeper that reads the new epoch (Acquire, in `wait_until`) also sees the
    // publication that preceded this wake.
    word.epoch.fetch_add(1, Ordering::Release);
    crate::fault::point("inside_wake");
    futex_wake(&word.epoch);
}

/// A segment's close events now (`word`: its `Watch::closes`), read before a probe; `None`
/// where a sleep cannot wait on them (no `futex_waitv`; loom, Miri).
pub(crate) fn close_events(word: &std::sync::atomic::AtomicU32) -> Option<u32> {
    #[cfg(all(not(loom), not(miri)))]
    return reactor::close_events(word);
    #[cfg(any(loom, miri))]
    {
        let _ = word;
        None
    }
}

/// How a [`sleep`] ended, besides a wake-up, a timeout or a spurious return (which its
/// caller's re-check tells apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slept {
    /// Woken, timed out, or returned for nothing.
    Plain,
    /// The segment's close events moved (a peer may have died).
    Closed,
    /// A signal handler interrupted the sleep inside [`interruptible`]: the wait ends if it
    /// has a deadline.
    Interrupted,
}

/// One sleep of a registered sleeper on `word` at `epoch`, for at most `left`; with
/// `closes`, on those close events too (one `futex_waitv`).
fn sleep(
    word: &WaitWord,
    epoch: u32,
    left: Option<Duration>,
    closes: Option<(&std::sync::atomic::AtomicU32, u32)>,
) -> Slept {
    #[cfg(all(not(loom), not(miri)))]
    if let Some((events, seen)) = closes {
        FUTEX_WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(waited) = reactor::sleep_or_close(word, epoch, (events, seen), left) {
            // Acquire: pairs with the Release bump of the watcher thread (the caller's
            // probe that follows sees what the close left).
            if events.load(std::sync::atomic::Ordering::Acquire) != seen {
                return Slept::Closed;
            }
            return if waited.is_err_and(|e| e == rustix::io::Errno::INTR) {
                intr()
            } else {
                Slept::Plain
            };
        }
    }
    #[cfg(any(loom, miri))]
    let _ = closes;
    futex_wait(&word.epoch, epoch, left)
}

/// Whether a sleep of this thread's wait was interrupted by a signal inside
/// [`interruptible`] since the last call (which clears it).
pub(crate) fn take_interruption() -> bool {
    #[cfg(not(loom))]
    return interrupt::take();
    #[cfg(loom)]
    false
}

/// A sleep returned `EINTR`.
#[cfg(all(not(loom), not(miri)))]
fn intr() -> Slept {
    if interrupt::interrupted() { Slept::Interrupted } else { Slept::Plain }
}

#[cfg(all(not(loom), not(miri)))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> Slept {
    use rustix::thread::futex;
    FUTEX_WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ts = timeout.map(|d| futex::Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: d.subsec_nanos().into(),
    });
    // EAGAIN (the epoch moved), EINTR and ETIMEDOUT all lead back to the caller's re-check
    // (EINTR ends the wait inside `interruptible`); no other error is possible for a valid,
    // aligned word.
    match futex::wait(word, futex::Flags::empty(), expected, ts.as_ref()) {
        Err(rustix::io::Errno::INTR) => intr(),
        _ => Slept::Plain,
    }
}

#[cfg(all(not(loom), not(miri)))]
fn futex_wake(word: &AtomicU32) {
    use rustix::thread::futex;
    FUTEX_WAKES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Cannot fail for a valid, aligned word; a failure would only cost a sleeper its
    // deadline, so it is not worth a panic on the publishing path.
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

// Under Miri the kernel futex is out of reach (Miri rejects the argument types of rustix's
// `syscall(SYS_futex, ...)`), so a sleeper naps on Miri's virtual clock and re-checks, which
// `wait_until` always does; the futex itself is exercised by the native tests.
#[cfg(all(miri, not(loom)))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> Slept {
    FUTEX_WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if word.load(Ordering::Relaxed) == expected {
        std::thread::sleep(timeout.map_or(DEGRADED_RECHECK, |t| t.min(DEGRADED_RECHECK)));
    }
    Slept::Plain
}

#[cfg(all(miri, not(loom)))]
fn futex_wake(_word: &AtomicU32) {
    FUTEX_WAKES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

// Under loom nobody sleeps in the kernel: these keep the code shape and are never reached
// by the models (they use the non-blocking operations only).
#[cfg(loom)]
fn futex_wait(_word: &AtomicU32, _expected: u32, _timeout: Option<Duration>) -> Slept {
    loom::thread::yield_now();
    Slept::Plain
}

#[cfg(loom)]
fn futex_wake(_word: &AtomicU32) {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn notify_without_sleepers_makes_no_syscall() {
        let word = WaitWord::new();
        for _ in 0..1000 {
            notify(&word);
        }
        // Other tests in this binary may sleep concurrently, but never on this word; the
        // epoch is the per-word proof that no wake was issued.
        assert_eq!(word.epoch.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn deadline_passes_with_sleep_policy() {
        let (word, waits) = (WaitWord::new(), Waits::new(WaitPolicy::SLEEP));
        let r: Result<(), _> = wait_until(
            &mut Sleeper::of(&word, &waits),
            &waits,
            true,
            Deadline::after(Duration::from_millis(20)),
            None,
            || None,
        );
        assert_eq!(r, Err(TimedOut));
        assert_eq!(word.sleepers(), 0, "a timed-out sleeper must deregister");
    }

    #[test]
    fn deadline_passes_with_spin_only_policy() {
        let (word, waits) = (WaitWord::new(), Waits::new(WaitPolicy::spin_then_sleep(u32::MAX, 0)));
        let r: Result<(), _> = wait_until(
            &mut Sleeper::of(&word, &waits),
            &waits,
            true,
            Deadline::after(Duration::from_millis(5)),
            None,
            || None,
        );
        assert_eq!(r, Err(TimedOut));
    }

    #[test]
    fn sleeper_is_woken_by_notify() {
        let word = Arc::new(WaitWord::new());
        let flag = Arc::new(AtomicBool::new(false));
        let (w, f) = (word.clone(), flag.clone());
        let sleeper = std::thread::spawn(move || {
            let waits = Waits::new(WaitPolicy::SLEEP);
            wait_until(&mut Sleeper::of(&w, &waits), &waits, true, Deadline::Never, None, || {
                f.load(Ordering::Acquire).then_some(())
            })
        });
        // Wait until the sleeper registered, so the wake must go through the futex.
        while word.sleepers() == 0 {
            std::thread::yield_now();
        }
        flag.store(true, Ordering::Release);
        notify(&word);
        assert_eq!(sleeper.join().unwrap(), Ok(()));
        assert!(word.epoch.load(Ordering::Relaxed) >= 1, "the wake path bumps the epoch");
        assert_eq!(word.sleepers(), 0);
    }
}
