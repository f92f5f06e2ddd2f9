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

wait_errors! {
    generics [T] [T] [T];
    derive(Debug, Clone, Copy, PartialEq, Eq);
    /// Why a blocking [`push`](crate::SpscProducer::push) (and `push_async`) did not push.
    base PushError;
    /// Why [`push_timeout`](crate::SpscProducer::push_timeout) (and `push_deadline`) did
    /// not push.
    timeout PushTimeoutError {
        /// The deadline passed with the ring still full; here is the value back.
        Timeout(value: T) => f.write_str("timed out waiting for room in the ring")
    }
    fmt |f|;
    variants {
        /// The ring is full and every consumer that attached to it has left cleanly (named
        /// rings; seen at once); here is the value back.
        Disconnected(value: T) => f.write_str("the ring is full and every consumer has left");
        /// The ring is full and every consumer that attached to it has died (named rings:
        /// their liveness locks are gone); here is the value back.
        PeerDead(value: T) => f.write_str("the ring is full and every consumer has died");
        /// The ring's shared state is impossible.
        Corrupted(c: Corrupted) => c.fmt(f);
    }
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

wait_errors! {
    generics [] [] [];
    derive(Debug, Clone, Copy, PartialEq, Eq);
    /// Why a blocking [`pop`](crate::SpscConsumer::pop) (and `pop_async`, `iter`) returned
    /// nothing.
    base PopError;
    /// Why [`pop_timeout`](crate::SpscConsumer::pop_timeout) (and `pop_deadline`) returned
    /// nothing.
    timeout PopTimeoutError {
        /// The deadline passed with the ring still empty.
        Timeout => f.write_str("timed out waiting for an element")
    }
    fmt |f|;
    variants {
        /// Every producer that attached to the ring has left cleanly and everything they
        /// published has been taken (named rings; seen at once). Not for ever: a producer
        /// that attaches later may push again.
        Disconnected => f.write_str("every producer of the ring has left (all it published was taken)");
        /// Every producer that attached to the ring has died, and everything they
        /// published has been taken (named rings: their liveness locks are gone).
        PeerDead => f.write_str("every producer of the ring has died (all it published was taken)");
        /// The ring's shared state is impossible.
        Corrupted(c: Corrupted) => c.fmt(f);
    }
}

wait_errors! {
    generics [] [] [];
    derive(Debug, Clone, Copy, PartialEq, Eq);
    /// Why a blocking [`read`](crate::BroadcastReader::read) (and `read_async`) of a
    /// broadcast ring returned nothing.
    base ReadError;
    /// Why [`read_timeout`](crate::BroadcastReader::read_timeout) (and `read_deadline`)
    /// returned nothing.
    timeout ReadTimeoutError {
        /// The deadline passed with nothing new to read.
        Timeout => f.write_str("timed out waiting for an element")
    }
    /// Why [`try_read`](crate::BroadcastReader::try_read) returned nothing.
    try TryReadError {
        /// This reader has read everything published.
        Empty => f.write_str("nothing new to read")
    }
    fmt |f|;
    variants {
        /// A lagging ring (`.lagging(true)`): the producer, which never waits, overwrote
        /// this many elements before this reader read them. The reader goes on with the
        /// oldest element still there: the next read returns it.
        Lagged(missed: u64) => write!(f, "the reader fell behind and missed {missed} elements");
        /// The producer has left cleanly and this reader has read everything it
        /// published. Not for ever: a producer that attaches later may publish again.
        Disconnected => f.write_str("the producer has left (all it published was read)");
        /// The producer has died, and this reader has read everything it published.
        PeerDead => f.write_str("the producer has died (all it published was read)");
        /// The ring's shared state is impossible.
        Corrupted(c: Corrupted) => c.fmt(f);
    }
}

impl From<Blocked> for ReadTimeoutError {
    fn from(blocked: Blocked) -> Self {
        match blocked {
            Blocked::Timeout => ReadTimeoutError::Timeout,
            Blocked::Disconnected => ReadTimeoutError::Disconnected,
            Blocked::PeerDead => ReadTimeoutError::PeerDead,
            Blocked::Corrupted(c) => ReadTimeoutError::Corrupted(c),
        }
    }
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

impl<T: core::fmt::Debug> std::error::Error for TryPushError<T> {}
impl std::error::Error for TryPopError {}

impl<T> PushError<T> {
    /// The same error, carrying `f` of what it carries.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> PushError<U> {
        match self {
            PushError::Disconnected(v) => PushError::Disconnected(f(v)),
            PushError::PeerDead(v) => PushError::PeerDead(f(v)),
            PushError::Corrupted(c) => PushError::Corrupted(c),
        }
    }
}

impl<T> PushTimeoutError<T> {
    /// The same error, carrying `f` of what it carries.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> PushTimeoutError<U> {
        match self {
            PushTimeoutError::Timeout(v) => PushTimeoutError::Timeout(f(v)),
            PushTimeoutError::Disconnected(v) => PushTimeoutError::Disconnected(f(v)),
            PushTimeoutError::PeerDead(v) => PushTimeoutError::PeerDead(f(v)),
            PushTimeoutError::Corrupted(c) => PushTimeoutError::Corrupted(c),
        }
    }

    pub(crate) fn from_blocked(blocked: Blocked, value: T) -> Self {
        match blocked {
            Blocked::Timeout => PushTimeoutError::Timeout(value),
            Blocked::Disconnected => PushTimeoutError::Disconnected(value),
            Blocked::PeerDead => PushTimeoutError::PeerDead(value),
            Blocked::Corrupted(c) => PushTimeoutError::Corrupted(c),
        }
    }
}

impl From<Blocked> for PopTimeoutError {
    fn from(blocked: Blocked) -> Self {
        match blocked {
            Blocked::Timeout => PopTimeoutError::Timeout,
            Blocked::Disconnected => PopTimeoutError::Disconnected,
            Blocked::PeerDead => PopTimeoutError::PeerDead,
            Blocked::Corrupted(c) => PopTimeoutError::Corrupted(c),
        }
    }
}
