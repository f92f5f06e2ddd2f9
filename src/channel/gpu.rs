//! GPU channels (feature `cuda`): the [`Cuda`] backend, leases and messages of device
//! slots, handed off in stream order.
//!
//! ```text
//! sender:   acquire_on(&s1)  -> s1 waits on the slot's release event (unless done)
//!           (kernels on s1 write the slot)
//!           send(lease)      -> ready event recorded on s1; descriptor pushed
//! receiver: recv_on(&s2)     -> descriptor checked; s2 waits on the ready event
//!           (kernels on s2 read the slot)
//!           drop(message)    -> release event recorded on s2 (unless s2 is idle);
//!                               slot back in the pool
//! ```
//!
//! Nothing here synchronises a stream or a context: every wait is enqueued on a stream, so
//! the CPU never blocks for GPU work. A sender that chose [`GpuReady::HostFlag`] signals a
//! send by a write of the slot's ready flag on its stream instead of the ready event, and
//! the receiver's CPU waits for the flag before `recv_on` returns (no stream waits on it).
//! The device pools themselves (allocation, events, flags, their export and import) live
//! in `pool/cuda.rs`.

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DeviceRepr, sys};

use super::backend::process_exited;
use super::backend::sealed::Backend;
use super::error::{ChannelError, RecvError};
use super::receiver::Taken;
use super::{ChannelBuilder, Host, Lease, Message, Receiver, Sender};
use crate::descriptor::Descriptor;
use crate::layout::{BACKEND_CUDA, Corrupted, PoolLayout};
use crate::pool::cuda::{
    CudaContext, CudaStream, DevicePool, ImportedPool, driver, register_local,
};
use crate::pool::{AcquireError, CudaError, PoolSegment};
use crate::sync::Ordering;
use crate::wait::slack::LowTimerSlack;
use crate::wait::{Deadline, WaitPolicy, blocking, receive_iter, spin_then_yield};

/// Slots in CUDA device memory: the backend of GPU channels (`Channel<Cuda>`,
/// `Sender<Cuda>`, ...), made with [`ChannelBuilder::cuda`].
///
/// ```no_run
/// use gpuring::{Channel, Cuda, DType, Sender, TensorMeta, cuda};
/// let ctx = cuda::context(0)?;
/// let stream = ctx.new_stream()?;
/// let ch = Channel::builder("frames").slots(8, 64 << 20).cuda(&ctx).create()?;
/// let tx: Sender<Cuda> = ch.sender()?;
/// let lease = tx.acquire_on(&stream)?; // `stream` waits until the last reader is done
/// // ... enqueue kernels on `stream` that write lease.device_ptr() ...
/// tx.send(lease, TensorMeta::contiguous(DType::F16, &[4, 1024, 1024])?)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cuda;

/// How a GPU channel's receiver learns that a sent slot's writes are done: the sender's
/// choice, per sender ([`ChannelBuilder::ready`]); receivers follow each pool's.
///
/// - [`Event`](GpuReady::Event) (the default): the send records the slot's interprocess
///   ready event on the sender's stream; `recv_on` enqueues a wait for it on the
///   receiver's stream and returns at once. The CPU never waits for the GPU.
/// - [`HostFlag`](GpuReady::HostFlag): the send enqueues a write of the slot's ready flag,
///   a word in the pool's shared memory (`cuStreamWriteValue64`, fenced after the
///   stream's earlier writes); `recv_on` returns once the receiver's CPU has seen it, so
///   the payload is complete for any stream, and nothing is enqueued on the receiver's
///   stream. Per item this saves the GPU an event record and a wait on the two sides
///   (measured: 2.1–3.6× the items per second of events in the raw protocols,
///   docs/BENCHMARKS.md runs AF and AG); it costs a receiver's CPU the wait for the
///   sender's GPU work (typically microseconds), spent as the receiver's
///   [`WaitPolicy`](crate::WaitPolicy) says (at least 4,096 spins, then its yields, then
///   naps of 4 µs doubling to 1 ms; a policy that never sleeps spins until the flag),
///   which the receive's deadline does not bound: a receive, `try_recv_on` included,
///   that has taken a message waits for its flag until it comes, the pool is retired
///   ([`RecvError::SenderGone`]) or the sender's process has exited
///   ([`RecvError::PeerDead`]). No stream ever waits on a value (NVIDIA warns that such
///   waits can deadlock, and under MPS they did, run AF).
///
/// ```no_run
/// use gpuring::{Channel, GpuReady, cuda};
/// let ctx = cuda::context(0)?;
/// let ch = Channel::builder("frames").slots(64, 1 << 20).cuda(&ctx).ready(GpuReady::HostFlag).create()?;
/// # let _ = ch;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuReady {
    /// Interprocess ready events, waited on by the receiver's stream.
    #[default]
    Event,
    /// A ready flag in shared memory, written by the sender's stream and waited for by the
    /// receiver's CPU.
    HostFlag,
}

/// A GPU channel's context in a process: the CUDA context, and how this process's senders
/// signal a send.
#[derive(Debug, Clone)]
pub struct CudaSetup {
    ctx: Arc<CudaContext>,
    ready: GpuReady,
}

/// The device attribute host ready flags need (`cuStreamWriteValue64`).
const STREAM_MEM_OPS_64: sys::CUdevice_attribute =
    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS;

/// A device slot a lease holds: the sender's pool, the stream the lease was taken on.
#[derive(Debug)]
pub struct DeviceLease {
    device: Arc<DevicePool>,
    stream: Arc<CudaStream>,
    ptr: sys::CUdeviceptr,
}

/// A device slot a message holds. Dropping it records the slot's release event on the
/// message's stream (after the reads queued there), before the slot goes back.
#[derive(Debug)]
pub struct DeviceRead {
    device: Arc<ImportedPool>,
    stream: Arc<CudaStream>,
    ptr: sys::CUdeviceptr,
    slot: u32,
}

impl Drop for DeviceRead {
    fn drop(&mut self) {
        // The next lease's stream waits on this record, so it writes only after our reads
        // (when the stream is idle, the reads are done and nothing is recorded).
        if self.device.record_release(self.slot, &self.stream).is_err() {
            // Without the record the slot would be handed back under pending reads: wait
            // for them instead (a failed driver call; never the normal path).
            let _ = self.stream.synchronize();
        }
    }
}

impl Backend for Cuda {
    const CODE: u32 = BACKEND_CUDA;
    const NAME: &'static str = "cuda";
    type Context = CudaSetup;
    type Exported = Arc<DevicePool>;
    type Imported = Arc<ImportedPool>;
    type LeaseSlot = DeviceLease;
    type MessageSlot = DeviceRead;

    fn create_pool(
        setup: &CudaSetup,
        name: &str,
        slot_count: u32,
        slot_size: u64,
    ) -> Result<(PoolSegment, Arc<DevicePool>), ChannelError> {
        let stride = PoolLayout::cuda(slot_count, slot_size).expect("checked at create").stride;
        let flags = setup.ready == GpuReady::HostFlag;
        let attribute = |a| setup.ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"));
        if flags && attribute(STREAM_MEM_OPS_64)? == 0 {
            return Err(CudaError::Driver {
                op: "host ready flags: the device has no 64-bit stream memory operations",
                code: sys::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED as i32,
            }
            .into());
        }
        // The allocation, its events and every IPC handle first: the segment publishes them.
        let mut device = DevicePool::create(&setup.ctx, slot_count as usize, stride, flags)?;
        let pool =
            PoolSegment::create(name, BACKEND_CUDA, slot_count, slot_size, |seg, layout| {
                device.export_into(seg, layout);
            })?;
        if flags {
            // Before any send: the sender's stream writes the flags through this mapping.
            device.set_ready_flags(pool.map_ready_flags(&setup.ctx)?);
        }
        let device = Arc::new(device);
        // A receiver in this process uses the pool directly (CUDA cannot open our own
        // IPC handles).
        register_local(&device);
        Ok((pool, device))
    }

    fn retire(device: Arc<DevicePool>, pool: &PoolSegment) {
        device.retire(pool);
    }

    fn holder_gone(pid: u32) -> bool {
        process_exited(pid)
    }

    fn import(setup: &CudaSetup, seg: &PoolSegment) -> Result<Arc<ImportedPool>, RecvError> {
        let host_flags = seg.cuda_info().host_flags()?;
        ImportedPool::import(&setup.ctx, seg, host_flags).map(Arc::new).map_err(RecvError::Cuda)
    }

    fn refuse(seg: &PoolSegment) -> Result<(), RecvError> {
        if seg.retired() { Err(RecvError::SenderGone) } else { Ok(()) }
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
}

impl ChannelBuilder<Host> {
    /// Slots in device memory on `ctx`'s device (`create`), or the context this process
    /// uses for the channel's device slots (`open`): the builder of a GPU channel.
    pub fn cuda(self, ctx: &Arc<CudaContext>) -> ChannelBuilder<Cuda> {
        let ChannelBuilder {
            segment, flavor, capacity, slot_count, slot_size, max_senders, ..
        } = self;
        ChannelBuilder {
            segment,
            flavor,
            capacity,
            slot_count,
            slot_size,
            max_senders,
            ctx: CudaSetup { ctx: ctx.clone(), ready: GpuReady::Event },
        }
    }
}

impl ChannelBuilder<Cuda> {
    /// How this process's senders of the channel signal that a slot's writes are done
    /// ([`GpuReady`]; default [`GpuReady::Event`]). Each sender's pool records its choice,
    /// and receivers follow it, whatever their own builder said.
    pub fn ready(mut self, ready: GpuReady) -> Self {
        self.ctx.ready = ready;
        self
    }
}

impl Sender<Cuda> {
    blocking! {
        /// Leases a free device slot (waiting, spin then sleep, until one is free) and
        /// enqueues on `stream` a wait for the slot's last release, so that work queued on
        /// `stream` after this runs only after the previous holder's reads. Blocks the CPU
        /// only for a free slot, never for GPU work.
        ///
        /// # Errors
        ///
        /// [`AcquireError::PeerDead`] when every slot is out and every receiver holding
        /// them has died; [`AcquireError::Corrupted`]; [`AcquireError::Cuda`] when the
        /// driver refused the wait. (`try_acquire_on`: [`AcquireError::Exhausted`].)
        pub fn acquire_on, acquire_on_timeout, acquire_on_deadline, try try_acquire_on
            (&self, stream: &Arc<CudaStream>) -> Result<Lease<Cuda>, AcquireError>
            => acquire_on_until;
    }

    /// As [`acquire_on`](Self::acquire_on), waiting for a free slot without blocking the
    /// thread (feature `async`; see [`Sender::acquire_async`]). Cancel-safe.
    ///
    /// # Errors
    ///
    /// As [`acquire_on`](Self::acquire_on).
    #[cfg(feature = "async")]
    pub async fn acquire_on_async(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<Lease<Cuda>, AcquireError> {
        self.acquire_async_with(|s, d| s.acquire_on_until(stream, d)).await
    }

    fn acquire_on_until(
        &self,
        stream: &Arc<CudaStream>,
        deadline: Deadline,
    ) -> Result<Lease<Cuda>, AcquireError> {
        let device = self.exported.as_ref().expect("a live sender has its device pool");
        let slot = self.take_slot(deadline)?;
        let view = DeviceLease {
            device: device.clone(),
            stream: stream.clone(),
            ptr: device.slot_ptr(slot.slot),
        };
        // Made first, so that an error below returns the slot.
        let lease = Lease::new(self.pool.clone(), slot, view);
        device.wait_release(slot.slot, stream).map_err(AcquireError::Cuda)?;
        Ok(lease)
    }
}

impl Lease<Cuda> {
    /// The slot's device address (valid for [`capacity`](Self::capacity) bytes).
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.slot.ptr
    }

    /// The stream the lease was taken on: write the slot in its order.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.slot.stream
    }
}

impl Receiver<Cuda> {
    blocking! {
        /// Receives a device message, waiting (spin, then sleep) until one arrives, and
        /// enqueues on `stream` a wait for the slot's ready event: work queued on `stream`
        /// after this sees the sender's writes. The CPU does not wait for the GPU. From a
        /// sender that chose [`GpuReady::HostFlag`], it waits instead, once it has taken
        /// the message, until the slot's ready flag says the writes are done (beyond the
        /// deadline, see [`GpuReady`]), and enqueues nothing: any stream sees them.
        ///
        /// # Errors
        ///
        /// [`RecvError::Disconnected`] once every sender has left and all they sent was
        /// received ([`RecvError::PeerDead`] when one of them died);
        /// [`RecvError::Corrupted`] (also when the descriptor's memory or
        /// event handle or device does not match its pool); [`RecvError::Pool`];
        /// [`RecvError::Cuda`]; host flags: [`RecvError::SenderGone`] or
        /// [`RecvError::PeerDead`] when the sender gave the pool up or died before its
        /// flag came. (`try_recv_on`: [`RecvError::Empty`].)
        pub fn recv_on, recv_on_timeout, recv_on_deadline, try try_recv_on
            (&self, stream: &Arc<CudaStream>) -> Result<Message<Cuda>, RecvError>
            => recv_on_until;
    }

    /// As [`Receiver::iter`], receiving onto `stream`.
    pub fn iter_on<'a>(
        &'a self,
        stream: &'a Arc<CudaStream>,
    ) -> impl Iterator<Item = Result<Message<Cuda>, RecvError>> + 'a {
        receive_iter(|| self.recv_on(stream), |e| matches!(e, RecvError::Disconnected))
    }

    /// As [`Receiver::try_iter`], receiving onto `stream`.
    pub fn try_iter_on<'a>(
        &'a self,
        stream: &'a Arc<CudaStream>,
    ) -> impl Iterator<Item = Result<Message<Cuda>, RecvError>> + 'a {
        receive_iter(
            || self.try_recv_on(stream),
            |e| matches!(e, RecvError::Empty | RecvError::Disconnected),
        )
    }

    /// As [`recv_on`](Self::recv_on), waiting for a message without blocking the thread
    /// (feature `async`; see [`Receiver::recv_async`]). Cancel-safe.
    ///
    /// # Errors
    ///
    /// As [`recv_on`](Self::recv_on).
    #[cfg(feature = "async")]
    pub async fn recv_on_async(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<Message<Cuda>, RecvError> {
        self.recv_async_with(|r, d| r.recv_on_until(stream, d)).await
    }

    pub(super) fn recv_on_until(
        &self,
        stream: &Arc<CudaStream>,
        deadline: Deadline,
    ) -> Result<Message<Cuda>, RecvError> {
        let Taken { pool, hold, desc, meta } = self.take(deadline)?;
        let device = pool.imported;
        let slot = hold.held.slot;
        if device.host_flags() {
            // On an error the hold goes, and the slot back unread.
            wait_ready_flag(&hold.pool, slot, desc.generation, self.wait_policy())?;
        } else {
            device.wait_ready(slot, stream).map_err(RecvError::Cuda)?;
        }
        let view = DeviceRead {
            ptr: device.slot_ptr(slot, desc.byte_offset),
            device,
            stream: stream.clone(),
            slot,
        };
        Ok(Message::new(hold, desc, meta, view))
    }
}

/// The fewest spins before a host-flag receive yields or naps: some tens of microseconds,
/// about what a sender's GPU takes to reach a send it has just made. A receiver's
/// [`WaitPolicy`] with more spins gets its own.
const FLAG_SPINS: u32 = 1 << 12;
/// Spinning, the sender is checked once per this many spins (some milliseconds; only a
/// policy with more spins than [`FLAG_SPINS`] gets there).
const FLAG_CHECK_SPINS: u32 = 1 << 18;
/// Once its spins and yields are spent, the wait first naps this long, for
/// [`FLAG_SHORT_NAPS_FOR`], with the thread's timer slack lowered to [`FLAG_NAP_SLACK_NS`].
/// Without MPS a flag comes a GPU context switch after its send (100–200 µs), and at the
/// default slack of 50 µs a nap of 4 µs lasts 60 µs: the receive overshot the flag by
/// 10–30 µs (runs AJ, AM).
const FLAG_SHORT_NAP: Duration = Duration::from_micros(4);
/// How long the short naps go on before the naps double: a few context switches' worth.
/// Not longer: in a VM a short nap is mostly the timer's own exits to the host, and the
/// thread's CPU time while it naps so is more than half its wall time (57 % on the H100 VM).
const FLAG_SHORT_NAPS_FOR: Duration = Duration::from_micros(500);
/// The timer slack of the short naps, in nanoseconds.
const FLAG_NAP_SLACK_NS: u64 = 1_000;
/// The longest nap of that wait; the sender is checked after each once naps are this long.
const FLAG_NAP_MAX: Duration = Duration::from_millis(1);

/// A host-flag pool's receive: waits until slot `slot`'s ready flag says that the send of
/// `generation` is done (the sender's stream wrote it after the slot's writes, fenced
/// system-wide), as the receiver's `policy` says: spinning (at least [`FLAG_SPINS`] times;
/// for a policy that never sleeps, `u32::MAX` times: minutes), yielding, then napping: naps
/// of 4 µs at a timer slack of 1 µs for [`FLAG_SHORT_NAPS_FOR`] (the thread's own slack is
/// put back after them), then naps doubling up to 1 ms. Not bounded by the receive's
/// deadline (the message is taken, and its writes are under way): it ends when the flag
/// comes, or the pool is retired ([`RecvError::SenderGone`]), or the sender's process has
/// exited, taking its GPU work with it ([`RecvError::PeerDead`]), which are checked after
/// the short naps, at each nap of 1 ms and every [`FLAG_CHECK_SPINS`] spins. A pid only
/// names the sender's process: a pid reused by another process in the meantime would keep
/// this waiting for a flag that cannot come.
fn wait_ready_flag(
    pool: &PoolSegment,
    slot: u32,
    generation: u64,
    policy: WaitPolicy,
) -> Result<(), RecvError> {
    let flag = pool.ready_flag(slot);
    // Generations wrap at 32 bits: the flag is at or past `generation` when their
    // difference, as a signed 32-bit number, is not negative. Acquire: pairs with the
    // sender's stream's write of the flag (`cuStreamWriteValue64`, whose default fence
    // orders the stream's earlier writes before it), so the payload is complete once seen.
    let done = || (flag.load(Ordering::Acquire) as u32).wrapping_sub(generation as u32) as i32 >= 0;
    let sender_gone = || {
        if pool.retired() {
            Some(RecvError::SenderGone)
        } else if process_exited(pool.owner_pid()) {
            Some(RecvError::PeerDead)
        } else {
            None
        }
    };
    // Spinning long (a policy that never sleeps), the sender is checked now and then.
    let mut checks = 0u32;
    let spun = spin_then_yield(
        policy,
        FLAG_SPINS,
        || done().then_some(Ok(())),
        || {
            checks += 1;
            if checks % (FLAG_CHECK_SPINS / 1024) != 0 {
                return None;
            }
            sender_gone().map(Err)
        },
    );
    if let Some(outcome) = spun {
        return outcome;
    }
    {
        let _slack = LowTimerSlack::new(FLAG_NAP_SLACK_NS);
        let napping = Instant::now();
        while napping.elapsed() < FLAG_SHORT_NAPS_FOR {
            if done() {
                return Ok(());
            }
            std::thread::sleep(FLAG_SHORT_NAP);
        }
    }
    let mut nap = FLAG_SHORT_NAP;
    loop {
        if done() {
            return Ok(());
        }
        if nap == FLAG_SHORT_NAP || nap == FLAG_NAP_MAX {
            if let Some(e) = sender_gone() {
                return Err(e);
            }
        }
        nap = (nap * 2).min(FLAG_NAP_MAX);
        std::thread::sleep(nap);
    }
}

impl Message<Cuda> {
    /// The tensor's device address.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.slot_view().ptr
    }

    /// The stream the message was received on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.slot_view().stream
    }

    /// Makes `stream` see the payload too: enqueues on it a wait for the slot's ready
    /// event, as [`Receiver::recv_on`] did on the message's own stream (from a
    /// [`GpuReady::HostFlag`] sender, nothing: the writes were done when it was
    /// received). For a reader that works on another stream than the one it received on
    /// (the Python package's DLPack export does this for the consumer's stream). The
    /// slot's release is still recorded on [`stream`](Self::stream) when the message
    /// drops: order the reads queued on `stream` before that (e.g.
    /// `msg.stream().join(&stream)`), or the slot may be written again under them.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the driver refused the wait.
    pub fn wait_on(&self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        let read = self.slot_view();
        read.device.wait_ready(read.slot, stream)
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
        let slice = unsafe { self.stream().upgrade_device_ptr(self.device_ptr(), len) };
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
