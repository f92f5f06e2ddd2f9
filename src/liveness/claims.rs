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
///
/// A *sole* endpoint's lock is no lock at all: an endpoint that is never cloned and that
/// its owner uses from one thread at a time (a channel's `Sender` and `Receiver`, which are
/// not `Sync`, hold their descriptor-ring ends so) has no clone to take turns with, and its
/// operations follow one another in program order (or, moved to another thread, in the
/// order the move established). Its turns then cost one branch on a plain `bool` instead of
/// an atomic swap and a store. What that rests on, checked when the docs are tested:
///
/// ```
/// fn sendable<T: Send>() {}
/// sendable::<gpuring::Sender>();
/// sendable::<gpuring::Receiver>();
/// ```
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<gpuring::Sender>(); // a sender is not `Sync`
/// ```
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<gpuring::Receiver>(); // a receiver is not `Sync`
/// ```
#[derive(Debug, Default)]
pub struct ClaimLock {
    #[cfg(not(loom))]
    held: std::sync::atomic::AtomicBool,
    #[cfg(loom)]
    held: loom::sync::Mutex<()>,
    sole: bool,
}

impl ClaimLock {
    /// An unheld lock.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lock of a sole endpoint (see the type's docs): its turns take nothing. The
    /// endpoint holding it must never be cloned (`ShmStorage::clone` asserts so) and must be
    /// used by one thread at a time.
    pub(crate) fn sole() -> Self {
        Self { sole: true, ..Self::default() }
    }

    /// Whether this is a sole endpoint's lock.
    pub(crate) fn is_sole(&self) -> bool {
        self.sole
    }

    /// Takes the lock, spinning (then yielding) while a clone holds it; given back when the
    /// guard drops.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn lock(&self) -> ClaimTurn<'_> {
        use std::sync::atomic::Ordering;
        if self.sole {
            return ClaimTurn { lock: None };
        }
        // Acquire: pairs with the Release store in `ClaimTurn::drop` of the clone that held
        // it last, so its claim store and its stamps come before ours (our claim store then
        // follows its in the line's order).
        if self.held.swap(true, Ordering::Acquire) {
            self.contended();
        }
        ClaimTurn { lock: Some(self) }
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
        ClaimTurn { _held: (!self.sole).then(|| self.held.lock().unwrap()) }
    }
}

/// A turn with a claim line; drop it once every cell of the run is finished.
#[derive(Debug)]
pub(crate) struct ClaimTurn<'a> {
    /// `None`: a sole endpoint's turn.
    #[cfg(not(loom))]
    lock: Option<&'a ClaimLock>,
    #[cfg(loom)]
    _held: Option<loom::sync::MutexGuard<'a, ()>>,
}

#[cfg(not(loom))]
impl Drop for ClaimTurn<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(lock) = self.lock {
            // Release: pairs with the Acquire swap in `ClaimLock::lock` of the next clone.
            lock.held.store(false, std::sync::atomic::Ordering::Release);
        }
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::ClaimLock;

    #[test]
    fn a_shared_lock_is_held_for_its_turn_and_a_sole_one_never() {
        use std::sync::atomic::Ordering;
        let shared = ClaimLock::new();
        let turn = shared.lock();
        assert!(shared.held.load(Ordering::Relaxed), "a turn holds the lock");
        drop(turn);
        assert!(!shared.held.load(Ordering::Relaxed), "given back with the turn");

        let sole = ClaimLock::sole();
        let (first, second) = (sole.lock(), sole.lock()); // no lock: both at once
        assert!(!sole.held.load(Ordering::Relaxed), "a sole end's turn takes nothing");
        drop((first, second));
        assert!(sole.is_sole() && !shared.is_sole());
    }
}
