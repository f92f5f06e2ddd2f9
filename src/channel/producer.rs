//! [`ProducerRing`]: the producer end of a channel's descriptor ring, as a sender (and, for
//! a pinned sender's stream-ordered sends, the thread that publishes them) holds it.

use std::sync::Arc;

use super::Flavor;
use crate::descriptor::Descriptor;
use crate::layout::{MpmcCell, ParticipantId, SpscCell};
use crate::liveness::{AttachError, Blocked, Watch};
use crate::ring::broadcast::{self, ReaderDropped};
use crate::ring::{PushTimeoutError, RingSegment, ShmStorage, Storage, mpmc, spsc};
use crate::wait::{Deadline, WaitPolicy};
#[cfg(feature = "async")]
use crate::{liveness::Role, wait::reactor::Park};

/// The producer end of a channel's descriptor ring, as a sender (and, for stream-ordered
/// sends, the threads that publish them) holds it.
#[derive(Debug)]
pub struct ProducerRing(RingEnd);

#[derive(Debug)]
enum RingEnd {
    Spsc(spsc::Producer<Descriptor, ShmStorage<SpscCell<Descriptor>>>),
    Mpmc(mpmc::Producer<Descriptor, ShmStorage<MpmcCell<Descriptor>>>),
    Broadcast(broadcast::Producer<Descriptor, ShmStorage<SpscCell<Descriptor>>>),
}

impl ProducerRing {
    /// The producer end of a channel's `ring` of `flavor` (SPSC: claiming the producer
    /// role). MPMC: a sole end (`ClaimLock`): a `ProducerRing` is used through `&mut`
    /// alone, by one thread at a time (the sender's, or under `PinnedTx`'s lock), and never
    /// cloned.
    pub(super) fn attach(ring: &Arc<RingSegment>, flavor: Flavor) -> Result<Self, AttachError> {
        Ok(ProducerRing(match flavor {
            Flavor::Spsc => RingEnd::Spsc(ring.spsc_producer()?),
            Flavor::Mpmc => RingEnd::Mpmc(ring.mpmc_producer(true)?),
            Flavor::Broadcast => RingEnd::Broadcast(ring.broadcast_producer()?),
        }))
    }

    /// Broadcast rings: the position the next push writes (`None` for the others).
    pub(super) fn next_position(&self) -> Option<u64> {
        match &self.0 {
            RingEnd::Broadcast(p) => Some(p.next_position()),
            _ => None,
        }
    }

    /// Lagging broadcast rings: the position the next push writes (`None` for the others).
    pub(super) fn lagging_next(&self) -> Option<u64> {
        match &self.0 {
            RingEnd::Broadcast(p) if p.is_lagging() => Some(p.next_position()),
            _ => None,
        }
    }

    /// Broadcast rings: a lower bound of every counted reader's cursor, computed now.
    pub(super) fn slowest(&self) -> Option<u64> {
        match &self.0 {
            RingEnd::Broadcast(p) => Some(p.slowest()),
            _ => None,
        }
    }

    /// Broadcast rings: what to do, under a dead reader's lock, when a tick of a push drops
    /// it (a broadcast channel's sender clears its holds).
    pub(super) fn on_reader_dropped(&mut self, f: ReaderDropped) {
        if let RingEnd::Broadcast(p) = &mut self.0 {
            p.on_reader_dropped(f);
        }
    }

    /// Broadcast rings: drops the dead readers, those of the mask and those of `held` (a
    /// mask of places that hold slots), each with the `on_reader_dropped` action; how
    /// many (see `broadcast::Producer::drop_gone_readers`).
    pub(super) fn drop_dead_readers(&self, held: u64) -> usize {
        match &self.0 {
            RingEnd::Broadcast(p) => p.drop_gone_readers(held),
            _ => 0,
        }
    }

    /// Pushes `d`, waiting until `deadline`; an error does not carry the descriptor back
    /// (the lease it describes is what the caller gives back).
    pub(crate) fn push_until(
        &mut self,
        d: Descriptor,
        deadline: Deadline,
    ) -> Result<(), PushTimeoutError<()>> {
        let pushed = match &mut self.0 {
            RingEnd::Spsc(p) => p.push_until(d, deadline),
            RingEnd::Mpmc(p) => p.push_until(d, deadline),
            RingEnd::Broadcast(p) => p.push_until(d, deadline),
        };
        pushed.map_err(|e| e.map(|_| ()))
    }

    /// Whether every receiver of the channel is gone (see `ring::peers_gone`).
    pub(super) fn receivers_gone(&self, probe: bool) -> Option<Blocked> {
        match &self.0 {
            RingEnd::Spsc(p) => p.consumers_gone(probe),
            RingEnd::Mpmc(p) => p.consumers_gone(probe),
            RingEnd::Broadcast(p) => p.consumers_gone(probe),
        }
    }

    /// Whether a descriptor naming slot `slot` of pool `pool_id` at `generation` is still
    /// in the ring (SPSC: queued; MPMC: in a cell not yet freed). A receiver takes a slot
    /// before the descriptor leaves the ring (SPSC: before `head` moves; MPMC: before the
    /// cell is freed), so a receiver that died in between left both, and the next receiver
    /// takes the slot over with the message. Reads every such cell: slow paths only.
    pub(super) fn queued(&self, pool_id: u32, slot: u32, generation: u32) -> bool {
        let names = |d: &Descriptor| {
            d.pool_id == pool_id && d.slot == slot && d.generation == u64::from(generation)
        };
        match &self.0 {
            RingEnd::Spsc(p) => p.any_queued(names),
            RingEnd::Mpmc(p) => p.any_unfreed(names),
            RingEnd::Broadcast(p) => p.any_unread(names),
        }
    }

    /// This endpoint's identity in the channel's ring.
    pub(super) fn id(&self) -> ParticipantId {
        let id = match &self.0 {
            RingEnd::Spsc(p) => p.storage().watch().id(),
            RingEnd::Mpmc(p) => p.storage().watch().id(),
            RingEnd::Broadcast(p) => p.storage().watch().id(),
        };
        id.expect("an endpoint of a ring in shared memory is registered")
    }

    /// Where an async send parks: the ring's `not_full` word.
    #[cfg(feature = "async")]
    pub(super) fn park(&self) -> Park {
        match &self.0 {
            RingEnd::Spsc(p) => p.storage().park(Role::Producer),
            RingEnd::Mpmc(p) => p.storage().park(Role::Producer),
            RingEnd::Broadcast(p) => p.storage().park(Role::Producer),
        }
    }

    pub(super) fn set_wait_policy(&mut self, policy: WaitPolicy) {
        match &mut self.0 {
            RingEnd::Spsc(p) => p.set_wait_policy(policy),
            RingEnd::Mpmc(p) => p.set_wait_policy(policy),
            RingEnd::Broadcast(p) => p.set_wait_policy(policy),
        }
    }
}
