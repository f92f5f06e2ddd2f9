//! The hot path allocates nothing: a counting global allocator watches push and pop on
//! shared-memory rings, and acquire/send/recv/drop on channels, once they are set up. The
//! same loops make no futex call (nobody sleeps), counted by `wait_stats`.
#![cfg(not(loom))] // shared memory is not modelled by loom

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use gpuring::internal::wait_stats;
use gpuring::{Channel, Descriptor, MpmcRing, SpscRing, TensorMeta};

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
    let spsc = SpscRing::<Descriptor>::builder(format!("gpuring-noalloc-s-{}", std::process::id()))
        .capacity(64)
        .create()
        .unwrap();
    let (mut tx, mut rx) = (spsc.producer().unwrap(), spsc.consumer().unwrap());
    let mpmc = MpmcRing::<Descriptor>::builder(format!("gpuring-noalloc-m-{}", std::process::id()))
        .capacity(64)
        .create()
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

    // Channels, SPSC and MPMC: warm up (the first message maps the pool), then count.
    let pid = std::process::id();
    let spsc = Channel::builder(format!("gpuring-noalloc-cs-{pid}")).slots(4, 4096).create();
    let mpmc = Channel::builder(format!("gpuring-noalloc-cm-{pid}")).mpmc().slots(4, 4096).create();
    for ch in [spsc.unwrap(), mpmc.unwrap()] {
        let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
        let round = |i: u64| {
            let mut lease =
                if i % 2 == 0 { tx.acquire().unwrap() } else { tx.try_acquire().unwrap() };
            lease[..8].copy_from_slice(&i.to_le_bytes());
            let meta = TensorMeta::bytes(8 + i % 4000);
            if i % 2 == 0 {
                tx.send(lease, meta).unwrap()
            } else {
                tx.try_send(lease, meta).unwrap()
            }
            let m = if i % 2 == 0 { rx.recv().unwrap() } else { rx.try_recv().unwrap() };
            assert_eq!((m.seq(), &m[..8]), (i, &i.to_le_bytes()[..]));
        };
        round(0);
        let futex_before = wait_stats();
        let n = allocations_during(|| {
            for i in 1..100_000u64 {
                round(i);
            }
            // A lease dropped unsent, and messages held while the pool runs dry.
            drop(tx.acquire().unwrap());
            let held: [_; 4] = std::array::from_fn(|i| {
                tx.send(tx.acquire().unwrap(), TensorMeta::bytes(i as u64)).unwrap();
                rx.recv().unwrap()
            });
            assert!(tx.try_acquire().is_err());
            drop(held);
        });
        assert_eq!(n, 0, "{n} heap allocations in channel steady state ({:?})", ch.flavor());
        assert_eq!(wait_stats(), futex_before, "a futex call while nobody sleeps");
        assert_eq!(tx.free_slots(), 4);
    }

    // The counter does count: a control that must move.
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 16]))) >= 1);
}
