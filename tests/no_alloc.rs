//! The hot path allocates nothing: a counting global allocator watches push and pop on
//! shared-memory rings once they are set up.
#![cfg(not(loom))] // shared memory is not modelled by loom

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use gpuring::{Descriptor, MpmcRing, SpscRing};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    f();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

// One test function, so that no other test's allocations run concurrently in this binary.
#[test]
fn push_and_pop_allocate_nothing() {
    let spsc =
        SpscRing::<Descriptor>::create(&format!("gpuring-noalloc-s-{}", std::process::id()), 64)
            .unwrap();
    let (mut tx, mut rx) = (spsc.producer().unwrap(), spsc.consumer().unwrap());
    let mpmc =
        MpmcRing::<Descriptor>::create(&format!("gpuring-noalloc-m-{}", std::process::id()), 64)
            .unwrap();
    let (mtx, mrx) = (mpmc.producer().unwrap(), mpmc.consumer().unwrap());
    let d = Descriptor::default();

    let n = allocations_during(|| {
        for i in 0..100_000u64 {
            tx.try_push(Descriptor { seq: i, ..d }).unwrap();
            assert_eq!(rx.try_pop().unwrap().seq, i);
            tx.push(Descriptor { seq: i, ..d }).unwrap();
            assert_eq!(rx.pop().unwrap().seq, i);
            mtx.try_push(Descriptor { seq: i, ..d }).unwrap();
            assert_eq!(mrx.try_pop().unwrap().seq, i);
            mtx.push(Descriptor { seq: i, ..d }).unwrap();
            assert_eq!(mrx.pop().unwrap().seq, i);
        }
        // Full and empty paths too.
        for _ in 0..64 {
            tx.try_push(d).unwrap();
        }
        assert!(tx.try_push(d).is_err());
        while rx.try_pop().is_ok() {}
        assert!(rx.try_pop().is_err());
    });
    assert_eq!(n, 0, "{n} heap allocations on the hot path");
    // The counter does count: a control that must move.
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 16]))) >= 1);
}
