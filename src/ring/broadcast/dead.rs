//! Readers that died: dropped from a broadcast ring at the producer's liveness ticks,
//! with what a broadcast channel does for each (clear its holds on the slots); and the walk
//! over a readers mask's places that this and the producer's minimum share.

use super::{Cursors, MAX_READERS};
use crate::sync::Ordering;

/// What a broadcast channel does when a dead reader is dropped: clear its holds.
pub(crate) struct ReaderDropped(pub(crate) Box<dyn Fn(usize) + Send + Sync>);

impl core::fmt::Debug for ReaderDropped {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ReaderDropped")
    }
}

/// [`Producer::drop_gone_readers`](super::Producer::drop_gone_readers) over the producer's parts.
pub(super) fn drop_gone_readers<S: Cursors>(
    storage: &S,
    on_drop: Option<&ReaderDropped>,
    held: u64,
) -> usize {
    let also = |i| on_drop.map_or((), |f| (f.0)(i));
    // Relaxed: which places to look at; each drop decides under its entry's lock.
    let mask = storage.readers().load(Ordering::Relaxed) | held;
    bits(mask).filter(|&i| storage.drop_if_gone(i, &also)).count()
}

/// The indices of the bits set in `mask`, below [`MAX_READERS`], lowest first: one step per
/// bit set, not per place (a reclaim asks at every last holder's drop).
pub(super) fn bits(mask: u64) -> impl Iterator<Item = usize> {
    // (A forged mask's bits past the places there are name none.)
    let mut left = mask & (u64::MAX >> (64 - MAX_READERS));
    std::iter::from_fn(move || {
        let i = left.trailing_zeros() as usize;
        left &= left.wrapping_sub(1); // the lowest bit set goes
        (i < 64).then_some(i)
    })
}
