//! Death words: a word in shared memory that the kernel itself marks when this process
//! dies, so that a peer learns of the death with one load and no system call.
//!
//! The mechanism is the kernel's robust-futex list (`set_robust_list(2)`): a thread
//! registers a list of entries in its memory; when the thread exits (a process that dies,
//! however it dies, or that execs), the kernel walks the list and, in each entry's futex
//! word that holds the thread's id, replaces the id with `OWNER_DIED` (bit 30). The walk
//! runs as the dying thread releases its memory, before its files close: before a CUDA
//! context of the process is torn down and its device memory freed.
//!
//! One **keeper** thread per process owns the list. It does nothing but exist: it sets its
//! robust list and parks for good, so its exit is the process's. A watched word holds the
//! keeper's thread id while the process lives (any thread writes it). The list's entries
//! are words of shared memory beside their futex words (`PoolHeader::keeper_link`, at the
//! fixed `futex_offset` before `PoolHeader::owner_word`), linked in this process's
//! addresses; their order is kept in a private vector and only ever *written* to shared
//! memory, never read back: a peer that scribbles a link can at worst spoil the kernel's
//! walk at this process's death (bounded by the kernel, and no worse than forging the
//! word), never make this process follow a pointer.
//!
//! The keeper's own robust list replaces the one glibc registered for it; the keeper never
//! locks a robust pthread mutex, and glibc's exit-time walk of its own list runs only if a
//! thread's function returns, which the keeper's never does. A forked child has no keeper
//! (only the forking thread is copied): its first watch starts one, with an empty list.
//! The keeper's state is behind a lock that records its holder's pid ([`PidLock`]), so a
//! child forked while another thread of the parent held it (registering or dropping a
//! sender at that instant) takes it over instead of waiting for a thread it does not have.

use std::cell::UnsafeCell;
// Not `crate::sync`: process-private state outside every loom model (and a static).
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::layout::KEEPER_FUTEX_OFFSET;

/// The bit the kernel sets in a dead owner's futex word.
pub(crate) const OWNER_DIED: u32 = 0x4000_0000;

/// `struct robust_list_head` of the kernel's ABI (64-bit).
#[repr(C)]
struct RobustListHead {
    /// The first entry's address, or the head's own address when the list is empty.
    next: AtomicUsize,
    /// Where an entry's futex word lies from the entry.
    futex_offset: isize,
    /// An entry being added or removed (unused: each change is one store).
    pending: AtomicUsize,
}

/// The keeper's list head (the kernel reads it in this process's memory).
static HEAD: RobustListHead = RobustListHead {
    next: AtomicUsize::new(0),
    futex_offset: KEEPER_FUTEX_OFFSET,
    pending: AtomicUsize::new(0),
};

/// The keeper of this process, once one was started.
struct Keeper {
    /// The process that started it (a forked child starts its own).
    pid: u32,
    /// Its thread id (`None`: the kernel refused the list; nothing is watched).
    tid: Option<u32>,
    /// The entries' addresses in list order (the first is `HEAD.next`).
    links: Vec<usize>,
}

static KEEPER: PidLock<Option<Keeper>> = PidLock::new(None);

/// A lock that records the pid of the process whose thread holds it. Every thread of a
/// process shares its pid, so within a process it excludes as a mutex does; a forked child,
/// which finds it held by a pid not its own (a thread of the parent, which the child does
/// not have), takes it over. What it guards may then be half-changed: the keeper's state is
/// the parent's anyway, and the child leaks it and starts its own (`Vigil::watch`).
struct PidLock<T> {
    /// 0 when free, else the holder's pid.
    holder: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, which the lock makes exclusive among
// the threads of one process (a static is never shared between processes).
unsafe impl<T: Send> Sync for PidLock<T> {}

impl<T> PidLock<T> {
    const fn new(value: T) -> Self {
        Self { holder: AtomicU32::new(0), value: UnsafeCell::new(value) }
    }

    /// Takes the lock, waiting (yielding) while another thread of this process holds it;
    /// taken over from a holder of another pid. Not for hot paths: one `getpid` a call.
    fn lock(&self) -> PidGuard<'_, T> {
        let me = std::process::id();
        let mut seen = 0;
        loop {
            // Acquire: pairs with the Release store in `PidGuard::drop` of the previous
            // holder (its changes to the value come before ours).
            match self.holder.compare_exchange(seen, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return PidGuard { lock: self },
                // Held by a thread of this process: wait for it.
                Err(h) if h == me => {
                    seen = 0;
                    std::thread::yield_now();
                }
                // Free (try again from 0), or held by a pid that is not this process's:
                // a thread of the process this one was forked from, absent here. Take it
                // over with a CAS from that exact pid.
                Err(h) => seen = h,
            }
        }
    }
}

/// Exclusive access to a [`PidLock`]'s value; gives the lock back on drop.
struct PidGuard<'a, T> {
    lock: &'a PidLock<T>,
}

impl<T> std::ops::Deref for PidGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock (see `PidLock`).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for PidGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the guard's only borrow.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for PidGuard<'_, T> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire CAS in `PidLock::lock` of the next holder.
        self.lock.holder.store(0, Ordering::Release);
    }
}

fn head_addr() -> usize {
    &HEAD as *const RobustListHead as usize
}

/// Starts this process's keeper thread: its id, or `None` if the thread or its list could
/// not be made.
fn start() -> Option<u32> {
    // Relaxed: read by the kernel at the keeper's exit, and by nothing else; the keeper
    // registers the head after this store (`spawn` orders it before the thread starts).
    HEAD.next.store(head_addr(), Ordering::Relaxed);
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("gpuring-keeper".into())
        .stack_size(64 << 10)
        .spawn(move || {
            // SAFETY: registers a list head that lives for the whole process (a static of
            // the kernel's layout and size). Entries are linked only while the memory they
            // and their words lie in is mapped here (see `Vigil`).
            let r = unsafe {
                libc::syscall(
                    libc::SYS_set_robust_list,
                    &HEAD as *const RobustListHead,
                    size_of::<RobustListHead>(),
                )
            };
            let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
            let _ = tx.send((r == 0).then_some(tid));
            if r == 0 {
                loop {
                    std::thread::park();
                }
            }
        });
    spawned.ok()?;
    rx.recv().ok().flatten()
}

/// A word that the kernel marks `OWNER_DIED` if this process dies while this value lives.
/// Dropping it (the owner leaves cleanly) clears the word to 0 (not watched) and takes it
/// off the list. Holds what keeps the word's memory mapped.
pub(crate) struct Vigil {
    link: usize,
    word: *const AtomicU32,
    pid: u32,
    _keep: std::sync::Arc<dyn Send + Sync>,
}

impl std::fmt::Debug for Vigil {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vigil").field("link", &self.link).finish_non_exhaustive()
    }
}

// SAFETY: the pointers are into the mapping that `_keep` keeps alive; the word is an
// atomic; nothing ties them to a thread.
unsafe impl Send for Vigil {}
// SAFETY: as above (`&Vigil` gives nothing out).
unsafe impl Sync for Vigil {}

impl Vigil {
    /// Watches `word`, whose robust-list entry is `link` (`KEEPER_FUTEX_OFFSET` bytes
    /// before it), both inside the mapping `keep` keeps alive. `None` when this process has
    /// no keeper (the kernel refused the list): the word stays 0, not watched.
    ///
    /// # Safety
    ///
    /// `link` and `word` must lie in memory that stays mapped at the same address while
    /// `keep` lives.
    pub(crate) unsafe fn watch(
        link: &AtomicU64,
        word: &AtomicU32,
        keep: std::sync::Arc<dyn Send + Sync>,
    ) -> Option<Self> {
        let (link_addr, word_addr) =
            (link as *const AtomicU64 as usize, word as *const AtomicU32 as usize);
        assert_eq!(word_addr as isize - link_addr as isize, KEEPER_FUTEX_OFFSET);
        let pid = crate::shm::current_pid();
        let mut keeper = KEEPER.lock();
        if keeper.as_ref().is_none_or(|k| k.pid != pid) {
            // A forked child's copy of the parent's state may be half-changed (the lock
            // taken over from a thread the child does not have): leaked, never used.
            std::mem::forget(keeper.replace(Keeper { pid, tid: start(), links: Vec::new() }));
        }
        let keeper = keeper.as_mut().expect("set above");
        let tid = keeper.tid?;
        // Linked first, the word written after: a death in between leaves the word 0 (the
        // kernel marks only words holding the keeper's id), never the id of a dead thread.
        let first = keeper.links.first().copied().unwrap_or_else(head_addr);
        // Relaxed (both): read by the kernel when this process dies, after every thread of
        // it has stopped; no thread of ours reads them.
        link.store(first as u64, Ordering::Relaxed);
        HEAD.next.store(link_addr, Ordering::Relaxed);
        keeper.links.insert(0, link_addr);
        // Release: pairs with the Acquire load in `died` of a receiver that then reads
        // what this process wrote before (nothing depends on it but the word itself).
        word.store(tid, Ordering::Release);
        Some(Self { link: link_addr, word, pid, _keep: keep })
    }

    /// Whether a word is watched and its process lives: it holds a keeper's id, unmarked.
    pub(crate) fn alive(word: &AtomicU32) -> bool {
        // Acquire: as in `died`.
        let w = word.load(Ordering::Acquire);
        w != 0 && w & OWNER_DIED == 0
    }

    /// Whether a watched word says its process died (the kernel set `OWNER_DIED`).
    pub(crate) fn died(word: &AtomicU32) -> bool {
        // Acquire: pairs with the kernel's store at the death (a locked cmpxchg) and with
        // the Release store in `watch`.
        word.load(Ordering::Acquire) & OWNER_DIED != 0
    }
}

impl Drop for Vigil {
    fn drop(&mut self) {
        if self.pid != crate::shm::current_pid() {
            return; // a forked child's copy: the list is the parent's
        }
        // SAFETY: the word lies in the mapping `_keep` keeps alive.
        let word = unsafe { &*self.word };
        // Cleared first, unlinked after: a death in between leaves a word the kernel does
        // not touch (it no longer holds the keeper's id). Relaxed: as in `watch`.
        word.store(0, Ordering::Relaxed);
        let mut keeper = KEEPER.lock();
        let Some(keeper) = keeper.as_mut() else { return };
        let Some(i) = keeper.links.iter().position(|&l| l == self.link) else { return };
        let next = keeper.links.get(i + 1).copied().unwrap_or_else(head_addr);
        if i == 0 {
            // Relaxed: as in `watch`.
            HEAD.next.store(next, Ordering::Relaxed);
        } else {
            // SAFETY: the previous entry is linked, so its memory is mapped (its `Vigil`
            // lives and unlinks it before its mapping goes); an aligned `AtomicU64`.
            let prev = unsafe { &*(keeper.links[i - 1] as *const AtomicU64) };
            // Relaxed: as in `watch`.
            prev.store(next as u64, Ordering::Relaxed);
        }
        keeper.links.remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::PidLock;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    /// Held by another pid (what a forked child finds when a thread of its parent held the
    /// lock at the fork): taken over at once.
    #[test]
    fn a_lock_held_by_another_process_is_taken_over() {
        let lock = PidLock::new(5);
        let me = std::process::id();
        lock.holder.store(me.wrapping_add(1).max(1), Ordering::Relaxed);
        let t = Instant::now();
        *lock.lock() += 1;
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(lock.holder.load(Ordering::Relaxed), 0, "given back");
        assert_eq!(*lock.lock(), 6);
    }

    /// Held by another thread of this process: waited for, as a mutex is.
    #[test]
    fn a_lock_held_by_another_thread_excludes() {
        const ROUNDS: u64 = if cfg!(miri) { 50 } else { 10_000 };
        let lock = std::sync::Arc::new(PidLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        let mut g = lock.lock();
                        let v = *g;
                        std::hint::black_box(&mut *g);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*lock.lock(), 4 * ROUNDS);
    }
}
