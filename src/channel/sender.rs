//! The sending side: [`Sender`] (a pool of slots registered in the channel, and the
//! producer end of its ring) and [`Lease`] (a slot being written).
//!
//! **Lease protocol** (see `pool::lease`): a lease pops a free slot and moves its record to
//! `LEASED(g+1)`; `send` stores `SENT` and pushes a descriptor naming the slot and `g+1`,
//! whose Release push publishes the bytes and the state; a lease dropped unsent goes back.
//!
//! **Who unlinks a pool.** Its sender may leave with messages in flight, so the pool's name
//! must outlive it. The sender sets `closed` (SeqCst) and then checks whether every slot is
//! free (SeqCst loads); a receiver returning a slot CASes it free (SeqCst) and then reads
//! `closed`. Of the departing sender and the last returner at least one sees "closed and
//! drained", and unlinks (a second unlink finds nothing).

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
#[cfg(feature = "cuda")]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::backend::sealed::Backend;
use super::backend::{Host, HostSlot};
use super::error::SendError;
use super::table::ChannelSegment;
use super::{Channel, Flavor};
use crate::descriptor::{Descriptor, TensorMeta};
use crate::layout::{MpmcCell, ParticipantId, SpscCell};
use crate::liveness::{AttachError, Blocked, Watch};
use crate::pool::{AcquireError, PoolSegment, SlotRef};
use crate::ring::{PushError, ShmStorage, Storage, mpmc, spsc};
use crate::wait::{Deadline, WaitPolicy, blocking};
#[cfg(feature = "async")]
use crate::{
    liveness::Role,
    wait::reactor::{Park, wait},
};

/// The producer end of a channel's descriptor ring.
pub(super) enum Ring {
    Spsc(spsc::Producer<Descriptor, ShmStorage<SpscCell<Descriptor>>>),
    Mpmc(mpmc::Producer<Descriptor, ShmStorage<MpmcCell<Descriptor>>>),
}

/// The producer end of a channel's ring, shared by its [`Sender`] and the host functions of
/// the sender's stream-ordered sends (feature `cuda`, `channel/staging.rs`), which publish
/// on a driver thread.
///
/// **Who touches the ring.** The sender's thread (`owner`) and host functions (`locked`).
/// While no stream-ordered send is pending (`staged` is 0) only the sender can: it uses the
/// ring with no lock, as before there were host functions (one load on the hot path).
/// While one is pending, both sides take `lock`. Only the sender raises `staged` (before
/// it enqueues a host function); a host function lowers it, under the lock, after its last
/// touch of the ring.
pub(super) struct Tx {
    ring: UnsafeCell<Ring>,
    staged: AtomicU32,
    lock: Mutex<()>,
    /// Stream-ordered sends whose descriptor could not be published (every receiver gone,
    /// or the ring corrupt): their slots went back to the pool.
    #[cfg(feature = "cuda")]
    pub(super) lost: AtomicU64,
    /// One entry per slot for stream-ordered sends, made on the first.
    #[cfg(feature = "cuda")]
    pub(super) staging: std::sync::OnceLock<Box<[Staged]>>,
    /// Where their host functions run, made on the first.
    #[cfg(feature = "cuda")]
    pub(super) lane: std::sync::OnceLock<crate::pool::pinned::Lane>,
}

/// A stream-ordered send waiting for its copy: the lease and its descriptor, handed to the
/// host function that publishes them (`channel/staging.rs`).
#[cfg(feature = "cuda")]
pub(super) type Staged = crate::pool::pinned::Handoff<(Lease<Host>, Descriptor), Tx>;

// SAFETY: the ring's producer is used by one thread at a time (see the type's docs:
// `owner` runs only on the sender's thread, a `Sender` not being `Sync`; `locked` and
// `owner` while `staged` > 0 hold `lock`); the producers themselves are `Send`.
unsafe impl Send for Tx {}
// SAFETY: as above.
unsafe impl Sync for Tx {}

impl Tx {
    /// The producer end of `channel`'s ring (SPSC: claiming the producer role).
    fn attach<B: Backend>(channel: &ChannelSegment<B>) -> Result<Self, AttachError> {
        let ring = match channel.flavor {
            Flavor::Spsc => Ring::Spsc(channel.ring.spsc_producer()?),
            Flavor::Mpmc => Ring::Mpmc(channel.ring.mpmc_producer()?),
        };
        Ok(Tx {
            ring: UnsafeCell::new(ring),
            staged: AtomicU32::new(0),
            lock: Mutex::new(()),
            #[cfg(feature = "cuda")]
            lost: AtomicU64::new(0),
            #[cfg(feature = "cuda")]
            staging: std::sync::OnceLock::new(),
            #[cfg(feature = "cuda")]
            lane: std::sync::OnceLock::new(),
        })
    }

    /// Runs `f` on the ring, from the sender's thread (never from a host function, and
    /// never nested: no `f` calls back into `Tx`).
    fn owner<R>(&self, f: impl FnOnce(&mut Ring) -> R) -> R {
        // Acquire: pairs with the Release decrement in `staged_done`: once a host function
        // has lowered it to 0, its touches of the ring happened before ours.
        if self.staged.load(Ordering::Acquire) == 0 {
            // SAFETY: no host function is pending or running (only this thread enqueues
            // them, after raising `staged`), and this thread is the sender's only user.
            return f(unsafe { &mut *self.ring.get() });
        }
        self.locked(f)
    }

    /// Runs `f` on the ring under the lock: host functions, and the sender while some are
    /// pending.
    pub(super) fn locked<R>(&self, f: impl FnOnce(&mut Ring) -> R) -> R {
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: every user of the ring while `staged` > 0 holds the lock; the owner's
        // lock-free use happens only at 0, which no host function is around to see.
        f(unsafe { &mut *self.ring.get() })
    }

    /// Stream-ordered sends enqueued and not yet published.
    #[cfg(feature = "cuda")]
    pub(super) fn staged(&self) -> u32 {
        self.staged.load(Ordering::Relaxed)
    }

    /// A stream-ordered send is about to be enqueued (the sender's thread).
    #[cfg(feature = "cuda")]
    pub(super) fn stage(&self) {
        // Relaxed: only this thread raises it; the host function is enqueued after, and
        // the driver orders its start after the enqueue.
        self.staged.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream-ordered send is done with the ring (a host function, holding the lock; or
    /// the sender, when its enqueue failed).
    #[cfg(feature = "cuda")]
    pub(super) fn staged_done(&self) {
        // Release: pairs with the Acquire load in `owner`.
        self.staged.fetch_sub(1, Ordering::Release);
    }

    /// Pushes `d`, waiting until `deadline`; an error does not carry the descriptor back
    /// (the lease it describes is what the caller gives back).
    fn push_until(&self, d: Descriptor, deadline: Deadline) -> Result<(), PushError<()>> {
        self.owner(|ring| ring.push_until(d, deadline))
    }

    /// Whether every receiver of the channel is gone (see `ring::peers_gone`).
    pub(super) fn receivers_gone(&self, probe: bool) -> Option<Blocked> {
        self.owner(|ring| match ring {
            Ring::Spsc(p) => p.consumers_gone(probe),
            Ring::Mpmc(p) => p.consumers_gone(probe),
        })
    }

    /// Whether a descriptor naming slot `slot` of pool `pool_id` at `generation` is still
    /// in the ring (SPSC: queued; MPMC: in a cell not yet freed). A receiver takes a slot
    /// before the descriptor leaves the ring (SPSC: before `head` moves; MPMC: before the
    /// cell is freed), so a receiver that died in between left both, and the next receiver
    /// takes the slot over with the message. Reads every such cell: slow paths only.
    fn queued(&self, pool_id: u32, slot: u32, generation: u32) -> bool {
        let names = |d: &Descriptor| {
            d.pool_id == pool_id && d.slot == slot && d.generation == u64::from(generation)
        };
        self.owner(|ring| match ring {
            Ring::Spsc(p) => p.any_queued(names),
            Ring::Mpmc(p) => p.any_unfreed(names),
        })
    }

    /// This endpoint's identity in the channel's ring.
    fn id(&self) -> ParticipantId {
        let id = self.owner(|ring| match ring {
            Ring::Spsc(p) => p.storage().watch().id(),
            Ring::Mpmc(p) => p.storage().watch().id(),
        });
        id.expect("an endpoint of a ring in shared memory is registered")
    }

    /// Where an async send parks: the ring's `not_full` word.
    #[cfg(feature = "async")]
    fn park(&self) -> Park {
        self.owner(|ring| match ring {
            Ring::Spsc(p) => p.storage().park(Role::Producer),
            Ring::Mpmc(p) => p.storage().park(Role::Producer),
        })
    }

    fn set_wait_policy(&self, policy: WaitPolicy) {
        self.owner(|ring| match ring {
            Ring::Spsc(p) => p.set_wait_policy(policy),
            Ring::Mpmc(p) => p.set_wait_policy(policy),
        });
    }
}

impl Ring {
    /// Pushes `d`, waiting until `deadline`, without the descriptor in the error.
    pub(super) fn push_until(
        &mut self,
        d: Descriptor,
        deadline: Deadline,
    ) -> Result<(), PushError<()>> {
        let pushed = match self {
            Ring::Spsc(p) => p.push_until(d, deadline),
            Ring::Mpmc(p) => p.push_until(d, deadline),
        };
        pushed.map_err(|e| match e {
            PushError::Timeout(_) => PushError::Timeout(()),
            PushError::Disconnected(_) => PushError::Disconnected(()),
            PushError::PeerDead(_) => PushError::PeerDead(()),
            PushError::Corrupted(c) => PushError::Corrupted(c),
        })
    }
}

/// The sending end of a channel: owns a pool of slots, leases them, sends them.
///
/// `Send` but not `Sync`: one thread uses a sender at a time (in MPMC, make one sender
/// per thread; each gets its own pool). On a GPU channel (`Sender<Cuda>`) leases are taken
/// on a CUDA stream with `acquire_on`.
///
/// Dropping a sender with messages in flight is fine: they still arrive, even after this
/// process exits (host slots live in shared memory; the pool goes when the last slot comes
/// back), and its receivers get [`RecvError::Disconnected`](super::RecvError::Disconnected)
/// once they have them all. On a GPU channel device memory cannot outlive its process: the
/// drop waits up to 5 s for its slots to come back, then gives up what is still queued
/// (receivers get [`RecvError::SenderGone`](super::RecvError::SenderGone) for each, and
/// read nothing) and waits up to 5 s more for reads under way; memory a receiver still
/// holds after that is leaked until the process exits rather than freed under the read.
///
/// ```no_run
/// use gpuring::{Channel, DType, TensorMeta};
/// let ch = Channel::builder("frames").slots(8, 64 << 20).create()?;
/// let tx = ch.sender()?;
/// let mut lease = tx.acquire()?; // waits while every slot is in use
/// let meta = TensorMeta::contiguous(DType::F32, &[3, 2160, 2080])?;
/// lease[..4].copy_from_slice(&1.5f32.to_le_bytes()); // write the tensor in place
/// tx.send(lease, meta)?; // a descriptor travels, not the bytes
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Sender<B: Backend = Host> {
    pub(super) channel: Arc<ChannelSegment<B>>,
    pub(super) pool: Arc<PoolSegment>,
    /// What the backend made beside the pool segment (taken by `drop`).
    pub(super) exported: Option<B::Exported>,
    index: u32,
    pool_id: u32,
    free: mpmc::Consumer<u32, ShmStorage<MpmcCell<u32>>>,
    pub(super) tx: Arc<Tx>,
    pub(super) seq: Cell<u64>,
}

impl<B: Backend> core::fmt::Debug for Sender<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sender")
            .field("channel", &self.channel.segment.name())
            .field("pool", &self.pool.name())
            .field("seq", &self.seq.get())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Channel<B> {
    /// A sender: creates this sender's pool, registers it in the pool table and, for SPSC,
    /// claims the producer role.
    ///
    /// # Errors
    ///
    /// [`ChannelError::Attach`](super::ChannelError::Attach) (SPSC: another sender lives),
    /// [`ChannelError::PoolTableFull`](super::ChannelError::PoolTableFull), and what
    /// creating the pool segment (or, on a GPU channel, the device pool) can return.
    pub fn sender(&self) -> Result<Sender<B>, super::ChannelError> {
        let tx = Tx::attach(&self.inner)?;
        let queued = |pool_id, slot, generation| tx.queued(pool_id, slot, generation);
        let registered = self.inner.register_pool(tx.id(), &queued)?;
        Ok(Sender {
            channel: self.inner.clone(),
            free: registered.pool.core.free_consumer(),
            pool: Arc::new(registered.pool),
            exported: Some(registered.exported),
            index: registered.index,
            pool_id: (registered.instance << 16) | registered.index,
            tx: Arc::new(tx),
            seq: Cell::new(0),
        })
    }
}

impl<B: Backend> Sender<B> {
    /// Leases a free slot, waiting until `deadline` (the taking back of dead receivers'
    /// slots runs at the liveness ticks of the wait).
    pub(super) fn take_slot(&self, deadline: Deadline) -> Result<SlotRef, AcquireError> {
        let gone = |why| match why {
            Blocked::PeerDead => AcquireError::PeerDead,
            _ => AcquireError::Disconnected,
        };
        // Nobody would read what this lease becomes (one load while receivers are there).
        if let Some(why) = self.tx.receivers_gone(false) {
            return Err(gone(why));
        }
        let core = &self.pool.core;
        // At each liveness tick of the wait (it probes locks): slots of dead receivers are
        // taken back; if there were none, every receiver of the channel gone ends it.
        let tick = || {
            let queued = |slot, generation| self.queued(slot, generation);
            if core.reclaim_dead(B::holder_gone, queued) > 0 {
                return Ok(true);
            }
            self.tx.receivers_gone(true).map_or(Ok(false), Err)
        };
        let slot = core.lease_until(&self.free, deadline, tick)?;
        crate::fault::point("send_holding_lease");
        Ok(slot)
    }

    /// Whether a descriptor of this sender naming `slot` at `generation` is still in the
    /// ring (see `Tx::queued`).
    fn queued(&self, slot: u32, generation: u32) -> bool {
        self.tx.queued(self.pool_id, slot, generation)
    }

    blocking! {
        /// Sends a leased slot holding a tensor described by `meta` (use
        /// [`TensorMeta::bytes`] for plain bytes), waiting while the ring is full. Wakes a
        /// sleeping receiver, if any; makes no syscall otherwise. Panics if `lease` came
        /// from another sender.
        ///
        /// # Errors
        ///
        /// [`SendError::TooLarge`] (the lease back) when `meta` spans more than a slot;
        /// [`SendError::PeerDead`] (the lease back) when the ring stays full and every
        /// receiver has died; [`SendError::Corrupted`]; [`SendError::Cuda`] when the
        /// GPU side of the send failed. (`try_send`: [`SendError::Full`], the lease
        /// back.)
        pub fn send, send_timeout, send_deadline, try try_send(&self, lease: Lease<B>, meta: TensorMeta)
            -> Result<(), SendError<Lease<B>>> => send_until;
    }

    /// Sends a leased slot, waiting for room in the ring without blocking the thread
    /// (feature `async`): the task parks on the same wait word as [`send`](Self::send).
    /// Returns at once, with no syscall, when there is room. Takes `&mut self` so that the
    /// future is `Send` (a sender is not `Sync`).
    ///
    /// Cancel-safe in the sense of a channel send: a future dropped before it completes has
    /// sent nothing, and its lease goes back to the pool with it.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    #[cfg(feature = "async")]
    pub async fn send_async(
        &mut self,
        lease: Lease<B>,
        meta: TensorMeta,
    ) -> Result<(), SendError<Lease<B>>> {
        let mut lease = Some(lease);
        wait(
            self,
            |s| s.tx.park(),
            |s, d| match s.send_until(lease.take().expect("given back below until sent"), meta, d) {
                Err(SendError::Full(back) | SendError::Timeout(back)) => {
                    lease = Some(back);
                    None
                }
                done => Some(done),
            },
        )
        .await
    }

    /// Waits without blocking the thread for `take` (a lease form of this sender, given
    /// its deadline) to lease a slot or fail for good.
    #[cfg(feature = "async")]
    pub(super) async fn acquire_async_with<R>(
        &mut self,
        mut take: impl FnMut(&Self, Deadline) -> Result<R, AcquireError>,
    ) -> Result<R, AcquireError> {
        // Parks on the free ring; receivers, who return slots and may die holding them,
        // are all users of the channel's segment.
        let at = |s: &Self| s.free.storage().park(Role::Consumer).watching(s.tx.park());
        wait(self, at, |s, d| match take(s, d) {
            Err(AcquireError::Exhausted | AcquireError::Timeout) => None,
            done => Some(done),
        })
        .await
    }

    /// Fills a descriptor for `lease` (the backend adds its part), publishes it.
    fn send_until(
        &self,
        lease: Lease<B>,
        meta: TensorMeta,
        deadline: Deadline,
    ) -> Result<(), SendError<Lease<B>>> {
        let mut lease = self.sendable(lease, &meta)?;
        let slot = lease.hold.slot;
        let mut d = self.descriptor(&lease, &meta);
        B::fill(&lease.slot, slot.slot, &mut d).map_err(SendError::Cuda)?;
        self.pool.core.mark_sent(slot);
        match self.tx.push_until(d, deadline) {
            Ok(()) => {
                // Sent: the receiver owns the slot now, so the lease must not cancel it.
                lease.hold.pool = None;
                self.seq.set(self.seq.get().wrapping_add(1));
                Ok(())
            }
            Err(e) => {
                self.pool.core.unmark_sent(slot);
                Err(match e {
                    PushError::Timeout(_) if deadline == Deadline::Now => SendError::Full(lease),
                    PushError::Timeout(_) => SendError::Timeout(lease),
                    PushError::Disconnected(_) => SendError::Disconnected(lease),
                    PushError::PeerDead(_) => SendError::PeerDead(lease),
                    PushError::Corrupted(c) => SendError::Corrupted(c),
                })
            }
        }
    }

    /// The checks before any send of `lease` as `meta`: the lease is this sender's (else a
    /// panic), `meta` fits in its slot, and some receiver would read it (one load while
    /// receivers are there). The lease back on success, and in the error.
    pub(super) fn sendable(
        &self,
        lease: Lease<B>,
        meta: &TensorMeta,
    ) -> Result<Lease<B>, SendError<Lease<B>>> {
        let pool = lease.hold.pool.as_ref().expect("a live lease has its pool");
        assert!(Arc::ptr_eq(pool, &self.pool), "a lease must be sent by the sender it came from");
        let capacity = lease.capacity() as u64;
        if meta.nbytes() > capacity {
            return Err(SendError::TooLarge { lease, len: meta.nbytes(), capacity });
        }
        match self.tx.receivers_gone(false) {
            Some(Blocked::PeerDead) => Err(SendError::PeerDead(lease)),
            Some(_) => Err(SendError::Disconnected(lease)),
            None => Ok(lease),
        }
    }

    /// The descriptor of a send of `lease` as `meta`, with the next sequence number (the
    /// backend's fields left for `B::fill`).
    pub(super) fn descriptor(&self, lease: &Lease<B>, meta: &TensorMeta) -> Descriptor {
        let mut d = Descriptor::new(self.seq.get(), meta);
        d.tag = lease.hold.tag;
        d.pool_id = self.pool_id;
        d.slot = lease.hold.slot.slot;
        d.generation = u64::from(lease.hold.slot.generation);
        d
    }

    /// Slots in this sender's pool.
    pub fn slot_count(&self) -> u32 {
        self.pool.core.slot_count()
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.pool.slot_size()
    }

    /// Slots now free in this sender's pool (a snapshot; exact when nothing moves).
    pub fn free_slots(&self) -> usize {
        self.pool.core.free_slots()
    }

    /// The sequence number the next message will carry.
    pub fn next_seq(&self) -> u64 {
        self.seq.get()
    }

    /// This sender's pool id, as descriptors carry it.
    pub fn pool_id(&self) -> u32 {
        self.pool_id
    }

    /// The pool segment's name.
    pub fn pool_name(&self) -> &str {
        self.pool.name()
    }

    /// Sets how this sender waits, for a free slot and for room in the ring.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.free.set_wait_policy(policy);
        self.tx.set_wait_policy(policy);
    }

    /// Pushes a raw descriptor into the ring, bypassing the pool, waiting for room: for
    /// tests of what receivers do with forged descriptors (`internal::push_raw`).
    pub(crate) fn push_raw(&self, d: Descriptor) -> Result<(), PushError<()>> {
        self.tx.push_until(d, Deadline::Never)
    }
}

impl Sender<Host> {
    blocking! {
        /// Leases a free slot, waiting (spin, then sleep) until a receiver returns one.
        /// Slots held by receivers that died are taken back while it waits.
        ///
        /// # Errors
        ///
        /// [`AcquireError::PeerDead`] when every slot is out and every receiver holding
        /// them has died; [`AcquireError::Corrupted`] when the pool's shared state is
        /// impossible. (`try_acquire`: [`AcquireError::Exhausted`].)
        pub fn acquire, acquire_timeout, acquire_deadline, try try_acquire(&self)
            -> Result<Lease, AcquireError> => acquire_until;
    }

    /// Leases a free slot, waiting without blocking the thread (feature `async`): the task
    /// parks on the same wait word as [`acquire`](Self::acquire), and this process's waiter
    /// thread wakes it. Returns at once, with no syscall, when a slot is free.
    ///
    /// Cancel-safe: a future dropped before it completes has leased nothing.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use gpuring::{Channel, TensorMeta};
    /// let ch = Channel::builder("frames").slots(8, 1 << 20).create()?;
    /// let mut tx = ch.sender()?;
    /// let mut lease = tx.acquire_async().await?;
    /// lease[..5].copy_from_slice(b"hello");
    /// tx.send_async(lease, TensorMeta::bytes(5)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    #[cfg(feature = "async")]
    pub async fn acquire_async(&mut self) -> Result<Lease, AcquireError> {
        self.acquire_async_with(Self::acquire_until).await
    }

    fn acquire_until(&self, deadline: Deadline) -> Result<Lease, AcquireError> {
        let slot = self.take_slot(deadline)?;
        let view = HostSlot { ptr: self.pool.slot_ptr(slot.slot), len: self.pool.slot_size() };
        Ok(Lease::new(self.pool.clone(), slot, view))
    }
}

impl<B: Backend> Drop for Sender<B> {
    fn drop(&mut self) {
        // Stream-ordered sends still waiting for their copy publish first (up to 5 s; after
        // that they still do when their stream gets there: their host functions hold the
        // ring and the pool, and leak them rather than drop the last reference).
        #[cfg(feature = "cuda")]
        if let Some(lane) = self.tx.lane.get() {
            lane.settle(std::time::Duration::from_secs(5));
        }
        self.pool.close();
        if let Some(exported) = self.exported.take() {
            B::retire(exported, &self.pool);
        }
        self.channel.close_entry(self.index);
    }
}

/// A slot taken from a pool, and its return on drop unless it was sent.
#[derive(Debug)]
pub(super) struct SlotLease {
    pub(super) pool: Option<Arc<PoolSegment>>,
    pub(super) slot: SlotRef,
    pub(super) tag: u64,
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            if pool.core.cancel(self.slot) {
                // The sender may have left while this lease was out.
                pool.unlink_if_drained();
            }
        }
    }
}

/// A leased slot: write it in place, then [`Sender::send`] it. Dropping a lease without
/// sending it returns the slot to the pool.
///
/// A host lease (`Lease`, `Lease<Host>`) derefs to the slot's bytes; a GPU lease
/// (`Lease<Cuda>`) gives the slot's device address, to be written in the order of the
/// stream it was taken on.
///
/// ```no_run
/// use gpuring::{Channel, TensorMeta};
/// let ch = Channel::builder("frames").create()?;
/// let tx = ch.sender()?;
/// let mut lease = tx.acquire()?;
/// lease[..5].copy_from_slice(b"hello");
/// lease.set_tag(42); // travels in the descriptor
/// tx.send(lease, TensorMeta::bytes(5))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Lease<B: Backend = Host> {
    pub(super) hold: SlotLease,
    pub(super) slot: B::LeaseSlot,
}

impl<B: Backend> core::fmt::Debug for Lease<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Lease")
            .field("slot", &self.hold.slot.slot)
            .field("generation", &self.hold.slot.generation)
            .field("tag", &self.hold.tag)
            .field("memory", &self.slot)
            .finish()
    }
}

impl<B: Backend> Lease<B> {
    pub(super) fn new(pool: Arc<PoolSegment>, slot: SlotRef, view: B::LeaseSlot) -> Self {
        Self { hold: SlotLease { pool: Some(pool), slot, tag: 0 }, slot: view }
    }

    /// Slot index in the pool.
    pub fn slot(&self) -> u32 {
        self.hold.slot.slot
    }

    /// This lease's generation of the slot.
    pub fn generation(&self) -> u32 {
        self.hold.slot.generation
    }

    /// Bytes the slot holds.
    pub fn capacity(&self) -> usize {
        self.hold.pool.as_ref().map_or(0, |p| p.slot_size())
    }

    /// Sets the application tag the descriptor will carry.
    pub fn set_tag(&mut self, tag: u64) {
        self.hold.tag = tag;
    }
}

impl Deref for Lease<Host> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // (A hostile process with the pool mapped could still write: crate docs, Safety.)
        // SAFETY: `len` bytes of the slot inside the mapping the lease keeps alive; the
        // lease protocol makes this process the slot's only user until it is sent.
        unsafe { std::slice::from_raw_parts(self.slot.ptr.as_ptr(), self.slot.len) }
    }
}

impl DerefMut for Lease<Host> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view in this process.
        unsafe { std::slice::from_raw_parts_mut(self.slot.ptr.as_ptr(), self.slot.len) }
    }
}
