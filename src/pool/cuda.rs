//! Device pools (feature `cuda`): everything about slots in device memory lives here, the
//! channel's GPU ends (`channel/gpu.rs`) excepted.
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
//! ([`ImportedPool::import`]).
//!
//! cudarc is loaded dynamically, so the crate builds and its host paths run on machines
//! without CUDA; [`context`] says [`CudaError::Unavailable`] there instead of panicking.

/// What went wrong on the CUDA side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// No CUDA driver library on this machine (or it failed to initialise).
    Unavailable,
    /// A driver call failed.
    Driver {
        /// The call.
        op: &'static str,
        /// Its `CUresult` code.
        code: i32,
    },
    /// The pool's device is not this context's device, and the two cannot reach each
    /// other (no peer access).
    DeviceMismatch {
        /// UUID of the pool's device.
        pool_device: [u8; 16],
        /// UUID of this context's device.
        this_device: [u8; 16],
    },
    /// The thread that runs a pinned pool's stream-ordered hand-offs could not be started.
    Thread,
}

impl core::fmt::Display for CudaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CudaError::Unavailable => f.write_str("no CUDA driver on this machine"),
            CudaError::Driver { op, code } => write!(f, "{op} failed: CUDA error {code}"),
            CudaError::Thread => {
                f.write_str("could not start the thread for stream-ordered hand-offs")
            }
            CudaError::DeviceMismatch { pool_device, this_device } => write!(
                f,
                "the pool lives on device {} and this context's device {} cannot reach it",
                hex(pool_device),
                hex(this_device)
            ),
        }
    }
}

impl std::error::Error for CudaError {}

fn hex(bytes: &[u8; 16]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(all(feature = "cuda", not(loom)))]
pub use imp::*;

#[cfg(all(feature = "cuda", not(loom)))]
mod imp {
    use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};
    use std::sync::{Arc, Mutex, PoisonError, Weak};

    pub use cudarc::driver::{CudaContext, CudaStream};
    use cudarc::driver::{result, sys};

    use super::CudaError;
    use crate::layout::{
        BACKEND_CUDA, CudaPoolInfo, PoolLayout, SlotEvents, SlotRecord, load_bytes, store_bytes,
    };
    use crate::pool::PoolSegment;
    use crate::shm::Segment;
    use crate::sync::AtomicU64 as AtomicU64Shared;
    use crate::sync::Ordering;

    static IPC_OPENS: AtomicU64 = AtomicU64::new(0);

    /// IPC handles this process has opened (memory and event handles together). A
    /// receiver opens a pool's handles once, on first sight: the count does not move per
    /// message.
    pub fn ipc_opens() -> u64 {
        IPC_OPENS.load(StdOrdering::Relaxed)
    }

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

    pub(crate) fn driver(op: &'static str) -> impl Fn(result::DriverError) -> CudaError {
        move |e| CudaError::Driver { op, code: e.0 as i32 }
    }

    fn check(op: &'static str, r: sys::CUresult) -> Result<(), CudaError> {
        r.result().map_err(driver(op))
    }

    /// The answer of a query (`cuEventQuery`, `cuStreamQuery`): whether the work it asks
    /// about has completed.
    fn completed(op: &'static str, r: sys::CUresult) -> Result<bool, CudaError> {
        match r {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(op, r).map(|()| true),
        }
    }

    /// The UUID of `ctx`'s device.
    pub(crate) fn device_uuid(ctx: &CudaContext) -> Result<[u8; 16], CudaError> {
        let uuid = result::device::get_uuid(ctx.cu_device()).map_err(driver("cuDeviceGetUuid"))?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    fn event_handle(event: sys::CUevent) -> Result<[u8; 64], CudaError> {
        let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: out-pointer valid; an interprocess event of ours.
        check("cuIpcGetEventHandle", unsafe { sys::cuIpcGetEventHandle(&mut h, event) })?;
        Ok(h.reserved.map(|b| b as u8))
    }

    fn interprocess_event() -> Result<sys::CUevent, CudaError> {
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
    struct Events {
        ctx: Arc<CudaContext>,
        ready: Vec<sys::CUevent>,
        release: Vec<sys::CUevent>,
    }

    // SAFETY: driver handles are usable from any thread once the context is bound, which
    // every method does; the driver serialises calls on one handle.
    unsafe impl Send for Events {}
    // SAFETY: as above.
    unsafe impl Sync for Events {}

    impl Events {
        fn new(ctx: &Arc<CudaContext>, slots: usize) -> Self {
            let (ready, release) = (Vec::with_capacity(slots), Vec::with_capacity(slots));
            Self { ctx: ctx.clone(), ready, release }
        }

        /// Makes the pool's context current on this thread (every call below needs it).
        fn bind(&self) -> Result<(), CudaError> {
            self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
        }

        /// Enqueues on `stream` a wait for `event` (a never-recorded event is a no-op).
        fn wait(&self, event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
            self.bind()?;
            enqueue_wait(event, stream)
        }

        /// As [`wait`](Self::wait), enqueuing nothing when `event` has already completed
        /// (a query reads the event's state; no wait, no GPU work, is then needed).
        fn wait_pending(&self, event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
            self.bind()?;
            // SAFETY: a live event.
            if completed("cuEventQuery", unsafe { sys::cuEventQuery(event) })? {
                return Ok(());
            }
            enqueue_wait(event, stream)
        }

        /// Records `event` on `stream`, after the work queued there.
        fn record(&self, event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
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
        fn record_unless_idle(
            &self,
            event: sys::CUevent,
            stream: &CudaStream,
            after: Option<sys::CUevent>,
        ) -> Result<(), CudaError> {
            self.bind()?;
            let after_done = match after {
                // SAFETY: a live event.
                Some(after) => completed("cuEventQuery", unsafe { sys::cuEventQuery(after) })?,
                None => true,
            };
            let idle = after_done
                // SAFETY: the caller's live stream.
                && completed("cuStreamQuery", unsafe { sys::cuStreamQuery(stream.cu_stream()) })?;
            if idle { Ok(()) } else { enqueue_record(event, stream) }
        }
    }

    /// `cuStreamWaitEvent` of `event` on `stream`, in the context current on this thread.
    fn enqueue_wait(event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
        // SAFETY: a live event and the caller's live stream.
        check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), event, 0) })
    }

    /// `cuEventRecord` of `event` on `stream`, in the context current on this thread.
    fn enqueue_record(event: sys::CUevent, stream: &CudaStream) -> Result<(), CudaError> {
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
        /// the device, [`PoolSegment::map_ready_flags`]) the device address of slot 0's
        /// ready word in that mapping.
        host_flags: bool,
        ready_flags: sys::CUdeviceptr,
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
            // SAFETY: offsets from the device-pool layout that sized the segment (`at`
            // checks bounds); atomics only; ours alone until published.
            let info = unsafe { seg.at::<CudaPoolInfo>(layout.cuda_info).as_ref() };
            store_bytes(&info.mem_handle, &self.mem_handle);
            store_bytes(&info.device_uuid, &self.uuid);
            // Relaxed: published with the segment's init word.
            info.device_ordinal.store(self.events.ctx.ordinal() as u32, Ordering::Relaxed);
            info.set_host_flags(self.host_flags);
            info.stride.store(self.stride as u64, Ordering::Relaxed);
            for (i, (ready, release)) in self.event_handles.iter().enumerate() {
                let at = layout.slot_events + i * size_of::<SlotEvents>();
                // SAFETY: as above; slot `i` < slot_count, inside the events array.
                let events = unsafe { seg.at::<SlotEvents>(at).as_ref() };
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

        /// Where slot 0's ready flag is for the device (from
        /// [`PoolSegment::map_ready_flags`]), before the pool is shared.
        pub(crate) fn set_ready_flags(&mut self, first: sys::CUdeviceptr) {
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
    }

    impl ImportedPool {
        /// Opens the device pool whose handles `seg` holds, in `ctx` (a receiver, on first
        /// sight of the pool), signalled by host ready flags if `host_flags` (the
        /// segment's checked [`CudaPoolInfo::host_flags`]). A pool on
        /// another device is opened with lazy peer access when the devices can reach each
        /// other.
        pub(crate) fn import(
            ctx: &Arc<CudaContext>,
            seg: &PoolSegment,
            host_flags: bool,
        ) -> Result<Self, CudaError> {
            let (info, events, stride) = (seg.cuda_info(), seg.slot_events(), seg.layout.stride);
            ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
            let mut uuid = [0u8; 16];
            load_bytes(&info.device_uuid, &mut uuid);
            let here = device_uuid(ctx)?;
            if uuid != here && !can_reach(ctx, &uuid)? {
                return Err(CudaError::DeviceMismatch { pool_device: uuid, this_device: here });
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
            };
            let handle = sys::CUipcMemHandle { reserved: mem_handle.map(|b| b as _) };
            IPC_OPENS.fetch_add(1, StdOrdering::Relaxed);
            // SAFETY: out-pointer valid; the handle bytes came from the pool segment (a
            // forged handle makes the driver fail, not us).
            check("cuIpcOpenMemHandle", unsafe {
                sys::cuIpcOpenMemHandle_v2(&mut pool.base, handle, flags)
            })?;
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
        pub(crate) fn record_release(
            &self,
            slot: u32,
            stream: &CudaStream,
        ) -> Result<(), CudaError> {
            let slot = slot as usize;
            // With host flags no stream waited on the ready event: only the stream's own
            // state says whether reads are pending.
            let after = (!self.host_flags).then(|| self.events.ready[slot]);
            self.events.record_unless_idle(self.events.release[slot], stream, after)
        }
    }

    fn open_event(handle: &[u8; 64]) -> Result<sys::CUevent, CudaError> {
        let h = sys::CUipcEventHandle { reserved: handle.map(|b| b as _) };
        let mut event = std::ptr::null_mut();
        IPC_OPENS.fetch_add(1, StdOrdering::Relaxed);
        // SAFETY: out-pointer valid; bytes from the pool segment (a forged handle makes the
        // driver fail).
        check("cuIpcOpenEventHandle", unsafe { sys::cuIpcOpenEventHandle(&mut event, h) })?;
        Ok(event)
    }

    /// Whether `ctx`'s device can reach the device with `uuid` (peer access).
    fn can_reach(ctx: &CudaContext, uuid: &[u8; 16]) -> Result<bool, CudaError> {
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
                return Ok(can != 0);
            }
        }
        Ok(false)
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

    /// The device part of a pool segment.
    impl PoolSegment {
        /// A sender's new device pool ordered by host ready flags: registers this mapping
        /// of the segment with CUDA in `ctx`'s driver (portable, device-mapped; it goes
        /// just before the mapping does) and returns the device address of slot 0's ready
        /// word (records are `size_of::<SlotRecord>()` apart). Not on the hot path.
        pub(crate) fn map_ready_flags(
            &self,
            ctx: &Arc<CudaContext>,
        ) -> Result<sys::CUdeviceptr, CudaError> {
            // SAFETY: offset 0 of the mapping, a byte: in bounds, aligned.
            let base = unsafe { self.segment.at::<u8>(0) }.as_ptr();
            // The mapping is page-aligned and its last page mapped whole.
            let len = self.segment.len().next_multiple_of(rustix::param::page_size());
            let pinned = crate::pool::pinned::Pinned::register(ctx, base, len)?;
            let first = pinned.device_ptr()?
                + (self.layout.records + std::mem::offset_of!(SlotRecord, ready)) as u64;
            // A new segment nobody else maps yet: nobody set it meanwhile.
            let _ = self.pinned.set(pinned);
            Ok(first)
        }

        /// Slot `slot`'s ready flag (host-flag pools; `slot` checked by the caller).
        pub(crate) fn ready_flag(&self, slot: u32) -> &AtomicU64Shared {
            assert!((slot as usize) < self.layout.slot_count, "slot index checked by the caller");
            let at = self.layout.records + slot as usize * size_of::<SlotRecord>();
            // SAFETY: a record inside the checked layout (`at` checks bounds); atomics only.
            &unsafe { self.segment.at::<SlotRecord>(at).as_ref() }.ready
        }

        /// Device pools: the allocation's handle and device.
        ///
        /// # Panics
        ///
        /// On a host pool.
        pub(crate) fn cuda_info(&self) -> &CudaPoolInfo {
            assert_eq!(self.backend, BACKEND_CUDA, "a device pool");
            // SAFETY: offset from the checked device-pool layout; atomics only.
            unsafe { self.segment.at::<CudaPoolInfo>(self.layout.cuda_info).as_ref() }
        }

        /// Device pools: every slot's event handles.
        ///
        /// # Panics
        ///
        /// On a host pool.
        pub(crate) fn slot_events(&self) -> &[SlotEvents] {
            assert_eq!(self.backend, BACKEND_CUDA, "a device pool");
            let first = self.layout.slot_events;
            // Checks the last record's bounds (and the first's alignment).
            // SAFETY: `at` checks bounds; atomics only.
            let _ = unsafe {
                self.segment.at::<SlotEvents>(
                    first + (self.layout.slot_count - 1) * size_of::<SlotEvents>(),
                )
            };
            // SAFETY: `slot_count` records from `first` lie inside the mapping (checked just
            // above), aligned; atomics only, valid for any bytes.
            unsafe {
                std::slice::from_raw_parts(
                    self.segment.at::<SlotEvents>(first).as_ptr(),
                    self.layout.slot_count,
                )
            }
        }
    }
}
