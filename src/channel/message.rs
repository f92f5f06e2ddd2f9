//! What a receive hands out: [`Message`], a received slot, read in place and returned on
//! drop.

use std::mem::ManuallyDrop;
use std::ops::Deref;

use super::backend::sealed;
use super::backend::{Backend, Host, HostMemory};
use crate::descriptor::{Descriptor, TensorMeta};
use crate::pool::SlotHold;

/// A received message: its metadata and a view of its slot, read in place. Dropping it
/// returns the slot to the sender's pool (and wakes the sender if it waits for one).
///
/// A message of host memory (`Message`, `Message<Host>`, `Message<Pinned>`) derefs to the
/// payload's bytes; a GPU message (`Message<Cuda>`) gives the payload's device address,
/// valid in the order of the stream it was received on.
///
/// ```
/// # let _made = gpuring::internal::doc_channel("doc-message-fmt", 2)?;
/// use gpuring::Channel;
/// let ch = Channel::builder("doc-message-fmt").open()?;
/// let rx = ch.receiver()?;
/// let msg = rx.recv()?;
/// let first = f32::from_le_bytes(msg[..4].try_into()?);
/// assert_eq!(msg.meta().nbytes(), msg.len() as u64);
/// println!("{first}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Message<B: Backend = Host> {
    // Both given up by the backend when the message goes (`Backend::release`): by default
    // the slot's view first (a GPU message records its release event), then the hold.
    pub(crate) slot: ManuallyDrop<B::MessageSlot>,
    pub(crate) hold: ManuallyDrop<SlotHold>,
    desc: Descriptor,
    meta: TensorMeta,
    redelivered: bool,
}

impl<B: Backend> core::fmt::Debug for Message<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Message")
            .field("seq", &self.desc.seq)
            .field("tag", &self.desc.tag)
            .field("pool_id", &self.desc.pool_id)
            .field("slot", &self.hold.held.slot)
            .field("generation", &self.hold.held.generation)
            .field("meta", &self.meta)
            .field("redelivered", &self.redelivered)
            .field("memory", &*self.slot)
            .finish()
    }
}

impl<B: Backend> Drop for Message<B> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the message is not used again.
        let (slot, hold) =
            unsafe { (ManuallyDrop::take(&mut self.slot), ManuallyDrop::take(&mut self.hold)) };
        B::release(slot, hold);
    }
}

impl<B: Backend> Message<B> {
    pub(super) fn new(
        hold: SlotHold,
        desc: Descriptor,
        meta: TensorMeta,
        slot: B::MessageSlot,
        redelivered: bool,
    ) -> Self {
        Self {
            slot: ManuallyDrop::new(slot),
            hold: ManuallyDrop::new(hold),
            desc,
            meta,
            redelivered,
        }
    }

    /// The message as its parts, the slot not returned: for the backends' own ways of
    /// giving it back (after a stream's work).
    pub(crate) fn into_parts(self) -> (B::MessageSlot, SlotHold) {
        let mut parts = ManuallyDrop::new(self);
        // SAFETY: `parts` is never dropped or used again: each field is taken once (the
        // others own nothing to drop).
        unsafe { (ManuallyDrop::take(&mut parts.slot), ManuallyDrop::take(&mut parts.hold)) }
    }

    /// The tensor metadata (checked).
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-meta", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-meta").open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// println!("{:?} of {:?}", msg.meta().shape(), msg.meta().dtype());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The sender's sequence number (0, 1, 2, ... per sender).
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-seq", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-seq").open()?;
    /// let rx = ch.receiver()?;
    /// let (a, b) = (rx.recv()?, rx.recv()?);
    /// assert_eq!(b.seq(), a.seq() + 1); // one sender: in order
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seq(&self) -> u64 {
        self.desc.seq
    }

    /// Whether this message was delivered before, to a receiver that died holding it
    /// (see [`ChannelBuilder::redeliver`](crate::ChannelBuilder::redeliver)): that receiver
    /// may have acted on it. Such a message comes before the ones queued behind it, and may
    /// come after later messages of its sender that other receivers took meanwhile.
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-redelivered", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-redelivered").open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// if msg.redelivered() {
    ///     println!("message {} again: a receiver died holding it", msg.seq());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }

    /// The application tag the sender set ([`Lease::set_tag`](crate::Lease::set_tag)).
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-tag", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-tag").open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// println!("tag {}", msg.tag());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tag(&self) -> u64 {
        self.desc.tag
    }

    /// Bytes of payload.
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-len", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-len").open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// assert_eq!(msg.len() as u64, msg.meta().nbytes());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.desc.len as usize
    }

    /// Whether the payload is empty.
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-is-empty", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-is-empty").open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// assert_eq!(msg.is_empty(), msg.len() == 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.desc.len == 0
    }

    /// The header the sender wrote beside the payload
    /// ([`Lease::set_header`](crate::Lease::set_header)): host memory for every backend,
    /// empty unless the sender set one. Its length was checked against the header area
    /// when the message was received; its bytes are the sender's, as the payload's are.
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-header", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-header").open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// println!("{} header bytes", msg.header().len());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn header(&self) -> &[u8] {
        let ptr = self.hold.pool.header_ptr(self.hold.held.slot);
        // (A hostile process with the pool mapped could still write: crate docs, Safety.)
        // SAFETY: `header_len` (checked ≤ SLOT_HEADER_SIZE in `check_and_hold`) bytes of
        // the slot's header, inside the mapping the held pool keeps alive; this message
        // holds the slot, so its sender does not write it until the message drops.
        unsafe { std::slice::from_raw_parts(ptr.as_ptr(), self.desc.header_len as usize) }
    }

    /// The descriptor as it arrived (already validated).
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-descriptor", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-descriptor").open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// assert_eq!(msg.descriptor().seq, msg.seq());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }
}

impl<B: HostMemory> Deref for Message<B> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let slot = <B as sealed::HostMemory>::message_bytes(&self.slot);
        // SAFETY: `len` bytes from `ptr` lie inside the slot (checked in `check_and_hold`),
        // in a mapping the pool keeps alive; this message holds the slot until it drops.
        unsafe { std::slice::from_raw_parts(slot.ptr.as_ptr(), slot.len) }
    }
}

/// Why [`Receiver::requeue`](crate::Receiver::requeue) did not put a message back in its
/// channel; each variant gives the message back, held as before (boxed: a message is
/// some 600 bytes, and this is no hot path).
#[derive(Debug)]
#[non_exhaustive]
pub enum RequeueError<B: Backend = Host> {
    /// The channel does not deliver messages again: made with
    /// [`redeliver(false)`](crate::ChannelBuilder::redeliver), or a broadcast channel
    /// (where each receiver has a delivery of its own).
    NoRedelivery(Box<Message<B>>),
    /// The message was received by another receiver: put it back through that one.
    NotReceivedHere(Box<Message<B>>),
    /// GPU channels: waiting for this receiver's reads of the slot failed.
    Device(Box<Message<B>>, B::Error),
}

impl<B: Backend> RequeueError<B> {
    /// The message, still held by this receiver.
    pub fn into_message(self) -> Message<B> {
        match self {
            RequeueError::NoRedelivery(m)
            | RequeueError::NotReceivedHere(m)
            | RequeueError::Device(m, _) => *m,
        }
    }
}

impl<B: Backend> core::fmt::Display for RequeueError<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RequeueError::NoRedelivery(_) => f.write_str(
                "the channel does not deliver messages again (redeliver(false), or broadcast)",
            ),
            RequeueError::NotReceivedHere(_) => {
                f.write_str("the message was received by another receiver")
            }
            RequeueError::Device(_, e) => e.fmt(f),
        }
    }
}

impl<B: Backend> std::error::Error for RequeueError<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RequeueError::Device(_, e) => e.source(),
            _ => None,
        }
    }
}
