//! Rings in named POSIX shared memory: [`Ring`] of any `Pod` element, [`SpscRing`] or
//! [`MpmcRing`] by its flavor, for processes that pass small values (or their own
//! descriptors) without slot pools.
//!
//! A ring handle creates or opens the segment (checking the ring parameters in it against
//! the element type asked for) and hands out endpoints (`endpoints.rs`): the algorithms of
//! [`crate::ring`] over the segment's cells. Every endpoint attaches through
//! [`crate::liveness`] (a participant entry with its lock; SPSC endpoints also claim their
//! role), so that a blocked peer learns of its death.

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;

use crate::descriptor::Descriptor;
use crate::layout::{Corrupted, MpmcCell, RingLayout, SegmentHeader, SegmentKind, SpscCell};
use crate::liveness::AttachError;
use crate::ring::RingSegment;
use crate::shm::{Segment, SegmentOptions, ShmError, segment_options};

mod broadcast;
mod endpoints;

pub use broadcast::{BroadcastProducer, BroadcastReader};
pub use endpoints::{MpmcConsumer, MpmcProducer, SpscConsumer, SpscProducer};

/// Why a ring could not be created or opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum RingError {
    /// The segment could not be created or opened (no such name, not ours, not a gpuring
    /// segment, another kind, no space for it, ...).
    Segment(ShmError),
    /// `create`: a capacity that is not a power of two in `1..=2^24` (`2..=2^24` for MPMC).
    InvalidCapacity {
        /// The capacity asked for.
        capacity: u64,
    },
    /// `open`: the ring holds elements of another size or alignment than the type asked
    /// for.
    ElementMismatch {
        /// `(size, align)` of the type asked for.
        expected: (u32, u32),
        /// `(size, align)` recorded in the ring.
        found: (u32, u32),
    },
    /// `open`: the ring's parameters are impossible.
    Corrupted(Corrupted),
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RingError::Segment(e) => e.fmt(f),
            RingError::InvalidCapacity { capacity } => write!(
                f,
                "capacity {capacity} is not a power of two in 1..=16777216 (2.. for MPMC)"
            ),
            RingError::ElementMismatch { expected, found } => write!(
                f,
                "ring elements are {} bytes aligned to {}, the type asked for is {} aligned to {}",
                found.0, found.1, expected.0, expected.1
            ),
            RingError::Corrupted(c) => c.fmt(f),
        }
    }
}

impl std::error::Error for RingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The segment's error is displayed above: its own source, not itself.
        match self {
            RingError::Segment(e) => e.source(),
            _ => None,
        }
    }
}

error_from!(RingError { Segment(ShmError) });

/// Options for creating or opening a [`Ring`], as for a channel: the name, then
/// `create()` or `open()`. From [`Ring::builder`].
///
/// `create` uses every option; `open` uses the name and how the segment is opened (the
/// capacity is the creator's). The element type and the flavor are the builder's type
/// parameters: the ring's endpoints differ by flavor (an MPMC end is `Clone` and used
/// through `&self`, an SPSC end through `&mut self`), so the flavor is chosen where the
/// types are.
///
/// ```no_run
/// use std::time::Duration;
/// use gpuring::{Descriptor, MpmcRing};
/// let ring = MpmcRing::<Descriptor>::builder("jobs").capacity(4096).create()?;
/// let peer = MpmcRing::<Descriptor>::builder("jobs").open_timeout(Duration::from_secs(5)).open()?;
/// # Ok::<(), gpuring::RingError>(())
/// ```
#[derive(Debug)]
pub struct RingBuilder<T, F> {
    segment: SegmentOptions,
    capacity: u64,
    /// Broadcast rings: the producer never waits for readers.
    lagging: bool,
    _ring: PhantomData<fn() -> Ring<T, F>>,
}

impl<T, F> Clone for RingBuilder<T, F> {
    fn clone(&self) -> Self {
        Self {
            segment: self.segment.clone(),
            capacity: self.capacity,
            lagging: self.lagging,
            _ring: PhantomData,
        }
    }
}

impl<T: Pod + Send, F: RingFlavor> RingBuilder<T, F> {
    /// Number of cells, a power of two in `1..=2^24` (`2..` for MPMC; checked by `create`;
    /// default 1024).
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    segment_options!();

    /// Creates the ring, exclusively, mode 0600.
    ///
    /// The ring lives while any process has it open or an element waits in it: the last
    /// handle out removes it if it is empty.
    ///
    /// # Errors
    ///
    /// [`RingError::InvalidCapacity`]; [`RingError::Segment`] with
    /// [`ShmError::InvalidName`], [`ShmError::AlreadyExists`], [`ShmError::NoSpace`],
    /// [`ShmError::PermissionDenied`] or [`ShmError::Io`].
    pub fn create(&self) -> Result<Ring<T, F>, RingError> {
        let capacity = self.capacity;
        let layout = layout::<T, F>(capacity).ok_or(RingError::InvalidCapacity { capacity })?;
        let segment = self.segment.create(F::KIND, layout.total_size, |seg| {
            if F::STAMPED {
                RingSegment::init_in::<T, _>(seg, &layout, |i| MpmcCell::<T>::new(i as u64));
            } else {
                RingSegment::init_in::<T, _>(seg, &layout, |_| SpscCell::<T>::new());
            }
            if self.lagging {
                RingSegment::set_lagging_in(seg, &layout);
            }
            Ok::<_, ShmError>(())
        })?;
        Ok(Ring::view(segment, layout))
    }

    /// Opens the ring if it exists, and creates it where it does not: what a process that
    /// may be restarted calls. A ring whose creator died is attached to as it is, with what
    /// waits in it; of several processes calling this at once, one creates the ring and the
    /// others open it. An existing ring's capacity is its creator's.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-ring-open-or-create");
    /// use gpuring::MpmcRing;
    /// let ring = MpmcRing::<u64>::builder("doc-ring-open-or-create").capacity(64).open_or_create()?;
    /// ring.producer()?.push(7)?;
    /// drop(ring); // an element waits: the ring stays
    /// let again = MpmcRing::<u64>::builder("doc-ring-open-or-create").open_or_create()?;
    /// assert_eq!(again.consumer()?.pop()?, 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open) for a ring that exists, as [`create`](Self::create) for one
    /// that does not.
    pub fn open_or_create(&self) -> Result<Ring<T, F>, RingError> {
        let now = self.clone().open_timeout(std::time::Duration::ZERO);
        let shm: fn(&RingError) -> Option<&ShmError> = |e| match e {
            RingError::Segment(s) => Some(s),
            _ => None,
        };
        crate::shm::open_or_create(|| now.open(), || self.open(), || self.create(), shm)
    }

    /// Opens the ring, waiting up to the open timeout (default
    /// [`DEFAULT_OPEN_TIMEOUT`](crate::DEFAULT_OPEN_TIMEOUT)) for the name to appear and
    /// its creator to finish (a consumer that may start first sets a longer
    /// [`open_timeout`](Self::open_timeout)). Checks owner, mode, size, magic, version and
    /// the element type.
    ///
    /// # Errors
    ///
    /// [`RingError::ElementMismatch`], [`RingError::Corrupted`]; [`RingError::Segment`] with
    /// [`ShmError::NotFound`], [`ShmError::PermissionDenied`], [`ShmError::SizeMismatch`],
    /// [`ShmError::BadMagic`], [`ShmError::VersionMismatch`],
    /// [`ShmError::NotInitialized`], [`ShmError::KindMismatch`] or [`ShmError::Io`].
    pub fn open(&self) -> Result<Ring<T, F>, RingError> {
        let (segment, _) = self.segment.open(&[F::KIND])?;
        // The segment is at least a header long; the ring header and the table follow it.
        let min = RingLayout::new(1, 0).expect("valid").cells;
        if segment.len() < min {
            let (expected, found) = (min as u64, segment.len() as u64);
            return Err(ShmError::SizeMismatch { expected, found }.into());
        }
        let (found, capacity) = RingSegment::read_params(&segment, size_of::<SegmentHeader>())
            .map_err(RingError::Corrupted)?;
        let expected = (size_of::<T>() as u32, align_of::<T>() as u32);
        if found != expected {
            return Err(RingError::ElementMismatch { expected, found });
        }
        let layout = layout::<T, F>(capacity).ok_or(RingError::Corrupted(Corrupted {
            what: "ring capacity is not a power of two in range",
        }))?;
        if layout.total_size != segment.len() {
            let (expected, found) = (layout.total_size as u64, segment.len() as u64);
            return Err(ShmError::SizeMismatch { expected, found }.into());
        }
        segment.populate();
        Ok(Ring::view(segment, layout))
    }
}

/// One producer and one consumer: the flavor of an [`SpscRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spsc;

/// Any number of producers and consumers: the flavor of an [`MpmcRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mpmc;

/// One producer, and readers that each read every element: the flavor of a
/// [`BroadcastRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broadcast;

/// A ring's flavor: [`Spsc`], [`Mpmc`] or [`Broadcast`]. Sealed.
pub trait RingFlavor: sealed::RingFlavor {}

impl<F: sealed::RingFlavor> RingFlavor for F {}

mod sealed {
    use super::*;

    /// What differs between the flavors when a ring is created or opened.
    pub trait RingFlavor: Sized + 'static {
        /// The segment kind.
        const KIND: SegmentKind;
        /// Whether the cells carry stamps (`MpmcCell`) or are bare (`SpscCell`).
        const STAMPED: bool;
        /// Whether elements not yet read keep the ring for a consumer that comes later
        /// (a broadcast ring's readers read only what comes after they join).
        const KEEPS_UNREAD: bool = true;
    }

    impl RingFlavor for Spsc {
        const KIND: SegmentKind = SegmentKind::SpscRing;
        const STAMPED: bool = false;
    }

    impl RingFlavor for Mpmc {
        const KIND: SegmentKind = SegmentKind::MpmcRing;
        const STAMPED: bool = true;
    }

    impl RingFlavor for Broadcast {
        const KIND: SegmentKind = SegmentKind::BroadcastRing;
        const STAMPED: bool = false;
        const KEEPS_UNREAD: bool = false;
    }
}

/// Bytes per cell of a ring of `T` of flavor `F`.
fn cell_size<T, F: RingFlavor>() -> usize {
    if F::STAMPED { size_of::<MpmcCell<T>>() } else { size_of::<SpscCell<T>>() }
}

/// The layout of a ring of `F` with `capacity` cells of `T`, if the capacity is a power of
/// two in range (an MPMC ring needs two cells at least: with one, "written at p" and "free
/// for p + 1" are the same stamp).
fn layout<T, F: RingFlavor>(capacity: u64) -> Option<RingLayout> {
    RingLayout::new(capacity, cell_size::<T, F>()).filter(|_| !F::STAMPED || capacity >= 2)
}

/// A ring of `T` in named shared memory: an [`SpscRing`] (one producer, one consumer) or an
/// [`MpmcRing`] (any number of each, each element taken by exactly one consumer, each
/// producer's elements in order).
///
/// The ring lives while any process has it open or an element waits in it: the last
/// handle out, in whichever process (the creator's or not), removes it if it is empty, and
/// a ring with elements waiting stays for a consumer that comes later (or
/// [`inspect::remove`](crate::inspect::remove), `gpuring clean --queued`).
///
/// ```no_run
/// use gpuring::{MpmcRing, SpscRing};
/// // Process A: create the ring (mode 0600, exclusive) and claim the producer role.
/// let ring = SpscRing::<u64>::builder("ticks").capacity(256).create()?;
/// let mut tx = ring.producer()?;
/// assert!(ring.producer().is_err(), "one producer only");
/// tx.push(1)?;
///
/// // Process B: open it (checks owner, mode, size, magic, version, element type).
/// let ring = SpscRing::<u64>::builder("ticks").open()?;
/// let mut rx = ring.consumer()?;
/// assert_eq!(rx.pop()?, 1);
///
/// // Many producers and consumers: the same API; their ends are `Clone`.
/// let work = MpmcRing::<u64>::builder("work").create()?;
/// let (tx, rx) = (work.producer()?, work.consumer()?);
/// let tx2 = tx.clone(); // another producer, e.g. for another thread
/// tx.push(5)?;
/// tx2.push(6)?;
/// assert_eq!((rx.pop()?, rx.pop()?), (5, 6));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Ring<T, F> {
    ring: Arc<RingSegment>,
    _elem: PhantomData<(fn() -> T, F)>,
}

/// A single-producer single-consumer ring of `T` in named shared memory (see [`Ring`]).
pub type SpscRing<T = Descriptor> = Ring<T, Spsc>;
/// A multi-producer multi-consumer ring of `T` in named shared memory (see [`Ring`]).
pub type MpmcRing<T = Descriptor> = Ring<T, Mpmc>;
/// A broadcast ring of `T` in named shared memory: one producer, and up to 64 endpoints
/// in all, each reader reading every element published after it attached (see
/// [`BroadcastProducer`], [`BroadcastReader`]). It keeps nothing for a reader that comes
/// later: the last handle out removes it.
///
/// ```no_run
/// use gpuring::BroadcastRing;
/// // The producer's process.
/// let ring = BroadcastRing::<u64>::builder("steps").capacity(64).create()?;
/// let mut tx = ring.producer()?;
/// // Each worker's process.
/// let ring = BroadcastRing::<u64>::builder("steps").open()?;
/// let mut rx = ring.reader()?;
/// tx.push(1)?;
/// assert_eq!(rx.read()?, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type BroadcastRing<T = Descriptor> = Ring<T, Broadcast>;

impl<T: Pod + Send, F: RingFlavor> Ring<T, F> {
    /// Options for ring `name` (a shared-memory object name; a leading `/` is optional):
    /// capacity 1024, open timeout [`DEFAULT_OPEN_TIMEOUT`](crate::DEFAULT_OPEN_TIMEOUT).
    ///
    /// ```no_run
    /// let ring = gpuring::SpscRing::<u64>::builder("ticks").capacity(256).create()?;
    /// # drop(ring);
    /// # Ok::<(), gpuring::RingError>(())
    /// ```
    pub fn builder(name: impl Into<String>) -> RingBuilder<T, F> {
        RingBuilder {
            segment: SegmentOptions::new(name.into()),
            capacity: 1024,
            lagging: false,
            _ring: PhantomData,
        }
    }

    fn view(mut segment: Segment, layout: RingLayout) -> Self {
        // The last user out removes the ring, unless elements wait in it for a consumer.
        segment.set_last_out(Box::new(move |seg| {
            !F::KEEPS_UNREAD || RingSegment::drained_in(seg, &layout)
        }));
        Self { ring: RingSegment::view(Arc::new(segment), layout, F::STAMPED), _elem: PhantomData }
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// The segment's object name, with its leading `/`.
    pub fn name(&self) -> &str {
        self.ring.segment().name()
    }

    /// How many threads sleep waiting for an element and for room (a diagnostic snapshot).
    pub fn sleepers(&self) -> (u32, u32) {
        self.ring.sleepers()
    }

    pub(crate) fn segment(&self) -> &Segment {
        self.ring.segment()
    }
}

impl<T: Pod + Send> Ring<T, Spsc> {
    /// Claims the producer role and returns the producer end.
    ///
    /// # Errors
    ///
    /// [`AttachError::RoleTaken`] while another producer lives;
    /// [`AttachError::TooManyParticipants`]; [`AttachError::Corrupted`] when the ring's
    /// positions are impossible.
    pub fn producer(&self) -> Result<SpscProducer<T>, AttachError> {
        self.ring.spsc_producer().map(|inner| SpscProducer { inner })
    }

    /// Claims the consumer role and returns the consumer end.
    ///
    /// # Errors
    ///
    /// As [`producer`](Self::producer), for the consumer role.
    pub fn consumer(&self) -> Result<SpscConsumer<T>, AttachError> {
        self.ring.spsc_consumer().map(|inner| SpscConsumer { inner })
    }
}

impl<T: Pod + Send> Ring<T, Mpmc> {
    /// A producer end. Any number may exist (clone one, or call this again).
    ///
    /// # Errors
    ///
    /// [`AttachError::TooManyParticipants`]; [`AttachError::Corrupted`] when the ring's
    /// positions are impossible.
    pub fn producer(&self) -> Result<MpmcProducer<T>, AttachError> {
        self.ring.mpmc_producer(false).map(|inner| MpmcProducer { inner })
    }

    /// A consumer end. Any number may exist.
    ///
    /// # Errors
    ///
    /// As [`producer`](Self::producer).
    pub fn consumer(&self) -> Result<MpmcConsumer<T>, AttachError> {
        self.ring.mpmc_consumer(false).map(|inner| MpmcConsumer { inner })
    }
}

impl<T: Pod + Send> Ring<T, Broadcast> {
    /// Claims the producer role and returns the producer end (one producer at a time).
    ///
    /// # Errors
    ///
    /// [`AttachError::RoleTaken`] while another producer lives;
    /// [`AttachError::TooManyParticipants`]; [`AttachError::Corrupted`].
    pub fn producer(&self) -> Result<BroadcastProducer<T>, AttachError> {
        self.ring.broadcast_producer().map(|inner| BroadcastProducer { inner })
    }

    /// A new reader, which reads every element published from now on.
    ///
    /// # Errors
    ///
    /// [`AttachError::TooManyParticipants`] when 64 endpoints are attached;
    /// [`AttachError::Corrupted`].
    pub fn reader(&self) -> Result<BroadcastReader<T>, AttachError> {
        self.ring.broadcast_reader().map(|inner| BroadcastReader { inner })
    }
}

impl<T: Pod + Send> RingBuilder<T, Broadcast> {
    /// Whether the producer never waits for readers (`create` only; default `false`).
    ///
    /// By default the slowest reader holds the producer back: a push waits until every
    /// reader has room, and nothing is lost. Lagging, a push never waits: a reader that
    /// falls more than the ring's capacity behind is told how many elements it missed
    /// ([`ReadError::Lagged`](crate::ReadError::Lagged), as `tokio::sync::broadcast`
    /// says `Lagged(n)`) and goes on with the oldest element still there; the others
    /// never notice it.
    ///
    /// ```no_run
    /// let ring = gpuring::BroadcastRing::<u64>::builder("ticks").lagging(true).create()?;
    /// # drop(ring);
    /// # Ok::<(), gpuring::RingError>(())
    /// ```
    pub fn lagging(mut self, on: bool) -> Self {
        self.lagging = on;
        self
    }
}

#[cfg(test)]
mod sole_tests {
    use super::{Mpmc, Ring};

    /// A sole ring end takes no claim lock, so a clone (sharing its line) must never exist.
    #[test]
    #[cfg_attr(miri, ignore = "shm_open and mmap are not available under Miri")]
    fn a_sole_end_moves_elements_and_cannot_be_cloned() {
        let name = format!("gpuring-test-sole-{}", std::process::id());
        let ring = Ring::<u64, Mpmc>::builder(&name).capacity(8).create().unwrap();
        let (tx, rx) =
            (ring.ring.mpmc_producer::<u64>(true).unwrap(), ring.ring.mpmc_consumer(true).unwrap());
        for i in 0..20 {
            tx.try_push(i).unwrap();
            assert_eq!(rx.try_pop(), Ok(i));
        }
        let cloned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tx.clone()));
        assert!(cloned.is_err(), "cloning a sole end panics");
        let shared = ring.producer().unwrap();
        drop(shared.clone()); // a shared end clones
    }
}
