//! A receiver's checks of a popped descriptor (against the pool table, its pool and the
//! backend) and its claim of the slot, before the descriptor leaves the ring.

use super::{CachedPool, Receiver, Taken, Unheld};
use crate::channel::backend::Backend;
use crate::channel::error::{RecvTimeoutError, corrupt};
use crate::descriptor::{Descriptor, TensorMeta};
use crate::layout::SLOT_HEADER_SIZE;
use crate::pool::{SharedHold, SlotHold};

impl<B: Backend> Receiver<B> {
    /// Checks a popped descriptor against the pool table, its pool and the backend, then
    /// claims its slot. A refused message's error comes with its slot, if it was taken, to
    /// give back once the descriptor has left the ring.
    pub(super) fn check_and_hold(&self, d: Descriptor) -> Result<Taken<B>, Unheld<B>> {
        let (index, instance) = (d.pool_id & 0xFFFF, d.pool_id >> 16);
        if index >= self.channel.max_pools() {
            return Err((corrupt("descriptor names an unknown pool"), None));
        }
        let pool = self.pool_for(index, instance, &d)?;
        let meta = self.check(&pool, &d).map_err(|why| (why, None))?;
        // The pool's handle moves into the hold (one reference count a message, not two).
        let CachedPool { seg, imported, .. } = pool;
        let core = &seg.core;
        let (held, shared) = match &self.shared {
            None => (core.receive(d.slot, d.generation).map_err(|c| (c.into(), None))?, None),
            Some((bit, ring)) => {
                let held = if self.lagging {
                    // Retired by the sender before we held it: one message missed.
                    let held = core.hold_retirable(d.slot, d.generation, *bit);
                    held.map_err(|c| (c.into(), None))?
                        .ok_or((RecvTimeoutError::Lagged(1), None))?
                } else {
                    core.hold_shared(d.slot, d.generation, *bit).map_err(|c| (c.into(), None))?
                };
                (held, Some(SharedHold { bit: *bit, ring: ring.clone() }))
            }
        };
        let hold = SlotHold { pool: seg, held, shared };
        let died = self.note_owner(&hold.pool);
        // The slot is ours: a sender giving its device memory up now waits for us, or we
        // see that it has (then the slot goes back unread, with `hold`).
        if let Err(why) = B::refuse(&hold.pool, died) {
            crate::fault::point("refused_holding");
            return Err((why.into(), Some(hold)));
        }
        // The slot is ours and the descriptor still in the ring.
        crate::fault::point("recv_holding");
        Ok(Taken { imported, hold, desc: d, meta, redelivered: false })
    }

    /// The checks of a descriptor `d` of `pool` before its slot is used: metadata, slot
    /// in range, payload and header within the slot, and the backend's own fields.
    pub(super) fn check(
        &self,
        pool: &CachedPool<B>,
        d: &Descriptor,
    ) -> Result<TensorMeta, RecvTimeoutError<B>> {
        let meta = d.meta().map_err(|_| corrupt("descriptor carries invalid tensor metadata"))?;
        if d.slot >= pool.seg.core.slot_count() {
            return Err(corrupt("descriptor names a slot out of range"));
        }
        let end = d.byte_offset.checked_add(d.len);
        if end.is_none_or(|e| e > pool.seg.slot_size() as u64) {
            return Err(corrupt("descriptor length is larger than the slot"));
        }
        if meta.nbytes() != d.len {
            return Err(corrupt("descriptor metadata is inconsistent with its length"));
        }
        if d.header_len as usize > SLOT_HEADER_SIZE {
            return Err(corrupt("descriptor header is longer than a slot's header"));
        }
        B::check(&pool.imported, d)?;
        Ok(meta)
    }
}
