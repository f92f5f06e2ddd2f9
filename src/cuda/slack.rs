//! A thread's timer slack: how late the kernel may end its sleeps (50 µs by default for a
//! normal thread), which stretches a nap of a few microseconds tenfold. The waits that nap
//! on the GPU (a host ready flag, a pinned lane's event) lower it for their naps.

/// The calling thread's timer slack (how late the kernel may end its sleeps, 50 µs by
/// default) lowered until the guard drops, then put back. Best effort: a slack that cannot
/// be read or set, or is already as low, is left as it is, and naps are only longer.
pub(crate) struct LowTimerSlack(Option<u64>);

impl LowTimerSlack {
    pub(crate) fn new(ns: u64) -> Self {
        match timer_slack() {
            Some(old) if old > ns && set_timer_slack(ns) => Self(Some(old)),
            _ => Self(None),
        }
    }
}

impl Drop for LowTimerSlack {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            set_timer_slack(old);
        }
    }
}

/// This thread's timer slack in nanoseconds, or `None` where it cannot be read.
pub(crate) fn timer_slack() -> Option<u64> {
    // SAFETY: PR_GET_TIMERSLACK reads the calling thread's slack; it takes no pointer and
    // returns the slack (a `long`, through the raw syscall, so no value is cut to `int`).
    let ns = unsafe { libc::syscall(libc::SYS_prctl, libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    u64::try_from(ns).ok().filter(|&ns| ns > 0)
}

/// Sets this thread's timer slack to `ns` (> 0: zero would mean the thread's default);
/// whether it took.
pub(crate) fn set_timer_slack(ns: u64) -> bool {
    debug_assert!(ns > 0);
    let ns = libc::c_ulong::try_from(ns).unwrap_or(libc::c_ulong::MAX);
    // SAFETY: PR_SET_TIMERSLACK takes a number of nanoseconds and changes the calling
    // thread only; it takes no pointer.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "prctl is not available under Miri")]
    fn a_lowered_slack_is_put_back() {
        // A thread of its own: the slack is per thread, and the test harness's may differ.
        std::thread::spawn(|| {
            let before = timer_slack().expect("PR_GET_TIMERSLACK");
            assert!(set_timer_slack(50_000));
            {
                let _low = LowTimerSlack::new(1_000);
                assert_eq!(timer_slack(), Some(1_000));
            }
            assert_eq!(timer_slack(), Some(50_000));
            // Already as low: left alone, and still so after.
            assert!(set_timer_slack(500));
            drop(LowTimerSlack::new(1_000));
            assert_eq!(timer_slack(), Some(500));
            assert!(set_timer_slack(before));
        })
        .join()
        .unwrap();
    }
}
