//! Ring operations against a `VecDeque` model: any sequence of pushes and pops on the heap
//! SPSC and MPMC rings gives exactly what a bounded FIFO queue gives.
//!
//! Input bytes are operations: the low bit picks push (of the next counter value) or pop;
//! the first byte picks the capacity (a power of two, 1..=64) and the ring kind.
#![no_main]

use std::collections::VecDeque;

use gpuring::ring::{mpmc, spsc};
use gpuring::{TryPopError, TryPushError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, ops)) = data.split_first() else { return };
    // MPMC rings need two cells at least (one cell cannot tell full from empty).
    let mpmc = first & 0x80 != 0;
    let capacity = 1usize << (first % 7).max(u8::from(mpmc));
    if mpmc {
        let (tx, rx) = mpmc::with_capacity::<u64>(capacity);
        check(ops, capacity, |v| tx.try_push(v), || rx.try_pop());
    } else {
        let (mut tx, mut rx) = spsc::with_capacity::<u64>(capacity);
        check(ops, capacity, |v| tx.try_push(v), || rx.try_pop());
    }
});

/// Runs `ops` through a ring's `push` / `pop` and a `VecDeque` bounded at `capacity`.
fn check(
    ops: &[u8],
    capacity: usize,
    mut push: impl FnMut(u64) -> Result<(), TryPushError<u64>>,
    mut pop: impl FnMut() -> Result<u64, TryPopError>,
) {
    let mut model = VecDeque::new();
    let mut next = 0u64;
    for &op in ops {
        if op & 1 == 0 {
            match push(next) {
                Ok(()) => {
                    model.push_back(next);
                    assert!(model.len() <= capacity, "pushed into a full ring");
                }
                Err(TryPushError::Full(v)) => {
                    assert_eq!(v, next);
                    assert_eq!(model.len(), capacity, "full only at capacity");
                }
                Err(e) => panic!("{e}"),
            }
            next += 1;
        } else {
            match pop() {
                Ok(v) => assert_eq!(Some(v), model.pop_front()),
                Err(TryPopError::Empty) => assert!(model.is_empty(), "empty only when empty"),
                Err(e) => panic!("{e}"),
            }
        }
    }
}
