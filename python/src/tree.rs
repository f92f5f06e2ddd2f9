//! Objects made of tuples, lists, dicts, scalars and torch tensors, sent as one message
//! without pickle: what `Sender.send_object`, `Message.object` and `Queue` use first.
//!
//! A *plain tree* is `None`, `bool`, `int` (64-bit), `float`, `str`, `bytes`, and tuples,
//! lists and dicts of them (exactly those types: a namedtuple or an `OrderedDict` is not
//! one), with dense torch tensors (`torch.Tensor` or `torch.nn.Parameter`, of a dtype
//! gpuring carries, on the CPU or a GPU) and numpy arrays (`numpy.ndarray`, of a dtype
//! gpuring carries and numpy exports by DLPack) anywhere as leaves. Its description, written in
//! the message's header (host memory beside the slot), must fit the header's 4096 bytes;
//! the tensors are copied into the slot one after another, 256-byte aligned. Anything
//! else (a dataclass, a numpy scalar, a list met twice or containing itself, a description
//! too long) is not a plain tree, and the caller pickles it instead (`_objects.py`): this
//! form exists for speed, the pickle one for generality.
//!
//! The description, after the four bytes `GRT1`: one node, each a tag byte then
//!
//! | tag | node | then |
//! |---|---|---|
//! | 0, 1, 2 | `None`, `False`, `True` | nothing |
//! | 3 | int | i64 |
//! | 4 | float | f64 |
//! | 5, 6 | str (UTF-8), bytes | u32 length, the bytes |
//! | 7, 8 | tuple, list | u32 count, the items |
//! | 9 | dict | u32 count, key and value of each item |
//! | 10 | tensor | u8 dtype code, u8 flags (1: requires grad, 2: a Parameter), i32 device it left (-1: CPU), u64 offset in the slot, u8 dims, u64 each |
//! | 11 | a tensor or array met before | u32 its index, in the order they first appear |
//! | 12 | numpy array | u8 dtype code, u64 offset in the slot, u8 dims, u64 each |
//!
//! little-endian throughout. The receiver checks every value (a count, a length, a dtype,
//! a part outside the payload: `Corrupted`), as it does the rest of shared memory.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use gpuring::{DType, MAX_DIMS, SLOT_HEADER_SIZE, TensorMeta};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PySlice, PyString, PyTuple};

use crate::blocking::Until;
use crate::dlpack::{self, DEVICE_CUDA, Keep, Place, Source};
use crate::errors::{Class, raise};
use crate::gpu;
use crate::receiver::torch_from_capsule;
use crate::sender::{TxShared, acquire, copy_into, gather_into, send_lease};

/// The first four bytes of a plain tree's header.
pub(crate) const MAGIC: &[u8; 4] = b"GRT1";
/// Nesting deeper than this is not a plain tree (and, read, `Corrupted`).
const MAX_DEPTH: usize = 64;
/// Tensors in the slot start at multiples of this.
const ALIGN: u64 = 256;

const NONE: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const INT: u8 = 3;
const FLOAT: u8 = 4;
const STR: u8 = 5;
const BYTES: u8 = 6;
const TUPLE: u8 = 7;
const LIST: u8 = 8;
const DICT: u8 = 9;
const TENSOR: u8 = 10;
const AGAIN: u8 = 11;
const NDARRAY: u8 = 12;

const REQUIRES_GRAD: u8 = 1;
const PARAMETER: u8 = 2;

/// `torch.Tensor` and `torch.nn.Parameter`, looked up once.
static TORCH_TYPES: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();

fn torch_types<'py>(
    py: Python<'py>,
    torch: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let (t, p) = TORCH_TYPES.get_or_try_init(py, || {
        let t = torch.getattr("Tensor")?.unbind();
        let p = torch.getattr("nn")?.getattr("Parameter")?.unbind();
        Ok::<_, PyErr>((t, p))
    })?;
    Ok((t.bind(py).clone(), p.bind(py).clone()))
}

/// A plain tree read for sending: its header, the tensors with their offsets in the slot,
/// and the bytes the slot must hold.
pub(crate) struct Tree<'py> {
    pub(crate) header: Vec<u8>,
    pub(crate) parts: Vec<(Source<'py>, u64)>,
    pub(crate) total: u64,
}

struct Encoder<'py> {
    out: Vec<u8>,
    parts: Vec<(Source<'py>, u64)>,
    /// Each tensor met, by identity: its index (a tensor met twice travels once).
    tensors: HashMap<usize, u32>,
    /// Lists and dicts met, by identity: one met twice (or inside itself) is for pickle,
    /// which keeps that sharing.
    containers: HashSet<usize>,
    end: u64,
    /// torch.Tensor and torch.nn.Parameter, where torch is imported.
    torch: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    /// numpy.ndarray, where numpy is imported.
    ndarray: Option<Bound<'py, PyAny>>,
    /// The channel's GPU (None: host slots).
    channel: Option<i32>,
}

/// Reads `obj` as a plain tree for a channel whose slots are on GPU `channel` (None:
/// host slots): `None` if it is not one. Raises `CudaError` for a CUDA tensor of another
/// GPU than a GPU channel's, as the pickle form does.
pub(crate) fn encode<'py>(
    obj: &Bound<'py, PyAny>,
    channel: Option<i32>,
) -> PyResult<Option<Tree<'py>>> {
    let py = obj.py();
    let torch = match gpu::torch_module(py)? {
        Some(t) => Some(torch_types(py, &t)?),
        None => None,
    };
    let ndarray = match gpu::module(py, intern!(py, "numpy"))? {
        Some(np) => Some(np.getattr(intern!(py, "ndarray"))?),
        None => None,
    };
    // Room for a typical object (a few containers, tens of tensors) from the start: growing
    // them step by step showed in a ten-tensor dict's profile.
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(MAGIC);
    let mut e = Encoder {
        out,
        parts: Vec::with_capacity(16),
        tensors: HashMap::with_capacity(16),
        containers: HashSet::with_capacity(8),
        end: 0,
        torch,
        ndarray,
        channel,
    };
    if !e.node(obj, 0)? || e.out.len() > SLOT_HEADER_SIZE {
        return Ok(None);
    }
    Ok(Some(Tree { header: e.out, parts: e.parts, total: e.end }))
}

impl<'py> Encoder<'py> {
    fn len_u32(&mut self, n: usize) -> bool {
        match u32::try_from(n) {
            Ok(n) => {
                self.out.extend_from_slice(&n.to_le_bytes());
                true
            }
            Err(_) => false,
        }
    }

    /// Writes a tuple's or a list's `n` items (`get`); false if one is not plain.
    fn items(
        &mut self,
        tag: u8,
        n: usize,
        get: &dyn Fn(usize) -> Option<Bound<'py, PyAny>>,
        depth: usize,
    ) -> PyResult<bool> {
        self.out.push(tag);
        if !self.len_u32(n) {
            return Ok(false);
        }
        for k in 0..n {
            let Some(item) = get(k) else { return Ok(false) };
            if !self.node(&item, depth + 1)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Writes `obj`; false if it is not part of a plain tree.
    fn node(&mut self, obj: &Bound<'py, PyAny>, depth: usize) -> PyResult<bool> {
        if depth > MAX_DEPTH || self.out.len() > SLOT_HEADER_SIZE {
            return Ok(false);
        }
        if obj.is_none() {
            self.out.push(NONE);
        } else if let Ok(b) = obj.cast_exact::<PyBool>() {
            self.out.push(if b.is_true() { TRUE } else { FALSE });
        } else if obj.is_exact_instance_of::<PyInt>() {
            let Ok(v) = obj.extract::<i64>() else { return Ok(false) };
            self.out.push(INT);
            self.out.extend_from_slice(&v.to_le_bytes());
        } else if let Ok(f) = obj.cast_exact::<PyFloat>() {
            self.out.push(FLOAT);
            self.out.extend_from_slice(&f.value().to_le_bytes());
        } else if let Ok(s) = obj.cast_exact::<PyString>() {
            // Strings with lone surrogates have no UTF-8: pickle keeps them.
            let Ok(text) = s.to_cow() else { return Ok(false) };
            self.out.push(STR);
            if !self.len_u32(text.len()) {
                return Ok(false);
            }
            self.out.extend_from_slice(text.as_bytes());
        } else if let Ok(b) = obj.cast_exact::<PyBytes>() {
            let bytes = b.as_bytes();
            self.out.push(BYTES);
            if !self.len_u32(bytes.len()) {
                return Ok(false);
            }
            self.out.extend_from_slice(bytes);
        } else if let Ok(t) = obj.cast_exact::<PyTuple>() {
            return self.items(TUPLE, t.len(), &|k| t.get_item(k).ok(), depth);
        } else if let Ok(l) = obj.cast_exact::<PyList>() {
            if !self.containers.insert(obj.as_ptr() as usize) {
                return Ok(false);
            }
            // Read item by item: the list should not change under us (no Python code runs
            // here but torch's and numpy's C accessors), and a count that did is caught.
            let n = l.len();
            return Ok(self.items(LIST, n, &|k| l.get_item(k).ok(), depth)? && l.len() == n);
        } else if let Ok(d) = obj.cast_exact::<PyDict>() {
            if !self.containers.insert(obj.as_ptr() as usize) {
                return Ok(false);
            }
            self.out.push(DICT);
            let n = d.len();
            if !self.len_u32(n) {
                return Ok(false);
            }
            let mut seen = 0;
            for (k, v) in d.iter() {
                seen += 1;
                if seen > n || !self.node(&k, depth + 1)? || !self.node(&v, depth + 1)? {
                    return Ok(false);
                }
            }
            if seen != n {
                return Ok(false);
            }
        } else {
            return self.tensor(obj);
        }
        Ok(true)
    }

    /// Places `src` in the slot and remembers it as `obj`: its offset.
    fn place(&mut self, obj: &Bound<'py, PyAny>, src: Source<'py>) -> Option<u64> {
        let off = self.end.div_ceil(ALIGN) * ALIGN;
        self.end = off.checked_add(src.meta.nbytes())?;
        let k = u32::try_from(self.parts.len()).unwrap_or(u32::MAX);
        self.tensors.insert(obj.as_ptr() as usize, k);
        self.parts.push((src, off));
        Some(off)
    }

    fn dims(&mut self, meta: &TensorMeta) {
        self.out.push(meta.shape().len() as u8);
        for d in meta.shape() {
            self.out.extend_from_slice(&d.to_le_bytes());
        }
    }

    /// Writes a torch tensor or a numpy array (or a reference to one met before); false
    /// for anything else.
    fn tensor(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<bool> {
        let ty = obj.get_type();
        let is_array = self.ndarray.as_ref().is_some_and(|a| ty.is(a));
        let (tensor, param) = match &self.torch {
            Some((t, p)) => (ty.is(t), ty.is(p)),
            None => (false, false),
        };
        if !(is_array || tensor || param) {
            return Ok(false);
        }
        let id = obj.as_ptr() as usize;
        if let Some(&k) = self.tensors.get(&id) {
            self.out.push(AGAIN);
            self.out.extend_from_slice(&k.to_le_bytes());
            return Ok(true);
        }
        if is_array {
            return self.array(obj);
        }
        let py = obj.py();
        // A dtype gpuring does not carry, a sparse tensor and the like: pickle's.
        let Ok(Some(src)) = Source::read_torch(obj) else { return Ok(false) };
        let device = match src.place {
            Place::Host => -1,
            Place::Cuda(d) => {
                if let Some(c) = self.channel
                    && c != d
                {
                    return Err(crate::sender::gpu_mismatch(py, d, c));
                }
                d
            }
        };
        let grad = obj.getattr(intern!(py, "requires_grad"))?.is_truthy()?;
        let meta = src.meta;
        let Some(off) = self.place(obj, src) else { return Ok(false) };
        let flags = if grad { REQUIRES_GRAD } else { 0 } | if param { PARAMETER } else { 0 };
        self.out.extend_from_slice(&[TENSOR, meta.dtype() as u8, flags]);
        self.out.extend_from_slice(&device.to_le_bytes());
        self.out.extend_from_slice(&off.to_le_bytes());
        self.dims(&meta);
        Ok(true)
    }

    /// Writes a numpy array of a dtype gpuring carries (read by DLPack, made contiguous
    /// where it is not); false for another dtype, and into GPU slots (an array there goes
    /// by the pickle form, whose way back to the host is the one tested on a GPU so far).
    fn array(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<bool> {
        if self.channel.is_some() {
            return Ok(false);
        }
        let py = obj.py();
        let dtype = obj.getattr(intern!(py, "dtype"))?;
        if dtype.getattr(intern!(py, "hasobject"))?.is_truthy()? {
            return Ok(false);
        }
        // Host memory: no stream to order by.
        let Ok(src) = Source::read(obj, &mut |_| Ok(0)) else { return Ok(false) };
        if src.place != Place::Host {
            return Ok(false);
        }
        let meta = src.meta;
        let Some(off) = self.place(obj, src) else { return Ok(false) };
        self.out.extend_from_slice(&[NDARRAY, meta.dtype() as u8]);
        self.out.extend_from_slice(&off.to_le_bytes());
        self.dims(&meta);
        Ok(true)
    }
}

/// Sends `obj` through `tx` as one message with `tag` if it is a plain tree (true), waiting
/// until `until` for a slot and room; false (nothing done) if it is not one.
pub(crate) fn send(
    py: Python<'_>,
    tx: &Arc<TxShared>,
    obj: &Bound<'_, PyAny>,
    until: Until,
    tag: u64,
) -> PyResult<bool> {
    let channel = tx.gpu.as_ref().map(|g| g.ordinal);
    let Some(mut tree) = encode(obj, channel)? else { return Ok(false) };
    if tree.total > tx.slot_bytes {
        let msg = format!(
            "the object needs {} bytes (its tensors), a slot holds {}: make the channel with a \
             larger slot_bytes",
            tree.total, tx.slot_bytes
        );
        return Err(raise(py, Class::TooLarge, msg));
    }
    // Copies into a GPU slot go on torch's current stream of its device, which the tensors
    // were written in the order of.
    let raw = match &tx.gpu {
        Some(g) => Some(gpu::current_stream(py, g.ordinal)?),
        None => None,
    };
    let mut lease = acquire(py, tx, until, raw.unwrap_or(0))?;
    lease.set_header(py, &tree.header)?;
    // Several CUDA tensors of the slot's device: one kernel launch for all of them, on
    // the lease's stream (torch's current one, which they were written in the order of).
    if let (Some(g), Some(raw)) = (&tx.gpu, raw) {
        if gather_into(py, tx, &lease, tree.parts.iter().map(|(s, off)| (s, *off)), raw)? {
            tree.parts.retain(|(s, _)| s.place != Place::Cuda(g.ordinal));
        }
    }
    for (src, off) in &tree.parts {
        // Into host slots, a CUDA tensor is read in the order of its own device's stream.
        let asked = if matches!(src.place, Place::Cuda(_)) { raw } else { None };
        copy_into(py, tx, &mut lease, *off, src, asked)?;
    }
    drop(tree.parts);
    let meta = TensorMeta::contiguous(DType::U8, &[tree.total])
        .map_err(|e| raise(py, Class::TooLarge, e))?;
    send_lease(py, tx, until, lease, meta, tag)?;
    Ok(true)
}

/// What a received tree's tensors view: the message's payload, or one copy of it.
pub(crate) struct Payload<'a, 'py> {
    pub(crate) ptr: usize,
    pub(crate) len: u64,
    pub(crate) place: (i32, i32),
    /// What each view of the payload keeps alive (the message).
    pub(crate) keep: &'a dyn Fn() -> Keep,
    /// The payload as one torch tensor (for a copy).
    pub(crate) whole: &'a dyn Fn() -> PyResult<Bound<'py, PyAny>>,
    /// The message, whose `__dlpack__` numpy reads (host payloads).
    pub(crate) message: &'a Bound<'py, PyAny>,
}

struct Decoder<'a, 'b, 'py> {
    py: Python<'py>,
    buf: &'a [u8],
    at: usize,
    made: Vec<Bound<'py, PyAny>>,
    payload: &'a Payload<'b, 'py>,
    copy: bool,
    /// With `copy`: the payload's one copy, made at the first tensor.
    base: Option<(usize, Bound<'py, PyAny>)>,
    /// The payload as a numpy array (a copy with `copy`), made at the first array.
    nbase: Option<Bound<'py, PyAny>>,
    torch: Option<Bound<'py, PyAny>>,
}

fn corrupted(py: Python<'_>, what: &str) -> PyErr {
    raise(py, Class::Corrupted, format!("an object message's description {what}"))
}

/// The object a plain tree's `header` describes, its tensors views of `payload` (or, with
/// `copy`, of one copy of it).
pub(crate) fn decode<'py>(
    py: Python<'py>,
    header: &[u8],
    payload: &Payload<'_, 'py>,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let buf = header.strip_prefix(MAGIC.as_slice()).ok_or_else(|| corrupted(py, "is not one"))?;
    let mut d = Decoder {
        py,
        buf,
        at: 0,
        made: Vec::new(),
        payload,
        copy,
        base: None,
        nbase: None,
        torch: None,
    };
    let obj = d.node(0)?;
    if d.at != buf.len() {
        return Err(corrupted(py, "has bytes after its end"));
    }
    Ok(obj)
}

impl<'py> Decoder<'_, '_, 'py> {
    fn take(&mut self, n: usize) -> PyResult<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| corrupted(self.py, "is cut short"))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> PyResult<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    fn count(&mut self) -> PyResult<usize> {
        let n = u32::from_le_bytes(self.array()?) as usize;
        // Every item takes a byte at least: a count beyond what is left is a lie.
        if n > self.buf.len() - self.at {
            return Err(corrupted(self.py, "holds a count beyond its length"));
        }
        Ok(n)
    }

    fn node(&mut self, depth: usize) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        if depth > MAX_DEPTH {
            return Err(corrupted(py, "nests too deep"));
        }
        let [tag] = self.array()?;
        Ok(match tag {
            NONE => py.None().into_bound(py),
            FALSE => PyBool::new(py, false).to_owned().into_any(),
            TRUE => PyBool::new(py, true).to_owned().into_any(),
            INT => i64::from_le_bytes(self.array()?).into_pyobject(py)?.into_any(),
            FLOAT => PyFloat::new(py, f64::from_le_bytes(self.array()?)).into_any(),
            STR => {
                let n = self.count()?;
                let text = std::str::from_utf8(self.take(n)?)
                    .map_err(|_| corrupted(py, "holds a string that is not UTF-8"))?;
                PyString::new(py, text).into_any()
            }
            BYTES => {
                let n = self.count()?;
                PyBytes::new(py, self.take(n)?).into_any()
            }
            TUPLE | LIST => {
                let n = self.count()?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.node(depth + 1)?);
                }
                if tag == TUPLE {
                    PyTuple::new(py, items)?.into_any()
                } else {
                    PyList::new(py, items)?.into_any()
                }
            }
            DICT => {
                let n = self.count()?;
                let d = PyDict::new(py);
                for _ in 0..n {
                    let k = self.node(depth + 1)?;
                    let v = self.node(depth + 1)?;
                    d.set_item(k, v)
                        .map_err(|_| corrupted(py, "holds a key that cannot be one"))?;
                }
                d.into_any()
            }
            TENSOR => self.tensor()?,
            NDARRAY => self.ndarray()?,
            AGAIN => {
                let k = u32::from_le_bytes(self.array()?) as usize;
                let t = self.made.get(k).ok_or_else(|| corrupted(py, "names an unknown tensor"))?;
                t.clone()
            }
            _ => return Err(corrupted(py, "holds an unknown node")),
        })
    }

    fn torch(&mut self) -> PyResult<Bound<'py, PyAny>> {
        if self.torch.is_none() {
            // Imported already where a program handles tensors: a look in `sys.modules` is
            // much cheaper than `import`'s machinery.
            self.torch = Some(match gpu::torch_module(self.py)? {
                Some(t) => t,
                None => self.py.import("torch")?.into_any(),
            });
        }
        Ok(self.torch.clone().expect("set above"))
    }

    /// A tensor's or an array's shape, checked, and that it lies within the payload.
    fn part(&mut self, dtype: DType, off: u64) -> PyResult<TensorMeta> {
        let py = self.py;
        let [ndim] = self.array()?;
        if ndim as usize > MAX_DIMS {
            return Err(corrupted(py, "holds an impossible tensor"));
        }
        let mut dims = [0u64; MAX_DIMS];
        for d in dims.iter_mut().take(ndim as usize) {
            *d = u64::from_le_bytes(self.array()?);
        }
        let meta = TensorMeta::contiguous(dtype, &dims[..ndim as usize])
            .map_err(|_| corrupted(py, "holds an impossible shape"))?;
        if off.checked_add(meta.nbytes()).is_none_or(|end| end > self.payload.len) {
            return Err(corrupted(py, "names bytes outside its slot"));
        }
        Ok(meta)
    }

    fn dtype(&self, code: u8) -> PyResult<DType> {
        DType::from_code(code).ok_or_else(|| corrupted(self.py, "holds an unknown dtype"))
    }

    fn tensor(&mut self) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        let [code, flags] = self.array()?;
        let device = i32::from_le_bytes(self.array()?);
        let off = u64::from_le_bytes(self.array()?);
        let dtype = self.dtype(code)?;
        if flags & !(REQUIRES_GRAD | PARAMETER) != 0 || device < -1 {
            return Err(corrupted(py, "holds an impossible tensor"));
        }
        let meta = self.part(dtype, off)?;
        let p = self.payload;
        let torch = self.torch()?;
        let capsule = if self.copy {
            if self.base.is_none() {
                let whole = (p.whole)()?.call_method0(intern!(py, "clone"))?;
                let ptr: usize = whole.call_method0(intern!(py, "data_ptr"))?.extract()?;
                self.base = Some((ptr, whole));
            }
            let (ptr, whole) = self.base.as_ref().expect("made above");
            let keep: Keep = Box::new(whole.clone().unbind());
            dlpack::export(py, ptr + off as usize, p.place, &meta, false, keep)?
        } else {
            dlpack::export(py, p.ptr + off as usize, p.place, &meta, false, (p.keep)())?
        };
        let mut v = torch_from_capsule(py, capsule)?;
        // Back on the device it left from (copies, as the pickle form makes them).
        let on_gpu = p.place.0 == DEVICE_CUDA;
        if !on_gpu && device >= 0 {
            v = v.call_method1(intern!(py, "to"), (format!("cuda:{device}"),))?;
        } else if on_gpu && device < 0 {
            v = v.call_method0(intern!(py, "cpu"))?;
        }
        let grad = flags & REQUIRES_GRAD != 0;
        if flags & PARAMETER != 0 {
            let param = torch.getattr(intern!(py, "nn"))?.getattr(intern!(py, "Parameter"))?;
            v = param.call1((v, grad))?;
        } else if grad && v.call_method0(intern!(py, "is_floating_point"))?.is_truthy()? {
            v.call_method1(intern!(py, "requires_grad_"), (true,))?;
        }
        self.made.push(v.clone());
        Ok(v)
    }

    /// A numpy array: a view of the payload (or of its one copy); from GPU slots, a copy
    /// back on the host (as the pickle form makes).
    fn ndarray(&mut self) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        let [code] = self.array()?;
        let off = u64::from_le_bytes(self.array()?);
        let dtype = self.dtype(code)?;
        let meta = self.part(dtype, off)?;
        let p = self.payload;
        let bytes = if p.place.0 == DEVICE_CUDA {
            self.torch()?;
            let raw = TensorMeta::bytes(meta.nbytes());
            let keep = (p.keep)();
            let capsule = dlpack::export(py, p.ptr + off as usize, p.place, &raw, false, keep)?;
            let v = torch_from_capsule(py, capsule)?;
            v.call_method0(intern!(py, "cpu"))?.call_method0(intern!(py, "numpy"))?
        } else {
            if self.nbase.is_none() {
                let np = py.import("numpy")?;
                let base = np.call_method1(intern!(py, "from_dlpack"), (p.message,))?;
                let base = if self.copy { base.call_method0(intern!(py, "copy"))? } else { base };
                self.nbase = Some(base);
            }
            let base = self.nbase.as_ref().expect("made above");
            let (start, end) = (off as isize, (off + meta.nbytes()) as isize);
            base.get_item(PySlice::new(py, start, end, 1))?
        };
        let shape = PyTuple::new(py, meta.shape())?;
        let v = bytes
            .call_method1(intern!(py, "view"), (crate::dtypes::name(dtype),))?
            .call_method1(intern!(py, "reshape"), (shape,))?;
        self.made.push(v.clone());
        Ok(v)
    }
}
