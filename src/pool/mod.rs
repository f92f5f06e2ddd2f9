//! Slot pools: a fixed set of equal, preallocated slots per sender, leased with a
//! generation number and returned through a free-slot ring.
//!
//! | file | what lives there |
//! |---|---|
//! | `lease.rs` | the lease protocol ([`PoolCore`]): slot records and free ring over any storage; [`AcquireError`] |
//! | `segment.rs` | a pool in shared memory ([`PoolSegment`]): records, free ring, host slots |
//! | `cuda.rs` | device pools (feature `cuda`): the allocation, the slots' IPC events, export and import; [`CudaError`] |
//! | `pinned.rs` | pinned host pools (feature `cuda`): registration with CUDA, host functions that return slots in stream order |
//! | `setup.rs` | where two processes' GPU work meets (feature `cuda`): a device's MPS state, `GpuPath` |
//!
//! A pool belongs to one sender; any receiver of its channel maps it on first sight and
//! returns slots to it.

pub(crate) mod cuda;
mod lease;
#[cfg(all(feature = "cuda", not(loom)))]
pub(crate) mod pinned;
#[cfg(not(loom))]
mod segment;
#[cfg(all(feature = "cuda", not(loom)))]
pub(crate) mod setup;

pub use cuda::CudaError;
pub use lease::{AcquireError, HeapPool, PoolCore, SlotRef, heap_pool};
pub(crate) use lease::{Phase, phase};
#[cfg(not(loom))]
pub(crate) use segment::{PoolError, PoolSegment};
