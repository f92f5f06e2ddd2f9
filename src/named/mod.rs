//! Rings in named POSIX shared memory: [`SpscRing`] and [`MpmcRing`] of any `Pod` element,
//! for processes that pass small values (or their own descriptors) without slot pools.
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

mod endpoints;

pub use endpoints::{MpmcConsumer, MpmcProducer, SpscConsumer, SpscProducer};

/// Why a ring could not be created or opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum RingError {
    /// The segment could not be created or opened (no such name, not ours, not a gpuring
    /// segment, another kind, a dead creator, ...).
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
        match self {
            RingError::Segment(e) => Some(e),
            RingError::Corrupted(c) => Some(c),
            _ => None,
        }
    }
}

impl From<ShmError> for RingError {
    fn from(e: ShmError) -> Self {
        RingError::Segment(e)
    }
}

/// Options for creating or opening a ring: capacity and how the segment is created and
/// opened.
///
/// ```no_run
/// use std::time::Duration;
/// use gpuring::{Descriptor, RingOptions};
/// let ring = RingOptions::new("jobs").capacity(4096).create_mpmc::<Descriptor>()?;
/// let peer = RingOptions::new("jobs").open_timeout(Duration::from_secs(5)).open_mpmc::<Descriptor>()?;
/// # Ok::<(), gpuring::RingError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RingOptions {
    segment: SegmentOptions,
    capacity: u64,
}

impl RingOptions {
    /// Options for ring `name` (a shared-memory object name; a leading `/` is optional):
    /// capacity 1024, open timeout [`DEFAULT_OPEN_TIMEOUT`](crate::DEFAULT_OPEN_TIMEOUT).
    pub fn new(name: impl Into<String>) -> Self {
        Self { segment: SegmentOptions::new(name.into()), capacity: 1024 }
    }

    /// Number of cells, a power of two in `1..=2^24` (checked by `create`).
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    segment_options!();

    /// Creates an SPSC ring. See [`SpscRing::create`].
    ///
    /// # Errors
    ///
    /// As [`SpscRing::create`].
    pub fn create_spsc<T: Pod + Send>(&self) -> Result<SpscRing<T>, RingError> {
        let ring = self.create::<T, _>(SegmentKind::SpscRing, |_| SpscCell::<T>::new())?;
        Ok(SpscRing { ring, _elem: PhantomData })
    }

    /// Opens an SPSC ring. See [`SpscRing::open`].
    ///
    /// # Errors
    ///
    /// As [`SpscRing::open`].
    pub fn open_spsc<T: Pod + Send>(&self) -> Result<SpscRing<T>, RingError> {
        let ring = self.open::<T, SpscCell<T>>(SegmentKind::SpscRing)?;
        Ok(SpscRing { ring, _elem: PhantomData })
    }

    /// Creates an MPMC ring. See [`MpmcRing::create`].
    ///
    /// # Errors
    ///
    /// As [`MpmcRing::create`].
    pub fn create_mpmc<T: Pod + Send>(&self) -> Result<MpmcRing<T>, RingError> {
        // With one cell, "written at p" and "free for p + 1" are the same stamp.
        if self.capacity < 2 {
            return Err(RingError::InvalidCapacity { capacity: self.capacity });
        }
        let ring = self.create::<T, _>(SegmentKind::MpmcRing, |i| MpmcCell::<T>::new(i as u64))?;
        Ok(MpmcRing { ring, _elem: PhantomData })
    }

    /// Opens an MPMC ring. See [`MpmcRing::open`].
    ///
    /// # Errors
    ///
    /// As [`MpmcRing::open`].
    pub fn open_mpmc<T: Pod + Send>(&self) -> Result<MpmcRing<T>, RingError> {
        let ring = self.open::<T, MpmcCell<T>>(SegmentKind::MpmcRing)?;
        Ok(MpmcRing { ring, _elem: PhantomData })
    }

    fn create<T: Pod, C>(
        &self,
        kind: SegmentKind,
        init_cell: impl Fn(usize) -> C,
    ) -> Result<Arc<RingSegment>, RingError> {
        let capacity = self.capacity;
        let layout = RingLayout::new(capacity, size_of::<C>())
            .ok_or(RingError::InvalidCapacity { capacity })?;
        let segment = self.segment.create(kind, layout.total_size, |seg| {
            RingSegment::init_in::<T, C>(seg, &layout, init_cell);
            Ok::<_, ShmError>(())
        })?;
        Ok(RingSegment::view(Arc::new(segment), layout, kind == SegmentKind::MpmcRing))
    }

    fn open<T: Pod, C>(&self, kind: SegmentKind) -> Result<Arc<RingSegment>, RingError> {
        let (segment, _) = self.segment.open(&[kind])?;
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
        let layout =
            RingLayout::new(capacity, size_of::<C>()).ok_or(RingError::Corrupted(Corrupted {
                what: "ring capacity is not a power of two in range",
            }))?;
        if layout.total_size != segment.len() {
            let (expected, found) = (layout.total_size as u64, segment.len() as u64);
            return Err(ShmError::SizeMismatch { expected, found }.into());
        }
        Ok(RingSegment::view(Arc::new(segment), layout, kind == SegmentKind::MpmcRing))
    }
}

/// A single-producer single-consumer ring of `T` in named shared memory.
///
/// The creating handle unlinks the name when it and every endpoint made from it are
/// dropped; processes that opened the ring keep their mapping.
///
/// ```no_run
/// use gpuring::SpscRing;
/// // Process A: create the ring (mode 0600, exclusive) and claim the producer role.
/// let ring = SpscRing::<u64>::create("ticks", 256)?;
/// let mut tx = ring.producer()?;
/// assert!(ring.producer().is_err(), "one producer only");
/// tx.push(1)?;
///
/// // Process B: open it (checks owner, mode, size, magic, version, element type).
/// let ring = SpscRing::<u64>::open("ticks")?;
/// let mut rx = ring.consumer()?;
/// assert_eq!(rx.pop()?, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SpscRing<T = Descriptor> {
    ring: Arc<RingSegment>,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Pod + Send> SpscRing<T> {
    /// Creates ring `name` with `capacity` cells (a power of two), mode 0600, exclusively.
    /// [`RingOptions`] has the other options.
    ///
    /// # Errors
    ///
    /// [`RingError::InvalidCapacity`]; [`RingError::Segment`] with
    /// [`ShmError::InvalidName`], [`ShmError::AlreadyExists`],
    /// [`ShmError::PermissionDenied`] or [`ShmError::Io`].
    pub fn create(name: &str, capacity: u64) -> Result<Self, RingError> {
        RingOptions::new(name).capacity(capacity).create_spsc()
    }

    /// Opens ring `name`, waiting up to [`DEFAULT_OPEN_TIMEOUT`](crate::DEFAULT_OPEN_TIMEOUT)
    /// for its creator to finish.
    ///
    /// # Errors
    ///
    /// [`RingError::ElementMismatch`], [`RingError::Corrupted`]; [`RingError::Segment`] with
    /// [`ShmError::NotFound`], [`ShmError::PermissionDenied`], [`ShmError::SizeMismatch`],
    /// [`ShmError::BadMagic`], [`ShmError::VersionMismatch`],
    /// [`ShmError::NotInitialized`], [`ShmError::KindMismatch`], [`ShmError::OwnerDead`] or
    /// [`ShmError::Io`].
    pub fn open(name: &str) -> Result<Self, RingError> {
        RingOptions::new(name).open_spsc()
    }

    /// Claims the producer role and returns the producer end.
    ///
    /// # Errors
    ///
    /// [`AttachError::RoleTaken`] while another producer lives;
    /// [`AttachError::TooManyParticipants`]; [`AttachError::Corrupted`] when the ring's
    /// positions are impossible.
    pub fn producer(&self) -> Result<SpscProducer<T>, AttachError> {
        Ok(SpscProducer::new(self.ring.spsc_producer()?))
    }

    /// Claims the consumer role and returns the consumer end.
    ///
    /// # Errors
    ///
    /// As [`producer`](Self::producer), for the consumer role.
    pub fn consumer(&self) -> Result<SpscConsumer<T>, AttachError> {
        Ok(SpscConsumer::new(self.ring.spsc_consumer()?))
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

/// A multi-producer multi-consumer ring of `T` in named shared memory.
///
/// Any number of processes may open it and make producers and consumers; each element is
/// taken by exactly one consumer, and each producer's elements leave in order.
///
/// ```no_run
/// use gpuring::MpmcRing;
/// let ring = MpmcRing::<u64>::create("work", 1024)?;
/// let (tx, rx) = (ring.producer()?, ring.consumer()?);
/// let tx2 = tx.clone(); // another producer, e.g. for another thread
/// tx.push(5)?;
/// tx2.push(6)?;
/// assert_eq!((rx.pop()?, rx.pop()?), (5, 6));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MpmcRing<T = Descriptor> {
    ring: Arc<RingSegment>,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Pod + Send> MpmcRing<T> {
    /// Creates ring `name` with `capacity` cells (a power of two, at least 2), mode 0600,
    /// exclusively.
    ///
    /// # Errors
    ///
    /// As [`SpscRing::create`].
    pub fn create(name: &str, capacity: u64) -> Result<Self, RingError> {
        RingOptions::new(name).capacity(capacity).create_mpmc()
    }

    /// Opens ring `name`, waiting up to [`DEFAULT_OPEN_TIMEOUT`](crate::DEFAULT_OPEN_TIMEOUT)
    /// for its creator to finish.
    ///
    /// # Errors
    ///
    /// As [`SpscRing::open`].
    pub fn open(name: &str) -> Result<Self, RingError> {
        RingOptions::new(name).open_mpmc()
    }

    /// A producer end. Any number may exist.
    ///
    /// # Errors
    ///
    /// [`AttachError::TooManyParticipants`]; [`AttachError::Corrupted`] when the ring's
    /// positions are impossible.
    pub fn producer(&self) -> Result<MpmcProducer<T>, AttachError> {
        Ok(MpmcProducer::new(self.ring.mpmc_producer()?))
    }

    /// A consumer end. Any number may exist.
    ///
    /// # Errors
    ///
    /// As [`producer`](Self::producer).
    pub fn consumer(&self) -> Result<MpmcConsumer<T>, AttachError> {
        Ok(MpmcConsumer::new(self.ring.mpmc_consumer()?))
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
}
