//! What the GPU benches share (feature `cuda`).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};

/// Unwraps a driver call's result.
pub fn ok(r: sys::CUresult) {
    r.result().unwrap();
}

/// The primary context of device 0, and a new stream on it.
pub fn setup() -> (Arc<CudaContext>, Arc<CudaStream>) {
    let ctx = gpuring::cuda::context(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    (ctx, stream)
}
