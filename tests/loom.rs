//! Loom models of the ring algorithms over heap storage.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom`. Each model explores
//! every interleaving (and every weak-memory outcome loom models) up to a preemption bound:
//! `LOOM_MAX_PREEMPTIONS` if set, otherwise the bound named in the model.
#![cfg(loom)]

use loom::model::Builder;
use loom::thread;

use gpuring::ring::{TryPopError, TryPushError, mpmc, spsc};

fn builder(default_bound: usize) -> Builder {
    let mut b = Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(default_bound);
    }
    // Retry loops (a consumer polling an empty ring) add branches on every turn.
    b.max_branches = b.max_branches.max(100_000);
    b
}

/// One producer, one consumer, capacity 2, three elements: the ring wraps and fills.
/// Every element arrives once, in order, unchanged.
#[test]
fn spsc_no_loss_no_duplicate_fifo() {
    builder(3).check(|| {
        let (mut tx, mut rx) = spsc::with_capacity::<u64>(2);
        let producer = thread::spawn(move || {
            for v in 1..=3u64 {
                let mut item = v * 11;
                loop {
                    match tx.try_push(item) {
                        Ok(()) => break,
                        Err(TryPushError::Full(back)) => {
                            item = back;
                            thread::yield_now();
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            match rx.try_pop() {
                Ok(v) => got.push(v),
                Err(TryPopError::Empty) => thread::yield_now(),
                Err(e) => panic!("{e:?}"),
            }
        }
        producer.join().unwrap();
        assert_eq!(got, [11, 22, 33]);
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
    });
}

/// Moves an empty ring's positions forward by `n` (push, pop), so that a model starts in
/// the middle of a lap and its elements wrap around the end of the cell array.
fn advance(tx: &mpmc::HeapProducer<u64>, rx: &mpmc::HeapConsumer<u64>, n: usize) {
    for _ in 0..n {
        tx.try_push(0).unwrap();
        rx.try_pop().unwrap();
    }
}

/// Pops whatever is left, after every thread has been joined.
fn drain(rx: &mpmc::HeapConsumer<u64>) -> Vec<u64> {
    let mut rest = Vec::new();
    loop {
        match rx.try_pop() {
            Ok(v) => rest.push(v),
            Err(TryPopError::Empty) => return rest,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// Up to `attempts` pops, without waiting: no retry loops, so the model stays finite.
fn pop_some(rx: &mpmc::HeapConsumer<u64>, attempts: usize) -> Vec<u64> {
    let mut got = Vec::new();
    for _ in 0..attempts {
        match rx.try_pop() {
            Ok(v) => got.push(v),
            Err(TryPopError::Empty) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    got
}

/// Per-producer FIFO (producer = value / 10, its sequence = value % 10): within each
/// consumer's list, and everything left for `drain` comes after everything the threads
/// popped (they finished before the drain began).
fn assert_fifo(consumers: &[&Vec<u64>], rest: &[u64]) {
    for p in 1..=2u64 {
        let mine = |list: &[u64]| list.iter().copied().filter(|v| v / 10 == p).collect::<Vec<_>>();
        for got in consumers {
            let seq = mine(got);
            assert!(seq.windows(2).all(|w| w[0] < w[1]), "producer {p} out of order: {got:?}");
        }
        let taken_max = consumers.iter().flat_map(|g| mine(g)).max();
        let left = mine(rest);
        assert!(left.windows(2).all(|w| w[0] < w[1]), "drain out of order: {rest:?}");
        if let (Some(t), Some(l)) = (taken_max, left.first()) {
            assert!(t < *l, "producer {p}: {t} taken while earlier {l} was still queued");
        }
    }
}

/// Two producers and two consumers, capacity 4, started three positions into a lap so the
/// four elements wrap: each delivered exactly once, each producer's elements in order.
#[test]
fn mpmc_two_by_two_exactly_once_per_producer_fifo() {
    builder(2).check(|| {
        let (tx, rx) = mpmc::with_capacity::<u64>(4);
        advance(&tx, &rx, 3);
        // Producer p sends p*10 + 1, p*10 + 2; four cells, so a push is never refused.
        let producers: Vec<_> = (1..=2u64)
            .map(|p| {
                let tx = tx.clone();
                thread::spawn(move || {
                    for v in [p * 10 + 1, p * 10 + 2] {
                        tx.try_push(v).unwrap();
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let rx = rx.clone();
                thread::spawn(move || pop_some(&rx, 2))
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let got: Vec<_> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
        let rest = drain(&rx);
        assert_fifo(&got.iter().collect::<Vec<_>>(), &rest);
        let mut all: Vec<_> = got.iter().flatten().chain(&rest).copied().collect();
        all.sort_unstable();
        assert_eq!(all, [11, 12, 21, 22], "lost or duplicated");
    });
}

/// Capacity 2, one element already queued, two producers racing for the last cell while a
/// consumer frees one: a refused push hands its value back, and every accepted element
/// arrives exactly once.
#[test]
fn mpmc_full_ring_capacity_2() {
    builder(3).check(|| {
        let (tx, rx) = mpmc::with_capacity::<u64>(2);
        advance(&tx, &rx, 1);
        tx.try_push(1).unwrap();
        let producers: Vec<_> = [11u64, 21]
            .into_iter()
            .map(|v| {
                let tx = tx.clone();
                thread::spawn(move || match tx.try_push(v) {
                    Ok(()) => Some(v),
                    Err(TryPushError::Full(back)) => {
                        assert_eq!(back, v);
                        None
                    }
                    Err(e) => panic!("{e:?}"),
                })
            })
            .collect();
        let consumer = {
            let rx = rx.clone();
            thread::spawn(move || pop_some(&rx, 1))
        };
        let mut sent: Vec<u64> = producers.into_iter().filter_map(|p| p.join().unwrap()).collect();
        assert!(!sent.is_empty(), "one cell was free, so at least one push succeeds");
        sent.push(1);
        let got = consumer.join().unwrap();
        assert!(got.is_empty() || got == [1], "the oldest element leaves first: {got:?}");
        let mut all: Vec<_> = got.iter().chain(&drain(&rx)).copied().collect();
        all.sort_unstable();
        sent.sort_unstable();
        assert_eq!(all, sent, "lost or duplicated");
    });
}

/// The lease/return protocol of a slot pool: one sender leasing the pool's only slot for
/// two messages, two receivers taking messages and returning the slot, each making a
/// bounded number of attempts (no retry loops, so the model stays finite); the main thread
/// then takes what is left. Every message sent arrives exactly once with the bytes written
/// for it: loom's `UnsafeCell` flags a write by the sender that is not ordered after the
/// previous holder's read (the reuse hand-off through the free ring), and the slot ends
/// free.
#[test]
fn pool_lease_and_return_two_receivers() {
    use gpuring::pool::{HeapPool, heap_pool};
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU64, Ordering};

    // Takes one message if there is one: checks its bytes, records it, returns the slot.
    fn take(
        pool: &HeapPool,
        slot: &UnsafeCell<u64>,
        rx: &mpmc::HeapConsumer<u64>,
        seen: &AtomicU64,
    ) {
        if let Ok(d) = rx.try_pop() {
            let held = pool.receive(d as u32, d >> 32).expect("a sent slot");
            // SAFETY: `receive` made this receiver the slot's only holder.
            let k = slot.with(|p| unsafe { *p });
            // Relaxed: a record of arrivals, read after the threads are joined.
            let before = seen.fetch_or(1 << k, Ordering::Relaxed);
            assert_eq!(before & (1 << k), 0, "message {k} received twice");
            assert!(pool.release(held), "returned once");
        }
    }

    builder(2).check(|| {
        let pool = Arc::new(heap_pool(1));
        let slot = Arc::new(UnsafeCell::new(0u64));
        let (msg_tx, msg_rx) = mpmc::with_capacity::<u64>(2);
        let seen = Arc::new(AtomicU64::new(0)); // bit k: message k arrived
        let sender = {
            let (pool, slot) = (pool.clone(), slot.clone());
            thread::spawn(move || {
                let mut sent = 0u64;
                for k in 1..=2u64 {
                    // The second lease needs the slot back: two attempts, then give up.
                    let Some(lease) = (0..2).find_map(|_| match pool.try_lease() {
                        Ok(l) => Some(l),
                        Err(gpuring::AcquireError::Exhausted) => {
                            thread::yield_now();
                            None
                        }
                        Err(e) => panic!("{e:?}"),
                    }) else {
                        break;
                    };
                    // SAFETY: the lease makes the sender the slot's only user.
                    slot.with_mut(|p| unsafe { *p = k });
                    pool.mark_sent(lease);
                    let d = u64::from(lease.slot) | (u64::from(lease.generation) << 32);
                    msg_tx.try_push(d).expect("room for both messages");
                    sent |= 1 << k;
                }
                sent
            })
        };
        let receivers: Vec<_> = (0..2)
            .map(|_| {
                let (pool, slot, rx, seen) =
                    (pool.clone(), slot.clone(), msg_rx.clone(), seen.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        take(&pool, &slot, &rx, &seen);
                    }
                })
            })
            .collect();
        let sent = sender.join().unwrap();
        for r in receivers {
            r.join().unwrap();
        }
        for _ in 0..2 {
            take(&pool, &slot, &msg_rx, &seen);
        }
        assert!(sent & 0b10 != 0, "the first lease always succeeds");
        assert_eq!(seen.load(Ordering::Relaxed), sent, "exactly the messages sent arrived");
        assert_eq!(pool.free_slots(), 1, "the slot is back");
    });
}
