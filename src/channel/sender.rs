//! The sending side: [`Sender`], a pool of slots registered in the channel and the producer
//! end of its ring (its leases are `lease.rs`'s).
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

use std::cell::Cell;
use std::sync::Arc;

use super::backend::sealed::HoldsRing;
use super::backend::{Backend, Host};
use super::error::{
    AcquireError, AcquireTimeoutError, SendError, SendTimeoutError, TryAcquireError, TrySendError,
};
use super::lease::Lease;
use super::producer::ProducerRing;
use super::table::ChannelSegment;
use super::{Channel, Flavor};
use crate::descriptor::{Descriptor, TensorMeta};
use crate::layout::MpmcCell;
use crate::liveness::Blocked;
use crate::liveness::keeper::Vigil;
use crate::pool::{PoolSegment, SlotLease, SlotRef};
use crate::ring::broadcast::ReaderDropped;
use crate::ring::{PopTimeoutError, PushTimeoutError, ShmStorage, mpmc};
use crate::wait::{Deadline, WaitPolicy, blocking};

mod info;
#[cfg(feature = "async")]
use crate::{liveness::Role, wait::reactor::wait};

/// The sending end of a channel: owns a pool of slots, leases them, sends them.
///
/// `Send` but not `Sync`: one thread uses a sender at a time (in MPMC, make one sender
/// per thread; each gets its own pool). The same calls serve every backend: on a GPU
/// channel (`Sender<Cuda>`) a lease is taken in the order of the sender's CUDA stream
/// (the channel handle's, or the one given to `set_cuda_stream`).
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
/// ```
/// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-fmt");
/// use gpuring::{Channel, DType, TensorMeta};
/// let ch = Channel::builder("doc-sender-fmt").slots(8, 64 << 20).create()?;
/// let tx = ch.sender()?;
/// let mut lease = tx.acquire()?; // waits while every slot is in use
/// let meta = TensorMeta::contiguous(DType::F32, &[3, 2160, 2080])?;
/// lease[..4].copy_from_slice(&1.5f32.to_le_bytes()); // write the tensor in place
/// tx.send(lease, meta)?; // a descriptor travels, not the bytes
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Sender<B: Backend = Host> {
    pub(crate) channel: Arc<ChannelSegment<B>>,
    pub(crate) pool: Arc<PoolSegment>,
    /// The ring's producer end, and what the backend made beside the pool segment.
    pub(crate) sending: B::Sending,
    index: u32,
    pool_id: u32,
    free: mpmc::Consumer<u32, ShmStorage<MpmcCell<u32>>>,
    pub(crate) seq: Cell<u64>,
    /// Has the kernel mark the pool's `owner_word` if this process dies; dropped after
    /// `Drop::drop` has left (device memory freed), clearing the word.
    _vigil: Option<Vigil>,
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
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-sender");
    /// let ch = gpuring::Channel::builder("doc-sender-sender").create()?;
    /// let tx = ch.sender()?;
    /// assert_eq!(tx.free_slots(), 8); // the default pool: 8 slots of 1 MiB
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ChannelError::Attach`](super::ChannelError::Attach) (SPSC: another sender lives),
    /// [`ChannelError::PoolTableFull`](super::ChannelError::PoolTableFull), and what
    /// creating the pool segment (or the backend's part of the pool) can return.
    pub fn sender(&self) -> Result<Sender<B>, super::ChannelError<B>> {
        self.sender_with_slots(self.inner.slot_count, self.inner.slot_size)
    }

    /// A sender whose pool has slots of its own: `slot_count` slots of `slot_size` bytes
    /// instead of the channel's (see [`Channel::slots`]). Receivers take each sender's
    /// messages from its pool whatever its slots; what one sender's pool costs (host shared
    /// memory, or device memory) is its own. For a sender whose items outgrow the
    /// channel's slots, as a queue's putter of large tensors.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-own-slots");
    /// let ch = gpuring::Channel::builder("doc-sender-own-slots").mpmc().slots(4, 4096).create()?;
    /// let big = ch.sender_with_slots(2, 1 << 20)?;
    /// assert_eq!((big.slot_count(), big.slot_size()), (2, 1 << 20));
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ChannelError::InvalidPool`](super::ChannelError::InvalidPool) for slots out of
    /// range (as at create), and as [`sender`](Self::sender).
    pub fn sender_with_slots(
        &self,
        slot_count: u32,
        slot_size: u64,
    ) -> Result<Sender<B>, super::ChannelError<B>> {
        if crate::layout::PoolLayout::for_backend(B::CODE, slot_count, slot_size).is_none() {
            return Err(super::ChannelError::InvalidPool { slot_count, slot_size });
        }
        let mut ring = ProducerRing::attach(&self.inner.ring, self.inner.flavor)?;
        let queued = |pool_id, slot, generation| ring.queued(pool_id, slot, generation);
        let slots = (slot_count, slot_size);
        let registered = self.inner.register_pool(ring.id(), &queued, slots)?;
        let vigil = registered.pool.watch_owner();
        let pool = Arc::new(registered.pool);
        // Broadcast: a dead reader dropped at a tick of a push lets go of its slots too.
        let holds = pool.clone();
        ring.on_reader_dropped(ReaderDropped(Box::new(move |i| holds.core.clear_holder(i))));
        Ok(Sender {
            channel: self.inner.clone(),
            free: pool.core.free_consumer(),
            _vigil: vigil,
            pool,
            sending: B::sending(&self.inner.ctx, ring, registered.made),
            index: registered.index,
            pool_id: (registered.instance << 16) | registered.index,
            seq: Cell::new(0),
        })
    }
}

impl<B: Backend> Sender<B> {
    /// Runs `f` on the ring's producer end.
    fn ring<R>(&self, f: impl FnOnce(&mut ProducerRing) -> R) -> R {
        self.sending.with_ring(f)
    }

    /// Leases a free slot, waiting until `deadline` (the taking back of dead receivers'
    /// slots runs at the liveness ticks of the wait).
    fn take_slot(&self, deadline: Deadline) -> Result<SlotRef, AcquireTimeoutError<B>> {
        let gone = |why| match why {
            Blocked::PeerDead => AcquireTimeoutError::PeerDead,
            _ => AcquireTimeoutError::Disconnected,
        };
        // Nobody would read what this lease becomes (one load while receivers are there).
        if let Some(why) = self.ring(|r| r.receivers_gone(false)) {
            return Err(gone(why));
        }
        let core = &self.pool.core;
        // At each liveness tick of the wait (it probes locks): slots of dead receivers are
        // taken back (or, where messages are delivered again, the receivers told to take
        // the messages those held); if there were none, every receiver of the channel gone
        // ends it.
        let redeliver = self.channel.redeliver;
        let tick = || {
            let queued = |slot, generation| self.queued(slot, generation);
            let mut found = core.reclaim_dead(B::holder_gone, queued, redeliver);
            if self.channel.flavor == Flavor::Broadcast {
                found.back += self.make_room(true);
            }
            if found.orphans > 0 {
                self.channel.note_orphans();
            }
            if found.back > 0 {
                return Ok(true);
            }
            self.ring(|r| r.receivers_gone(true)).map_or(Ok(false), Err)
        };
        if self.channel.flavor == Flavor::Broadcast {
            // Slots whose readers are all done come back here (or with their last reader's
            // drop): look before waiting (or saying there is none).
            match core.lease_until(&self.free, Deadline::Now, || Ok(false)) {
                Ok(slot) => return Ok(slot),
                Err(PopTimeoutError::Corrupted(c)) => {
                    return Err(AcquireTimeoutError::Corrupted(c));
                }
                Err(_) => _ = self.make_room(false),
            }
        }
        let slot = core.lease_until(&self.free, deadline, tick).map_err(|e| match e {
            PopTimeoutError::Timeout => AcquireTimeoutError::Timeout,
            PopTimeoutError::PeerDead => AcquireTimeoutError::PeerDead,
            PopTimeoutError::Disconnected => AcquireTimeoutError::Disconnected,
            PopTimeoutError::Corrupted(c) => AcquireTimeoutError::Corrupted(c),
        })?;
        crate::fault::point("send_holding_lease");
        Ok(slot)
    }

    /// Broadcast channels: puts back on the free ring every sent slot whose message every
    /// reader has passed and dropped (`pool::lease::shared`); with `ticking`, first drops
    /// the readers that died (their holds cleared under their places' locks). How many
    /// came back (0 for the other flavors).
    fn reclaim_broadcast(&self, ticking: bool) -> u32 {
        let core = &self.pool.core;
        self.ring(|r| {
            if ticking {
                r.drop_dead_readers(core.holders());
            }
            r.slowest().map_or(0, |min| core.reclaim_all_sent(min))
        })
    }

    /// Broadcast channels with no free slot: [`reclaim_broadcast`](Self::reclaim_broadcast),
    /// and where that found none and the channel is lagging, the retirement of the oldest
    /// message nobody holds (`PoolCore::retire_oldest`: a reader that has not read it yet
    /// is told it missed it). How many slots came back.
    fn make_room(&self, ticking: bool) -> u32 {
        let back = self.reclaim_broadcast(ticking);
        match self.ring(|r| r.lagging_next()) {
            Some(next) if back == 0 => u32::from(self.pool.core.retire_oldest(next)),
            _ => back,
        }
    }

    /// Whether a descriptor of this sender naming `slot` at `generation` is still in the
    /// ring (see `ProducerRing::queued`).
    fn queued(&self, slot: u32, generation: u32) -> bool {
        self.ring(|r| r.queued(self.pool_id, slot, generation))
    }

    blocking! {
        /// Leases a free slot, waiting (spin, then sleep) until a receiver returns one.
        /// Slots held by receivers that died come back while it waits: their messages go
        /// to the next receiver first (the default; see
        /// [`ChannelBuilder::redeliver`](crate::ChannelBuilder::redeliver)), or, without
        /// redelivery, they are taken back at once. On a GPU
        /// channel, the sender's stream is made to wait for the slot's last reader (the CPU
        /// waits only for a free slot, never for GPU work), and kernels written on that
        /// stream after this call write the slot.
        ///
        /// ```
        /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-acquire");
        /// let ch = gpuring::Channel::builder("doc-sender-acquire").slots(2, 4096).create()?;
        /// let tx = ch.sender()?;
        /// let mut lease = tx.acquire()?;
        /// lease[..5].copy_from_slice(b"hello");
        /// tx.send(lease, gpuring::TensorMeta::bytes(5))?;
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        ///
        /// [`AcquireError::PeerDead`] when every slot is out and the channel has no
        /// receiver left to return one, one of them having died; [`AcquireError::Disconnected`] when every receiver has left;
        /// [`AcquireError::Corrupted`] when the pool's shared state is impossible;
        /// [`AcquireError::Device`] when the backend's step failed (the slot goes back).
        /// (`try_acquire`: [`TryAcquireError::Exhausted`].)
        pub fn acquire -> AcquireError<B>, acquire_timeout, acquire_deadline -> AcquireTimeoutError<B>,
            try try_acquire -> TryAcquireError<B>;
            (&self) -> Lease<B> => acquire_until;
        examples {
            timeout {
                /// ```
                /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-acquire-timeout");
                /// use std::time::Duration;
                /// use gpuring::AcquireTimeoutError;
                /// let ch = gpuring::Channel::builder("doc-sender-acquire-timeout").slots(1, 4096).create()?;
                /// let tx = ch.sender()?;
                /// let held = tx.acquire()?; // the only slot
                /// let again = tx.acquire_timeout(Duration::from_millis(10));
                /// assert!(matches!(again, Err(AcquireTimeoutError::Timeout)));
                /// # drop(held);
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
            deadline {
                /// ```
                /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-acquire-deadline");
                /// use std::time::{Duration, Instant};
                /// let ch = gpuring::Channel::builder("doc-sender-acquire-deadline").slots(4, 4096).create()?;
                /// let tx = ch.sender()?;
                /// let until = Instant::now() + Duration::from_millis(100); // for the whole batch
                /// let batch = (0..4).map(|_| tx.acquire_deadline(until)).collect::<Result<Vec<_>, _>>()?;
                /// assert_eq!(batch.len(), 4);
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
            try {
                /// ```
                /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-try-acquire");
                /// use gpuring::TryAcquireError;
                /// let ch = gpuring::Channel::builder("doc-sender-try-acquire").slots(1, 4096).create()?;
                /// let tx = ch.sender()?;
                /// let held = tx.try_acquire()?;
                /// assert!(matches!(tx.try_acquire(), Err(TryAcquireError::Exhausted)));
                /// drop(held); // unsent: the slot goes back
                /// assert!(tx.try_acquire().is_ok());
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
        }
    }

    /// Leases a free slot, waiting without blocking the thread (feature `async`): the task
    /// parks on the same wait word as [`acquire`](Self::acquire), and this process's waiter
    /// thread wakes it. Returns at once, with no syscall, when a slot is free.
    ///
    /// Cancel-safe: a future dropped before it completes has leased nothing.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-acquire-async");
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use gpuring::{Channel, TensorMeta};
    /// let ch = Channel::builder("doc-sender-acquire-async").slots(8, 1 << 20).create()?;
    /// let mut tx = ch.sender()?;
    /// let mut lease = tx.acquire_async().await?;
    /// lease[..5].copy_from_slice(b"hello");
    /// tx.send_async(lease, TensorMeta::bytes(5)).await?;
    /// # Ok(()) }
    /// # futures::executor::block_on(run())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    #[cfg(feature = "async")]
    pub async fn acquire_async(&mut self) -> Result<Lease<B>, AcquireError<B>> {
        // Parks on the free ring; receivers, who return slots and may die holding them,
        // are all users of the channel's segment.
        let at = |s: &Self| s.free.storage().park(Role::Consumer).watching(s.ring(|r| r.park()));
        wait(self, at, |s, d| match s.acquire_until(d) {
            Err(AcquireTimeoutError::Timeout) => None,
            done => Some(done.map_err(AcquireError::from_timeout)),
        })
        .await
    }

    fn acquire_until(&self, deadline: Deadline) -> Result<Lease<B>, AcquireTimeoutError<B>> {
        let slot = self.take_slot(deadline)?;
        // Made first, so that an error below returns the slot.
        let hold = SlotLease { pool: Some(self.pool.clone()), slot, tag: 0, header_len: 0 };
        let view =
            B::lease(&self.sending, &self.pool, slot).map_err(AcquireTimeoutError::Device)?;
        Ok(Lease::new(hold, view))
    }

    blocking! {
        /// Sends a leased slot holding a tensor described by `meta` (use
        /// [`TensorMeta::bytes`] for plain bytes), waiting while the ring is full. Wakes a
        /// sleeping receiver, if any; makes no syscall otherwise. On a GPU channel the
        /// send is ordered after the work queued on the lease's stream: receivers see the
        /// slot's writes. Panics if `lease` came from another sender.
        ///
        /// ```
        /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-send");
        /// use gpuring::{Channel, DType, TensorMeta};
        /// let ch = Channel::builder("doc-sender-send").slots(2, 4096).create()?;
        /// let tx = ch.sender()?;
        /// let mut lease = tx.acquire()?;
        /// lease[..8].copy_from_slice(&[1.0f32, 2.0].map(f32::to_le_bytes).concat());
        /// tx.send(lease, TensorMeta::contiguous(DType::F32, &[2])?)?;
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        ///
        /// [`SendError::TooLarge`] (the lease back) when `meta` spans more than a slot;
        /// [`SendError::Disconnected`] (the lease back) when every receiver has left;
        /// [`SendError::PeerDead`] (the lease back) when the ring stays full and every
        /// receiver has died; [`SendError::Corrupted`]; [`SendError::Device`] when the
        /// backend's part of the send failed. (`try_send`: [`TrySendError::Full`], the
        /// lease back.)
        pub fn send -> SendError<B>, send_timeout, send_deadline -> SendTimeoutError<B>,
            try try_send -> TrySendError<B>;
            (&self, lease: Lease<B>, meta: TensorMeta) -> ()
            => send_until;
        examples {
            timeout {
                /// ```
                /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-send-timeout");
                /// use std::time::Duration;
                /// use gpuring::{Channel, SendTimeoutError, TensorMeta};
                /// let ch = Channel::builder("doc-sender-send-timeout").capacity(1).slots(2, 4096).create()?;
                /// let tx = ch.sender()?;
                /// tx.send(tx.acquire()?, TensorMeta::bytes(0))?; // the ring's one cell
                /// match tx.send_timeout(tx.acquire()?, TensorMeta::bytes(0), Duration::from_millis(10)) {
                ///     Err(SendTimeoutError::Timeout(lease)) => drop(lease), // back, unsent
                ///     other => panic!("{other:?}"),
                /// }
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
            deadline {
                /// ```
                /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-send-deadline");
                /// use std::time::{Duration, Instant};
                /// use gpuring::{Channel, TensorMeta};
                /// let ch = Channel::builder("doc-sender-send-deadline").slots(2, 4096).create()?;
                /// let tx = ch.sender()?;
                /// let until = Instant::now() + Duration::from_millis(100);
                /// for _ in 0..2 {
                ///     tx.send_deadline(tx.acquire_deadline(until)?, TensorMeta::bytes(0), until)?;
                /// }
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
            try {
                /// ```
                /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-try-send");
                /// use gpuring::{Channel, TensorMeta, TrySendError};
                /// let ch = Channel::builder("doc-sender-try-send").capacity(1).slots(2, 4096).create()?;
                /// let tx = ch.sender()?;
                /// tx.try_send(tx.acquire()?, TensorMeta::bytes(0))?;
                /// let full = tx.try_send(tx.acquire()?, TensorMeta::bytes(0));
                /// assert!(matches!(full, Err(TrySendError::Full(_)))); // the lease comes back
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
        }
    }

    /// Sends a leased slot, waiting for room in the ring without blocking the thread
    /// (feature `async`): the task parks on the same wait word as [`send`](Self::send).
    /// Returns at once, with no syscall, when there is room. Takes `&mut self` so that the
    /// future is `Send` (a sender is not `Sync`).
    ///
    /// Cancel-safe in the sense of a channel send: a future dropped before it completes has
    /// sent nothing, and its lease goes back to the pool with it.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-send-async");
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let ch = gpuring::Channel::builder("doc-sender-send-async").slots(2, 4096).create()?;
    /// let mut tx = ch.sender()?;
    /// let lease = tx.acquire_async().await?;
    /// tx.send_async(lease, gpuring::TensorMeta::bytes(0)).await?;
    /// # Ok(()) }
    /// # futures::executor::block_on(run())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    #[cfg(feature = "async")]
    pub async fn send_async(
        &mut self,
        lease: Lease<B>,
        meta: TensorMeta,
    ) -> Result<(), SendError<B>> {
        let mut lease = Some(lease);
        wait(
            self,
            |s| s.ring(|r| r.park()),
            |s, d| match s.send_until(lease.take().expect("given back below until sent"), meta, d) {
                Err(SendTimeoutError::Timeout(back)) => {
                    lease = Some(back);
                    None
                }
                done => Some(done.map_err(SendError::from_timeout)),
            },
        )
        .await
    }

    /// Fills a descriptor for `lease` (the backend adds its part), publishes it.
    fn send_until(
        &self,
        lease: Lease<B>,
        meta: TensorMeta,
        deadline: Deadline,
    ) -> Result<(), SendTimeoutError<B>> {
        let mut lease = self.sendable(lease, &meta).map_err(SendTimeoutError::from)?;
        let slot = lease.hold.slot;
        let mut d = self.descriptor(&lease, &meta);
        B::fill(&lease.slot, slot.slot, &mut d).map_err(SendTimeoutError::Device)?;
        if self.channel.redeliver {
            self.pool.write_sent(slot.slot, &d);
        }
        if self.channel.flavor == Flavor::Broadcast {
            let pos = self.ring(|r| r.next_position()).expect("a broadcast channel's ring");
            self.pool.core.set_sent_at(slot, pos);
        }
        self.pool.core.mark_sent(slot);
        match self.ring(|r| r.push_until(d, deadline)) {
            Ok(()) => {
                // Sent: the receiver owns the slot now, so the lease must not cancel it.
                lease.hold.pool = None;
                self.seq.set(self.seq.get().wrapping_add(1));
                Ok(())
            }
            Err(e) => {
                self.pool.core.unmark_sent(slot);
                Err(match e {
                    PushTimeoutError::Timeout(()) => SendTimeoutError::Timeout(lease),
                    PushTimeoutError::Disconnected(()) => SendTimeoutError::Disconnected(lease),
                    PushTimeoutError::PeerDead(()) => SendTimeoutError::PeerDead(lease),
                    PushTimeoutError::Corrupted(c) => SendTimeoutError::Corrupted(c),
                })
            }
        }
    }

    /// The checks before any send of `lease` as `meta`: the lease is this sender's (else a
    /// panic), `meta` fits in its slot, and some receiver would read it (one load while
    /// receivers are there). The lease back on success, and in the error.
    pub(crate) fn sendable(
        &self,
        lease: Lease<B>,
        meta: &TensorMeta,
    ) -> Result<Lease<B>, SendError<B>> {
        let pool = lease.hold.pool.as_ref().expect("a live lease has its pool");
        assert!(Arc::ptr_eq(pool, &self.pool), "a lease must be sent by the sender it came from");
        let capacity = lease.capacity() as u64;
        if meta.nbytes() > capacity {
            return Err(SendError::TooLarge { lease, len: meta.nbytes(), capacity });
        }
        match self.ring(|r| r.receivers_gone(false)) {
            Some(Blocked::PeerDead) => Err(SendError::PeerDead(lease)),
            Some(_) => Err(SendError::Disconnected(lease)),
            None => Ok(lease),
        }
    }

    /// The descriptor of a send of `lease` as `meta`, with the next sequence number (the
    /// backend's fields left for `B::fill`).
    pub(crate) fn descriptor(&self, lease: &Lease<B>, meta: &TensorMeta) -> Descriptor {
        let mut d = Descriptor::new(self.seq.get(), meta);
        d.tag = lease.hold.tag;
        d.header_len = lease.hold.header_len;
        d.pool_id = self.pool_id;
        d.slot = lease.hold.slot.slot;
        d.generation = u64::from(lease.hold.slot.generation);
        d
    }

    /// Sets how this sender waits, for a free slot and for room in the ring.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-set-wait-policy");
    /// let ch = gpuring::Channel::builder("doc-sender-set-wait-policy").slots(2, 4096).create()?;
    /// let mut tx = ch.sender()?;
    /// tx.set_wait_policy(gpuring::WaitPolicy::SLEEP); // sleep at once, never spin
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.free.set_wait_policy(policy);
        self.ring(|r| r.set_wait_policy(policy));
    }

    /// Pushes a raw descriptor into the ring, bypassing the pool, waiting for room: for
    /// tests of what receivers do with forged descriptors (`internal::push_raw`).
    pub(crate) fn push_raw(&self, d: Descriptor) -> Result<(), PushTimeoutError<()>> {
        self.ring(|r| r.push_until(d, Deadline::Never))
    }
}

impl<B: Backend> Drop for Sender<B> {
    fn drop(&mut self) {
        if self.pool.inherited() {
            return; // a forked child's copy: the parent's sender leaves for itself
        }
        if self.channel.flavor == Flavor::Broadcast {
            // What every reader is done with goes back first, so that the pool can drain
            // (and go) without this sender.
            self.reclaim_broadcast(false);
        }
        B::leave(&mut self.sending, &self.pool);
        self.channel.close_entry(self.index);
    }
}
