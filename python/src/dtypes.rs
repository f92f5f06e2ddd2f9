//! Element type names, shared by numpy and torch (`"float32"`, `"bfloat16"`, ...), and
//! the other small conversions between Python arguments and gpuring's types.

use gpuring::{DType, MAX_DIMS, TensorMeta};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};

use crate::errors::{Class, raise};

/// Every element type gpuring carries, by the name numpy and torch give it.
pub(crate) const NAMES: [(DType, &str); 17] = [
    (DType::Bool, "bool"),
    (DType::U8, "uint8"),
    (DType::I8, "int8"),
    (DType::U16, "uint16"),
    (DType::I16, "int16"),
    (DType::U32, "uint32"),
    (DType::I32, "int32"),
    (DType::U64, "uint64"),
    (DType::I64, "int64"),
    (DType::F16, "float16"),
    (DType::BF16, "bfloat16"),
    (DType::F32, "float32"),
    (DType::F64, "float64"),
    (DType::F8E4M3Fn, "float8_e4m3fn"),
    (DType::F8E5M2, "float8_e5m2"),
    (DType::C64, "complex64"),
    (DType::C128, "complex128"),
];

/// The name of `dtype`.
pub(crate) fn name(dtype: DType) -> &'static str {
    NAMES.iter().find(|(d, _)| *d == dtype).map_or("unknown", |(_, n)| n)
}

/// A dtype argument: a name (`"float32"`), a numpy dtype or scalar type (`np.float32`),
/// or a torch dtype (`torch.float32`).
pub(crate) fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let py = obj.py();
    let text: String = if let Ok(s) = obj.cast::<pyo3::types::PyString>() {
        s.extract::<String>()?
    } else if obj.hasattr("itemsize")?
        && obj.hasattr("name")?
        && !obj.is_instance_of::<pyo3::types::PyType>()
    {
        // A numpy dtype.
        obj.getattr("name")?.extract()?
    } else if obj.is_instance_of::<pyo3::types::PyType>() {
        // A numpy scalar type such as np.float32 (numpy is imported: its type was passed).
        py.import("numpy")?.getattr("dtype")?.call1((obj,))?.getattr("name")?.extract()?
    } else {
        // torch.float32 prints as "torch.float32".
        obj.str()?.extract()?
    };
    let key = text.strip_prefix("torch.").unwrap_or(&text);
    let key = match key {
        "half" => "float16",
        "double" => "float64",
        other => other,
    };
    NAMES.iter().find(|(_, n)| *n == key).map(|(d, _)| *d).ok_or_else(|| {
        let known: Vec<&str> = NAMES.iter().map(|(_, n)| *n).collect();
        raise(
            py,
            Class::DTypeError,
            format!("unknown dtype {text:?}: gpuring carries {}", known.join(", ")),
        )
    })
}

/// A shape argument (a sequence of ints, or one int) as the metadata of a C-contiguous
/// tensor of `dtype`.
pub(crate) fn meta(obj: &Bound<'_, PyAny>, dtype: DType) -> PyResult<TensorMeta> {
    let py = obj.py();
    let bad = |_| raise(py, Class::ConfigError, "a shape is a sequence of ints >= 0");
    // An int or a tuple (the usual forms) is read without a failed conversion (a Python
    // exception made and dropped: ~0.6 us) and without allocating.
    if obj.is_instance_of::<PyInt>() {
        let n: u64 = obj.extract().map_err(bad)?;
        return TensorMeta::contiguous(dtype, &[n]).map_err(|e| raise(py, Class::TooLarge, e));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return tuple_meta(t, dtype, bad);
    }
    let shape: Vec<u64> = obj.extract().map_err(bad)?;
    // More than MAX_DIMS dimensions: MetaError::TooManyDims, said as TooLarge.
    TensorMeta::contiguous(dtype, &shape).map_err(|e| raise(py, Class::TooLarge, e))
}

/// The metadata of a C-contiguous tensor of `dtype` shaped as the tuple `t` (a shape
/// argument, a `torch.Size`), read in place: no list, no Vec. More than `MAX_DIMS`
/// dimensions: `TooLarge`; an element that is not an int >= 0: `bad` of its error.
pub(crate) fn tuple_meta(
    t: &Bound<'_, PyTuple>,
    dtype: DType,
    bad: impl Fn(PyErr) -> PyErr,
) -> PyResult<TensorMeta> {
    let py = t.py();
    if t.len() > MAX_DIMS {
        let e = gpuring::MetaError::TooManyDims { ndim: t.len() };
        return Err(raise(py, Class::TooLarge, e));
    }
    let mut dims = [0u64; MAX_DIMS];
    for (d, n) in dims.iter_mut().zip(t.iter()) {
        *d = n.extract().map_err(&bad)?;
    }
    TensorMeta::contiguous(dtype, &dims[..t.len()]).map_err(|e| raise(py, Class::TooLarge, e))
}

/// A shape as a Python tuple.
pub(crate) fn shape_tuple<'py>(
    py: Python<'py>,
    meta: &TensorMeta,
) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, meta.shape())
}
