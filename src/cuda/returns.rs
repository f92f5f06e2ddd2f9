//! A pinned receiver's side: the pools it mapped (each registered, or why not), what its
//! messages hold, and the return of a slot once a stream's work on it is done, with no
//! thread blocked (a lane's function does it).

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaStream;

use super::CudaError;
use super::lane::{Handoff, Lane, drop_outside_cuda, in_host_fn};
use super::register::Registration;
use crate::channel::backend::HostSlot;
use crate::pool::{PoolSegment, SlotRef};

/// A pool a pinned receiver has mapped: its registration (or why there is none: the pool is
/// read unpinned then, pinning being a matter of speed), and the stream-ordered returns of
/// its slots.
#[derive(Debug)]
pub struct PinnedPool {
    pub(super) seg: Arc<PoolSegment>,
    pub(super) registration: Result<Registration, CudaError>,
    /// One entry per slot for returns that wait for a stream, made on the first.
    pub(super) deferred: OnceLock<Box<[Deferred]>>,
    /// Where their functions run, made on the first.
    pub(super) lane: OnceLock<Lane>,
}

/// A receiver's slot whose return waits for a stream.
type Deferred = Handoff<SlotRef, PinnedPool>;

/// What a pinned message holds: the payload's bytes, and its pool (whose registration
/// stays while the message, or a copy out of it, lives).
#[derive(Debug)]
pub struct PinnedRead {
    pub(super) bytes: HostSlot,
    pub(super) pool: Arc<PinnedPool>,
}

/// Returns `held` (a slot this process holds as a receiver of `pool`) once the work queued
/// on `stream` so far has completed, without blocking: a lane's function does it. When the
/// function cannot be enqueued, waits for the stream instead, returns the slot, and says
/// why.
pub(super) fn release_after(
    pool: &Arc<PinnedPool>,
    held: SlotRef,
    stream: &CudaStream,
) -> Result<(), CudaError> {
    let slots = pool.seg.core.slot_count() as usize;
    let entries = pool.deferred.get_or_init(|| Deferred::entries(slots));
    let lane = match Lane::in_cell(&pool.lane, stream, slots) {
        Ok(lane) => lane,
        Err(e) => {
            let _ = stream.synchronize();
            release(&pool.seg, held);
            return Err(e);
        }
    };
    let slot = held.slot as usize;
    // SAFETY: the entry of a slot we hold: empty (its last function emptied it before that
    // slot came back to be held again), and nobody else fills it.
    let user = unsafe { entries[slot].fill(held, pool.clone()) };
    // SAFETY: `release_deferred` calls no CUDA and does not unwind (`in_host_fn`); the entry
    // lives in this pool, which the reference in it keeps until it has run.
    match unsafe { lane.launch_after(stream, slot, release_deferred, user) } {
        Ok(()) => Ok(()),
        Err(e) => {
            // Not enqueued: wait for the reads, then return the slot here.
            let _ = stream.synchronize();
            // SAFETY: the function never ran, so the entry is still full and ours.
            unsafe { release_deferred(user) };
            Err(e)
        }
    }
}

/// Returns `held` to `pool`, and unlinks the pool if its sender left and this was the
/// last slot out.
fn release(pool: &PoolSegment, held: SlotRef) {
    if pool.core.release(held) {
        pool.unlink_if_drained();
    }
}

/// The function of [`release_after`]: empties the entry, then returns the slot.
///
/// # Safety
///
/// `user` is a full [`Deferred`] entry, filled by `release_after`.
unsafe extern "C" fn release_deferred(user: *mut c_void) {
    in_host_fn(|| {
        // SAFETY: a full entry from `release_after`, taken once here.
        let (held, pool) = unsafe { Deferred::take(user) };
        release(&pool.seg, held);
        drop_outside_cuda(pool);
    });
}
