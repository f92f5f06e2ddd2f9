//! Closes: the inotify close events of the segments parked futures wait on, counted per
//! segment by one watcher thread (how a future learns that a peer may have died).

use super::*;

/// The closes of one segment this process watches (any process's descriptor of it, ours
/// included): bumped by the watcher thread, compared by parked futures.
#[derive(Debug)]
pub(crate) struct Closes {
    pub(super) count: AtomicU64,
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
pub(super) struct Watcher {
    fd: OwnedFd,
    /// Watch descriptor → its closes (one entry per watched inode: adding a watch for an
    /// inode already watched returns the same descriptor).
    pub(super) watches: Mutex<HashMap<i32, Weak<Closes>>>,
}

pub(super) static WATCHER: OnceLock<Option<&'static Watcher>> = OnceLock::new();

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
