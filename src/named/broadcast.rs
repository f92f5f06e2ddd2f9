//! The endpoints of a [`BroadcastRing`](crate::BroadcastRing): one producer, and readers
//! that each read every element published after they joined (`ring::broadcast`).

use bytemuck::Pod;

use crate::layout::SpscCell;
use crate::ring::{
    PushError, PushTimeoutError, ReadError, ReadTimeoutError, ShmStorage, TryPushError,
    TryReadError, broadcast,
};
use crate::wait::{WaitPolicy, blocking};
#[cfg(feature = "async")]
use crate::{liveness::Role, wait::reactor::wait};

/// The producer end of a [`BroadcastRing`](crate::BroadcastRing): the one process that
/// publishes. Every reader attached when an element is published reads it; the slowest
/// one holds the producer back (a blocking push waits for it; nothing is lost), and a
/// reader that died stops holding it back at the next liveness tick of that wait. With
/// no reader, an element goes nowhere.
///
/// ```no_run
/// use gpuring::BroadcastRing;
/// let ring = BroadcastRing::<u64>::builder("steps").capacity(64).create()?;
/// let mut tx = ring.producer()?;
/// tx.push(17)?; // every reader attached now reads 17
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BroadcastProducer<T> {
    pub(super) inner: broadcast::Producer<T, ShmStorage<SpscCell<T>>>,
}

impl<T: Pod + Send> BroadcastProducer<T> {
    /// Publishes `value` if every reader has room for it; never blocks.
    ///
    /// # Errors
    ///
    /// [`TryPushError::Full`] with the value back while the slowest reader is a whole ring
    /// behind; [`TryPushError::Corrupted`].
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), TryPushError<T>> {
        self.inner.try_push(value)
    }

    blocking! {
        /// Publishes `value`, waiting for the slowest reader as the [`WaitPolicy`] says.
        ///
        /// # Errors
        ///
        /// [`PushError::PeerDead`] with the value back when the ring stays full and every
        /// reader that held it back has died but not yet finished dying (their places
        /// cannot be taken yet); [`PushError::Corrupted`].
        pub fn push -> PushError<T>, push_timeout, push_deadline -> PushTimeoutError<T>;
            (&mut self, value: T) -> () => inner.push_until;
    }

    /// Publishes `value`, waiting for the slowest reader without blocking the thread
    /// (feature `async`): the task parks on the same wait word as [`push`](Self::push),
    /// and this process's waiter thread wakes it. Works under any executor. Returns at
    /// once, with no syscall, when there is room.
    ///
    /// Cancel-safe: a future dropped before it completes has published nothing.
    ///
    /// # Errors
    ///
    /// As [`push`](Self::push).
    #[cfg(feature = "async")]
    pub async fn push_async(&mut self, value: T) -> Result<(), PushError<T>> {
        let mut end = &mut self.inner;
        wait(
            &mut end,
            |e| e.storage().park(Role::Producer),
            |e, d| match e.push_until(value, d) {
                Err(PushTimeoutError::Timeout(_)) => None,
                done => Some(done.map_err(PushError::from_timeout)),
            },
        )
        .await
    }

    /// Readers attached now (a snapshot).
    pub fn readers(&self) -> usize {
        self.inner.readers()
    }

    /// Sets how blocking pushes wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.inner.set_wait_policy(policy);
    }

    /// Number of cells.
    pub fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}

/// A reader of a [`BroadcastRing`](crate::BroadcastRing): reads every element published
/// from the moment it attached, in order, exactly once; other readers read the same
/// elements. Dropping it stops it holding the producer back.
///
/// ```no_run
/// use gpuring::BroadcastRing;
/// let ring = BroadcastRing::<u64>::builder("steps").open()?;
/// let mut rx = ring.reader()?;
/// let step = rx.read()?; // the next element published
/// # let _ = step;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BroadcastReader<T> {
    pub(super) inner: broadcast::Reader<T, ShmStorage<SpscCell<T>>>,
}

impl<T: Pod + Send> BroadcastReader<T> {
    /// The next element, if one was published since the last; never blocks.
    ///
    /// # Errors
    ///
    /// [`TryReadError::Empty`]; [`TryReadError::Lagged`] (a lagging ring: the producer
    /// overwrote that many before this reader read them; the next read goes on with the
    /// oldest still there); [`TryReadError::Corrupted`] when the ring's positions are
    /// impossible.
    #[inline]
    pub fn try_read(&mut self) -> Result<T, TryReadError> {
        self.inner.try_read()
    }

    blocking! {
        /// The next element, waiting for one as the [`WaitPolicy`] says.
        ///
        /// # Errors
        ///
        /// [`ReadError::Lagged`] (a lagging ring: see [`try_read`](Self::try_read));
        /// [`ReadError::Disconnected`] once the producer has left and this reader has read
        /// all it published ([`ReadError::PeerDead`] when it died);
        /// [`ReadError::Corrupted`].
        pub fn read -> ReadError, read_timeout, read_deadline -> ReadTimeoutError;
            (&mut self) -> T => inner.read_until;
    }

    /// The next element, waiting for it without blocking the thread (feature `async`):
    /// the task parks on the same wait word as [`read`](Self::read), and this process's
    /// waiter thread wakes it. Works under any executor. Returns at once, with no
    /// syscall, when an element is there.
    ///
    /// Cancel-safe: a future dropped before it completes has read nothing.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let ring = gpuring::BroadcastRing::<u64>::builder("steps").open()?;
    /// let mut rx = ring.reader()?;
    /// let step = rx.read_async().await?;
    /// # let _ = step;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    #[cfg(feature = "async")]
    pub async fn read_async(&mut self) -> Result<T, ReadError> {
        let mut end = &mut self.inner;
        wait(
            &mut end,
            |e| e.storage().park(Role::Consumer),
            |e, d| match e.read_until(d) {
                Err(ReadTimeoutError::Timeout) => None,
                done => Some(done.map_err(ReadError::from_timeout)),
            },
        )
        .await
    }

    /// Elements published that this reader has not read yet (a snapshot).
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether this reader has read everything published (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Sets how blocking reads wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.inner.set_wait_policy(policy);
    }
}
