//! The one place that names atomics and `UnsafeCell`.
//!
//! Every other module imports them from here, so that under `--cfg loom` the ring
//! algorithms run against loom's model-checked types without a line changing. Nothing else
//! lives here: no algorithm, no layout.
//!
//! Under loom the shared-memory modules are not built (loom's types have their own size and
//! cannot sit in a mapping); the ring algorithms are checked over heap storage instead.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `std`'s `UnsafeCell` with loom's closure-based API, so that one body of code serves
/// both. `repr(transparent)`: in shared memory it is exactly a `T`.
#[cfg(not(loom))]
#[repr(transparent)]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a pointer for reading.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a pointer for writing.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// A hint inside a retry loop: a `pause` normally, a yield to loom's scheduler under loom
/// (loom must see the thread give way, or a spin loop never ends in the model).
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
