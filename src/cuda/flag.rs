//! A receiver's wait for a host ready flag (`GpuReady::HostFlag`): the sender's stream
//! writes the slot's flag once its writes are done, and the receiver's CPU waits for it, as
//! its `WaitPolicy` says, bounded by the sender's liveness rather than a deadline.

use std::time::{Duration, Instant};

use super::slack::LowTimerSlack;
use crate::liveness::{ProcessState, process_state};
use crate::pool::PoolSegment;
use crate::sync::Ordering;
use crate::wait::WaitPolicy;
use crate::wait::spins::spin_then_yield;

/// Why a flag will not come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlagGone {
    /// The sender gave its pool up (it left, and its device memory with it).
    Retired,
    /// The sender's process has exited.
    Exited,
}

/// Whether a process has exited (gone, or a zombie): then the driver has torn its context
/// down, and no kernel of it can still touch a slot. Unknown counts as not exited.
pub(crate) fn process_exited(pid: u32) -> bool {
    process_state(pid) == ProcessState::Exited
}

/// The fewest spins before a host-flag receive yields or naps: some tens of microseconds,
/// about what a sender's GPU takes to reach a send it has just made. A receiver's
/// [`WaitPolicy`] with more spins gets its own.
const FLAG_SPINS: u32 = 1 << 12;
/// Spinning, the sender is checked once per this many spins (some milliseconds; only a
/// policy with more spins than [`FLAG_SPINS`] gets there).
const FLAG_CHECK_SPINS: u32 = 1 << 18;
/// Once its spins and yields are spent, the wait first naps this long, for
/// [`FLAG_SHORT_NAPS_FOR`], with the thread's timer slack lowered to [`FLAG_NAP_SLACK_NS`].
/// Without MPS a flag comes a GPU context switch after its send (100–200 µs), and at the
/// default slack of 50 µs a nap of 4 µs lasts about 60 µs: the receive would overshoot the
/// flag by tens of microseconds.
const FLAG_SHORT_NAP: Duration = Duration::from_micros(4);
/// How long the short naps go on before the naps double: a few context switches' worth.
/// Not longer: in a VM a short nap is mostly the timer's own exits to the host, and the
/// thread's CPU time while it naps so is more than half its wall time.
const FLAG_SHORT_NAPS_FOR: Duration = Duration::from_micros(500);
/// The timer slack of the short naps, in nanoseconds.
const FLAG_NAP_SLACK_NS: u64 = 1_000;
/// The longest nap of that wait; the sender is checked after each once naps are this long.
const FLAG_NAP_MAX: Duration = Duration::from_millis(1);

/// A host-flag pool's receive: waits until slot `slot`'s ready flag says that the send of
/// `generation` is done (the sender's stream wrote it after the slot's writes, fenced
/// system-wide), as the receiver's `policy` says: spinning (at least [`FLAG_SPINS`] times;
/// for a policy that never sleeps, `u32::MAX` times: minutes), yielding, then napping: naps
/// of 4 µs at a timer slack of 1 µs for [`FLAG_SHORT_NAPS_FOR`] (the thread's own slack is
/// put back after them), then naps doubling up to 1 ms. Not bounded by the receive's
/// deadline (the message is taken, and its writes are under way): it ends when the flag
/// comes, or the pool is retired ([`FlagGone::Retired`]), or the sender's process has
/// exited, taking its GPU work with it ([`FlagGone::Exited`]), which are checked after
/// the short naps, at each nap of 1 ms and every [`FLAG_CHECK_SPINS`] spins. A pid only
/// names the sender's process: a pid reused by another process in the meantime would keep
/// this waiting for a flag that cannot come.
pub(crate) fn wait_ready_flag(
    pool: &PoolSegment,
    slot: u32,
    generation: u64,
    policy: WaitPolicy,
) -> Result<(), FlagGone> {
    let flag = &pool.record(slot).ready;
    // Generations wrap at 32 bits: the flag is at or past `generation` when their
    // difference, as a signed 32-bit number, is not negative. Acquire: pairs with the
    // sender's stream's write of the flag (`cuStreamWriteValue64`, whose default fence
    // orders the stream's earlier writes before it), so the payload is complete once seen.
    let done = || (flag.load(Ordering::Acquire) as u32).wrapping_sub(generation as u32) as i32 >= 0;
    let sender_gone = || {
        if pool.retired() {
            Some(FlagGone::Retired)
        } else if process_exited(pool.owner_pid()) {
            Some(FlagGone::Exited)
        } else {
            None
        }
    };
    // Spinning long (a policy that never sleeps), the sender is checked now and then.
    let mut checks = 0u32;
    let spun = spin_then_yield(
        policy,
        FLAG_SPINS,
        || done().then_some(Ok(())),
        || {
            checks += 1;
            if checks % (FLAG_CHECK_SPINS / 1024) != 0 {
                return None;
            }
            sender_gone().map(Err)
        },
    );
    if let Some(outcome) = spun {
        return outcome;
    }
    {
        let _slack = LowTimerSlack::new(FLAG_NAP_SLACK_NS);
        let napping = Instant::now();
        while napping.elapsed() < FLAG_SHORT_NAPS_FOR {
            if done() {
                return Ok(());
            }
            std::thread::sleep(FLAG_SHORT_NAP);
        }
    }
    let mut nap = FLAG_SHORT_NAP;
    loop {
        if done() {
            return Ok(());
        }
        if nap == FLAG_SHORT_NAP || nap == FLAG_NAP_MAX {
            if let Some(e) = sender_gone() {
                return Err(e);
            }
        }
        nap = (nap * 2).min(FLAG_NAP_MAX);
        std::thread::sleep(nap);
    }
}
