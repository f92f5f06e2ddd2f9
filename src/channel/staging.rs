//! Host channels and the GPU (feature `cuda`): pinned host pools, and stream-ordered copies
//! between device memory and host slots, handed off with no thread blocked.
//!
//! ```text
//! sender (GPU process):   lease = acquire()
//!                         send_from_device_on(lease, src, meta, &s1)
//!                           -> cuMemcpyDtoHAsync(slot <- src) on s1
//!                           -> event on s1; the sender's lane thread publishes the
//!                              descriptor once it has completed
//! receiver (CPU process): recv() -> reads the slot in place
//! receiver (GPU process): recv() -> copy_to_device_on(dst, &s2)
//!                           -> cuMemcpyHtoDAsync(dst <- slot) on s2
//!                           -> event on s2; the pool's lane thread returns the slot
//!                              once it has completed
//! ```
//!
//! With a pinned pool (`ChannelBuilder::pinned`) both copies are truly asynchronous DMA;
//! with a plain one they still work, but the driver stages them through its own pinned
//! buffer and the call returns only once the copy is done. A lane is a thread of the
//! library's that polls each event and then runs the hand-off, with a host function's
//! rules (no CUDA); on a stream of another context a host function does it instead. See
//! `pool/pinned.rs`.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cudarc::driver::sys;

use super::backend::HostSlot;
use super::error::SendError;
use super::sender::Staged;
use super::{ChannelBuilder, Host, Lease, Message, Receiver, Sender};
use crate::descriptor::TensorMeta;
use crate::pool::CudaError;
use crate::pool::cuda::{CudaContext, CudaStream, driver};
use crate::pool::pinned::{Lane, drop_outside_cuda, in_host_fn};
use crate::wait::Deadline;

impl ChannelBuilder<Host> {
    /// Pins the host pools of this process's endpoints with CUDA (`cuMemHostRegister`,
    /// portable and device-mapped, in `ctx`'s driver): a sender's pool when it is made,
    /// and each pool a receiver maps, on first sight. Copies between device memory and a
    /// pinned slot are asynchronous DMA at full bandwidth, and do not stall the process's
    /// other CUDA calls the way copies to pageable memory do (see
    /// [`Sender::send_from_device_on`], [`Message::copy_to_device_on`]).
    ///
    /// Pinning is per process: each side chooses it. A CPU-only receiver of a pinned
    /// sender needs no CUDA at all. Without this option nothing touches CUDA.
    ///
    /// A sender whose pool cannot be pinned fails to be made (`ChannelError::Cuda`); a
    /// receiver that cannot pin a pool still receives its messages, unpinned, and says why
    /// in [`Receiver::pin_error`].
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").slots(4, 54 << 20).pinned(&ctx).create()?;
    /// let tx = ch.sender()?; // its 4 slots are pinned in this process
    /// assert!(tx.is_pinned());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pinned(mut self, ctx: &Arc<CudaContext>) -> Self {
        self.ctx.pinned = Some(ctx.clone());
        self
    }
}

impl Sender<Host> {
    /// Whether this sender's pool is pinned with CUDA in this process
    /// ([`ChannelBuilder::pinned`]).
    pub fn is_pinned(&self) -> bool {
        self.pool.is_pinned()
    }

    /// Sends `lease` filled on the GPU, in the order of `stream`, with no thread blocked:
    /// enqueues on `stream` a copy of `meta.nbytes()` bytes from device address `src` into
    /// the slot and an event after it; this sender's lane thread publishes the descriptor
    /// once the event has completed. Returns when both are enqueued. The receiver reads
    /// the final bytes, and needs no CUDA of its own.
    ///
    /// Into a pinned pool ([`ChannelBuilder::pinned`]) the copy is asynchronous DMA; into a
    /// plain one the driver makes it synchronous (this call returns after it), and it
    /// still works. Messages of one sender arrive in stream order; a plain
    /// [`send`](Self::send) made while stream-ordered sends are pending may arrive before
    /// them. Dropping the sender waits (up to 5 s) for its pending stream-ordered sends to
    /// publish; a process that exits sooner loses them (synchronize the stream first).
    ///
    /// A send that can no longer be published when the stream gets there (every receiver
    /// gone, or the ring found corrupt) gives its slot back and is counted in
    /// [`stream_sends_lost`](Self::stream_sends_lost). While the ring is full the lane
    /// waits for room, holding up this sender's later stream-ordered sends.
    ///
    /// ```no_run
    /// use gpuring::{Channel, DType, TensorMeta, cuda};
    /// let ctx = cuda::context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let frame = stream.alloc_zeros::<f32>(1 << 20)?; // written by kernels on `stream`
    /// let ch = Channel::builder("frames").slots(4, 4 << 20).pinned(&ctx).create()?;
    /// let tx = ch.sender()?;
    /// let lease = tx.acquire()?;
    /// let meta = TensorMeta::contiguous(DType::F32, &[1 << 20])?;
    /// let (src, _sync) = cudarc::driver::DevicePtr::device_ptr(&frame, &stream);
    /// // SAFETY: `frame` holds 4 MiB and lives until the stream has copied it.
    /// unsafe { tx.send_from_device_on(lease, src, meta, &stream)? };
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    ///
    /// `src` is device memory (or device-mapped host memory) of at least `meta.nbytes()`
    /// bytes, readable by `stream`'s context, and not freed before the copy has run in
    /// stream order.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send), the lease back: [`SendError::TooLarge`],
    /// [`SendError::Disconnected`], [`SendError::PeerDead`]; [`SendError::Cuda`] when the
    /// copy or its event cannot be enqueued (the slot goes back, after the stream has
    /// finished with it).
    pub unsafe fn send_from_device_on(
        &self,
        lease: Lease,
        src: sys::CUdeviceptr,
        meta: TensorMeta,
        stream: &Arc<CudaStream>,
    ) -> Result<(), SendError<Lease>> {
        let lease = self.sendable(lease, &meta)?;
        let bind = stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"));
        bind.map_err(SendError::Cuda)?; // the lease goes back with the error
        let len = meta.nbytes() as usize;
        // SAFETY: `len` <= the slot's bytes (checked above), which this lease owns until the
        // host function publishes them; `src` as the caller promises.
        let copy = unsafe {
            sys::cuMemcpyDtoHAsync_v2(lease.slot.ptr.as_ptr().cast(), src, len, stream.cu_stream())
        };
        if let Err(e) = copy.result().map_err(driver("cuMemcpyDtoHAsync")) {
            return Err(SendError::Cuda(e)); // nothing enqueued: the slot goes back
        }
        let d = self.descriptor(&lease, &meta);
        let slot = lease.hold.slot.slot as usize;
        let slots = self.pool.core.slot_count() as usize;
        let entries = self.tx.staging.get_or_init(|| Staged::entries(slots));
        let lane = Lane::in_cell(&self.tx.lane, stream, slots).map_err(|e| {
            // The copy is enqueued: the slot goes back (with the lease) once it is done.
            let _ = stream.synchronize();
            SendError::Cuda(e)
        })?;
        self.tx.stage();
        // SAFETY: the entry of the slot this lease owns: empty (its last host function
        // emptied it before the slot could be leased again), and nobody else fills it.
        let user = unsafe { entries[slot].fill((lease, d), self.tx.clone()) };
        // SAFETY: `publish_staged` calls no CUDA and does not unwind (`in_host_fn`); the
        // entry lives in the `Tx` that the reference in it keeps until it has run.
        match unsafe { lane.launch_after(stream, slot, publish_staged, user) } {
            Ok(()) => {
                self.seq.set(self.seq.get().wrapping_add(1));
                Ok(())
            }
            Err(e) => {
                // Not enqueued; the copy may be: the slot goes back once it is done.
                let _ = stream.synchronize();
                // SAFETY: full, and the host function never ran.
                let ((lease, _), tx) = unsafe { Staged::take(user) };
                tx.staged_done();
                drop(lease);
                Err(SendError::Cuda(e))
            }
        }
    }

    /// Stream-ordered sends enqueued whose copy has not completed yet (not published).
    pub fn stream_sends_pending(&self) -> u32 {
        self.tx.staged()
    }

    /// Stream-ordered sends that could not be published when their copy completed (every
    /// receiver gone, or the ring found corrupt); their slots went back to the pool.
    pub fn stream_sends_lost(&self) -> u64 {
        self.tx.lost.load(Ordering::Relaxed)
    }
}

/// The host function of [`Sender::send_from_device_on`]: the copy has completed, so the
/// descriptor is published (the lease counts as sent), or, when it cannot be, the slot
/// goes back.
///
/// # Safety
///
/// `user` is a full `Staged` entry, filled by `send_from_device_on`.
unsafe extern "C" fn publish_staged(user: *mut c_void) {
    in_host_fn(|| {
        // SAFETY: a full entry from `send_from_device_on`, taken once here.
        let ((mut lease, d), tx) = unsafe { Staged::take(user) };
        // The pool reference leaves the lease here, so that it is let go of outside CUDA.
        let pool = lease.hold.pool.take().expect("a staged lease has its pool");
        let slot = lease.hold.slot;
        drop(lease); // holds no pool now: does nothing
        pool.core.mark_sent(slot);
        tx.locked(|ring| {
            if ring.push_until(d, Deadline::Never).is_err() {
                // Not published: the slot goes back (the sender may have left meanwhile).
                pool.core.unmark_sent(slot);
                if pool.core.cancel(slot) {
                    pool.unlink_if_drained();
                }
                tx.lost.fetch_add(1, Ordering::Relaxed);
            }
            // Done with the ring (under the lock; see `Tx`).
            tx.staged_done();
        });
        drop_outside_cuda(pool);
        drop_outside_cuda(tx);
    });
}

impl Receiver<Host> {
    /// Why this receiver could not pin a pool it mapped ([`ChannelBuilder::pinned`]), if
    /// it could not: the first such error. Its messages are received all the same, from
    /// unpinned memory.
    pub fn pin_error(&self) -> Option<CudaError> {
        self.first_import_error()
    }
}

impl Message<Host> {
    /// Whether this message's slot is pinned with CUDA in this process (its receiver was
    /// made with [`ChannelBuilder::pinned`]).
    pub fn is_pinned(&self) -> bool {
        self.pool().is_pinned()
    }

    /// Copies the payload to device address `dst` in the order of `stream`, and gives the
    /// slot back once the copy has completed, with no caller's thread blocked (the pool's
    /// lane thread returns it once an event recorded after the copy has completed). From
    /// a pinned slot the copy is asynchronous DMA; from a plain one the driver stages it
    /// and it is still correct. Kernels enqueued on `stream` after this call see the
    /// payload.
    ///
    /// ```no_run
    /// use gpuring::{Channel, cuda};
    /// let ctx = cuda::context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let ch = Channel::builder("batches").pinned(&ctx).open()?;
    /// let rx = ch.receiver()?;
    /// let mut batch = stream.alloc_zeros::<u8>(64 << 20)?; // at least a slot's bytes
    /// let msg = rx.recv()?;
    /// let (dst, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut batch, &stream);
    /// // SAFETY: `batch` holds a slot's bytes and outlives the copy.
    /// unsafe { msg.copy_to_device_on(dst, &stream)? }; // the slot goes back after the copy
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    ///
    /// `dst` is device memory (or device-mapped host memory) of at least
    /// [`len`](Self::len) bytes, writable by `stream`'s context, and not freed before the
    /// copy has run in stream order.
    ///
    /// # Errors
    ///
    /// [`CudaError`] when the copy cannot be enqueued (the slot goes back at once), or the
    /// slot's return cannot (then this waits for `stream`, and the slot goes back).
    pub unsafe fn copy_to_device_on(
        self,
        dst: sys::CUdeviceptr,
        stream: &Arc<CudaStream>,
    ) -> Result<(), CudaError> {
        stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let HostSlot { ptr, len } = self.host_view();
        let (ptr, len) = (*ptr, *len);
        // SAFETY: `len` bytes of the slot this message holds until `release_on`'s host
        // function runs after the copy; `dst` as the caller promises.
        let copy =
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, ptr.as_ptr().cast(), len, stream.cu_stream()) };
        copy.result().map_err(driver("cuMemcpyHtoDAsync"))?;
        self.release_on(stream)
    }

    /// Gives the slot back once the work queued on `stream` so far has completed (say,
    /// copies out of the slot that you enqueued yourself), with no thread blocked.
    ///
    /// # Errors
    ///
    /// [`CudaError`] when the return cannot be enqueued: then this waits for `stream`, and
    /// the slot goes back.
    pub fn release_on(self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        let (pool, held) = self.into_held();
        pool.release_after(held, stream)
    }
}
