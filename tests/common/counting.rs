//! A global allocator that counts the calling thread's allocations only (the other tests of
//! a binary run on other threads at the same time). A test binary installs it with
//! `#[global_allocator] static GLOBAL: common::counting::Counting = common::counting::Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to the system allocator, counting this thread's allocations.
pub struct Counting;

thread_local! {
    // No destructor and a const initialiser: usable from inside the allocator.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

/// Allocations (and reallocations) this thread has made so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Checks that the counter sees this thread's allocations (so that a zero means none).
pub fn assert_counting() {
    let before = allocations();
    drop(std::hint::black_box(vec![1u8; 16]));
    assert!(allocations() > before, "the counter counts this thread's allocations");
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
