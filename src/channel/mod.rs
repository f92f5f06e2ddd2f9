//! [`Sender`] and [`Receiver`]: a descriptor ring tied to slot pools, the API most users
//! touch.
//!
//! A channel is one shared-memory segment holding a pool table and a descriptor ring
//! (SPSC or MPMC). Each [`Sender`] owns a [`pool`](crate::pool) of preallocated slots in
//! its own segment and registers it in the table. The producer leases a slot, writes its
//! bytes in place, and sends it: only a 384-byte descriptor travels through the ring. The
//! receiver validates the descriptor against the pool table, maps the pool on first sight,
//! and reads the bytes in place; dropping the [`Message`] returns the slot.
//!
//! ```no_run
//! use gpuring::{Channel, TensorMeta};
//!
//! // Process A: create the channel, 8 slots of 1 MiB, and send.
//! let ch = Channel::builder("frames").capacity(64).slots(8, 1 << 20).create()?;
//! let tx = ch.sender()?;
//! let mut lease = tx.acquire()?;
//! lease[..5].copy_from_slice(b"hello");
//! tx.send(lease, TensorMeta::bytes(5))?;
//!
//! // Process B: open it and receive.
//! let ch = Channel::builder("frames").open()?;
//! let rx = ch.receiver()?;
//! let msg = rx.recv()?;
//! assert_eq!(&msg[..], b"hello");
//! drop(msg); // the slot goes back to A's pool
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Lifetimes of names
//!
//! The channel's creator unlinks the channel name when it drops; processes that opened it
//! keep working. A pool's name outlives its sender while any of its slots is in flight:
//! the sender marks the pool closed, and whoever then sees it closed with every slot free
//! (the sender itself, or the receiver returning the last slot) unlinks it. So a sender may
//! send and exit at once, and its messages still arrive.

use std::cell::{Cell, RefCell};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crate::cuda::CudaError;
use crate::descriptor::{Descriptor, TensorMeta};
#[cfg(feature = "cuda")]
use crate::layout::BACKEND_CUDA;
use crate::layout::{
    BACKEND_HOST, ChannelHeader, ChannelLayout, ENTRY_ACTIVE, ENTRY_CLAIMED, ENTRY_CLOSED,
    ENTRY_EMPTY, MpmcCell, POOL_NAME_BYTES, PoolEntry, PoolLayout, SegmentKind, SpscCell,
    load_bytes, store_bytes,
};
use crate::named::{
    DEFAULT_OPEN_TIMEOUT, MpmcConsumer, MpmcProducer, RingSegment, SpscConsumer, SpscProducer,
};
use crate::pool::{AcquireError, PoolSegment, SlotRef};
use crate::ring::{Corrupted, PopError, PushError, TryPopError, TryPushError};
use crate::shm::{Segment, ShmError, object_name};
use crate::sync::Ordering;
use crate::wait::WaitPolicy;

#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
pub use gpu::{DeviceView, GpuLease, GpuMessage};

/// One sender and one receiver, or any number of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// One sender, one receiver: an SPSC descriptor ring, roles claimed in the segment.
    Spsc,
    /// Any number of senders (each with its own pool) and receivers: an MPMC ring.
    Mpmc,
}

impl Flavor {
    fn kind(self) -> SegmentKind {
        match self {
            Flavor::Spsc => SegmentKind::SpscChannel,
            Flavor::Mpmc => SegmentKind::MpmcChannel,
        }
    }

    fn cell_size(self) -> usize {
        match self {
            Flavor::Spsc => size_of::<SpscCell<Descriptor>>(),
            Flavor::Mpmc => size_of::<MpmcCell<Descriptor>>(),
        }
    }
}

/// Longest channel name: pool segment names append a suffix of up to 35 bytes.
pub const MAX_CHANNEL_NAME: usize = 200;

/// Options for creating or opening a [`Channel`].
///
/// `create` uses every option; `open` uses the name, the flavor if one was set (else it
/// takes what it finds) and the open timeout: capacity and slots are the creator's.
///
/// ```no_run
/// use std::time::Duration;
/// use gpuring::Channel;
/// let ch = Channel::builder("jobs")
///     .mpmc()
///     .capacity(1024)
///     .slots(16, 4 << 20) // each sender: 16 slots of 4 MiB
///     .max_senders(8)
///     .create()?;
/// let peer = Channel::builder("jobs").open_timeout(Duration::from_secs(5)).open()?;
/// # Ok::<(), gpuring::ShmError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ChannelBuilder {
    name: String,
    flavor: Option<Flavor>,
    capacity: u64,
    slot_count: u32,
    slot_size: u64,
    max_senders: Option<u32>,
    open_timeout: Duration,
    replace_stale: bool,
    allow_dead_owner: bool,
    #[cfg(feature = "cuda")]
    cuda: Option<Arc<crate::cuda::CudaContext>>,
}

impl ChannelBuilder {
    /// Options for channel `name`: SPSC, capacity 256, 8 slots of 1 MiB per sender.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            flavor: None,
            capacity: 256,
            slot_count: 8,
            slot_size: 1 << 20,
            max_senders: None,
            open_timeout: DEFAULT_OPEN_TIMEOUT,
            replace_stale: false,
            allow_dead_owner: false,
            #[cfg(feature = "cuda")]
            cuda: None,
        }
    }

    /// Slots in device memory on `ctx`'s device (`create`), or the context this process
    /// uses for the channel's device slots (`open`). Without it, `create` makes a host
    /// channel, and a GPU channel opened without it can make no sender or receiver
    /// ([`CudaError::NoContext`]).
    #[cfg(feature = "cuda")]
    pub fn cuda(mut self, ctx: &Arc<crate::cuda::CudaContext>) -> Self {
        self.cuda = Some(ctx.clone());
        self
    }

    fn backend(&self) -> u32 {
        #[cfg(feature = "cuda")]
        if self.cuda.is_some() {
            return BACKEND_CUDA;
        }
        BACKEND_HOST
    }

    /// One sender, one receiver (the default for `create`).
    pub fn spsc(mut self) -> Self {
        self.flavor = Some(Flavor::Spsc);
        self
    }

    /// Any number of senders and receivers.
    pub fn mpmc(mut self) -> Self {
        self.flavor = Some(Flavor::Mpmc);
        self
    }

    /// Descriptor ring cells, a power of two in `1..=2^24`.
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    /// Each sender's pool: `count` slots (`1..=2^20`) of `bytes` bytes each.
    pub fn slots(mut self, count: u32, bytes: u64) -> Self {
        self.slot_count = count;
        self.slot_size = bytes;
        self
    }

    /// Pool table entries: how many senders may have pools at once, counting departed
    /// senders whose messages are still in flight (default 4 for SPSC, 16 for MPMC).
    pub fn max_senders(mut self, n: u32) -> Self {
        self.max_senders = Some(n);
        self
    }

    /// How long `open` waits for the creator to finish initialising.
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.open_timeout = timeout;
        self
    }

    /// `create`: replace a channel of this name whose creator has died (default: fail
    /// with [`ShmError::AlreadyExists`]). A live creator's channel is never replaced.
    pub fn replace_stale(mut self, yes: bool) -> Self {
        self.replace_stale = yes;
        self
    }

    /// `open`: attach to a channel whose creator has died, e.g. to drain what was sent
    /// before the crash (default: fail with [`ShmError::OwnerDead`]).
    pub fn allow_dead_owner(mut self, yes: bool) -> Self {
        self.allow_dead_owner = yes;
        self
    }

    /// Creates the channel, exclusively, mode 0600. No pool exists until a sender is made.
    ///
    /// # Errors
    ///
    /// [`ShmError::InvalidName`] (also beyond [`MAX_CHANNEL_NAME`] bytes),
    /// [`ShmError::InvalidCapacity`], [`ShmError::InvalidPool`],
    /// [`ShmError::InvalidConfig`], [`ShmError::AlreadyExists`],
    /// [`ShmError::PermissionDenied`], [`ShmError::Io`].
    pub fn create(&self) -> Result<Channel, ShmError> {
        let base = check_name(&self.name)?;
        let flavor = self.flavor.unwrap_or(Flavor::Spsc);
        let max_pools = self.max_senders.unwrap_or(match flavor {
            Flavor::Spsc => 4,
            Flavor::Mpmc => 16,
        });
        if max_pools == 0 || max_pools > crate::layout::MAX_POOLS {
            return Err(ShmError::InvalidConfig { reason: "max_senders must be in 1..=1024" });
        }
        let backend = self.backend();
        if PoolLayout::for_backend(backend, self.slot_count, self.slot_size).is_none() {
            return Err(ShmError::InvalidPool {
                slot_count: self.slot_count,
                slot_size: self.slot_size,
            });
        }
        if flavor == Flavor::Mpmc && self.capacity < 2 {
            return Err(ShmError::InvalidCapacity { capacity: self.capacity });
        }
        let layout = ChannelLayout::new(max_pools, self.capacity, flavor.cell_size())
            .ok_or(ShmError::InvalidCapacity { capacity: self.capacity })?;
        let nonce = nonce();
        let (size, replace) = (layout.total_size, self.replace_stale);
        let segment = Segment::create_with(&self.name, flavor.kind(), size, replace, |seg| {
            // SAFETY: offset from `layout`, which sized the segment; ours alone until
            // `create` publishes it.
            let h = unsafe { seg.at::<ChannelHeader>(layout.header).as_ref() };
            // Relaxed: published by the Release store of `init` in `Segment::create`.
            h.max_pools.store(max_pools, Ordering::Relaxed);
            h.slot_count.store(self.slot_count, Ordering::Relaxed);
            h.slot_size.store(self.slot_size, Ordering::Relaxed);
            h.nonce.store(nonce, Ordering::Relaxed);
            h.backend.store(backend, Ordering::Relaxed);
            // Pool entries are zero (EMPTY) in a fresh object.
            match flavor {
                Flavor::Spsc => RingSegment::init_in::<Descriptor, SpscCell<Descriptor>>(
                    seg,
                    &layout.ring,
                    |_| SpscCell::new(),
                ),
                Flavor::Mpmc => RingSegment::init_in::<Descriptor, MpmcCell<Descriptor>>(
                    seg,
                    &layout.ring,
                    |i| MpmcCell::new(i as u64),
                ),
            }
            Ok(())
        })?;
        Ok(Channel::new(
            segment,
            layout,
            flavor,
            (self.slot_count, self.slot_size, nonce, backend),
            base,
            self,
        ))
    }

    /// Opens the channel, waiting up to the open timeout for its creator to finish.
    ///
    /// # Errors
    ///
    /// [`ShmError::NotFound`], [`ShmError::PermissionDenied`], [`ShmError::SizeMismatch`],
    /// [`ShmError::BadMagic`], [`ShmError::VersionMismatch`], [`ShmError::NotInitialized`],
    /// [`ShmError::KindMismatch`] (not a channel, or not the flavor asked for),
    /// [`ShmError::OwnerDead`] (its creator died; see
    /// [`allow_dead_owner`](Self::allow_dead_owner)), [`ShmError::ElementMismatch`],
    /// [`ShmError::Corrupted`], [`ShmError::Io`].
    pub fn open(&self) -> Result<Channel, ShmError> {
        let base = check_name(&self.name)?;
        let (segment, flavor) = match self.flavor {
            Some(f) => (Segment::open(&self.name, f.kind(), self.open_timeout)?, f),
            None => match Segment::open(&self.name, SegmentKind::SpscChannel, self.open_timeout) {
                Ok(s) => (s, Flavor::Spsc),
                Err(ShmError::KindMismatch { found, .. })
                    if found == SegmentKind::MpmcChannel as u32 =>
                {
                    let s = Segment::open(&self.name, SegmentKind::MpmcChannel, self.open_timeout)?;
                    (s, Flavor::Mpmc)
                }
                Err(e) => return Err(e),
            },
        };
        let segment =
            if self.allow_dead_owner { segment } else { segment.require_live_creator()? };
        let header_end = ChannelLayout::new(1, 1, 0).expect("valid").pools;
        if segment.len() < header_end {
            return Err(ShmError::SizeMismatch {
                expected: header_end as u64,
                found: segment.len() as u64,
            });
        }
        // SAFETY: inside the mapping (checked just above); atomics only.
        let h = unsafe { segment.at::<ChannelHeader>(size_of::<crate::layout::SegmentHeader>()) };
        // SAFETY: as above.
        let h = unsafe { h.as_ref() };
        // Relaxed: `Segment::open` synchronised with the creator through `init`. Each
        // field is read once, then checked.
        let max_pools = h.max_pools.load(Ordering::Relaxed);
        let slots = (h.slot_count.load(Ordering::Relaxed), h.slot_size.load(Ordering::Relaxed));
        let nonce = h.nonce.load(Ordering::Relaxed);
        let backend = h.backend.load(Ordering::Relaxed);
        let corrupted = |what| ShmError::Corrupted(Corrupted { what });
        if PoolLayout::for_backend(backend, slots.0, slots.1).is_none() {
            return Err(corrupted("channel slot parameters out of range"));
        }
        let probe = ChannelLayout::new(max_pools, 1, flavor.cell_size())
            .ok_or(corrupted("channel pool table size out of range"))?;
        if segment.len() < probe.ring.cells {
            return Err(ShmError::SizeMismatch {
                expected: probe.ring.cells as u64,
                found: segment.len() as u64,
            });
        }
        // SAFETY: the ring header lies inside the mapping (checked just above).
        let ring_header =
            unsafe { segment.at::<crate::layout::RingHeader>(probe.ring.ring_header).as_ref() };
        let capacity = ring_header.capacity.load(Ordering::Relaxed);
        let layout = ChannelLayout::new(max_pools, capacity, flavor.cell_size())
            .ok_or(corrupted("ring capacity is not a power of two in range"))?;
        if layout.total_size != segment.len() {
            return Err(ShmError::SizeMismatch {
                expected: layout.total_size as u64,
                found: segment.len() as u64,
            });
        }
        RingSegment::check_in::<Descriptor>(&segment, &layout.ring)?;
        Ok(Channel::new(segment, layout, flavor, (slots.0, slots.1, nonce, backend), base, self))
    }
}

fn check_name(name: &str) -> Result<String, ShmError> {
    let full = object_name(name)?;
    let bare = full.to_str().expect("object names are UTF-8")[1..].to_owned();
    if bare.len() > MAX_CHANNEL_NAME {
        return Err(ShmError::InvalidName {
            name: name.to_owned(),
            reason: "longer than 200 bytes (pool segment names add a suffix)",
        });
    }
    Ok(bare)
}

/// A number that differs between channels created one after another under one name.
fn nonce() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let x = t ^ (u64::from(std::process::id()) << 32);
    // A 64-to-32 mix (splitmix64's finaliser) so nearby times give unrelated values.
    let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) as u32
}

/// Where a pool table entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolState {
    /// A sender is registering it.
    Registering,
    /// Its sender is live.
    Active,
    /// Its sender is gone; slots still in flight drain back to it.
    Closed,
}

/// A row of the pool table, as [`Channel::pools`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// Table index (low 16 bits of a descriptor's `pool_id`).
    pub index: u32,
    /// Registration instance (high 16 bits of `pool_id`).
    pub instance: u32,
    /// Where the entry stands.
    pub state: PoolState,
    /// The sending process, as it registered (pids are reused).
    pub owner_pid: u32,
    /// The pool segment's name.
    pub name: String,
}

#[derive(Debug)]
struct Shared {
    segment: Arc<Segment>,
    layout: ChannelLayout,
    flavor: Flavor,
    ring: Arc<RingSegment>,
    slot_count: u32,
    slot_size: u64,
    nonce: u32,
    backend: u32,
    base: String,
    open_timeout: Duration,
    #[cfg(feature = "cuda")]
    cuda: Option<Arc<crate::cuda::CudaContext>>,
}

impl Shared {
    fn header(&self) -> &ChannelHeader {
        // SAFETY: offset from the checked layout; atomics only.
        unsafe { self.segment.at::<ChannelHeader>(self.layout.header).as_ref() }
    }

    fn entry(&self, index: u32) -> &PoolEntry {
        assert!((index as usize) < self.layout.max_pools, "pool index checked by the caller");
        let offset = self.layout.pools + index as usize * size_of::<PoolEntry>();
        // SAFETY: index < max_pools, so the entry lies in the table; atomics only.
        unsafe { self.segment.at::<PoolEntry>(offset).as_ref() }
    }

    fn max_pools(&self) -> u32 {
        self.layout.max_pools as u32
    }

    /// The pool segment name for table entry `index`, registration `instance`: derived,
    /// so a receiver never opens a name a peer chose.
    fn pool_name(&self, index: u32, instance: u32) -> String {
        format!("{}.{:08x}.p{index}.{instance}", self.base, self.nonce)
    }
}

/// Packs `name` into an entry's name words.
fn write_name(entry: &PoolEntry, name: &str) {
    assert!(name.len() <= POOL_NAME_BYTES, "pool names are bounded by MAX_CHANNEL_NAME");
    store_bytes(&entry.name, name.as_bytes());
    // Relaxed: published by the Release store of `state`.
    entry.name_len.store(name.len() as u32, Ordering::Relaxed);
}

/// Reads an entry's name (lossy: it is shared memory).
fn read_name(entry: &PoolEntry) -> String {
    // Relaxed: read after the caller's Acquire load of `state`.
    let len = (entry.name_len.load(Ordering::Relaxed) as usize).min(POOL_NAME_BYTES);
    let mut bytes = [0u8; POOL_NAME_BYTES];
    load_bytes(&entry.name, &mut bytes);
    String::from_utf8_lossy(&bytes[..len]).into_owned()
}

/// A channel segment, created or opened; makes [`Sender`]s and [`Receiver`]s.
///
/// The creating handle unlinks the channel name when it and everything made from it are
/// dropped. See the [module docs](self) for an example.
#[derive(Debug, Clone)]
pub struct Channel {
    shared: Arc<Shared>,
}

impl Channel {
    /// Options for channel `name`.
    pub fn builder(name: impl Into<String>) -> ChannelBuilder {
        ChannelBuilder::new(name)
    }

    fn new(
        segment: Segment,
        layout: ChannelLayout,
        flavor: Flavor,
        (slot_count, slot_size, nonce, backend): (u32, u64, u32, u32),
        base: String,
        builder: &ChannelBuilder,
    ) -> Self {
        let segment = Arc::new(segment);
        let ring = RingSegment::view(segment.clone(), layout.ring, flavor == Flavor::Mpmc);
        let shared = Shared {
            segment,
            layout,
            flavor,
            ring,
            slot_count,
            slot_size,
            nonce,
            backend,
            base,
            open_timeout: builder.open_timeout,
            #[cfg(feature = "cuda")]
            cuda: builder.cuda.clone(),
        };
        Self { shared: Arc::new(shared) }
    }

    /// A sender: creates this sender's pool, registers it in the pool table and, for SPSC,
    /// claims the producer role.
    ///
    /// # Errors
    ///
    /// [`ShmError::RoleTaken`] (SPSC, another sender lives), [`ShmError::PoolTableFull`],
    /// and what creating the pool segment can return.
    pub fn sender(&self) -> Result<Sender, ShmError> {
        self.check_backend()?;
        let tx = match self.shared.flavor {
            Flavor::Spsc => Tx::Spsc(RefCell::new(self.shared.ring.spsc_producer()?)),
            Flavor::Mpmc => Tx::Mpmc(self.shared.ring.mpmc_producer()?),
        };
        let s = &self.shared;
        #[cfg(feature = "cuda")]
        let device = if s.backend == BACKEND_CUDA {
            let ctx = s.cuda.as_ref().ok_or(ShmError::Cuda(CudaError::NoContext))?;
            let stride = PoolLayout::cuda(s.slot_count, s.slot_size).expect("checked").stride;
            let pool = crate::cuda::DevicePool::create(ctx, s.slot_count as usize, stride)
                .map_err(ShmError::Cuda)?;
            Some(Arc::new(pool))
        } else {
            None
        };
        let (index, instance, pool) = self.register_pool(|name| {
            PoolSegment::create(name, s.backend, s.slot_count, s.slot_size, |_seg, _layout| {
                #[cfg(feature = "cuda")]
                if let Some(device) = &device {
                    // SAFETY: offsets from the device-pool layout that sized the segment
                    // (`at` checks bounds); atomics only; ours alone until published.
                    let info = unsafe {
                        _seg.at::<crate::layout::CudaPoolInfo>(_layout.cuda_info).as_ref()
                    };
                    let events = (0.._layout.slot_count).map(|i| {
                        let at = _layout.slot_events + i * size_of::<crate::layout::SlotEvents>();
                        // SAFETY: as above.
                        unsafe { _seg.at::<crate::layout::SlotEvents>(at).as_ref() }
                    });
                    for (i, slot) in events.enumerate() {
                        device.export_slot(i, slot);
                    }
                    device.export(info);
                }
                Ok(())
            })
        })?;
        Ok(Sender {
            shared: self.shared.clone(),
            free: pool.core.free_consumer(),
            pool: Arc::new(pool),
            index,
            pool_id: (instance << 16) | index,
            tx,
            seq: Cell::new(0),
            #[cfg(feature = "cuda")]
            device,
        })
    }

    /// A GPU channel needs this build to have CUDA, and this handle a context.
    fn check_backend(&self) -> Result<(), ShmError> {
        if self.shared.backend == BACKEND_HOST {
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        if self.shared.cuda.is_none() {
            return Err(ShmError::Cuda(CudaError::NoContext));
        }
        #[cfg(not(feature = "cuda"))]
        return Err(ShmError::Cuda(CudaError::NotBuilt));
        #[cfg(feature = "cuda")]
        Ok(())
    }

    fn register_pool(
        &self,
        make: impl FnOnce(&str) -> Result<PoolSegment, ShmError>,
    ) -> Result<(u32, u32, PoolSegment), ShmError> {
        let mut make = Some(make);
        let s = &self.shared;
        for index in 0..s.max_pools() {
            let entry = s.entry(index);
            // Acquire: pairs with the Release store of the state by the entry's last
            // writer, so its instance and name are visible.
            let state = entry.state.load(Ordering::Acquire);
            let reusable = match state {
                ENTRY_EMPTY => true,
                ENTRY_CLOSED => {
                    // Reusable once its pool is drained: the last one out unlinked it.
                    let old = s.pool_name(index, entry.instance.load(Ordering::Relaxed) & 0xFFFF);
                    !Segment::exists(&old)?
                }
                _ => false,
            };
            // Acquire: as above; makes this sender the entry's only writer.
            if !reusable
                || entry
                    .state
                    .compare_exchange(state, ENTRY_CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            // Relaxed: a counter; only uniqueness matters.
            let instance =
                s.header().registrations.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & 0xFFFF;
            let name = s.pool_name(index, instance);
            // Called once: every path below returns.
            let make = make.take().expect("one registration per call");
            let pool = match make(&name) {
                Ok(pool) => pool,
                Err(e) => {
                    // Release: pairs with the Acquire loads above.
                    entry.state.store(state, Ordering::Release);
                    return Err(e);
                }
            };
            // Relaxed: published by the Release store of `state` below.
            entry.instance.store(instance, Ordering::Relaxed);
            entry.backend.store(s.backend, Ordering::Relaxed);
            entry.slot_count.store(s.slot_count, Ordering::Relaxed);
            entry.slot_size.store(s.slot_size, Ordering::Relaxed);
            entry.owner_pid.store(std::process::id(), Ordering::Relaxed);
            write_name(entry, &name);
            // Release: pairs with the Acquire load of the state in `Receiver::pool_for`;
            // the fields above are visible to a receiver that sees ACTIVE.
            entry.state.store(ENTRY_ACTIVE, Ordering::Release);
            return Ok((index, instance, pool));
        }
        Err(ShmError::PoolTableFull { max_pools: s.max_pools() })
    }

    /// A receiver; for SPSC, claims the consumer role.
    ///
    /// # Errors
    ///
    /// [`ShmError::RoleTaken`] (SPSC, another receiver lives), [`ShmError::Corrupted`].
    pub fn receiver(&self) -> Result<Receiver, ShmError> {
        self.check_backend()?;
        let rx = match self.shared.flavor {
            Flavor::Spsc => Rx::Spsc(RefCell::new(self.shared.ring.spsc_consumer()?)),
            Flavor::Mpmc => Rx::Mpmc(self.shared.ring.mpmc_consumer()?),
        };
        let pools = (0..self.shared.max_pools()).map(|_| None).collect();
        Ok(Receiver { shared: self.shared.clone(), rx, pools: RefCell::new(pools) })
    }

    /// SPSC or MPMC.
    pub fn flavor(&self) -> Flavor {
        self.shared.flavor
    }

    /// Descriptor ring cells.
    pub fn capacity(&self) -> usize {
        self.shared.layout.ring.capacity
    }

    /// Each sender's pool: (slot count, bytes per slot).
    pub fn slots(&self) -> (u32, u64) {
        (self.shared.slot_count, self.shared.slot_size)
    }

    /// Pool table entries.
    pub fn max_senders(&self) -> u32 {
        self.shared.max_pools()
    }

    /// The channel segment.
    pub fn segment(&self) -> &Segment {
        &self.shared.segment
    }

    /// The pool table's entries in use (a snapshot, for diagnostics).
    pub fn pools(&self) -> Vec<PoolInfo> {
        let s = &self.shared;
        (0..s.max_pools())
            .filter_map(|index| {
                let e = s.entry(index);
                // Acquire: pairs with the Release store of the state in `register_pool`.
                let state = match e.state.load(Ordering::Acquire) {
                    ENTRY_CLAIMED => PoolState::Registering,
                    ENTRY_ACTIVE => PoolState::Active,
                    ENTRY_CLOSED => PoolState::Closed,
                    _ => return None,
                };
                Some(PoolInfo {
                    index,
                    // Relaxed: after the Acquire above.
                    instance: e.instance.load(Ordering::Relaxed),
                    state,
                    owner_pid: e.owner_pid.load(Ordering::Relaxed),
                    name: read_name(e),
                })
            })
            .collect()
    }
}

enum Tx {
    // The SPSC producer caches positions (`&mut self`); `Sender` is not `Sync`, and no
    // method re-enters, so a `RefCell` borrow never fails.
    Spsc(RefCell<SpscProducer<Descriptor>>),
    Mpmc(MpmcProducer<Descriptor>),
}

enum Rx {
    Spsc(RefCell<SpscConsumer<Descriptor>>),
    Mpmc(MpmcConsumer<Descriptor>),
}

/// How long a blocking call waits.
#[derive(Clone, Copy)]
enum Wait {
    No,
    For(Duration),
    Forever,
}

/// The sending end: owns a pool of slots, leases them, sends them.
///
/// `Send` but not `Sync`: one thread uses a sender at a time (make one sender per thread
/// in MPMC; each gets its own pool). On a GPU channel use the `_on` methods
/// (`acquire_on`, `send_gpu`: feature `cuda`).
///
/// Dropping a sender with messages in flight is fine: they still arrive, and the pool goes
/// when the last slot comes back. On a GPU channel the drop waits up to 5 s for its slots
/// to come back (device memory cannot outlive its process's context safely); slots still
/// out after that are leaked rather than freed under a reader.
pub struct Sender {
    shared: Arc<Shared>,
    pool: Arc<PoolSegment>,
    index: u32,
    pool_id: u32,
    free: MpmcConsumer<u32>,
    tx: Tx,
    seq: Cell<u64>,
    #[cfg(feature = "cuda")]
    device: Option<Arc<crate::cuda::DevicePool>>,
}

impl core::fmt::Debug for Sender {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sender")
            .field("channel", &self.shared.segment.name())
            .field("pool", &self.pool.name())
            .field("seq", &self.seq.get())
            .finish_non_exhaustive()
    }
}

/// A lease of either kind: what `send_with` needs of it.
trait Leased {
    fn slot_lease(&mut self) -> &mut SlotLease;
    fn capacity(&self) -> usize;
}

impl Sender {
    /// Leases a free slot, waiting (spin, then sleep) until a receiver returns one.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Corrupted`] when the pool's shared state is impossible;
    /// [`AcquireError::Cuda`] (`WrongBackend`) on a GPU channel.
    pub fn acquire(&self) -> Result<Lease, AcquireError> {
        self.host_lease(Wait::Forever)
    }

    /// As [`acquire`](Self::acquire), giving up after `timeout`.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Timeout`], [`AcquireError::Corrupted`], [`AcquireError::Cuda`].
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Lease, AcquireError> {
        self.host_lease(Wait::For(timeout))
    }

    /// Leases a free slot if one is free now.
    ///
    /// # Errors
    ///
    /// [`AcquireError::Exhausted`], [`AcquireError::Corrupted`], [`AcquireError::Cuda`].
    pub fn try_acquire(&self) -> Result<Lease, AcquireError> {
        self.host_lease(Wait::No)
    }

    fn host_lease(&self, wait: Wait) -> Result<Lease, AcquireError> {
        if self.shared.backend != BACKEND_HOST {
            return Err(AcquireError::Cuda(CudaError::WrongBackend));
        }
        let slot = self.take_slot(wait)?;
        crate::fault::point("send_holding_lease");
        Ok(Lease {
            data: self.pool.slot_ptr(slot.slot),
            len: self.pool.slot_size(),
            inner: SlotLease { pool: Some(self.pool.clone()), slot, tag: 0 },
        })
    }

    fn take_slot(&self, wait: Wait) -> Result<SlotRef, AcquireError> {
        let core = &self.pool.core;
        // The fast path: a free slot now, no clock read, no syscall.
        match core.try_lease_via(&self.free) {
            Err(AcquireError::Exhausted) => {}
            other => return other,
        }
        // Slots of dead receivers are taken back while waiting only (it probes locks).
        let deadline = match wait {
            Wait::No => return Err(AcquireError::Exhausted),
            Wait::For(t) => Some(std::time::Instant::now() + t),
            Wait::Forever => None,
        };
        // Waiting: in ticks, taking back the slots of dead receivers after each.
        loop {
            let tick = crate::ring::LIVENESS_TICK;
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            match core.lease_via(&self.free, Some(left.map_or(tick, |l| l.min(tick)))) {
                Err(AcquireError::Timeout) => {
                    let exited = |pid| self.holder_exited(pid);
                    if core.reclaim_dead(exited, |slot, g| self.queued(slot, g)) > 0 {
                        continue;
                    }
                    if left.is_some_and(|l| l <= tick) {
                        return Err(AcquireError::Timeout);
                    }
                    if core.receivers_dead() {
                        return Err(AcquireError::PeerDead);
                    }
                }
                other => return other,
            }
        }
    }

    /// Whether a descriptor of this sender naming `slot` at `generation` is still in the
    /// ring. A receiver takes a slot before the descriptor leaves the ring (SPSC: before
    /// `head` moves; MPMC: before the cell is freed), so a receiver that died in between
    /// left both, and the next receiver takes the slot over with the message.
    fn queued(&self, slot: u32, generation: u32) -> bool {
        let ours = |d: &Descriptor| {
            d.pool_id == self.pool_id && d.slot == slot && d.generation == u64::from(generation)
        };
        match &self.tx {
            Tx::Spsc(p) => p.borrow().any_queued(ours),
            Tx::Mpmc(p) => p.any_unfreed(ours),
        }
    }

    /// Whether a dead receiver's slots may be reused. Host slots: at once (its lock is
    /// gone, so it runs no more code). Device slots: only once the process has exited
    /// (a zombie or reaped), when the driver has torn its context down, so that no
    /// kernel of it can still touch the slot.
    fn holder_exited(&self, pid: u32) -> bool {
        self.shared.backend == BACKEND_HOST || process_exited(pid)
    }

    /// Sends a leased slot holding a tensor described by `meta` (use
    /// [`TensorMeta::bytes`] for plain bytes), waiting while the ring is full. Wakes a
    /// sleeping receiver, if any; makes no syscall otherwise.
    ///
    /// # Errors
    ///
    /// [`SendError::TooLarge`] (with the lease back) when `meta` spans more than a slot;
    /// [`SendError::Corrupted`].
    ///
    /// # Panics
    ///
    /// If `lease` came from another sender.
    pub fn send(&self, lease: Lease, meta: TensorMeta) -> Result<(), SendError> {
        self.send_with(lease, meta, Wait::Forever, |_, _| Ok(()))
    }

    /// As [`send`](Self::send), giving up after `timeout` with the lease back.
    ///
    /// # Errors
    ///
    /// [`SendError::Timeout`], [`SendError::TooLarge`], [`SendError::Corrupted`].
    ///
    /// # Panics
    ///
    /// If `lease` came from another sender.
    pub fn send_timeout(
        &self,
        lease: Lease,
        meta: TensorMeta,
        timeout: Duration,
    ) -> Result<(), SendError> {
        self.send_with(lease, meta, Wait::For(timeout), |_, _| Ok(()))
    }

    /// As [`send`](Self::send), without waiting: a full ring gives the lease back.
    ///
    /// # Errors
    ///
    /// [`SendError::Full`], [`SendError::TooLarge`], [`SendError::Corrupted`].
    ///
    /// # Panics
    ///
    /// If `lease` came from another sender.
    pub fn try_send(&self, lease: Lease, meta: TensorMeta) -> Result<(), SendError> {
        self.send_with(lease, meta, Wait::No, |_, _| Ok(()))
    }

    /// Fills a descriptor for `lease` (then `fill` adds the backend's part), publishes it.
    fn send_with<L: Leased>(
        &self,
        mut lease: L,
        meta: TensorMeta,
        wait: Wait,
        fill: impl FnOnce(&L, &mut Descriptor) -> Result<(), CudaError>,
    ) -> Result<(), SendError<L>> {
        let capacity = lease.capacity() as u64;
        let inner = lease.slot_lease();
        let pool = inner.pool.as_ref().expect("a live lease has its pool");
        assert!(Arc::ptr_eq(pool, &self.pool), "a lease must be sent by the sender it came from");
        let (slot, tag) = (inner.slot, inner.tag);
        if meta.nbytes() > capacity {
            return Err(SendError::TooLarge { lease, len: meta.nbytes(), capacity });
        }
        let seq = self.seq.get();
        let mut d = Descriptor::new(seq, &meta);
        d.tag = tag;
        d.pool_id = self.pool_id;
        d.slot = slot.slot;
        d.generation = u64::from(slot.generation);
        fill(&lease, &mut d).map_err(SendError::Cuda)?;
        self.pool.core.mark_sent(slot);
        let pushed: Result<(), NotPushed> = match (&self.tx, wait) {
            (Tx::Spsc(p), Wait::No) => p.borrow_mut().try_push(d).map_err(NotPushed::from_try),
            (Tx::Spsc(p), Wait::For(t)) => {
                p.borrow_mut().push_timeout(d, t).map_err(NotPushed::from_push)
            }
            (Tx::Spsc(p), Wait::Forever) => p.borrow_mut().push(d).map_err(NotPushed::from_push),
            (Tx::Mpmc(p), Wait::No) => p.try_push(d).map_err(NotPushed::from_try),
            (Tx::Mpmc(p), Wait::For(t)) => p.push_timeout(d, t).map_err(NotPushed::from_push),
            (Tx::Mpmc(p), Wait::Forever) => p.push(d).map_err(NotPushed::from_push),
        };
        match pushed {
            Ok(()) => {
                // Sent: the receiver owns the slot now, so the lease must not cancel it.
                lease.slot_lease().pool = None;
                self.seq.set(seq.wrapping_add(1));
                Ok(())
            }
            Err(e) => {
                self.pool.core.unmark_sent(slot);
                match (e, wait) {
                    (NotPushed::Waiting, Wait::No) => Err(SendError::Full(lease)),
                    (NotPushed::Waiting, _) => Err(SendError::Timeout(lease)),
                    (NotPushed::PeerDead, _) => Err(SendError::PeerDead(lease)),
                    (NotPushed::Corrupted(c), _) => Err(SendError::Corrupted(c)),
                }
            }
        }
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
        match &mut self.tx {
            Tx::Spsc(p) => p.get_mut().set_wait_policy(policy),
            Tx::Mpmc(p) => p.set_wait_policy(policy),
        }
    }

    /// Pushes a raw descriptor into the ring, bypassing the pool: for tests of what
    /// receivers do with forged descriptors. Not for applications.
    #[doc(hidden)]
    /// There is no lease, so errors carry `()` where a send's carry the lease.
    pub fn push_raw(&self, d: Descriptor) -> Result<(), SendError<()>> {
        let r = match &self.tx {
            Tx::Spsc(p) => p.borrow_mut().push(d).map_err(NotPushed::from_push),
            Tx::Mpmc(p) => p.push(d).map_err(NotPushed::from_push),
        };
        r.map_err(|e| match e {
            NotPushed::Corrupted(c) => SendError::Corrupted(c),
            NotPushed::PeerDead => SendError::PeerDead(()),
            NotPushed::Waiting => unreachable!("push without a deadline does not time out"),
        })
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.pool.close();
        #[cfg(feature = "cuda")]
        if let Some(device) = self.device.take() {
            gpu::retire(&self.pool, device);
        }
        // Release: pairs with the Acquire loads of the state in `register_pool`.
        self.shared.entry(self.index).state.store(ENTRY_CLOSED, Ordering::Release);
    }
}

/// Whether process `pid` has exited: gone, or a zombie (its files, and with them a CUDA
/// context, released). An unreadable status counts as not exited.
fn process_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state == 'Z' || state == 'X'),
    }
}

/// Why a descriptor was not pushed (the value itself is dropped: the lease goes back).
enum NotPushed {
    /// Full (try) or still full at the deadline.
    Waiting,
    /// Full, and every receiver died.
    PeerDead,
    Corrupted(Corrupted),
}

impl NotPushed {
    fn from_try<T>(e: TryPushError<T>) -> Self {
        match e {
            TryPushError::Full(_) => NotPushed::Waiting,
            TryPushError::Corrupted(c) => NotPushed::Corrupted(c),
        }
    }

    fn from_push<T>(e: PushError<T>) -> Self {
        match e {
            PushError::Timeout(_) => NotPushed::Waiting,
            PushError::PeerDead(_) => NotPushed::PeerDead,
            PushError::Corrupted(c) => NotPushed::Corrupted(c),
        }
    }
}

/// The part of a lease common to both backends: the slot, and its return on drop unless
/// it was sent.
#[derive(Debug)]
struct SlotLease {
    pool: Option<Arc<PoolSegment>>,
    slot: SlotRef,
    tag: u64,
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

/// A leased slot: write its bytes in place, then [`Sender::send`] it. Dropping a lease
/// without sending it returns the slot to the pool.
pub struct Lease {
    inner: SlotLease,
    data: NonNull<u8>,
    len: usize,
}

// SAFETY: the lease is the slot's one holder; `data` points into a mapping its pool
// keeps alive, and nothing in it is tied to a thread.
unsafe impl Send for Lease {}
// SAFETY: `&Lease` gives only `&[u8]`.
unsafe impl Sync for Lease {}

impl Leased for Lease {
    fn slot_lease(&mut self) -> &mut SlotLease {
        &mut self.inner
    }
    fn capacity(&self) -> usize {
        self.len
    }
}

impl core::fmt::Debug for Lease {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Lease")
            .field("slot", &self.inner.slot.slot)
            .field("generation", &self.inner.slot.generation)
            .field("len", &self.len)
            .field("tag", &self.inner.tag)
            .finish()
    }
}

impl Lease {
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

impl Deref for Lease {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // (A hostile process with the pool mapped could still write: crate docs, Safety.)
        // SAFETY: `len` bytes of the slot inside the mapping the lease keeps alive; the
        // lease protocol makes this process the slot's only user until it is sent.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view in this process.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr(), self.len) }
    }
}

/// Why a send did not happen. Variants that carry the lease (`L`: [`Lease`], or
/// `GpuLease` on GPU channels) give it back, contents intact.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendError<L = Lease> {
    /// `try_send`: the ring is full.
    Full(L),
    /// `send_timeout`: the ring stayed full until the deadline.
    Timeout(L),
    /// The metadata spans more bytes than a slot holds.
    TooLarge {
        /// The lease, back.
        lease: L,
        /// Bytes the metadata spans.
        len: u64,
        /// Bytes in a slot.
        capacity: u64,
    },
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
    /// Recording the slot's ready event failed (the slot went back to the pool).
    Cuda(CudaError),
    /// The ring is full and every receiver that attached has died (noticed within
    /// [`LIVENESS_TICK`](crate::ring::LIVENESS_TICK) of waiting); the lease, back.
    PeerDead(L),
}

impl<L> core::fmt::Display for SendError<L> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SendError::Full(_) => f.write_str("ring is full"),
            SendError::Timeout(_) => f.write_str("timed out waiting for room in the ring"),
            SendError::TooLarge { len, capacity, .. } => {
                write!(f, "tensor spans {len} bytes, a slot holds {capacity}")
            }
            SendError::Corrupted(c) => c.fmt(f),
            SendError::Cuda(e) => e.fmt(f),
            SendError::PeerDead(_) => f.write_str("the ring is full and every receiver has died"),
        }
    }
}

impl<L: core::fmt::Debug> std::error::Error for SendError<L> {}

/// Why nothing was received.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecvError {
    /// `try_recv`: the ring is empty.
    Empty,
    /// `recv_timeout`: nothing arrived before the deadline.
    Timeout,
    /// The ring is corrupt, or the descriptor popped was invalid (unknown pool, slot out of
    /// range, stale generation, length beyond the slot, bad metadata, handles that do not
    /// match the pool); `what` says which. An invalid descriptor is dropped and the pool
    /// left as it was; the next `recv` carries on.
    Corrupted(Corrupted),
    /// The descriptor's pool could not be mapped (e.g. out of file descriptors).
    Attach(ShmError),
    /// A CUDA call failed (importing the pool, or enqueueing the wait), or a host call on
    /// a GPU channel (`WrongBackend`).
    Cuda(CudaError),
    /// Every sender that attached has died and everything they sent has been received
    /// (noticed within [`LIVENESS_TICK`](crate::ring::LIVENESS_TICK) of waiting).
    PeerDead,
}

impl core::fmt::Display for RecvError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RecvError::Empty => f.write_str("ring is empty"),
            RecvError::Timeout => f.write_str("timed out waiting for a message"),
            RecvError::Corrupted(c) => c.fmt(f),
            RecvError::Attach(e) => write!(f, "cannot map the message's pool: {e}"),
            RecvError::Cuda(e) => e.fmt(f),
            RecvError::PeerDead => {
                f.write_str("every sender has died, and all they sent was received")
            }
        }
    }
}

impl std::error::Error for RecvError {}

impl From<Corrupted> for RecvError {
    fn from(c: Corrupted) -> Self {
        RecvError::Corrupted(c)
    }
}

/// A pool a receiver has mapped (and, for GPU pools, imported).
#[derive(Debug, Clone)]
struct CachedPool {
    instance: u32,
    seg: Arc<PoolSegment>,
    #[cfg(feature = "cuda")]
    device: Option<Arc<crate::cuda::ImportedPool>>,
}

/// Pools a receiver has mapped, by table row.
type PoolCache = RefCell<Box<[Option<CachedPool>]>>;

/// The receiving end: pops descriptors, checks them, maps pools on first sight.
///
/// `Send` but not `Sync`. In MPMC, make one receiver per thread. On a GPU channel use
/// `recv_on` (feature `cuda`).
pub struct Receiver {
    shared: Arc<Shared>,
    rx: Rx,
    // Preallocated: one entry per pool table row, filled on first sight of a pool.
    pools: PoolCache,
}

impl core::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Receiver")
            .field("channel", &self.shared.segment.name())
            .finish_non_exhaustive()
    }
}

/// A descriptor that passed the checks common to both backends; its slot not yet claimed.
struct Checked {
    pool: CachedPool,
    desc: Descriptor,
    meta: TensorMeta,
}

impl Receiver {
    /// Receives a message, waiting (spin, then sleep) until one arrives.
    ///
    /// # Errors
    ///
    /// [`RecvError::Corrupted`], [`RecvError::Attach`], [`RecvError::Cuda`]
    /// (`WrongBackend`, on a GPU channel).
    pub fn recv(&self) -> Result<Message, RecvError> {
        self.recv_host(Wait::Forever)
    }

    /// As [`recv`](Self::recv), giving up after `timeout`.
    ///
    /// # Errors
    ///
    /// [`RecvError::Timeout`], [`RecvError::Corrupted`], [`RecvError::Attach`],
    /// [`RecvError::Cuda`].
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message, RecvError> {
        self.recv_host(Wait::For(timeout))
    }

    /// Receives a message if one is waiting.
    ///
    /// # Errors
    ///
    /// [`RecvError::Empty`], [`RecvError::Corrupted`], [`RecvError::Attach`],
    /// [`RecvError::Cuda`].
    pub fn try_recv(&self) -> Result<Message, RecvError> {
        self.recv_host(Wait::No)
    }

    fn recv_host(&self, wait: Wait) -> Result<Message, RecvError> {
        if self.shared.backend != BACKEND_HOST {
            return Err(RecvError::Cuda(CudaError::WrongBackend));
        }
        self.take(wait, |d| {
            let c = self.check(d)?;
            if c.desc.device_ordinal != -1 {
                return Err(corrupt("descriptor names a device, the pool is host memory"));
            }
            let held = c.pool.seg.core.receive(c.desc.slot, c.desc.generation)?;
            let hold = SlotHold { pool: c.pool.seg, held };
            crate::fault::point("recv_holding");
            // SAFETY: byte_offset + len <= slot_size (checked in `check`), inside the slot.
            let data = unsafe { hold.pool.slot_ptr(held.slot).add(c.desc.byte_offset as usize) };
            Ok(Message { hold, desc: c.desc, meta: c.meta, data })
        })
    }

    /// Pops a descriptor and runs `then` on it (the checks and taking its slot) before the
    /// descriptor leaves the ring (SPSC: before `head` moves; MPMC: before its cell is
    /// freed). A receiver killed inside `then` leaves the message for the next receiver
    /// (SPSC: the next pop; MPMC: a waiting receiver adopts it within a tick), which takes
    /// the slot over from the dead holder (`PoolCore::receive`).
    fn take<R>(
        &self,
        wait: Wait,
        then: impl FnOnce(Descriptor) -> Result<R, RecvError>,
    ) -> Result<R, RecvError> {
        match (&self.rx, wait) {
            (Rx::Spsc(c), Wait::No) => {
                c.borrow_mut().try_pop_then(then).map_err(empty_or_corrupt)?
            }
            (Rx::Spsc(c), Wait::For(t)) => {
                c.borrow_mut().pop_then(Some(t), then).map_err(pop_error)?
            }
            (Rx::Spsc(c), Wait::Forever) => {
                c.borrow_mut().pop_then(None, then).map_err(pop_error)?
            }
            (Rx::Mpmc(c), Wait::No) => c.try_pop_then(then).map_err(empty_or_corrupt)?,
            (Rx::Mpmc(c), Wait::For(t)) => c.pop_then(Some(t), then).map_err(pop_error)?,
            (Rx::Mpmc(c), Wait::Forever) => c.pop_then(None, then).map_err(pop_error)?,
        }
    }

    /// Checks a popped descriptor against the pool table and its pool (not yet the
    /// slot's state, which the caller claims last).
    fn check(&self, d: Descriptor) -> Result<Checked, RecvError> {
        let (index, instance) = (d.pool_id & 0xFFFF, d.pool_id >> 16);
        if index >= self.shared.max_pools() {
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
        Ok(Checked { pool, desc: d, meta })
    }

    /// The pool at table row `index`, registration `instance`: cached, or mapped now.
    fn pool_for(&self, index: u32, instance: u32) -> Result<CachedPool, RecvError> {
        let mut pools = self.pools.borrow_mut();
        let cached = &mut pools[index as usize];
        if let Some(pool) = cached {
            if pool.instance == instance {
                return Ok(pool.clone());
            }
        }
        let s = &self.shared;
        let entry = s.entry(index);
        // Acquire: pairs with the Release store of ACTIVE in `register_pool`.
        let state = entry.state.load(Ordering::Acquire);
        // Relaxed: after the Acquire above.
        if !matches!(state, ENTRY_ACTIVE | ENTRY_CLOSED)
            || entry.instance.load(Ordering::Relaxed) != instance
        {
            return Err(corrupt("descriptor names an unknown pool"));
        }
        let params =
            (entry.slot_count.load(Ordering::Relaxed), entry.slot_size.load(Ordering::Relaxed));
        if params != (s.slot_count, s.slot_size)
            || entry.backend.load(Ordering::Relaxed) != s.backend
        {
            return Err(corrupt("pool table entry disagrees with the channel"));
        }
        let name = s.pool_name(index, instance);
        if read_name(entry) != name {
            return Err(corrupt("pool table entry names an unexpected segment"));
        }
        let seg =
            match PoolSegment::open(&name, s.backend, s.slot_count, s.slot_size, s.open_timeout) {
                Ok(p) => Arc::new(p),
                Err(ShmError::NotFound { .. }) => {
                    return Err(corrupt("descriptor names a pool that no longer exists"));
                }
                Err(ShmError::Corrupted(c)) => return Err(RecvError::Corrupted(c)),
                Err(e) => return Err(RecvError::Attach(e)),
            };
        let pool = CachedPool {
            instance,
            #[cfg(feature = "cuda")]
            device: gpu::import(s, &seg)?,
            seg,
        };
        *cached = Some(pool.clone());
        Ok(pool)
    }

    /// Sets how this receiver waits for a message.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        match &mut self.rx {
            Rx::Spsc(c) => c.get_mut().set_wait_policy(policy),
            Rx::Mpmc(c) => c.set_wait_policy(policy),
        }
    }
}

fn corrupt(what: &'static str) -> RecvError {
    RecvError::Corrupted(Corrupted { what })
}

fn empty_or_corrupt(e: TryPopError) -> RecvError {
    match e {
        TryPopError::Empty => RecvError::Empty,
        TryPopError::Corrupted(c) => RecvError::Corrupted(c),
    }
}

fn pop_error(e: PopError) -> RecvError {
    match e {
        PopError::Timeout => RecvError::Timeout,
        PopError::PeerDead => RecvError::PeerDead,
        PopError::Corrupted(c) => RecvError::Corrupted(c),
    }
}

/// The accessors both kinds of received message have (they hold `desc` and `meta`).
macro_rules! received_accessors {
    () => {
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

        /// The descriptor as it arrived (already validated).
        pub fn descriptor(&self) -> &Descriptor {
            &self.desc
        }
    };
}
#[cfg(feature = "cuda")]
use received_accessors;

/// The part of a received message common to both backends: the held slot, returned on
/// drop.
#[derive(Debug)]
struct SlotHold {
    pool: Arc<PoolSegment>,
    held: SlotRef,
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        if self.pool.core.release(self.held) {
            self.pool.unlink_if_drained();
        }
    }
}

/// A received message: its metadata and a view of its slot's bytes. Dropping it returns
/// the slot to the sender's pool (and wakes the sender if it waits for one).
pub struct Message {
    hold: SlotHold,
    desc: Descriptor,
    meta: TensorMeta,
    data: NonNull<u8>,
}

// SAFETY: the message is the slot's one holder; `data` points into a mapping its pool
// keeps alive, and nothing in it is tied to a thread.
unsafe impl Send for Message {}
// SAFETY: `&Message` gives only shared access to the bytes.
unsafe impl Sync for Message {}

impl core::fmt::Debug for Message {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Message")
            .field("seq", &self.desc.seq)
            .field("tag", &self.desc.tag)
            .field("pool_id", &self.desc.pool_id)
            .field("slot", &self.hold.held.slot)
            .field("generation", &self.hold.held.generation)
            .field("meta", &self.meta)
            .finish()
    }
}

impl Message {
    received_accessors!();
}

impl Deref for Message {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes from `data` lie inside the slot (checked in `check`), in a
        // mapping the pool keeps alive; this message holds the slot until it drops.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.desc.len as usize) }
    }
}
