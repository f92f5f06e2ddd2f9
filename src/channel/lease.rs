//! [`Lease`]: a slot a sender has taken from its pool, being written.

use std::ops::{Deref, DerefMut};

use super::backend::sealed;
use super::backend::{Backend, Host, HostMemory};
use crate::layout::SLOT_HEADER_SIZE;
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

/// A header longer than a slot's header area ([`SLOT_HEADER_SIZE`] bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderTooLarge {
    /// The length asked for.
    pub len: usize,
}

impl core::fmt::Display for HeaderTooLarge {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "a header of {} bytes does not fit: a slot's header holds {SLOT_HEADER_SIZE} (put \
             the rest in the slot itself)",
            self.len
        )
    }
}

impl std::error::Error for HeaderTooLarge {}

impl<B: Backend> Lease<B> {
    /// The slot's header: [`SLOT_HEADER_SIZE`] bytes of host memory beside the slot, for
    /// every backend (a GPU slot's header is host shared memory too), to write in place.
    /// The message carries the first [`set_header_len`](Self::set_header_len) bytes of
    /// it (none unless set); the receiver reads them as
    /// [`Message::header`](crate::Message::header). What to put there: anything the
    /// receiver's CPU needs before it touches the payload, such as where several tensors
    /// sit in the slot, or a serialized object whose tensors the slot holds.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-header-mut");
    /// let ch = gpuring::Channel::builder("doc-lease-header-mut").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// let mut lease = tx.acquire()?;
    /// lease.header_mut()[..3].copy_from_slice(b"v=1");
    /// lease.set_header_len(3)?;
    /// tx.send(lease, gpuring::TensorMeta::bytes(0))?;
    /// let msg = ch.receiver()?.recv()?;
    /// assert_eq!(msg.header(), b"v=1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn header_mut(&mut self) -> &mut [u8] {
        let pool = self.hold.pool.as_ref().expect("a live lease has its pool");
        let ptr = pool.header_ptr(self.hold.slot.slot);
        // (A hostile process with the pool mapped could still write: crate docs, Safety.)
        // SAFETY: the slot's header, SLOT_HEADER_SIZE bytes inside the mapping the lease's
        // pool keeps alive; the lease protocol makes this process its only user until the
        // lease is sent, and `&mut self` the only view in this process.
        unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), SLOT_HEADER_SIZE) }
    }

    /// How many bytes of [`header_mut`](Self::header_mut) the message carries.
    ///
    /// # Errors
    ///
    /// [`HeaderTooLarge`] above [`SLOT_HEADER_SIZE`] (the length is left as it was).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-set-header-len");
    /// let ch = gpuring::Channel::builder("doc-lease-set-header-len").slots(2, 4096).create()?;
    /// let mut lease = ch.sender()?.acquire()?;
    /// assert!(lease.set_header_len(gpuring::SLOT_HEADER_SIZE + 1).is_err());
    /// lease.set_header_len(16)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_header_len(&mut self, len: usize) -> Result<(), HeaderTooLarge> {
        if len > SLOT_HEADER_SIZE {
            return Err(HeaderTooLarge { len });
        }
        self.hold.header_len = len as u32;
        Ok(())
    }

    /// How many bytes of the header the message carries (0 unless set).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-header-len");
    /// let ch = gpuring::Channel::builder("doc-lease-header-len").slots(2, 4096).create()?;
    /// let mut lease = ch.sender()?.acquire()?;
    /// assert_eq!(lease.header_len(), 0);
    /// lease.set_header(b"abc")?;
    /// assert_eq!(lease.header_len(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn header_len(&self) -> usize {
        self.hold.header_len as usize
    }

    /// Copies `bytes` into the slot's header, as the header the message carries.
    ///
    /// # Errors
    ///
    /// [`HeaderTooLarge`] when `bytes` is longer than [`SLOT_HEADER_SIZE`] (nothing is
    /// written).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-set-header");
    /// let ch = gpuring::Channel::builder("doc-lease-set-header").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// let mut lease = tx.acquire()?;
    /// lease.set_header(b"frame 17")?;
    /// tx.send(lease, gpuring::TensorMeta::bytes(0))?;
    /// assert_eq!(ch.receiver()?.recv()?.header(), b"frame 17");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_header(&mut self, bytes: &[u8]) -> Result<(), HeaderTooLarge> {
        if bytes.len() > SLOT_HEADER_SIZE {
            return Err(HeaderTooLarge { len: bytes.len() });
        }
        self.header_mut()[..bytes.len()].copy_from_slice(bytes);
        self.set_header_len(bytes.len())
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
