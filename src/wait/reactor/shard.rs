//! Shards: the waiter threads, each asleep on up to 127 parked words at once
//! (`futex_waitv`), waking the futures whose word moved.

use super::*;

/// A parked future.
pub(super) struct Entry {
    /// The word's epoch, inside the mapping `_keep` keeps alive.
    pub(super) word: *const WaitWord,
    pub(super) expected: u32,
    pub(super) waker: Waker,
    pub(super) closes: Arc<Closes>,
    /// Wake at this instant even if nothing moved (an unwatched segment's probe, or the
    /// degraded barrier's re-check).
    pub(super) wake_at: Option<Instant>,
    pub(super) _keep: KeepAlive,
    /// Which parking this is, so that a stale key cannot take out a later entry.
    pub(super) ticket: u64,
}

// SAFETY: `word` points into the mapping that `_keep` (Send + Sync) keeps alive, and is
// only used for atomic operations; `Waker` is Send.
unsafe impl Send for Entry {}

impl Entry {
    pub(super) fn word(&self) -> &WaitWord {
        // SAFETY: the mapping lives as long as `_keep`, which this entry holds.
        unsafe { &*self.word }
    }

    /// Takes this entry out of the sleepers of its word.
    pub(super) fn unregister(&self) {
        self.word().unregister();
    }
}

/// One waiter thread and the futures parked with it.
pub(super) struct Shard {
    pub(super) entries: Mutex<Vec<Option<Entry>>>,
    /// Bumped on every new entry; the first word of each `futex_waitv`, so that an entry
    /// added while the thread sleeps wakes it to add the word.
    control: StdAtomicU32,
}

/// The shards of this process, each with its thread. Shards are never removed: an idle
/// one sleeps on its control word.
pub(super) static REGISTRY: Mutex<Vec<Arc<Shard>>> = Mutex::new(Vec::new());
pub(super) static TICKETS: AtomicU64 = AtomicU64::new(1);

impl Shard {
    /// Takes out and wakes the entries that `pred` selects.
    pub(super) fn wake_where(&self, mut pred: impl FnMut(&Entry) -> bool) {
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
pub(super) fn private_wait(word: &StdAtomicU32, val: u32) -> futex::Wait {
    let mut w = futex::Wait::new();
    w.uaddr = futex::WaitPtr::new(word.as_ptr().cast());
    w.val = val.into();
    w.flags = futex::WaitFlags::SIZE_U32 | futex::WaitFlags::PRIVATE;
    w
}

/// A `futex_waitv` entry for the epoch of `word` while it holds `expected`: shared, since
/// the word is in a mapping other processes wake.
pub(super) fn word_wait(word: &WaitWord, expected: u32) -> futex::Wait {
    let mut w = futex::Wait::new();
    w.uaddr = futex::WaitPtr::new(word.epoch.as_ptr().cast());
    w.val = expected.into();
    w.flags = futex::WaitFlags::SIZE_U32;
    w
}

/// `at` as an absolute time of the monotonic clock (`futex_waitv`'s timeout).
pub(super) fn monotonic(at: Instant) -> futex::Timespec {
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
pub(super) fn park(entry: Entry) -> Result<Key, Entry> {
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
pub(super) struct Key {
    shard: Arc<Shard>,
    index: usize,
    ticket: u64,
}

impl Key {
    /// Whether the entry is still parked (nothing woke it yet); if so, it will wake the
    /// task of `waker` from now on.
    pub(super) fn still_parked(&self, waker: &Waker) -> bool {
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
    pub(super) fn unpark(self) {
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
