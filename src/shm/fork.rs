//! Which process a handle belongs to. A process that forks gives its child a copy of every
//! handle: the same mappings and the same open file descriptions, so the same locks. A
//! handle dropped in that child must not act for the parent (give up its locks, mark an
//! endpoint gone, return a slot, remove a segment): each handle records the process that
//! made it, and its drop does nothing to shared state elsewhere.
//!
//! The current pid is cached (a `pthread_atfork` child handler updates it), so that the
//! check costs no system call: drops of messages and leases are on the hot path.

use std::sync::Once;
// Not `crate::sync`: a per-process cache outside every loom model (and a static).
use std::sync::atomic::{AtomicU32, Ordering};

/// This process's pid, or 0 before the first call of [`current_pid`].
static PID: AtomicU32 = AtomicU32::new(0);
static HANDLER: Once = Once::new();

fn getpid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// Runs in the child of a `fork`, before `fork` returns there (async-signal-safe: one
/// system call and one atomic store).
extern "C" fn forked_child() {
    // Relaxed: the child runs one thread now; later reads in it are ordered after this by
    // program order, and other processes never read it.
    PID.store(getpid(), Ordering::Relaxed);
}

/// This process's pid, without a system call after the first.
pub(crate) fn current_pid() -> u32 {
    HANDLER.call_once(|| {
        // Relaxed: see `forked_child`; `call_once` orders this before every return.
        PID.store(getpid(), Ordering::Relaxed);
        // SAFETY: registers a child handler that only calls getpid and stores an atomic.
        // A failure (ENOMEM) leaves a child with its parent's pid cached: it would then
        // act for the parent on drop, as every handle did before this check.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    // Relaxed: as above.
    PID.load(Ordering::Relaxed)
}
