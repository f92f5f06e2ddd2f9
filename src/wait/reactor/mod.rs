//! Async waits (feature `async`): futures that park on the same shared wait words as the
//! blocking calls, woken by one waiter thread per 127 parked futures that sleeps on all of
//! their words at once (`futex_waitv`, Linux ≥ 5.16), and told of peer deaths by one watcher
//! thread reading inotify close events of the segments they wait on.
//!
//! **Parking.** A future whose operation cannot proceed does what a blocking sleeper does,
//! in the same order — `sleepers += 1`, the heavy barrier, read the epoch, try once more —
//! and then, instead of `futex_wait`, hands (word, epoch, waker) to a [`Shard`]. The shard's
//! thread `futex_waitv`s on its control word and every parked word; when a word's epoch has
//! moved (a publisher's `notify` saw the sleeper and woke the futex), it takes the entry
//! out, gives the sleeper count back and wakes the task, which tries again. Whoever takes
//! an entry out (the thread after a wake, or the future when it is polled again or dropped)
//! gives its `sleepers` back, so the count is right even for a future that is leaked.
//! Entries hold a reference on the mapping of their word (`KeepAlive`): the thread reads a
//! word only while its entry is in the table, and the mapping cannot go before the entry.
//!
//! **Liveness.** A blocking call probes its peers every `LIVENESS_TICK`; a thousand parked
//! futures doing that would burn a core. A peer that dies closes its descriptor of the
//! segment (the kernel does it), and inotify reports the close: the watcher thread counts
//! closes per segment and wakes the futures parked on it, which then probe once (the
//! blocking form's tick, `Deadline::Tick`). An endpoint also probes the first time it parks,
//! and not again until the segment's close count moves (see `Park`). An idle process with
//! parked futures makes no syscall and uses no CPU. Where inotify is refused, futures fall
//! back to probing every `LIVENESS_TICK`.
//!
//! The fast path (the operation succeeds at once) touches none of this.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32 as StdAtomicU32, AtomicU64, Ordering as StdOrdering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rustix::thread::futex;

use super::{DEGRADED_RECHECK, Deadline, WaitWord};
use crate::sync::Ordering;

/// A reference that keeps the mapping of a parked word alive (the endpoint's segment).
pub(crate) type KeepAlive = Arc<dyn Send + Sync>;

/// How long a future parked on a segment that inotify cannot watch goes between probes
/// of its peers (the blocking calls' tick).
const UNWATCHED_TICK: Duration = Duration::from_millis(30);

/// Parked futures per waiter thread: `futex_waitv` takes at most 128 words, one of which
/// is the thread's control word.
const SHARD_SIZE: usize = 127;

/// Locks `m`, carrying on past a poisoned lock: every critical section below leaves the
/// table consistent at each step, so a panic in a waker cannot break it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

mod any;
mod closes;
mod park;
mod select;
mod shard;

pub(crate) use any::*;
pub(crate) use closes::*;
pub use park::*;
pub use select::*;
use shard::*;
