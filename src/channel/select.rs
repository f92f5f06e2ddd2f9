//! Waiting on several sources at once: [`select`] and its [`try_select`],
//! [`select_timeout`] and [`select_deadline`] forms block the calling thread, asleep on every
//! source's wait word at once (`reactor::block_on_any`); [`select_async`] (feature `async`)
//! polls each source's async take, parked on its own word, and returns the first that has
//! something (or a final error). Sources are channel [`Receiver`]s of any backend, or ring
//! consumers: what can be selected is the sealed [`Selectable`] (in `wait::reactor`, below
//! the layers whose types implement it).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::backend::Backend;
use super::error::RecvError;
use super::message::Message;
use super::receiver::Receiver;
use crate::wait::Deadline;
use crate::wait::reactor::{self, Park, Parked, Selectable, sealed};

impl<B: Backend> sealed::Selectable for Receiver<B> {
    type Output = Result<Message<B>, RecvError<B>>;

    fn take(&mut self, deadline: Deadline) -> Option<Self::Output> {
        Receiver::take(self, deadline)
    }

    fn park(&self) -> Park {
        Receiver::park(self)
    }
}

/// Where the scans of successive selects start, so that a busy receiver early in the list
/// cannot starve the others.
static START: AtomicUsize = AtomicUsize::new(0);

/// Takes from whichever of `sources` has something first, waiting without blocking the
/// thread (feature `async`): channel receivers, or consumers of rings (see
/// [`Selectable`]). Each source parks on its own ring's wait word; a message on any wakes
/// the task, which takes it from that source alone. A source whose senders (producers)
/// have all left answers `(i, Err(..::Disconnected))` at once: take it out of the list and
/// select again. Scans start at a different source each call, so that a busy one early in
/// the list cannot starve the others.
///
/// Cancel-safe: a future dropped before it completes has taken nothing.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let _a = gpuring::internal::doc_channel("doc-select-select-async-a", 2)?;
/// # let _b = gpuring::internal::doc_channel("doc-select-select-async-b", 2)?;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use gpuring::{Channel, select_async};
/// let a = Channel::builder("doc-select-select-async-a").open()?;
/// let b = Channel::builder("doc-select-select-async-b").open()?;
/// let mut rxs = [a.receiver()?, b.receiver()?];
/// let mut live: Vec<_> = rxs.iter_mut().collect();
/// while !live.is_empty() {
///     match select_async(&mut live).await {
///         (i, Ok(msg)) => println!("camera {i}: {} bytes", msg.len()),
///         (i, Err(_)) => drop(live.remove(i)), // that camera has gone
///     }
/// }
/// # Ok(()) }
/// # futures::executor::block_on(run())
/// # }
/// ```
///
/// # Panics
///
/// If `sources` is empty.
#[cfg(feature = "async")]
pub async fn select_async<S: Selectable + ?Sized>(sources: &mut [&mut S]) -> (usize, S::Output) {
    select_with(sources, S::take, S::park).await
}

/// The select of every source, async: `take` tries one source (see
/// [`sealed::Selectable::take`]), `park` says where it parks.
async fn select_with<S: ?Sized, O>(
    sources: &mut [&mut S],
    mut take: impl FnMut(&mut S, Deadline) -> Option<O>,
    park: impl Fn(&S) -> Park,
) -> (usize, O) {
    let n = sources.len();
    let order = rotation(n);
    // The fast path: one try each, no allocation, no syscall.
    if let Some(done) = reactor::try_each(sources, order, &mut take) {
        return done;
    }
    let mut parked: Vec<Parked> = (0..n).map(|_| Parked::default()).collect();
    std::future::poll_fn(|cx| {
        for k in 0..n {
            let i = order(k);
            if let Poll::Ready(done) = parked[i].poll(cx, &mut *sources[i], &park, &mut take) {
                return Poll::Ready((i, done));
            }
        }
        Poll::Pending
    })
    .await
}

/// The select of every source, blocking this thread until `deadline` (`None`: until one
/// has something). It sleeps on all their words at once (`reactor::block_on_any`: one
/// wake-up from the publisher), or, past 127 sources or before Linux 5.16, waits as
/// [`select_with`]'s future through the waiter threads.
fn select_blocking<S: ?Sized, O>(
    sources: &mut [&mut S],
    deadline: Option<Instant>,
    mut take: impl FnMut(&mut S, Deadline) -> Option<O>,
    park: impl Fn(&S) -> Park,
) -> Option<(usize, O)> {
    let order = rotation(sources.len());
    // The fast path: one try each, no allocation, no syscall.
    if let Some(done) = reactor::try_each(sources, order, &mut take) {
        return Some(done);
    }
    match reactor::block_on_any(sources, order, deadline, &mut take, &park) {
        Ok(done) => done,
        Err(reactor::Unsupported) => block_on(select_with(sources, take, park), deadline),
    }
}

/// The order in which a select over `n` sources tries them: from a start that moves at
/// every select, so that a busy source early in the list cannot starve the others.
///
/// # Panics
///
/// If `n` is 0.
fn rotation(n: usize) -> impl Fn(usize) -> usize + Copy {
    assert!(n > 0, "select over no sources");
    let start = START.fetch_add(1, Ordering::Relaxed) % n;
    move |k| (start + k) % n
}

/// Takes from whichever of `sources` has something first, blocking the calling thread
/// until one has. The thread sleeps on every source's wait word at once (`futex_waitv`; up
/// to 127 sources, Linux ≥ 5.16; beyond, it waits as a task would, on this process's
/// waiter threads). A source whose senders (producers) have all left answers
/// `(i, Err(..::Disconnected))` at once: take it out of the list and select again. Scans
/// start at a different source each call, so that a busy one early in the list cannot
/// starve the others.
///
/// ```
/// # let _a = gpuring::internal::doc_channel("doc-select-select-a", 2)?;
/// # let _b = gpuring::internal::doc_channel("doc-select-select-b", 2)?;
/// use gpuring::{Channel, select};
/// let a = Channel::builder("doc-select-select-a").open()?;
/// let b = Channel::builder("doc-select-select-b").open()?;
/// let mut rxs = [a.receiver()?, b.receiver()?];
/// let mut live: Vec<_> = rxs.iter_mut().collect();
/// while !live.is_empty() {
///     match select(&mut live) {
///         (i, Ok(msg)) => println!("camera {i}: {} bytes", msg.len()),
///         (i, Err(_)) => drop(live.remove(i)),
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Panics
///
/// If `sources` is empty.
pub fn select<S: Selectable + ?Sized>(sources: &mut [&mut S]) -> (usize, S::Output) {
    select_blocking(sources, None, S::take, S::park).expect("no deadline")
}

/// As [`select`], without waiting: one try of each source (no syscall), `None` when none
/// had anything.
///
/// ```
/// # let _a = gpuring::internal::doc_channel("doc-select-try-select-a", 2)?;
/// # let _b = gpuring::internal::doc_channel("doc-select-try-select-b", 2)?;
/// use gpuring::{Channel, try_select};
/// let a = Channel::builder("doc-select-try-select-a").open()?;
/// let b = Channel::builder("doc-select-try-select-b").open()?;
/// let (mut a, mut b) = (a.receiver()?, b.receiver()?);
/// if let Some((i, msg)) = try_select(&mut [&mut a, &mut b]) {
///     println!("camera {i}: {} bytes", msg?.len());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Panics
///
/// If `sources` is empty.
pub fn try_select<S: Selectable + ?Sized>(sources: &mut [&mut S]) -> Option<(usize, S::Output)> {
    reactor::try_each(sources, rotation(sources.len()), &mut S::take)
}

/// As [`select`], giving up after `timeout`: `None` when no source had something (or a
/// final error) by then.
///
/// ```
/// # let _a = gpuring::internal::doc_channel("doc-select-select-timeout-a", 2)?;
/// # let _b = gpuring::internal::doc_channel("doc-select-select-timeout-b", 2)?;
/// use std::time::Duration;
/// use gpuring::{Channel, select_timeout};
/// let a = Channel::builder("doc-select-select-timeout-a").open()?;
/// let b = Channel::builder("doc-select-select-timeout-b").open()?;
/// let (mut a, mut b) = (a.receiver()?, b.receiver()?);
/// match select_timeout(&mut [&mut a, &mut b], Duration::from_millis(100)) {
///     Some((i, msg)) => println!("camera {i}: {} bytes", msg?.len()),
///     None => println!("no frame within 100 ms"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Panics
///
/// If `sources` is empty.
pub fn select_timeout<S: Selectable + ?Sized>(
    sources: &mut [&mut S],
    timeout: Duration,
) -> Option<(usize, S::Output)> {
    select_blocking(sources, Instant::now().checked_add(timeout), S::take, S::park)
}

/// As [`select`], giving up at `deadline`: one deadline for several calls.
///
/// ```
/// # let _a = gpuring::internal::doc_channel("doc-select-select-deadline-a", 2)?;
/// # let _b = gpuring::internal::doc_channel("doc-select-select-deadline-b", 2)?;
/// use std::time::{Duration, Instant};
/// use gpuring::{Channel, select_deadline};
/// let a = Channel::builder("doc-select-select-deadline-a").open()?;
/// let b = Channel::builder("doc-select-select-deadline-b").open()?;
/// let (mut a, mut b) = (a.receiver()?, b.receiver()?);
/// let until = Instant::now() + Duration::from_secs(1);
/// while let Some((i, msg)) = select_deadline(&mut [&mut a, &mut b], until) {
///     match msg {
///         Ok(msg) => println!("camera {i}: {} bytes", msg.len()),
///         Err(e) => {
///             println!("camera {i}: {e}"); // gone (a program would go on with the others)
///             break;
///         }
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Panics
///
/// If `sources` is empty.
pub fn select_deadline<S: Selectable + ?Sized>(
    sources: &mut [&mut S],
    deadline: Instant,
) -> Option<(usize, S::Output)> {
    select_blocking(sources, Some(deadline), S::take, S::park)
}

/// Wakes a thread parked in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    /// This thread's waker, made once (not per select).
    static WAKER: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
}

/// Runs `fut` on this thread until it completes or `deadline` passes (then the future is
/// dropped, which parks nothing and takes nothing).
fn block_on<F: Future>(fut: F, deadline: Option<Instant>) -> Option<F::Output> {
    let waker = WAKER.with(Waker::clone);
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        match deadline {
            None => std::thread::park(),
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}
