//! What the GPU benches share (feature `cuda`).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};

/// Unwraps a driver call's result.
pub fn ok(r: sys::CUresult) {
    r.result().unwrap();
}

/// The primary context of device 0, and a new stream on it.
pub fn setup() -> (Arc<CudaContext>, Arc<CudaStream>) {
    setup_on(0)
}

/// The primary context of device `ordinal`, and a new stream on it.
pub fn setup_on(ordinal: usize) -> (Arc<CudaContext>, Arc<CudaStream>) {
    let ctx = gpuring::cuda::context(ordinal).unwrap();
    let stream = ctx.new_stream().unwrap();
    (ctx, stream)
}

/// The device a bench's peer process uses: `GPURING_BENCH_PEER_DEVICE`, default 0 (the
/// device of the measuring process). On a machine with two GPUs, 1 puts the peer (the
/// consumer) on the other GPU.
pub fn peer_device() -> usize {
    std::env::var("GPURING_BENCH_PEER_DEVICE").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}
