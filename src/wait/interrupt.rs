//! Waits that a signal ends: [`interruptible`].
//!
//! A runtime whose signal handlers only set a flag (CPython's do; so does a Rust program's
//! `signal_hook::flag` handler) must get back to its own code to act on the flag. A sleep
//! in the kernel that a handler interrupts returns `EINTR`; the crate's waits normally go
//! back to sleep then (their deadline is what ends them). Inside [`interruptible`], on the
//! thread that called it, that `EINTR` ends the wait instead, as if its time had run out.

use std::cell::Cell;

thread_local! {
    /// This thread's state: whether it is inside [`interruptible`] (`armed`), and whether a
    /// sleep there was interrupted by a signal since (`hit`).
    static STATE: Cell<State> = const { Cell::new(State { armed: false, hit: false }) };
}

#[derive(Clone, Copy)]
struct State {
    armed: bool,
    hit: bool,
}

/// Runs `f`, during which a blocking wait of this crate with a deadline, on this thread
/// (an endpoint's `send_timeout`, `recv_deadline`, `acquire_timeout`, ...), that a signal
/// handler interrupts returns at once with its `Timeout` error instead of sleeping on until
/// its deadline. The caller then looks at what its handler recorded, and waits again if it
/// is nothing to act on. Nothing already received or sent is lost: the wait ends as it
/// would at its deadline. A form without a deadline (`recv`, `send`) has no such error and
/// sleeps on.
///
/// The interruption is the kernel's: a sleep in `futex` returns `EINTR` when a handler runs
/// on the sleeping thread. So it happens only for a signal delivered to this thread (a
/// process-wide signal such as the terminal's `SIGINT` goes to the main thread when that
/// one does not block it), caught by a handler (a signal that is ignored or blocked
/// interrupts nothing), and installed without `SA_RESTART` (which restarts some sleeps).
/// A signal that arrives while the wait is not asleep (spinning, or between two sleeps)
/// ends nothing: wait in bounded pieces (a `_timeout` form) if that must not go unseen.
///
/// Nesting is allowed; the thread's waits stay interruptible until the outermost call
/// returns. The `select` family (`select_timeout`, ...) and the async forms are not
/// affected: a signal does not end their waits.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ch = gpuring::Channel::builder("jobs").open()?;
/// let rx = ch.receiver()?;
/// # let stop = Arc::new(AtomicBool::new(false)); // a signal handler sets it
/// loop {
///     match gpuring::interruptible(|| rx.recv_timeout(Duration::from_secs(60))) {
///         Ok(msg) => println!("{} bytes", msg.len()),
///         Err(gpuring::RecvTimeoutError::Timeout) if stop.load(Ordering::Relaxed) => break,
///         Err(gpuring::RecvTimeoutError::Timeout) => continue, // another signal, or 60 s
///         Err(e) => return Err(e.into()),
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub fn interruptible<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(State);
    impl Drop for Restore {
        fn drop(&mut self) {
            STATE.with(|s| s.set(self.0));
        }
    }
    let before = STATE.with(|s| s.replace(State { armed: true, hit: false }));
    let _restore = Restore(before);
    f()
}

/// A sleep of this thread returned `EINTR`: whether that ends its wait (inside
/// [`interruptible`]); if so, it is remembered for [`take`].
pub(crate) fn interrupted() -> bool {
    STATE.with(|s| {
        let mut now = s.get();
        if now.armed {
            now.hit = true;
            s.set(now);
        }
        now.armed
    })
}

/// Whether a sleep of this thread was interrupted since the last call (inside
/// [`interruptible`]); clears it.
pub(crate) fn take() -> bool {
    STATE.with(|s| {
        let mut now = s.get();
        let hit = now.hit;
        now.hit = false;
        s.set(now);
        hit
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interruption_counts_inside_interruptible_only_and_is_taken_once() {
        assert!(!interrupted(), "outside: a sleep's EINTR ends nothing");
        assert!(!take());
        interruptible(|| {
            assert!(!take());
            assert!(interrupted());
            interruptible(|| assert!(interrupted(), "nested: still armed"));
            assert!(take());
            assert!(!take(), "taken once");
        });
        assert!(!interrupted(), "disarmed once the outermost call returned");
    }
}
