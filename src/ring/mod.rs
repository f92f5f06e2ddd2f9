//! The ring algorithms, written once and generic over where the ring lives: the engine
//! under the named rings ([`crate::named`]), the channels' descriptor rings and the pools'
//! free rings.
//!
//! | file | what lives there |
//! |---|---|
//! | `mod.rs` | [`Storage`] (where the cells are), [`Heap`] storage, cache hints, `cell_at` |
//! | `error.rs` | the errors of pushes and pops |
//! | `spsc.rs` | single producer, single consumer (Lamport's ring, cached peer positions) |
//! | `mpmc.rs` | bounded MPMC with a stamp per cell (as crossbeam's `ArrayQueue`), claimed in runs |
//! | `runs.rs` | MPMC runs: the cells ready in a row for one side, claimed with one compare-and-swap |
//! | `slices.rs` | pushing and popping many elements at once, on both |
//! | `repair.rs` | MPMC cells whose winner died: skipped (producers) or adopted (consumers), and the consumer's wait that adopts |
//! | `placed.rs` | a ring inside a mapped segment: [`ShmStorage`], creating and checking one |
//!
//! Every blocking operation has one deadline form, `x_until(.., Deadline)`, which waits in
//! [`crate::liveness`]'s tick loop; the public types above build `try_x`, `x`,
//! `x_timeout` and `x_deadline` on it.
//!
//! Elements are [`bytemuck::Pod`]: any bit pattern is a valid value, so a cell written by a
//! hostile peer is garbage, never undefined behaviour. Every position read from the other
//! side is checked before use; an impossible one (a tail more than `capacity` ahead of
//! head, a stamp ahead of its position) is [`Corrupted`]. Cell indices are masked with the
//! capacity this process holds, never one read from shared memory, so no forged value can
//! index out of bounds. Every successful operation calls `wait::notify`, which costs a
//! fence and a load and no syscall unless somebody sleeps.

use std::sync::Arc;

use crate::layout::{Corrupted, RingControl};
use crate::liveness::{Blocked, Role, Tick, Unwatched, Watch, block_on};
use crate::wait::{Deadline, Waits};

pub mod broadcast;
mod error;
pub mod mpmc;
#[cfg(not(loom))]
mod placed;
mod repair;
mod runs;
mod slices;
pub mod spsc;
#[cfg(all(test, not(loom)))]
mod tests;

pub use error::{
    PopError, PopTimeoutError, PushError, PushTimeoutError, ReadError, ReadTimeoutError,
    TryPopError, TryPushError, TryReadError,
};
#[cfg(not(loom))]
pub(crate) use placed::{RingSegment, ShmStorage};
pub use repair::repair;

/// Where a ring's control block and cells live, and who watches its peers.
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
    /// What this storage knows of the ring's peers.
    type Watch: Watch;
    /// The ring's positions and wait words.
    fn control(&self) -> &RingControl;
    /// The cells.
    fn cells(&self) -> &[Self::Cell];
    /// The liveness of the ring's peers, as far as this storage can tell. Its
    /// [`claims`](Watch::claims) is read on every MPMC push and pop: keep it a field access.
    fn watch(&self) -> &Self::Watch;
}

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

impl<C> Heap<C> {
    /// Both ends of the new ring in this storage, which `ends` makes from two handles of
    /// it.
    ///
    /// # Panics
    ///
    /// If the ends refuse the storage (a new ring is consistent, so never).
    pub(crate) fn ends<P, Q>(
        self,
        ends: impl FnOnce(Self, Self) -> Result<(P, Q), Corrupted>,
    ) -> (P, Q) {
        ends(self.clone(), self).expect("a new ring is consistent")
    }
}

// SAFETY: the control block and the boxed cells live as long as the `Arc`, which every
// clone keeps alive; the length is fixed at construction and asserted a power of two; the
// constructors in `spsc` and `mpmc` initialise the cells for their kind.
unsafe impl<C> Storage for Heap<C> {
    type Cell = C;
    type Watch = Unwatched;
    fn control(&self) -> &RingControl {
        &self.inner.control
    }
    fn cells(&self) -> &[C] {
        &self.inner.cells
    }
    fn watch(&self) -> &Unwatched {
        &Unwatched
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

/// What a cache hint asks of the CPU for a value's lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hint {
    /// Bring them into this core's cache, for reading (`prefetcht0`).
    Read,
    /// Bring them into this core's cache *for writing* (`prefetchw`: ownership is requested
    /// ahead, so that the stores that follow do not each wait for another core to give the
    /// line up). CPUs without it execute it as a NOP.
    Write,
    /// Move them from this core's private caches to the shared cache (`cldemote`), where
    /// another core reads them without snooping this one. A NOP on CPUs without it.
    Demote,
}

/// Gives the CPU `hint` for every 64-byte line of `value`, in native x86_64 builds;
/// elsewhere (other targets, loom, Miri) does nothing. A hint never faults and changes no
/// value.
#[inline(always)]
pub(crate) fn cache_hint<C>(value: &C, hint: Hint) {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    {
        use core::arch::asm;
        let base = (value as *const C).cast::<u8>();
        for offset in (0..size_of::<C>()).step_by(64) {
            let line = base.wrapping_add(offset);
            // PREFETCHT0, PREFETCHW and CLDEMOTE only hint where a line should be: they
            // cannot fault, write or change a value, and the latter two decode as NOPs where
            // unsupported (PREFETCHT0 is baseline). No stack use, flags untouched.
            // SAFETY: a hint (see above) at an address inside `value`.
            unsafe {
                match hint {
                    Hint::Read => {
                        asm!("prefetcht0 byte ptr [{0}]", in(reg) line, options(nostack, preserves_flags))
                    }
                    Hint::Write => {
                        asm!("prefetchw byte ptr [{0}]", in(reg) line, options(nostack, preserves_flags))
                    }
                    Hint::Demote => {
                        asm!("cldemote byte ptr [{0}]", in(reg) line, options(nostack, preserves_flags))
                    }
                }
            }
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = (value, hint);
}

/// Waits, as an endpoint playing `me` on `storage`'s ring, until `attempt` succeeds: in
/// [`crate::liveness`]'s tick loop, sleeping on the word of `me`'s side (producers on
/// `not_full`, consumers on `not_empty`), waking the other side's after a success, and
/// giving up with `PeerDead` once every endpoint of the other side has died.
pub(crate) fn wait_for<S: Storage, R>(
    storage: &S,
    me: Role,
    waits: &Waits,
    deadline: Deadline,
    attempt: impl FnMut() -> Result<Option<R>, Corrupted>,
    on_tick: impl FnMut() -> Tick<R>,
) -> Result<R, Blocked> {
    let c = storage.control();
    let (peers, sleep_on, wake) = match me {
        Role::Producer => (Role::Consumer, &c.not_full, &c.not_empty),
        Role::Consumer => (Role::Producer, &c.not_empty, &c.not_full),
    };
    block_on(storage.watch(), peers, sleep_on, wake, waits, deadline, attempt, on_tick)
}

/// For the non-blocking forms, after they found the ring full or empty: whether every
/// endpoint of side `role` has left cleanly (the hint, then the locks). A side that died is
/// not reported here: the non-blocking forms leave deaths to the blocking ones.
#[inline]
pub(crate) fn peers_left<S: Storage>(storage: &S, role: Role) -> bool {
    peers_gone(storage, role, false) == Some(Blocked::Disconnected)
}

/// Whether every endpoint of side `role` of `storage`'s ring is gone, and how
/// ([`Blocked::Disconnected`] or [`Blocked::PeerDead`]): with `probe`, from the locks
/// (slow paths: liveness ticks); without, from the departure hint, confirmed by the locks
/// only when it says so (cheap enough for every send).
#[inline]
pub(crate) fn peers_gone<S: Storage>(storage: &S, role: Role, probe: bool) -> Option<Blocked> {
    let watch = storage.watch();
    if probe { watch.gone(role).map(Blocked::from) } else { crate::liveness::departed(watch, role) }
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
