//! Waiting on several receivers at once (feature `async`): [`select_async`] polls each
//! receiver's async receive, parked on its own wait word, and returns the first that has a
//! message (or a final error); [`select`] and [`select_timeout`] run it on the calling
//! thread. `select_on_async` and `select_on` do the same for GPU receivers.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::backend::Host;
use super::backend::sealed::Backend;
use super::error::RecvError;
#[cfg(feature = "cuda")]
use super::gpu::Cuda;
use super::receiver::{Message, Receiver};
#[cfg(feature = "cuda")]
use crate::pool::cuda::CudaStream;
use crate::wait::{Deadline, reactor::Parked};

/// What a select returns: the index of the receiver it took from, and what it took.
pub type Selected = (usize, Result<Message, RecvError>);

/// Where the scans of successive selects start, so that a busy receiver early in the list
/// cannot starve the others.
static START: AtomicUsize = AtomicUsize::new(0);

/// Receives from whichever of `receivers` has a message first, waiting without blocking
/// the thread (feature `async`). Each receiver parks on its own ring's wait word; a
/// message on any wakes the task, which takes it from that receiver alone. A receiver whose
/// senders have all left answers `(i, Err(RecvError::Disconnected))` at once: take it out
/// of the list and select again. Scans start at a different receiver each call.
///
/// Cancel-safe: a future dropped before it completes has taken nothing.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use gpuring::{Channel, select_async};
/// let (a, b) = (Channel::builder("cams-0").open()?, Channel::builder("cams-1").open()?);
/// let mut rxs = [a.receiver()?, b.receiver()?];
/// let mut live: Vec<_> = rxs.iter_mut().collect();
/// while !live.is_empty() {
///     match select_async(&mut live).await {
///         (i, Ok(msg)) => println!("camera {i}: {} bytes", msg.len()),
///         (i, Err(_)) => drop(live.remove(i)), // that camera has gone
///     }
/// }
/// # Ok(()) }
/// ```
///
/// # Panics
///
/// If `receivers` is empty.
pub async fn select_async(receivers: &mut [&mut Receiver<Host>]) -> Selected {
    select_with(receivers, Receiver::recv_until).await
}

/// As [`select_async`], for the receivers of GPU channels: the message taken is received
/// onto `stream` (as [`Receiver::recv_on`]).
///
/// # Panics
///
/// If `receivers` is empty.
#[cfg(feature = "cuda")]
pub async fn select_on_async(
    receivers: &mut [&mut Receiver<Cuda>],
    stream: &Arc<CudaStream>,
) -> SelectedOn {
    select_with(receivers, |r, d| r.recv_on_until(stream, d)).await
}

/// What a select over GPU receivers returns (see [`Selected`]).
#[cfg(feature = "cuda")]
pub type SelectedOn = (usize, Result<Message<Cuda>, RecvError>);

/// The select of every backend: `recv` is the receive form, given its deadline.
async fn select_with<B: Backend>(
    receivers: &mut [&mut Receiver<B>],
    recv: impl Fn(&Receiver<B>, Deadline) -> Result<Message<B>, RecvError>,
) -> (usize, Result<Message<B>, RecvError>) {
    assert!(!receivers.is_empty(), "select over no receivers");
    let n = receivers.len();
    let start = START.fetch_add(1, Ordering::Relaxed) % n;
    // The fast path: one try each, no allocation, no syscall.
    for k in 0..n {
        let i = (start + k) % n;
        match recv(receivers[i], Deadline::Now) {
            Err(RecvError::Empty) => {}
            done => return (i, done),
        }
    }
    let mut parked: Vec<Parked> = (0..n).map(|_| Parked::default()).collect();
    std::future::poll_fn(|cx| {
        for k in 0..n {
            let i = (start + k) % n;
            let rx: &mut Receiver<B> = receivers[i];
            if let Poll::Ready(done) = rx.poll_recv(cx, &mut parked[i], &recv) {
                return Poll::Ready((i, done));
            }
        }
        Poll::Pending
    })
    .await
}

/// Receives from whichever of `receivers` has a message first, blocking the calling thread
/// until one has (feature `async`: the thread waits as a task would, on this process's
/// waiter thread). As [`select_async`]: `(i, Err(RecvError::Disconnected))` when receiver
/// `i`'s senders have all left.
///
/// ```no_run
/// use gpuring::{Channel, select};
/// let (a, b) = (Channel::builder("cams-0").open()?, Channel::builder("cams-1").open()?);
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
/// If `receivers` is empty.
pub fn select(receivers: &mut [&mut Receiver<Host>]) -> Selected {
    block_on(select_async(receivers), None).expect("no deadline")
}

/// As [`select`], for the receivers of GPU channels, receiving onto `stream`.
///
/// # Panics
///
/// If `receivers` is empty.
#[cfg(feature = "cuda")]
pub fn select_on(receivers: &mut [&mut Receiver<Cuda>], stream: &Arc<CudaStream>) -> SelectedOn {
    block_on(select_on_async(receivers, stream), None).expect("no deadline")
}

/// As [`select`], giving up after `timeout`: `None` when no receiver had a message (or a
/// final error) by then.
///
/// # Panics
///
/// If `receivers` is empty.
pub fn select_timeout(
    receivers: &mut [&mut Receiver<Host>],
    timeout: Duration,
) -> Option<Selected> {
    block_on(select_async(receivers), Instant::now().checked_add(timeout))
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
