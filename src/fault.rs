//! Fault injection for crash tests (cargo feature `fault-injection`; without it every point
//! is an empty inline function).
//!
//! `GPURING_FAULT=<point>:<n>` makes this process kill itself with SIGKILL at the `n`-th
//! time (1-based) it reaches `<point>`, after writing `GPURING:fault <point> <ns>` to stdout
//! (flushed; `<ns>`: `CLOCK_MONOTONIC` in nanoseconds), so that a test can prove where and
//! when the death happened. Points:
//!
//! | point | where |
//! |---|---|
//! | `push_after_write` | SPSC push: the cell written, `tail` not yet published |
//! | `push_won` | MPMC push: its claim named, the CAS on `tail` won, the cell not yet written |
//! | `pop_won` | MPMC pop: its claim named, the CAS on `head` won, the cell not yet read |
//! | `adopt_won` | MPMC adoption: a dead consumer's cell taken (named, stamped adopted), not yet read or freed |
//! | `push_after_claim` | MPMC push: the cell claimed (CAS on `tail` won), not yet written |
//! | `push_before_publish` | MPMC push: the cell written, its stamp not yet stored |
//! | `pop_after_claim` | MPMC pop: the cell claimed (CAS on `head` won), not yet read or freed |
//! | `inside_wake` | a publisher waking sleepers: the epoch bumped, the futex not yet woken |
//! | `send_holding_lease` | a sender: a slot leased, not yet sent |
//! | `recv_holding` | a receiver: a slot taken (HELD), the message not yet returned |
//! | `recv_popped` | a receiver: the descriptor out of the ring, the message not yet returned |
//! | `redeliver_holding` | a receiver: a dead receiver's message taken over, not yet returned |
//! | `refused_holding` | a receiver refusing a message (a gone GPU sender's): its slot taken, the descriptor not yet out of the ring |
//! | `release_marked` | a slot given back: marked RETURNING, not yet on the free ring |
//! | `pool_made` | a sender registering: its entry claimed and its pool made, not yet `ACTIVE` |

/// Reaches fault point `name`.
#[cfg(all(feature = "fault-injection", not(loom)))]
#[inline(never)]
pub(crate) fn point(name: &'static str) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PLAN: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let plan = PLAN.get_or_init(|| {
        let v = std::env::var("GPURING_FAULT").ok()?;
        let (point, n) = v.split_once(':')?;
        Some((point.to_owned(), n.parse().ok()?))
    });
    let Some((point, n)) = plan else { return };
    // Relaxed: a per-process count; the kill needs no ordering with anything.
    if point == name && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let ns = t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64;
        let _ = writeln!(out, "GPURING:fault {name} {ns}");
        let _ = out.flush();
        let me = rustix::process::getpid();
        let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; if the kill failed, stop here anyway.
        std::process::abort();
    }
}

/// Reaches fault point `name` (fault injection is not built in: nothing).
#[cfg(not(all(feature = "fault-injection", not(loom))))]
#[inline(always)]
pub(crate) fn point(_name: &'static str) {}
