//! The options of creating and opening a named object, which every builder of one (rings,
//! channels) shares: one struct, and one macro that writes its setters.

use std::time::Duration;

use super::{Segment, ShmError};
use crate::layout::SegmentKind;

/// How long `open` waits for a creator to finish initialising, by default.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(1);

/// How a named segment is created and opened: the options every builder of a named object
/// (rings, channels) shares, with their setters written once by [`segment_options!`].
#[derive(Debug, Clone)]
pub(crate) struct SegmentOptions {
    /// The object name (a leading `/` is optional).
    pub(crate) name: String,
    /// How long `open` waits for the creator to finish initialising.
    pub(crate) open_timeout: Duration,
    /// `create`: replace a segment of this name whose creator is dead.
    pub(crate) replace_stale: bool,
    /// `open`: attach to a segment whose creator is dead.
    pub(crate) allow_dead_owner: bool,
}

impl SegmentOptions {
    pub(crate) fn new(name: String) -> Self {
        Self {
            name,
            open_timeout: DEFAULT_OPEN_TIMEOUT,
            replace_stale: false,
            allow_dead_owner: false,
        }
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

    /// Opens the segment, which must hold one of `kinds`, and refuses one whose creator is
    /// dead unless `allow_dead_owner` says otherwise.
    pub(crate) fn open(&self, kinds: &[SegmentKind]) -> Result<(Segment, SegmentKind), ShmError> {
        let (segment, kind) = Segment::open_checked(&self.name, kinds, self.open_timeout)?;
        if self.allow_dead_owner {
            Ok((segment, kind))
        } else {
            Ok((segment.require_live_creator()?, kind))
        }
    }
}

/// The setters of [`SegmentOptions`] on a builder with a `segment: SegmentOptions` field.
macro_rules! segment_options {
    () => {
        /// How long `open` waits for the creator to finish initialising the segment
        /// (default [`DEFAULT_OPEN_TIMEOUT`](crate::DEFAULT_OPEN_TIMEOUT)).
        pub fn open_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.segment.open_timeout = timeout;
            self
        }

        /// `create`: replace an object of this name whose creator has died (default: fail
        /// with [`ShmError::AlreadyExists`](crate::ShmError::AlreadyExists)). A live
        /// creator's object is never replaced.
        pub fn replace_stale(mut self, yes: bool) -> Self {
            self.segment.replace_stale = yes;
            self
        }

        /// `open`: attach to an object whose creator has died, e.g. to drain what was sent
        /// before the crash (default: fail with
        /// [`ShmError::OwnerDead`](crate::ShmError::OwnerDead)).
        pub fn allow_dead_owner(mut self, yes: bool) -> Self {
            self.segment.allow_dead_owner = yes;
            self
        }
    };
}
pub(crate) use segment_options;
