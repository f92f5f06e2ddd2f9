//! The GPU wing (feature `cuda`): everything of gpuring that talks to CUDA, plugged into the
//! generic channels through their backend trait. cudarc loads the driver at run time, so
//! this builds everywhere and says [`CudaError::Unavailable`] where there is no driver.
//!
//! Here: a context for a device ([`context`]), whether a driver is present
//! ([`available`]), counters of the IPC handles opened and host memory registered, where
//! two processes' GPU work meets ([`device_info`], [`GpuPath`]: one GPU time-sliced between
//! the processes, one GPU under CUDA MPS, or two GPUs; docs/GPU.md says what each costs),
//! and the two backends: [`Cuda`] (slots in device memory, handed off in stream order) and
//! [`Pinned`] (host slots registered with CUDA, filled and read by stream-ordered copies).
//!
//! ```no_run
//! let ctx = gpuring::cuda::context(0)?; // the primary context of device 0
//! let stream = ctx.new_stream()?;
//! let ch = gpuring::Channel::builder("frames").cuda(&stream).create()?;
//! # drop(ch);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! | file | what lives there |
//! |---|---|
//! | `mod.rs` | [`CudaError`], the public face of the wing |
//! | `events.rs` | CUDA events and their IPC handles, the driver calls on them; [`ipc_opens`] |
//! | `device.rs` | device pools: the allocation and the slots' events, export and import; [`context`] |
//! | `register.rs` | host memory registered with CUDA ([`host_registrations`]) |
//! | `lane.rs` | the threads that run stream-ordered hand-offs, and their preallocated entries |
//! | `slack.rs` | a thread's timer slack, lowered for short naps |
//! | `backend.rs` | the [`Cuda`] backend: device leases and messages in stream order, [`GpuReady`] |
//! | `flag.rs` | the receiver's wait for a host ready flag |
//! | `returns.rs` | a pinned receiver's pools, and the return of a slot once a stream is done with it |
//! | `pinned.rs` | the [`Pinned`] backend: stream-ordered copies into and out of pinned host slots |
//! | `setup.rs` | [`DeviceInfo`], [`GpuPath`]: a device's MPS state, and what a hand-off crosses |
//!
//! Files import only those above them in this table (`tests/layers.rs` checks it).

mod backend;
mod device;
mod events;
mod flag;
mod lane;
mod pinned;
mod register;
mod returns;
mod setup;
mod slack;

pub use backend::{Cuda, DeviceView, GpuReady};
pub use cudarc::driver::{CudaContext, CudaStream};
pub use device::{available, context};
pub use events::ipc_opens;
pub use pinned::Pinned;
pub use register::{host_registered, host_registrations};
pub use setup::{DeviceInfo, GpuPath, MPS_HINT, device_info};

/// What went wrong on the CUDA side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// No CUDA driver library on this machine (or it failed to initialise).
    Unavailable,
    /// A driver call failed.
    Driver {
        /// The call.
        op: &'static str,
        /// Its `CUresult` code.
        code: i32,
    },
    /// The pool's device is not this context's device, and the two cannot reach each
    /// other (no peer access).
    DeviceMismatch {
        /// UUID of the pool's device.
        pool_device: [u8; 16],
        /// UUID of this context's device.
        this_device: [u8; 16],
    },
    /// The thread that runs a pinned pool's stream-ordered hand-offs could not be started.
    Thread,
}

impl core::fmt::Display for CudaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CudaError::Unavailable => f.write_str("no CUDA driver on this machine"),
            CudaError::Driver { op, code } => write!(f, "{op} failed: CUDA error {code}"),
            CudaError::Thread => {
                f.write_str("could not start the thread for stream-ordered hand-offs")
            }
            CudaError::DeviceMismatch { pool_device, this_device } => write!(
                f,
                "the pool lives on device {} and this context's device {} cannot reach it",
                hex(pool_device),
                hex(this_device)
            ),
        }
    }
}

impl std::error::Error for CudaError {}

fn hex(bytes: &[u8; 16]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `CudaError` of a failed driver call `op`.
pub(crate) fn driver(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver { op, code: e.0 as i32 }
}
