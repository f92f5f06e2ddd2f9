//! The receiving side: [`Receiver`], the consumer end of the channel's ring and the pools
//! it has mapped (messages are `message.rs`'s).
//!
//! **Validation.** Before any use a receiver checks, from the descriptor read once: pool
//! index inside the table; the entry active or closed with the same instance (else "unknown
//! pool"); the entry's slot count, size and backend equal the channel's; the stored segment
//! name equals the derived one; tensor metadata valid; slot in range; `byte_offset + len`
//! within the slot; `meta.nbytes() == len`; `header_len` within the slot's header; the
//! backend's own fields (host: device −1; GPU: device, memory and event handles those of
//! the pool); and finally the
//! `SENT(g) → HELD(g)` CAS (else "stale slot generation" or "slot not in flight"). A
//! rejected descriptor is consumed and reported as [`RecvError::Corrupted`]; nothing in the
//! pool changes and the next receive carries on.
//!
//! A receiver takes a message's slot *before* the descriptor leaves the ring (SPSC: before
//! `head` moves; MPMC: before its cell is freed), so one killed in between leaves the
//! message for the next receiver, which takes the slot over from the dead holder.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use super::backend::{Backend, Host};
use super::error::{RecvError, RecvTimeoutError, TryRecvError};
use super::message::Message;
use super::table::ChannelSegment;
use super::{Channel, Flavor};
use crate::descriptor::{Descriptor, TensorMeta};
use crate::layout::{MpmcCell, ParticipantId, SpscCell};
use crate::liveness::{AttachError, Tick, Watch};
use crate::pool::{PoolSegment, SlotHold};
use crate::ring::{PopTimeoutError, ShmStorage, Storage, broadcast, mpmc, spsc};
#[cfg(feature = "async")]
use crate::wait::reactor::Parked;
use crate::wait::{Deadline, WaitPolicy, blocking, receive_iter};
use crate::{liveness::Role, wait::reactor::Park};

mod checks;
mod lagging;
mod pools;

/// The consumer end of a channel's descriptor ring.
enum Rx {
    // The SPSC consumer caches positions (`&mut`); no method re-enters.
    Spsc(RefCell<spsc::Consumer<Descriptor, ShmStorage<SpscCell<Descriptor>>>>),
    Mpmc(mpmc::Consumer<Descriptor, ShmStorage<MpmcCell<Descriptor>>>),
    Broadcast(RefCell<broadcast::Reader<Descriptor, ShmStorage<SpscCell<Descriptor>>>>),
}

impl Rx {
    /// The consumer end of `channel`'s ring (SPSC: claiming the consumer role).
    fn attach<B: Backend>(channel: &ChannelSegment<B>) -> Result<Self, AttachError> {
        Ok(match channel.flavor {
            Flavor::Spsc => Rx::Spsc(RefCell::new(channel.ring.spsc_consumer()?)),
            // Sole: a receiver is not `Sync` and never clones its end.
            Flavor::Mpmc => Rx::Mpmc(channel.ring.mpmc_consumer(true)?),
            Flavor::Broadcast => Rx::Broadcast(RefCell::new(channel.ring.broadcast_reader()?)),
        })
    }

    /// This endpoint's identity in the channel's ring.
    fn id(&self) -> ParticipantId {
        let id = match self {
            Rx::Spsc(c) => c.borrow().storage().watch().id(),
            Rx::Mpmc(c) => c.storage().watch().id(),
            Rx::Broadcast(c) => c.borrow().storage().watch().id(),
        };
        id.expect("an endpoint of a ring in shared memory is registered")
    }
}

/// A pool a receiver has mapped (and the backend imported).
#[derive(Debug)]
struct CachedPool<B: Backend> {
    instance: u32,
    seg: Arc<PoolSegment>,
    imported: B::Imported,
}

impl<B: Backend> Clone for CachedPool<B> {
    fn clone(&self) -> Self {
        Self { instance: self.instance, seg: self.seg.clone(), imported: self.imported.clone() }
    }
}

/// The receiving end of a channel: pops descriptors, checks them, maps pools on first
/// sight, and hands out [`Message`]s that read the sender's slot in place.
///
/// `Send` but not `Sync`. In MPMC, make one receiver per thread. The same calls serve
/// every backend: on a GPU channel (`Receiver<Cuda>`) a message is received in the order
/// of the receiver's CUDA stream (the channel handle's, or the one given to `set_cuda_stream`).
///
/// ```
/// # let _made = gpuring::internal::doc_channel("doc-receiver-fmt", 2)?;
/// use gpuring::Channel;
/// let ch = Channel::builder("doc-receiver-fmt").open()?;
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
    /// The pools this receiver mapped and refused (a GPU sender's, gone with its device
    /// memory), by table row and instance, until they drain: its ticks unlink one that
    /// drained with nobody left to (a receiver killed giving its last slot back). Dropped
    /// early, as `pools`.
    refused: RefCell<Vec<(u32, u32, Arc<PoolSegment>)>>,
    rx: Rx,
    /// What the backend keeps besides the ring (a GPU receiver's stream).
    pub(crate) receiving: B::Receiving,
    channel: Arc<ChannelSegment<B>>,
    /// This receiver's identity in the channel's ring (it closes dead senders' entries
    /// under it); kept here because the SPSC consumer is borrowed during a wait's tick.
    me: ParticipantId,
    /// Set when a message came from a pool whose sender died and that nobody has closed
    /// yet: the receive then closes it (`close_dead_senders`).
    saw_dead_owner: Cell<bool>,
    /// Set until the first receive, which looks for messages to deliver again (a receiver
    /// that replaces a dead one takes over what that one held).
    first: Cell<bool>,
    /// Per pool table row, `instance + 1` of a pool that a look for messages to deliver
    /// again could not map (gone, or refused): not tried again (0: none). Preallocated.
    unmapped: RefCell<Box<[u32]>>,
    /// Broadcast channels: this reader's bit in the slots' holders masks, and its end of
    /// the ring, which each of its messages' holds keeps (`pool::SharedHold`).
    shared: Option<(u64, Arc<ShmStorage<SpscCell<Descriptor>>>)>,
    /// Lagging broadcast channels: whether the ring is (its reader's reading), and what the
    /// receive after a `Lagged` returns (`lagging.rs`).
    lagging: bool,
    pending: Cell<Option<Result<Taken<B>, RecvTimeoutError<B>>>>,
}

/// A message taken, checked and held, not yet made ready by the backend.
struct Taken<B: Backend> {
    /// The backend's import of the message's pool.
    imported: B::Imported,
    hold: SlotHold,
    desc: Descriptor,
    meta: TensorMeta,
    /// Taken over from a receiver that died holding it.
    redelivered: bool,
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
        // A message kept after a `Lagged` goes first: its pool must not outlive the channel.
        drop(self.pending.take());
        if self.channel.segment.inherited() {
            return; // a forked child's copy: the parent's receiver leaves for itself
        }
        if let Rx::Broadcast(c) = &self.rx {
            // Out of the mask first: the slots only this reader's cursor held back (messages
            // it never read) can go back now, and nobody else may look before a tick.
            c.borrow().leave();
            let min = broadcast::slowest_now(c.borrow().storage());
            for pool in self.pools.get_mut().iter().flatten() {
                pool.seg.core.reclaim_all_sent(min);
            }
        }
        for pool in self.pools.get_mut().iter().flatten() {
            B::receiver_gone(&pool.imported);
        }
    }
}

impl<B: Backend> Channel<B> {
    /// A receiver; for SPSC, claims the consumer role.
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-receiver-receiver", 2)?;
    /// let ch = gpuring::Channel::builder("doc-receiver-receiver").open()?;
    /// let rx = ch.receiver()?;
    /// # drop(rx);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ChannelError::Attach`](super::ChannelError::Attach) (SPSC: another receiver
    /// lives; or the ring's positions are impossible).
    pub fn receiver(&self) -> Result<Receiver<B>, super::ChannelError<B>> {
        let rx = Rx::attach(&self.inner)?;
        let (shared, lagging) = match &rx {
            Rx::Broadcast(c) => {
                let c = c.borrow();
                (Some((1u64 << c.index(), Arc::new(c.storage().clone()))), c.is_lagging())
            }
            _ => (None, false),
        };
        let pools = (0..self.inner.max_pools()).map(|_| None).collect();
        let unmapped = vec![0; self.inner.max_pools() as usize].into_boxed_slice();
        Ok(Receiver {
            pools: RefCell::new(pools),
            refused: RefCell::new(Vec::new()),
            me: rx.id(),
            rx,
            receiving: B::receiving(&self.inner.ctx),
            channel: self.inner.clone(),
            saw_dead_owner: Cell::new(false),
            first: Cell::new(true),
            unmapped: RefCell::new(unmapped),
            shared,
            lagging,
            pending: Cell::new(None),
        })
    }
}

/// Why a popped descriptor was refused, with its slot if it was taken (given back once
/// the descriptor has left the ring).
type Unheld<B> = (RecvTimeoutError<B>, Option<SlotHold>);

impl<B: Backend> Receiver<B> {
    /// Pops a descriptor, waiting until `deadline`, checks it and takes its slot, all
    /// before the descriptor leaves the ring (SPSC: before `head` moves; MPMC: before its
    /// cell is freed); `recv_until` then has the backend make the message. A receiver killed in between
    /// leaves the message for the next receiver (SPSC: the next pop; MPMC: a waiting
    /// receiver adopts it within a tick), which takes the slot over from the dead holder
    /// (`PoolCore::receive`).
    ///
    /// Where the channel delivers again (`ChannelBuilder::redeliver`), a message whose
    /// receiver died holding it comes first (`redeliver_one`): looked for on the first
    /// receive, on a receive after a sender hinted at one (`ChannelHeader::orphans`, one
    /// load), and at each liveness tick of a wait.
    ///
    /// A sender that died leaves its pool to the receivers: at each liveness tick of a
    /// wait, after a message from such a pool, and before `PeerDead` is returned, the pools
    /// of dead senders are closed (`close_dead_senders`).
    fn take_until(&self, deadline: Deadline) -> Result<Taken<B>, RecvTimeoutError<B>> {
        let redeliver = self.channel.redeliver;
        if redeliver && (self.first.get() || self.channel.orphans_hinted()) {
            self.first.set(false);
            self.channel.clear_orphans_hint();
            if let Some(taken) = self.redeliver_one() {
                // There may be more: the next receive looks again.
                self.channel.note_orphans();
                return taken;
            }
        }
        // The message taken goes here, and the wait passes on only whether it took one: a
        // `Taken` is some 600 bytes, which every layer of the wait would move again.
        let found = Cell::new(None);
        let keep = |taken: Result<Taken<B>, Unheld<B>>| taken.map(|t| found.set(Some(t)));
        let then = |d| keep(self.check_and_hold(d));
        let tick = || {
            self.close_dead_senders();
            match redeliver.then(|| self.redeliver_one()).flatten() {
                Some(taken) => Tick::Done(keep(taken.map_err(|why| (why, None)))),
                None => {
                    // After the look for messages to deliver again, which maps every pool.
                    self.unlink_drained_pools();
                    Tick::Idle
                }
            }
        };
        let popped = match &self.rx {
            Rx::Spsc(c) => c.borrow_mut().pop_then_ticking(deadline, then, tick),
            Rx::Mpmc(c) => c.pop_then_ticking(deadline, then, tick),
            Rx::Broadcast(c) => {
                // A lagging ring's jump ends the wait as a lag of the channel's (`recv_until`).
                let lagged =
                    |missed| self.lagging.then_some(Err((RecvTimeoutError::Lagged(missed), None)));
                c.borrow_mut().read_then_ticking(deadline, |_, d| then(d), lagged, tick)
            }
        };
        if matches!(popped, Ok(Ok(()))) {
            // The descriptor has left the ring; the message is this receiver's alone.
            crate::fault::point("recv_popped");
        }
        // A refused message's slot goes back only now that its descriptor has left the ring:
        // a receiver killed in between leaves the slot held by a dead receiver and the
        // descriptor in the ring (its cell won and unfreed), for the next one to refuse in
        // turn. Given back before, the slot would let the pool drain and go (a dead
        // sender's is unlinked then) while its descriptor waited to be adopted: the GPU
        // kill storms' rare "descriptor names a pool that no longer exists".
        let popped = popped.map(|r| {
            r.map_err(|(why, hold)| {
                drop(hold);
                why
            })
        });
        if self.saw_dead_owner.take() || matches!(popped, Err(PopTimeoutError::PeerDead)) {
            self.close_dead_senders();
        }
        popped.map_err(|e| match e {
            PopTimeoutError::Timeout => RecvTimeoutError::Timeout,
            PopTimeoutError::Disconnected => RecvTimeoutError::Disconnected,
            PopTimeoutError::PeerDead => RecvTimeoutError::PeerDead,
            PopTimeoutError::Corrupted(c) => RecvTimeoutError::Corrupted(c),
        })??;
        Ok(found.take().expect("a receive that succeeded took a message"))
    }

    /// Whether the sender of pool `seg` died (the kernel marked its owner word: one load);
    /// a dead sender's pool that nobody has closed yet is noted for `recv_until` to close.
    fn note_owner(&self, seg: &PoolSegment) -> bool {
        let died = seg.owner_died();
        if died && !seg.is_closed() {
            self.saw_dead_owner.set(true);
        }
        died
    }

    /// The imports of the pools mapped so far (diagnostics of the backends).
    pub(crate) fn imported(&self) -> Vec<B::Imported> {
        self.pools.borrow().iter().flatten().map(|p| p.imported.clone()).collect()
    }

    /// Where an async receive or a select parks: the ring's `not_empty` word.
    pub(super) fn park(&self) -> Park {
        match &self.rx {
            Rx::Spsc(c) => c.borrow().storage().park(Role::Consumer),
            Rx::Mpmc(c) => c.storage().park(Role::Consumer),
            Rx::Broadcast(c) => c.borrow().storage().park(Role::Consumer),
        }
    }

    /// One attempt, or one wait until `deadline`, as a select's take: `None` when there
    /// was nothing (`Timeout`, also for nothing now).
    pub(super) fn take(&mut self, deadline: Deadline) -> Option<Result<Message<B>, RecvError<B>>> {
        match self.recv_until(deadline) {
            Err(RecvTimeoutError::Timeout) => None,
            done => Some(done.map_err(RecvError::from_timeout)),
        }
    }

    /// Sets how this receiver waits for a message (and, on a GPU channel, for a host ready
    /// flag: see `GpuReady::HostFlag`, feature `cuda`).
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-receiver-set-wait-policy", 2)?;
    /// let ch = gpuring::Channel::builder("doc-receiver-set-wait-policy").open()?;
    /// let mut rx = ch.receiver()?;
    /// rx.set_wait_policy(gpuring::WaitPolicy::SLEEP); // sleep at once, never spin
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        match &mut self.rx {
            Rx::Spsc(c) => c.get_mut().set_wait_policy(policy),
            Rx::Mpmc(c) => c.set_wait_policy(policy),
            Rx::Broadcast(c) => c.get_mut().set_wait_policy(policy),
        }
    }

    /// How this receiver waits (as last set; [`WaitPolicy::default`] until then).
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-receiver-wait-policy", 2)?;
    /// let ch = gpuring::Channel::builder("doc-receiver-wait-policy").open()?;
    /// let rx = ch.receiver()?;
    /// assert_eq!(rx.wait_policy(), gpuring::WaitPolicy::default());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_policy(&self) -> WaitPolicy {
        match &self.rx {
            Rx::Spsc(c) => c.borrow().wait_policy(),
            Rx::Mpmc(c) => c.wait_policy(),
            Rx::Broadcast(c) => c.borrow().wait_policy(),
        }
    }

    blocking! {
        /// Receives a message, waiting (spin, then sleep) until one arrives. On a GPU
        /// channel, work queued on the receiver's stream after this call sees the sender's
        /// writes (see `GpuReady` for how).
        ///
        /// ```
        /// # let _made = gpuring::internal::doc_channel("doc-receiver-recv", 2)?;
        /// let ch = gpuring::Channel::builder("doc-receiver-recv").open()?;
        /// let rx = ch.receiver()?;
        /// let msg = rx.recv()?;
        /// println!("{} bytes", msg.len());
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        ///
        /// [`RecvError::Disconnected`] once every sender has left and all they sent was
        /// received; [`RecvError::PeerDead`] the same when one of them died;
        /// [`RecvError::Corrupted`] (the descriptor was refused; the next receive carries
        /// on); [`RecvError::Pool`]; [`RecvError::Device`] and (GPU channels)
        /// [`RecvError::SenderGone`]. (`try_recv`: [`TryRecvError::Empty`].)
        pub fn recv -> RecvError<B>, recv_timeout, recv_deadline -> RecvTimeoutError<B>,
            try try_recv -> TryRecvError<B>;
            (&self) -> Message<B> => recv_until;
        examples {
            timeout {
                /// ```
                /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-receiver-recv-timeout");
                /// use std::time::Duration;
                /// use gpuring::RecvTimeoutError;
                /// let ch = gpuring::Channel::builder("doc-receiver-recv-timeout").create()?;
                /// let rx = ch.receiver()?;
                /// match rx.recv_timeout(Duration::from_millis(10)) {
                ///     Ok(msg) => println!("{} bytes", msg.len()),
                ///     Err(RecvTimeoutError::Timeout) => println!("nothing within 10 ms"),
                ///     Err(e) => return Err(e.into()),
                /// }
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
            deadline {
                /// ```
                /// # let _made = gpuring::internal::doc_channel("doc-receiver-recv-deadline", 3)?;
                /// use std::time::{Duration, Instant};
                /// let ch = gpuring::Channel::builder("doc-receiver-recv-deadline").open()?;
                /// let rx = ch.receiver()?;
                /// let until = Instant::now() + Duration::from_secs(1); // for the whole batch
                /// let batch: Vec<_> = (0..3).map(|_| rx.recv_deadline(until)).collect::<Result<_, _>>()?;
                /// assert_eq!(batch.len(), 3);
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
            try {
                /// ```
                /// # let _made = gpuring::internal::doc_channel("doc-receiver-try-recv", 1)?;
                /// use gpuring::TryRecvError;
                /// let ch = gpuring::Channel::builder("doc-receiver-try-recv").open()?;
                /// let rx = ch.receiver()?;
                /// let first = rx.try_recv()?; // was waiting
                /// // Its one sender has left and everything was received:
                /// assert!(matches!(rx.try_recv(), Err(TryRecvError::Disconnected)));
                /// # drop(first);
                /// # Ok::<(), Box<dyn std::error::Error>>(())
                /// ```
            }
        }
    }

    /// The messages as they arrive, until every sender has left and all they sent has been
    /// received ([`RecvError::Disconnected`] ends it quietly). A lagging broadcast
    /// channel's [`RecvError::Lagged`] is yielded and the messages go on; any other error
    /// is yielded, and ends it; call `iter` again to carry on after one.
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-receiver-iter", 2)?;
    /// use gpuring::Channel;
    /// let ch = Channel::builder("doc-receiver-iter").open_timeout(std::time::Duration::from_secs(5)).open()?;
    /// let rx = ch.receiver()?;
    /// let mut bytes = 0;
    /// for msg in rx.iter() {
    ///     bytes += msg?.len(); // the slot goes back when `msg` drops
    /// }
    /// println!("every sender left; {bytes} bytes received");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = Result<Message<B>, RecvError<B>>> + '_ {
        let lagged = |e: &RecvError<B>| matches!(e, RecvError::Lagged(_));
        receive_iter(|| self.recv(), |e| matches!(e, RecvError::Disconnected), lagged)
    }

    /// The messages there now: ends quietly when the ring is empty
    /// ([`TryRecvError::Empty`]) or every sender has left
    /// ([`TryRecvError::Disconnected`]); a `Lagged` is yielded and the messages go on; any
    /// other error is yielded, and ends it.
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-receiver-try-iter", 2)?;
    /// let ch = gpuring::Channel::builder("doc-receiver-try-iter").open()?;
    /// let rx = ch.receiver()?;
    /// let waiting = rx.try_iter().filter(Result::is_ok).count();
    /// println!("{waiting} messages were waiting");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_iter(&self) -> impl Iterator<Item = Result<Message<B>, TryRecvError<B>>> + '_ {
        receive_iter(
            || self.try_recv(),
            |e| matches!(e, TryRecvError::Empty | TryRecvError::Disconnected),
            |e| matches!(e, TryRecvError::Lagged(_)),
        )
    }
}

#[cfg(feature = "async")]
impl<B: Backend> Receiver<B> {
    /// One poll of an async receive parked in `parked`: the one place an async receive is
    /// written (futures, streams).
    fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
        parked: &mut Parked,
    ) -> std::task::Poll<Result<Message<B>, RecvError<B>>> {
        parked.poll(cx, self, Self::park, |r, d| r.take(d))
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
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let _made = gpuring::internal::doc_channel("doc-receiver-recv-async", 2)?;
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use gpuring::Channel;
    /// let ch = Channel::builder("doc-receiver-recv-async").open()?;
    /// let mut rx = ch.receiver()?;
    /// let msg = rx.recv_async().await?;
    /// println!("{} bytes", msg.len());
    /// # Ok(()) }
    /// # futures::executor::block_on(run())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv).
    pub async fn recv_async(&mut self) -> Result<Message<B>, RecvError<B>> {
        let mut parked = Parked::default();
        std::future::poll_fn(|cx| self.poll_recv(cx, &mut parked)).await
    }

    /// The messages as a [`Stream`](futures_core::Stream) (feature `async`): as
    /// [`iter`](Self::iter), it ends quietly once every sender has left and everything was
    /// received, yields a `Lagged` and goes on, and ends after yielding any other error. Each item is a
    /// [`recv_async`](Self::recv_async), and as cancel-safe.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let _made = gpuring::internal::doc_channel("doc-receiver-stream", 2)?;
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use futures::StreamExt;
    /// let ch = gpuring::Channel::builder("doc-receiver-stream").open()?;
    /// let mut rx = ch.receiver()?;
    /// let mut messages = rx.stream();
    /// while let Some(msg) = messages.next().await {
    ///     println!("{} bytes", msg?.len());
    /// }
    /// # Ok(()) }
    /// # futures::executor::block_on(run())
    /// # }
    /// ```
    pub fn stream(&mut self) -> Messages<'_, B> {
        Messages { rx: self, parked: Parked::default(), ended: false }
    }
}

/// The messages of a [`Receiver`] as a [`Stream`](futures_core::Stream) (from
/// [`Receiver::stream`]).
#[cfg(feature = "async")]
#[derive(Debug)]
pub struct Messages<'a, B: Backend = Host> {
    rx: &'a mut Receiver<B>,
    parked: Parked,
    ended: bool,
}

#[cfg(feature = "async")]
impl<B: Backend> futures_core::Stream for Messages<'_, B> {
    type Item = Result<Message<B>, RecvError<B>>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let Self { rx, parked, ended } = self.get_mut();
        if *ended {
            return Poll::Ready(None);
        }
        match rx.poll_recv(cx, parked) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(m)) => Poll::Ready(Some(Ok(m))),
            // As `iter`: a `Lagged` is yielded and the messages go on; `Disconnected` ends it
            // quietly, any other error after it.
            Poll::Ready(Err(e @ RecvError::Lagged(_))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(Err(e)) => {
                *ended = true;
                Poll::Ready((!matches!(e, RecvError::Disconnected)).then_some(Err(e)))
            }
        }
    }
}

#[cfg(feature = "async")]
impl<B: Backend> futures_core::FusedStream for Messages<'_, B> {
    fn is_terminated(&self) -> bool {
        self.ended
    }
}
