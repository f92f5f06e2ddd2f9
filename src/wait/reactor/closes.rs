//! Closes: the inotify close events of the segments parked futures wait on, counted per
//! segment by one watcher thread (how a future learns that a peer may have died).

use super::*;

/// The closes of one segment this process watches (any process's descriptor of it, ours
/// included): bumped by the watcher thread, compared by parked futures.
#[derive(Debug)]
pub(crate) struct Closes {
    /// The count, bumped and woken by the watcher thread at every event: compared by
    /// parked futures, and the futex word a blocking wait sleeps on beside its own (see
    /// `wait_until`'s `closes`).
    pub(super) events: StdAtomicU32,
    /// The inotify watch, or `None` when inotify refused it: then futures probe by time.
    wd: Option<i32>,
    /// The fork generation of the watcher that holds `wd` (see [`FORKS`]).
    forks: u32,
}

impl Closes {
    /// The closes of the segment open as `fd`: a watch of the watcher thread (one per
    /// segment and process), or an unwatched one when inotify is unavailable.
    pub(crate) fn watch(fd: BorrowedFd<'_>) -> Arc<Closes> {
        watcher().map_or_else(Closes::unwatched, |w| w.add(fd))
    }

    /// Closes nobody watches: futures parked on such a segment probe by time.
    fn unwatched() -> Arc<Closes> {
        Arc::new(Closes { events: StdAtomicU32::new(0), wd: None, forks: 0 })
    }

    /// The futex word of this segment's close events, where this process's watcher
    /// thread counts them (`None`: nobody does; waits probe by time).
    pub(crate) fn word(&self) -> Option<&StdAtomicU32> {
        self.watched().then_some(&self.events)
    }

    /// Whether inotify watches this segment for this process (a watch a forked child
    /// inherited belongs to its parent's watcher thread, which the child has not: the
    /// child probes by time there). No system call, no lock.
    pub(crate) fn watched(&self) -> bool {
        // Relaxed: see `forked_child`.
        self.wd.is_some() && self.forks == FORKS.load(StdOrdering::Relaxed)
    }
}

impl Drop for Closes {
    fn drop(&mut self) {
        if let (Some(wd), true, Some(w)) = (self.wd, self.watched(), watcher()) {
            w.remove(wd);
        }
    }
}

/// The inotify instance of this process and the segments it watches.
pub(super) struct Watcher {
    fd: OwnedFd,
    /// Watch descriptor → its closes (one entry per watched inode: adding a watch for an
    /// inode already watched returns the same descriptor).
    pub(super) watches: Mutex<HashMap<i32, Weak<Closes>>>,
    /// The fork generation it was made in.
    forks: u32,
}

/// This process's watcher: `None` before the first use (or where inotify or a thread was
/// refused, until the next try); one a forked child inherited is its parent's, whose
/// thread the child has not (its `forks` is older than [`FORKS`]): the child makes its
/// own.
pub(super) static WATCHER: Mutex<Option<&'static Watcher>> = Mutex::new(None);

/// Forks this process has gone through since the watcher machinery was first used
/// (counted in each child, by a `pthread_atfork` handler).
static FORKS: StdAtomicU32 = StdAtomicU32::new(0);

/// Runs in the child of a `fork`, before `fork` returns there (async-signal-safe: one
/// atomic add).
extern "C" fn forked_child() {
    // Relaxed: the child runs one thread now; later reads in it follow in program order.
    FORKS.fetch_add(1, StdOrdering::Relaxed);
}

/// This process's watcher, started on the first call (and again in a child forked since);
/// `None` where inotify or a thread is refused.
fn watcher() -> Option<&'static Watcher> {
    static HANDLER: std::sync::Once = std::sync::Once::new();
    HANDLER.call_once(|| {
        // SAFETY: registers a child handler that only adds to an atomic. Should it fail
        // (ENOMEM), a forked child would take the inherited watcher for its own and its
        // blocking waits would learn of deaths by their `IDLE_TICK` only.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    let mut current = lock(&WATCHER);
    // Relaxed: see `forked_child`.
    let forks = FORKS.load(StdOrdering::Relaxed);
    if let Some(w) = *current {
        if w.forks == forks {
            return Some(w);
        }
        // Inherited: its descriptor is the parent's instance too, never read here (it
        // stays open, one descriptor per fork, with close-on-exec).
    }
    use rustix::fs::inotify;
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).ok()?;
    let w: &'static Watcher =
        Box::leak(Box::new(Watcher { fd, watches: Mutex::new(HashMap::new()), forks }));
    std::thread::Builder::new().name("gpuring-closes".into()).spawn(move || w.run()).ok()?;
    *current = Some(w);
    Some(w)
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
        let closes =
            Arc::new(Closes { events: StdAtomicU32::new(0), wd: Some(wd), forks: self.forks });
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
            // The queue overflowed (wd -1): events were lost, so every segment may have
            // seen a close.
            let all: Vec<Arc<Closes>> = lock(&self.watches)
                .iter()
                .filter(|&(&w, _)| w == wd || wd == -1)
                .filter_map(|(_, c)| c.upgrade())
                .collect();
            for closes in all {
                // Release: pairs with the Acquire loads in `Parked::probe_due` and
                // `close_events` (futures and blocking waits probe after they see it move).
                closes.events.fetch_add(1, StdOrdering::Release);
                let _ = futex::wake(&closes.events, futex::Flags::PRIVATE, i32::MAX as u32);
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
