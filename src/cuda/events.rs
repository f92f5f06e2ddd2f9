//! CUDA events and their interprocess handles: a device pool's per-slot *ready* and
//! *release* events, created by the exporter or opened by an importer, and the driver
//! calls on them (record, wait, query); the count of IPC handles this process opened.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};

use cudarc::driver::{CudaContext, CudaStream, sys};

use super::{CudaError, driver};

pub(super) static IPC_OPENS: AtomicU64 = AtomicU64::new(0);

/// IPC handles this process has opened (memory and event handles together). A
/// receiver opens a pool's handles once, on first sight: the count does not move per
/// message.
pub fn ipc_opens() -> u64 {
    IPC_OPENS.load(StdOrdering::Relaxed)
}

pub(super) fn check(op: &'static str, r: sys::CUresult) -> Result<(), CudaError> {
    r.result().map_err(driver(op))
}

/// The answer of a query (`cuEventQuery`, `cuStreamQuery`): whether the work it asks
/// about has completed.
pub(super) fn completed(op: &'static str, r: sys::CUresult) -> Result<bool, CudaError> {
    match r {
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => check(op, r).map(|()| true),
    }
}

pub(super) fn event_handle(event: sys::CUevent) -> Result<[u8; 64], CudaError> {
    let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
    // SAFETY: out-pointer valid; an interprocess event of ours.
    check("cuIpcGetEventHandle", unsafe { sys::cuIpcGetEventHandle(&mut h, event) })?;
    Ok(h.reserved.map(|b| b as u8))
}

pub(super) fn interprocess_event() -> Result<sys::CUevent, CudaError> {
    // DISABLE_TIMING is required with INTERPROCESS.
    let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let mut event = std::ptr::null_mut();
    // SAFETY: `event` is a valid out-pointer; the caller bound the context.
    check("cuEventCreate", unsafe { sys::cuEventCreate(&mut event, flags) })?;
    Ok(event)
}

/// Every slot's two interprocess events in this process, `ready` and `release`: created
/// (a sender's pool) or opened from their IPC handles (a receiver's import). Destroyed
/// on drop; for an opened event, that closes this process's handle.
#[derive(Debug)]
pub(super) struct Events {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) ready: Vec<sys::CUevent>,
    pub(super) release: Vec<sys::CUevent>,
}

// SAFETY: driver handles are usable from any thread once the context is bound, which
// every method does; the driver serialises calls on one handle.
unsafe impl Send for Events {}
// SAFETY: as above.
unsafe impl Sync for Events {}

impl Events {
    pub(super) fn new(ctx: &Arc<CudaContext>, slots: usize) -> Self {
        let (ready, release) = (Vec::with_capacity(slots), Vec::with_capacity(slots));
        Self { ctx: ctx.clone(), ready, release }
    }

    /// Makes the pool's context current on this thread (every call below needs it).
    pub(super) fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
    }

    /// Enqueues on `stream` a wait for `event` (a never-recorded event is a no-op).
    pub(super) fn wait(&self, event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
        self.bind()?;
        enqueue_wait(event, stream)
    }

    /// As [`wait`](Self::wait), enqueuing nothing when `event` has already completed
    /// (a query reads the event's state; no wait, no GPU work, is then needed).
    pub(super) fn wait_pending(
        &self,
        event: sys::CUevent,
        stream: &CudaStream,
    ) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: a live event.
        if completed("cuEventQuery", unsafe { sys::cuEventQuery(event) })? {
            return Ok(());
        }
        enqueue_wait(event, stream)
    }

    /// Records `event` on `stream`, after the work queued there.
    pub(super) fn record(&self, event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
        self.bind()?;
        enqueue_record(event, stream)
    }

    /// As [`record`](Self::record), recording nothing when every piece of work queued
    /// on `stream` has already completed: a record would then only say "done", which
    /// the event's earlier record says too once it completes (a waiter waits on that
    /// one, at worst longer than needed). `after` is an event `stream` was made to wait
    /// on (the slot's ready event), if any: while it is pending, so is the stream, and
    /// the costlier stream query (0.3–1.4 µs against 20–40 ns for an event's) is not
    /// asked. A record of an interprocess event costs the thread 0.7–1.5 µs and the GPU
    /// a semaphore release.
    pub(super) fn record_unless_idle(
        &self,
        event: sys::CUevent,
        stream: &CudaStream,
        after: Option<sys::CUevent>,
    ) -> Result<(), CudaError> {
        if self.idle(stream, after)? { Ok(()) } else { enqueue_record(event, stream) }
    }

    /// Whether every piece of work queued on `stream` has completed; `after` as for
    /// [`record_unless_idle`](Self::record_unless_idle) (pending: not idle, without the
    /// costlier stream query).
    pub(super) fn idle(
        &self,
        stream: &CudaStream,
        after: Option<sys::CUevent>,
    ) -> Result<bool, CudaError> {
        self.bind()?;
        let after_done = match after {
            // SAFETY: a live event.
            Some(after) => completed("cuEventQuery", unsafe { sys::cuEventQuery(after) })?,
            None => true,
        };
        // SAFETY: the caller's live stream.
        Ok(after_done
            && completed("cuStreamQuery", unsafe { sys::cuStreamQuery(stream.cu_stream()) })?)
    }
}

/// `cuStreamWaitEvent` of `event` on `stream`, in the context current on this thread.
pub(super) fn enqueue_wait(event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
    // SAFETY: a live event and the caller's live stream.
    check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), event, 0) })
}

/// `cuEventRecord` of `event` on `stream`, in the context current on this thread.
pub(super) fn enqueue_record(event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
    // SAFETY: a live event and the caller's live stream.
    check("cuEventRecord", unsafe { sys::cuEventRecord(event, stream.cu_stream()) })
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for &e in self.ready.iter().chain(self.release.iter()) {
            // SAFETY: events of this process (created, or opened from their handles),
            // destroyed once, here.
            let _ = unsafe { sys::cuEventDestroy_v2(e) };
        }
    }
}

pub(super) fn open_event(handle: &[u8; 64]) -> Result<sys::CUevent, CudaError> {
    let h = sys::CUipcEventHandle { reserved: handle.map(|b| b as _) };
    let mut event = std::ptr::null_mut();
    IPC_OPENS.fetch_add(1, StdOrdering::Relaxed);
    // SAFETY: out-pointer valid; bytes from the pool segment (a forged handle makes the
    // driver fail).
    check("cuIpcOpenEventHandle", unsafe { sys::cuIpcOpenEventHandle(&mut event, h) })?;
    Ok(event)
}
