//! Slot pools: a fixed set of equal, preallocated slots per sender, leased with a
//! generation number and returned through a free-slot ring.
//!
//! | file | what lives there |
//! |---|---|
//! | `lease.rs` | the lease protocol ([`PoolCore`]): slot records and free ring over any storage |
//! | `segment.rs` | a pool in shared memory ([`PoolSegment`]): records, free ring, host slots, and the typed views of a device pool's handles |
//! | `hold.rs` | a slot in a sender's or a receiver's hands ([`SlotLease`], [`SlotHold`]), given back on drop |
//!
//! A pool belongs to one sender; any receiver of its channel maps it on first sight and
//! returns slots to it. What a backend adds to a pool (device memory, a registration with
//! CUDA) is the backend's, in `crate::cuda`: a pool carries nothing of it.

#[cfg(not(loom))]
mod hold;
mod lease;
#[cfg(not(loom))]
mod segment;

#[cfg(not(loom))]
pub(crate) use hold::{SharedHold, SlotHold, SlotLease};
pub use lease::{HeapPool, PoolCore, SlotRef, heap_pool};
pub(crate) use lease::{Phase, phase};
#[cfg(not(loom))]
pub(crate) use segment::{PoolSegment, PoolSegmentError};
