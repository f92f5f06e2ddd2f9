//! Where a channel's slots live, as a type parameter: [`Host`] (shared memory, the
//! default), and, from the GPU wing (`crate::cuda`, feature `cuda`), `Cuda` (device memory)
//! and `Pinned` (host memory registered with CUDA).
//!
//! A `Channel<B>`, `Sender<B>`, `Receiver<B>`, `Lease<B>` and `Message<B>` are written
//! once; what differs between backends is the sealed trait below: how a sender makes its
//! pool, holds its ring and lets them go, how a lease reaches its slot, how a receiver
//! imports a pool, checks a descriptor's backend fields and turns a taken slot into a
//! message. The generic channel code knows nothing else of a backend; a host call on a GPU
//! channel (or the reverse) does not compile, and opening a channel with the wrong backend
//! is a typed error at `open` ([`ChannelError::WrongBackend`](super::ChannelError::WrongBackend)).

use std::cell::RefCell;
use std::convert::Infallible;
use std::ptr::NonNull;
use std::sync::Arc;

use super::producer::ProducerRing;
use crate::descriptor::Descriptor;
use crate::layout::{BACKEND_HOST, Corrupted};
use crate::pool::{PoolSegment, PoolSegmentError, SlotHold, SlotRef};
use crate::wait::WaitPolicy;

/// Where a channel's slots live: [`Host`], or (feature `cuda`) `Cuda` and `Pinned`.
/// Sealed: the crate defines the ones there are.
///
/// The backend is part of every channel type, so a host call on a GPU channel does not
/// compile (and opening a channel with the other backend's builder is a typed error):
///
/// ```compile_fail
/// fn first_byte(msg: &gpuring::Message<gpuring::Cuda>) -> u8 {
///     msg[0] // device memory: a GPU message does not deref to bytes
/// }
/// ```
///
/// Generic code over every backend takes `B: Backend`:
///
/// ```
/// fn describe<B: gpuring::Backend>(rx: &gpuring::Receiver<B>) -> String {
///     format!("{rx:?}")
/// }
/// ```
pub trait Backend: sealed::Backend {}

impl<B: sealed::Backend> Backend for B {}

/// The backends whose slots are host memory ([`Host`], and `Pinned` with feature `cuda`):
/// their leases and messages deref to the slot's bytes. Sealed.
///
/// ```
/// fn checksum<B: gpuring::HostMemory>(msg: &gpuring::Message<B>) -> u32 {
///     msg.iter().map(|&b| u32::from(b)).sum()
/// }
/// ```
pub trait HostMemory: sealed::HostMemory {}

impl<B: sealed::HostMemory> HostMemory for B {}

pub(crate) mod sealed {
    use super::*;

    /// What a backend provides to the generic channel code. See the module docs.
    pub trait Backend: Sized + Send + Sync + core::fmt::Debug + 'static {
        /// The code the channel header and pool table record.
        const CODE: u32;
        /// How errors name it.
        const NAME: &'static str;
        /// What its own calls fail with ([`Infallible`] for host memory).
        type Error: std::error::Error + Clone + Send + Sync + 'static;
        /// What a channel handle of this backend carries (a CUDA stream, a context).
        type Context: Clone + core::fmt::Debug + Send + Sync;
        /// What making a sender's pool makes besides its segment (the device allocation).
        type Made: Send;
        /// What a sender owns: its ring's producer end and what the backend made.
        type Sending: HoldsRing + Send;
        /// What a receiver owns besides its ring's consumer end (its stream).
        type Receiving: Send;
        /// What a receiver keeps per pool it has seen (the imported allocation).
        type Imported: Clone + core::fmt::Debug;
        /// What a lease holds to reach its slot.
        type LeaseSlot: core::fmt::Debug + Send;
        /// What a message holds to reach its slot; dropped before the slot goes back.
        type MessageSlot: core::fmt::Debug + Send;

        /// Makes a sender's pool: the segment `name` with `slot_count` slots of `slot_size`
        /// bytes, and what else the backend needs.
        fn create_pool(
            ctx: &Self::Context,
            name: &str,
            slot_count: u32,
            slot_size: u64,
        ) -> Result<(PoolSegment, Self::Made), Unmade<Self::Error>>;

        /// What the sender owns, from its ring's producer end and what `create_pool` made.
        fn sending(ctx: &Self::Context, ring: ProducerRing, made: Self::Made) -> Self::Sending;

        /// The sender leaves: its pool is closed ([`PoolSegment::close`]), in the order
        /// the backend needs around its own departure.
        fn leave(sending: &mut Self::Sending, pool: &PoolSegment);

        /// Whether a slot held by a receiver whose liveness lock is gone (its process
        /// `pid` died) may be reused now. Host memory: at once (the holder runs no more
        /// code, and its copies, if any, went with its process).
        fn holder_gone(pid: u32) -> bool {
            let _ = pid;
            true
        }

        /// What a new lease of `slot` in `pool` holds, after the backend's own steps (a
        /// stream's wait for the slot's last reader). On an error the slot goes back.
        fn lease(
            sending: &Self::Sending,
            pool: &Arc<PoolSegment>,
            slot: SlotRef,
        ) -> Result<Self::LeaseSlot, Self::Error>;

        /// Writes the descriptor's backend fields for a send of `lease`'s slot `slot`
        /// (after enqueueing what the send needs on the device). Host memory: none.
        fn fill(lease: &Self::LeaseSlot, slot: u32, d: &mut Descriptor) -> Result<(), Self::Error> {
            let _ = (lease, slot, d);
            Ok(())
        }

        /// What a new receiver owns besides its ring.
        fn receiving(ctx: &Self::Context) -> Self::Receiving;

        /// A receiver sees pool `seg` for the first time.
        fn import(
            ctx: &Self::Context,
            seg: &Arc<PoolSegment>,
        ) -> Result<Self::Imported, Refused<Self::Error>>;

        /// The checks of a descriptor's backend fields against its pool, after the common
        /// ones and before the slot is taken. Host memory: it names no device.
        fn check(imported: &Self::Imported, d: &Descriptor) -> Result<(), Corrupted> {
            let _ = imported;
            check_host(d)
        }

        /// Whether messages of pool `seg` are refused, unread: before the pool is imported,
        /// and after each slot is taken; `owner_died` is what the pool's owner word said
        /// (read once by the receiver). Host memory outlives its sender (never); device
        /// memory does not (a retired pool, or a sender that died).
        fn refuse(seg: &PoolSegment, owner_died: bool) -> Result<(), Refused<Self::Error>> {
            let _ = (seg, owner_died);
            Ok(())
        }

        /// What a message of the slot `hold` holds, described by `d` (checked), once the
        /// backend's steps are done (a stream's wait for the sender's writes); `policy` is
        /// how the receiver waits. On an error the slot goes back unread (with `hold`).
        fn deliver(
            receiving: &Self::Receiving,
            imported: &Self::Imported,
            hold: &SlotHold,
            d: &Descriptor,
            policy: WaitPolicy,
        ) -> Result<Self::MessageSlot, Refused<Self::Error>>;

        /// A message goes: what it held of its slot, then its hold (the slot goes back, or
        /// a broadcast reader's hold on it). By default both now, in that order.
        fn release(slot: Self::MessageSlot, hold: SlotHold) {
            drop(slot);
            drop(hold);
        }

        /// A message about to be put back in its channel (`Receiver::requeue`): waits
        /// until this receiver's reads of the slot are done, and makes the slot's drop
        /// signal nothing (the receiver that takes the message over signals the slot's
        /// release after its own reads). Host memory: nothing to wait for.
        fn settle(slot: &mut Self::MessageSlot) -> Result<(), Self::Error> {
            let _ = slot;
            Ok(())
        }

        /// A receiver that imported this pool is being dropped.
        fn receiver_gone(imported: &Self::Imported) {
            let _ = imported;
        }
    }

    /// A backend whose slots are host memory.
    pub trait HostMemory: Backend {
        /// The slot's bytes a lease holds.
        fn lease_bytes(slot: &Self::LeaseSlot) -> &HostSlot;
        /// The payload's bytes a message holds.
        fn message_bytes(slot: &Self::MessageSlot) -> &HostSlot;
    }

    /// How a sender reaches its ring's producer end: alone, or shared with the threads
    /// that publish its stream-ordered sends.
    pub trait HoldsRing {
        /// Runs `f` on the producer end; never nested (no `f` calls back into the holder).
        fn with_ring<R>(&self, f: impl FnOnce(&mut ProducerRing) -> R) -> R;
    }
}

/// Why a backend could not make a sender's pool (the channel says it as `ChannelError`).
#[derive(Debug)]
pub enum Unmade<E> {
    /// The pool segment.
    Pool(PoolSegmentError),
    /// The backend's own part.
    Device(E),
}

impl<E> From<PoolSegmentError> for Unmade<E> {
    fn from(e: PoolSegmentError) -> Self {
        Unmade::Pool(e)
    }
}

/// Why a backend refused a message, or its pool (the receiver says it as `RecvError`).
#[derive(Debug)]
pub enum Refused<E> {
    /// A value in the pool segment is impossible.
    Corrupted(Corrupted),
    /// A call of the backend failed.
    Device(E),
    /// The message's sender has left, and its memory with it.
    SenderGone,
    /// The message's sender has died before the message was complete.
    PeerDead,
}

/// A producer end used by its sender's thread alone (a `Sender` is not `Sync`).
#[derive(Debug)]
pub struct OwnedRing(RefCell<ProducerRing>);

impl OwnedRing {
    pub(crate) fn new(ring: ProducerRing) -> Self {
        Self(RefCell::new(ring))
    }
}

impl sealed::HoldsRing for OwnedRing {
    fn with_ring<R>(&self, f: impl FnOnce(&mut ProducerRing) -> R) -> R {
        f(&mut self.0.borrow_mut())
    }
}

/// Slots in host shared memory: the default backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host;

/// A host slot's bytes, inside the pool's mapping (kept alive by the lease or message).
#[derive(Debug)]
pub struct HostSlot {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
}

// SAFETY: the bytes of one slot, which the lease protocol gives to one holder at a time;
// nothing in it is tied to a thread.
unsafe impl Send for HostSlot {}
// SAFETY: shared references give only `&[u8]` (see `Lease` and `Message`).
unsafe impl Sync for HostSlot {}

impl HostSlot {
    /// The bytes of `slot` in `pool` (a host pool), all of them.
    pub(crate) fn of_slot(pool: &PoolSegment, slot: u32) -> Self {
        Self { ptr: pool.slot_ptr(slot), len: pool.slot_size() }
    }

    /// The payload `d` describes in the slot `hold` holds (`byte_offset + len` checked
    /// against the slot by the receiver).
    pub(crate) fn of_payload(hold: &SlotHold, d: &Descriptor) -> Self {
        debug_assert!(d.byte_offset + d.len <= hold.pool.slot_size() as u64);
        // SAFETY: byte_offset + len <= slot_size (checked in `check_and_hold`), inside the
        // slot.
        let ptr = unsafe { hold.pool.slot_ptr(hold.held.slot).add(d.byte_offset as usize) };
        Self { ptr, len: d.len as usize }
    }
}

/// The descriptor checks of host memory: no device named.
fn check_host(d: &Descriptor) -> Result<(), Corrupted> {
    if d.device_ordinal != -1 {
        return Err(Corrupted { what: "descriptor names a device, the pool is host memory" });
    }
    Ok(())
}

impl sealed::Backend for Host {
    const CODE: u32 = BACKEND_HOST;
    const NAME: &'static str = "host";
    type Error = Infallible;
    type Context = ();
    type Made = ();
    type Sending = OwnedRing;
    type Receiving = ();
    type Imported = ();
    type LeaseSlot = HostSlot;
    type MessageSlot = HostSlot;

    fn create_pool(
        _: &(),
        name: &str,
        slot_count: u32,
        slot_size: u64,
    ) -> Result<(PoolSegment, ()), Unmade<Infallible>> {
        let pool = PoolSegment::create(name, BACKEND_HOST, slot_count, slot_size, |_, _| {})?;
        Ok((pool, ()))
    }

    fn sending(_: &(), ring: ProducerRing, _: ()) -> OwnedRing {
        OwnedRing::new(ring)
    }

    fn leave(_: &mut OwnedRing, pool: &PoolSegment) {
        pool.close();
    }

    fn lease(
        _: &OwnedRing,
        pool: &Arc<PoolSegment>,
        slot: SlotRef,
    ) -> Result<HostSlot, Infallible> {
        Ok(HostSlot::of_slot(pool, slot.slot))
    }

    fn receiving(_: &()) {}

    fn import(_: &(), _: &Arc<PoolSegment>) -> Result<(), Refused<Infallible>> {
        Ok(())
    }

    fn deliver(
        _: &(),
        _: &(),
        hold: &SlotHold,
        d: &Descriptor,
        _: WaitPolicy,
    ) -> Result<HostSlot, Refused<Infallible>> {
        Ok(HostSlot::of_payload(hold, d))
    }
}

impl sealed::HostMemory for Host {
    fn lease_bytes(slot: &HostSlot) -> &HostSlot {
        slot
    }

    fn message_bytes(slot: &HostSlot) -> &HostSlot {
        slot
    }
}
