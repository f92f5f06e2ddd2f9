//! CUDA from the Python side: the context of a device (the primary context, which torch
//! uses too, so its streams and ours mix), torch's current stream, cudarc handles of
//! foreign streams, copies between a tensor and a slot, and ordering one stream after
//! another.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaStream, sys};
use gpuring::CudaError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};

use crate::gather::Gather;

/// Which way a copy goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dir {
    DeviceToDevice,
    HostToDevice,
    DeviceToHost,
}

/// A device's primary context, and the last foreign stream wrapped for it.
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) ordinal: i32,
    /// One stream handle is used over and over (torch's current stream): wrap it once.
    last: Mutex<Option<(usize, Arc<CudaStream>)>>,
    /// The copy kernel of several tensors, loaded at first use (`None`: refused).
    gather: OnceLock<Option<Gather>>,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if let Some(Some(g)) = self.gather.get()
            && self.ctx.bind_to_thread().is_ok()
        {
            g.unload();
        }
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuda:{}", self.ordinal)
    }
}

fn driver(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver { op, code: e.0 as i32 }
}

fn check(op: &'static str, r: sys::CUresult) -> Result<(), CudaError> {
    r.result().map_err(driver(op))
}

impl Gpu {
    /// The primary context of device `ordinal`.
    pub(crate) fn new(ordinal: i32) -> Result<Arc<Self>, CudaError> {
        let n = usize::try_from(ordinal).map_err(|_| CudaError::Driver {
            op: "a device ordinal < 0",
            code: sys::cudaError_enum::CUDA_ERROR_INVALID_DEVICE as i32,
        })?;
        let ctx = gpuring::cuda::context(n)?;
        Ok(Arc::new(Gpu { ctx, ordinal, last: Mutex::new(None), gather: OnceLock::new() }))
    }

    /// A cudarc handle of the stream whose raw handle is `raw` (0: the legacy default
    /// stream, 2: the per-thread default stream), which the caller (torch, or the user who
    /// passed it) keeps alive. Never destroys it.
    pub(crate) fn stream(&self, raw: usize) -> Arc<CudaStream> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((r, s)) = last.as_ref()
            && *r == raw
        {
            return s.clone();
        }
        // SAFETY: `raw` is a stream of this device's primary context (torch's current
        // stream, or a handle the caller passed and keeps alive, as documented); the
        // wrapper borrows it and never destroys it.
        let s = unsafe { self.ctx.wrap_borrowed_stream(raw as sys::CUstream) };
        *last = Some((raw, s.clone()));
        s
    }

    /// Enqueues a copy of `n` bytes from `src` to `dst` on `stream`, in the direction
    /// given (the direction-specific calls skip the pointer lookup of `cuMemcpyAsync`).
    /// From pageable host memory the driver stages the copy, and the call returns once the
    /// host side is read; to pageable host memory, once the copy (after the work queued
    /// on `stream`) is done.
    pub(crate) fn copy(
        &self,
        dir: Dir,
        dst: u64,
        src: u64,
        n: usize,
        stream: &CudaStream,
    ) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let s = stream.cu_stream();
        // SAFETY: the caller vouches for `n` bytes at `src` (a checked tensor, kept alive)
        // and at `dst` (a leased slot of at least `n` bytes), each where `dir` says.
        let r = unsafe {
            match dir {
                Dir::DeviceToDevice => sys::cuMemcpyDtoDAsync_v2(dst, src, n, s),
                Dir::HostToDevice => {
                    sys::cuMemcpyHtoDAsync_v2(dst, src as *const std::ffi::c_void, n, s)
                }
                Dir::DeviceToHost => {
                    sys::cuMemcpyDtoHAsync_v2(dst as *mut std::ffi::c_void, src, n, s)
                }
            }
        };
        check("cuMemcpyAsync", r)
    }

    /// Enqueues the copies `parts` (source, destination, bytes: device addresses of this
    /// device that the caller vouches for, as for [`Gpu::copy`]) on `stream` in one launch
    /// per 64: false (nothing enqueued) where the kernel cannot be loaded.
    pub(crate) fn gather(
        &self,
        parts: &[(u64, u64, u64)],
        stream: &CudaStream,
    ) -> Result<bool, CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let Some(g) = self.gather.get_or_init(Gather::load) else { return Ok(false) };
        g.copy(parts, stream).map(|()| true)
    }

    /// Waits on the host for everything queued on `stream`.
    pub(crate) fn synchronize(&self, stream: &CudaStream) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    /// Makes `waiter` wait for the work queued on `on` so far (no host wait).
    pub(crate) fn join(&self, waiter: &CudaStream, on: &CudaStream) -> Result<(), CudaError> {
        if waiter.cu_stream() == on.cu_stream() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        waiter.join(on).map_err(driver("cuStreamWaitEvent"))
    }
}

static SYS_MODULES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
static CURRENT_STREAM: PyOnceLock<(Py<PyAny>, bool)> = PyOnceLock::new();

/// torch's module, if the program imported it (gpuring never imports torch).
pub(crate) fn torch_module<'py>(py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
    module(py, intern!(py, "torch"))
}

/// Module `name`, if the program imported it (a look in `sys.modules`: nothing imported).
/// `name` an interned string (`intern!`): this runs per tensor, and a `&str` would make a
/// Python string each time.
pub(crate) fn module<'py>(
    py: Python<'py>,
    name: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let modules = SYS_MODULES.get_or_try_init(py, || {
        py.import("sys")?
            .getattr("modules")?
            .cast_into::<PyDict>()
            .map(Bound::unbind)
            .map_err(PyErr::from)
    })?;
    modules.bind(py).get_item(name)
}

/// torch's current stream on `device` as a raw handle (0: the legacy default stream), if
/// torch is imported; 0 otherwise. Asks `torch._C._cuda_getCurrentRawStream` (what
/// torch's own generated code calls: no Stream object made) where torch has it, else the
/// public `torch.cuda.current_stream(device).cuda_stream`.
pub(crate) fn current_stream(py: Python<'_>, device: i32) -> PyResult<usize> {
    let (f, raw) = match CURRENT_STREAM.get(py) {
        Some((f, raw)) => (f.bind(py).clone(), *raw),
        None => {
            let Some(torch) = torch_module(py)? else { return Ok(0) };
            let c = torch.getattr("_C")?;
            let (f, raw) = match c.getattr("_cuda_getCurrentRawStream") {
                Ok(f) => (f, true),
                Err(_) => (torch.getattr("cuda")?.getattr("current_stream")?, false),
            };
            CURRENT_STREAM.get_or_init(py, || (f.clone().unbind(), raw));
            (f, raw)
        }
    };
    let got = f.call1((device,))?;
    if raw { got.extract() } else { got.getattr("cuda_stream")?.extract() }
}

/// A DLPack `stream` value for raw handle `raw`: the legacy default stream is 1.
pub(crate) fn dlpack_stream(raw: usize) -> usize {
    if raw == 0 { 1 } else { raw }
}

/// A `stream=` argument of ours: `None` (torch's current stream if torch is imported,
/// else the legacy default stream), an int (a raw `cudaStream_t`), or an object with a
/// `cuda_stream` attribute (a `torch.cuda.Stream`, cupy's, ...).
pub(crate) fn stream_handle(
    py: Python<'_>,
    stream: Option<&Bound<'_, PyAny>>,
    device: i32,
) -> PyResult<usize> {
    match stream.filter(|s| !s.is_none()) {
        None => current_stream(py, device),
        Some(s) if s.hasattr("cuda_stream")? => s.getattr("cuda_stream")?.extract(),
        Some(s) => s.extract(),
    }
}
