//! GPU channels: leases and messages of device slots, handed off in stream order.
//!
//! ```text
//! sender:   acquire_on(&s1)  -> s1 waits on the slot's release event
//!           (kernels on s1 write the slot)
//!           send_gpu(lease)  -> ready event recorded on s1; descriptor pushed
//! receiver: recv_on(&s2)     -> descriptor checked; s2 waits on the ready event
//!           (kernels on s2 read the slot)
//!           drop(message)    -> release event recorded on s2; slot back in the pool
//! ```
//!
//! Nothing here synchronises a stream or a context: every wait is enqueued on a stream, so
//! the CPU never blocks for GPU work.

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaSlice, DeviceRepr, sys};

use super::{
    AcquireError, CachedPool, Checked, Leased, Receiver, RecvError, SendError, Sender, Shared,
    SlotHold, SlotLease, Wait, corrupt, received_accessors,
};
use crate::cuda::{CudaError, CudaStream, DevicePool, ImportedPool};
use crate::descriptor::{Descriptor, TensorMeta};
use crate::layout::BACKEND_CUDA;
use crate::pool::PoolSegment;

/// A leased device slot: enqueue writes to [`device_ptr`](Self::device_ptr) on the lease's
/// stream, then [`Sender::send_gpu`] it. Dropping it unsent returns the slot.
pub struct GpuLease {
    inner: SlotLease,
    device: Arc<DevicePool>,
    stream: Arc<CudaStream>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl Leased for GpuLease {
    fn slot_lease(&mut self) -> &mut SlotLease {
        &mut self.inner
    }
    fn capacity(&self) -> usize {
        self.len
    }
}

impl core::fmt::Debug for GpuLease {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GpuLease")
            .field("slot", &self.inner.slot.slot)
            .field("generation", &self.inner.slot.generation)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl GpuLease {
    /// The slot's device address (valid for [`capacity`](Self::capacity) bytes).
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Bytes in the slot.
    pub fn capacity(&self) -> usize {
        self.len
    }

    /// The stream the lease was taken on: write the slot in its order.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Slot index in the pool.
    pub fn slot(&self) -> u32 {
        self.inner.slot.slot
    }

    /// This lease's generation of the slot.
    pub fn generation(&self) -> u32 {
        self.inner.slot.generation
    }

    /// Sets the application tag the descriptor will carry.
    pub fn set_tag(&mut self, tag: u64) {
        self.inner.tag = tag;
    }
}

impl Sender {
    /// Leases a free device slot (waiting, spin then sleep, until one is free) and
    /// enqueues on `stream` a wait for the slot's last release, so that work queued on
    /// `stream` after this runs only after the previous holder's reads. Blocks the CPU
    /// only for a free slot, never for GPU work.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Corrupted`]; [`AcquireError::Cuda`] (`WrongBackend` on a host
    /// channel, or the driver refused the wait).
    pub fn acquire_on(&self, stream: &Arc<CudaStream>) -> Result<GpuLease, AcquireError> {
        self.gpu_lease(stream, Wait::Forever)
    }

    /// As [`acquire_on`](Self::acquire_on), giving up after `timeout`.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Timeout`], [`AcquireError::Corrupted`], [`AcquireError::Cuda`].
    pub fn acquire_on_timeout(
        &self,
        stream: &Arc<CudaStream>,
        timeout: Duration,
    ) -> Result<GpuLease, AcquireError> {
        self.gpu_lease(stream, Wait::For(timeout))
    }

    /// As [`acquire_on`](Self::acquire_on), if a slot is free now.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Exhausted`], [`AcquireError::Corrupted`], [`AcquireError::Cuda`].
    pub fn try_acquire_on(&self, stream: &Arc<CudaStream>) -> Result<GpuLease, AcquireError> {
        self.gpu_lease(stream, Wait::No)
    }

    fn gpu_lease(&self, stream: &Arc<CudaStream>, wait: Wait) -> Result<GpuLease, AcquireError> {
        let device = self.device.as_ref().ok_or(AcquireError::Cuda(CudaError::WrongBackend))?;
        let slot = self.take_slot(wait)?;
        // Made first, so that an error below returns the slot.
        let inner = SlotLease { pool: Some(self.pool.clone()), slot, tag: 0 };
        device.wait_release(slot.slot, stream).map_err(AcquireError::Cuda)?;
        Ok(GpuLease {
            ptr: device.slot_ptr(slot.slot),
            len: self.pool.slot_size(),
            device: device.clone(),
            stream: stream.clone(),
            inner,
        })
    }

    /// Sends a device slot: records the slot's ready event on the lease's stream (after
    /// the writes queued there), then publishes the descriptor, which carries the pool's
    /// memory handle, the slot's ready-event handle and the device's UUID. Waits while
    /// the ring is full.
    ///
    /// # Errors
    ///
    /// [`SendError::TooLarge`] (lease back), [`SendError::Corrupted`],
    /// [`SendError::Cuda`].
    ///
    /// # Panics
    ///
    /// If `lease` came from another sender.
    pub fn send_gpu(&self, lease: GpuLease, meta: TensorMeta) -> Result<(), SendError<GpuLease>> {
        self.send_with(lease, meta, Wait::Forever, fill)
    }

    /// As [`send_gpu`](Self::send_gpu), giving up after `timeout` with the lease back.
    ///
    /// # Errors
    ///
    /// [`SendError::Timeout`], [`SendError::TooLarge`], [`SendError::Corrupted`],
    /// [`SendError::Cuda`].
    ///
    /// # Panics
    ///
    /// If `lease` came from another sender.
    pub fn send_gpu_timeout(
        &self,
        lease: GpuLease,
        meta: TensorMeta,
        timeout: Duration,
    ) -> Result<(), SendError<GpuLease>> {
        self.send_with(lease, meta, Wait::For(timeout), fill)
    }
}

/// The device part of a descriptor, after recording the ready event.
fn fill(lease: &GpuLease, d: &mut Descriptor) -> Result<(), CudaError> {
    let slot = lease.inner.slot.slot;
    lease.device.record_ready(slot, &lease.stream)?;
    let (uuid, ordinal) = lease.device.device();
    let (mem, ready) = lease.device.handles(slot);
    d.device_ordinal = ordinal;
    d.device_uuid = uuid;
    d.mem_handle = *mem;
    d.event_handle = *ready;
    Ok(())
}

/// A sender is leaving: once every slot is back and every recorded release has
/// completed, the allocation and events may go (with the last lease holding them). If
/// slots are still out after a while, the pool is leaked instead: a receiver may still
/// read it, and freeing it under that read would be worse than the leak.
pub(super) fn retire(pool: &PoolSegment, device: Arc<DevicePool>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !pool.core.all_free() {
        if std::time::Instant::now() >= deadline {
            std::mem::forget(device);
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if device.synchronize_releases().is_err() {
        std::mem::forget(device);
    }
}

/// Imports a device pool for a receiver (first sight only).
pub(super) fn import(
    s: &Shared,
    seg: &PoolSegment,
) -> Result<Option<Arc<ImportedPool>>, RecvError> {
    if s.backend != BACKEND_CUDA {
        return Ok(None);
    }
    let ctx = s.cuda.as_ref().ok_or(RecvError::Cuda(CudaError::NoContext))?;
    let pool = ImportedPool::open(ctx, seg.cuda_info(), seg.slot_events(), seg.stride())
        .map_err(RecvError::Cuda)?;
    Ok(Some(Arc::new(pool)))
}

impl Receiver {
    /// Receives a device message, waiting (spin, then sleep) until one arrives, and
    /// enqueues on `stream` a wait for the slot's ready event: work queued on `stream`
    /// after this sees the sender's writes. The CPU does not wait for the GPU.
    ///
    /// # Errors
    ///
    /// [`RecvError::Corrupted`] (also when the descriptor's memory or event handle or
    /// device does not match its pool), [`RecvError::Attach`], [`RecvError::Cuda`].
    pub fn recv_on(&self, stream: &Arc<CudaStream>) -> Result<GpuMessage, RecvError> {
        self.recv_gpu(stream, Wait::Forever)
    }

    /// As [`recv_on`](Self::recv_on), giving up after `timeout`.
    ///
    /// # Errors
    ///
    /// [`RecvError::Timeout`], and as [`recv_on`](Self::recv_on).
    pub fn recv_on_timeout(
        &self,
        stream: &Arc<CudaStream>,
        timeout: Duration,
    ) -> Result<GpuMessage, RecvError> {
        self.recv_gpu(stream, Wait::For(timeout))
    }

    /// As [`recv_on`](Self::recv_on), if a message is waiting.
    ///
    /// # Errors
    ///
    /// [`RecvError::Empty`], and as [`recv_on`](Self::recv_on).
    pub fn try_recv_on(&self, stream: &Arc<CudaStream>) -> Result<GpuMessage, RecvError> {
        self.recv_gpu(stream, Wait::No)
    }

    fn recv_gpu(&self, stream: &Arc<CudaStream>, wait: Wait) -> Result<GpuMessage, RecvError> {
        if self.shared.backend != BACKEND_CUDA {
            return Err(RecvError::Cuda(CudaError::WrongBackend));
        }
        let (hold, device, d, meta) = self.take(wait, |d| {
            let Checked { pool: CachedPool { seg, device, .. }, desc: d, meta } = self.check(d)?;
            let device = device.expect("device pools are imported with their segment");
            let (mem, ready, uuid) = device.handles(d.slot);
            if d.device_ordinal < 0 {
                return Err(corrupt("descriptor names host memory, the pool is on a device"));
            }
            if d.device_uuid != *uuid {
                return Err(corrupt("descriptor names another device than its pool"));
            }
            if d.mem_handle != *mem {
                return Err(corrupt("descriptor's memory handle does not match its pool"));
            }
            if d.event_handle != *ready {
                return Err(corrupt("descriptor's event handle does not match its slot"));
            }
            let held = seg.core.receive(d.slot, d.generation)?;
            Ok((SlotHold { pool: seg, held }, device, d, meta))
        })?;
        let held = hold.held;
        device.wait_ready(held.slot, stream).map_err(RecvError::Cuda)?;
        Ok(GpuMessage {
            ptr: device.slot_ptr(held.slot, d.byte_offset),
            device,
            stream: stream.clone(),
            desc: d,
            meta,
            hold,
        })
    }
}

/// A received device message: metadata and the slot's device address, valid in the order
/// of the stream it was received on. Dropping it records the slot's release event on that
/// stream (after the reads queued there) and returns the slot.
pub struct GpuMessage {
    device: Arc<ImportedPool>,
    stream: Arc<CudaStream>,
    desc: Descriptor,
    meta: TensorMeta,
    ptr: sys::CUdeviceptr,
    hold: SlotHold,
}

impl core::fmt::Debug for GpuMessage {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GpuMessage")
            .field("seq", &self.desc.seq)
            .field("tag", &self.desc.tag)
            .field("slot", &self.hold.held.slot)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("meta", &self.meta)
            .finish()
    }
}

impl GpuMessage {
    /// The tensor's device address.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Bytes of payload.
    pub fn len(&self) -> usize {
        self.desc.len as usize
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.desc.len == 0
    }

    received_accessors!();

    /// The stream the message was received on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The payload as a cudarc slice of `T` on the message's stream, without taking
    /// ownership: dropping the view never frees the memory. (cudarc may create events for
    /// the view when its context tracks events; this helper is for convenience, not the
    /// hot path.)
    pub fn view<T: DeviceRepr>(&self) -> DeviceView<'_, T> {
        let len = self.len() / size_of::<T>().max(1);
        // SAFETY: `ptr` is valid for `len * size_of::<T>()` bytes (checked against the
        // slot) while this message, which the view borrows, lives; the slice is leaked,
        // never freed, when the view drops.
        let slice = unsafe { self.stream.upgrade_device_ptr(self.ptr, len) };
        DeviceView { slice: ManuallyDrop::new(slice), _message: core::marker::PhantomData }
    }
}

impl Drop for GpuMessage {
    fn drop(&mut self) {
        // Before the slot goes back (`hold` drops after this): the next lease's stream
        // waits on this record, so it writes only after our reads.
        if self.device.record_release(self.hold.held.slot, &self.stream).is_err() {
            // Without the record the slot would be handed back under pending reads: wait
            // for them instead (a failed driver call; never the normal path).
            let _ = self.stream.synchronize();
        }
    }
}

/// A borrowed cudarc view of a [`GpuMessage`]'s payload; never frees the memory.
pub struct DeviceView<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    _message: core::marker::PhantomData<&'a GpuMessage>,
}

impl<T> core::ops::Deref for DeviceView<'_, T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> Drop for DeviceView<'_, T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the slice is not used after.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // Leak: the memory is the sender's (imported), never ours to free.
        let _ = slice.leak();
    }
}
