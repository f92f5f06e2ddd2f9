//! Several tensors in one message: [`PartsWriter`] lays them out in a lease's slot and
//! writes their table into the slot's header; [`Message::parts`] reads the table back,
//! checked. One descriptor, one wait and one release for a whole set of tensors (a state
//! dict, a batch of named inputs).
//!
//! The table, in the header (little-endian): `b"GRP1"`, a `u32` count, then per part a `u64`
//! byte offset in the slot, a `u8` [`DType`] code, a `u8` number of dimensions, 6 zero
//! bytes, and one `u64` per dimension. Parts are C-contiguous and 256-byte aligned, one after
//! another. Everything is checked on the way back: a table that does not parse, or a part
//! that does not lie inside the payload, is [`Corrupted`].

use super::backend::Backend;
use super::lease::{HeaderTooLarge, Lease};
use super::message::Message;
use crate::descriptor::{DType, MAX_DIMS, MetaError, TensorMeta};
use crate::layout::{Corrupted, SLOT_HEADER_SIZE};

const MAGIC: &[u8; 4] = b"GRP1";
/// Parts start at multiples of this many bytes in the slot.
pub const PART_ALIGN: u64 = 256;
const FIXED: usize = 16; // offset, dtype, ndim, padding

/// Why a part could not be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartError {
    /// The slot cannot hold the parts so far and this one.
    SlotFull {
        /// Bytes the parts would need.
        needed: u64,
        /// Bytes the slot holds.
        capacity: u64,
    },
    /// The header cannot hold one more table entry.
    HeaderFull(HeaderTooLarge),
}

impl core::fmt::Display for PartError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PartError::SlotFull { needed, capacity } => write!(
                f,
                "the parts need {needed} bytes, a slot holds {capacity}: make the channel \
                 with larger slots"
            ),
            PartError::HeaderFull(e) => write!(f, "the parts' table does not fit: {e}"),
        }
    }
}

impl std::error::Error for PartError {}

/// Lays several tensors out in a lease's slot and writes their table into its header
/// ([`Lease::parts`]). Each [`push`](Self::push) says where that tensor's bytes go;
/// [`finish`](Self::finish) gives the metadata to send the lease with.
///
/// ```
/// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-parts");
/// use gpuring::{Channel, DType, TensorMeta};
/// let ch = Channel::builder("doc-parts").slots(2, 1 << 16).create()?;
/// let (tx, rx) = (ch.sender()?, ch.receiver()?);
/// let mut lease = tx.acquire()?;
/// let mut parts = lease.parts();
/// let w = parts.push(&TensorMeta::contiguous(DType::F32, &[4, 4])?)?;
/// let b = parts.push(&TensorMeta::contiguous(DType::F32, &[4])?)?;
/// let meta = parts.finish();
/// lease[w as usize..][..64].copy_from_slice(&[0u8; 64]);
/// lease[b as usize..][..16].copy_from_slice(&[1u8; 16]);
/// tx.send(lease, meta)?;
///
/// let msg = rx.recv()?;
/// let got: Vec<_> = msg.parts()?.collect();
/// assert_eq!(got.len(), 2);
/// assert_eq!((got[1].offset, got[1].meta.shape()), (b, &[4u64][..]));
/// assert_eq!(&msg[b as usize..][..16], &[1u8; 16]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PartsWriter<'a, B: Backend> {
    lease: &'a mut Lease<B>,
    count: u32,
    /// Bytes of the header written so far.
    used: usize,
    /// End of the last part in the slot.
    end: u64,
}

/// One tensor of a message sent with parts: where its bytes start in the slot, and what
/// they are (C-contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Byte offset of its first element in the slot (a multiple of [`PART_ALIGN`]).
    pub offset: u64,
    /// Its dtype and shape.
    pub meta: TensorMeta,
}

impl<B: Backend> Lease<B> {
    /// Starts laying several tensors out in this slot (see [`PartsWriter`]); what the
    /// header held is replaced by the table.
    ///
    /// ```
    /// # let _clean = gpuring::internal::RemoveOnDrop::new("doc-lease-parts");
    /// use gpuring::{DType, TensorMeta};
    /// let ch = gpuring::Channel::builder("doc-lease-parts").slots(2, 4096).create()?;
    /// let tx = ch.sender()?;
    /// let mut lease = tx.acquire()?;
    /// let mut parts = lease.parts();
    /// assert_eq!(parts.push(&TensorMeta::contiguous(DType::I32, &[3])?)?, 0);
    /// assert_eq!(parts.push(&TensorMeta::contiguous(DType::I32, &[3])?)?, 256);
    /// let meta = parts.finish();
    /// tx.send(lease, meta)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parts(&mut self) -> PartsWriter<'_, B> {
        let h = self.header_mut();
        h[..4].copy_from_slice(MAGIC);
        h[4..8].fill(0); // the count, written by `finish`
        PartsWriter { lease: self, count: 0, used: 8, end: 0 }
    }
}

impl<B: Backend> PartsWriter<'_, B> {
    /// Adds a C-contiguous tensor of `meta`'s dtype and shape (its strides are not
    /// looked at); returns the byte offset in the slot where its bytes go, 256-byte
    /// aligned after the previous part.
    ///
    /// # Errors
    ///
    /// [`PartError::SlotFull`] when the slot cannot hold it; [`PartError::HeaderFull`]
    /// when the table has no room for it. Nothing is added then.
    pub fn push(&mut self, meta: &TensorMeta) -> Result<u64, PartError> {
        let ndim = meta.shape().len();
        let entry = FIXED + 8 * ndim;
        if self.used + entry > SLOT_HEADER_SIZE {
            return Err(PartError::HeaderFull(HeaderTooLarge { len: self.used + entry }));
        }
        let bytes = meta.numel() * meta.dtype().itemsize();
        let offset = self.end.next_multiple_of(PART_ALIGN);
        let capacity = self.lease.capacity() as u64;
        let needed = offset.saturating_add(bytes);
        if needed > capacity {
            return Err(PartError::SlotFull { needed, capacity });
        }
        let used = self.used;
        let h = &mut self.lease.header_mut()[used..used + entry];
        h[..8].copy_from_slice(&offset.to_le_bytes());
        h[8] = meta.dtype() as u8;
        h[9] = ndim as u8;
        h[10..16].fill(0);
        for (d, n) in meta.shape().iter().enumerate() {
            h[FIXED + 8 * d..FIXED + 8 * d + 8].copy_from_slice(&n.to_le_bytes());
        }
        self.used += entry;
        self.count += 1;
        self.end = needed;
        Ok(offset)
    }

    /// Writes the count and sets the header's length; returns the metadata to send the
    /// lease with (bytes up to the end of the last part).
    pub fn finish(self) -> TensorMeta {
        let count = self.count.to_le_bytes();
        self.lease.header_mut()[4..8].copy_from_slice(&count);
        self.lease.set_header_len(self.used).expect("checked at each push");
        TensorMeta::bytes(self.end)
    }
}

impl<B: Backend> Message<B> {
    /// The tensors of a message sent with [`Lease::parts`], each checked to lie inside
    /// the payload. Reads the header only: no allocation, no copy.
    ///
    /// # Errors
    ///
    /// [`Corrupted`] when the header is not a parts table, or any entry is impossible (an
    /// unknown dtype, more than [`MAX_DIMS`] dimensions, a size that overflows, bytes
    /// outside the payload, a table longer than the header).
    ///
    /// ```
    /// # let _made = gpuring::internal::doc_channel("doc-message-parts", 2)?;
    /// let ch = gpuring::Channel::builder("doc-message-parts").open()?;
    /// let msg = ch.receiver()?.recv()?;
    /// match msg.parts() {
    ///     Ok(parts) => parts.for_each(|p| println!("{:?} at {}", p.meta.shape(), p.offset)),
    ///     Err(e) => println!("not sent with parts: {e}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parts(&self) -> Result<impl Iterator<Item = Part> + '_, Corrupted> {
        let h = self.header();
        if h.len() < 8 || &h[..4] != MAGIC {
            return Err(Corrupted { what: "the message's header is not a parts table" });
        }
        let count = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
        let len = self.len() as u64;
        // Checked whole first, so that the iterator cannot fail.
        let mut at = 8;
        for _ in 0..count {
            at = read_part(h, at, len)?.1;
        }
        let mut at = 8;
        Ok((0..count).map(move |_| {
            let (part, next) = read_part(h, at, len).expect("checked above");
            at = next;
            part
        }))
    }
}

/// The part whose entry starts at `at` in `h`, and where the next entry starts.
fn read_part(h: &[u8], at: usize, payload: u64) -> Result<(Part, usize), Corrupted> {
    let bad = |what| Corrupted { what };
    let fixed = h.get(at..at + FIXED).ok_or(bad("a parts table runs past its header"))?;
    let offset = u64::from_le_bytes(fixed[..8].try_into().expect("8 bytes"));
    let dtype = DType::from_code(fixed[8]).ok_or(bad("a part names an unknown dtype"))?;
    let ndim = fixed[9] as usize;
    if ndim > MAX_DIMS {
        return Err(bad("a part has too many dimensions"));
    }
    let dims = h
        .get(at + FIXED..at + FIXED + 8 * ndim)
        .ok_or(bad("a parts table runs past its header"))?;
    let mut shape = [0u64; MAX_DIMS];
    for (d, s) in shape.iter_mut().take(ndim).enumerate() {
        *s = u64::from_le_bytes(dims[8 * d..8 * d + 8].try_into().expect("8 bytes"));
    }
    let meta = TensorMeta::contiguous(dtype, &shape[..ndim]).map_err(|e| match e {
        MetaError::Overflow => bad("a part's size overflows"),
        _ => bad("a part's metadata is impossible"),
    })?;
    if offset.checked_add(meta.nbytes()).is_none_or(|end| end > payload) {
        return Err(bad("a part lies outside the message's payload"));
    }
    Ok((Part { offset, meta }, at + FIXED + 8 * ndim))
}
