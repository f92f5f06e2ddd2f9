//! A slot in someone's hands, given back when the hand lets go: [`SlotLease`] (a sender's,
//! returned unless it was sent) and [`SlotHold`] (a receiver's, returned when the message
//! goes).

use std::sync::Arc;

use super::SlotRef;
use super::segment::PoolSegment;
use crate::descriptor::Descriptor;
use crate::layout::SpscCell;
use crate::ring::ShmStorage;
use crate::ring::broadcast::slowest_now;

/// A slot taken from a pool by its sender, and its return on drop unless it was sent.
#[derive(Debug)]
pub struct SlotLease {
    /// The pool; `None` once sent (the receiver owns the slot then).
    pub(crate) pool: Option<Arc<PoolSegment>>,
    pub(crate) slot: SlotRef,
    /// The application tag the descriptor will carry.
    pub(crate) tag: u64,
    /// Bytes of the slot's header the descriptor will carry.
    pub(crate) header_len: u32,
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            if pool.inherited() {
                return; // a forked child's copy: the parent's lease gives the slot back
            }
            if pool.core.cancel(self.slot) {
                // The sender may have left while this lease was out.
                pool.unlink_if_drained();
            }
        }
    }
}

/// A slot held by a receiver, returned to its pool on drop.
#[derive(Debug)]
pub struct SlotHold {
    pub(crate) pool: Arc<PoolSegment>,
    pub(crate) held: SlotRef,
    /// A broadcast channel's reader's hold (`pool::lease::shared`); `None` elsewhere.
    pub(crate) shared: Option<SharedHold>,
}

/// A broadcast reader's hold on a slot: its bit in the slot's holders mask, and its end of
/// the ring, which keeps its place (so that the bit is no new reader's until the hold goes)
/// and says where the cursors are when the last holder tries to put the slot back.
#[derive(Debug)]
pub(crate) struct SharedHold {
    pub(crate) bit: u64,
    pub(crate) ring: Arc<ShmStorage<SpscCell<Descriptor>>>,
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        if self.pool.inherited() {
            return; // a forked child's copy: the parent's message gives the slot back
        }
        let back = match &self.shared {
            None => self.pool.core.release(self.held),
            // The last holder puts the slot back, if every reader is past its message.
            Some(s) => self
                .pool
                .core
                .release_shared_then_reclaim(self.held, s.bit, || slowest_now(&*s.ring)),
        };
        if back {
            self.pool.unlink_if_drained();
        }
    }
}
