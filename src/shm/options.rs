//! The options of creating and opening a named object, which every builder of one (rings,
//! channels) shares: one struct, and one macro that writes its setters.

use std::time::Duration;

use super::{Segment, ShmError};
use crate::layout::SegmentKind;

/// How long `open` waits, by default, for the name to appear and its creator to finish.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(1);

/// How a named segment is created and opened: the options every builder of a named object
/// (rings, channels) shares, with their setters written once by [`segment_options!`].
#[derive(Debug, Clone)]
pub(crate) struct SegmentOptions {
    /// The object name (a leading `/` is optional).
    pub(crate) name: String,
    /// How long `open` waits for the creator to finish initialising.
    pub(crate) open_timeout: Duration,
    /// `create`: replace a segment of this name that nobody has open.
    pub(crate) replace_stale: bool,
}

impl SegmentOptions {
    pub(crate) fn new(name: String) -> Self {
        Self { name, open_timeout: DEFAULT_OPEN_TIMEOUT, replace_stale: false }
    }

    /// Creates the segment (see [`Segment::create`]).
    pub(crate) fn create<E: From<ShmError>>(
        &self,
        kind: SegmentKind,
        size: usize,
        init: impl FnOnce(&Segment) -> Result<(), E>,
    ) -> Result<Segment, E> {
        Segment::create(&self.name, kind, size, self.replace_stale, init)
    }

    /// Opens the segment, which must hold one of `kinds`, waiting up to the open timeout
    /// for the name to appear and its creator to finish.
    pub(crate) fn open(&self, kinds: &[SegmentKind]) -> Result<(Segment, SegmentKind), ShmError> {
        Segment::open_checked(&self.name, kinds, self.open_timeout, true)
    }
}

/// `open_or_create` of a builder, from its three ways in: `open_now` (the name alone, not
/// waited for), `open` (waiting the open timeout for a creator to finish) and `create`;
/// `shm` finds the segment error in the builder's error type. Opens what is there; creates
/// where nothing is; and where another process created it in between (`AlreadyExists`), or
/// is still creating it (`NotInitialized`), opens that one once it is ready.
pub(crate) fn open_or_create<T, E>(
    open_now: impl FnOnce() -> Result<T, E>,
    open: impl Fn() -> Result<T, E>,
    create: impl FnOnce() -> Result<T, E>,
    shm: fn(&E) -> Option<&ShmError>,
) -> Result<T, E> {
    match open_now() {
        Err(e) => match shm(&e) {
            Some(ShmError::NotFound { .. }) => {}
            Some(ShmError::NotInitialized { .. }) => return open(),
            _ => return Err(e),
        },
        opened => return opened,
    }
    match create() {
        Err(e) if matches!(shm(&e), Some(ShmError::AlreadyExists { .. })) => open(),
        done => done,
    }
}

/// The setters of [`SegmentOptions`] on a builder with a `segment: SegmentOptions` field.
macro_rules! segment_options {
    () => {
        /// How long `open` waits for the name to exist and for its creator to finish
        /// initialising it (default
        /// [`DEFAULT_OPEN_TIMEOUT`](crate::DEFAULT_OPEN_TIMEOUT)): a consumer that may
        /// start before its producer sets this to how long it is willing to wait.
        pub fn open_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.segment.open_timeout = timeout;
            self
        }

        /// `create`: replace an object of this name that no process has open, left behind
        /// by a crash or holding elements nobody came for (they are dropped); default:
        /// fail with [`ShmError::AlreadyExists`](crate::ShmError::AlreadyExists). An
        /// object in use is never replaced.
        pub fn replace_stale(mut self, yes: bool) -> Self {
            self.segment.replace_stale = yes;
            self
        }
    };
}
pub(crate) use segment_options;
