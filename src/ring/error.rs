//! What a push or a pop can run into: one small error per operation, as `try_x` and the
//! blocking forms report it. A value that could not be pushed is handed back.

use crate::layout::Corrupted;
use crate::liveness::Blocked;

/// Why [`try_push`](crate::SpscProducer::try_push) did not push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryPushError<T> {
    /// The ring is full; here is the value back.
    Full(T),
    /// The ring is full and every consumer that attached has left (named rings: cleanly;
    /// seen at once); here is the value back.
    Disconnected(T),
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
}

/// Why a blocking [`push`](crate::SpscProducer::push) did not push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PushError<T> {
    /// The deadline passed with the ring still full; here is the value back.
    Timeout(T),
    /// The ring is full and every consumer that attached to it has left cleanly (named
    /// rings; seen at once); here is the value back.
    Disconnected(T),
    /// The ring is full and every consumer that attached to it has died (named rings:
    /// their liveness locks are gone); here is the value back.
    PeerDead(T),
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
}

/// Why [`try_pop`](crate::SpscConsumer::try_pop) returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryPopError {
    /// The ring is empty.
    Empty,
    /// The ring is empty and every producer that attached to it has left cleanly (named
    /// rings; seen at once). Not for ever: a producer that attaches later may push again.
    Disconnected,
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
}

/// Why a blocking [`pop`](crate::SpscConsumer::pop) returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PopError {
    /// The deadline passed with the ring still empty.
    Timeout,
    /// Every producer that attached to the ring has left cleanly and everything they
    /// published has been taken (named rings; seen at once). Not for ever: a producer that
    /// attaches later may push again.
    Disconnected,
    /// Every producer that attached to the ring has died, and everything they published
    /// has been taken (named rings: their liveness locks are gone).
    PeerDead,
    /// The ring's shared state is impossible.
    Corrupted(Corrupted),
}

macro_rules! display_errors {
    ($($ty:ty => |$s:ident, $f:ident| $body:expr;)*) => {$(
        impl core::fmt::Display for $ty {
            fn fmt(&self, $f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                let $s = self;
                $body
            }
        }
    )*};
}

display_errors! {
    TryPopError => |s, f| match s {
        TryPopError::Empty => f.write_str("ring is empty"),
        TryPopError::Disconnected => f.write_str("ring is empty and every producer has left"),
        TryPopError::Corrupted(c) => c.fmt(f),
    };
    PopError => |s, f| match s {
        PopError::Timeout => f.write_str("timed out waiting for a message"),
        PopError::Disconnected => f.write_str("every producer of the ring has left (all it published was taken)"),
        PopError::PeerDead => f.write_str("every producer of the ring has died (all it published was taken)"),
        PopError::Corrupted(c) => c.fmt(f),
    };
}

impl<T> core::fmt::Display for TryPushError<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TryPushError::Full(_) => f.write_str("ring is full"),
            TryPushError::Disconnected(_) => {
                f.write_str("the ring is full and every consumer has left")
            }
            TryPushError::Corrupted(c) => c.fmt(f),
        }
    }
}

impl<T> core::fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PushError::Timeout(_) => f.write_str("timed out waiting for room in the ring"),
            PushError::Disconnected(_) => {
                f.write_str("the ring is full and every consumer has left")
            }
            PushError::PeerDead(_) => f.write_str("the ring is full and every consumer has died"),
            PushError::Corrupted(c) => c.fmt(f),
        }
    }
}

impl<T: core::fmt::Debug> std::error::Error for TryPushError<T> {}
impl<T: core::fmt::Debug> std::error::Error for PushError<T> {}
impl std::error::Error for TryPopError {}
impl std::error::Error for PopError {}

impl<T> PushError<T> {
    /// The same error, carrying `f` of what it carries.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> PushError<U> {
        match self {
            PushError::Timeout(v) => PushError::Timeout(f(v)),
            PushError::Disconnected(v) => PushError::Disconnected(f(v)),
            PushError::PeerDead(v) => PushError::PeerDead(f(v)),
            PushError::Corrupted(c) => PushError::Corrupted(c),
        }
    }

    pub(crate) fn from_blocked(blocked: Blocked, value: T) -> Self {
        match blocked {
            Blocked::Timeout => PushError::Timeout(value),
            Blocked::Disconnected => PushError::Disconnected(value),
            Blocked::PeerDead => PushError::PeerDead(value),
            Blocked::Corrupted(c) => PushError::Corrupted(c),
        }
    }
}

impl From<Blocked> for PopError {
    fn from(blocked: Blocked) -> Self {
        match blocked {
            Blocked::Timeout => PopError::Timeout,
            Blocked::Disconnected => PopError::Disconnected,
            Blocked::PeerDead => PopError::PeerDead,
            Blocked::Corrupted(c) => PopError::Corrupted(c),
        }
    }
}
