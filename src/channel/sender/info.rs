//! What a [`Sender`] says about itself: its pool's shape and state, its next sequence
//! number, its pool's id and name.

use super::Sender;
use crate::channel::backend::Backend;

impl<B: Backend> Sender<B> {
    /// Slots in this sender's pool.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-slot-count");
    /// let ch = gpuring::Channel::builder("doc-sender-slot-count").slots(4, 1 << 20).create()?;
    /// assert_eq!(ch.sender()?.slot_count(), 4);
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn slot_count(&self) -> u32 {
        self.pool.core.slot_count()
    }

    /// Bytes per slot.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-slot-size");
    /// let ch = gpuring::Channel::builder("doc-sender-slot-size").slots(4, 1 << 20).create()?;
    /// assert_eq!(ch.sender()?.slot_size(), 1 << 20);
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn slot_size(&self) -> usize {
        self.pool.slot_size()
    }

    /// Slots now free in this sender's pool (a snapshot; exact when nothing moves). In a
    /// broadcast channel it first puts back every sent slot that every receiver has passed
    /// and dropped: a message that went out with no receiver attached, or whose last
    /// receiver's drop came before another receiver's cursor passed it, holds its slot
    /// until then (or until an acquire finds no free slot).
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-free-slots");
    /// let ch = gpuring::Channel::builder("doc-sender-free-slots").slots(4, 1 << 20).create()?;
    /// let tx = ch.sender()?;
    /// let lease = tx.acquire()?;
    /// assert_eq!(tx.free_slots(), 3);
    /// # drop(lease);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn free_slots(&self) -> usize {
        if self.channel.flavor == crate::channel::Flavor::Broadcast {
            self.reclaim_broadcast(false);
        }
        self.pool.core.free_slots()
    }

    /// Slots of this sender's pool that receivers hold now: received and not yet dropped
    /// (a snapshot). With [`free_slots`](Self::free_slots), what tells a sender whose
    /// acquire would wait that its receivers keep its messages, rather than not having
    /// taken them yet. A broadcast channel's slots count as sent, never as held.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-held-slots");
    /// let ch = gpuring::Channel::builder("doc-sender-held-slots").slots(4, 4096).create()?;
    /// let (tx, rx) = (ch.sender()?, ch.receiver()?);
    /// tx.send(tx.acquire()?, gpuring::TensorMeta::bytes(8))?;
    /// assert_eq!((tx.free_slots(), tx.held_slots()), (3, 0)); // sent, not yet received
    /// let msg = rx.recv()?;
    /// assert_eq!(tx.held_slots(), 1);
    /// drop(msg);
    /// assert_eq!((tx.free_slots(), tx.held_slots()), (4, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn held_slots(&self) -> usize {
        self.pool.core.held_slots()
    }

    /// The sequence number the next message will carry.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-next-seq");
    /// let ch = gpuring::Channel::builder("doc-sender-next-seq").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// assert_eq!(tx.next_seq(), 0);
    /// tx.send(tx.acquire()?, gpuring::TensorMeta::bytes(0))?;
    /// assert_eq!(tx.next_seq(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn next_seq(&self) -> u64 {
        self.seq.get()
    }

    /// This sender's pool id, as descriptors carry it.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-pool-id");
    /// let ch = gpuring::Channel::builder("doc-sender-pool-id").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// assert_eq!(tx.pool_id() & 0xFFFF, 0); // the pool table's first entry
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn pool_id(&self) -> u32 {
        self.pool_id
    }

    /// The pool segment's name.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-sender-pool-name");
    /// let ch = gpuring::Channel::builder("doc-sender-pool-name").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// assert!(tx.pool_name().starts_with("/doc-sender-pool-name."));
    /// # Ok::<(), gpuring::ChannelError>(())
    /// ```
    pub fn pool_name(&self) -> &str {
        self.pool.name()
    }
}
