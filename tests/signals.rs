//! `gpuring::interruptible`: a signal handler that runs on a thread asleep in a wait with a
//! deadline ends that wait (as Python's Ctrl-C needs); outside it, or for a wait without a
//! deadline, a signal ends nothing.
#![cfg(not(loom))]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::unique_name;
use gpuring::{Channel, DType, RecvTimeoutError, TensorMeta, interruptible};

/// Signals the handler saw (it does nothing else, as CPython's sets a flag).
static HANDLED: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    // Relaxed: a count the test reads after the waits it ended.
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

/// A `SIGUSR1` handler installed without `SA_RESTART` (as CPython installs its own).
fn install_handler() {
    // SAFETY: a zeroed `sigaction` is a valid value to fill in; the handler is an
    // async-signal-safe function of the right signature for a handler without SA_SIGINFO.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()), 0);
    }
}

/// Runs `wait` on a thread of its own, sending that thread `SIGUSR1` every 50 ms from
/// 200 ms on until it returns; returns what it returned and how long it took.
fn signalled<R: Send + 'static>(wait: impl FnOnce() -> R + Send + 'static) -> (R, Duration) {
    install_handler();
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let waiter = std::thread::spawn(move || {
        let r = wait();
        tx.send(()).unwrap();
        r
    });
    std::thread::sleep(Duration::from_millis(200));
    let thread = std::os::unix::thread::JoinHandleExt::as_pthread_t(&waiter);
    while rx.recv_timeout(Duration::from_millis(50)).is_err() {
        // SAFETY: the thread has not been joined (it signals before it returns and this
        // loop ends once it has), so its pthread_t names a live thread.
        assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
    }
    let r = waiter.join().unwrap();
    (r, start.elapsed())
}

fn meta() -> TensorMeta {
    TensorMeta::contiguous(DType::U8, &[8]).unwrap()
}

#[test]
fn a_signal_ends_a_wait_with_a_deadline_inside_interruptible_only() {
    let name = unique_name("signals");
    let ch = Channel::builder(&name).capacity(4).slots(2, 64).create().unwrap();
    let tx = ch.sender().unwrap();
    let ch2 = Channel::builder(&name).open().unwrap();

    // Inside: the first signal that finds the thread asleep ends its wait, at once (not at
    // its next liveness tick, nor at its 20 s deadline).
    let rx = ch2.receiver().unwrap();
    let ((got, rx), took) = signalled(move || {
        let got = interruptible(|| rx.recv_timeout(Duration::from_secs(20)).map(drop));
        (got, rx)
    });
    assert!(matches!(got, Err(RecvTimeoutError::Timeout)), "{got:?}");
    assert!(took < Duration::from_secs(2), "the signal did not end the wait: {took:?}");
    assert!(HANDLED.load(Ordering::Relaxed) >= 1);

    // Nothing was lost: what is sent now is received.
    tx.send(tx.acquire().unwrap(), meta()).unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());

    // Outside: the signals (every 50 ms) end nothing; the wait ends at its deadline.
    let ((got, rx), took) = signalled(move || {
        let got = rx.recv_timeout(Duration::from_millis(700)).map(drop);
        (got, rx)
    });
    assert!(matches!(got, Err(RecvTimeoutError::Timeout)), "{got:?}");
    assert!(took >= Duration::from_millis(700), "ended before its deadline: {took:?}");

    // Inside, a wait with no deadline sleeps on through the signals, to the message sent
    // after them.
    let sent = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        tx.send(tx.acquire().unwrap(), meta()).unwrap();
        tx
    });
    let (got, took) = signalled(move || interruptible(|| rx.recv().map(drop)));
    assert!(got.is_ok(), "{got:?}");
    assert!(took >= Duration::from_millis(600), "{took:?}");
    drop(sent.join().unwrap());
}
