//! [`Lease`]: a slot a sender has taken from its pool, being written.

use std::ops::{Deref, DerefMut};

use super::backend::sealed;
use super::backend::{Backend, Host, HostMemory};
use crate::pool::SlotLease;

/// A leased slot: write it in place, then [`Sender::send`](crate::Sender::send) it. Dropping a lease without
/// sending it returns the slot to the pool.
///
/// A lease of host memory (`Lease`, `Lease<Host>`, `Lease<Pinned>`) derefs to the slot's
/// bytes; a GPU lease (`Lease<Cuda>`) gives the slot's device address, to be written in the
/// order of the stream it was taken on.
///
/// ```
/// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-fmt");
/// use gpuring::{Channel, TensorMeta};
/// let ch = Channel::builder("doc-lease-fmt").slots(2, 4096).create()?;
/// let tx = ch.sender()?;
/// let mut lease = tx.acquire()?;
/// lease[..5].copy_from_slice(b"hello");
/// lease.set_tag(42); // travels in the descriptor
/// tx.send(lease, TensorMeta::bytes(5))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Lease<B: Backend = Host> {
    pub(crate) hold: SlotLease,
    pub(crate) slot: B::LeaseSlot,
}

impl<B: Backend> core::fmt::Debug for Lease<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Lease")
            .field("slot", &self.hold.slot.slot)
            .field("generation", &self.hold.slot.generation)
            .field("tag", &self.hold.tag)
            .field("memory", &self.slot)
            .finish()
    }
}

impl<B: Backend> Lease<B> {
    pub(super) fn new(hold: SlotLease, slot: B::LeaseSlot) -> Self {
        Self { hold, slot }
    }

    /// Slot index in the pool.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-slot");
    /// let ch = gpuring::Channel::builder("doc-lease-slot").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// assert!(tx.acquire()?.slot() < tx.slot_count());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot(&self) -> u32 {
        self.hold.slot.slot
    }

    /// This lease's generation of the slot (bumped at every lease of it).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-generation");
    /// let ch = gpuring::Channel::builder("doc-lease-generation").slots(1, 4096).create()?;
    /// let tx = ch.sender()?;
    /// let first = tx.acquire()?.generation(); // dropped unsent: the slot goes back
    /// assert_eq!(tx.acquire()?.generation(), first + 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn generation(&self) -> u32 {
        self.hold.slot.generation
    }

    /// Bytes the slot holds.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-capacity");
    /// let ch = gpuring::Channel::builder("doc-lease-capacity").slots(8, 4096).create()?;
    /// assert_eq!(ch.sender()?.acquire()?.capacity(), 4096);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.hold.pool.as_ref().map_or(0, |p| p.slot_size())
    }

    /// Sets the application tag the descriptor will carry.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-set-tag");
    /// let ch = gpuring::Channel::builder("doc-lease-set-tag").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// let mut lease = tx.acquire()?;
    /// lease.set_tag(7); // the receiver reads it as `msg.tag()`
    /// tx.send(lease, gpuring::TensorMeta::bytes(0))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_tag(&mut self, tag: u64) {
        self.hold.tag = tag;
    }
}

impl<B: HostMemory> Deref for Lease<B> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let slot = <B as sealed::HostMemory>::lease_bytes(&self.slot);
        // (A hostile process with the pool mapped could still write: crate docs, Safety.)
        // SAFETY: `len` bytes of the slot inside the mapping the lease keeps alive; the
        // lease protocol makes this process the slot's only user until it is sent.
        unsafe { std::slice::from_raw_parts(slot.ptr.as_ptr(), slot.len) }
    }
}

impl<B: HostMemory> DerefMut for Lease<B> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let slot = <B as sealed::HostMemory>::lease_bytes(&self.slot);
        // SAFETY: as in `deref`; `&mut self` makes this the only view in this process.
        unsafe { std::slice::from_raw_parts_mut(slot.ptr.as_ptr(), slot.len) }
    }
}
