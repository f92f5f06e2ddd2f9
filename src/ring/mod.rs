//! The ring algorithms, written once and generic over where the ring lives.
//!
//! - [`spsc`]: single producer, single consumer. Lamport's ring: the producer alone writes
//!   `tail`, the consumer alone writes `head`, and each side caches the other's position so
//!   that it touches the shared line only when the ring looks full (or empty).
//! - [`mpmc`]: bounded multi-producer multi-consumer queue with a stamp per cell (Vyukov's
//!   design, as in crossbeam's `ArrayQueue`): producers race for `tail` and consumers for
//!   `head` with compare-and-swap, and a cell's stamp says whether it awaits a write or a
//!   read.
//!
//! A ring lives in a [`Storage`]: [`Heap`] (an `Arc`'d allocation, used by loom, Miri,
//! unit tests and in-process use) or the shared-memory storage in
//! [`crate::named`]. Elements are [`bytemuck::Pod`]: any bit pattern is a valid value, so a
//! cell written by a hostile peer is garbage, never undefined behaviour.
//!
//! Every position read from the other side is checked before use; an impossible one (a
//! tail more than `capacity` ahead of head, a stamp ahead of its position) is
//! [`Corrupted`]. Cell indices are masked with the capacity this process holds, never one
//! read from shared memory, so no forged value can index out of bounds.
//!
//! Blocking variants ([`spsc::Producer::push`], ...) are built on [`crate::wait`]: every
//! successful operation calls `notify`, which costs a fence and a load and no syscall unless
//! somebody sleeps.

use std::sync::Arc;

use crate::layout::{Claims, RingControl};

pub mod mpmc;
pub mod spsc;

/// A value read from shared memory was impossible; the ring cannot be trusted.
///
/// `what` names the value, e.g. `"tail is more than capacity ahead of head"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupted {
    /// What was found wrong.
    pub what: &'static str,
}

impl core::fmt::Display for Corrupted {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "shared memory corrupted: {}", self.what)
    }
}

impl std::error::Error for Corrupted {}

/// Why [`try_push`](spsc::Producer::try_push) did not push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryPushError<T> {
    /// The ring is full; here is the value back.
    Full(T),
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
}

/// Why a blocking [`push`](spsc::Producer::push) did not push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PushError<T> {
    /// The deadline passed with the ring still full; here is the value back.
    Timeout(T),
    /// The ring is full and every consumer that attached to it has died (named rings:
    /// their liveness locks are gone); here is the value back.
    PeerDead(T),
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
}

/// Why [`try_pop`](spsc::Consumer::try_pop) returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryPopError {
    /// The ring is empty.
    Empty,
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
}

/// Why a blocking [`pop`](spsc::Consumer::pop) returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PopError {
    /// The deadline passed with the ring still empty.
    Timeout,
    /// Every producer that attached to the ring has died, and everything they published
    /// has been taken (named rings: their liveness locks are gone).
    PeerDead,
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
}

macro_rules! display_errors {
    ($($ty:ty => |$s:ident, $f:ident| $body:expr;)*) => {$(
        impl core::fmt::Display for $ty {
            fn fmt(&self, $f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                let $s = self;
                $body
            }
        }
    )*};
}

display_errors! {
    TryPopError => |s, f| match s {
        TryPopError::Empty => f.write_str("ring is empty"),
        TryPopError::Corrupted(c) => c.fmt(f),
    };
    PopError => |s, f| match s {
        PopError::Timeout => f.write_str("timed out waiting for a message"),
        PopError::PeerDead => f.write_str("every producer of the ring has died (all it published was taken)"),
        PopError::Corrupted(c) => c.fmt(f),
    };
}

impl<T> core::fmt::Display for TryPushError<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TryPushError::Full(_) => f.write_str("ring is full"),
            TryPushError::Corrupted(c) => c.fmt(f),
        }
    }
}

impl<T> core::fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PushError::Timeout(_) => f.write_str("timed out waiting for room in the ring"),
            PushError::PeerDead(_) => f.write_str("the ring is full and every consumer has died"),
            PushError::Corrupted(c) => c.fmt(f),
        }
    }
}

impl<T: core::fmt::Debug> std::error::Error for TryPushError<T> {}
impl<T: core::fmt::Debug> std::error::Error for PushError<T> {}
impl std::error::Error for TryPopError {}
impl std::error::Error for PopError {}

/// Where a ring's control block and cells live.
///
/// # Safety
///
/// An implementation promises, for the whole life of the value and of every clone:
/// - `control()` and `cells()` always return the same memory, which stays valid;
/// - `cells().len()` is a power of two, at least 1, and never changes;
/// - the memory is shared only with other endpoints of the same ring (in this or other
///   processes) that follow the same protocol, or with peers whose writes are treated as
///   untrusted (the algorithms check what they read);
/// - the cells were initialised for the ring kind before the first endpoint was made (for
///   MPMC: cell `i` has stamp `i` and head = tail = 0, or a state reached from there).
pub unsafe trait Storage {
    /// The cell type: [`SpscCell`](crate::layout::SpscCell) or
    /// [`MpmcCell`](crate::layout::MpmcCell).
    type Cell;
    /// Whether [`peers_dead`](Self::peers_dead) can ever answer yes: then blocking
    /// operations that have to wait wake every [`LIVENESS_TICK`] to ask.
    const WATCHES_PEERS: bool = false;
    /// The ring's positions and wait words.
    fn control(&self) -> &RingControl;
    /// The cells.
    fn cells(&self) -> &[Self::Cell];
    /// Whether every endpoint of `side` that attached has died, none lives (a blocked
    /// endpoint waiting for that side then gives up with `PeerDead`). Called only while
    /// waiting, never on the fast path.
    fn peers_dead(&self, side: Side) -> bool {
        let _ = side;
        false
    }
    /// The participant entry this endpoint's storage holds, if the storage registers
    /// endpoints (named rings do; heap storage does not).
    fn participant(&self) -> Option<u32> {
        None
    }
    /// If participant entry `index` belongs to an endpoint whose process died, the pid
    /// it recorded.
    fn dead_participant(&self, index: u32) -> Option<u32> {
        let _ = index;
        None
    }
    /// This endpoint's claim words, where an MPMC endpoint records each position it wins
    /// (see [`mpmc`], "Repair"); `None` when the storage does not track endpoints. Read on
    /// every MPMC push and pop: keep it a field access.
    #[inline(always)]
    fn claims(&self) -> Option<&Claims> {
        None
    }
    /// Whether an endpoint of `side` that recorded winning MPMC position `pos` in its
    /// claim line is dead (see [`mpmc`], "Repair"). Probes locks: slow paths only.
    fn claimant_dead(&self, side: Side, pos: u64) -> bool {
        let _ = (side, pos);
        false
    }
    /// Whether the memory itself is known to be damaged (a shared-memory segment that
    /// another process truncated under us); blocked endpoints then give up with
    /// [`Corrupted`] at their next [`LIVENESS_TICK`].
    fn damaged(&self) -> Option<Corrupted> {
        None
    }
}

/// A side of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The producers (senders).
    Producers,
    /// The consumers (receivers).
    Consumers,
}

/// How often a blocked endpoint of a ring that watches its peers checks that they live:
/// a death is noticed within this (plus one probe of the participant table).
pub const LIVENESS_TICK: std::time::Duration = std::time::Duration::from_millis(30);

/// A ring on the heap, shared by `Arc` between the endpoints of one process.
#[derive(Debug)]
pub struct Heap<C> {
    inner: Arc<HeapRing<C>>,
}

#[derive(Debug)]
struct HeapRing<C> {
    control: RingControl,
    cells: Box<[C]>,
}

// SAFETY: the cells hold `Pod` values behind `UnsafeCell`; the endpoints access them only
// under the ring protocol (a cell is written by exactly one side at a time, handed over by
// Release/Acquire on the positions or stamps), which is what makes sharing across threads
// sound. `C: Send` because values move between threads through the cells.
unsafe impl<C: Send> Sync for HeapRing<C> {}

impl<C> Clone for Heap<C> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<C> Heap<C> {
    /// Storage of `capacity` cells made by `cell(index)`.
    ///
    /// # Panics
    ///
    /// If `capacity` is not a power of two in `1..=2^24`.
    pub fn new(capacity: usize, cell: impl FnMut(usize) -> C) -> Self {
        assert!(
            capacity.is_power_of_two() && capacity as u64 <= crate::layout::MAX_CAPACITY,
            "ring capacity must be a power of two in 1..=2^24, got {capacity}"
        );
        let cells = (0..capacity).map(cell).collect();
        Self { inner: Arc::new(HeapRing { control: RingControl::default(), cells }) }
    }
}

// SAFETY: the control block and the boxed cells live as long as the `Arc`, which every
// clone keeps alive; the length is fixed at construction and asserted a power of two; the
// constructors in `spsc` and `mpmc` initialise the cells for their kind.
unsafe impl<C> Storage for Heap<C> {
    type Cell = C;
    fn control(&self) -> &RingControl {
        &self.inner.control
    }
    fn cells(&self) -> &[C] {
        &self.inner.cells
    }
}

/// Why a blocking operation gave up.
pub(crate) enum Blocked {
    /// The deadline passed.
    Timeout,
    /// Every endpoint of the side waited for has died.
    PeerDead,
    /// The shared state is impossible.
    Corrupted(Corrupted),
}

/// The blocking form of a non-blocking operation: retries `attempt` (which returns
/// `Ok(Some(r))` on success, `Ok(None)` to wait) as `policy` says, sleeping on `wait_on`,
/// until `deadline`; after a success, wakes the other side's sleepers on `wake`.
///
/// Storage that watches its peers is asked, every [`LIVENESS_TICK`] of waiting, whether
/// its memory is damaged ([`Storage::damaged`]: the wait ends `Corrupted`); then `on_tick`
/// does the endpoint's own slow-path work (MPMC: skip the cells of dead producers, adopt
/// the elements of dead consumers; a success ends the wait); then, past the deadline, one
/// last attempt before [`Blocked::Timeout`]; then, if the side `waits_for` is all dead, one
/// last attempt takes what they left, and the wait ends with [`Blocked::PeerDead`]. The
/// first attempt reads no clock.
#[allow(clippy::too_many_arguments)] // the one place the waiting policy is written
pub(crate) fn block_on<S: Storage, R>(
    storage: &S,
    waits_for: Side,
    wait_on: &crate::wait::WaitWord,
    wake: &crate::wait::WaitWord,
    policy: crate::wait::WaitPolicy,
    deadline: Option<std::time::Instant>,
    mut attempt: impl FnMut() -> Result<Option<R>, Corrupted>,
    mut on_tick: impl FnMut() -> Option<R>,
) -> Result<R, Blocked> {
    let done = |r| {
        crate::wait::notify(wake);
        Ok(r)
    };
    if !S::WATCHES_PEERS {
        return match crate::wait::wait_until(wait_on, policy, deadline, || attempt().transpose()) {
            Ok(Ok(r)) => done(r),
            Ok(Err(c)) => Err(Blocked::Corrupted(c)),
            Err(_) => Err(Blocked::Timeout),
        };
    }
    match attempt() {
        Ok(Some(r)) => return done(r),
        Ok(None) => {}
        Err(c) => return Err(Blocked::Corrupted(c)),
    }
    loop {
        let tick = std::time::Instant::now() + LIVENESS_TICK;
        let chunk = deadline.map_or(tick, |d| d.min(tick));
        match crate::wait::wait_until(wait_on, policy, Some(chunk), || attempt().transpose()) {
            Ok(Ok(r)) => return done(r),
            Ok(Err(c)) => return Err(Blocked::Corrupted(c)),
            Err(_) => {
                if let Some(c) = storage.damaged() {
                    return Err(Blocked::Corrupted(c));
                }
                // The endpoint's own slow-path work (MPMC: skip cells of dead producers,
                // adopt elements of dead consumers).
                if let Some(r) = on_tick() {
                    return done(r);
                }
                let timed_out = deadline.is_some_and(|d| std::time::Instant::now() >= d);
                if timed_out || storage.peers_dead(waits_for) {
                    // One last attempt: the tick's work may just have unblocked us, and what
                    // the dead published before dying is in the ring: take it first.
                    return match attempt() {
                        Ok(Some(r)) => done(r),
                        Ok(None) if timed_out => Err(Blocked::Timeout),
                        Ok(None) => Err(Blocked::PeerDead),
                        Err(c) => Err(Blocked::Corrupted(c)),
                    };
                }
            }
        }
    }
}

impl<T> TryPushError<T> {
    /// For [`block_on`]: `Full` means wait.
    pub(crate) fn retry(self) -> Result<Option<()>, Corrupted> {
        match self {
            TryPushError::Full(_) => Ok(None),
            TryPushError::Corrupted(c) => Err(c),
        }
    }
}

impl TryPopError {
    /// For [`block_on`]: `Empty` means wait.
    pub(crate) fn retry<T>(self) -> Result<Option<T>, Corrupted> {
        match self {
            TryPopError::Empty => Ok(None),
            TryPopError::Corrupted(c) => Err(c),
        }
    }
}

impl<T> PushError<T> {
    pub(crate) fn from_blocked(blocked: Blocked, value: T) -> Self {
        match blocked {
            Blocked::Timeout => PushError::Timeout(value),
            Blocked::PeerDead => PushError::PeerDead(value),
            Blocked::Corrupted(c) => PushError::Corrupted(c),
        }
    }
}

impl From<Blocked> for PopError {
    fn from(blocked: Blocked) -> Self {
        match blocked {
            Blocked::Timeout => PopError::Timeout,
            Blocked::PeerDead => PopError::PeerDead,
            Blocked::Corrupted(c) => PopError::Corrupted(c),
        }
    }
}

/// Cache hints an endpoint gives the CPU. Prefetching is on unless `GPURING_PREFETCH=0`;
/// demoting is off unless `GPURING_DEMOTE=1` (both read when an endpoint is made).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hints {
    /// Consumer: prefetch published cells ahead of the one being read. Producer:
    /// `prefetchw` the cells it is about to write.
    pub(crate) prefetch: bool,
    /// Producer: `cldemote` what it just published.
    pub(crate) demote: bool,
}

impl Hints {
    pub(crate) fn from_env() -> Self {
        let var = |name| std::env::var(name).ok();
        Self {
            prefetch: var("GPURING_PREFETCH").is_none_or(|v| v != "0"),
            demote: var("GPURING_DEMOTE").is_some_and(|v| v == "1"),
        }
    }
}

/// Calls `hint` with the address of each 64-byte line of `value`, in native x86_64 builds;
/// elsewhere (other targets, loom, Miri) does nothing. The cache hints below share it.
#[inline(always)]
fn for_each_line<C>(value: &C, hint: impl Fn(*const u8)) {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    {
        let base = (value as *const C).cast::<u8>();
        for offset in (0..size_of::<C>()).step_by(64) {
            hint(base.wrapping_add(offset));
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = (value, hint);
}

/// Asks the CPU to bring `value`'s cache lines into this core's cache. A hint: it never
/// faults and changes no value.
#[inline(always)]
pub(crate) fn prefetch<C>(value: &C) {
    for_each_line(value, |line| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `prefetch` is a hint that cannot fault or write; the address is inside
        // `value`. SSE is part of the x86_64 baseline.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(line.cast())
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = line;
    });
}

/// Asks the CPU to bring `value`'s cache lines into this core's cache *for writing*
/// (`prefetchw`: ownership is requested ahead, so that the stores that follow do not each
/// wait for another core to give the line up). A hint: it never faults and changes no
/// value; CPUs without it execute it as a NOP.
#[inline(always)]
pub(crate) fn prefetch_write<C>(value: &C) {
    for_each_line(value, |line| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHW only hints; it cannot fault, write or change a value, and
        // decodes as a NOP where unsupported. The address is inside `value`. No stack use,
        // flags untouched.
        unsafe {
            core::arch::asm!("prefetchw byte ptr [{0}]", in(reg) line, options(nostack, preserves_flags))
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = line;
    });
}

/// Asks the CPU to move `value`'s cache lines from this core's private caches to the
/// shared cache (`cldemote`), where another core reads them without snooping this one. A
/// hint: it never faults, changes no value, and executes as a NOP on CPUs without it.
#[inline(always)]
pub(crate) fn demote<C>(value: &C) {
    for_each_line(value, |line| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: CLDEMOTE only hints where a line should live; it cannot fault, write or
        // change a value, and its encoding is a NOP where unsupported. The address is
        // inside `value`. No stack use, flags untouched.
        unsafe {
            core::arch::asm!("cldemote byte ptr [{0}]", in(reg) line, options(nostack, preserves_flags))
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = line;
    });
}

/// The cell of position `pos`, masked with the `capacity` this process validated (never a
/// value read from shared memory).
#[inline(always)]
pub(crate) fn cell_at<S: Storage>(storage: &S, capacity: u64, pos: u64) -> &S::Cell {
    let index = (pos & (capacity - 1)) as usize;
    debug_assert!(capacity as usize == storage.cells().len());
    // SAFETY: index < capacity == cells().len(); capacity is a power of two (Storage
    // contract), so the mask is `% capacity`.
    unsafe { storage.cells().get_unchecked(index) }
}

/// `Instant::now() + timeout`, or no deadline when that overflows.
pub(crate) fn deadline_after(timeout: std::time::Duration) -> Option<std::time::Instant> {
    std::time::Instant::now().checked_add(timeout)
}
