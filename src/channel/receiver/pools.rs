//! The pools a receiver maps (on first sight of each), and redelivery from them: a
//! receiver takes over the messages of receivers that died holding them
//! (`ChannelBuilder::redeliver`), checking each slot's sent copy as any descriptor; and
//! the closing of dead senders' entries, which the pools mapped here make cheaper.

use super::{CachedPool, Receiver, Taken};
use crate::channel::backend::Backend;
use crate::channel::error::{RecvTimeoutError, corrupt};
use crate::channel::{Message, RequeueError};
use crate::descriptor::Descriptor;
use crate::pool::{PoolSegment, SlotHold};
use std::sync::Arc;

/// Why a pool was not mapped, with the pool where it was mapped and then refused before
/// its import (a device pool whose sender is gone).
type Refused<B> = (Option<Arc<PoolSegment>>, RecvTimeoutError<B>);

impl<B: Backend> Receiver<B> {
    /// Puts `msg`, received by this receiver, back in the channel, as if this receiver had
    /// died holding it: the next receive of any receiver of the channel (this one
    /// included) takes it before what is queued, marked
    /// [`redelivered`](Message::redelivered). For a consumer that took more than it will
    /// handle (a batch taken ahead, a shutdown): what it gives back is not lost. Waits for
    /// this receiver's reads of the slot first (GPU channels: the message's stream).
    /// Needs a channel that delivers messages again (the default).
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-receiver-requeue", 2)?;
    /// let ch = gpuring::Channel::builder("doc-receiver-requeue").open()?;
    /// let rx = ch.receiver()?;
    /// let first = rx.recv()?;
    /// let seq = first.seq();
    /// rx.requeue(first)?; // not handled after all
    /// let again = rx.recv()?;
    /// assert_eq!(again.seq(), seq);
    /// assert!(again.redelivered());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Each gives the message back ([`RequeueError::into_message`]):
    /// [`NoRedelivery`](RequeueError::NoRedelivery) on a channel made with
    /// `redeliver(false)` or a broadcast channel;
    /// [`NotReceivedHere`](RequeueError::NotReceivedHere) for another receiver's message;
    /// [`Device`](RequeueError::Device) when the wait for the reads failed.
    pub fn requeue(&self, mut msg: Message<B>) -> Result<(), RequeueError<B>> {
        if !self.channel.redeliver || msg.hold.shared.is_some() {
            return Err(RequeueError::NoRedelivery(Box::new(msg)));
        }
        let ours =
            self.pools.borrow().iter().flatten().any(|p| Arc::ptr_eq(&p.seg, &msg.hold.pool));
        if !ours || msg.hold.pool.inherited() {
            return Err(RequeueError::NotReceivedHere(Box::new(msg)));
        }
        if let Err(e) = B::settle(&mut msg.slot) {
            return Err(RequeueError::Device(Box::new(msg), e));
        }
        let (slot, hold) = msg.into_parts();
        drop(slot); // settled: signals nothing
        // Held by nobody now: a look for messages to deliver again adopts it, and the
        // hold's drop finds the slot no longer ours and gives nothing back. (A CAS that
        // fails found the record written by another party: a corrupt segment, where the
        // message's own drop would give nothing back either.)
        if hold.pool.core.give_up(hold.held) {
            self.channel.note_orphans();
        }
        drop(hold);
        Ok(())
    }

    /// Closes the pool table entries of senders that died (`ChannelSegment::close_dead_owners_but`:
    /// one lock probe per live entry, but none for a pool mapped here whose owner word says
    /// its sender lives or died): their pools are closed (device pools retired: what is
    /// still queued is refused), the slots that would never come back marked free, and each
    /// unlinks itself once what is still queued has been received or refused. Slow paths
    /// only: liveness ticks, and once per dead sender's pool.
    pub(super) fn close_dead_senders(&self) {
        let ring = &self.channel.ring;
        let queued = |pool_id: u32, slot: u32, generation: u32| {
            ring.any_in_ring::<Descriptor>(|d| {
                d.pool_id == pool_id && d.slot == slot && d.generation == u64::from(generation)
            })
        };
        // A pool mapped here whose owner word says its sender lives, or died, needs no probe.
        let pools = self.pools.borrow();
        let owner = |index: u32, instance: u32| {
            let pool = pools.get(index as usize).and_then(Option::as_ref);
            let seg = &pool.filter(|p| p.instance == instance)?.seg;
            if seg.owner_alive() { Some(true) } else { seg.owner_died().then_some(false) }
        };
        self.channel.close_dead_owners_but(self.me, &queued, &owner);
    }

    /// Takes over one message whose receiver died holding it, from any pool of the
    /// channel (`PoolCore::adopt`: a slot HELD by a party that is gone, whose descriptor is
    /// no longer queued), and checks its sent copy as any descriptor: `None` when there is
    /// none. A copy that fails the checks, or a device pool whose sender is gone, gives the
    /// slot back unread with the error. Probes the holders' locks, and maps the pools not
    /// seen yet (a pool that cannot be mapped, or is refused, is not tried again: its
    /// segment is gone, or its messages are refused anyway): slow paths only. Allocates
    /// only to map a pool.
    pub(super) fn redeliver_one(&self) -> Option<Result<Taken<B>, RecvTimeoutError<B>>> {
        let ring = &self.channel.ring;
        for (index, instance) in self.channel.pools_in_use() {
            let unmapped = &mut self.unmapped.borrow_mut()[index as usize];
            if *unmapped == instance + 1 {
                continue;
            }
            let pool_id = instance << 16 | index;
            let queued = |slot: u32, generation: u32| {
                ring.any_in_ring::<Descriptor>(|d| {
                    d.pool_id == pool_id && d.slot == slot && d.generation == u64::from(generation)
                })
            };
            let pool = match self.pool_at(index, instance, false) {
                Ok(pool) => pool,
                Err((Some(seg), why)) => {
                    // Refused (a device pool whose sender is gone): what it held goes back.
                    *unmapped = instance + 1;
                    let age = |slot| seg.read_sent(slot).seq;
                    let Some(held) = seg.core.adopt(B::holder_gone, queued, age) else {
                        continue;
                    };
                    drop(SlotHold { pool: seg, held, shared: None });
                    return Some(Err(why));
                }
                Err((None, _)) => {
                    *unmapped = instance + 1;
                    continue;
                }
            };
            // The oldest first: what was given back together comes back in send order.
            let age = |slot| pool.seg.read_sent(slot).seq;
            let Some(held) = pool.seg.core.adopt(B::holder_gone, queued, age) else { continue };
            let hold = SlotHold { pool: pool.seg.clone(), held, shared: None };
            return Some(self.check_adopted(pool, hold, pool_id));
        }
        None
    }

    /// Unlinks the pools this receiver has mapped that are closed (their sender gone) and
    /// drained, and forgets them. A pool normally unlinks itself at the return of its last
    /// slot, but a receiver killed between that return and its look (at
    /// `release_marked`, say) leaves a closed pool with every slot free and nobody to
    /// look again: the kill storms saw such pools stay in `/dev/shm`. Receivers look at
    /// their ticks: one load per mapped pool, and an unlink once. (Where the channel
    /// delivers again, every receiver maps every pool in use at its ticks; without, only a
    /// pool one of them has a message from.)
    pub(super) fn unlink_drained_pools(&self) {
        for (index, cached) in self.pools.borrow_mut().iter_mut().enumerate() {
            let Some(pool) = cached else { continue };
            if pool.seg.is_closed() && pool.seg.core.all_free() {
                pool.seg.unlink_if_drained();
                // Not mapped again by a look for messages to deliver again.
                self.unmapped.borrow_mut()[index] = pool.instance + 1;
                *cached = None;
            }
        }
        // The refused pools too (a dead GPU sender's, never imported), forgotten once
        // drained.
        self.refused.borrow_mut().retain(|(.., seg)| {
            let drained = seg.is_closed() && seg.core.all_free();
            if drained {
                seg.unlink_if_drained();
            }
            !drained
        });
    }

    /// Checks the sent copy of a slot taken over by `redeliver_one`: it must name that
    /// pool, slot and generation, and pass the checks of any descriptor.
    fn check_adopted(
        &self,
        pool: CachedPool<B>,
        hold: SlotHold,
        pool_id: u32,
    ) -> Result<Taken<B>, RecvTimeoutError<B>> {
        let d = pool.seg.read_sent(hold.held.slot);
        if d.pool_id != pool_id
            || d.slot != hold.held.slot
            || d.generation != u64::from(hold.held.generation)
        {
            return Err(corrupt("a held slot's sent copy names another message"));
        }
        let meta = self.check(&pool, &d)?;
        let died = self.note_owner(&hold.pool);
        B::refuse(&hold.pool, died)?;
        // The slot is ours again; a death here leaves it to the next receiver the same way.
        crate::fault::point("redeliver_holding");
        Ok(Taken { imported: pool.imported, hold, desc: d, meta, redelivered: true })
    }

    /// The pool at table row `index`, registration `instance`: cached, or mapped (and
    /// imported) now. A pool refused before its import (a device pool whose sender is gone)
    /// refuses `d`, whose slot is taken, to go back unread once `d` has left the ring (so
    /// that the pool drains).
    pub(super) fn pool_for(
        &self,
        index: u32,
        instance: u32,
        d: &Descriptor,
    ) -> Result<CachedPool<B>, super::Unheld<B>> {
        self.pool_at(index, instance, true).map_err(|(seg, why)| {
            let hold = seg.and_then(|seg| {
                let held = seg.core.receive(d.slot, d.generation).ok()?;
                crate::fault::point("refused_holding");
                Some(SlotHold { pool: seg, held, shared: None })
            });
            (why, hold)
        })
    }

    /// The pool at table row `index`, registration `instance`: cached, or mapped (and
    /// imported) now, waiting for its segment as `wait` says (see `open_pool`). The error
    /// carries the pool when it was mapped and then refused before its import (a device
    /// pool whose sender is gone).
    fn pool_at(&self, index: u32, instance: u32, wait: bool) -> Result<CachedPool<B>, Refused<B>> {
        let mut pools = self.pools.borrow_mut();
        let cached = &mut pools[index as usize];
        if let Some(pool) = cached {
            if pool.instance == instance {
                return Ok(pool.clone());
            }
        }
        // A pool refused before is not mapped again (a refusal is for good: its sender is
        // gone).
        let known = self
            .refused
            .borrow()
            .iter()
            .find(|r| (r.0, r.1) == (index, instance))
            .map(|r| r.2.clone());
        let seg = match known.clone() {
            Some(seg) => seg,
            None => Arc::new(self.channel.open_pool(index, instance, wait).map_err(|e| (None, e))?),
        };
        let died = self.note_owner(&seg);
        // A device pool whose sender has gone is not imported; it is kept until it drains.
        if let Err(why) = B::refuse(&seg, died) {
            if known.is_none() {
                self.refused.borrow_mut().push((index, instance, seg.clone()));
            }
            return Err((Some(seg), why.into()));
        }
        let imported = B::import(&self.channel.ctx, &seg).map_err(|e| (None, e.into()))?;
        let pool = CachedPool { instance, seg, imported };
        *cached = Some(pool.clone());
        Ok(pool)
    }
}
