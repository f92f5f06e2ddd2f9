//! Device pools: the allocation of a GPU channel's sender, its slots' interprocess events,
//! their export into the pool segment and their import by receivers.
//!
//! A device pool is one `cuMemAlloc` allocation (slots `stride` apart, 2 MiB multiples) and,
//! per slot, two interprocess events created with
//! `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`: *ready* (the sender records it on its
//! stream after writing the slot; the receiver's stream waits on it) and *release* (the
//! receiver records it after its reads; the next lease's stream waits on it). Their IPC
//! handles are taken once, when the pool is made, and written into the pool segment; each
//! receiver opens them once per pool, on first sight, and never in the exporting process.
//! Imported memory is closed with `cuIpcCloseMemHandle`, never freed. No stream or context
//! is synchronised on the hot path: every wait is enqueued on a stream. Two calls are
//! skipped when a cheaper query (no GPU work) shows them moot: the wait for a release that
//! has completed, and the record of a release on a stream that is idle.
//!
//! A sender makes a [`DevicePool`] and writes its handles into the pool segment
//! ([`DevicePool::export_into`], `layout::CudaPoolInfo` and `layout::SlotEvents`); a
//! receiver opens them as an [`ImportedPool`] on first sight of the pool
//! ([`ImportedPool::import`]), and each message it receives holds a [`DeviceRead`].

use std::sync::atomic::Ordering as StdOrdering;
use std::sync::{Arc, Mutex, PoisonError, Weak};

pub use cudarc::driver::{CudaContext, CudaStream};
use cudarc::driver::{result, sys};

use super::events::{Events, IPC_OPENS, check, event_handle, interprocess_event, open_event};
use super::register::Registration;
use super::returns::{Home, Returns, drop_after};
use super::{CudaError, driver};
use crate::layout::{PoolLayout, PoolView, SlotRecord, load_bytes, store_bytes};
use crate::pool::{PoolSegment, SlotHold};
use crate::shm::Segment;
use crate::sync::Ordering;

/// Whether a CUDA driver can be loaded and initialised here.
pub fn available() -> bool {
    // SAFETY: only probes for the library; loads nothing into our address space that
    // could be used unsafely.
    let present = unsafe { sys::is_culib_present() };
    present && result::init().is_ok()
}

/// The primary context of device `ordinal`, or [`CudaError::Unavailable`] when there
/// is no driver (cudarc itself would panic).
///
/// # Errors
///
/// [`CudaError::Unavailable`], [`CudaError::Driver`].
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    if !available() {
        return Err(CudaError::Unavailable);
    }
    CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))
}

/// The UUID of `ctx`'s device.
pub(crate) fn device_uuid(ctx: &CudaContext) -> Result<[u8; 16], CudaError> {
    let uuid = result::device::get_uuid(ctx.cu_device()).map_err(driver("cuDeviceGetUuid"))?;
    Ok(uuid.bytes.map(|b| b as u8))
}

/// Device pools this process exported and still has: a receiver in the same process
/// uses one directly, since CUDA does not open a process's own IPC handles
/// (`cuIpcOpenMemHandle` fails with `CUDA_ERROR_INVALID_CONTEXT`).
static LOCAL_POOLS: Mutex<Vec<Weak<DevicePool>>> = Mutex::new(Vec::new());

/// Makes `pool` findable by a receiver of this process (see [`LOCAL_POOLS`]).
pub(crate) fn register_local(pool: &Arc<DevicePool>) {
    let mut pools = LOCAL_POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    pools.retain(|p| p.strong_count() > 0);
    pools.push(Arc::downgrade(pool));
}

/// This process's own live pool whose allocation has IPC handle `mem_handle`.
fn local_pool(mem_handle: &[u8; 64]) -> Option<Arc<DevicePool>> {
    let pools = LOCAL_POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    pools.iter().filter_map(Weak::upgrade).find(|p| p.mem_handle == *mem_handle)
}

/// The exporting side of a device pool: the allocation and the events, owned.
#[derive(Debug)]
pub struct DevicePool {
    events: Arc<Events>,
    base: sys::CUdeviceptr,
    stride: usize,
    uuid: [u8; 16],
    mem_handle: [u8; 64],
    // Per slot: ready, release.
    event_handles: Box<[([u8; 64], [u8; 64])]>,
    /// Ordered by host ready flags: whether, and (once the pool segment is mapped for
    /// the device, [`map_ready_flags`]) the device address of slot 0's ready word in that
    /// mapping, and the mapping's registration (it goes after the memory: the streams that
    /// write the flags are done with it by then, see `retire`).
    host_flags: bool,
    ready_flags: sys::CUdeviceptr,
    flags_mapping: Option<Registration>,
}

impl DevicePool {
    /// Allocates `slot_count` slots `stride` apart on `ctx`'s device, with their events;
    /// `host_flags`: a send is signalled by the slot's host ready flag, not its ready
    /// event.
    pub(crate) fn create(
        ctx: &Arc<CudaContext>,
        slot_count: usize,
        stride: usize,
        host_flags: bool,
    ) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let uuid = device_uuid(ctx)?;
        let len = stride * slot_count;
        let mut base = 0;
        // SAFETY: out-pointer valid; a plain cuMemAlloc (exportable, unlike the
        // stream-ordered allocations cudarc makes).
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut base, len) })?;
        let mut pool = Self {
            events: Arc::new(Events::new(ctx, slot_count)),
            base,
            stride,
            uuid,
            mem_handle: [0; 64],
            event_handles: Box::new([]),
            host_flags,
            ready_flags: 0,
            flags_mapping: None,
        };
        // On error from here, Drop frees what was made so far.
        let mut mem = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: out-pointer valid; `base` is our live cuMemAlloc allocation.
        check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut mem, base) })?;
        pool.mem_handle = mem.reserved.map(|b| b as u8);
        let mut handles = Vec::with_capacity(slot_count);
        let events = Arc::get_mut(&mut pool.events).expect("not shared yet");
        let made = (0..slot_count).try_for_each(|_| {
            let (r, l) = (interprocess_event()?, interprocess_event()?);
            events.ready.push(r);
            events.release.push(l);
            handles.push((event_handle(r)?, event_handle(l)?));
            Ok(())
        });
        pool.event_handles = handles.into_boxed_slice();
        made.map(|()| pool)
    }

    /// Writes the allocation's handle, device and stride, and every slot's event
    /// handles, into the pool segment `seg` being created with `layout` (from
    /// `PoolSegment::create`'s `init`; published with the segment's init word).
    pub(crate) fn export_into(&self, seg: &Segment, layout: &PoolLayout) {
        // Ours alone until published; the device-pool layout sized the segment.
        let view = PoolView::of(seg, layout).expect("sized by its layout");
        let info = view.cuda_info.expect("a device-pool layout");
        store_bytes(&info.mem_handle, &self.mem_handle);
        store_bytes(&info.device_uuid, &self.uuid);
        // Relaxed: published with the segment's init word.
        info.device_ordinal.store(self.events.ctx.ordinal() as u32, Ordering::Relaxed);
        info.set_host_flags(self.host_flags);
        info.stride.store(self.stride as u64, Ordering::Relaxed);
        for (events, (ready, release)) in view.slot_events.iter().zip(self.event_handles.iter()) {
            store_bytes(&events.ready, ready);
            store_bytes(&events.release, release);
        }
    }

    /// The sender is leaving. Messages in flight are delivered for up to 5 s; once
    /// every slot of `pool` is back and every recorded release has completed, the
    /// allocation and events go (with the last lease holding them). Slots still out
    /// after that are given up: the pool is marked retired, so that receivers refuse
    /// what is still queued, unread (`RecvError::SenderGone`), and the reads under way
    /// get another 5 s to finish. Then the memory goes, unless a receiver still holds a
    /// slot: then it is leaked until this process exits, rather than freed under that
    /// read.
    pub(crate) fn retire(self: Arc<Self>, pool: &PoolSegment) {
        let wait = |done: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !done() {
                if std::time::Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            true
        };
        if !wait(&|| pool.core.all_free()) {
            pool.retire();
            if !wait(&|| pool.core.none_held()) {
                std::mem::forget(self);
                return;
            }
        }
        if self.synchronize_releases().is_err() {
            std::mem::forget(self);
        }
    }

    /// The handle bytes a descriptor of `slot` carries: memory, ready event.
    pub(crate) fn handles(&self, slot: u32) -> (&[u8; 64], &[u8; 64]) {
        (&self.mem_handle, &self.event_handles[slot as usize].0)
    }

    /// Device address of slot `slot`.
    pub(crate) fn slot_ptr(&self, slot: u32) -> sys::CUdeviceptr {
        assert!((slot as usize) < self.event_handles.len(), "slot index checked by the lease");
        self.base + (slot as usize * self.stride) as u64
    }

    /// The device's UUID and this process's ordinal for it.
    pub(crate) fn device(&self) -> ([u8; 16], i32) {
        (self.uuid, self.events.ctx.ordinal() as i32)
    }

    /// Enqueues on `stream` a wait for the last release of `slot` (nothing when it has
    /// completed: in a steady stream the reader released the slot long before it comes
    /// round again, and the wait would cost ~1 µs of this thread and a GPU semaphore).
    pub(crate) fn wait_release(&self, slot: u32, stream: &CudaStream) -> Result<(), CudaError> {
        self.events.wait_pending(self.events.release[slot as usize], stream)
    }

    /// Whether sends are signalled by host ready flags (else by ready events).
    pub(crate) fn host_flags(&self) -> bool {
        self.ready_flags != 0
    }

    /// The registered mapping of the pool segment and where slot 0's ready flag is in it
    /// for the device (from [`map_ready_flags`]), before the pool is shared.
    pub(crate) fn set_ready_flags(&mut self, (mapping, first): (Registration, sys::CUdeviceptr)) {
        self.flags_mapping = Some(mapping);
        self.ready_flags = first;
    }

    /// Signals on `stream`, after the work queued there, that `slot`'s writes for the
    /// send of `generation` are done: records the slot's ready event, or (host flags)
    /// writes `generation` into its ready flag (`cuStreamWriteValue64`; the default
    /// flags fence the stream's earlier writes before it, system-wide).
    pub(crate) fn signal_ready(
        &self,
        slot: u32,
        generation: u64,
        stream: &CudaStream,
    ) -> Result<(), CudaError> {
        if !self.host_flags {
            return self.events.record(self.events.ready[slot as usize], stream);
        }
        assert!(self.ready_flags != 0, "the flags are mapped when the pool is made");
        assert!((slot as usize) < self.event_handles.len(), "slot index checked by the lease");
        let at = self.ready_flags + (slot as usize * size_of::<SlotRecord>()) as u64;
        self.events.bind()?;
        // SAFETY: `at` is slot `slot`'s ready word (8-byte aligned) in this process's
        // mapping of the pool segment, registered and device-mapped while the pool
        // segment lives (the lease holds it); the caller's live stream.
        check("cuStreamWriteValue64", unsafe {
            sys::cuStreamWriteValue64_v2(stream.cu_stream(), at, generation, 0)
        })
    }

    /// Blocks until every recorded release has completed: receivers' GPU reads are
    /// done and the memory can be freed. Off the hot path (the sender's drop).
    pub(crate) fn synchronize_releases(&self) -> Result<(), CudaError> {
        self.events.bind()?;
        for &e in &self.events.release {
            // SAFETY: our live event.
            check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(e) })?;
        }
        Ok(())
    }
}

impl Drop for DevicePool {
    fn drop(&mut self) {
        let _ = self.events.ctx.bind_to_thread();
        // SAFETY: our allocation; every slot was handed back (the sender waits for
        // that, or leaks the pool instead of dropping it). The events go after it.
        let _ = unsafe { sys::cuMemFree_v2(self.base) };
    }
}

/// The importing side of a device pool: the allocation and events opened from their
/// IPC handles, once; or, for a pool of this very process, the pool itself.
#[derive(Debug)]
pub struct ImportedPool {
    events: Arc<Events>,
    /// The pool, when this process exported it (its memory stays while we hold it).
    local: Option<Arc<DevicePool>>,
    base: sys::CUdeviceptr,
    stride: usize,
    mem_handle: [u8; 64],
    ready_handles: Box<[[u8; 64]]>,
    uuid: [u8; 16],
    host_flags: bool,
    /// Broadcast messages' holds given up after this receiver's reads (`Cuda::release`).
    pub(super) returns: Returns<ImportedPool>,
}

impl Home for ImportedPool {
    fn returns(&self) -> &Returns<Self> {
        &self.returns
    }

    fn slot_count(&self) -> usize {
        self.ready_handles.len()
    }
}

impl ImportedPool {
    /// Opens the device pool whose handles `seg` holds, in `ctx` (a receiver, on first
    /// sight of the pool), signalled by host ready flags if `host_flags` (the
    /// segment's checked [`CudaPoolInfo::host_flags`]). A pool on
    /// another device is opened with lazy peer access when the devices can reach each
    /// other; on a device this process does not see (`CUDA_VISIBLE_DEVICES`), when the
    /// driver opens its handle (it does between GPUs that reach each other).
    pub(crate) fn import(
        ctx: &Arc<CudaContext>,
        seg: &PoolSegment,
        host_flags: bool,
    ) -> Result<Self, CudaError> {
        let (info, events, stride) = (seg.cuda_info(), seg.slot_events(), seg.layout().stride);
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut uuid = [0u8; 16];
        load_bytes(&info.device_uuid, &mut uuid);
        let here = device_uuid(ctx)?;
        // None: a device this process does not see; only the open can tell.
        let reach = if uuid == here { Some(true) } else { can_reach(ctx, &uuid)? };
        let mismatch = CudaError::DeviceMismatch { pool_device: uuid, this_device: here };
        if reach == Some(false) {
            return Err(mismatch);
        }
        // The driver requires this flag; it also enables peer access to a pool on
        // another device on first use.
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        let mut mem_handle = [0u8; 64];
        load_bytes(&info.mem_handle, &mut mem_handle);
        if let Some(local) = local_pool(&mem_handle) {
            return Self::local(local, stride, events.len(), uuid, host_flags);
        }
        let mut pool = Self {
            events: Arc::new(Events::new(ctx, events.len())),
            local: None,
            base: 0,
            stride,
            mem_handle,
            ready_handles: Box::new([]),
            uuid,
            host_flags,
            returns: Returns::new(),
        };
        let handle = sys::CUipcMemHandle { reserved: mem_handle.map(|b| b as _) };
        IPC_OPENS.fetch_add(1, StdOrdering::Relaxed);
        // SAFETY: out-pointer valid; the handle bytes came from the pool segment (a
        // forged handle makes the driver fail, not us).
        let rc = unsafe { sys::cuIpcOpenMemHandle_v2(&mut pool.base, handle, flags) };
        if reach.is_none() && rc != sys::CUresult::CUDA_SUCCESS {
            return Err(mismatch);
        }
        check("cuIpcOpenMemHandle", rc)?;
        let mut ready_handles = Vec::with_capacity(events.len());
        let opened = Arc::get_mut(&mut pool.events).expect("not shared yet");
        let done = events.iter().try_for_each(|slot| {
            let mut r = [0u8; 64];
            load_bytes(&slot.ready, &mut r);
            opened.ready.push(open_event(&r)?);
            ready_handles.push(r);
            let mut l = [0u8; 64];
            load_bytes(&slot.release, &mut l);
            opened.release.push(open_event(&l)?);
            Ok(())
        });
        pool.ready_handles = ready_handles.into_boxed_slice();
        done.map(|()| pool)
    }

    /// A pool of this process seen by one of its receivers: its allocation and events
    /// used as they are (nothing opened). The segment's layout must be the pool's own
    /// (shared memory is untrusted: a forged segment could name our handle with
    /// another size, or another ready signal).
    fn local(
        pool: Arc<DevicePool>,
        stride: usize,
        slots: usize,
        uuid: [u8; 16],
        host_flags: bool,
    ) -> Result<Self, CudaError> {
        if pool.stride != stride
            || pool.event_handles.len() != slots
            || pool.uuid != uuid
            || pool.host_flags != host_flags
        {
            return Err(CudaError::Driver {
                op: "importing a pool of this process whose segment says another layout",
                code: sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE as i32,
            });
        }
        Ok(Self {
            events: pool.events.clone(),
            base: pool.base,
            stride,
            mem_handle: pool.mem_handle,
            ready_handles: pool.event_handles.iter().map(|(ready, _)| *ready).collect(),
            uuid,
            host_flags,
            local: Some(pool),
            returns: Returns::new(),
        })
    }

    /// Device address of slot `slot` plus `offset` (both checked by the caller).
    pub(crate) fn slot_ptr(&self, slot: u32, offset: u64) -> sys::CUdeviceptr {
        assert!((slot as usize) < self.ready_handles.len(), "slot index checked by the caller");
        self.base + (slot as usize * self.stride) as u64 + offset
    }

    /// The handle bytes a genuine descriptor of `slot` carries.
    pub(crate) fn handles(&self, slot: u32) -> (&[u8; 64], &[u8; 64], &[u8; 16]) {
        (&self.mem_handle, &self.ready_handles[slot as usize], &self.uuid)
    }

    /// Whether sends are signalled by host ready flags (the receiver's CPU waits for
    /// them; no stream waits on a ready event).
    pub(crate) fn host_flags(&self) -> bool {
        self.host_flags
    }

    /// Enqueues on `stream` a wait for `slot`'s ready event (host flags: nothing, the
    /// writes are done before the message is returned).
    pub(crate) fn wait_ready(&self, slot: u32, stream: &CudaStream) -> Result<(), CudaError> {
        if self.host_flags {
            return Ok(());
        }
        self.events.wait(self.events.ready[slot as usize], stream)
    }

    /// Records `slot`'s release event on `stream` (nothing when `stream` is idle: the
    /// reads queued there are done, see `Events::record_unless_idle`).
    pub(crate) fn record_release(&self, slot: u32, stream: &CudaStream) -> Result<(), CudaError> {
        self.events.record_unless_idle(self.events.release[slot as usize], stream, self.after(slot))
    }

    /// Whether the reads of `slot` queued on `stream` are done: every piece of work queued
    /// there has completed.
    pub(crate) fn reads_done(&self, slot: u32, stream: &CudaStream) -> Result<bool, CudaError> {
        self.events.idle(stream, self.after(slot))
    }

    /// The event a stream of `slot`'s reader waited on, if any: with host flags no stream
    /// waited on the ready event, and only the stream's own state says whether reads are
    /// pending.
    fn after(&self, slot: u32) -> Option<sys::CUevent> {
        (!self.host_flags).then(|| self.events.ready[slot as usize])
    }
}

/// A device slot a message holds. Dropping it records the slot's release event on the
/// message's stream (after the reads queued there), before the slot goes back; a broadcast
/// message's hold goes only once those reads are done ([`DeviceRead::release`]).
#[derive(Debug)]
pub struct DeviceRead {
    pub(super) device: Arc<ImportedPool>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) slot: u32,
    after: AfterReads,
}

/// What a message's drop does for the reads queued on its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterReads {
    /// Records the slot's release event, which the next lease's stream waits on.
    RecordRelease,
    /// A broadcast channel's message, which several receivers read: the slot's one release
    /// event cannot order them all, so the hold is given up only after this receiver's
    /// reads (`Cuda::release` hands it to a lane; this is what is left if it did not).
    WaitForReads,
    /// The hold was handed over already.
    Nothing,
}

impl DeviceRead {
    /// What a message of `device`'s slot `slot` (payload at `ptr`) holds, read in the order
    /// of `stream`; `shared`: a broadcast channel's.
    pub(super) fn new(
        device: &Arc<ImportedPool>,
        stream: &Arc<CudaStream>,
        ptr: sys::CUdeviceptr,
        slot: u32,
        shared: bool,
    ) -> Self {
        let after = if shared { AfterReads::WaitForReads } else { AfterReads::RecordRelease };
        Self { device: device.clone(), stream: stream.clone(), ptr, slot, after }
    }

    /// Its message goes: this, then `hold` (`Backend::release`).
    pub(super) fn release(self, hold: SlotHold) {
        if self.after == AfterReads::WaitForReads {
            self.drop_hold_after_reads(hold);
        } else {
            drop(self);
            drop(hold);
        }
    }

    /// Waits for the reads queued on the message's stream, and makes the drop signal
    /// nothing: for a message put back in its channel, whose next receiver signals the
    /// slot's release after its own reads.
    pub(super) fn settle(&mut self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        self.after = AfterReads::Nothing;
        Ok(())
    }

    /// Gives up `hold`, a broadcast message's, once this receiver's reads queued on the
    /// message's stream are done: now if they are, else from a lane's function (no thread
    /// blocked); waits for them where neither can be known or enqueued (a failed driver
    /// call: never the normal path).
    fn drop_hold_after_reads(mut self, hold: SlotHold) {
        self.after = AfterReads::Nothing;
        match self.device.reads_done(self.slot, &self.stream) {
            Ok(true) => drop(hold),
            // On an error it waited for the stream and dropped the hold.
            Ok(false) => {
                let _ = drop_after(&self.device, hold, &self.stream);
            }
            Err(_) => {
                let _ = self.stream.synchronize();
                drop(hold);
            }
        }
    }
}

impl Drop for DeviceRead {
    fn drop(&mut self) {
        match self.after {
            AfterReads::Nothing => {}
            AfterReads::WaitForReads => {
                // Our reads are done when the drop returns; then the hold lets the slot go.
                let _ = self.stream.synchronize();
            }
            // The next lease's stream waits on this record, so it writes only after our
            // reads (when the stream is idle, the reads are done and nothing is recorded).
            AfterReads::RecordRelease => {
                if self.device.record_release(self.slot, &self.stream).is_err() {
                    // Without the record the slot would be handed back under pending reads:
                    // wait for them instead (a failed driver call; never the normal path).
                    let _ = self.stream.synchronize();
                }
            }
        }
    }
}

/// Whether `ctx`'s device can reach the device with `uuid` (peer access); `None` when this
/// process does not see a device with `uuid` (hidden by `CUDA_VISIBLE_DEVICES`).
fn can_reach(ctx: &CudaContext, uuid: &[u8; 16]) -> Result<Option<bool>, CudaError> {
    let count = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
    for ordinal in 0..count {
        let dev = result::device::get(ordinal).map_err(driver("cuDeviceGet"))?;
        let u = result::device::get_uuid(dev).map_err(driver("cuDeviceGetUuid"))?;
        if u.bytes.map(|b| b as u8) == *uuid {
            let mut can = 0;
            // SAFETY: out-pointer valid; two valid device handles.
            check("cuDeviceCanAccessPeer", unsafe {
                sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), dev)
            })?;
            return Ok(Some(can != 0));
        }
    }
    Ok(None)
}

impl Drop for ImportedPool {
    fn drop(&mut self) {
        let _ = self.events.ctx.bind_to_thread();
        if self.base != 0 && self.local.is_none() {
            // SAFETY: a mapping we opened; closed, never freed (the exporter owns it).
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.base) };
        }
    }
}

/// A sender's new device pool ordered by host ready flags: registers the whole mapping of
/// its segment `pool` with CUDA in `ctx`'s driver (portable, device-mapped; the
/// registration keeps the mapping) and gives the device address of slot 0's ready word in
/// it. Not on the hot path.
pub(crate) fn map_ready_flags(
    pool: &PoolSegment,
    ctx: &Arc<CudaContext>,
) -> Result<(Registration, sys::CUdeviceptr), CudaError> {
    let (base, len, ready, mapping) = pool.mapping();
    let registration = Registration::register(ctx, base.as_ptr(), len, mapping.clone())?;
    let first = registration.device_ptr()? + ready as u64;
    Ok((registration, first))
}
