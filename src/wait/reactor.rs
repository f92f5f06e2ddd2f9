//! Async waits (feature `async`): futures that park on the same shared wait words as the
//! blocking calls, woken by one waiter thread per 127 parked futures that sleeps on all of
//! their words at once (`futex_waitv`, Linux ≥ 5.16), and told of peer deaths by one watcher
//! thread reading inotify close events of the segments they wait on.
//!
//! **Parking.** A future whose operation cannot proceed does what a blocking sleeper does,
//! in the same order — `sleepers += 1`, the heavy barrier, read the epoch, try once more —
//! and then, instead of `futex_wait`, hands (word, epoch, waker) to a [`Shard`]. The shard's
//! thread `futex_waitv`s on its control word and every parked word; when a word's epoch has
//! moved (a publisher's `notify` saw the sleeper and woke the futex), it takes the entry
//! out, gives the sleeper count back and wakes the task, which tries again. Whoever takes
//! an entry out (the thread after a wake, or the future when it is polled again or dropped)
//! gives its `sleepers` back, so the count is right even for a future that is leaked.
//! Entries hold a reference on the mapping of their word (`KeepAlive`): the thread reads a
//! word only while its entry is in the table, and the mapping cannot go before the entry.
//!
//! **Liveness.** A blocking call probes its peers every `LIVENESS_TICK`; a thousand parked
//! futures doing that would burn a core. A peer that dies closes its descriptor of the
//! segment (the kernel does it), and inotify reports the close: the watcher thread counts
//! closes per segment and wakes the futures parked on it, which then probe once (the
//! blocking form's tick, `Deadline::Tick`). An endpoint also probes the first time it parks,
//! and not again until the segment's close count moves (see `Park`). An idle process with
//! parked futures makes no syscall and uses no CPU. Where inotify is refused, futures fall
//! back to probing every `LIVENESS_TICK`.
//!
//! The fast path (the operation succeeds at once) touches none of this.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32 as StdAtomicU32, AtomicU64, Ordering as StdOrdering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rustix::thread::futex;

use super::{DEGRADED_RECHECK, Deadline, WaitWord};
use crate::sync::Ordering;

/// A reference that keeps the mapping of a parked word alive (the endpoint's segment).
pub(crate) type KeepAlive = Arc<dyn Send + Sync>;

/// How long a future parked on a segment that inotify cannot watch goes between probes
/// of its peers (the blocking calls' tick).
const UNWATCHED_TICK: Duration = Duration::from_millis(30);

/// Parked futures per waiter thread: `futex_waitv` takes at most 128 words, one of which
/// is the thread's control word.
const SHARD_SIZE: usize = 127;

/// Locks `m`, carrying on past a poisoned lock: every critical section below leaves the
/// table consistent at each step, so a panic in a waker cannot break it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------
// Closes: inotify close events per segment

/// The closes of one segment this process watches (any process's descriptor of it, ours
/// included): bumped by the watcher thread, compared by parked futures.
#[derive(Debug)]
pub(crate) struct Closes {
    count: AtomicU64,
    /// The inotify watch, or `None` when inotify refused it: then futures probe by time.
    wd: Option<i32>,
}

impl Closes {
    /// The closes of the segment open as `fd`: a watch of the watcher thread (one per
    /// segment and process), or an unwatched one when inotify is unavailable.
    pub(crate) fn watch(fd: BorrowedFd<'_>) -> Arc<Closes> {
        watcher().map_or_else(Closes::unwatched, |w| w.add(fd))
    }

    /// Closes nobody watches: futures parked on such a segment probe by time.
    fn unwatched() -> Arc<Closes> {
        Arc::new(Closes { count: AtomicU64::new(0), wd: None })
    }

    /// Whether inotify watches this segment.
    pub(crate) fn watched(&self) -> bool {
        self.wd.is_some()
    }
}

impl Drop for Closes {
    fn drop(&mut self) {
        if let (Some(wd), Some(w)) = (self.wd, watcher()) {
            w.remove(wd);
        }
    }
}

/// The inotify instance of this process and the segments it watches.
struct Watcher {
    fd: OwnedFd,
    /// Watch descriptor → its closes (one entry per watched inode: adding a watch for an
    /// inode already watched returns the same descriptor).
    watches: Mutex<HashMap<i32, Weak<Closes>>>,
}

static WATCHER: OnceLock<Option<&'static Watcher>> = OnceLock::new();

fn watcher() -> Option<&'static Watcher> {
    *WATCHER.get_or_init(|| {
        use rustix::fs::inotify;
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC).ok()?;
        let w: &'static Watcher =
            Box::leak(Box::new(Watcher { fd, watches: Mutex::new(HashMap::new()) }));
        std::thread::Builder::new().name("gpuring-closes".into()).spawn(move || w.run()).ok()?;
        Some(w)
    })
}

impl Watcher {
    fn add(&'static self, fd: BorrowedFd<'_>) -> Arc<Closes> {
        use rustix::fs::inotify::{self, WatchFlags};
        // The magic link names this very object, wherever it is mounted.
        let path = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&fd));
        // Closes are how deaths show; a change of size or mode is worth a probe too.
        let what = WatchFlags::CLOSE_WRITE
            | WatchFlags::CLOSE_NOWRITE
            | WatchFlags::MODIFY
            | WatchFlags::ATTRIB;
        let mut watches = lock(&self.watches);
        let Ok(wd) = inotify::add_watch(&self.fd, path, what) else { return Closes::unwatched() };
        if let Some(closes) = watches.get(&wd).and_then(Weak::upgrade) {
            return closes;
        }
        let closes = Arc::new(Closes { count: AtomicU64::new(0), wd: Some(wd) });
        watches.insert(wd, Arc::downgrade(&closes));
        closes
    }

    fn remove(&self, wd: i32) {
        let mut watches = lock(&self.watches);
        // Another `Closes` for the same inode may have been made since this one's count
        // reached zero; only a dead entry is removed.
        if watches.get(&wd).is_some_and(|w| w.strong_count() == 0) {
            watches.remove(&wd);
            let _ = rustix::fs::inotify::remove_watch(&self.fd, wd);
        }
    }

    fn run(&self) {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = rustix::fs::inotify::Reader::new(self.fd.as_fd(), &mut buf);
        loop {
            let wd = match reader.next() {
                Ok(event) => event.wd(),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    // Cannot happen on a descriptor we own with a page of buffer; if it
                    // did, parked futures still wake on messages: do not spin on it.
                    std::thread::sleep(UNWATCHED_TICK);
                    continue;
                }
            };
            let closes = lock(&self.watches).get(&wd).and_then(Weak::upgrade);
            if let Some(closes) = closes {
                // Release: a future that reads the new count (Acquire) probes after it.
                closes.count.fetch_add(1, StdOrdering::Release);
                // Release: pairs with the Acquire load in `block_on_any`, which then sees
                // the count bumped above. Threads asleep there wake to probe.
                CLOSE_EVENTS.fetch_add(1, StdOrdering::Release);
                let _ = futex::wake(&CLOSE_EVENTS, futex::Flags::PRIVATE, i32::MAX as u32);
                // Cloned out, so that no waker runs under the registry's lock.
                let shards: Vec<_> = lock(&REGISTRY).clone();
                for shard in shards {
                    shard.wake_where(|e| Arc::ptr_eq(&e.closes, &closes));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shards: waiter threads

/// A parked future.
struct Entry {
    /// The word's epoch, inside the mapping `_keep` keeps alive.
    word: *const WaitWord,
    expected: u32,
    waker: Waker,
    closes: Arc<Closes>,
    /// Wake at this instant even if nothing moved (an unwatched segment's probe, or the
    /// degraded barrier's re-check).
    wake_at: Option<Instant>,
    _keep: KeepAlive,
    /// Which parking this is, so that a stale key cannot take out a later entry.
    ticket: u64,
}

// SAFETY: `word` points into the mapping that `_keep` (Send + Sync) keeps alive, and is
// only used for atomic operations; `Waker` is Send.
unsafe impl Send for Entry {}

impl Entry {
    fn word(&self) -> &WaitWord {
        // SAFETY: the mapping lives as long as `_keep`, which this entry holds.
        unsafe { &*self.word }
    }

    /// Takes this entry out of the sleepers of its word.
    fn unregister(&self) {
        self.word().unregister();
    }
}

/// One waiter thread and the futures parked with it.
struct Shard {
    entries: Mutex<Vec<Option<Entry>>>,
    /// Bumped on every new entry; the first word of each `futex_waitv`, so that an entry
    /// added while the thread sleeps wakes it to add the word.
    control: StdAtomicU32,
}

/// The shards of this process, each with its thread. Shards are never removed: an idle
/// one sleeps on its control word.
static REGISTRY: Mutex<Vec<Arc<Shard>>> = Mutex::new(Vec::new());
static TICKETS: AtomicU64 = AtomicU64::new(1);

impl Shard {
    /// Takes out and wakes the entries that `pred` selects.
    fn wake_where(&self, mut pred: impl FnMut(&Entry) -> bool) {
        let mut woken = Vec::new();
        for e in lock(&self.entries).iter_mut() {
            if e.as_ref().is_some_and(&mut pred) {
                let e = e.take().expect("selected above");
                e.unregister();
                woken.push(e.waker);
            }
        }
        woken.into_iter().for_each(Waker::wake);
    }

    fn run(&self) {
        let mut waits = [futex::Wait::new(); SHARD_SIZE + 1];
        loop {
            let (n, wake_at) = {
                let entries = lock(&self.entries);
                // Acquire: pairs with the Release bump in `park`; read under the lock, so
                // that every entry added before the bump is in the list below.
                let control = self.control.load(StdOrdering::Acquire);
                waits[0] = private_wait(&self.control, control);
                let mut n = 1;
                let mut wake_at: Option<Instant> = None;
                for e in entries.iter().flatten() {
                    waits[n] = word_wait(e.word(), e.expected);
                    n += 1;
                    wake_at = match (wake_at, e.wake_at) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                (n, wake_at)
            };
            // The words are read by the kernel once, at the start: an entry taken out (and
            // its mapping gone) while this sleeps is never read again by us, and the kernel
            // fails the call rather than fault if a mapping went before it started.
            let timeout = wake_at.map(monotonic);
            // Any outcome (a word moved, the timeout, EAGAIN, EINTR, EFAULT) leads to the
            // same look at every entry.
            let waited = futex::waitv(
                &waits[..n],
                futex::WaitvFlags::empty(),
                timeout.as_ref(),
                rustix::time::ClockId::Monotonic,
            );
            if waited == Err(rustix::io::Errno::NOSYS) {
                // Before Linux 5.16: sleep on the control word alone and look at every
                // word each `DEGRADED_RECHECK` (a new entry still wakes us at once).
                let _ = futex::wait(
                    &self.control,
                    futex::Flags::PRIVATE,
                    waits[0].val as u32,
                    Some(&futex::Timespec { tv_sec: 0, tv_nsec: DEGRADED_RECHECK.as_nanos() as _ }),
                );
            }
            let now = Instant::now();
            self.wake_where(|e| {
                // Acquire: pairs with the Release bump in `wake_all`.
                e.word().epoch.load(Ordering::Acquire) != e.expected
                    || e.wake_at.is_some_and(|at| at <= now)
            });
        }
    }
}

/// A `futex_waitv` entry for this process's own word `word` while it holds `val`.
fn private_wait(word: &StdAtomicU32, val: u32) -> futex::Wait {
    let mut w = futex::Wait::new();
    w.uaddr = futex::WaitPtr::new(word.as_ptr().cast());
    w.val = val.into();
    w.flags = futex::WaitFlags::SIZE_U32 | futex::WaitFlags::PRIVATE;
    w
}

/// A `futex_waitv` entry for the epoch of `word` while it holds `expected`: shared, since
/// the word is in a mapping other processes wake.
fn word_wait(word: &WaitWord, expected: u32) -> futex::Wait {
    let mut w = futex::Wait::new();
    w.uaddr = futex::WaitPtr::new(word.epoch.as_ptr().cast());
    w.val = expected.into();
    w.flags = futex::WaitFlags::SIZE_U32;
    w
}

/// `at` as an absolute time of the monotonic clock (`futex_waitv`'s timeout).
fn monotonic(at: Instant) -> futex::Timespec {
    let left = at.saturating_duration_since(Instant::now());
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let ns = now.tv_nsec as u128 + left.subsec_nanos() as u128;
    futex::Timespec {
        tv_sec: now.tv_sec + left.as_secs() as i64 + (ns / 1_000_000_000) as i64,
        tv_nsec: (ns % 1_000_000_000) as _,
    }
}

/// Parks a future: adds an entry to a shard with room (making one, and its thread, if
/// none has), and wakes that shard's thread so that it sleeps on the word too.
fn park(entry: Entry) -> Result<Key, Entry> {
    let ticket = entry.ticket;
    let mut registry = lock(&REGISTRY);
    let mut entry = Some(entry);
    let mut found = None;
    for s in registry.iter() {
        let mut entries = lock(&s.entries);
        let index = match entries.iter().position(Option::is_none) {
            Some(i) => i,
            None if entries.len() < SHARD_SIZE => {
                entries.push(None);
                entries.len() - 1
            }
            None => continue,
        };
        entries[index] = entry.take();
        found = Some((s.clone(), index));
        break;
    }
    let (shard, index) = match found {
        Some(found) => found,
        None => {
            let s = Arc::new(Shard {
                entries: Mutex::new(vec![entry.take()]),
                control: StdAtomicU32::new(0),
            });
            let thread = s.clone();
            let spawned = std::thread::Builder::new()
                .name("gpuring-waiter".into())
                .spawn(move || thread.run());
            if spawned.is_err() {
                let back = lock(&s.entries)[0].take();
                return Err(back.expect("put there above"));
            }
            registry.push(s.clone());
            (s, 0)
        }
    };
    drop(registry);
    // Release: pairs with the Acquire load in `Shard::run`.
    shard.control.fetch_add(1, StdOrdering::Release);
    let _ = futex::wake(&shard.control, futex::Flags::PRIVATE, 1);
    Ok(Key { shard, index, ticket })
}

/// Where a future is parked.
struct Key {
    shard: Arc<Shard>,
    index: usize,
    ticket: u64,
}

impl Key {
    /// Whether the entry is still parked (nothing woke it yet); if so, it will wake the
    /// task of `waker` from now on.
    fn still_parked(&self, waker: &Waker) -> bool {
        let mut entries = lock(&self.shard.entries);
        match entries[self.index].as_mut() {
            Some(e) if e.ticket == self.ticket => {
                if !e.waker.will_wake(waker) {
                    e.waker = waker.clone();
                }
                true
            }
            _ => false,
        }
    }

    /// Takes the entry out if the thread has not (then gives its `sleepers` back).
    fn unpark(self) {
        let taken = {
            let mut entries = lock(&self.shard.entries);
            let slot = &mut entries[self.index];
            if slot.as_ref().is_some_and(|e| e.ticket == self.ticket) { slot.take() } else { None }
        };
        if let Some(e) = taken {
            e.unregister();
        }
    }
}

// ---------------------------------------------------------------------------------------
// The future's side

/// What an async operation's future keeps between polls: where it is parked, and (on a
/// segment inotify cannot watch) when it probes its peers next.
///
/// `pub` only so that the sealed `Selectable` trait may name it: `wait` is a private
/// module, so no user can.
#[derive(Default)]
pub struct Parked {
    key: Option<Key>,
    next_probe: Option<Instant>,
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
    clear_at: Arc<AtomicU64>,
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
    pub(crate) fn watching(self, other: Park) -> Self {
        Self { closes: other.closes, ..self }
    }

    fn word(&self) -> &WaitWord {
        // SAFETY: `keep` keeps the word's memory alive (`new`'s contract).
        unsafe { &*self.word }
    }
}

impl Parked {
    /// Whether the peers should be probed now: the segment saw a close since the
    /// endpoint's last probe that found nothing (`Some(Some(count))`: record `count` if
    /// this one finds nothing either), or, unwatched, a tick has passed (`Some(None)`).
    fn probe_due(&mut self, at: &Park) -> Option<Option<u64>> {
        if at.closes.watched() {
            // Acquire: pairs with the Release bump of the watcher thread.
            let count = at.closes.count.load(StdOrdering::Acquire);
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

// ---------------------------------------------------------------------------------------
// A thread waiting on several words at once (the blocking `select`)

/// Close events of every segment the watcher thread watches: a thread in
/// [`block_on_any`] sleeps on it too, so that a peer's death wakes it to probe.
static CLOSE_EVENTS: StdAtomicU32 = StdAtomicU32::new(0);

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

// ---------------------------------------------------------------------------------------
// What a select waits on

/// What [`select`](crate::select) and [`select_async`](crate::select_async) can wait on, several at once: a host channel's
/// [`Receiver`](crate::Receiver) (each take a `Result<Message, RecvError>`), an
/// [`SpscConsumer`](crate::SpscConsumer) or [`MpmcConsumer`](crate::MpmcConsumer) of a
/// ring (each take a `Result<T, PopError>`). Sealed: the crate implements it.
///
/// A list of one type selects as it is; SPSC and MPMC consumers of the same element type
/// mix as trait objects:
///
/// ```no_run
/// use gpuring::{MpmcRing, PopError, Selectable, SpscRing, select};
/// let (a, b) = (SpscRing::<u64>::open("ticks")?, MpmcRing::<u64>::open("jobs")?);
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
/// let s = gpuring::waiter_stats();
/// assert!(s.parked <= s.threads * 127);
/// ```
pub fn waiter_stats() -> WaiterStats {
    let registry = lock(&REGISTRY);
    let parked = registry.iter().map(|s| lock(&s.entries).iter().flatten().count()).sum();
    let watched_segments = WATCHER
        .get()
        .and_then(|w| w.map(|w| lock(&w.watches).values().filter(|c| c.strong_count() > 0).count()))
        .unwrap_or(0);
    WaiterStats { threads: registry.len(), parked, watched_segments }
}
