//! [`ChannelBuilder`]: the options of a channel, and creating or opening its segment.
//!
//! `create` writes the channel header, an empty pool table and the descriptor ring, and
//! publishes the segment; `open` reads every parameter once and checks it before anything
//! is mapped by it (a forged header is [`ChannelError::Corrupted`] or a size mismatch,
//! never an absurd mapping).

use std::sync::Arc;
use std::time::Duration;

use super::backend::Host;
use super::backend::sealed::Backend;
use super::error::ChannelError;
use super::table::{self, ChannelSegment, check_name, last_out, nonce};
use super::{Channel, Flavor};
use crate::descriptor::Descriptor;
use crate::layout::{
    BACKEND_CUDA, BACKEND_HOST, ChannelHeader, ChannelLayout, ChannelView, Corrupted, MAX_POOLS,
    MpmcCell, PoolLayout, SegmentHeader, SegmentKind, SpscCell, view,
};
use crate::ring::RingSegment;
use crate::shm::{SegmentOptions, ShmError, open_or_create, segment_options};
use crate::sync::Ordering;

impl Flavor {
    fn kind(self) -> SegmentKind {
        match self {
            Flavor::Spsc => SegmentKind::SpscChannel,
            Flavor::Mpmc => SegmentKind::MpmcChannel,
            Flavor::Broadcast => SegmentKind::BroadcastChannel,
        }
    }

    fn cell_size(self) -> usize {
        match self {
            Flavor::Spsc | Flavor::Broadcast => size_of::<SpscCell<Descriptor>>(),
            Flavor::Mpmc => size_of::<MpmcCell<Descriptor>>(),
        }
    }
}

/// Options for creating or opening a [`Channel`].
///
/// `create` uses every option; `open` uses the name, the flavor if one was set (else it
/// takes what it finds), the backend and how the segment is opened: capacity and slots are
/// the creator's. `cuda(&stream)` and `pinned(&ctx)` (feature `cuda`) make the builder one
/// of a GPU channel, or of a host channel whose slots this process pins.
///
/// ```
/// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-builder-new");
/// use std::time::Duration;
/// use gpuring::Channel;
/// let ch = Channel::builder("doc-builder-new")
///     .mpmc()
///     .capacity(1024)
///     .slots(16, 4 << 20) // each sender: 16 slots of 4 MiB
///     .max_senders(8)
///     .create()?;
/// let peer = Channel::builder("doc-builder-new").open_timeout(Duration::from_secs(5)).open()?;
/// # Ok::<(), gpuring::ChannelError>(())
/// ```
#[derive(Debug)]
pub struct ChannelBuilder<B: Backend = Host> {
    segment: SegmentOptions,
    opts: Options,
    pub(crate) ctx: B::Context,
}

/// The options besides the segment's and the backend's: the same for every backend.
#[derive(Debug, Clone, Copy)]
struct Options {
    flavor: Option<Flavor>,
    capacity: u64,
    slot_count: u32,
    slot_size: u64,
    max_senders: Option<u32>,
    redeliver: bool,
    lagging: bool,
}

// By hand: a derive would ask `B: Clone` of the backend marker, not of what is cloned.
impl<B: Backend> Clone for ChannelBuilder<B> {
    fn clone(&self) -> Self {
        Self { segment: self.segment.clone(), opts: self.opts, ctx: self.ctx.clone() }
    }
}

impl ChannelBuilder<Host> {
    /// Options for host channel `name`: SPSC, capacity 256, 8 slots of 1 MiB per sender.
    pub fn new(name: impl Into<String>) -> Self {
        let opts = Options {
            flavor: None,
            capacity: 256,
            slot_count: 8,
            slot_size: 1 << 20,
            max_senders: None,
            redeliver: true,
            lagging: false,
        };
        Self { segment: SegmentOptions::new(name.into()), opts, ctx: () }
    }

    /// The same options for the backend `C`, whose context is `ctx` (the GPU wing's
    /// builders).
    pub(crate) fn with_backend<C: Backend>(self, ctx: C::Context) -> ChannelBuilder<C> {
        ChannelBuilder { segment: self.segment, opts: self.opts, ctx }
    }
}

impl<B: Backend> ChannelBuilder<B> {
    /// One sender, one receiver (the default for `create`).
    pub fn spsc(mut self) -> Self {
        self.opts.flavor = Some(Flavor::Spsc);
        self
    }

    /// Any number of senders and receivers.
    pub fn mpmc(mut self) -> Self {
        self.opts.flavor = Some(Flavor::Mpmc);
        self
    }

    /// One sender, and up to 63 receivers that each get every message sent while they are
    /// attached, zero-copy: a slot goes back to the sender once every receiver it was
    /// delivered to has dropped its message. The slowest receiver holds the sender back
    /// (nothing is lost; a receiver that dies or leaves stops holding it within a liveness
    /// tick). A receiver that attaches later starts with the next message. Messages are not
    /// delivered again ([`redeliver`](Self::redeliver) is off: each receiver has its own
    /// copy of the delivery). With device slots, a receiver's drop does not wait for the
    /// reads it queued on its stream: its hold goes once they are done.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-builder-broadcast");
    /// use gpuring::{Channel, TensorMeta};
    /// let ch = Channel::builder("doc-builder-broadcast").broadcast().slots(4, 4096).create()?;
    /// let tx = ch.sender()?;
    /// let (a, b) = (ch.receiver()?, ch.receiver()?);
    /// let mut lease = tx.acquire()?;
    /// lease[..5].copy_from_slice(b"hello");
    /// tx.send(lease, TensorMeta::bytes(5))?;
    /// let (ma, mb) = (a.recv()?, b.recv()?); // the same slot, read in place by both
    /// assert_eq!((&ma[..], &mb[..]), (&b"hello"[..], &b"hello"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast(mut self) -> Self {
        self.opts.flavor = Some(Flavor::Broadcast);
        self
    }

    /// Broadcast channels: whether the sender never waits for a receiver that is behind
    /// (default `false`; set at create, `open` takes the creator's).
    ///
    /// By default ([`broadcast`](Self::broadcast)) the slowest receiver holds the sender
    /// back and nothing is lost. A *lagging* channel's sender, when it needs a slot and
    /// none is free, takes back the slot of the oldest message that no receiver holds now,
    /// even if some receiver has not read it yet; that receiver's next receive says how
    /// many it missed ([`RecvError::Lagged`](crate::RecvError::Lagged), as
    /// `tokio::sync::broadcast` does) and the one after goes on with the oldest message
    /// still there. The sender waits only while every slot holds a message that a receiver
    /// has in hand (received and not yet dropped): zero-copy, a message held is never
    /// rewritten. Choose it where the newest data matters more than every item (video
    /// frames, telemetry, the latest weights).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-builder-lagging");
    /// use gpuring::{Channel, RecvError, TensorMeta};
    /// let ch = Channel::builder("doc-builder-lagging").broadcast().lagging(true).slots(2, 64).create()?;
    /// let (tx, rx) = (ch.sender()?, ch.receiver()?);
    /// for i in 0..5u8 {
    ///     let mut lease = tx.try_acquire()?; // never waits: rx holds nothing
    ///     lease[0] = i;
    ///     tx.send(lease, TensorMeta::bytes(1))?;
    /// }
    /// assert!(matches!(rx.recv(), Err(RecvError::Lagged(3)))); // two slots: 3 and 4 are left
    /// assert_eq!((rx.recv()?[0], rx.recv()?[0]), (3, 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lagging(mut self, on: bool) -> Self {
        self.opts.lagging = on;
        self
    }

    /// Descriptor ring cells, a power of two in `1..=2^24` (`2..` for MPMC).
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.opts.capacity = capacity;
        self
    }

    /// Each sender's pool: `count` slots (`1..=2^20`) of `bytes` bytes each.
    pub fn slots(mut self, count: u32, bytes: u64) -> Self {
        self.opts.slot_count = count;
        self.opts.slot_size = bytes;
        self
    }

    /// Pool table entries: how many senders may have pools at once, counting departed
    /// senders whose messages are still in flight (default 4 for SPSC, 16 for MPMC).
    pub fn max_senders(mut self, n: u32) -> Self {
        self.opts.max_senders = Some(n);
        self
    }

    /// Whether a message whose receiver died holding it (killed after its `recv` took the
    /// message and before the message was dropped) is delivered again, to the next
    /// receiver that receives, marked [`Message::redelivered`](crate::Message::redelivered)
    /// (default `true`; set at create, `open` takes the creator's).
    ///
    /// With it, nothing sent is lost to a receiver's crash: each message reaches a live
    /// receiver at least once, and a receiver may see one a dead one had already acted on
    /// (the mark says so). Without it, such a message is dropped and its slot taken back:
    /// each message reaches a receiver at most once. Choose `false` where a late duplicate
    /// is worse than a gap (a live video frame, say). The cost of the default is a copy of
    /// each descriptor (384 bytes) beside its slot when it is sent, and one load per
    /// receive.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-builder-redeliver");
    /// let ch = gpuring::Channel::builder("doc-builder-redeliver").redeliver(false).create()?;
    /// assert!(!ch.redelivers());
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn redeliver(mut self, on: bool) -> Self {
        self.opts.redeliver = on;
        self
    }

    segment_options!();

    /// Creates the channel, exclusively, mode 0600. No pool exists until a sender is made.
    ///
    /// The channel lives while any process has it open, or a message waits in it; the last
    /// user out removes it (and its pools). A sender may send and exit at once: a receiver
    /// that opens it later gets every message.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-builder-create");
    /// use gpuring::{Channel, ChannelError, ShmError};
    /// let ch = Channel::builder("doc-builder-create").slots(4, 1 << 20).create()?;
    /// // The name is taken while the channel lives:
    /// let again = Channel::builder("doc-builder-create").create();
    /// assert!(matches!(again, Err(ChannelError::Segment(ShmError::AlreadyExists { .. }))));
    /// # drop(ch);
    /// # Ok::<(), ChannelError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ChannelError::InvalidCapacity`], [`ChannelError::InvalidPool`],
    /// [`ChannelError::InvalidConfig`]; [`ChannelError::Segment`] with
    /// [`ShmError::InvalidName`] (also beyond [`MAX_CHANNEL_NAME`](crate::MAX_CHANNEL_NAME)
    /// bytes), [`ShmError::AlreadyExists`], [`ShmError::NoSpace`],
    /// [`ShmError::PermissionDenied`] or [`ShmError::Io`].
    pub fn create(&self) -> Result<Channel<B>, ChannelError<B>> {
        let base = check_name(&self.segment.name)?;
        let flavor = self.opts.flavor.unwrap_or(Flavor::Spsc);
        let max_pools = self.opts.max_senders.unwrap_or(match flavor {
            Flavor::Spsc | Flavor::Broadcast => 4,
            Flavor::Mpmc => 16,
        });
        // Each broadcast receiver has its own delivery: none is delivered again.
        let redeliver = self.opts.redeliver && flavor != Flavor::Broadcast;
        if max_pools == 0 || max_pools > MAX_POOLS {
            return Err(ChannelError::InvalidConfig { reason: "max_senders must be in 1..=1024" });
        }
        let (slot_count, slot_size) = (self.opts.slot_count, self.opts.slot_size);
        if PoolLayout::for_backend(B::CODE, slot_count, slot_size).is_none() {
            return Err(ChannelError::InvalidPool { slot_count, slot_size });
        }
        if self.opts.lagging && flavor != Flavor::Broadcast {
            return Err(ChannelError::InvalidConfig {
                reason: "lagging applies to broadcast channels (`.broadcast()`)",
            });
        }
        if flavor == Flavor::Mpmc && self.opts.capacity < 2 {
            return Err(ChannelError::InvalidCapacity { capacity: self.opts.capacity });
        }
        let layout = ChannelLayout::new(max_pools, self.opts.capacity, flavor.cell_size())
            .ok_or(ChannelError::InvalidCapacity { capacity: self.opts.capacity })?;
        if self.segment.replace_stale {
            // The stale channel goes with its pools (their names carry its nonce).
            table::remove_stale(&self.segment.name)?;
        }
        let nonce = nonce();
        let segment = self.segment.create(flavor.kind(), layout.total_size, |seg| {
            // Ours alone until `create` publishes it; `layout` sized the segment.
            let h = ChannelView::with_layout(seg, layout).expect("sized by its layout").header;
            // Relaxed: published by the Release store of `init` in `Segment::create`.
            h.max_pools.store(max_pools, Ordering::Relaxed);
            h.slot_count.store(slot_count, Ordering::Relaxed);
            h.slot_size.store(slot_size, Ordering::Relaxed);
            h.nonce.store(nonce, Ordering::Relaxed);
            h.backend.store(B::CODE, Ordering::Relaxed);
            h.redeliver.store(u32::from(redeliver), Ordering::Relaxed);
            // Pool entries are zero (EMPTY) in a fresh object.
            match flavor {
                Flavor::Spsc | Flavor::Broadcast => RingSegment::init_in::<
                    Descriptor,
                    SpscCell<Descriptor>,
                >(seg, &layout.ring, |_| {
                    SpscCell::new()
                }),
                Flavor::Mpmc => RingSegment::init_in::<Descriptor, MpmcCell<Descriptor>>(
                    seg,
                    &layout.ring,
                    |i| MpmcCell::new(i as u64),
                ),
            }
            if self.opts.lagging {
                RingSegment::set_lagging_in(seg, &layout.ring);
            }
            Ok::<_, ShmError>(())
        })?;
        let params = Params { slot_count, slot_size, nonce, redeliver };
        Ok(self.channel(segment, layout, flavor, params, base))
    }

    /// Opens the channel if it exists, and creates it (with these options) where it does
    /// not: what a process that may be restarted calls, producer or consumer. A channel
    /// whose creator died (killed before any consumer came, say) is attached to as it is,
    /// with what waits in it; a restarted sender is a new sender of it (the dead one's pool
    /// is closed, its messages still delivered). Of several processes calling this at once,
    /// one creates the channel and the others open it. The options of an existing channel
    /// (capacity, slots) are its creator's.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-builder-open-or-create");
    /// use gpuring::{Channel, TensorMeta};
    /// let first = Channel::builder("doc-builder-open-or-create").slots(4, 4096).open_or_create()?;
    /// let tx = first.sender()?;
    /// tx.send(tx.acquire()?, TensorMeta::bytes(0))?;
    /// drop((tx, first)); // a message waits: the channel stays
    /// // A restarted producer gets the channel back, message and all:
    /// let again = Channel::builder("doc-builder-open-or-create").open_or_create()?;
    /// assert_eq!(again.receiver()?.try_iter().count(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open) for a channel that exists, as [`create`](Self::create) for
    /// one that does not.
    pub fn open_or_create(&self) -> Result<Channel<B>, ChannelError<B>> {
        let now = self.clone().open_timeout(Duration::ZERO);
        let shm: fn(&ChannelError<B>) -> Option<&ShmError> = |e| match e {
            ChannelError::Segment(s) => Some(s),
            _ => None,
        };
        open_or_create(|| now.open(), || self.open(), || self.create(), shm)
    }

    /// Opens the channel, waiting up to the open timeout (default
    /// [`DEFAULT_OPEN_TIMEOUT`](crate::DEFAULT_OPEN_TIMEOUT)) for the name to appear and
    /// its creator to finish.
    ///
    /// A consumer that may start before the producer sets
    /// [`open_timeout`](Self::open_timeout) to how long it will wait: `open` then waits
    /// for the channel to be created. A channel whose senders have all gone (even killed)
    /// opens as any other: what they sent is still there to receive, then `recv` says
    /// `Disconnected` (or `PeerDead`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use gpuring::{Channel, ChannelError, ShmError};
    /// let missing = Channel::builder("doc-builder-open-nobody").open_timeout(Duration::ZERO).open();
    /// assert!(matches!(missing, Err(ChannelError::Segment(ShmError::NotFound { .. }))));
    /// # Ok::<(), ChannelError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ChannelError::WrongBackend`] (a GPU channel opened without
    /// `cuda(&stream)`, or the reverse), [`ChannelError::Corrupted`];
    /// [`ChannelError::Segment`] with [`ShmError::NotFound`],
    /// [`ShmError::PermissionDenied`], [`ShmError::SizeMismatch`], [`ShmError::BadMagic`],
    /// [`ShmError::VersionMismatch`], [`ShmError::NotInitialized`],
    /// [`ShmError::KindMismatch`] (not a channel, or not the flavor asked for) or
    /// [`ShmError::Io`].
    pub fn open(&self) -> Result<Channel<B>, ChannelError<B>> {
        let base = check_name(&self.segment.name)?;
        let kinds = match self.opts.flavor {
            Some(f) => vec![f.kind()],
            None => vec![
                SegmentKind::SpscChannel,
                SegmentKind::MpmcChannel,
                SegmentKind::BroadcastChannel,
            ],
        };
        let (segment, kind) = self.segment.open(&kinds)?;
        let flavor = match kind {
            SegmentKind::MpmcChannel => Flavor::Mpmc,
            SegmentKind::BroadcastChannel => Flavor::Broadcast,
            _ => Flavor::Spsc,
        };
        let header_end = ChannelLayout::new(1, 1, 0).expect("valid").pools;
        let Some(h) = view::<ChannelHeader>(&segment, size_of::<SegmentHeader>()) else {
            let (expected, found) = (header_end as u64, segment.len() as u64);
            return Err(ShmError::SizeMismatch { expected, found }.into());
        };
        // Relaxed: `Segment::open` synchronised with the creator through `init`. Each
        // field is read once, then checked.
        let max_pools = h.max_pools.load(Ordering::Relaxed);
        let slots = (h.slot_count.load(Ordering::Relaxed), h.slot_size.load(Ordering::Relaxed));
        let nonce = h.nonce.load(Ordering::Relaxed);
        let backend = h.backend.load(Ordering::Relaxed);
        let redeliver = h.redeliver.load(Ordering::Relaxed);
        let corrupted = |what| ChannelError::Corrupted(Corrupted { what });
        let redeliver = match redeliver {
            0 => false,
            1 if flavor != Flavor::Broadcast => true,
            _ => return Err(corrupted("channel names an unknown delivery guarantee")),
        };
        if backend != B::CODE {
            let channel = match backend {
                BACKEND_HOST => "host",
                BACKEND_CUDA => "cuda",
                _ => return Err(corrupted("channel names an unknown slot backend")),
            };
            return Err(ChannelError::WrongBackend { channel, asked: B::NAME });
        }
        if PoolLayout::for_backend(backend, slots.0, slots.1).is_none() {
            return Err(corrupted("channel slot parameters out of range"));
        }
        let probe = ChannelLayout::new(max_pools, 1, flavor.cell_size())
            .ok_or(corrupted("channel pool table size out of range"))?;
        if segment.len() < probe.ring.cells {
            let (expected, found) = (probe.ring.cells as u64, segment.len() as u64);
            return Err(ShmError::SizeMismatch { expected, found }.into());
        }
        let (_, capacity) = RingSegment::read_params(&segment, probe.ring.ring_header)?;
        let layout = ChannelLayout::new(max_pools, capacity, flavor.cell_size())
            .ok_or(corrupted("ring capacity is not a power of two in range"))?;
        if layout.total_size != segment.len() {
            let (expected, found) = (layout.total_size as u64, segment.len() as u64);
            return Err(ShmError::SizeMismatch { expected, found }.into());
        }
        RingSegment::check_in::<Descriptor>(&segment, &layout.ring)?;
        segment.populate();
        let params = Params { slot_count: slots.0, slot_size: slots.1, nonce, redeliver };
        Ok(self.channel(segment, layout, flavor, params, base))
    }

    fn channel(
        &self,
        mut segment: crate::shm::Segment,
        layout: ChannelLayout,
        flavor: Flavor,
        Params { slot_count, slot_size, nonce, redeliver }: Params,
        base: String,
    ) -> Channel<B> {
        // The last user out removes the channel and its pools, unless messages wait in it.
        let stem = base.clone();
        let broadcast = flavor == Flavor::Broadcast;
        segment.set_last_out(Box::new(move |seg| last_out(seg, &layout, &stem, nonce, broadcast)));
        let segment = Arc::new(segment);
        let ring = RingSegment::view(segment.clone(), layout.ring, flavor == Flavor::Mpmc);
        Channel {
            inner: Arc::new(ChannelSegment {
                segment,
                layout,
                flavor,
                ring,
                slot_count,
                slot_size,
                nonce,
                redeliver,
                base,
                open_timeout: self.segment.open_timeout,
                ctx: self.ctx.clone(),
            }),
        }
    }
}

/// A channel's parameters, as created or as read (and checked) at open.
struct Params {
    slot_count: u32,
    slot_size: u64,
    nonce: u32,
    redeliver: bool,
}
