//! One kernel launch that copies several CUDA tensors into a GPU slot: how a message of
//! several tensors (a tuple, a dict, a state dict) is copied in. A driver copy per tensor
//! costs 5–7 µs of CPU each and torch's `_foreach_copy_` needs a torch view of the slot per
//! tensor (~1.4 µs each) before its own ~9 µs; this launch costs ~5 µs for up to
//! [`MAX_PARTS`] tensors (H200, under MPS: docs/data/h200-2026-11-28-gather-micro.txt).
//!
//! The kernel is `kernels/gather.cu`, compiled to PTX by `scripts/gather-ptx.sh` and
//! checked in as `kernels/gather.ptx`; the driver compiles it for the GPU at first use. A
//! driver that refuses it leaves the caller to copy tensor by tensor.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::{CudaStream, sys};
use gpuring::CudaError;

/// The kernel, NUL-terminated as `cuModuleLoadData` reads it.
const PTX: &str = concat!(include_str!("kernels/gather.ptx"), "\0");

/// Parts one launch copies (`GATHER_MAX` in gather.cu: the table rides in the launch's
/// parameters, 1,536 bytes of the 4,096 a launch takes).
pub(crate) const MAX_PARTS: usize = 64;

/// Threads per block, and the most blocks a part is spread over (each thread then loops).
const THREADS: u64 = 256;
const MAX_BLOCKS: u64 = 4096;

/// One copy: `n` bytes from `src` to `dst` (`struct Part` in gather.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Part {
    src: u64,
    dst: u64,
    n: u64,
}

/// The kernel's one parameter (`struct Table` in gather.cu), passed by value.
#[repr(C)]
struct Table {
    parts: [Part; MAX_PARTS],
}

/// The kernel loaded into a context.
pub(crate) struct Gather {
    module: sys::CUmodule,
    func: sys::CUfunction,
}

// SAFETY: a module and its function are driver objects of their context, usable from any
// thread that has the context current (every call here binds it first); neither is
// changed after `load`.
unsafe impl Send for Gather {}
// SAFETY: as above: launches from several threads at once are the driver's to order.
unsafe impl Sync for Gather {}

impl Gather {
    /// Loads the kernel into the context current on this thread (the caller bound it);
    /// `None` where the driver refuses it (one older than the PTX's ISA).
    pub(crate) fn load() -> Option<Self> {
        let mut module: sys::CUmodule = ptr::null_mut();
        // SAFETY: `PTX` is a NUL-terminated PTX image; the call writes `module` only.
        let r = unsafe { sys::cuModuleLoadData(&mut module, PTX.as_ptr().cast()) };
        if r.result().is_err() {
            return None;
        }
        let mut func: sys::CUfunction = ptr::null_mut();
        // SAFETY: `module` was loaded above; the name is NUL-terminated.
        let r = unsafe { sys::cuModuleGetFunction(&mut func, module, c"gpuring_gather".as_ptr()) };
        if r.result().is_err() {
            // SAFETY: loaded above, used by nothing.
            unsafe { sys::cuModuleUnload(module) };
            return None;
        }
        Some(Gather { module, func })
    }

    /// Enqueues on `stream` the copies `parts` (source, destination, bytes): device
    /// addresses of this context that the caller vouches for (sources alive until the
    /// copies ran, as the stream orders; destinations in a slot it holds, not overlapping
    /// them), in launches of [`MAX_PARTS`]. The caller bound the context.
    pub(crate) fn copy(
        &self,
        parts: &[(u64, u64, u64)],
        stream: &CudaStream,
    ) -> Result<(), CudaError> {
        for chunk in parts.chunks(MAX_PARTS) {
            let mut table = Table { parts: [Part::default(); MAX_PARTS] };
            let mut blocks = 1;
            for (slot, &(src, dst, n)) in table.parts.iter_mut().zip(chunk) {
                *slot = Part { src, dst, n };
                // 16 bytes a thread where both ends and the length allow it (gather.cu).
                let units = if (src | dst | n) & 15 == 0 { n / 16 } else { n };
                blocks = blocks.max(units.div_ceil(THREADS));
            }
            let mut params = [(&raw mut table).cast::<c_void>()];
            // Grid rows: the parts filled (≤ 64, under the 65,535 allowed), each copying
            // only its own `n` bytes, which the caller vouches for.
            // SAFETY: `func` takes one `Table` by value, which `params[0]` points at (the
            // driver copies it at the launch); `stream` is a live stream of this context.
            let r = unsafe {
                sys::cuLaunchKernel(
                    self.func,
                    blocks.min(MAX_BLOCKS) as u32,
                    chunk.len() as u32,
                    1,
                    THREADS as u32,
                    1,
                    1,
                    0,
                    stream.cu_stream(),
                    params.as_mut_ptr(),
                    ptr::null_mut(),
                )
            };
            r.result().map_err(|e| CudaError::Driver { op: "cuLaunchKernel", code: e.0 as i32 })?;
        }
        Ok(())
    }

    /// Waits for the context's work (launches of the kernel among it), then unloads the
    /// module (the caller bound the context): when a channel's GPU handle goes.
    pub(crate) fn unload(&self) {
        // SAFETY: no arguments; waits for the bound context's queued work.
        unsafe { sys::cuCtxSynchronize() };
        // SAFETY: loaded by `load`, used by no launch still to run (waited for above), and
        // its owner is going.
        unsafe { sys::cuModuleUnload(self.module) };
    }
}
