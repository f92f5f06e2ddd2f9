//! The [`Pinned`] backend: host channels whose slots this process registers with CUDA
//! (`cuMemHostRegister`), so that copies between device memory and a slot are
//! asynchronous DMA, handed off in stream order with no thread blocked.
//!
//! ```text
//! sender (GPU process):   lease = acquire()
//!                         send_from_device_on(lease, src, meta, &s1)
//!                           -> cuMemcpyDtoHAsync(slot <- src) on s1
//!                           -> event on s1; the sender's lane thread publishes the
//!                              descriptor once it has completed
//! receiver (CPU process): a plain host receiver: recv() -> reads the slot in place
//! receiver (GPU process): recv() -> copy_to_device_on(dst, &s2)
//!                           -> cuMemcpyHtoDAsync(dst <- slot) on s2
//!                           -> event on s2; the pool's lane thread returns the slot
//!                              once it has completed
//! ```
//!
//! The channel is a host channel (its segments say so): each process chooses to pin or
//! not, and a CPU-only peer needs no CUDA. A pinned sender holds its ring's producer end
//! in a [`PinnedTx`], shared with the thread that publishes its stream-ordered sends: the
//! sender uses it with no lock while none is pending, both take its lock while one is.
//! The lanes are `lane.rs`'s.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, sys};

use super::CudaError;
use super::driver;
use super::lane::{Handoff, Lane, drop_outside_cuda, in_host_fn};
use super::register::Registration;
use super::returns::{PinnedPool, PinnedRead, Returns, drop_after};
use crate::channel::backend::sealed::{Backend, HoldsRing, HostMemory};
use crate::channel::backend::{HostSlot, Refused, Unmade};
use crate::channel::producer::ProducerRing;
use crate::channel::{ChannelBuilder, Host, Lease, Message, Receiver, SendError, Sender};
use crate::descriptor::{Descriptor, TensorMeta};
use crate::layout::BACKEND_HOST;
use crate::pool::{PoolSegment, SlotHold, SlotRef};
use crate::wait::{Deadline, WaitPolicy};

/// Host slots registered with CUDA in this process: the backend of a host channel opened
/// with [`ChannelBuilder::pinned`] (`Channel<Pinned>`, `Sender<Pinned>`, ...). Leases and
/// messages deref to the slot's bytes as a [`Host`] channel's do; a sender also fills a
/// slot from device memory in stream order ([`Sender::send_from_device_on`]), and a
/// receiver copies a message out to device memory and gives the slot back in stream order
/// ([`Message::copy_to_device_on`], [`Message::release_on`]).
///
/// ```no_run
/// use gpuring::{Channel, Pinned, Sender};
/// let ctx = gpuring::cuda::context(0)?;
/// let ch = Channel::builder("frames").slots(4, 54 << 20).pinned(&ctx).create()?;
/// let tx: Sender<Pinned> = ch.sender()?; // its 4 slots are pinned in this process
/// # drop(tx);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned;

/// A stream-ordered send waiting for its copy: the lease and its descriptor, handed to the
/// function that publishes them.
type Staged = Handoff<(Lease<Pinned>, Descriptor), PinnedTx>;

/// A pinned sender's ring and what its stream-ordered sends need, shared by the sender and
/// the functions that publish those sends once their copy is done (on a lane's thread).
///
/// **Who touches the ring.** The sender's thread ([`with_ring`](HoldsRing::with_ring)) and
/// the publishing functions ([`locked`](Self::locked)). While no stream-ordered send is
/// pending (`staged` is 0) only the sender can: it uses the ring with no lock (one load on
/// the hot path). While one is pending, both sides take `lock`. Only the sender raises
/// `staged` (before it enqueues a function); a function lowers it, under the lock, after
/// its last touch of the ring.
#[derive(Debug)]
pub struct PinnedTx {
    ring: UnsafeCell<ProducerRing>,
    staged: AtomicU32,
    lock: Mutex<()>,
    /// Stream-ordered sends whose descriptor could not be published (every receiver gone,
    /// or the ring corrupt): their slots went back to the pool.
    lost: AtomicU64,
    /// One entry per slot for stream-ordered sends, made on the first.
    staging: OnceLock<Box<[Staged]>>,
    /// Where their functions run, made on the first.
    lane: OnceLock<Lane>,
    /// The sender's pool, registered: the copies into its slots hold it, with this.
    _registration: Registration,
}

// SAFETY: the ring's producer is used by one thread at a time (see the type's docs: the
// sender's thread, a `Sender` not being `Sync`, with no lock while `staged` is 0; it and
// the publishing functions under `lock` otherwise); the producer itself is `Send`.
unsafe impl Send for PinnedTx {}
// SAFETY: as above.
unsafe impl Sync for PinnedTx {}

impl HoldsRing for Arc<PinnedTx> {
    fn with_ring<R>(&self, f: impl FnOnce(&mut ProducerRing) -> R) -> R {
        // Acquire: pairs with the Release decrement in `staged_done`: once a function has
        // lowered it to 0, its touches of the ring happened before ours.
        if self.staged.load(Ordering::Acquire) == 0 {
            // SAFETY: no publishing function is pending or running (only this thread
            // enqueues them, after raising `staged`), and this thread is the sender's only
            // user.
            return f(unsafe { &mut *self.ring.get() });
        }
        self.locked(f)
    }
}

impl PinnedTx {
    /// Runs `f` on the ring under the lock: the publishing functions, and the sender while
    /// some are pending.
    fn locked<R>(&self, f: impl FnOnce(&mut ProducerRing) -> R) -> R {
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: every user of the ring while `staged` > 0 holds the lock; the owner's
        // lock-free use happens only at 0, which no function is around to see.
        f(unsafe { &mut *self.ring.get() })
    }

    /// A stream-ordered send is about to be enqueued (the sender's thread).
    fn stage(&self) {
        // Relaxed: only this thread raises it; the function is enqueued after, and the
        // lane (or the driver) orders its start after the enqueue.
        self.staged.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream-ordered send is done with the ring (a function, holding the lock; or the
    /// sender, when its enqueue failed).
    fn staged_done(&self) {
        // Release: pairs with the Acquire load in `with_ring`.
        self.staged.fetch_sub(1, Ordering::Release);
    }
}

impl Backend for Pinned {
    // A host channel: its segments say host, and any host endpoint may open it.
    const CODE: u32 = BACKEND_HOST;
    const NAME: &'static str = "host";
    type Error = CudaError;
    type Context = Arc<CudaContext>;
    type Made = Registration;
    type Sending = Arc<PinnedTx>;
    type Receiving = ();
    type Imported = Arc<PinnedPool>;
    type LeaseSlot = HostSlot;
    type MessageSlot = PinnedRead;

    fn create_pool(
        ctx: &Arc<CudaContext>,
        name: &str,
        slot_count: u32,
        slot_size: u64,
    ) -> Result<(PoolSegment, Registration), Unmade<CudaError>> {
        let pool = PoolSegment::create(name, BACKEND_HOST, slot_count, slot_size, |_, _| {})?;
        let (data, len, mapping) = pool.slot_pages();
        match Registration::register(ctx, data.as_ptr(), len, mapping.clone()) {
            Ok(registration) => Ok((pool, registration)),
            Err(e) => {
                pool.close(); // nothing was leased: this unlinks it
                Err(Unmade::Device(e))
            }
        }
    }

    fn sending(_: &Arc<CudaContext>, ring: ProducerRing, made: Registration) -> Arc<PinnedTx> {
        Arc::new(PinnedTx {
            ring: UnsafeCell::new(ring),
            staged: AtomicU32::new(0),
            lock: Mutex::new(()),
            lost: AtomicU64::new(0),
            staging: OnceLock::new(),
            lane: OnceLock::new(),
            _registration: made,
        })
    }

    fn leave(sending: &mut Arc<PinnedTx>, pool: &PoolSegment) {
        // Stream-ordered sends still waiting for their copy publish first (up to 5 s; after
        // that they still do when their stream gets there: their functions hold the ring
        // and the pool, and leak them rather than drop the last reference).
        if let Some(lane) = sending.lane.get() {
            lane.settle(Duration::from_secs(5));
        }
        pool.close();
    }

    fn lease(
        _: &Arc<PinnedTx>,
        pool: &Arc<PoolSegment>,
        slot: SlotRef,
    ) -> Result<HostSlot, CudaError> {
        Ok(HostSlot::of_slot(pool, slot.slot))
    }

    fn import(
        ctx: &Arc<CudaContext>,
        seg: &Arc<PoolSegment>,
    ) -> Result<Arc<PinnedPool>, Refused<CudaError>> {
        let (data, len, mapping) = seg.slot_pages();
        Ok(Arc::new(PinnedPool {
            seg: seg.clone(),
            registration: Registration::register(ctx, data.as_ptr(), len, mapping.clone()),
            returns: Returns::new(),
        }))
    }

    fn receiving(_: &Arc<CudaContext>) {}

    fn deliver(
        _: &(),
        pool: &Arc<PinnedPool>,
        hold: &SlotHold,
        d: &Descriptor,
        _: WaitPolicy,
    ) -> Result<PinnedRead, Refused<CudaError>> {
        Ok(PinnedRead { bytes: HostSlot::of_payload(hold, d), pool: pool.clone() })
    }

    fn receiver_gone(pool: &Arc<PinnedPool>) {
        // Slot returns queued on streams run first (up to 5 s), so that their functions do
        // not hold the last reference to the pool.
        pool.returns.settle(Duration::from_secs(5));
    }
}

impl HostMemory for Pinned {
    fn lease_bytes(slot: &HostSlot) -> &HostSlot {
        slot
    }

    fn message_bytes(slot: &PinnedRead) -> &HostSlot {
        &slot.bytes
    }
}

impl ChannelBuilder<Host> {
    /// Pins the host pools of this process's endpoints with CUDA (`cuMemHostRegister`,
    /// portable and device-mapped, in `ctx`'s driver): a sender's pool when it is made,
    /// and each pool a receiver maps, on first sight. Copies between device memory and a
    /// pinned slot are asynchronous DMA at full bandwidth, and do not stall the process's
    /// other CUDA calls the way copies to pageable memory do (see
    /// [`Sender::send_from_device_on`], [`Message::copy_to_device_on`]).
    ///
    /// Pinning is per process: each side chooses it, and the channel is a host channel
    /// either way. A CPU-only receiver of a pinned sender needs no CUDA at all.
    ///
    /// A sender whose pool cannot be pinned fails to be made (`ChannelError::Device`); a
    /// receiver that cannot pin a pool still receives its messages, unpinned, and says why
    /// in [`Receiver::pin_error`].
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").slots(4, 54 << 20).pinned(&ctx).create()?;
    /// let tx = ch.sender()?; // its 4 slots are pinned in this process
    /// # drop(tx);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pinned(self, ctx: &Arc<CudaContext>) -> ChannelBuilder<Pinned> {
        self.with_backend(ctx.clone())
    }
}

impl Sender<Pinned> {
    /// Sends `lease` filled on the GPU, in the order of `stream`, with no thread blocked:
    /// enqueues on `stream` a copy of `meta.nbytes()` bytes from device address `src` into
    /// the slot (asynchronous DMA: the slot is pinned) and an event after it; this sender's
    /// lane thread publishes the descriptor once the event has completed. Returns when both
    /// are enqueued. The receiver reads the final bytes, and needs no CUDA of its own.
    ///
    /// Messages of one sender arrive in stream order; a plain [`send`](Self::send) made
    /// while stream-ordered sends are pending may arrive before them. Dropping the sender
    /// waits (up to 5 s) for its pending stream-ordered sends to publish; a process that
    /// exits sooner loses them (synchronize the stream first).
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
    /// [`SendError::Disconnected`], [`SendError::PeerDead`]; [`SendError::Device`] when the
    /// copy or its event cannot be enqueued (the slot goes back, after the stream has
    /// finished with it).
    pub unsafe fn send_from_device_on(
        &self,
        lease: Lease<Pinned>,
        src: sys::CUdeviceptr,
        meta: TensorMeta,
        stream: &Arc<CudaStream>,
    ) -> Result<(), SendError<Pinned>> {
        let lease = self.sendable(lease, &meta)?;
        let bind = stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"));
        bind.map_err(SendError::Device)?; // the lease goes back with the error
        let len = meta.nbytes() as usize;
        // SAFETY: `len` <= the slot's bytes (checked above), which this lease owns until the
        // function publishes them; `src` as the caller promises.
        let copy = unsafe {
            sys::cuMemcpyDtoHAsync_v2(lease.slot.ptr.as_ptr().cast(), src, len, stream.cu_stream())
        };
        if let Err(e) = copy.result().map_err(driver("cuMemcpyDtoHAsync")) {
            return Err(SendError::Device(e)); // nothing enqueued: the slot goes back
        }
        let d = self.descriptor(&lease, &meta);
        let slot = lease.hold.slot.slot as usize;
        let slots = self.pool.core.slot_count() as usize;
        let tx = &self.sending;
        let entries = tx.staging.get_or_init(|| Staged::entries(slots));
        let lane = Lane::in_cell(&tx.lane, stream, slots).map_err(|e| {
            // The copy is enqueued: the slot goes back (with the lease) once it is done.
            let _ = stream.synchronize();
            SendError::Device(e)
        })?;
        tx.stage();
        // SAFETY: the entry of the slot this lease owns: empty (its last function emptied
        // it before the slot could be leased again), and nobody else fills it.
        let user = unsafe { entries[slot].fill((lease, d), tx.clone()) };
        // SAFETY: `publish_staged` calls no CUDA and does not unwind (`in_host_fn`); the
        // entry lives in the `PinnedTx` that the reference in it keeps until it has run.
        match unsafe { lane.launch_after(stream, slot, publish_staged, user) } {
            Ok(()) => {
                self.seq.set(self.seq.get().wrapping_add(1));
                Ok(())
            }
            Err(e) => {
                // Not enqueued; the copy may be: the slot goes back once it is done.
                let _ = stream.synchronize();
                // SAFETY: full, and the function never ran.
                let ((lease, _), tx) = unsafe { Staged::take(user) };
                tx.staged_done();
                drop(lease);
                Err(SendError::Device(e))
            }
        }
    }

    /// Stream-ordered sends enqueued whose copy has not completed yet (not published).
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").pinned(&ctx).create()?;
    /// let tx = ch.sender()?;
    /// assert_eq!(tx.stream_sends_pending(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream_sends_pending(&self) -> u32 {
        self.sending.staged.load(Ordering::Relaxed)
    }

    /// Stream-ordered sends that could not be published when their copy completed (every
    /// receiver gone, or the ring found corrupt); their slots went back to the pool.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").pinned(&ctx).create()?;
    /// let tx = ch.sender()?;
    /// assert_eq!(tx.stream_sends_lost(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream_sends_lost(&self) -> u64 {
        self.sending.lost.load(Ordering::Relaxed)
    }
}

/// The function of [`Sender::send_from_device_on`]: the copy has completed, so the
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
            // Done with the ring (under the lock; see `PinnedTx`).
            tx.staged_done();
        });
        drop_outside_cuda(pool);
        drop_outside_cuda(tx);
    });
}

impl Receiver<Pinned> {
    /// Why this receiver could not pin a pool it mapped ([`ChannelBuilder::pinned`]), if
    /// it could not: the first such error. Its messages are received all the same, from
    /// unpinned memory.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").pinned(&ctx).open()?;
    /// let rx = ch.receiver()?;
    /// let msg = rx.recv()?;
    /// assert_eq!(msg.is_pinned(), rx.pin_error().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pin_error(&self) -> Option<CudaError> {
        self.imported().iter().find_map(|p| p.registration.as_ref().err().copied())
    }
}

impl Message<Pinned> {
    /// Whether this message's slot is pinned in this process (its receiver could register
    /// the pool: see [`Receiver::pin_error`]).
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").pinned(&ctx).open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// println!("pinned: {}", msg.is_pinned());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_pinned(&self) -> bool {
        self.slot.pool.registration.is_ok()
    }

    /// Copies the payload to device address `dst` in the order of `stream`, and gives the
    /// slot back once the copy has completed, with no caller's thread blocked (the pool's
    /// lane thread returns it once an event recorded after the copy has completed). From
    /// a pinned slot the copy is asynchronous DMA; from one this receiver could not pin
    /// the driver stages it, and it is still correct. Kernels enqueued on `stream` after
    /// this call see the payload.
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
        let (ptr, len) = (self.slot.bytes.ptr, self.slot.bytes.len);
        // SAFETY: `len` bytes of the slot this message holds until `release_on`'s function
        // runs after the copy; `dst` as the caller promises.
        let copy =
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, ptr.as_ptr().cast(), len, stream.cu_stream()) };
        copy.result().map_err(driver("cuMemcpyHtoDAsync"))?;
        self.release_on(stream)
    }

    /// Gives the slot back once the work queued on `stream` so far has completed (say,
    /// copies out of the slot that you enqueued yourself), with no thread blocked.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let stream = ctx.new_stream()?;
    /// let ch = gpuring::Channel::builder("batches").pinned(&ctx).open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// // ... enqueue on `stream` your own copies out of `msg` ...
    /// msg.release_on(&stream)?; // the slot goes back once they are done
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CudaError`] when the return cannot be enqueued: then this waits for `stream`, and
    /// the slot goes back.
    pub fn release_on(self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        // A broadcast message's hold is one of several: its drop gives up only this
        // receiver's, and the last holder's puts the slot back.
        let (read, hold) = self.into_parts();
        drop_after(&read.pool, hold, stream)
    }
}
