//! The [`Cuda`] backend: GPU channels, whose slots are device memory handed off in stream
//! order. An endpoint works in the order of its CUDA stream, given when it is made (the
//! channel handle's, from [`ChannelBuilder::cuda`]) and changed with `set_cuda_stream`:
//!
//! ```text
//! sender:   acquire()        -> its stream waits on the slot's release event (unless done)
//!           (kernels on that stream write the slot)
//!           send(lease)      -> ready flag written (or ready event recorded) on it;
//!                               descriptor pushed
//! receiver: recv()           -> descriptor checked; its CPU waits for the flag (events:
//!                               its stream waits on the ready event)
//!           (kernels on that stream read the slot)
//!           drop(message)    -> release event recorded on it (unless it is idle);
//!                               slot back in the pool
//! ```
//!
//! Nothing here synchronises a stream or a context: every wait is enqueued on a stream, so
//! the CPU never blocks for GPU work (but for a host flag, which is what a receiver asks
//! for by it). The device pools themselves live in `device.rs`.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, sys};

use super::CudaError;
use super::device::{DevicePool, DeviceRead, ImportedPool, map_ready_flags, register_local};
use super::driver;
use super::flag::{FlagGone, process_exited, wait_ready_flag};
use crate::channel::backend::sealed::{Backend, HoldsRing};
use crate::channel::backend::{OwnedRing, Refused, Unmade};
use crate::channel::producer::ProducerRing;
use crate::channel::{ChannelBuilder, Host, Lease, Message, Receiver, Sender};
use crate::descriptor::Descriptor;
use crate::layout::{BACKEND_CUDA, Corrupted, PoolLayout};
use crate::pool::{PoolSegment, SlotHold, SlotRef};
use crate::wait::WaitPolicy;

/// Slots in CUDA device memory: the backend of GPU channels (`Channel<Cuda>`,
/// `Sender<Cuda>`, ...), made with [`ChannelBuilder::cuda`].
///
/// ```no_run
/// use gpuring::{Channel, Cuda, DType, Sender, TensorMeta, cuda};
/// let ctx = cuda::context(0)?;
/// let stream = ctx.new_stream()?;
/// let ch = Channel::builder("frames").slots(8, 64 << 20).cuda(&stream).create()?;
/// let tx: Sender<Cuda> = ch.sender()?;
/// let lease = tx.acquire()?; // `stream` waits until the last reader is done
/// // ... enqueue kernels on `stream` that write lease.device_ptr() ...
/// tx.send(lease, TensorMeta::contiguous(DType::F16, &[4, 1024, 1024])?)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cuda;

/// How a GPU channel's receiver learns that a sent slot's writes are done: the sender's
/// choice, per sender ([`ChannelBuilder::ready`]); receivers follow each pool's. By
/// default a sender signals by [`HostFlag`](GpuReady::HostFlag) where its device can (64-bit
/// stream memory operations), else by [`Event`](GpuReady::Event).
///
/// - [`HostFlag`](GpuReady::HostFlag): the send enqueues a write of the slot's ready flag,
///   a word in the pool's shared memory (`cuStreamWriteValue64`, fenced after the
///   stream's earlier writes); `recv` returns once the receiver's CPU has seen it, so the
///   payload is complete for any stream, and nothing is enqueued on the receiver's stream.
///   No GPU waits on another process's work: without CUDA MPS, where two processes on one
///   GPU are time-sliced, that is what keeps a hand-off from waiting for a context switch,
///   and in every setup it spares the GPU an event record and a wait per message. The
///   receiver's CPU waits instead, as its [`WaitPolicy`] says (at least 4,096 spins, then
///   its yields, then short naps, then naps doubling to 1 ms; a policy that never sleeps
///   spins until the flag), and that wait is not bounded by the receive's deadline: a
///   receive, `try_recv` included, that has taken a message waits for its flag until it
///   comes, or the pool is retired or the sender's process has exited (then
///   [`RecvError::SenderGone`](crate::RecvError::SenderGone): the message is dropped
///   unread).
/// - [`Event`](GpuReady::Event): the send records the slot's interprocess ready event on
///   the sender's stream; `recv` enqueues a wait for it on the receiver's stream and
///   returns at once. The CPU never waits for the GPU; the receiver's stream does, and the
///   payload is ordered for that stream only (another stream's reads are ordered with
///   [`Message::wait_on`]). Choose it when the receiving thread has other work to do while
///   the sender's GPU work runs (long kernels before each send), or when a receive must
///   return within its deadline.
///
/// No stream ever waits on a value (NVIDIA warns that such waits can deadlock).
/// docs/GPU.md has the measurements behind the default.
///
/// ```no_run
/// use gpuring::{Channel, GpuReady, cuda};
/// let stream = cuda::context(0)?.new_stream()?;
/// let ch = Channel::builder("frames").slots(64, 1 << 20).cuda(&stream).ready(GpuReady::Event).create()?;
/// # drop(ch);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuReady {
    /// A ready flag in shared memory, written by the sender's stream and waited for by the
    /// receiver's CPU (the default where the device can).
    HostFlag,
    /// Interprocess ready events, waited on by the receiver's stream.
    Event,
}

/// A GPU channel handle's context in a process: the stream its endpoints start on, and how
/// this process's senders signal a send.
#[derive(Debug, Clone)]
pub struct CudaSetup {
    stream: Arc<CudaStream>,
    /// `None`: host flags where the device can, else events.
    ready: Option<GpuReady>,
}

/// The device attribute host ready flags need (`cuStreamWriteValue64`).
const STREAM_MEM_OPS_64: sys::CUdevice_attribute =
    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS;

/// What a GPU sender owns: its ring, its device pool (taken when it leaves), its stream.
#[derive(Debug)]
pub struct CudaSending {
    ring: OwnedRing,
    device: Option<Arc<DevicePool>>,
    stream: Arc<CudaStream>,
}

impl CudaSending {
    fn device(&self) -> &Arc<DevicePool> {
        self.device.as_ref().expect("a live sender has its device pool")
    }
}

impl HoldsRing for CudaSending {
    fn with_ring<R>(&self, f: impl FnOnce(&mut ProducerRing) -> R) -> R {
        self.ring.with_ring(f)
    }
}

/// A device slot a lease holds: the sender's pool, the stream the lease was taken on.
#[derive(Debug)]
pub struct DeviceLease {
    device: Arc<DevicePool>,
    stream: Arc<CudaStream>,
    ptr: sys::CUdeviceptr,
}

impl Backend for Cuda {
    const CODE: u32 = BACKEND_CUDA;
    const NAME: &'static str = "cuda";
    type Error = CudaError;
    type Context = CudaSetup;
    type Made = Arc<DevicePool>;
    type Sending = CudaSending;
    type Receiving = Arc<CudaStream>;
    type Imported = Arc<ImportedPool>;
    type LeaseSlot = DeviceLease;
    type MessageSlot = DeviceRead;

    fn create_pool(
        setup: &CudaSetup,
        name: &str,
        slot_count: u32,
        slot_size: u64,
    ) -> Result<(PoolSegment, Arc<DevicePool>), Unmade<CudaError>> {
        let ctx = setup.stream.context();
        let stride = PoolLayout::cuda(slot_count, slot_size).expect("checked at create").stride;
        let attribute = |a| ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"));
        let can_flag = || attribute(STREAM_MEM_OPS_64).map(|v| v != 0).map_err(Unmade::Device);
        let flags = match setup.ready {
            Some(GpuReady::Event) => false,
            None => can_flag()?,
            Some(GpuReady::HostFlag) if can_flag()? => true,
            Some(GpuReady::HostFlag) => {
                return Err(Unmade::Device(CudaError::Driver {
                    op: "host ready flags: the device has no 64-bit stream memory operations",
                    code: sys::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED as i32,
                }));
            }
        };
        // The allocation, its events and every IPC handle first: the segment publishes them.
        let mut device =
            DevicePool::create(ctx, slot_count as usize, stride, flags).map_err(Unmade::Device)?;
        let pool =
            PoolSegment::create(name, BACKEND_CUDA, slot_count, slot_size, |seg, layout| {
                device.export_into(seg, layout);
            })?;
        if flags {
            // Before any send: the sender's stream writes the flags through this mapping.
            match map_ready_flags(&pool, ctx) {
                Ok(mapped) => device.set_ready_flags(mapped),
                Err(e) => {
                    pool.close(); // nothing was leased: this unlinks it
                    return Err(Unmade::Device(e));
                }
            }
        }
        let device = Arc::new(device);
        // A receiver in this process uses the pool directly (CUDA cannot open our own
        // IPC handles).
        register_local(&device);
        Ok((pool, device))
    }

    fn sending(setup: &CudaSetup, ring: ProducerRing, device: Arc<DevicePool>) -> CudaSending {
        CudaSending {
            ring: OwnedRing::new(ring),
            device: Some(device),
            stream: setup.stream.clone(),
        }
    }

    fn leave(sending: &mut CudaSending, pool: &PoolSegment) {
        pool.close();
        if let Some(device) = sending.device.take() {
            device.retire(pool);
        }
    }

    fn holder_gone(pid: u32) -> bool {
        process_exited(pid)
    }

    fn lease(
        sending: &CudaSending,
        _: &Arc<PoolSegment>,
        slot: SlotRef,
    ) -> Result<DeviceLease, CudaError> {
        let device = sending.device();
        device.wait_release(slot.slot, &sending.stream)?;
        Ok(DeviceLease {
            device: device.clone(),
            stream: sending.stream.clone(),
            ptr: device.slot_ptr(slot.slot),
        })
    }

    fn fill(lease: &DeviceLease, slot: u32, d: &mut Descriptor) -> Result<(), CudaError> {
        lease.device.signal_ready(slot, d.generation, &lease.stream)?;
        let (uuid, ordinal) = lease.device.device();
        let (mem, ready) = lease.device.handles(slot);
        d.device_ordinal = ordinal;
        d.device_uuid = uuid;
        d.mem_handle = *mem;
        d.event_handle = *ready;
        Ok(())
    }

    fn receiving(setup: &CudaSetup) -> Arc<CudaStream> {
        setup.stream.clone()
    }

    fn import(
        setup: &CudaSetup,
        seg: &Arc<PoolSegment>,
    ) -> Result<Arc<ImportedPool>, Refused<CudaError>> {
        let host_flags = seg.cuda_info().host_flags().map_err(Refused::Corrupted)?;
        ImportedPool::import(setup.stream.context(), seg, host_flags)
            .map(Arc::new)
            .map_err(Refused::Device)
    }

    fn check(device: &Arc<ImportedPool>, d: &Descriptor) -> Result<(), Corrupted> {
        let what = |what| Err(Corrupted { what });
        let (mem, ready, uuid) = device.handles(d.slot);
        if d.device_ordinal < 0 {
            return what("descriptor names host memory, the pool is on a device");
        }
        if d.device_uuid != *uuid {
            return what("descriptor names another device than its pool");
        }
        if d.mem_handle != *mem {
            return what("descriptor's memory handle does not match its pool");
        }
        if d.event_handle != *ready {
            return what("descriptor's event handle does not match its slot");
        }
        Ok(())
    }

    fn refuse(seg: &PoolSegment, owner_died: bool) -> Result<(), Refused<CudaError>> {
        // A sender that died had the kernel mark its owner word; one that left retired
        // its pool.
        if owner_died || seg.retired() { Err(Refused::SenderGone) } else { Ok(()) }
    }

    fn deliver(
        stream: &Arc<CudaStream>,
        device: &Arc<ImportedPool>,
        hold: &SlotHold,
        d: &Descriptor,
        policy: WaitPolicy,
    ) -> Result<DeviceRead, Refused<CudaError>> {
        let slot = hold.held.slot;
        if device.host_flags() {
            // Retired or exited, the sender's device memory is gone: this message is
            // refused, unread; whether every sender is gone is the next receive's answer.
            wait_ready_flag(&hold.pool, slot, d.generation, policy).map_err(|gone| match gone {
                FlagGone::Retired | FlagGone::Exited => Refused::SenderGone,
            })?;
        } else {
            device.wait_ready(slot, stream).map_err(Refused::Device)?;
        }
        let ptr = device.slot_ptr(slot, d.byte_offset);
        Ok(DeviceRead::new(device, stream, ptr, slot, hold.shared.is_some()))
    }

    fn release(slot: DeviceRead, hold: SlotHold) {
        slot.release(hold);
    }

    fn settle(slot: &mut DeviceRead) -> Result<(), CudaError> {
        slot.settle()
    }

    fn receiver_gone(device: &Arc<ImportedPool>) {
        // Broadcast holds queued on streams go first (up to 5 s), so that their functions
        // do not hold the last reference to the pool.
        device.returns.settle(std::time::Duration::from_secs(5));
    }
}

impl ChannelBuilder<Host> {
    /// Slots in device memory on `stream`'s device (`create`), or the stream this
    /// process's endpoints of a GPU channel start on (`open`): the builder of a GPU
    /// channel. Every sender and receiver made from the channel handle works in the order
    /// of `stream` until its `set_cuda_stream` changes it.
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).open()?;
    /// let rx = ch.receiver()?; // receives in the order of `stream`
    /// # drop(rx);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cuda(self, stream: &Arc<CudaStream>) -> ChannelBuilder<Cuda> {
        self.with_backend(CudaSetup { stream: stream.clone(), ready: None })
    }
}

impl ChannelBuilder<Cuda> {
    /// How this process's senders of the channel signal that a slot's writes are done
    /// ([`GpuReady`]; by default host flags where the device can, else events). Each
    /// sender's pool records its choice, and receivers follow it, whatever their own
    /// builder said. Asking for host flags on a device without 64-bit stream memory
    /// operations makes `sender()` fail.
    ///
    /// ```no_run
    /// use gpuring::{Channel, GpuReady};
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = Channel::builder("frames").cuda(&stream).ready(GpuReady::Event).create()?;
    /// # drop(ch);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ready(mut self, ready: GpuReady) -> Self {
        self.ctx.ready = Some(ready);
        self
    }
}

impl Sender<Cuda> {
    /// The stream this sender leases on: a lease's slot is written in its order.
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).create()?;
    /// assert_eq!(ch.sender()?.cuda_stream().cu_stream(), stream.cu_stream());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.sending.stream
    }

    /// How this sender signals that a sent slot's writes are done: what its builder's
    /// [`ready`](ChannelBuilder::ready) asked for, or the default's choice for its device
    /// (host flags where the device has 64-bit stream memory operations, else events).
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).create()?;
    /// println!("signalling by {:?}", ch.sender()?.ready_signal());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ready_signal(&self) -> GpuReady {
        if self.sending.device().host_flags() { GpuReady::HostFlag } else { GpuReady::Event }
    }

    /// Makes `stream` the stream this sender's next leases are taken on (the channel
    /// handle's until then): a lease's stream waits for its slot's last reader, and its
    /// send is ordered after the work queued on it.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&ctx.new_stream()?).create()?;
    /// let mut tx = ch.sender()?;
    /// tx.set_cuda_stream(&ctx.new_stream()?); // this thread's stream
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_cuda_stream(&mut self, stream: &Arc<CudaStream>) {
        self.sending.stream = stream.clone();
    }
}

impl Lease<Cuda> {
    /// The slot's device address (valid for [`capacity`](Self::capacity) bytes).
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).create()?;
    /// let lease = ch.sender()?.acquire()?;
    /// println!("write {} bytes at {:#x}", lease.capacity(), lease.device_ptr());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.slot.ptr
    }

    /// The stream the lease was taken on: write the slot in its order.
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).create()?;
    /// let lease = ch.sender()?.acquire()?;
    /// assert_eq!(lease.cuda_stream().cu_stream(), stream.cu_stream());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.slot.stream
    }
}

impl Receiver<Cuda> {
    /// The stream this receiver receives on: work queued on it after a `recv` sees the
    /// sender's writes.
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).open()?;
    /// assert_eq!(ch.receiver()?.cuda_stream().cu_stream(), stream.cu_stream());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.receiving
    }

    /// Makes `stream` the stream the next receives are ordered on (the channel handle's
    /// until then); a message keeps the stream it was received on, where its release is
    /// recorded.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&ctx.new_stream()?).open()?;
    /// let mut rx = ch.receiver()?;
    /// let mine = ctx.new_stream()?;
    /// rx.set_cuda_stream(&mine);
    /// let msg = rx.recv()?; // kernels on `mine` may read it now
    /// # drop(msg);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_cuda_stream(&mut self, stream: &Arc<CudaStream>) {
        self.receiving = stream.clone();
    }
}

impl Message<Cuda> {
    /// The tensor's device address.
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// println!("read {} bytes at {:#x}", msg.len(), msg.device_ptr());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.slot.ptr
    }

    /// The stream the message was received on (its release is recorded there).
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// assert_eq!(msg.cuda_stream().cu_stream(), stream.cu_stream());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.slot.stream
    }

    /// Makes `stream` see the payload too, for one message (the per-message override of
    /// the receiver's stream): from a [`GpuReady::Event`] sender, enqueues on it a wait for
    /// the slot's ready event, as the receive did on the message's own stream; from a
    /// [`GpuReady::HostFlag`] sender, nothing (the writes were done when it was received). The slot's release is still
    /// recorded on [`cuda_stream`](Self::cuda_stream) when the message drops: order the reads
    /// queued on `stream` before that (e.g. `msg.cuda_stream().join(&stream)`), or the slot may
    /// be written again under them.
    ///
    /// ```no_run
    /// let ctx = gpuring::cuda::context(0)?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&ctx.new_stream()?).open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// let other = ctx.new_stream()?;
    /// msg.wait_on(&other)?; // kernels on `other` may read it now
    /// msg.cuda_stream().join(&other)?; // and the release waits for them
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the driver refused the wait.
    pub fn wait_on(&self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        self.slot.device.wait_ready(self.slot.slot, stream)
    }

    /// The payload as a cudarc slice of `T` on the message's stream, without taking
    /// ownership: dropping the view never frees the memory. (cudarc may create events for
    /// the view when its context tracks events; this helper is for convenience, not the
    /// hot path.)
    ///
    /// ```no_run
    /// let stream = gpuring::cuda::context(0)?.new_stream()?;
    /// let ch = gpuring::Channel::builder("frames").cuda(&stream).open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// let floats = stream.clone_dtoh(&*msg.view::<f32>())?; // a copy to the host
    /// println!("{} floats", floats.len());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn view<T: DeviceRepr>(&self) -> DeviceView<'_, T> {
        let len = self.len() / size_of::<T>().max(1);
        // SAFETY: `ptr` is valid for `len * size_of::<T>()` bytes (checked against the
        // slot) while this message, which the view borrows, lives; the slice is leaked,
        // never freed, when the view drops.
        let slice = unsafe { self.cuda_stream().upgrade_device_ptr(self.device_ptr(), len) };
        DeviceView { slice: ManuallyDrop::new(slice), _message: core::marker::PhantomData }
    }
}

/// A borrowed cudarc view of a GPU [`Message`]'s payload; never frees the memory.
pub struct DeviceView<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    _message: core::marker::PhantomData<&'a Message<Cuda>>,
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
