//! What travels through a ring: the fixed-size [`Descriptor`], and the tensor metadata it
//! carries ([`DType`], [`TensorMeta`]).
//!
//! A descriptor is plain bytes (`bytemuck::Pod`): it is copied into a ring cell by the
//! producer and out of it by the consumer, and the consumer must treat every field as
//! untrusted. [`Descriptor::meta`] is the checked way back to a [`TensorMeta`].
//!
//! This module depends on nothing else in the crate.

use bytemuck::{Pod, Zeroable};

/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 8;

/// Element types, with DLPack-compatible codes ([`DType::dlpack`]).
///
/// The discriminant is the wire code in [`Descriptor::dtype`]; 0 is reserved for "none",
/// so a zeroed descriptor carries no valid dtype.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// Boolean, one byte.
    Bool = 1,
    /// Unsigned 8-bit integer.
    U8 = 2,
    /// Signed 8-bit integer.
    I8 = 3,
    /// Unsigned 16-bit integer.
    U16 = 4,
    /// Signed 16-bit integer.
    I16 = 5,
    /// Unsigned 32-bit integer.
    U32 = 6,
    /// Signed 32-bit integer.
    I32 = 7,
    /// Unsigned 64-bit integer.
    U64 = 8,
    /// Signed 64-bit integer.
    I64 = 9,
    /// IEEE half precision.
    F16 = 10,
    /// bfloat16.
    BF16 = 11,
    /// IEEE single precision.
    F32 = 12,
    /// IEEE double precision.
    F64 = 13,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, finite only (`float8_e4m3fn`).
    F8E4M3Fn = 14,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits (`float8_e5m2`).
    F8E5M2 = 15,
    /// Complex of two `f32`.
    C64 = 16,
    /// Complex of two `f64`.
    C128 = 17,
}

/// A DLPack `DLDataType`: type code, bits per lane, lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DlDataType {
    /// `DLDataTypeCode` (0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool, 10 e4m3fn,
    /// 12 e5m2).
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

const ALL_DTYPES: [DType; 17] = [
    DType::Bool,
    DType::U8,
    DType::I8,
    DType::U16,
    DType::I16,
    DType::U32,
    DType::I32,
    DType::U64,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::F8E4M3Fn,
    DType::F8E5M2,
    DType::C64,
    DType::C128,
];

impl DType {
    /// Decodes a wire code; `None` for 0 and unknown codes.
    ///
    /// ```
    /// use gpuring::DType;
    /// assert_eq!(DType::from_code(DType::F32 as u8), Some(DType::F32));
    /// assert_eq!(DType::from_code(0), None);
    /// ```
    pub fn from_code(code: u8) -> Option<Self> {
        ALL_DTYPES.iter().copied().find(|d| *d as u8 == code)
    }

    /// Size of one element in bytes.
    pub const fn itemsize(self) -> u64 {
        match self {
            DType::Bool | DType::U8 | DType::I8 | DType::F8E4M3Fn | DType::F8E5M2 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The DLPack data type.
    ///
    /// ```
    /// use gpuring::DType;
    /// let t = DType::BF16.dlpack();
    /// assert_eq!((t.code, t.bits, t.lanes), (4, 16, 1));
    /// ```
    pub const fn dlpack(self) -> DlDataType {
        let (code, bits) = match self {
            DType::Bool => (6, 8),
            DType::U8 => (1, 8),
            DType::I8 => (0, 8),
            DType::U16 => (1, 16),
            DType::I16 => (0, 16),
            DType::U32 => (1, 32),
            DType::I32 => (0, 32),
            DType::U64 => (1, 64),
            DType::I64 => (0, 64),
            DType::F16 => (2, 16),
            DType::BF16 => (4, 16),
            DType::F32 => (2, 32),
            DType::F64 => (2, 64),
            DType::F8E4M3Fn => (10, 8),
            DType::F8E5M2 => (12, 8),
            DType::C64 => (5, 64),
            DType::C128 => (5, 128),
        };
        DlDataType { code, bits, lanes: 1 }
    }

    /// The dtype for a DLPack data type, if gpuring knows it (scalars only).
    pub fn from_dlpack(t: DlDataType) -> Option<Self> {
        ALL_DTYPES.iter().copied().find(|d| d.dlpack() == t)
    }
}

/// Why tensor metadata was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetaError {
    /// More than [`MAX_DIMS`] dimensions.
    TooManyDims {
        /// The number asked for.
        ndim: usize,
    },
    /// Shape and strides have different lengths.
    StridesLength {
        /// Dimensions in the shape.
        shape: usize,
        /// Entries in the strides.
        strides: usize,
    },
    /// A negative stride (not supported).
    NegativeStride {
        /// The dimension.
        dim: usize,
    },
    /// Element count × stride × itemsize does not fit in 64 bits.
    Overflow,
    /// A dtype code that names no [`DType`].
    UnknownDType {
        /// The code found.
        code: u8,
    },
}

impl core::fmt::Display for MetaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MetaError::TooManyDims { ndim } => {
                write!(f, "{ndim} dimensions, at most {MAX_DIMS} are supported")
            }
            MetaError::StridesLength { shape, strides } => {
                write!(f, "shape has {shape} dimensions but strides has {strides}")
            }
            MetaError::NegativeStride { dim } => write!(f, "negative stride in dimension {dim}"),
            MetaError::Overflow => write!(f, "tensor size overflows 64 bits"),
            MetaError::UnknownDType { code } => write!(f, "unknown dtype code {code}"),
        }
    }
}

impl std::error::Error for MetaError {}

/// A tensor's element type, shape and strides (in elements), checked on construction.
///
/// ```
/// use gpuring::{DType, TensorMeta};
/// let m = TensorMeta::contiguous(DType::F16, &[4, 1024, 1024])?;
/// assert_eq!(m.strides(), &[1024 * 1024, 1024, 1]);
/// assert_eq!(m.nbytes(), 4 * 1024 * 1024 * 2);
/// assert!(TensorMeta::contiguous(DType::F32, &[u64::MAX, 2]).is_err());
/// # Ok::<(), gpuring::MetaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMeta {
    dtype: DType,
    ndim: u8,
    shape: [u64; MAX_DIMS],
    strides: [u64; MAX_DIMS],
    /// Bytes spanned from the first element to the end of the last.
    nbytes: u64,
}

impl TensorMeta {
    /// A row-major (C-contiguous) tensor of `shape`.
    ///
    /// # Errors
    ///
    /// [`MetaError::TooManyDims`] beyond [`MAX_DIMS`]; [`MetaError::Overflow`] when the
    /// byte size does not fit in a `u64`.
    pub fn contiguous(dtype: DType, shape: &[u64]) -> Result<Self, MetaError> {
        if shape.len() > MAX_DIMS {
            return Err(MetaError::TooManyDims { ndim: shape.len() });
        }
        let mut strides = [0u64; MAX_DIMS];
        let mut step = 1u64;
        for d in (0..shape.len()).rev() {
            strides[d] = step;
            step = step.checked_mul(shape[d]).ok_or(MetaError::Overflow)?;
        }
        Self::strided(dtype, shape, &strides[..shape.len()])
    }

    /// A tensor of `shape` with explicit `strides` (in elements, non-negative).
    ///
    /// # Errors
    ///
    /// [`MetaError::TooManyDims`], [`MetaError::StridesLength`], [`MetaError::Overflow`].
    pub fn strided(dtype: DType, shape: &[u64], strides: &[u64]) -> Result<Self, MetaError> {
        if shape.len() > MAX_DIMS {
            return Err(MetaError::TooManyDims { ndim: shape.len() });
        }
        if strides.len() != shape.len() {
            return Err(MetaError::StridesLength { shape: shape.len(), strides: strides.len() });
        }
        let nbytes = span_bytes(dtype, shape, strides)?;
        let mut meta = TensorMeta {
            dtype,
            ndim: shape.len() as u8,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
            nbytes,
        };
        meta.shape[..shape.len()].copy_from_slice(shape);
        meta.strides[..shape.len()].copy_from_slice(strides);
        Ok(meta)
    }

    /// A flat byte buffer of `len` bytes (`U8`, one dimension).
    pub fn bytes(len: u64) -> Self {
        // One dimension, stride 1, itemsize 1: cannot fail.
        let mut shape = [0; MAX_DIMS];
        let mut strides = [0; MAX_DIMS];
        shape[0] = len;
        strides[0] = 1;
        TensorMeta { dtype: DType::U8, ndim: 1, shape, strides, nbytes: len }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape, one entry per dimension.
    pub fn shape(&self) -> &[u64] {
        &self.shape[..self.ndim as usize]
    }

    /// The strides in elements, one entry per dimension.
    pub fn strides(&self) -> &[u64] {
        &self.strides[..self.ndim as usize]
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        if self.shape().contains(&0) {
            return 0;
        }
        // Cannot overflow: the product of a shape without zeros was checked on construction.
        self.shape().iter().product()
    }

    /// Bytes the tensor spans in memory, from its first element to the end of its last
    /// (for a contiguous tensor, `numel × itemsize`).
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Whether the strides are row-major contiguous.
    pub fn is_contiguous(&self) -> bool {
        let mut step = 1u64;
        for d in (0..self.ndim as usize).rev() {
            if self.shape[d] != 1 && self.strides[d] != step {
                return false;
            }
            step = step.saturating_mul(self.shape[d]);
        }
        true
    }
}

/// Bytes from the first element to the end of the last; 0 for an empty tensor.
fn span_bytes(dtype: DType, shape: &[u64], strides: &[u64]) -> Result<u64, MetaError> {
    if shape.contains(&0) {
        // An empty tensor spans nothing, whatever its other dimensions and strides.
        return Ok(0);
    }
    let mut last = 0u64; // offset of the last element, in elements
    let mut numel = 1u64;
    for (&n, &s) in shape.iter().zip(strides) {
        numel = numel.checked_mul(n).ok_or(MetaError::Overflow)?;
        let reach = (n - 1).checked_mul(s).ok_or(MetaError::Overflow)?;
        last = last.checked_add(reach).ok_or(MetaError::Overflow)?;
    }
    let _ = numel.checked_mul(dtype.itemsize()).ok_or(MetaError::Overflow)?;
    last.checked_add(1).and_then(|e| e.checked_mul(dtype.itemsize())).ok_or(MetaError::Overflow)
}

/// The fixed-size record a ring carries: 384 bytes, six cache lines, plain old data.
///
/// Fields are public because a descriptor is wire data; a consumer must treat every field
/// as untrusted and use the checked accessors ([`Descriptor::meta`]) or the channel layer's
/// validation before acting on one.
///
/// ```
/// use gpuring::{Descriptor, DType, TensorMeta};
/// let meta = TensorMeta::contiguous(DType::F32, &[2, 3])?;
/// let d = Descriptor::new(7, &meta).with_tag(42);
/// assert_eq!(d.seq, 7);
/// assert_eq!(d.meta()?, meta);
/// # Ok::<(), gpuring::MetaError>(())
/// ```
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Descriptor {
    /// Sequence number set by the producer.
    pub seq: u64,
    /// Free for the application.
    pub tag: u64,
    /// Which pool the slot belongs to.
    pub pool_id: u32,
    /// Slot index within the pool.
    pub slot: u32,
    /// The slot's generation when it was leased (detects stale descriptors).
    pub generation: u64,
    /// Offset of the tensor's first byte within the slot.
    pub byte_offset: u64,
    /// Bytes of payload.
    pub len: u64,
    /// CUDA device ordinal in the producer's process (-1: host memory).
    pub device_ordinal: i32,
    /// [`DType`] wire code (0: none).
    pub dtype: u8,
    /// Number of dimensions used in `shape` and `strides`.
    pub ndim: u8,
    /// Reserved flags, 0.
    pub flags: u16,
    /// CUDA device UUID (devices are matched by UUID, not ordinal).
    pub device_uuid: [u8; 16],
    /// Shape, `ndim` entries used.
    pub shape: [u64; MAX_DIMS],
    /// Strides in elements, `ndim` entries used.
    pub strides: [u64; MAX_DIMS],
    /// `CUipcMemHandle` of the pool's allocation.
    pub mem_handle: [u8; 64],
    /// `CUipcEventHandle` of the slot's ready event.
    pub event_handle: [u8; 64],
    /// Bytes of the slot's header that the message carries (at most
    /// [`SLOT_HEADER_SIZE`](crate::layout::SLOT_HEADER_SIZE)).
    pub header_len: u32,
    /// Reserved, zero; keeps the size a multiple of 64.
    pub reserved: [u8; 52],
}

const _: () = assert!(size_of::<Descriptor>() == 384);
const _: () = assert!(size_of::<Descriptor>() % 64 == 0);

impl Default for Descriptor {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl core::fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let ndim = (self.ndim as usize).min(MAX_DIMS);
        f.debug_struct("Descriptor")
            .field("seq", &self.seq)
            .field("tag", &self.tag)
            .field("pool_id", &self.pool_id)
            .field("slot", &self.slot)
            .field("generation", &self.generation)
            .field("byte_offset", &self.byte_offset)
            .field("len", &self.len)
            .field("device_ordinal", &self.device_ordinal)
            .field("dtype", &self.dtype)
            .field("shape", &&self.shape[..ndim])
            .field("strides", &&self.strides[..ndim])
            .finish_non_exhaustive()
    }
}

impl Descriptor {
    /// A host descriptor (device −1) for a tensor described by `meta`, with `len` set to
    /// the bytes it spans.
    pub fn new(seq: u64, meta: &TensorMeta) -> Self {
        let mut d = Self::zeroed();
        d.seq = seq;
        d.device_ordinal = -1;
        d.set_meta(meta);
        d
    }

    /// Sets the application tag.
    pub fn with_tag(mut self, tag: u64) -> Self {
        self.tag = tag;
        self
    }

    /// Writes dtype, shape, strides and `len` from `meta`.
    pub fn set_meta(&mut self, meta: &TensorMeta) {
        self.dtype = meta.dtype as u8;
        self.ndim = meta.ndim;
        self.shape = meta.shape;
        self.strides = meta.strides;
        self.len = meta.nbytes;
    }

    /// Reads the tensor metadata back, checking every field.
    ///
    /// # Errors
    ///
    /// [`MetaError::UnknownDType`], [`MetaError::TooManyDims`], [`MetaError::Overflow`]: a
    /// descriptor from an untrusted peer can carry anything.
    pub fn meta(&self) -> Result<TensorMeta, MetaError> {
        let dtype =
            DType::from_code(self.dtype).ok_or(MetaError::UnknownDType { code: self.dtype })?;
        let ndim = self.ndim as usize;
        if ndim > MAX_DIMS {
            return Err(MetaError::TooManyDims { ndim });
        }
        TensorMeta::strided(dtype, &self.shape[..ndim], &self.strides[..ndim])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_round_trip_and_are_unique() {
        for (i, d) in ALL_DTYPES.iter().enumerate() {
            assert_eq!(DType::from_code(*d as u8), Some(*d));
            assert_eq!(DType::from_dlpack(d.dlpack()), Some(*d));
            for e in &ALL_DTYPES[i + 1..] {
                assert_ne!(d.dlpack(), e.dlpack(), "{d:?} and {e:?} share a DLPack type");
            }
            assert_eq!(u64::from(d.dlpack().bits) / 8, d.itemsize().min(16));
        }
        for code in [0u8, 18, 200, 255] {
            assert_eq!(DType::from_code(code), None);
        }
    }

    #[test]
    fn contiguous_meta() {
        let m = TensorMeta::contiguous(DType::F32, &[2, 3, 4]).unwrap();
        assert_eq!(m.shape(), &[2, 3, 4]);
        assert_eq!(m.strides(), &[12, 4, 1]);
        assert_eq!(m.numel(), 24);
        assert_eq!(m.nbytes(), 96);
        assert!(m.is_contiguous());
        let scalar = TensorMeta::contiguous(DType::F64, &[]).unwrap();
        assert_eq!((scalar.numel(), scalar.nbytes()), (1, 8));
        let empty = TensorMeta::contiguous(DType::F64, &[3, 0]).unwrap();
        assert_eq!((empty.numel(), empty.nbytes()), (0, 0));
    }

    #[test]
    fn strided_meta_spans_to_last_element() {
        // A transposed 2x3 view of a 3x2 buffer.
        let m = TensorMeta::strided(DType::I16, &[2, 3], &[1, 2]).unwrap();
        assert_eq!(m.nbytes(), (1 + 2 * 2 + 1) * 2);
        assert!(!m.is_contiguous());
    }

    #[test]
    fn invalid_meta_is_an_error() {
        assert_eq!(
            TensorMeta::contiguous(DType::U8, &[1; 9]),
            Err(MetaError::TooManyDims { ndim: 9 })
        );
        assert_eq!(TensorMeta::contiguous(DType::F32, &[u64::MAX, 2]), Err(MetaError::Overflow));
        assert_eq!(TensorMeta::contiguous(DType::C128, &[1 << 61]), Err(MetaError::Overflow));
        assert_eq!(
            TensorMeta::strided(DType::U8, &[2, 2], &[1]),
            Err(MetaError::StridesLength { shape: 2, strides: 1 })
        );
        assert_eq!(TensorMeta::strided(DType::U8, &[2], &[u64::MAX]), Err(MetaError::Overflow));
    }

    #[test]
    fn descriptor_meta_round_trip_and_rejects_garbage() {
        let meta = TensorMeta::contiguous(DType::BF16, &[8, 128]).unwrap();
        let d = Descriptor::new(1, &meta);
        assert_eq!(d.len, 8 * 128 * 2);
        assert_eq!(d.meta().unwrap(), meta);

        let mut bad = d;
        bad.dtype = 99;
        assert_eq!(bad.meta(), Err(MetaError::UnknownDType { code: 99 }));
        let mut bad = d;
        bad.ndim = 200;
        assert_eq!(bad.meta(), Err(MetaError::TooManyDims { ndim: 200 }));
        let mut bad = d;
        bad.shape[0] = u64::MAX;
        assert_eq!(bad.meta(), Err(MetaError::Overflow));
        assert!(Descriptor::zeroed().meta().is_err(), "a zeroed descriptor has no dtype");
    }

    #[test]
    fn bytes_meta() {
        let m = TensorMeta::bytes(54 << 20);
        assert_eq!(m.nbytes(), 54 << 20);
        assert_eq!(m.dtype(), DType::U8);
    }
}
