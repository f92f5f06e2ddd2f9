//! Ring operations against a `VecDeque` model: any sequence of pushes and pops, one at a
//! time or in slices, on the heap SPSC and MPMC rings gives exactly what a bounded FIFO
//! queue gives.
//!
//! Input bytes are operations: the low bit picks push (of the next counter values) or pop,
//! the next three bits a slice length (0: one element with `try_push` / `try_pop`; 1..=7:
//! `try_push_slice` / `try_pop_into` with that many); the first byte picks the capacity (a
//! power of two, 1..=64) and the ring kind.
#![no_main]

use std::collections::VecDeque;

use gpuring::internal::{mpmc, spsc};
use gpuring::{Corrupted, TryPopError, TryPushError};
use libfuzzer_sys::fuzz_target;

/// One ring's operations, as closures over its two ends.
struct Ops<A, B, C, D> {
    push: A,
    pop: B,
    push_slice: C,
    pop_into: D,
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, ops)) = data.split_first() else { return };
    // MPMC rings need two cells at least (one cell cannot tell full from empty).
    let mpmc = first & 0x80 != 0;
    let capacity = 1usize << (first % 7).max(u8::from(mpmc));
    if mpmc {
        let (tx, rx) = mpmc::with_capacity::<u64>(capacity);
        check(
            ops,
            capacity,
            Ops {
                push: |v| tx.try_push(v),
                pop: || rx.try_pop(),
                push_slice: |s: &[u64]| tx.try_push_slice(s),
                pop_into: |s: &mut [u64]| rx.try_pop_into(s),
            },
        );
    } else {
        let (tx, rx) = spsc::with_capacity::<u64>(capacity);
        let (tx, rx) = (std::cell::RefCell::new(tx), std::cell::RefCell::new(rx));
        check(
            ops,
            capacity,
            Ops {
                push: |v| tx.borrow_mut().try_push(v),
                pop: || rx.borrow_mut().try_pop(),
                push_slice: |s: &[u64]| tx.borrow_mut().try_push_slice(s),
                pop_into: |s: &mut [u64]| rx.borrow_mut().try_pop_into(s),
            },
        );
    }
});

/// Runs `ops` through a ring and a `VecDeque` bounded at `capacity`.
fn check<A, B, C, D>(ops: &[u8], capacity: usize, mut ring: Ops<A, B, C, D>)
where
    A: FnMut(u64) -> Result<(), TryPushError<u64>>,
    B: FnMut() -> Result<u64, TryPopError>,
    C: FnMut(&[u64]) -> Result<usize, Corrupted>,
    D: FnMut(&mut [u64]) -> Result<usize, Corrupted>,
{
    let mut model = VecDeque::new();
    let mut next = 0u64;
    for &op in ops {
        let len = usize::from((op >> 1) & 7);
        match (op & 1 == 0, len) {
            (true, 0) => {
                match (ring.push)(next) {
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
            }
            (false, 0) => match (ring.pop)() {
                Ok(v) => assert_eq!(Some(v), model.pop_front()),
                Err(TryPopError::Empty) => assert!(model.is_empty(), "empty only when empty"),
                Err(e) => panic!("{e}"),
            },
            (true, len) => {
                let values: Vec<u64> = (next..next + len as u64).collect();
                let n = (ring.push_slice)(&values).unwrap();
                // One thread: every free cell is ready, so a slice stops only when full.
                assert_eq!(n, len.min(capacity - model.len()), "slice of {len} pushed {n}");
                model.extend(&values[..n]);
                next += n as u64;
            }
            (false, len) => {
                let mut out = [u64::MAX; 7];
                let n = (ring.pop_into)(&mut out[..len]).unwrap();
                assert_eq!(n, len.min(model.len()), "slice of {len} popped {n}");
                for v in &out[..n] {
                    assert_eq!(Some(*v), model.pop_front());
                }
            }
        }
    }
}
