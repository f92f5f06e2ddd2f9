//! An endpoint's claim line as its MPMC operations use it: the shared line where it names
//! the positions it is about to win, and the process-local lock that makes the clones of
//! one endpoint (threads sharing its line) take turns with it.
//!
//! An MPMC endpoint names a run in its line *before* its compare-and-swap on `tail` or
//! `head`, and keeps the lock until it has finished every cell of the run; so while it
//! lives, its line names every cell it has won and not finished. A repair acts on an
//! unfinished cell only when a dead endpoint's line names it and no live one's does
//! ([`Watch::orphaned`](super::Watch::orphaned)): a dead endpoint's word may name a
//! position it never won (it died between its claim and its compare-and-swap, or lost
//! that), but then the live winner's line names it too.

use crate::layout::Claims;

/// Makes the clones of one endpoint (threads of one process sharing its claim line) take
/// turns with the line: held from the claim store to the last stamp of the run. Local to
/// the process; uncontended unless two threads use one endpoint at once. (A test-and-set
/// lock; under loom a model mutex, as loom cannot schedule a spinning waiter fairly.)
#[derive(Debug, Default)]
pub struct ClaimLock {
    #[cfg(not(loom))]
    held: std::sync::atomic::AtomicBool,
    #[cfg(loom)]
    held: loom::sync::Mutex<()>,
}

impl ClaimLock {
    /// An unheld lock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the lock, spinning (then yielding) while a clone holds it; given back when the
    /// guard drops.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn lock(&self) -> ClaimTurn<'_> {
        use std::sync::atomic::Ordering;
        // Acquire: pairs with the Release store in `ClaimTurn::drop` of the clone that held
        // it last, so its claim store and its stamps come before ours (our claim store then
        // follows its in the line's order).
        if self.held.swap(true, Ordering::Acquire) {
            self.contended();
        }
        ClaimTurn { lock: self }
    }

    #[cfg(not(loom))]
    #[cold]
    fn contended(&self) {
        use std::sync::atomic::Ordering;
        let mut spins = 0u32;
        loop {
            // Relaxed: a hint; the swap below decides (and acquires).
            while self.held.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    // A clone descheduled mid-run: let it finish.
                    std::thread::yield_now();
                }
            }
            // Acquire: as in `lock`.
            if !self.held.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }

    /// Takes the lock (see the type's docs).
    #[cfg(loom)]
    pub(crate) fn lock(&self) -> ClaimTurn<'_> {
        ClaimTurn { _held: self.held.lock().unwrap() }
    }
}

/// A turn with a claim line; drop it once every cell of the run is finished.
#[derive(Debug)]
pub(crate) struct ClaimTurn<'a> {
    #[cfg(not(loom))]
    lock: &'a ClaimLock,
    #[cfg(loom)]
    _held: loom::sync::MutexGuard<'a, ()>,
}

#[cfg(not(loom))]
impl Drop for ClaimTurn<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: pairs with the Acquire swap in `ClaimLock::lock` of the next clone.
        self.lock.held.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// An endpoint's claim line in shared memory and the lock its clones share.
#[derive(Debug, Clone, Copy)]
pub struct ClaimLine<'a> {
    /// The line, in the ring's participant table.
    pub line: &'a Claims,
    /// The process-local lock.
    pub lock: &'a ClaimLock,
}
