//! Who is alive, and the one wait loop that asks while it waits.
//!
//! Liveness is never read from shared memory (a peer could forge it) nor from pids alone
//! (they are reused): it is a set of open-file-description locks on bytes of a segment's
//! object, which the kernel drops when the holder's process dies.
//!
//! - **Participants.** Every endpoint (ring producer or consumer, channel sender or
//!   receiver, a pool's free-ring user) registers in the participant table of the ring it
//!   uses: it takes the lock on byte `1 + i` of a free entry `i` (free entries first, so
//!   that a dead endpoint's entry survives as evidence), then writes `role << 32 | pid`
//!   there ([`ParticipantTable::register`]). On drop it clears the entry, then unlocks. An
//!   entry whose value is set and whose lock is gone belongs to an endpoint whose process
//!   died.
//! - **SPSC roles.** An SPSC endpoint also claims its role in the ring header with a CAS
//!   of 0 → pid; a second claimant gets [`AttachError::RoleTaken`] while the holder lives,
//!   and takes a dead holder's role over ([`Attachment`]).
//! - **The process probe** ([`process_state`]): where a pid is all there is (pool owners
//!   in tools; a dead receiver's GPU context, which lives until its process has exited).
//! - **Departures.** A clean detach clears the entry (so it is no evidence of a death) and
//!   takes one off the ring header's attach count of its side; the other side reads that
//!   count as a hint that every peer has left ([`Watch::maybe_left`]) and confirms it with
//!   the locks ([`Watch::gone`]): every peer gone and none dead is [`Gone::Left`]
//!   (`Disconnected` to users), any dead is [`Gone::Died`] (`PeerDead`).
//! - **[`Watch`]**: what a ring's storage can say about its peers. Heap rings say nothing
//!   ([`Unwatched`]); rings in shared memory answer from their [`Attachment`].
//! - **The tick loop** ([`block_on`]): every blocking call of the crate waits in it,
//!   waking every [`LIVENESS_TICK`] to ask whether the memory was damaged, to let the
//!   caller repair what dead peers left, and to give up with `PeerDead` once every peer it
//!   waits for has died, or `Disconnected` once they have all left; a departure seen by
//!   the attach count ends the wait at once. Where the process watches the segment's
//!   closes ([`Watch::closes`]), the sleep also wakes at a close (a death), and a consumer
//!   whose peers were found alive ticks only every [`IDLE_TICK`].
//!
//! Liveness is asked by the rings, pools, channels and tools and asks none of them: ring
//! work that a dead endpoint leaves (MPMC cells it won) is done by the ring layer, which
//! hands it in as callbacks.

use std::io;
use std::time::Duration;

use crate::layout::{Corrupted, PARTICIPANT_CONSUMER, PARTICIPANT_PRODUCER};
use crate::wait::{
    Deadline, Sleeper, TimedOut, WaitWord, Waits, notify, take_interruption, wait_until,
};

mod claims;
#[cfg(not(loom))]
pub(crate) mod keeper;
#[cfg(not(loom))]
mod participants;
mod process;

pub use claims::{ClaimLine, ClaimLock};
#[cfg(not(loom))]
pub use participants::Attachment;
#[cfg(not(loom))]
pub(crate) use participants::{AttachAs, ParticipantTable, RingParts};
pub use process::{ProcessState, process_state};

/// How often a blocked endpoint of a ring in shared memory checks that its peers live: a
/// death is noticed within this (plus one probe of the participant table).
pub const LIVENESS_TICK: Duration = Duration::from_millis(30);

/// How often a receiver (a ring consumer) whose wait for a message found its peers alive
/// (a [`LIVENESS_TICK`] into it, or an earlier wait's probe) checks them from then on,
/// where the kernel tells this process of closes of the ring's segment (inotify, and
/// `futex_waitv`: Linux ≥ 5.16). A peer's death closes its descriptors, and that close
/// wakes the waiter to probe at once, so deaths are noticed sooner than by the tick; the
/// tick only backs that up (a peer that is exiting but has not closed its descriptors yet,
/// as a GPU process may for seconds, is found by the tick's probe). An idle receiver then
/// makes one wake-up every four seconds instead of one every [`LIVENESS_TICK`]. Senders
/// waiting for room keep the [`LIVENESS_TICK`] (slots of a dead receiver can come back
/// later than its close: a GPU context lives until its process has exited), woken by
/// closes too.
pub const IDLE_TICK: Duration = Duration::from_secs(4);

/// A side of a ring, and the role an endpoint plays on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A producer (a channel's sender; a pool's receivers, which put slots back).
    Producer,
    /// A consumer (a channel's receiver; a pool's sender, which takes slots out).
    Consumer,
}

impl Role {
    /// The participant table's code for this role.
    fn code(self) -> u32 {
        match self {
            Role::Producer => PARTICIPANT_PRODUCER,
            Role::Consumer => PARTICIPANT_CONSUMER,
        }
    }
}

/// Why an endpoint could not attach to a ring.
#[derive(Debug)]
#[non_exhaustive]
pub enum AttachError {
    /// Every entry of the ring's participant table is held by a live endpoint.
    TooManyParticipants {
        /// Entries in the table.
        max: u32,
    },
    /// Another live endpoint holds this SPSC role.
    RoleTaken {
        /// The role asked for.
        role: Role,
        /// The pid recorded by the holder (diagnostic only).
        holder_pid: u32,
    },
    /// The ring's positions are impossible.
    Corrupted(Corrupted),
    /// A lock operation failed.
    Io {
        /// The operation, e.g. `"fcntl(F_OFD_SETLK)"`.
        op: &'static str,
        /// The error.
        source: io::Error,
    },
}

impl core::fmt::Display for AttachError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AttachError::TooManyParticipants { max } => {
                write!(f, "all {max} participant entries of the ring are held by live endpoints")
            }
            AttachError::RoleTaken { role, holder_pid } => {
                let (one, end) = match role {
                    Role::Producer => ("producer", "sender"),
                    _ => ("consumer", "receiver"),
                };
                let who = if *holder_pid == std::process::id() {
                    "this process".to_owned()
                } else {
                    format!("pid {holder_pid}")
                };
                write!(
                    f,
                    "an SPSC ring or channel has one {one} ({end}), and {who} holds it: drop \
                     that one first, or make the channel with `.mpmc()` (an `MpmcRing` for a \
                     ring) for several"
                )
            }
            AttachError::Corrupted(c) => c.fmt(f),
            AttachError::Io { op, source } => write!(f, "{op} failed: {source}"),
        }
    }
}

io_error_source!(AttachError);

error_from!(AttachError { Corrupted(Corrupted) });

/// How every endpoint of one side of a ring is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// Every one that attached has detached cleanly (and none is attached now).
    Left,
    /// None is attached now, and at least one died attached (its lock went with its
    /// process).
    Died,
}

/// Endpoints of one side of a ring, as the participant table and the liveness locks say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerCount {
    /// Entries whose lock is held: live endpoints.
    pub live: u32,
    /// Entries whose lock is gone: endpoints whose process died.
    pub dead: u32,
}

// ---------------------------------------------------------------------------------------
// What a ring asks

/// What a ring's storage knows of the endpoints attached to it: asked by the ring
/// algorithms while they wait (never on the fast path, except [`claims`](Self::claims)),
/// and by pools about the holders of their slots.
///
/// Heap rings know nothing ([`Unwatched`]); rings in shared memory answer from their
/// endpoint's attachment (its participant entry and lock). Models and tests implement it to
/// play dead peers.
pub trait Watch {
    /// Whether [`gone`](Self::gone) can ever answer: then blocked endpoints wake every
    /// [`LIVENESS_TICK`] to ask.
    const WATCHES: bool;
    /// Whether the endpoints of `role` are all gone, and how: `None` while one lives (or
    /// none has come yet). Probes locks: slow paths only.
    fn gone(&self, role: Role) -> Option<Gone> {
        let _ = role;
        None
    }
    /// A hint, one load: whether every endpoint of `role` may have left (the attach count
    /// of its side is 0, and one had come). Asked on every failed attempt of a wait; only
    /// [`gone`](Self::gone) says it is so.
    #[inline(always)]
    fn maybe_left(&self, role: Role) -> bool {
        let _ = role;
        false
    }
    /// Whether the memory itself is known to be damaged (a segment that another process
    /// truncated under us).
    fn damaged(&self) -> Option<Corrupted> {
        None
    }
    /// Where this process counts closes of the segment (inotify, read by the watcher
    /// thread), where a sleep can wait on them beside its own word (`futex_waitv`): the
    /// count's futex word, and this endpoint's record of the count at which its last probe
    /// found its peers alive and nothing to do (`u64::MAX`: none yet; peers alive at
    /// count `n` are alive while it stays `n`: a death is a close). `None`: the wait ticks
    /// every [`LIVENESS_TICK`] instead. Slow paths only (the first call starts the
    /// process's watcher thread).
    fn closes(&self) -> Option<(&std::sync::atomic::AtomicU32, &std::sync::atomic::AtomicU64)> {
        None
    }
    /// This endpoint's claim line, where an MPMC endpoint names each run of positions it
    /// is about to win, and the lock its clones share (see [`ClaimLine`]). Read on every
    /// MPMC push and pop: keep it field accesses.
    #[inline(always)]
    fn claims(&self) -> Option<ClaimLine<'_>> {
        None
    }
    /// Whether an unfinished MPMC cell at position `pos` on `role`'s side was left by an
    /// endpoint that died: a dead endpoint's claim line names `pos` and no live one's does.
    /// Callers read the side's position counter with Acquire first (so that a live
    /// winner's claim, stored before its winning CAS, is seen). Probes locks: slow paths
    /// only.
    fn orphaned(&self, role: Role, pos: u64) -> bool {
        let _ = (role, pos);
        false
    }
    /// As [`orphaned`](Self::orphaned) for a consumer cell, asked by an adopter that holds
    /// its own claim line's lock (so no clone of it is mid-run) and has named `pos` in its
    /// line: its own line does not count, every other one does.
    fn orphaned_but_mine(&self, pos: u64) -> bool {
        let _ = pos;
        false
    }
    /// This endpoint's identity in its ring's participant table (see
    /// [`ParticipantId`](crate::layout::ParticipantId)).
    fn id(&self) -> Option<u32> {
        None
    }
    /// Whether the endpoint that `id` names is gone: `None` while it lives; `Some(pid)`
    /// when it died holding its entry (the pid it recorded), `Some(None)` when its entry
    /// was cleared or registered again since. Probes a lock: slow paths only.
    fn id_gone(&self, id: u32) -> Option<Option<u32>> {
        let _ = id;
        None
    }
}

/// Storage that watches nobody (rings on the heap): every answer is "alive".
#[derive(Debug, Clone, Copy, Default)]
pub struct Unwatched;

impl Watch for Unwatched {
    const WATCHES: bool = false;
}

// ---------------------------------------------------------------------------------------
// The tick loop

/// Why a blocking operation gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// The deadline passed (with [`Deadline::Now`]: the one attempt failed).
    Timeout,
    /// Every endpoint of the side waited for has left cleanly.
    Disconnected,
    /// Every endpoint of the side waited for is gone, and one died attached.
    PeerDead,
    /// The shared state is impossible.
    Corrupted(Corrupted),
}

impl From<Gone> for Blocked {
    fn from(gone: Gone) -> Self {
        match gone {
            Gone::Left => Blocked::Disconnected,
            Gone::Died => Blocked::PeerDead,
        }
    }
}

/// Whether every endpoint of `role` has gone, as `watch` says: the one-load hint first,
/// then, only when it says so, the locks. For the non-blocking forms, and for senders that
/// refuse to send into a ring nobody will read.
#[inline]
pub(crate) fn departed<W: Watch>(watch: &W, role: Role) -> Option<Blocked> {
    if watch.maybe_left(role) { watch.gone(role).map(Blocked::from) } else { None }
}

/// What the caller's work at a liveness tick came to.
pub(crate) enum Tick<R> {
    /// It finished the operation (e.g. adopted a dead consumer's element).
    Done(R),
    /// It changed something the operation waits for (e.g. took back a dead holder's slot):
    /// try again now.
    Retry,
    /// Nothing to do.
    Idle,
    /// The operation cannot succeed (e.g. a sender waiting for a slot found every receiver
    /// of its channel gone): end the wait with this, after one last attempt.
    Stop(Blocked),
}

/// The blocking form of a non-blocking operation: retries `attempt` (which returns
/// `Ok(Some(r))` on success, `Ok(None)` to wait) as `waits` says, sleeping on `wait_on`,
/// until `deadline`; after a success, wakes the other side's sleepers on `wake`.
///
/// The first attempt reads no clock, and with [`Deadline::Now`] it is the only one. After
/// every failed attempt the watch's departure hint is read (one load); when it says the
/// side `waits_for` has left and the locks confirm it, one last attempt takes what they
/// left, and the wait ends [`Blocked::Disconnected`] (or `PeerDead`, if one of them died).
/// A hint the locks refute is not asked again before the next tick. Storage that watches
/// its peers is asked, every [`LIVENESS_TICK`] of waiting, whether its memory is damaged
/// (the wait ends `Corrupted`); then `on_tick` does the caller's slow-path work (MPMC: skip
/// the cells of dead producers, adopt the elements of dead consumers; a pool: take back the
/// slots of dead receivers); then, past the deadline, one last attempt before
/// [`Blocked::Timeout`]; then, if the side `waits_for` is all gone, one last attempt takes
/// what they left, and the wait ends with [`Blocked::PeerDead`] or
/// [`Blocked::Disconnected`].
#[allow(clippy::too_many_arguments)] // the one place the waiting policy is written
pub(crate) fn block_on<W: Watch, R>(
    watch: &W,
    waits_for: Role,
    wait_on: &WaitWord,
    wake: &WaitWord,
    waits: &Waits,
    deadline: Deadline,
    mut attempt: impl FnMut() -> Result<Option<R>, Corrupted>,
    mut on_tick: impl FnMut() -> Tick<R>,
) -> Result<R, Blocked> {
    let done = |r| {
        // Not fenced, on the hot path (a first attempt that succeeds ends here): where `wake`
        // is a word whose sleepers register without the heavy barrier (a broadcast ring's
        // `not_empty`), the attempt that published ran `notify_fenced` itself.
        notify(wake);
        Ok(r)
    };
    // Whether the side waited for has gone: the hint (one load), confirmed by the locks. A
    // refuted hint (a peer attaching right now, or a forged count) is not asked again until
    // the next tick, so that a wrong count cannot turn the wait into a loop of syscalls.
    let refuted = std::cell::Cell::new(false);
    let gone = || {
        if refuted.get() || !watch.maybe_left(waits_for) {
            return None;
        }
        let gone = watch.gone(waits_for);
        refuted.set(gone.is_none());
        gone.map(Blocked::from)
    };
    // Every failed attempt also reads the hint, so a departure ends the wait at once. The
    // departing endpoint wakes sleepers after taking itself off the count.
    let mut attempt = || match attempt() {
        Ok(Some(r)) => Some(Ok(r)),
        Ok(None) => gone().map(Err),
        Err(c) => Some(Err(Blocked::Corrupted(c))),
    };
    // What the side waited for left behind is taken before its departure is reported
    // (the attempt that read the hint ran before the hint was read). Where no tick ran
    // since, one tick's work too (`with_tick`): an endpoint of this side that died may have
    // left something of the departed side's in the ring (an MPMC consumer's won cell, which
    // only a tick adopts), and that is theirs as much as what is queued.
    let last = |attempt: &mut dyn FnMut() -> Option<Result<R, Blocked>>,
                with_tick: Option<&mut dyn FnMut() -> Tick<R>>,
                why: Blocked| {
        match attempt() {
            Some(Ok(r)) => return done(r),
            Some(Err(Blocked::Corrupted(c))) => return Err(Blocked::Corrupted(c)),
            _ => {}
        }
        match with_tick.filter(|_| W::WATCHES).map(|t| t()) {
            Some(Tick::Done(r)) => done(r),
            Some(Tick::Retry) => match attempt() {
                Some(Ok(r)) => done(r),
                Some(Err(Blocked::Corrupted(c))) => Err(Blocked::Corrupted(c)),
                _ => Err(why),
            },
            _ => Err(why),
        }
    };
    match attempt() {
        Some(Ok(r)) => return done(r),
        Some(Err(Blocked::Corrupted(c))) => return Err(Blocked::Corrupted(c)),
        Some(Err(why)) => return last(&mut attempt, Some(&mut on_tick), why),
        None if deadline == Deadline::Now => return Err(Blocked::Timeout),
        None => {}
    }
    // A mark an earlier wait's interrupted sleep left (one that ended otherwise) is not
    // this wait's.
    take_interruption();
    if !W::WATCHES {
        let mut sleeper = Sleeper::of(wait_on, waits);
        return match wait_until(&mut sleeper, waits, true, deadline, None, &mut attempt) {
            Ok(Ok(r)) => done(r),
            Ok(Err(Blocked::Corrupted(c))) => Err(Blocked::Corrupted(c)),
            Ok(Err(why)) => last(&mut attempt, None, why),
            Err(TimedOut) => Err(Blocked::Timeout),
        };
    }
    // The slow-path work of one tick: `Some` when it ended the wait.
    let tick = |attempt: &mut dyn FnMut() -> Option<Result<R, Blocked>>,
                on_tick: &mut dyn FnMut() -> Tick<R>| {
        if let Some(c) = watch.damaged() {
            return Some(Err(Blocked::Corrupted(c)));
        }
        match on_tick() {
            Tick::Done(r) => return Some(done(r)),
            Tick::Retry => match attempt() {
                Some(Ok(r)) => return Some(done(r)),
                Some(Err(Blocked::Corrupted(c))) => return Some(Err(Blocked::Corrupted(c))),
                Some(Err(why)) => return Some(last(attempt, None, why)),
                None => {}
            },
            Tick::Idle => {}
            Tick::Stop(why) => return Some(last(attempt, None, why)),
        }
        refuted.set(false);
        None
    };
    if deadline == Deadline::Tick {
        // One tick, and the probe of the side waited for, then give up.
        if let Some(end) = tick(&mut attempt, &mut on_tick) {
            return end;
        }
        return match watch.gone(waits_for) {
            Some(gone) => last(&mut attempt, None, gone.into()),
            None => Err(Blocked::Timeout),
        };
    }
    // Spin (and yield) at the start of the wait only: a waiter woken by its tick's timeout
    // goes back to sleep at once (an idle receiver's ticks then cost a few syscalls each).
    let mut first = true;
    // Registered at the first sleep, and until the wait ends: the ticks' sleeps after the
    // first need no heavy barrier (`wait::Sleeper`).
    let mut sleeper = Sleeper::of(wait_on, waits);
    // Where the kernel tells of the segment's closes (`Watch::closes`): the close events
    // as the last probe that found nothing to do saw them. The sleep then also wakes at a
    // close (a peer may have died: the tick probes at once), so a consumer waiting for
    // messages, which has nothing else a tick must do soon, ticks only every `IDLE_TICK`;
    // one whose endpoint's last quiet probe (an earlier wait's) saw the count the segment
    // still shows, less than an `IDLE_TICK` ago, sleeps so from the start, and its deadline
    // ends the wait without a tick (a caller that waits in slices, as Python does, would
    // otherwise probe at every slice).
    let consumer = waits_for == Role::Producer;
    let mut word = None;
    let mut closes = None;
    if consumer {
        if let Some((events, clear_at)) = *word.get_or_insert_with(|| watch.closes()) {
            closes = crate::wait::close_events(events)
                .filter(|&seen| quiet::holds(clear_at, seen))
                .map(|seen| (events, seen));
        }
    }
    // A tick's sleep that a signal cut short, in a wait with no deadline: slept on to its end.
    let mut resume = None;
    loop {
        let idle = consumer && closes.is_some();
        let chunk = resume
            .take()
            .unwrap_or_else(|| deadline.or_within(if idle { IDLE_TICK } else { LIVENESS_TICK }));
        let waited = wait_until(&mut sleeper, waits, first, chunk, closes, &mut attempt);
        first = false;
        match waited {
            Ok(Ok(r)) => return done(r),
            Ok(Err(Blocked::Corrupted(c))) => return Err(Blocked::Corrupted(c)),
            Ok(Err(why)) => return last(&mut attempt, Some(&mut on_tick), why),
            // A signal handler ran on this thread inside `interruptible`: a wait with a
            // deadline ends now, as at its deadline (its caller looks at what the handler
            // did); one without sleeps on to the same tick.
            Err(TimedOut) if deadline != Deadline::Never && take_interruption() => {
                return last(&mut attempt, None, Blocked::Timeout);
            }
            Err(TimedOut) if take_interruption() && !chunk.passed() => resume = Some(chunk),
            Err(TimedOut) => {
                // Read before the probes: a close after them wakes the next sleep.
                let at = *word.get_or_insert_with(|| watch.closes());
                let seen = at.and_then(|(events, clear_at)| {
                    crate::wait::close_events(events).map(|seen| (events, seen, clear_at))
                });
                let quiet = seen.is_some_and(|(_, seen, clear_at)| quiet::holds(clear_at, seen));
                if consumer && quiet && deadline.passed() {
                    return last(&mut attempt, None, Blocked::Timeout);
                }
                if let Some(end) = tick(&mut attempt, &mut on_tick) {
                    return end;
                }
                if deadline.passed() {
                    // One last attempt: the tick's work may just have unblocked us.
                    return last(&mut attempt, None, Blocked::Timeout);
                }
                if let Some(gone) = watch.gone(waits_for) {
                    // What the gone published before going is in the ring: take it first.
                    return last(&mut attempt, None, gone.into());
                }
                if let Some((_, seen, clear_at)) = seen {
                    quiet::record(clear_at, seen);
                }
                closes = seen.map(|(events, seen, _)| (events, seen));
            }
        }
    }
}

/// An endpoint's record of its last quiet probe (its peers alive, nothing to do): the
/// segment's close count then (low 32 bits) and when, in ms of this process's clock (high
/// 32 bits), in the `AtomicU64` of [`Watch::closes`] (`u64::MAX`: none yet).
mod quiet {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    use super::IDLE_TICK;

    /// This process's clock, in ms (wrapping after 49 days: a wrapped record is at worst
    /// one needless probe, or one skipped for less than an `IDLE_TICK`).
    fn now_ms() -> u32 {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_millis() as u32
    }

    /// Whether the last quiet probe saw close count `seen`, less than an `IDLE_TICK` ago.
    pub(super) fn holds(clear_at: &AtomicU64, seen: u32) -> bool {
        // Relaxed: the endpoint's own record of its probes; a stale value costs a probe.
        let v = clear_at.load(Ordering::Relaxed);
        v != u64::MAX
            && v as u32 == seen
            && u128::from(now_ms().wrapping_sub((v >> 32) as u32)) < IDLE_TICK.as_millis()
    }

    /// Records a quiet probe at close count `seen`, now.
    pub(super) fn record(clear_at: &AtomicU64, seen: u32) {
        // Relaxed: see `holds`.
        clear_at.store(u64::from(now_ms()) << 32 | u64::from(seen), Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn now_is_one_attempt_and_never_sleeps() {
        let word = WaitWord::new();
        let mut tries = 0;
        let r: Result<(), _> = block_on(
            &Unwatched,
            Role::Producer,
            &word,
            &word,
            &Waits::default(),
            Deadline::Now,
            || {
                tries += 1;
                Ok(None)
            },
            || Tick::Idle,
        );
        assert_eq!(r, Err(Blocked::Timeout));
        assert_eq!(tries, 1);
        assert_eq!(word.sleepers(), 0);
    }
}
