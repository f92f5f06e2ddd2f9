//! Unit tests of both algorithms over heap storage (they run under Miri too: counts shrink
//! there).

use std::collections::HashSet;
use std::time::Duration;

use super::mpmc::MAX_RUN;
use super::{
    Heap, PopTimeoutError, PushTimeoutError, Storage, TryPopError, TryPushError, mpmc, spsc,
};
use crate::layout::{Corrupted, MpmcCell, SpscCell};
use crate::sync::Ordering;
use crate::wait::Deadline;

/// A deadline `ms` milliseconds from now.
fn ms(ms: u64) -> Deadline {
    Deadline::after(Duration::from_millis(ms))
}

// ---------------------------------------------------------------------------------------
// SPSC

/// Pushes 0, 1, 2, ... through a ring of 4 cells, many laps, draining after every
/// `drain_every` pushes (when that fills the ring, a push more is refused with the value
/// back): every value comes out once, in order, and the ring ends empty.
fn fifo_many_laps(
    drain_every: u64,
    mut push: impl FnMut(u64) -> Result<(), TryPushError<u64>>,
    mut pop: impl FnMut() -> Result<u64, TryPopError>,
) {
    let n = if cfg!(miri) { 50 } else { 10_000 };
    let mut next = 0;
    let mut drain = |next: &mut u64| {
        while let Ok(v) = pop() {
            assert_eq!(v, *next);
            *next += 1;
        }
    };
    for i in 0..n {
        push(i).unwrap();
        if i % drain_every == drain_every - 1 {
            if drain_every == 4 {
                assert_eq!(push(99), Err(TryPushError::Full(99)));
            }
            drain(&mut next);
        }
    }
    drain(&mut next);
    assert_eq!(next, n);
    assert_eq!(pop(), Err(TryPopError::Empty));
}

#[test]
fn spsc_fifo_through_many_laps() {
    let (mut tx, mut rx) = spsc::with_capacity::<u64>(4);
    fifo_many_laps(3, |v| tx.try_push(v), || rx.try_pop());
    let (mut tx, mut rx) = spsc::with_capacity::<u64>(4);
    fifo_many_laps(4, |v| tx.try_push(v), || rx.try_pop());
}

#[test]
fn spsc_slices_fifo_across_laps_and_partial_batches() {
    let (mut tx, mut rx) = spsc::with_capacity::<u64>(8);
    let rounds = if cfg!(miri) { 20 } else { 2_000 };
    let (mut next_in, mut next_out) = (0u64, 0u64);
    let mut out = [0u64; 5];
    for r in 0..rounds {
        let batch: Vec<u64> = (next_in..next_in + (r % 7) + 1).collect();
        let n = tx.try_push_slice(&batch).unwrap();
        assert!(n <= batch.len());
        next_in += n as u64;
        let got = rx.try_pop_into(&mut out[..(r as usize % 5) + 1]).unwrap();
        for &v in &out[..got] {
            assert_eq!(v, next_out);
            next_out += 1;
        }
    }
    loop {
        let got = rx.try_pop_into(&mut out).unwrap();
        if got == 0 {
            break;
        }
        for &v in &out[..got] {
            assert_eq!(v, next_out);
            next_out += 1;
        }
    }
    assert_eq!(next_out, next_in);
    // Full: nothing pushed; empty output: nothing popped.
    assert_eq!(tx.try_push_slice(&[0; 8]), Ok(8));
    assert_eq!(tx.try_push_slice(&[9]), Ok(0));
    assert_eq!(rx.try_pop_into(&mut []), Ok(0));
    assert_eq!(rx.pop_into_until(&mut out, ms(1)), Ok(5));
    tx.push_slice_until(&[1, 2, 3, 4, 5], Deadline::Never).unwrap();
    assert_eq!(rx.pop_into_until(&mut [0; 16], Deadline::Never), Ok(8));
    assert_eq!(rx.pop_into_until(&mut out, ms(1)), Err(PopTimeoutError::Timeout));
}

#[test]
fn spsc_pop_then_runs_before_the_element_leaves_the_ring() {
    let (mut tx, mut rx) = spsc::with_capacity::<u32>(4);
    tx.try_push(1).unwrap();
    tx.try_push(2).unwrap();
    let seen = rx.pop_then_until(Deadline::Now, |v| {
        // Still queued while `then` runs: a receiver that dies here leaves it.
        assert_eq!(tx.len(), Some(2));
        assert!(tx.any_queued(|&x| x == v));
        v * 10
    });
    assert_eq!(seen, Ok(10));
    assert!(!tx.any_queued(|&x| x == 1), "gone once `then` returned");
    assert!(tx.any_queued(|&x| x == 2));
    assert_eq!(rx.pop_then_until(ms(5), |v| v + 1), Ok(3));
    assert_eq!(rx.pop_then_until(ms(5), |v| v), Err(PopTimeoutError::Timeout));
    assert_eq!(
        rx.pop_then_until(Deadline::Now, |_| unreachable!("not called when empty")),
        Err::<(), _>(PopTimeoutError::Timeout)
    );
}

#[test]
fn spsc_full_gives_the_value_back_and_empty_is_empty() {
    let (mut tx, mut rx) = spsc::with_capacity::<u32>(2);
    assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
    tx.try_push(1).unwrap();
    tx.try_push(2).unwrap();
    assert_eq!(tx.try_push(3), Err(TryPushError::Full(3)));
    assert_eq!(tx.len(), Some(2));
    assert_eq!(rx.try_pop(), Ok(1));
    tx.try_push(3).unwrap();
    assert_eq!((rx.try_pop(), rx.try_pop()), (Ok(2), Ok(3)));
    assert!(rx.is_empty());
}

#[test]
fn spsc_timeouts_hand_the_value_back() {
    let (mut tx, mut rx) = spsc::with_capacity::<u8>(1);
    tx.try_push(1).unwrap();
    assert_eq!(tx.push_until(2, ms(5)), Err(PushTimeoutError::Timeout(2)));
    assert_eq!(rx.pop_until(ms(5)), Ok(1));
    assert_eq!(rx.pop_until(ms(5)), Err(PopTimeoutError::Timeout));
}

#[test]
fn spsc_scribbled_positions_are_corrupted_not_a_panic() {
    let storage = Heap::new(4, |_| SpscCell::<u64>::new());
    storage.control().tail.store(100, Ordering::Relaxed);
    // SAFETY: sole producer/consumer of a fresh storage.
    unsafe {
        assert!(spsc::Producer::<u64, _>::new(storage.clone()).is_err());
        assert!(spsc::Consumer::<u64, _>::new(storage.clone()).is_err());
    }
    storage.control().tail.store(0, Ordering::Relaxed);
    // SAFETY: as above.
    let (mut tx, mut rx) = unsafe {
        (
            spsc::Producer::<u64, _>::new(storage.clone()).unwrap(),
            spsc::Consumer::<u64, _>::new(storage.clone()).unwrap(),
        )
    };
    for i in 0..4 {
        tx.try_push(i).unwrap();
    }
    // A hostile peer moves head backwards past what is possible.
    storage.control().head.store(u64::MAX - 5, Ordering::Relaxed);
    assert!(matches!(tx.try_push(9), Err(TryPushError::Corrupted(_))));
    // ... and the tail far ahead of the consumer.
    rx.try_pop().unwrap();
    rx.try_pop().unwrap();
    rx.try_pop().unwrap();
    rx.try_pop().unwrap();
    storage.control().tail.store(1 << 40, Ordering::Relaxed);
    assert!(matches!(rx.try_pop(), Err(TryPopError::Corrupted(_))));
    assert!(matches!(rx.pop_until(ms(0)), Err(PopTimeoutError::Corrupted(_))));
}

#[test]
fn spsc_threads_hand_off_in_order_with_blocking_calls() {
    let (mut tx, mut rx) = spsc::with_capacity::<u64>(8);
    let n: u64 = if cfg!(miri) { 200 } else { 200_000 };
    let t = std::thread::spawn(move || {
        for i in 0..n {
            tx.push_until(i, Deadline::Never).unwrap();
        }
    });
    for i in 0..n {
        assert_eq!(rx.pop_until(Deadline::Never).unwrap(), i);
    }
    t.join().unwrap();
}

// ---------------------------------------------------------------------------------------
// MPMC

/// Found by the `ring_model` fuzz target: with one cell, a push into the full ring saw
/// the stamp of "free for the next position" and overwrote the unread element.
#[test]
fn mpmc_one_cell_is_refused_and_two_cells_tell_full_from_empty() {
    let one = Heap::new(1, |i| MpmcCell::<u64>::new(i as u64));
    assert!(matches!(mpmc::Producer::<u64, _>::new(one.clone()), Err(Corrupted { .. })));
    assert!(matches!(mpmc::Consumer::<u64, _>::new(one), Err(Corrupted { .. })));
    assert!(std::panic::catch_unwind(|| mpmc::with_capacity::<u64>(1)).is_err());
    let (tx, rx) = mpmc::with_capacity::<u64>(2);
    for lap in 0..4 {
        tx.try_push(lap * 2).unwrap();
        tx.try_push(lap * 2 + 1).unwrap();
        assert_eq!(tx.try_push(99), Err(TryPushError::Full(99)));
        assert_eq!(rx.try_pop(), Ok(lap * 2));
        assert_eq!(rx.try_pop(), Ok(lap * 2 + 1));
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
    }
}

#[test]
fn mpmc_fifo_single_thread_many_laps() {
    let (tx, rx) = mpmc::with_capacity::<u64>(4);
    fifo_many_laps(4, |v| tx.try_push(v), || rx.try_pop());
    assert_eq!((tx.len(), rx.is_empty()), (Some(0), true));
    tx.try_push_slice(&[1, 2, 3]).unwrap();
    assert_eq!((tx.len(), rx.len()), (Some(3), Some(3)), "queued, seen from both ends");
}

#[test]
fn mpmc_threads_exactly_once_and_per_producer_order() {
    let (tx, rx) = mpmc::with_capacity::<u64>(16);
    let producers = 3u64;
    let per: u64 = if cfg!(miri) { 40 } else { 50_000 };
    let mut handles = Vec::new();
    for p in 0..producers {
        let tx = tx.clone();
        handles.push(std::thread::spawn(move || {
            for i in 0..per {
                tx.push_until((p << 32) | i, Deadline::Never).unwrap();
            }
        }));
    }
    drop(tx);
    let total = producers * per;
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let (rx, taken) = (rx.clone(), taken.clone());
        consumers.push(std::thread::spawn(move || {
            let mut got = Vec::new();
            while taken.load(std::sync::atomic::Ordering::Relaxed) < total {
                if let Ok(v) = rx.pop_until(ms(10)) {
                    taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    got.push(v);
                }
            }
            got
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let mut all = HashSet::new();
    for c in consumers {
        let got = c.join().unwrap();
        let mut last = [None::<u64>; 3];
        for v in got {
            let (p, i) = ((v >> 32) as usize, v & 0xffff_ffff);
            // Within one consumer, a producer's elements come in order.
            assert!(last[p].is_none_or(|l| l < i), "producer {p}: {i} after {last:?}");
            last[p] = Some(i);
            assert!(all.insert(v), "duplicate {v:#x}");
        }
    }
    assert_eq!(all.len() as u64, producers * per);
}

/// Slices: producers push runs of 1 to 7 (blocking `push_slice`) beside a producer
/// pushing one at a time; consumers take runs into buffers of 1 to 5 (and some single
/// pops). Every element exactly once, each producer's in order.
#[test]
fn mpmc_slices_exactly_once_and_per_producer_order() {
    let (tx, rx) = mpmc::with_capacity::<u64>(8);
    let per: u64 = if cfg!(miri) { 60 } else { 30_000 };
    let mut handles = Vec::new();
    for p in 0..3u64 {
        let tx = tx.clone();
        handles.push(std::thread::spawn(move || {
            let mut i = 0;
            while i < per {
                let len = if p == 0 { 1 } else { 1 + (i % 7) }.min(per - i);
                let slice: Vec<u64> = (i..i + len).map(|k| (p << 32) | k).collect();
                if p == 0 {
                    tx.push_until(slice[0], Deadline::Never).unwrap();
                } else {
                    tx.push_slice_until(&slice, Deadline::Never).unwrap();
                }
                i += len;
            }
        }));
    }
    drop(tx);
    let total = 3 * per;
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut consumers = Vec::new();
    for c in 0..2u64 {
        let (rx, taken) = (rx.clone(), taken.clone());
        consumers.push(std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u64; 5];
            let mut k = 0;
            while taken.load(std::sync::atomic::Ordering::Relaxed) < total {
                k += 1;
                let len = 1 + (k + c as usize) % 5;
                if len == 5 && c == 1 {
                    if let Ok(v) = rx.try_pop() {
                        taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        got.push(v);
                    }
                    continue;
                }
                if let Ok(n) = rx.pop_into_until(&mut buf[..len], ms(10)) {
                    assert!((1..=len).contains(&n), "{n} from a buffer of {len}");
                    taken.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    got.extend_from_slice(&buf[..n]);
                }
            }
            got
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let mut all = HashSet::new();
    for c in consumers {
        let mut last = [None::<u64>; 3];
        for v in c.join().unwrap() {
            let (p, i) = ((v >> 32) as usize, v & 0xffff_ffff);
            assert!(last[p].is_none_or(|l| l < i), "producer {p}: {i} after {last:?}");
            last[p] = Some(i);
            assert!(all.insert(v), "duplicate {v:#x}");
        }
    }
    assert_eq!(all.len() as u64, total);
}

/// A run is cut at the first cell not ready: a full ring takes part of a slice, and a
/// pop into a long buffer takes only what is published; runs longer than `MAX_RUN`
/// move in several claims.
#[test]
fn mpmc_runs_stop_at_the_ring_edges_and_at_max_run() {
    let (tx, rx) = mpmc::with_capacity::<u64>(4);
    assert_eq!(tx.try_push_slice(&[]), Ok(0));
    assert_eq!(tx.try_push_slice(&[1, 2, 3]), Ok(3));
    assert_eq!(tx.try_push_slice(&[4, 5, 6]), Ok(1));
    assert_eq!(tx.try_push_slice(&[5]), Ok(0));
    let mut out = [0; 3];
    assert_eq!(rx.try_pop_into(&mut out), Ok(3));
    assert_eq!(out, [1, 2, 3]);
    assert_eq!(rx.try_pop_into(&mut out), Ok(1));
    assert_eq!(out[0], 4);
    assert_eq!(rx.try_pop_into(&mut out), Ok(0));
    assert_eq!(rx.pop_into_until(&mut out, ms(1)), Err(PopTimeoutError::Timeout));

    let (tx, rx) = mpmc::with_capacity::<u64>(256);
    let values: Vec<u64> = (0..200).collect();
    assert_eq!(tx.try_push_slice(&values), Ok(MAX_RUN));
    tx.push_slice_until(&values[MAX_RUN..], Deadline::Never).unwrap();
    let mut out = vec![0; 256];
    let mut got = Vec::new();
    while got.len() < 200 {
        let n = rx.try_pop_into(&mut out).unwrap();
        assert!((1..=MAX_RUN).contains(&n));
        got.extend_from_slice(&out[..n]);
    }
    assert_eq!(got, values);
}

#[test]
fn mpmc_forged_stamps_are_corrupted_not_a_hang() {
    let storage = Heap::new(4, |i| MpmcCell::<u64>::new(i as u64));
    let tx = mpmc::Producer::new(storage.clone()).unwrap();
    let rx = mpmc::Consumer::new(storage.clone()).unwrap();
    // Stamp far ahead of tail: a producer would chase it for ever without the check.
    storage.cells()[0].stamp.store(1 << 50, Ordering::Relaxed);
    assert!(matches!(tx.try_push(1), Err(TryPushError::Corrupted(_))));
    assert!(matches!(rx.try_pop(), Err(TryPopError::Corrupted(_))));
    // Stamp far behind.
    storage.cells()[0].stamp.store(0u64.wrapping_sub(100), Ordering::Relaxed);
    assert!(matches!(tx.try_push(1), Err(TryPushError::Corrupted(_))));
    assert!(matches!(rx.try_pop(), Err(TryPopError::Corrupted(_))));
    // Positions apart by more than capacity.
    storage.control().tail.store(1000, Ordering::Relaxed);
    assert!(mpmc::Producer::<u64, _>::new(storage.clone()).is_err());
}
