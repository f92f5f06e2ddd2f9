//! The guard against `SIGBUS` from a segment that another process truncated.
//!
//! POSIX shared-memory objects cannot be sealed, so a process of the same user can shrink
//! one after we mapped it; touching a page beyond the new end then raises `SIGBUS`
//! (`BUS_ADRERR`), which would kill the process. Sizes are checked at attach; this covers
//! what happens after.
//!
//! Every mapping a [`Segment`](crate::shm::Segment) makes is registered in a fixed table.
//! On the first registration a `SIGBUS` handler is installed. When a fault's address lies
//! in a registered mapping, the handler maps a private zero page over the faulting page
//! (the access is then retried and reads zeros, which the ring and pool checks treat as
//! the untrusted values they are) and marks the mapping damaged, which blocked endpoints
//! report as `Corrupted` at their next liveness tick. A fault anywhere else, or of another
//! kind, goes to the handler that was installed before ours (or the default action, which
//! ends the process as it would have without us).
//!
//! The handler only loads atomics and makes raw `mmap`/`sigaction` system calls, which is
//! what a signal handler may do. A table that is full (more than [`SLOTS`] mappings at
//! once) leaves the extra mappings unguarded.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Mappings guarded at once.
pub(crate) const SLOTS: usize = 4096;

/// `base` of a slot being filled in (its `len` not yet written).
const RESERVED: usize = usize::MAX;

struct Slot {
    /// Start of the mapping; 0 when the slot is free.
    base: AtomicUsize,
    len: AtomicUsize,
    /// A fault in this mapping was repaired with a zero page.
    damaged: AtomicBool,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot { base: AtomicUsize::new(0), len: AtomicUsize::new(0), damaged: AtomicBool::new(false) }
}; SLOTS];

/// The `SIGBUS` action before ours, recorded before ours is installed.
static PREVIOUS: OnceLock<Previous> = OnceLock::new();
/// The page size once our handler is installed; 0 before (or if installing failed).
static PAGE: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

struct Previous(libc::sigaction);

// SAFETY: a plain C struct (a function address, flags and a mask); it is written once
// before the handler can run and only read after.
unsafe impl Sync for Previous {}
// SAFETY: as above.
unsafe impl Send for Previous {}

/// A registered mapping; unregisters on drop (before the caller unmaps).
#[derive(Debug)]
pub(crate) struct Guard {
    slot: usize,
}

impl Guard {
    /// Whether a fault in this mapping was repaired (the object was truncated under us).
    pub(crate) fn damaged(&self) -> bool {
        // Relaxed: a flag set by the handler of some thread; the caller only reports it.
        TABLE[self.slot].damaged.load(Ordering::Relaxed)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Release: pairs with the Acquire load in `register` of the next user of the slot.
        TABLE[self.slot].base.store(0, Ordering::Release);
    }
}

/// Guards the mapping `[base, base + len)`, installing the handler if it is not yet; `None`
/// when the table is full or the handler cannot be installed.
pub(crate) fn register(base: *mut u8, len: usize) -> Option<Guard> {
    INSTALL.call_once(install);
    // Acquire: pairs with the Release store in `install`.
    if PAGE.load(Ordering::Acquire) == 0 {
        return None;
    }
    for (i, slot) in TABLE.iter().enumerate() {
        // Acquire: pairs with the Release in `Guard::drop` of the slot's last user.
        if slot.base.compare_exchange(0, RESERVED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            slot.len.store(len, Ordering::Relaxed);
            slot.damaged.store(false, Ordering::Relaxed);
            // Release: pairs with the handler's Acquire load of `base`: it sees `len` set.
            slot.base.store(base as usize, Ordering::Release);
            return Some(Guard { slot: i });
        }
    }
    None
}

fn install() {
    // SAFETY: sysconf is always safe to call.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0);
    // SAFETY: zeroed `sigaction`s are valid (no handler, empty mask, no flags); the calls
    // read `new` and write `old`, both live locals.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if page == 0 || libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
            return;
        }
        // Recorded before ours is installed, so the handler always finds it.
        let _ = PREVIOUS.set(Previous(old));
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = on_sigbus as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut new.sa_mask);
        if libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) == 0 {
            // Release: pairs with the Acquire loads in `register` and the handler.
            PAGE.store(page, Ordering::Release);
        }
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; `si_addr` reads
    // the fault address of this SIGBUS.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // Acquire: pairs with the Release store in `install`.
    let page = PAGE.load(Ordering::Acquire);
    if code == libc::BUS_ADRERR && page != 0 {
        for slot in &TABLE {
            // Acquire: pairs with the Release store in `register` (`len` is set).
            let base = slot.base.load(Ordering::Acquire);
            if base == 0 || base == RESERVED {
                continue;
            }
            let len = slot.len.load(Ordering::Relaxed);
            if addr < base || addr - base >= len {
                continue;
            }
            let at = addr & !(page - 1);
            // SAFETY: replaces one page of a mapping this process made and still has
            // (its slot is registered until just before it is unmapped) with private
            // zeroed memory; nothing else is mapped there. A raw system call.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                // Relaxed: a flag for `Guard::damaged`, read at the next tick.
                slot.damaged.store(true, Ordering::Relaxed);
                return; // the access is retried, on the zero page
            }
            break;
        }
    }
    // Not ours: to the handler before us, or the default action (the access faults again
    // and the default ends the process, as without this guard).
    match PREVIOUS.get() {
        Some(Previous(prev))
            if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN =>
        {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous SA_SIGINFO handler, called as the kernel would.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the previous plain handler, called as the kernel would.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: resets SIGBUS to its default action; a raw system call.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        }
    }
}
