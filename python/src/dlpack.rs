//! DLPack, both ways: reading a tensor a caller hands to `send` (any object with
//! `__dlpack__`: torch tensors, numpy arrays, cupy, jax, ...), and exporting a message or a
//! lease as a capsule that `torch.from_dlpack` / `np.from_dlpack` turn into a zero-copy view.
//!
//! The structures are DLPack's C ABI (dlpack.h, v1.0): the legacy `DLManagedTensor`
//! (capsule name `dltensor`) and `DLManagedTensorVersioned` (`dltensor_versioned`).

use std::ffi::{CStr, c_void};

use gpuring::{DType, DlDataType, MAX_DIMS, TensorMeta};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{Class, raise};

static TORCH_TENSOR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static TORCH_STRIDED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub(crate) const DEVICE_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory, readable by the CPU.
const DEVICE_CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`: unified memory, readable by both.
const DEVICE_CUDA_MANAGED: i32 = 13;

const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataTypeC {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataTypeC,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// Where a tensor's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Host memory the CPU can read.
    Host,
    /// Device memory of CUDA device `n`.
    Cuda(i32),
}

/// A tensor handed to `send`, read through its DLPack capsule: the capsule (which keeps
/// the memory alive) and what was read from it, checked.
pub(crate) struct Source<'py> {
    /// The capsule, or the torch tensor itself: what keeps the memory alive (held, never
    /// read).
    _keep: Bound<'py, PyAny>,
    /// Address of the first element.
    pub(crate) ptr: usize,
    pub(crate) meta: TensorMeta,
    pub(crate) place: Place,
}

impl<'py> Source<'py> {
    /// Reads `obj` through `__dlpack__`. A CUDA tensor is asked for in the order of
    /// `cuda_stream(device)`'s stream (a DLPack stream value: 1 is the legacy default
    /// stream). A tensor that is not C-contiguous is made contiguous first (torch's
    /// `.contiguous()`, numpy's `ascontiguousarray`): one copy, by its own library.
    pub(crate) fn read(
        obj: &Bound<'py, PyAny>,
        cuda_stream: &mut dyn FnMut(i32) -> PyResult<usize>,
    ) -> PyResult<Self> {
        if let Some(src) = Self::read_torch(obj)? {
            return Ok(src);
        }
        if let Some(src) = Self::read_once(obj, cuda_stream)? {
            return Ok(src);
        }
        let py = obj.py();
        let contiguous = if obj.hasattr("contiguous")? {
            obj.call_method0("contiguous")?
        } else {
            py.import("numpy")?.call_method1("ascontiguousarray", (obj,))?
        };
        Self::read_once(&contiguous, cuda_stream)?.ok_or_else(|| {
            raise(py, Class::DTypeError, "the tensor stays non-contiguous after .contiguous()")
        })
    }

    /// A dense torch tensor on the CPU or a GPU, read through its own accessors (C
    /// functions: a fraction of what `__dlpack__`, a Python method making a capsule,
    /// costs). Its bytes are read in the order of torch's current stream, as the caller
    /// does anyway. `None`: not such a tensor (or torch not imported): use DLPack.
    pub(crate) fn read_torch(obj: &Bound<'py, PyAny>) -> PyResult<Option<Self>> {
        let py = obj.py();
        let Some(torch) = crate::gpu::torch_module(py)? else { return Ok(None) };
        let tensor =
            TORCH_TENSOR.get_or_try_init(py, || torch.getattr("Tensor").map(Bound::unbind))?;
        if !obj.is_instance(tensor.bind(py))? {
            return Ok(None);
        }
        let strided =
            TORCH_STRIDED.get_or_try_init(py, || torch.getattr("strided").map(Bound::unbind))?;
        // Names interned once: each lookup below then hashes nothing and allocates nothing.
        if !obj.getattr(intern!(py, "layout"))?.is(strided.bind(py)) {
            return Ok(None); // sparse and the like: DLPack says what it thinks of them
        }
        // `is_cpu` (a C property) where torch has it: `device.type` makes a device object.
        let is_cpu = |t: &Bound<'py, PyAny>| match t.getattr(intern!(py, "is_cpu")) {
            Ok(v) => v.is_truthy(),
            Err(_) => t.getattr(intern!(py, "device"))?.getattr(intern!(py, "type"))?.eq("cpu"),
        };
        let place = if obj.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
            Place::Cuda(obj.call_method0(intern!(py, "get_device"))?.extract()?)
        } else if is_cpu(obj)? {
            Place::Host
        } else {
            return Ok(None);
        };
        let dtype = torch_dtype(&obj.getattr(intern!(py, "dtype"))?)?;
        let mut t = obj.clone();
        // Lazy conjugation (complex views only: not asked of the rest) and negation are
        // flags on the view, not in the bytes.
        if matches!(dtype, DType::C64 | DType::C128)
            && t.call_method0(intern!(py, "is_conj"))?.is_truthy()?
        {
            t = t.call_method0(intern!(py, "resolve_conj"))?;
        }
        if t.call_method0(intern!(py, "is_neg"))?.is_truthy()? {
            t = t.call_method0(intern!(py, "resolve_neg"))?;
        }
        if !t.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
            t = t.call_method0(intern!(py, "contiguous"))?;
        }
        // torch.Size is a tuple: read in place, no list made.
        let size = t.getattr(intern!(py, "shape"))?;
        let meta = crate::dtypes::tuple_meta(size.cast::<PyTuple>()?, dtype, |e| e)?;
        let ptr: usize = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
        Ok(Some(Source { _keep: t, ptr, meta, place }))
    }

    fn read_once(
        obj: &Bound<'py, PyAny>,
        cuda_stream: &mut dyn FnMut(i32) -> PyResult<usize>,
    ) -> PyResult<Option<Self>> {
        let py = obj.py();
        if !obj.hasattr("__dlpack__")? {
            let ty = obj.get_type().name()?;
            return Err(raise(
                py,
                Class::DTypeError,
                format!(
                    "a {ty} is not a tensor or array: gpuring sends objects with __dlpack__ (torch tensors, numpy arrays, ...)"
                ),
            ));
        }
        let (device_type, device_id): (i32, i32) =
            obj.call_method0("__dlpack_device__")?.extract()?;
        let kwargs = PyDict::new(py);
        if device_type == DEVICE_CUDA {
            kwargs.set_item("stream", cuda_stream(device_id)?)?;
        }
        kwargs.set_item("max_version", (1, 0))?;
        let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            // A producer of DLPack before 1.0 knows no `max_version`.
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
                kwargs.del_item("max_version")?;
                obj.call_method("__dlpack__", (), Some(&kwargs)).map_err(|e| refused(py, e))?
            }
            Err(e) => return Err(refused(py, e)),
        };
        // SAFETY: `capsule` is a live object; the name pointer is read only while it lives.
        let name = unsafe { ffi::PyCapsule_GetName(capsule.as_ptr()) };
        if name.is_null() {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: a capsule's name is a NUL-terminated string that lives as long as it.
        let name = unsafe { CStr::from_ptr(name) };
        // SAFETY: the capsule holds the pointer under the name it was checked to have; the
        // DLPack producer keeps the structure alive until the capsule's destructor runs,
        // and we hold the capsule for as long as the pointer is used.
        let tensor: DLTensor = unsafe {
            let ptr = ffi::PyCapsule_GetPointer(capsule.as_ptr(), name.as_ptr());
            if ptr.is_null() {
                return Err(PyErr::fetch(py));
            }
            if name == NAME_VERSIONED {
                let m = &*(ptr as *const DLManagedTensorVersioned);
                if m.version.major != 1 {
                    let major = m.version.major;
                    return Err(raise(
                        py,
                        Class::DTypeError,
                        format!("DLPack version {major} is not 1"),
                    ));
                }
                m.dl_tensor
            } else if name == NAME_LEGACY {
                (*(ptr as *const DLManagedTensor)).dl_tensor
            } else {
                return Err(raise(
                    py,
                    Class::DTypeError,
                    format!("__dlpack__ gave a capsule named {name:?}"),
                ));
            }
        };
        let place = match tensor.device.device_type {
            DEVICE_CPU | DEVICE_CUDA_HOST | DEVICE_CUDA_MANAGED => Place::Host,
            DEVICE_CUDA => Place::Cuda(tensor.device.device_id),
            other => {
                return Err(raise(
                    py,
                    Class::DTypeError,
                    format!("DLPack device type {other} is neither host nor CUDA memory"),
                ));
            }
        };
        let ndim = usize::try_from(tensor.ndim).unwrap_or(usize::MAX);
        if ndim > MAX_DIMS {
            return Err(raise(
                py,
                Class::TooLarge,
                format!("{} dimensions, at most {MAX_DIMS}", tensor.ndim),
            ));
        }
        let dl = DlDataType {
            code: tensor.dtype.code,
            bits: tensor.dtype.bits,
            lanes: tensor.dtype.lanes,
        };
        let Some(dtype) = DType::from_dlpack(dl) else {
            return Err(raise(
                py,
                Class::DTypeError,
                format!(
                    "gpuring carries no element type of DLPack code {}, {} bits, {} lanes",
                    dl.code, dl.bits, dl.lanes
                ),
            ));
        };
        let mut shape = [0u64; MAX_DIMS];
        let mut contiguous = true;
        let mut step = 1i64;
        for d in (0..ndim).rev() {
            // SAFETY: DLPack gives `ndim` entries in `shape`, and in `strides` when it is
            // not null, valid while the capsule lives.
            let (n, s) = unsafe {
                let s = if tensor.strides.is_null() { None } else { Some(*tensor.strides.add(d)) };
                (*tensor.shape.add(d), s)
            };
            shape[d] = u64::try_from(n)
                .map_err(|_| raise(py, Class::DTypeError, "a negative dimension"))?;
            if let Some(s) = s
                && n != 1
                && s != step
            {
                contiguous = false;
            }
            step = step.saturating_mul(n);
        }
        // An empty tensor has no layout to keep, whatever its strides say.
        if !contiguous && !shape[..ndim].contains(&0) {
            return Ok(None);
        }
        let meta = TensorMeta::contiguous(dtype, &shape[..ndim])
            .map_err(|e| raise(py, Class::TooLarge, e))?;
        let ptr = (tensor.data as usize).wrapping_add(tensor.byte_offset as usize);
        Ok(Some(Source { _keep: capsule, ptr, meta, place }))
    }
}

/// A producer's refusal to export (numpy's `BufferError` for strings or objects, ...) as
/// a `DTypeError`, caused by it.
fn refused(py: Python<'_>, e: PyErr) -> PyErr {
    if !e.is_instance_of::<PyBufferError>(py) {
        return e;
    }
    let ours =
        raise(py, Class::DTypeError, format!("the tensor cannot be read through DLPack: {e}"));
    ours.set_cause(py, Some(e));
    ours
}

/// torch dtypes by identity (each is one object for the life of the process), so that the
/// hot path makes no string of them.
static TORCH_DTYPES: std::sync::Mutex<Vec<(usize, DType)>> = std::sync::Mutex::new(Vec::new());

fn torch_dtype(dtype: &Bound<'_, PyAny>) -> PyResult<DType> {
    let key = dtype.as_ptr() as usize;
    let mut known = TORCH_DTYPES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, d)) = known.iter().find(|(k, _)| *k == key) {
        return Ok(*d);
    }
    let d = crate::dtypes::from_py(dtype)?;
    // Kept alive for good, so that the address stays this dtype's.
    std::mem::forget(dtype.clone());
    known.push((key, d));
    Ok(d)
}

/// What an exported capsule keeps alive (a message, a lease) until the consumer's
/// tensor is gone.
pub(crate) type Keep = Box<dyn Send>;

/// The allocation behind an exported capsule: the managed tensor, its shape and strides,
/// and what it keeps alive.
struct Export<M> {
    managed: M,
    shape: [i64; MAX_DIMS],
    strides: [i64; MAX_DIMS],
    _keep: Keep,
}

/// How a consumer asked for a capsule: `__dlpack__(max_version=...)`.
pub(crate) fn wants_versioned(max_version: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let Some(v) = max_version else { return Ok(false) };
    if v.is_none() {
        return Ok(false);
    }
    let (major, _minor): (u32, u32) = v.extract()?;
    Ok(major >= 1)
}

/// Checks the `dl_device` and `copy` arguments of `__dlpack__` against what we export.
pub(crate) fn check_request(
    place: (i32, i32),
    dl_device: Option<&Bound<'_, PyAny>>,
    copy: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    if let Some(d) = dl_device.filter(|d| !d.is_none()) {
        let want: (i32, i32) = d.extract()?;
        if want != place {
            return Err(PyBufferError::new_err(format!(
                "the tensor is on DLPack device {place:?}, {want:?} was asked for (gpuring does not copy)"
            )));
        }
    }
    if let Some(c) = copy.filter(|c| !c.is_none())
        && c.is_truthy()?
    {
        return Err(PyBufferError::new_err(
            "copy=True: gpuring exports views of its slots, never copies",
        ));
    }
    Ok(())
}

/// A capsule for a view of `meta` at `data` on `place`, keeping `keep` alive until the
/// consumer's deleter runs (or the capsule is dropped unused).
pub(crate) fn export<'py>(
    py: Python<'py>,
    data: usize,
    place: (i32, i32),
    meta: &TensorMeta,
    versioned: bool,
    keep: Keep,
) -> PyResult<Bound<'py, PyAny>> {
    let dims = meta.shape().len();
    let mut shape = [0i64; MAX_DIMS];
    let mut strides = [0i64; MAX_DIMS];
    for d in 0..dims {
        // Sizes and strides of a checked TensorMeta fit in i64: its span fits in u64 bytes
        // and every slot is at most 256 GiB.
        shape[d] = i64::try_from(meta.shape()[d]).unwrap_or(i64::MAX);
        strides[d] = i64::try_from(meta.strides()[d]).unwrap_or(i64::MAX);
    }
    let dl = meta.dtype().dlpack();
    let tensor = DLTensor {
        data: data as *mut c_void,
        device: DLDevice { device_type: place.0, device_id: place.1 },
        ndim: dims as i32,
        dtype: DLDataTypeC { code: dl.code, bits: dl.bits, lanes: dl.lanes },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    if versioned {
        let managed = DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            // Never `DLPACK_FLAG_BITMASK_READ_ONLY`: a message's view could be one, but
            // torch refuses read-only tensors, and writing a received slot harms nobody.
            flags: 0,
            dl_tensor: tensor,
        };
        let ptr = Box::into_raw(Box::new(Export { managed, shape, strides, _keep: keep }));
        // SAFETY: `ptr` is the box just made; the pointers stored point into it, which
        // does not move until the deleter frees it.
        unsafe {
            (*ptr).managed.manager_ctx = ptr.cast();
            (*ptr).managed.dl_tensor.shape = (*ptr).shape.as_mut_ptr();
            (*ptr).managed.dl_tensor.strides = (*ptr).strides.as_mut_ptr();
            capsule(py, (&raw mut (*ptr).managed).cast(), NAME_VERSIONED, versioned_unused)
        }
    } else {
        let managed = DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        };
        let ptr = Box::into_raw(Box::new(Export { managed, shape, strides, _keep: keep }));
        // SAFETY: as above.
        unsafe {
            (*ptr).managed.manager_ctx = ptr.cast();
            (*ptr).managed.dl_tensor.shape = (*ptr).shape.as_mut_ptr();
            (*ptr).managed.dl_tensor.strides = (*ptr).strides.as_mut_ptr();
            capsule(py, (&raw mut (*ptr).managed).cast(), NAME_LEGACY, legacy_unused)
        }
    }
}

/// Wraps `ptr` in a capsule named `name` whose destructor `dtor` frees it unless a
/// consumer took it (and renamed the capsule `used_...`, as DLPack says).
///
/// # Safety
///
/// `ptr` is a managed tensor of the kind `name` says, freed by its own deleter.
unsafe fn capsule<'py>(
    py: Python<'py>,
    ptr: *mut c_void,
    name: &'static CStr,
    dtor: unsafe extern "C" fn(*mut ffi::PyObject),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `name` is 'static, as a capsule's name must outlive it.
    let cap = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(dtor)) };
    if cap.is_null() {
        let err = PyErr::fetch(py);
        // SAFETY: the capsule was not made, so nobody else frees `ptr`; `ptr` is the kind
        // of managed tensor `name` says.
        unsafe {
            if name == NAME_VERSIONED {
                delete_versioned(ptr.cast());
            } else {
                delete_legacy(ptr.cast());
            }
        }
        return Err(err);
    }
    // SAFETY: a new reference, owned from here.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: DLPack calls the deleter once, with the pointer we exported, whose
    // manager_ctx is the Box made in `export`.
    drop(unsafe { Box::from_raw((*m).manager_ctx as *mut Export<DLManagedTensor>) });
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`.
    drop(unsafe { Box::from_raw((*m).manager_ctx as *mut Export<DLManagedTensorVersioned>) });
}

/// The capsule's destructor: frees the export when no consumer took it (a consumer
/// renames the capsule and calls the deleter itself).
unsafe extern "C" fn legacy_unused(cap: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule, under the GIL; IsValid checks the name.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, NAME_LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, NAME_LEGACY.as_ptr());
            delete_legacy(p.cast());
        }
    }
}

unsafe extern "C" fn versioned_unused(cap: *mut ffi::PyObject) {
    // SAFETY: as in `legacy_unused`.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, NAME_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, NAME_VERSIONED.as_ptr());
            delete_versioned(p.cast());
        }
    }
}

/// A DLPack `stream` argument as a CUDA stream handle: `None` and 1 are the legacy default
/// stream (a null handle), 2 the per-thread default stream; -1 asks for no ordering.
pub(crate) fn stream_arg(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    let Some(s) = stream.filter(|s| !s.is_none()) else { return Ok(Some(0)) };
    let v: i64 = s.extract()?;
    Ok(match v {
        -1 => None,
        0 | 1 => Some(0),
        v => Some(usize::try_from(v).map_err(|_| {
            PyBufferError::new_err(format!("stream {v} is not a CUDA stream handle"))
        })?),
    })
}

/// `(kDLCPU, 0)` or `(kDLCUDA, n)`, as `__dlpack_device__` returns it.
pub(crate) fn device_tuple<'py>(
    py: Python<'py>,
    place: (i32, i32),
) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, [place.0, place.1])
}
