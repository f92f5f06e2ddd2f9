//! What the GPU test binaries share (feature `cuda`): device 0 and a stream, a value per
//! message, filling device words.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};

/// The primary context of device 0, and a new stream on it.
pub fn setup() -> (Arc<CudaContext>, Arc<CudaStream>) {
    let ctx = gpuring::cuda::context(0).expect("a CUDA device");
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
