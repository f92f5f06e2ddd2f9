//! The receiving side: [`Receiver`] (the consumer end of the channel's ring, and the pools
//! it has mapped) and [`Message`] (a received slot, returned on drop).
//!
//! **Validation.** Before any use a receiver checks, from the descriptor read once: pool
//! index inside the table; the entry active or closed with the same instance (else "unknown
//! pool"); the entry's slot count, size and backend equal the channel's; the stored segment
//! name equals the derived one; tensor metadata valid; slot in range; `byte_offset + len`
//! within the slot; `meta.nbytes() == len`; the backend's own fields (host: device −1;
//! GPU: device, memory and event handles those of the pool); and finally the
//! `SENT(g) → HELD(g)` CAS (else "stale slot generation" or "slot not in flight"). A
//! rejected descriptor is consumed and reported as [`RecvError::Corrupted`]; nothing in the
//! pool changes and the next receive carries on.
//!
//! A receiver takes a message's slot *before* the descriptor leaves the ring (SPSC: before
//! `head` moves; MPMC: before its cell is freed), so one killed in between leaves the
//! message for the next receiver, which takes the slot over from the dead holder.

use std::cell::RefCell;
use std::ops::Deref;
use std::sync::Arc;

use super::backend::sealed::Backend;
use super::backend::{Host, HostSlot};
use super::error::{RecvError, corrupt};
use super::table::ChannelSegment;
use super::{Channel, Flavor};
use crate::descriptor::{Descriptor, TensorMeta};
use crate::layout::{MpmcCell, SpscCell};
use crate::liveness::AttachError;
use crate::pool::{PoolSegment, SlotRef};
use crate::ring::{PopError, ShmStorage, mpmc, spsc};
use crate::wait::{Deadline, WaitPolicy, blocking, receive_iter};
#[cfg(feature = "async")]
use crate::{
    liveness::Role,
    wait::reactor::{Park, Parked},
};

/// The consumer end of a channel's descriptor ring.
enum Rx {
    // As `sender::Tx`: the SPSC consumer caches positions; no method re-enters.
    Spsc(RefCell<spsc::Consumer<Descriptor, ShmStorage<SpscCell<Descriptor>>>>),
    Mpmc(mpmc::Consumer<Descriptor, ShmStorage<MpmcCell<Descriptor>>>),
}

impl Rx {
    /// The consumer end of `channel`'s ring (SPSC: claiming the consumer role).
    fn attach<B: Backend>(channel: &ChannelSegment<B>) -> Result<Self, AttachError> {
        Ok(match channel.flavor {
            Flavor::Spsc => Rx::Spsc(RefCell::new(channel.ring.spsc_consumer()?)),
            Flavor::Mpmc => Rx::Mpmc(channel.ring.mpmc_consumer()?),
        })
    }
}

/// A pool a receiver has mapped (and the backend imported).
#[derive(Debug)]
pub(super) struct CachedPool<B: Backend> {
    instance: u32,
    pub(super) seg: Arc<PoolSegment>,
    pub(super) imported: B::Imported,
}

impl<B: Backend> Clone for CachedPool<B> {
    fn clone(&self) -> Self {
        Self { instance: self.instance, seg: self.seg.clone(), imported: self.imported.clone() }
    }
}

/// The receiving end of a channel: pops descriptors, checks them, maps pools on first
/// sight, and hands out [`Message`]s that read the sender's slot in place.
///
/// `Send` but not `Sync`. In MPMC, make one receiver per thread. On a GPU channel
/// (`Receiver<Cuda>`) messages are received onto a CUDA stream with `recv_on`.
///
/// ```no_run
/// use gpuring::Channel;
/// let ch = Channel::builder("frames").open()?;
/// let rx = ch.receiver()?;
/// let msg = rx.recv()?; // validated against the pool table
/// println!("{:?} {} bytes, tag {}", msg.meta().shape(), msg.len(), msg.tag());
/// drop(msg); // the slot goes back to the sender's pool
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Receiver<B: Backend = Host> {
    // Preallocated: one entry per pool table row, filled on first sight of a pool.
    // Dropped first (fields drop in order): when this receiver is the channel's last user,
    // the last-out removal of the channel's pools must not find them open by us.
    pools: RefCell<Box<[Option<CachedPool<B>>]>>,
    rx: Rx,
    channel: Arc<ChannelSegment<B>>,
}

impl<B: Backend> core::fmt::Debug for Receiver<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Receiver")
            .field("channel", &self.channel.segment.name())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Drop for Receiver<B> {
    fn drop(&mut self) {
        // Slot returns queued on streams (`Message::release_on`) run first (up to 5 s), so
        // that their host functions do not hold the last reference to a pool mapping.
        #[cfg(feature = "cuda")]
        for pool in self.pools.get_mut().iter().flatten() {
            pool.seg.settle(std::time::Duration::from_secs(5));
        }
    }
}

/// A descriptor that passed the checks, its slot taken.
pub(super) struct Taken<B: Backend> {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // GPU receives use its import
    pub(super) pool: CachedPool<B>,
    pub(super) hold: SlotHold,
    pub(super) desc: Descriptor,
    pub(super) meta: TensorMeta,
}

impl<B: Backend> Channel<B> {
    /// A receiver; for SPSC, claims the consumer role.
    ///
    /// # Errors
    ///
    /// [`ChannelError::Attach`](super::ChannelError::Attach) (SPSC: another receiver
    /// lives; or the ring's positions are impossible).
    pub fn receiver(&self) -> Result<Receiver<B>, super::ChannelError> {
        let rx = Rx::attach(&self.inner)?;
        let pools = (0..self.inner.max_pools()).map(|_| None).collect();
        Ok(Receiver { pools: RefCell::new(pools), rx, channel: self.inner.clone() })
    }
}

impl<B: Backend> Receiver<B> {
    /// Pops a descriptor, waiting until `deadline`, checks it and takes its slot, all
    /// before the descriptor leaves the ring (SPSC: before `head` moves; MPMC: before its
    /// cell is freed). A receiver killed in between leaves the message for the next
    /// receiver (SPSC: the next pop; MPMC: a waiting receiver adopts it within a tick),
    /// which takes the slot over from the dead holder (`PoolCore::receive`).
    pub(super) fn take(&self, deadline: Deadline) -> Result<Taken<B>, RecvError> {
        let then = |d| self.check_and_hold(d);
        let popped = match &self.rx {
            Rx::Spsc(c) => c.borrow_mut().pop_then_until(deadline, then),
            Rx::Mpmc(c) => c.pop_then_until(deadline, then),
        };
        match popped {
            Ok(taken) => taken,
            Err(PopError::Timeout) if deadline == Deadline::Now => Err(RecvError::Empty),
            Err(PopError::Timeout) => Err(RecvError::Timeout),
            Err(PopError::Disconnected) => Err(RecvError::Disconnected),
            Err(PopError::PeerDead) => Err(RecvError::PeerDead),
            Err(PopError::Corrupted(c)) => Err(RecvError::Corrupted(c)),
        }
    }

    /// Checks a popped descriptor against the pool table, its pool and the backend, then
    /// claims its slot.
    fn check_and_hold(&self, d: Descriptor) -> Result<Taken<B>, RecvError> {
        let (index, instance) = (d.pool_id & 0xFFFF, d.pool_id >> 16);
        if index >= self.channel.max_pools() {
            return Err(corrupt("descriptor names an unknown pool"));
        }
        let pool = self.pool_for(index, instance)?;
        let meta = d.meta().map_err(|_| corrupt("descriptor carries invalid tensor metadata"))?;
        if d.slot >= pool.seg.core.slot_count() {
            return Err(corrupt("descriptor names a slot out of range"));
        }
        let end = d.byte_offset.checked_add(d.len);
        if end.is_none_or(|e| e > pool.seg.slot_size() as u64) {
            return Err(corrupt("descriptor length is larger than the slot"));
        }
        if meta.nbytes() != d.len {
            return Err(corrupt("descriptor metadata is inconsistent with its length"));
        }
        B::check(&pool.imported, &d)?;
        let held = pool.seg.core.receive(d.slot, d.generation)?;
        let hold = SlotHold { pool: pool.seg.clone(), held };
        // The slot is ours: a sender giving its device memory up now waits for us, or we
        // see that it has (then the slot goes back unread, with `hold`).
        B::refuse(&hold.pool)?;
        // The slot is ours and the descriptor still in the ring.
        crate::fault::point("recv_holding");
        Ok(Taken { pool, hold, desc: d, meta })
    }

    /// The pool at table row `index`, registration `instance`: cached, or mapped (and
    /// imported) now.
    fn pool_for(&self, index: u32, instance: u32) -> Result<CachedPool<B>, RecvError> {
        let mut pools = self.pools.borrow_mut();
        let cached = &mut pools[index as usize];
        if let Some(pool) = cached {
            if pool.instance == instance {
                return Ok(pool.clone());
            }
        }
        let seg = Arc::new(self.channel.open_pool(index, instance)?);
        B::refuse(&seg)?; // a device pool whose sender has gone is not imported
        let imported = B::import(&self.channel.ctx, &seg)?;
        let pool = CachedPool { instance, seg, imported };
        *cached = Some(pool.clone());
        Ok(pool)
    }

    /// Where an async receive parks: the ring's `not_empty` word.
    #[cfg(feature = "async")]
    pub(super) fn park(&self) -> Park {
        match &self.rx {
            Rx::Spsc(c) => c.borrow().storage().park(Role::Consumer),
            Rx::Mpmc(c) => c.storage().park(Role::Consumer),
        }
    }

    /// One poll of an async receive by `recv` (a receive form of this receiver, given its
    /// deadline) parked in `parked`: the one place an async receive is written (futures,
    /// streams, `select_async`).
    #[cfg(feature = "async")]
    pub(super) fn poll_recv<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        parked: &mut Parked,
        mut recv: impl FnMut(&Self, Deadline) -> Result<R, RecvError>,
    ) -> std::task::Poll<Result<R, RecvError>> {
        parked.poll(cx, self, Self::park, |r, d| match recv(r, d) {
            Err(RecvError::Empty | RecvError::Timeout) => None,
            done => Some(done),
        })
    }

    /// Waits without blocking the thread for `recv` (a receive form of this receiver, given
    /// its deadline) to get a message or a final error.
    #[cfg(feature = "async")]
    pub(super) async fn recv_async_with<R>(
        &mut self,
        mut recv: impl FnMut(&Self, Deadline) -> Result<R, RecvError>,
    ) -> Result<R, RecvError> {
        let mut parked = Parked::default();
        std::future::poll_fn(|cx| self.poll_recv(cx, &mut parked, &mut recv)).await
    }

    /// Sets how this receiver waits for a message (and, on a GPU channel, for a host ready
    /// flag: see `GpuReady::HostFlag`, feature `cuda`).
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        match &mut self.rx {
            Rx::Spsc(c) => c.get_mut().set_wait_policy(policy),
            Rx::Mpmc(c) => c.set_wait_policy(policy),
        }
    }

    /// How this receiver waits (as last set; [`WaitPolicy::default`] until then).
    pub fn wait_policy(&self) -> WaitPolicy {
        match &self.rx {
            Rx::Spsc(c) => c.borrow().wait_policy(),
            Rx::Mpmc(c) => c.wait_policy(),
        }
    }
}

impl Receiver<Host> {
    blocking! {
        /// Receives a message, waiting (spin, then sleep) until one arrives.
        ///
        /// # Errors
        ///
        /// [`RecvError::Disconnected`] once every sender has left and all they sent was
        /// received; [`RecvError::PeerDead`] the same when one of them died;
        /// [`RecvError::Corrupted`] (the descriptor was refused; the next receive carries
        /// on); [`RecvError::Pool`]. (`try_recv`: [`RecvError::Empty`].)
        pub fn recv, recv_timeout, recv_deadline, try try_recv(&self)
            -> Result<Message, RecvError> => recv_until;
    }

    /// The messages as they arrive, until every sender has left and all they sent has been
    /// received ([`RecvError::Disconnected`] ends it quietly). Any other error is yielded,
    /// and ends it; call `iter` again to carry on after one.
    ///
    /// ```no_run
    /// use gpuring::Channel;
    /// let ch = Channel::builder("frames").open_timeout(std::time::Duration::from_secs(5)).open()?;
    /// let rx = ch.receiver()?;
    /// let mut bytes = 0;
    /// for msg in rx.iter() {
    ///     bytes += msg?.len(); // the slot goes back when `msg` drops
    /// }
    /// println!("every sender left; {bytes} bytes received");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = Result<Message, RecvError>> + '_ {
        receive_iter(|| self.recv(), |e| matches!(e, RecvError::Disconnected))
    }

    /// The messages there now: ends quietly when the ring is empty
    /// ([`RecvError::Empty`]) or every sender has left ([`RecvError::Disconnected`]); any
    /// other error is yielded, and ends it.
    pub fn try_iter(&self) -> impl Iterator<Item = Result<Message, RecvError>> + '_ {
        receive_iter(
            || self.try_recv(),
            |e| matches!(e, RecvError::Empty | RecvError::Disconnected),
        )
    }

    /// Receives a message, waiting without blocking the thread (feature `async`): the
    /// task parks on the same wait word as [`recv`](Self::recv), and this process's waiter
    /// thread wakes it (docs/DESIGN.md, "Async waits"). Runtime-agnostic (tokio, a plain
    /// `futures` executor, ...). Returns at once, with no syscall, when a message is there.
    /// Takes `&mut self` so that the future is `Send` (a receiver is not `Sync`).
    ///
    /// Cancel-safe: a future dropped before it completes has taken nothing; the message
    /// it would have received stays for the next receive.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use gpuring::Channel;
    /// let ch = Channel::builder("frames").open()?;
    /// let mut rx = ch.receiver()?;
    /// let msg = rx.recv_async().await?;
    /// println!("{} bytes", msg.len());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv).
    #[cfg(feature = "async")]
    pub async fn recv_async(&mut self) -> Result<Message, RecvError> {
        self.recv_async_with(Self::recv_until).await
    }

    /// The messages as a [`Stream`](futures_core::Stream) (feature `async`): as
    /// [`iter`](Self::iter), it ends quietly once every sender has left and everything was
    /// received, and ends after yielding any other error. Each item is a
    /// [`recv_async`](Self::recv_async), and as cancel-safe.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use futures::StreamExt;
    /// let ch = gpuring::Channel::builder("frames").open()?;
    /// let mut rx = ch.receiver()?;
    /// let mut messages = rx.stream();
    /// while let Some(msg) = messages.next().await {
    ///     println!("{} bytes", msg?.len());
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "async")]
    pub fn stream(&mut self) -> Messages<'_> {
        Messages { rx: self, parked: Parked::default(), ended: false }
    }

    pub(super) fn recv_until(&self, deadline: Deadline) -> Result<Message, RecvError> {
        let Taken { hold, desc, meta, .. } = self.take(deadline)?;
        // SAFETY: byte_offset + len <= slot_size (checked in `check_and_hold`), inside the
        // slot.
        let ptr = unsafe { hold.pool.slot_ptr(hold.held.slot).add(desc.byte_offset as usize) };
        Ok(Message::new(hold, desc, meta, HostSlot { ptr, len: desc.len as usize }))
    }
}

/// The messages of a host [`Receiver`] as a [`Stream`](futures_core::Stream) (from
/// [`Receiver::stream`]).
#[cfg(feature = "async")]
#[derive(Debug)]
pub struct Messages<'a> {
    rx: &'a mut Receiver<Host>,
    parked: Parked,
    ended: bool,
}

#[cfg(feature = "async")]
impl futures_core::Stream for Messages<'_> {
    type Item = Result<Message, RecvError>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let Self { rx, parked, ended } = self.get_mut();
        if *ended {
            return Poll::Ready(None);
        }
        match rx.poll_recv(cx, parked, Receiver::recv_until) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(m)) => Poll::Ready(Some(Ok(m))),
            Poll::Ready(Err(e)) => {
                // As `iter`: `Disconnected` ends it quietly, any other error after it.
                *ended = true;
                Poll::Ready((!matches!(e, RecvError::Disconnected)).then_some(Err(e)))
            }
        }
    }
}

#[cfg(feature = "async")]
impl futures_core::FusedStream for Messages<'_> {
    fn is_terminated(&self) -> bool {
        self.ended
    }
}

/// A slot held by a receiver, returned to its pool on drop.
#[derive(Debug)]
pub(super) struct SlotHold {
    pub(super) pool: Arc<PoolSegment>,
    pub(super) held: SlotRef,
}

impl SlotHold {
    /// The pool and the slot, without returning it: the caller does.
    #[cfg(feature = "cuda")]
    pub(super) fn into_parts(self) -> (Arc<PoolSegment>, SlotRef) {
        let hold = std::mem::ManuallyDrop::new(self);
        // SAFETY: `hold` is never used or dropped again; its pool is moved out once.
        (unsafe { std::ptr::read(&hold.pool) }, hold.held)
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        if self.pool.core.release(self.held) {
            self.pool.unlink_if_drained();
        }
    }
}

/// A received message: its metadata and a view of its slot, read in place. Dropping it
/// returns the slot to the sender's pool (and wakes the sender if it waits for one).
///
/// A host message (`Message`, `Message<Host>`) derefs to the payload's bytes; a GPU
/// message (`Message<Cuda>`) gives the payload's device address, valid in the order of the
/// stream it was received on.
///
/// ```no_run
/// use gpuring::Channel;
/// let ch = Channel::builder("frames").open()?;
/// let rx = ch.receiver()?;
/// let msg = rx.recv()?;
/// let first = f32::from_le_bytes(msg[..4].try_into()?);
/// assert_eq!(msg.meta().nbytes(), msg.len() as u64);
/// # let _ = first;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Message<B: Backend = Host> {
    // Dropped first: a GPU message records its release event before the slot goes back.
    slot: B::MessageSlot,
    hold: SlotHold,
    desc: Descriptor,
    meta: TensorMeta,
}

impl<B: Backend> core::fmt::Debug for Message<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Message")
            .field("seq", &self.desc.seq)
            .field("tag", &self.desc.tag)
            .field("pool_id", &self.desc.pool_id)
            .field("slot", &self.hold.held.slot)
            .field("generation", &self.hold.held.generation)
            .field("meta", &self.meta)
            .field("memory", &self.slot)
            .finish()
    }
}

impl<B: Backend> Message<B> {
    pub(super) fn new(
        hold: SlotHold,
        desc: Descriptor,
        meta: TensorMeta,
        slot: B::MessageSlot,
    ) -> Self {
        Self { slot, hold, desc, meta }
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // GPU messages read their view
    pub(super) fn slot_view(&self) -> &B::MessageSlot {
        &self.slot
    }

    /// The tensor metadata (checked).
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The sender's sequence number.
    pub fn seq(&self) -> u64 {
        self.desc.seq
    }

    /// The application tag.
    pub fn tag(&self) -> u64 {
        self.desc.tag
    }

    /// Bytes of payload.
    pub fn len(&self) -> usize {
        self.desc.len as usize
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.desc.len == 0
    }

    /// The descriptor as it arrived (already validated).
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }
}

impl Message<Host> {
    /// The pool mapping this message's slot lives in.
    #[cfg(feature = "cuda")]
    pub(super) fn pool(&self) -> &Arc<PoolSegment> {
        &self.hold.pool
    }

    /// The payload's bytes in the slot.
    #[cfg(feature = "cuda")]
    pub(super) fn host_view(&self) -> &HostSlot {
        &self.slot
    }

    /// The slot's pool and reference, for a return the caller makes.
    #[cfg(feature = "cuda")]
    pub(super) fn into_held(self) -> (Arc<PoolSegment>, SlotRef) {
        self.hold.into_parts()
    }
}

impl Receiver<Host> {
    /// The first pool mapped so far that could not be pinned: why.
    #[cfg(feature = "cuda")]
    pub(super) fn first_import_error(&self) -> Option<crate::pool::CudaError> {
        self.pools.borrow().iter().flatten().find_map(|p| p.imported)
    }
}

impl Deref for Message<Host> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes from `ptr` lie inside the slot (checked in `check_and_hold`),
        // in a mapping the pool keeps alive; this message holds the slot until it drops.
        unsafe { std::slice::from_raw_parts(self.slot.ptr.as_ptr(), self.slot.len) }
    }
}
