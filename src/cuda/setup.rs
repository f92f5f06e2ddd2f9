//! Where two processes' GPU work meets, and what that costs: whether this process's
//! device runs under CUDA MPS, and whether a sender and a receiver share a GPU
//! ([`GpuPath`]). Two processes on one GPU without MPS are time-sliced: the GPU switches
//! between their contexts, and each hand-off waits for a switch (~140 µs on an H100, most
//! of the GPU one-way figure); MPS (one shared context) or two GPUs remove it. See
//! docs/GPU.md.

use std::sync::Arc;

use cudarc::driver::{CudaContext, result, sys};

use super::CudaError;
use super::device::device_uuid;
use super::driver;

/// A device as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its ordinal in this process (`CUDA_VISIBLE_DEVICES` renumbers devices).
    pub ordinal: i32,
    /// Its UUID, the same in every process (what descriptors carry).
    pub uuid: [u8; 16],
    /// Its name, as the driver gives it.
    pub name: String,
    /// Whether contexts this process creates on it are shared through the CUDA MPS server
    /// (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`); `None` when the driver cannot say.
    pub mps: Option<bool>,
}

/// What `ctx`'s device is, and whether this process runs on it under MPS.
///
/// # Errors
///
/// [`CudaError::Driver`] when the driver cannot name the device.
pub fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, CudaError> {
    let dev = ctx.cu_device();
    let uuid = device_uuid(ctx)?;
    let name = result::device::get_name(dev).map_err(driver("cuDeviceGetName"))?;
    let attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED;
    // SAFETY: a device of a live context; the attribute is a plain integer query. A driver
    // that does not know it answers an error (then `None`).
    let mps = unsafe { result::device::get_attribute(dev, attribute) }.ok().map(|v| v != 0);
    Ok(DeviceInfo { ordinal: ctx.ordinal() as i32, uuid, name, mps })
}

/// How a hand-off between a sender's device and a receiver's reaches the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuPath {
    /// One GPU, no MPS: the GPU time-slices the two processes' contexts, and each hand-off
    /// waits for a context switch (~140 µs on an H100). Start the MPS daemon to remove it.
    TimeSliced,
    /// One GPU under MPS: the processes share one context; a hand-off costs microseconds.
    Mps,
    /// One GPU, and the driver cannot say whether MPS runs.
    SameGpu,
    /// Two GPUs: the receiver reads the sender's memory over NVLink or PCIe (peer access).
    TwoGpus,
}

impl GpuPath {
    /// The path from a sender on the device with UUID `sender` (a received message's
    /// [`Descriptor::device_uuid`](crate::Descriptor)) to a receiver on `receiver` (this
    /// process's [`device_info`]). The MPS state is this process's: processes of one user
    /// share the user's MPS server, or none.
    pub fn between(sender: &[u8; 16], receiver: &DeviceInfo) -> Self {
        match (*sender == receiver.uuid, receiver.mps) {
            (false, _) => GpuPath::TwoGpus,
            (true, Some(false)) => GpuPath::TimeSliced,
            (true, Some(true)) => GpuPath::Mps,
            (true, None) => GpuPath::SameGpu,
        }
    }

    /// One line for people: the setup, and for a time-sliced GPU what it costs and how to
    /// turn MPS on.
    pub fn describe(self, receiver: &DeviceInfo) -> String {
        let gpu = format!("GPU {} ({})", receiver.ordinal, receiver.name);
        match self {
            GpuPath::TimeSliced => format!(
                "both processes on {gpu} without CUDA MPS: the GPU time-slices their contexts, \
                 and each hand-off waits for a context switch (~140 µs on an H100). {MPS_HINT}"
            ),
            GpuPath::Mps => format!("both processes on {gpu}, sharing it through CUDA MPS"),
            GpuPath::SameGpu => format!(
                "both processes on {gpu}; the driver cannot say whether CUDA MPS runs \
                 (without it, each hand-off waits for a context switch)"
            ),
            GpuPath::TwoGpus => format!("sender and receiver on two GPUs (this one: {gpu})"),
        }
    }
}

/// How to start the MPS daemon (docs/GPU.md says more, caveats included).
pub const MPS_HINT: &str = "To share the GPU through CUDA MPS instead: export \
    CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log, create both \
    folders, run `nvidia-cuda-mps-control -d`, then start both processes with those \
    variables set (`echo quit | nvidia-cuda-mps-control` stops it); see docs/GPU.md";

#[cfg(test)]
mod tests {
    use super::*;

    fn device(mps: Option<bool>) -> DeviceInfo {
        DeviceInfo { ordinal: 0, uuid: [7; 16], name: "test GPU".into(), mps }
    }

    #[test]
    fn paths_between_devices() {
        assert_eq!(GpuPath::between(&[7; 16], &device(Some(false))), GpuPath::TimeSliced);
        assert_eq!(GpuPath::between(&[7; 16], &device(Some(true))), GpuPath::Mps);
        assert_eq!(GpuPath::between(&[7; 16], &device(None)), GpuPath::SameGpu);
        assert_eq!(GpuPath::between(&[8; 16], &device(Some(false))), GpuPath::TwoGpus);
        let hint = GpuPath::TimeSliced.describe(&device(Some(false)));
        assert!(hint.contains("nvidia-cuda-mps-control -d") && hint.contains("GPU 0 (test GPU)"));
        assert!(!GpuPath::Mps.describe(&device(Some(true))).contains("nvidia-cuda-mps-control"));
    }
}
