//! What the GPU test binaries share (feature `cuda`): device 0 and a stream, a value per
//! message, filling device words.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, result, sys};

/// The primary context of this process's device, and a new stream on it: device 0 for a
/// test's own process; for the processes a test starts (its peers),
/// `GPURING_TEST_PEER_DEVICE` (default 0). On a machine with two GPUs,
/// `GPURING_TEST_PEER_DEVICE=1` runs every cross-process GPU test with its two ends on two
/// GPUs, and `GPURING_TEST_PEER_ONLY_SEES=1` the same with the peers seeing GPU 1 alone
/// (their device 0).
pub fn setup() -> (Arc<CudaContext>, Arc<CudaStream>) {
    let ordinal = match super::role() {
        Some(_) if std::env::var_os("GPURING_TEST_PEER_ONLY_SEES").is_some() => 0,
        Some(_) => std::env::var("GPURING_TEST_PEER_DEVICE")
            .map(|v| v.parse().expect("GPURING_TEST_PEER_DEVICE: a device ordinal"))
            .unwrap_or(0),
        None => 0,
    };
    let ctx = gpuring::cuda::context(ordinal).expect("a CUDA device");
    let stream = ctx.new_stream().unwrap();
    (ctx, stream)
}

/// The word message `seq` carries (odd, so never a fresh buffer's zero).
pub fn value(seq: u64) -> u32 {
    (seq as u32).wrapping_mul(2_654_435_761) | 1
}

/// Fills `words` words at `ptr` with `v`, in `stream`'s order.
pub fn memset(ptr: sys::CUdeviceptr, v: u32, words: usize, stream: &CudaStream) {
    // SAFETY: `ptr` is a slot (or buffer) of at least `words` words, used in stream order.
    unsafe { sys::cuMemsetD32Async(ptr, v, words, stream.cu_stream()) }.result().unwrap();
}

/// Copies `out.len()` words at `ptr` to the host, in `stream`'s order, and waits for them.
pub fn read_words(ptr: sys::CUdeviceptr, out: &mut [u32], stream: &CudaStream) {
    // SAFETY: `ptr` is valid for `out.len()` words in `stream`'s order; `out` lives until
    // the synchronize below.
    unsafe { result::memcpy_dtoh_async(out, ptr, stream.cu_stream()) }.unwrap();
    stream.synchronize().unwrap();
}

/// Copies `bytes` bytes from `src` to `dst`, in `stream`'s order.
pub fn copy(dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize, stream: &CudaStream) {
    // SAFETY: both ranges are live device memory of at least `bytes`, in stream order.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }.unwrap();
}

/// Holds `stream` back for `ms` milliseconds from now: what is queued on it after this waits
/// (a host function that sleeps, run by the driver's thread), so that it surely runs after
/// what the host does meanwhile on other streams, however fast the GPU is.
pub fn hold(stream: &CudaStream, ms: u64) {
    unsafe extern "C" fn sleep(ms: *mut std::ffi::c_void) {
        std::thread::sleep(std::time::Duration::from_millis(ms as u64));
    }
    // SAFETY: `sleep` makes no CUDA call (as a host function must not) and reads nothing
    // through its argument, a number carried in the pointer.
    unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(sleep), ms as *mut std::ffi::c_void) }
        .result()
        .unwrap();
}
