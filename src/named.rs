//! Rings in named POSIX shared memory: the handles two processes use to talk.
//!
//! [`SpscRing`] and [`MpmcRing`] create or open a segment (through [`crate::shm`]), check
//! the ring parameters in it against the element type asked for, and hand out endpoints:
//! the [`ring`](crate::ring) algorithms over [`ShmStorage`]. SPSC endpoints claim their
//! role in the segment header (a second producer gets [`ShmError::RoleTaken`]) and give it
//! back on drop.
//!
//! ```no_run
//! use gpuring::{Descriptor, SpscRing};
//! // process A
//! let ring = SpscRing::<Descriptor>::create("demo", 1024)?;
//! let mut tx = ring.producer()?;
//! tx.push(Descriptor::default())?;
//! // process B
//! let ring = SpscRing::<Descriptor>::open("demo")?;
//! let mut rx = ring.consumer()?;
//! let d = rx.pop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use bytemuck::Pod;

use crate::descriptor::Descriptor;
use crate::layout::{MpmcCell, RingControl, RingHeader, RingLayout, SegmentKind, SpscCell};
use crate::ring::{Storage, mpmc, spsc};
use crate::shm::{Role, Segment, ShmError};
use crate::sync::{AtomicU32, Ordering};

/// The producer end of a shared-memory SPSC ring.
pub type SpscProducer<T = Descriptor> = spsc::Producer<T, ShmStorage<SpscCell<T>>>;
/// The consumer end of a shared-memory SPSC ring.
pub type SpscConsumer<T = Descriptor> = spsc::Consumer<T, ShmStorage<SpscCell<T>>>;
/// A producer end of a shared-memory MPMC ring.
pub type MpmcProducer<T = Descriptor> = mpmc::Producer<T, ShmStorage<MpmcCell<T>>>;
/// A consumer end of a shared-memory MPMC ring.
pub type MpmcConsumer<T = Descriptor> = mpmc::Consumer<T, ShmStorage<MpmcCell<T>>>;

/// How long `open` waits for a creator to finish initialising, by default.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(1);

/// A ring's cells and control block inside a mapped segment.
#[derive(Debug)]
pub struct ShmStorage<C> {
    ring: Arc<RingSegment>,
    // Released when the last clone drops (SPSC endpoints are never cloned).
    _claim: Option<Arc<RoleClaim>>,
    _cell: PhantomData<C>,
}

impl<C> Clone for ShmStorage<C> {
    fn clone(&self) -> Self {
        Self { ring: self.ring.clone(), _claim: self._claim.clone(), _cell: PhantomData }
    }
}

impl<C> ShmStorage<C> {
    /// The segment the ring lives in.
    pub fn segment(&self) -> &Segment {
        &self.ring.segment
    }
}

// SAFETY: `RingSegment::open`/`create` checked that the segment is exactly
// `layout.total_size` bytes for a power-of-two capacity of cells of `C`'s size, and the
// offsets come from that layout; the mapping lives as long as the `Arc<RingSegment>` that
// every clone holds. Cells were initialised by the creator before `init` was published.
unsafe impl<C> Storage for ShmStorage<C> {
    type Cell = C;
    fn control(&self) -> &RingControl {
        self.ring.control()
    }
    fn cells(&self) -> &[C] {
        // SAFETY: `capacity` cells of `C` start at `cells`, inside the mapping; C is a cell
        // type (atomics and UnsafeCell<Pod>), valid for any bytes.
        unsafe {
            std::slice::from_raw_parts(self.ring.cells.cast().as_ptr(), self.ring.layout.capacity)
        }
    }
}

// SAFETY: the storage is a view of shared memory whose cells are accessed only under the
// ring protocol, and `C` holds `Pod` values; nothing in it is tied to a thread.
unsafe impl<C: Send> Send for ShmStorage<C> {}
// SAFETY: as above.
unsafe impl<C: Send> Sync for ShmStorage<C> {}

/// A ring inside a mapped segment: a whole ring segment, or the ring part of a channel or
/// pool segment.
#[derive(Debug)]
pub(crate) struct RingSegment {
    segment: Arc<Segment>,
    layout: RingLayout,
    control: NonNull<RingControl>,
    cells: NonNull<u8>,
}

// SAFETY: pointers into the mapping owned by `segment`; see `ShmStorage`.
unsafe impl Send for RingSegment {}
// SAFETY: as above.
unsafe impl Sync for RingSegment {}

/// An SPSC role held in the segment header; given back on drop.
#[derive(Debug)]
pub(crate) struct RoleClaim {
    ring: Arc<RingSegment>,
    role: Role,
}

impl RoleClaim {
    fn take(ring: &Arc<RingSegment>, role: Role) -> Result<Self, ShmError> {
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        // Acquire on success: pairs with the Release store in `drop` of the previous holder,
        // so its last position and cell writes are visible to us.
        match ring.claim_word(role).compare_exchange(0, pid, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => Ok(Self { ring: ring.clone(), role }),
            Err(holder_pid) => Err(ShmError::RoleTaken { role, holder_pid }),
        }
    }
}

impl Drop for RoleClaim {
    fn drop(&mut self) {
        // Release: pairs with the Acquire CAS in `take` of the next holder.
        self.ring.claim_word(self.role).store(0, Ordering::Release);
    }
}

impl RingSegment {
    fn header(&self) -> &RingHeader {
        // SAFETY: offset from the checked layout; RingHeader is atomics only.
        unsafe { self.segment.at::<RingHeader>(self.layout.ring_header).as_ref() }
    }

    fn control(&self) -> &RingControl {
        // SAFETY: offset from the checked layout, in bounds and aligned; RingControl is
        // atomics only, valid for any bytes.
        unsafe { self.control.as_ref() }
    }

    /// Threads asleep waiting for an element, and for room.
    fn sleepers(&self) -> (u32, u32) {
        let c = self.control();
        (c.not_empty.sleepers(), c.not_full.sleepers())
    }

    fn claim_word(&self, role: Role) -> &AtomicU32 {
        match role {
            Role::Producer => &self.header().producer_claim,
            Role::Consumer => &self.header().consumer_claim,
        }
    }

    /// Writes a fresh ring (header and cells) at `layout` into `seg`, which is being
    /// created: call it from the `init` closure of [`Segment::create`].
    pub(crate) fn init_in<T: Pod, C>(
        seg: &Segment,
        layout: &RingLayout,
        init_cell: impl Fn(usize) -> C,
    ) {
        assert_eq!(size_of::<C>(), layout.cell_size, "cell type does not match the layout");
        // SAFETY: offsets from `layout`, which sized the segment (`at` checks the bounds);
        // the memory is ours alone until `Segment::create` publishes it.
        let header = unsafe { seg.at::<RingHeader>(layout.ring_header).as_ref() };
        // Relaxed: published by the Release store of `init` in `Segment::create`.
        header.capacity.store(layout.capacity as u64, Ordering::Relaxed);
        header.elem_size.store(size_of::<T>() as u32, Ordering::Relaxed);
        header.elem_align.store(align_of::<T>() as u32, Ordering::Relaxed);
        for i in 0..layout.capacity {
            // SAFETY: cell i lies inside the cell array of `layout`; nobody else has the
            // segment yet, so a plain write is fine.
            unsafe { seg.at::<C>(layout.cells + i * layout.cell_size).write(init_cell(i)) };
        }
    }

    /// Checks the ring header at `layout.ring_header` of an opened segment: element `T`,
    /// and exactly `layout.capacity` cells (which the enclosing segment's parameters
    /// implied).
    pub(crate) fn check_in<T: Pod>(seg: &Segment, layout: &RingLayout) -> Result<(), ShmError> {
        // SAFETY: `at` checks the bounds; RingHeader is atomics only.
        let header = unsafe { seg.at::<RingHeader>(layout.ring_header).as_ref() };
        // Relaxed: `Segment::open` already synchronised with the creator through `init`.
        let found =
            (header.elem_size.load(Ordering::Relaxed), header.elem_align.load(Ordering::Relaxed));
        let expected = (size_of::<T>() as u32, align_of::<T>() as u32);
        if found != expected {
            return Err(ShmError::ElementMismatch { expected, found });
        }
        if header.capacity.load(Ordering::Relaxed) != layout.capacity as u64 {
            return Err(ShmError::Corrupted(crate::ring::Corrupted {
                what: "ring capacity disagrees with the segment's parameters",
            }));
        }
        Ok(())
    }

    fn create<T: Pod, C>(
        name: &str,
        kind: SegmentKind,
        capacity: u64,
        init_cell: impl Fn(usize) -> C,
    ) -> Result<Arc<Self>, ShmError> {
        let layout = RingLayout::new(capacity, size_of::<C>())
            .ok_or(ShmError::InvalidCapacity { capacity })?;
        let segment = Segment::create(name, kind, layout.total_size, |seg| {
            Self::init_in::<T, C>(seg, &layout, init_cell);
            Ok(())
        })?;
        Ok(Self::view(Arc::new(segment), layout))
    }

    fn open<T: Pod, C>(
        name: &str,
        kind: SegmentKind,
        timeout: Duration,
    ) -> Result<Arc<Self>, ShmError> {
        let segment = Segment::open(name, kind, timeout)?;
        // The segment is at least a header long; the ring header follows it. Check that
        // there is room for it before reading.
        let min = RingLayout::new(1, 0).expect("valid").cells;
        if segment.len() < min {
            return Err(ShmError::SizeMismatch {
                expected: min as u64,
                found: segment.len() as u64,
            });
        }
        // SAFETY: inside the mapping (checked just above); atomics only.
        let header =
            unsafe { segment.at::<RingHeader>(size_of::<crate::layout::SegmentHeader>()).as_ref() };
        // Relaxed: `Segment::open` already synchronised with the creator through `init`.
        let capacity = header.capacity.load(Ordering::Relaxed);
        let found =
            (header.elem_size.load(Ordering::Relaxed), header.elem_align.load(Ordering::Relaxed));
        let expected = (size_of::<T>() as u32, align_of::<T>() as u32);
        if found != expected {
            return Err(ShmError::ElementMismatch { expected, found });
        }
        let layout = RingLayout::new(capacity, size_of::<C>()).ok_or(ShmError::Corrupted(
            crate::ring::Corrupted { what: "ring capacity is not a power of two in range" },
        ))?;
        if layout.total_size != segment.len() {
            return Err(ShmError::SizeMismatch {
                expected: layout.total_size as u64,
                found: segment.len() as u64,
            });
        }
        Ok(Self::view(Arc::new(segment), layout))
    }

    /// The ring at `layout` inside `segment`, whose parameters the caller has checked.
    ///
    /// # Panics
    ///
    /// If the ring does not fit in the segment (a bug in the caller's checks).
    pub(crate) fn view(segment: Arc<Segment>, layout: RingLayout) -> Arc<Self> {
        assert!(layout.total_size <= segment.len(), "ring outside its segment");
        // SAFETY: offsets from a layout that ends inside the mapping (`at` checks each).
        let (control, cells) =
            unsafe { (segment.at::<RingControl>(layout.control), segment.at::<u8>(layout.cells)) };
        Arc::new(Self { segment, layout, control, cells })
    }

    /// The SPSC producer end, claiming the producer role.
    pub(crate) fn spsc_producer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<SpscProducer<T>, ShmError> {
        let claim = RoleClaim::take(self, Role::Producer)?;
        // SAFETY: the claim makes this the only producer until it is dropped with the
        // endpoint's storage.
        Ok(unsafe { spsc::Producer::new(self.storage(Some(claim))) }?)
    }

    /// The SPSC consumer end, claiming the consumer role.
    pub(crate) fn spsc_consumer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<SpscConsumer<T>, ShmError> {
        let claim = RoleClaim::take(self, Role::Consumer)?;
        // SAFETY: the claim makes this the only consumer until it is dropped with the
        // endpoint's storage.
        Ok(unsafe { spsc::Consumer::new(self.storage(Some(claim))) }?)
    }

    /// An MPMC producer end.
    pub(crate) fn mpmc_producer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<MpmcProducer<T>, ShmError> {
        Ok(mpmc::Producer::new(self.storage(None))?)
    }

    /// An MPMC consumer end.
    pub(crate) fn mpmc_consumer<T: Pod + Send>(
        self: &Arc<Self>,
    ) -> Result<MpmcConsumer<T>, ShmError> {
        Ok(mpmc::Consumer::new(self.storage(None))?)
    }

    pub(crate) fn storage<C>(self: &Arc<Self>, claim: Option<RoleClaim>) -> ShmStorage<C> {
        // The layout was computed for one cell type; a view with another would mis-stride.
        assert_eq!(size_of::<C>(), self.layout.cell_size, "cell type does not match the layout");
        ShmStorage { ring: self.clone(), _claim: claim.map(Arc::new), _cell: PhantomData }
    }
}

/// Options for creating or opening a ring: capacity and how long `open` waits.
///
/// ```no_run
/// use std::time::Duration;
/// use gpuring::{Descriptor, RingOptions};
/// let ring = RingOptions::new("jobs").capacity(4096).create_mpmc::<Descriptor>()?;
/// let peer = RingOptions::new("jobs").open_timeout(Duration::from_secs(5)).open_mpmc::<Descriptor>()?;
/// # Ok::<(), gpuring::ShmError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RingOptions {
    name: String,
    capacity: u64,
    open_timeout: Duration,
}

impl RingOptions {
    /// Options for ring `name` (a shared-memory object name; a leading `/` is optional),
    /// capacity 1024, open timeout [`DEFAULT_OPEN_TIMEOUT`].
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), capacity: 1024, open_timeout: DEFAULT_OPEN_TIMEOUT }
    }

    /// Number of cells, a power of two in `1..=2^24` (checked by `create`).
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    /// How long `open` waits for the creator to finish initialising the segment.
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.open_timeout = timeout;
        self
    }

    /// Creates an SPSC ring. See [`SpscRing::create`].
    ///
    /// # Errors
    ///
    /// As [`SpscRing::create`].
    pub fn create_spsc<T: Pod + Send>(&self) -> Result<SpscRing<T>, ShmError> {
        let ring = RingSegment::create::<T, SpscCell<T>>(
            &self.name,
            SegmentKind::SpscRing,
            self.capacity,
            |_| SpscCell::new(),
        )?;
        Ok(SpscRing { ring, _elem: PhantomData })
    }

    /// Opens an SPSC ring. See [`SpscRing::open`].
    ///
    /// # Errors
    ///
    /// As [`SpscRing::open`].
    pub fn open_spsc<T: Pod + Send>(&self) -> Result<SpscRing<T>, ShmError> {
        let ring = RingSegment::open::<T, SpscCell<T>>(
            &self.name,
            SegmentKind::SpscRing,
            self.open_timeout,
        )?;
        Ok(SpscRing { ring, _elem: PhantomData })
    }

    /// Creates an MPMC ring. See [`MpmcRing::create`].
    ///
    /// # Errors
    ///
    /// As [`MpmcRing::create`].
    pub fn create_mpmc<T: Pod + Send>(&self) -> Result<MpmcRing<T>, ShmError> {
        let ring = RingSegment::create::<T, MpmcCell<T>>(
            &self.name,
            SegmentKind::MpmcRing,
            self.capacity,
            |i| MpmcCell::new(i as u64),
        )?;
        Ok(MpmcRing { ring, _elem: PhantomData })
    }

    /// Opens an MPMC ring. See [`MpmcRing::open`].
    ///
    /// # Errors
    ///
    /// As [`MpmcRing::open`].
    pub fn open_mpmc<T: Pod + Send>(&self) -> Result<MpmcRing<T>, ShmError> {
        let ring = RingSegment::open::<T, MpmcCell<T>>(
            &self.name,
            SegmentKind::MpmcRing,
            self.open_timeout,
        )?;
        Ok(MpmcRing { ring, _elem: PhantomData })
    }
}

/// A single-producer single-consumer ring of `T` in named shared memory.
///
/// The creating handle unlinks the name when it and every endpoint made from it are
/// dropped; processes that opened the ring keep their mapping.
///
/// ```no_run
/// use gpuring::SpscRing;
/// let ring = SpscRing::<u64>::create("ticks", 256)?;
/// let mut tx = ring.producer()?;
/// assert!(ring.producer().is_err(), "one producer only");
/// tx.try_push(1)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SpscRing<T = Descriptor> {
    ring: Arc<RingSegment>,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Pod + Send> SpscRing<T> {
    /// Creates ring `name` with `capacity` cells (a power of two), mode 0600, exclusively.
    ///
    /// # Errors
    ///
    /// [`ShmError::InvalidName`], [`ShmError::InvalidCapacity`],
    /// [`ShmError::AlreadyExists`], [`ShmError::PermissionDenied`], [`ShmError::Io`].
    pub fn create(name: &str, capacity: u64) -> Result<Self, ShmError> {
        RingOptions::new(name).capacity(capacity).create_spsc()
    }

    /// Opens ring `name`, waiting up to [`DEFAULT_OPEN_TIMEOUT`] for its creator to finish.
    ///
    /// # Errors
    ///
    /// [`ShmError::NotFound`], [`ShmError::PermissionDenied`], [`ShmError::SizeMismatch`],
    /// [`ShmError::BadMagic`], [`ShmError::VersionMismatch`], [`ShmError::NotInitialized`],
    /// [`ShmError::KindMismatch`], [`ShmError::ElementMismatch`], [`ShmError::Corrupted`],
    /// [`ShmError::Io`].
    pub fn open(name: &str) -> Result<Self, ShmError> {
        RingOptions::new(name).open_spsc()
    }

    /// Claims the producer role and returns the producer end.
    ///
    /// # Errors
    ///
    /// [`ShmError::RoleTaken`] while another producer lives; [`ShmError::Corrupted`] when
    /// the ring's positions are impossible.
    pub fn producer(&self) -> Result<SpscProducer<T>, ShmError> {
        self.ring.spsc_producer()
    }

    /// Claims the consumer role and returns the consumer end.
    ///
    /// # Errors
    ///
    /// [`ShmError::RoleTaken`] while another consumer lives; [`ShmError::Corrupted`] when
    /// the ring's positions are impossible.
    pub fn consumer(&self) -> Result<SpscConsumer<T>, ShmError> {
        self.ring.spsc_consumer()
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.ring.layout.capacity
    }

    /// The segment the ring lives in.
    pub fn segment(&self) -> &Segment {
        &self.ring.segment
    }

    /// How many threads sleep waiting for an element and for room (a diagnostic snapshot).
    pub fn sleepers(&self) -> (u32, u32) {
        self.ring.sleepers()
    }
}

/// A multi-producer multi-consumer ring of `T` in named shared memory.
///
/// Any number of processes may open it and make producers and consumers; each consumer
/// sees each element exactly once, and each producer's elements leave in order.
///
/// ```no_run
/// use gpuring::MpmcRing;
/// let ring = MpmcRing::<u64>::create("work", 1024)?;
/// let (tx, rx) = (ring.producer()?, ring.consumer()?);
/// tx.push(5)?;
/// assert_eq!(rx.pop()?, 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MpmcRing<T = Descriptor> {
    ring: Arc<RingSegment>,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Pod + Send> MpmcRing<T> {
    /// Creates ring `name` with `capacity` cells (a power of two), mode 0600, exclusively.
    ///
    /// # Errors
    ///
    /// As [`SpscRing::create`].
    pub fn create(name: &str, capacity: u64) -> Result<Self, ShmError> {
        RingOptions::new(name).capacity(capacity).create_mpmc()
    }

    /// Opens ring `name`, waiting up to [`DEFAULT_OPEN_TIMEOUT`] for its creator to finish.
    ///
    /// # Errors
    ///
    /// As [`SpscRing::open`].
    pub fn open(name: &str) -> Result<Self, ShmError> {
        RingOptions::new(name).open_mpmc()
    }

    /// A producer end. Any number may exist.
    ///
    /// # Errors
    ///
    /// [`ShmError::Corrupted`] when the ring's positions are impossible.
    pub fn producer(&self) -> Result<MpmcProducer<T>, ShmError> {
        self.ring.mpmc_producer()
    }

    /// A consumer end. Any number may exist.
    ///
    /// # Errors
    ///
    /// [`ShmError::Corrupted`] when the ring's positions are impossible.
    pub fn consumer(&self) -> Result<MpmcConsumer<T>, ShmError> {
        self.ring.mpmc_consumer()
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.ring.layout.capacity
    }

    /// The segment the ring lives in.
    pub fn segment(&self) -> &Segment {
        &self.ring.segment
    }

    /// How many threads sleep waiting for an element and for room (a diagnostic snapshot).
    pub fn sleepers(&self) -> (u32, u32) {
        self.ring.sleepers()
    }
}
