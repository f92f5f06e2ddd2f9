//! Host memory registered with CUDA in this process (`cuMemHostRegister`): a pinned pool's
//! slots, or a device pool's segment whose ready flags a sender's stream writes.
//!
//! `cuMemHostRegister(PORTABLE | DEVICEMAP)` pins one process's mapping only, so each
//! process registers its own mapping of a pool: a pinned sender on create, a pinned
//! receiver on first sight (once per mapping; [`host_registrations`] counts them). A
//! [`Registration`] keeps the mapping it covers, and goes (`cuMemHostUnregister`) before
//! it: whatever may still copy into or out of the range holds the registration.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaContext, sys};

use super::CudaError;
use super::driver;
use crate::shm::Segment;

static REGISTRATIONS: AtomicU64 = AtomicU64::new(0);
static REGISTERED: AtomicU64 = AtomicU64::new(0);

/// Host pool mappings this process has registered with CUDA (`cuMemHostRegister`) since it
/// started: a pinned sender's pool once, once per pool a pinned receiver maps, and a
/// device pool's segment once for a sender that signals by host ready flags
/// (`GpuReady::HostFlag`). The count does not move per message.
///
/// ```
/// let before = gpuring::cuda::host_registrations();
/// assert!(gpuring::cuda::host_registrations() >= before); // only ever grows
/// ```
pub fn host_registrations() -> u64 {
    REGISTRATIONS.load(Ordering::Relaxed)
}

/// Host pool mappings registered with CUDA in this process now (registered, not yet
/// unregistered).
///
/// ```
/// assert!(gpuring::cuda::host_registered() <= gpuring::cuda::host_registrations());
/// ```
pub fn host_registered() -> u64 {
    REGISTERED.load(Ordering::Relaxed)
}

/// A range of a mapping, registered with CUDA in this process; unregistered on drop.
#[derive(Debug)]
pub struct Registration {
    ctx: Arc<CudaContext>,
    ptr: *mut c_void,
    // The mapping the range lies in: unmapped only after the registration goes.
    _mapping: Arc<Segment>,
}

// SAFETY: the registration is a driver-side property of an address range; the pointer is
// only passed back to the driver (unregister), from any thread with the context bound.
unsafe impl Send for Registration {}
// SAFETY: as above; no method reads through the pointer.
unsafe impl Sync for Registration {}

impl Registration {
    /// Registers `len` bytes from `ptr` (whole pages of `mapping`, which the registration
    /// keeps) with `ctx`'s driver, portable to every context and mapped for the device.
    pub(crate) fn register(
        ctx: &Arc<CudaContext>,
        ptr: *mut u8,
        len: usize,
        mapping: Arc<Segment>,
    ) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: `ptr..ptr + len` is a live, page-aligned, read-write shared mapping
        // (`mapping`), which stays mapped while this registration holds it.
        let r = unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) };
        r.result().map_err(driver("cuMemHostRegister"))?;
        REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
        REGISTERED.fetch_add(1, Ordering::Relaxed);
        Ok(Self { ctx: ctx.clone(), ptr: ptr.cast(), _mapping: mapping })
    }

    /// The device address of the registration's first byte (`cuMemHostGetDevicePointer`).
    pub(crate) fn device_ptr(&self) -> Result<sys::CUdeviceptr, CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut dev = 0;
        // SAFETY: out-pointer valid; `ptr` is registered (device-mapped) while self lives.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, self.ptr, 0) };
        r.result().map_err(driver("cuMemHostGetDevicePointer"))?;
        Ok(dev)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: our registration of a range still mapped (the mapping is a field, dropped
        // after this); no copy is pending on it (each holds the registration).
        let _ = unsafe { sys::cuMemHostUnregister(self.ptr) };
        REGISTERED.fetch_sub(1, Ordering::Relaxed);
    }
}
