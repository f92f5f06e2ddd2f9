//! Broadcast ring operations against a model: any sequence of pushes, reads by any reader,
//! joins and leaves, on the heap broadcast ring, blocking or lagging, gives what each
//! reader's own bounded queue gives.
//!
//! The first byte picks the capacity (a power of two, 1..=32) and the policy (high bit:
//! lagging). Each later byte is one operation: low two bits 0 push the next counter value,
//! 1 a read by reader `(b >> 2) % 4`, 2 a join (when fewer than 4 are there), 3 the leave
//! of reader `(b >> 2) % 4`.
//!
//! The model: each reader's queue holds what was pushed since it joined. Blocking, a push
//! is refused (`Full`) exactly when a reader's queue already holds `capacity` elements;
//! lagging, a push always goes, and a reader whose queue exceeds `capacity` is told
//! `Lagged(n)` with `n` the oldest ones dropped, then reads the rest in order.
#![no_main]

use std::collections::VecDeque;

use gpuring::internal::broadcast;
use gpuring::{TryPushError, TryReadError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, ops)) = data.split_first() else { return };
    let lagging = first & 0x80 != 0;
    let capacity = 1usize << (first % 6);
    let mut tx = broadcast::with_policy::<u64>(capacity, 4, lagging);
    // The readers: each with its model queue.
    let mut readers: Vec<
        Option<(broadcast::Reader<u64, broadcast::HeapCursors<u64>>, VecDeque<u64>)>,
    > = (0..4).map(|_| None).collect();
    let mut next = 0u64;
    for &op in ops {
        let k = usize::from(op >> 2) % 4;
        match op & 3 {
            0 => {
                let full = readers.iter().flatten().any(|(_, q)| q.len() >= capacity);
                match tx.try_push(next) {
                    Ok(()) => {
                        assert!(lagging || !full, "blocking: pushed past a reader a ring behind");
                        for (_, q) in readers.iter_mut().flatten() {
                            q.push_back(next);
                        }
                        next += 1;
                    }
                    Err(TryPushError::Full(v)) => {
                        assert_eq!(v, next, "the value comes back");
                        assert!(!lagging && full, "refused with room for every reader");
                    }
                    Err(e) => panic!("push: {e}"),
                }
            }
            1 => {
                let Some((r, q)) = readers[k].as_mut() else { continue };
                match r.try_read() {
                    Ok(v) => assert_eq!(Some(v), q.pop_front(), "in order, none missed"),
                    Err(TryReadError::Empty) => assert!(q.is_empty(), "empty with {q:?} due"),
                    Err(TryReadError::Lagged(n)) => {
                        assert!(lagging, "Lagged in a blocking ring");
                        let over = q.len().saturating_sub(capacity);
                        assert_eq!(n as usize, over, "missed as many as were overwritten");
                        q.drain(..over);
                    }
                    Err(e) => panic!("read: {e}"),
                }
            }
            2 => {
                if let Some(slot) = readers.iter_mut().find(|r| r.is_none()) {
                    let r = tx.subscribe().expect("fewer than four readers are there");
                    *slot = Some((r, VecDeque::new()));
                }
            }
            _ => readers[k] = None,
        }
    }
});
