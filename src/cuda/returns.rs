//! A receiver's holds given up once a stream's work on their slots is done, with no thread
//! blocked (a lane's function drops the hold): a pinned receiver's slot after the copies
//! out of it (`Message::<Pinned>::release_on`), and a GPU broadcast message's hold after
//! this receiver's reads (the slot's one release event cannot order several receivers'
//! reads). Also the pools a pinned receiver maps (each registered, or why not).

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaStream;

use super::CudaError;
use super::lane::{Handoff, Lane, drop_outside_cuda, in_host_fn};
use super::register::Registration;
use crate::channel::backend::HostSlot;
use crate::pool::{PoolSegment, SlotHold};

/// The stream-ordered returns of one pool's slots, as one receiver holds them: an entry per
/// slot and the lane their functions run on, both made on the first return that has to
/// wait.
#[derive(Debug)]
pub(super) struct Returns<H> {
    deferred: OnceLock<Box<[Deferred<H>]>>,
    lane: OnceLock<Lane>,
}

/// A receiver's hold whose drop waits for a stream, and the pool that keeps its entry.
type Deferred<H> = Handoff<SlotHold, H>;

impl<H> Returns<H> {
    pub(super) const fn new() -> Self {
        Self { deferred: OnceLock::new(), lane: OnceLock::new() }
    }

    /// Waits, up to `limit`, for the returns queued so far (so that their functions do
    /// not hold the last reference to the pool when its receiver goes).
    pub(super) fn settle(&self, limit: std::time::Duration) {
        if let Some(lane) = self.lane.get() {
            lane.settle(limit);
        }
    }
}

/// A pool whose receiver's holds can wait for a stream: where its [`Returns`] are.
pub(super) trait Home: Send + Sync + Sized + 'static {
    fn returns(&self) -> &Returns<Self>;
    fn slot_count(&self) -> usize;
}

/// A pool a pinned receiver has mapped: its registration (or why there is none: the pool is
/// read unpinned then, pinning being a matter of speed), and the stream-ordered returns of
/// its slots.
#[derive(Debug)]
pub struct PinnedPool {
    pub(super) seg: Arc<PoolSegment>,
    pub(super) registration: Result<Registration, CudaError>,
    pub(super) returns: Returns<PinnedPool>,
}

impl Home for PinnedPool {
    fn returns(&self) -> &Returns<Self> {
        &self.returns
    }

    fn slot_count(&self) -> usize {
        self.seg.core.slot_count() as usize
    }
}

/// What a pinned message holds: the payload's bytes, and its pool (whose registration
/// stays while the message, or a copy out of it, lives).
#[derive(Debug)]
pub struct PinnedRead {
    pub(super) bytes: HostSlot,
    pub(super) pool: Arc<PinnedPool>,
}

/// Drops `hold` (a slot this process holds as a receiver of `home`'s pool) once the work
/// queued on `stream` so far has completed, without blocking: a lane's function does it.
/// When the function cannot be enqueued, waits for the stream instead, drops the hold, and
/// says why.
pub(super) fn drop_after<H: Home>(
    home: &Arc<H>,
    hold: SlotHold,
    stream: &CudaStream,
) -> Result<(), CudaError> {
    let returns = home.returns();
    let slots = home.slot_count();
    let slot = hold.held.slot as usize;
    let entries = returns.deferred.get_or_init(|| Deferred::entries(slots));
    let lane = match Lane::in_cell(&returns.lane, stream, slots) {
        Ok(lane) => lane,
        Err(e) => {
            let _ = stream.synchronize();
            drop(hold);
            return Err(e);
        }
    };
    // SAFETY: the entry of a slot we hold: empty (its last function emptied it before that
    // slot came back to be held again), and nobody else fills it (this receiver holds a
    // slot once at a time, and the entries are this receiver's).
    let user = unsafe { entries[slot].fill(hold, home.clone()) };
    // SAFETY: `drop_deferred` calls no CUDA and does not unwind (`in_host_fn`); the entry
    // lives in this pool, which the reference in it keeps until it has run.
    match unsafe { lane.launch_after(stream, slot, drop_deferred::<H>, user) } {
        Ok(()) => Ok(()),
        Err(e) => {
            // Not enqueued: wait for the reads, then drop the hold here.
            let _ = stream.synchronize();
            // SAFETY: the function never ran, so the entry is still full and ours.
            unsafe { drop_deferred::<H>(user) };
            Err(e)
        }
    }
}

/// The function of [`drop_after`]: empties the entry, then drops the hold (the slot goes
/// back, or, for a broadcast message, this receiver's hold on it).
///
/// # Safety
///
/// `user` is a full [`Deferred`] entry, filled by `drop_after`.
unsafe extern "C" fn drop_deferred<H: Home>(user: *mut c_void) {
    in_host_fn(|| {
        // SAFETY: a full entry from `drop_after`, taken once here.
        let (hold, home) = unsafe { Deferred::<H>::take(user) };
        drop(hold);
        drop_outside_cuda(home);
    });
}
