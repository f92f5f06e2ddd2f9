//! The demo's GPU path (feature `cuda`): device slots through a GPU channel, against a
//! pipe that must copy device → host → pipe → host → device.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, result, sys};
use gpuring::{Channel, GpuReady, TensorMeta, cuda};

use crate::Error;
use crate::demo::{
    Figures, STOP, Transport, finish, percentiles, phase_over, spawn_peer, stream_figures,
    stream_figures_of,
};

fn setup() -> Result<(Arc<CudaContext>, Arc<CudaStream>), Error> {
    let ctx = cuda::context(0)?;
    let stream = ctx.new_stream()?;
    Ok((ctx, stream))
}

fn memset_word(ptr: sys::CUdeviceptr, v: u32, s: &CudaStream) -> Result<(), Error> {
    // SAFETY: a live device slot of at least one word, in stream order.
    unsafe { sys::cuMemsetD32Async(ptr, v, 1, s.cu_stream()) }.result()?;
    Ok(())
}

fn read_word(ptr: sys::CUdeviceptr, s: &CudaStream) -> Result<u32, Error> {
    let mut w = [0u32; 1];
    // SAFETY: a live device word; `w` outlives the synchronize.
    unsafe { result::memcpy_dtoh_async(&mut w, ptr, s.cu_stream()) }?;
    s.synchronize()?;
    Ok(w[0])
}

/// GPU channel figures: ping-pong (A writes a word on its stream, B's stream waits,
/// copies it into its own slot and sends it back, A's stream waits, A reads it back
/// to the host), then a one-way stream; and a line on the GPU setup the hand-offs took
/// (one GPU time-sliced, one under MPS, or two GPUs: from the echo's device and this
/// process's MPS state), with the hint to turn MPS on where it would help. `events`: both
/// processes' senders signal by ready events (the echo's role says so); else by the
/// default (host flags where the device can). Also returns the signal this process's
/// senders used.
pub(super) fn channel(
    messages: u64,
    size: usize,
    pings: u64,
    events: bool,
) -> Result<(Figures, String, GpuReady), Error> {
    let (ctx, s) = setup()?;
    let here = cuda::device_info(&ctx)?;
    let mut path = None;
    let name = format!("gpuring-demo-{}{}", std::process::id(), if events { "-e" } else { "" });
    let make = |suffix: &str, cap: u64, slots: u32| {
        let b = Channel::builder(format!("{name}-{suffix}"))
            .capacity(cap)
            .slots(slots, size as u64)
            .cuda(&s);
        if events { b.ready(GpuReady::Event) } else { b }.create()
    };
    let (ab, ba) = (make("ab", 16, 4)?, make("ba", 16, 4)?);
    let (tx, rx) = (ab.sender()?, ba.receiver()?);
    let signal = tx.ready_signal();
    let role = if events { "echo-gpu-events" } else { "echo-gpu" };
    let child = spawn_peer(role, &name, size, false)?;
    let meta = TensorMeta::bytes(size as u64);
    let mut samples = Vec::with_capacity(pings as usize);
    let t0 = Instant::now();
    for seq in 0..=pings {
        if phase_over(t0, seq) {
            break;
        }
        let t = Instant::now();
        let lease = tx.acquire_timeout(Duration::from_secs(10))?;
        memset_word(lease.device_ptr(), seq as u32, &s)?;
        tx.send(lease, meta)?;
        let m = rx.recv_timeout(Duration::from_secs(10))?;
        path.get_or_insert_with(|| cuda::GpuPath::between(&m.descriptor().device_uuid, &here));
        if read_word(m.device_ptr(), &s)? != seq as u32 {
            return Err("echo returned the wrong word".into());
        }
        drop(m);
        if seq > 0 {
            samples.push(t.elapsed() / 2);
        }
    }
    let mut stop = tx.acquire()?;
    stop.set_tag(STOP);
    tx.send(stop, TensorMeta::bytes(0))?;
    finish(child)?;
    let latency = percentiles(samples);

    let sc = make("s", 256, 64)?;
    let tx = sc.sender()?;
    let child = spawn_peer("sink-gpu", &name, size, false)?;
    let label = match signal {
        GpuReady::HostFlag => "gpuring (GPU, host flags)",
        GpuReady::Event => "gpuring (GPU, events)",
    };
    let figures = stream_figures_of(label, (messages, latency), (&tx, child), meta, |seq| {
        let lease = tx.acquire_timeout(Duration::from_secs(10))?;
        memset_word(lease.device_ptr(), seq as u32, &s)?;
        Ok(lease)
    })?;
    let path = path.expect("the ping-pong ran at least once");
    Ok((figures, format!("GPU setup: {}", path.describe(&here)), signal))
}

pub(super) fn pipe(messages: u64, size: usize, pings: u64) -> Result<Figures, Error> {
    let mut f = stream_figures(Transport::Pipe, messages, size, pings, true)?;
    f.label = "pipe (GPU→host→pipe→GPU)".into();
    Ok(f)
}

pub(super) fn peer(role: &str, name: &str, size: usize) -> Result<(), Error> {
    let (_, s) = setup()?;
    if role == "sink-gpu" {
        let sc = Channel::builder(format!("{name}-s")).cuda(&s).open()?;
        let rx = sc.receiver()?;
        loop {
            let m = rx.recv_timeout(Duration::from_secs(30))?;
            if m.tag() == STOP {
                return Ok(());
            }
        }
    }
    let ab = Channel::builder(format!("{name}-ab")).cuda(&s).open()?;
    let ba = Channel::builder(format!("{name}-ba")).cuda(&s);
    let ba = if role == "echo-gpu-events" { ba.ready(GpuReady::Event) } else { ba }.open()?;
    let (rx, tx) = (ab.receiver()?, ba.sender()?);
    loop {
        let m = rx.recv_timeout(Duration::from_secs(30))?;
        if m.tag() == STOP {
            return Ok(());
        }
        let lease = tx.acquire_timeout(Duration::from_secs(30))?;
        // SAFETY: both are live device slots of at least 4 bytes, in stream order.
        unsafe { result::memcpy_dtod_async(lease.device_ptr(), m.device_ptr(), 4, s.cu_stream()) }?;
        drop(m);
        tx.send(lease, TensorMeta::bytes(size as u64))?;
    }
}

/// A device buffer for the pipe baseline's copies.
pub(super) struct Staging {
    _ctx: Arc<CudaContext>,
    s: Arc<CudaStream>,
    buf: sys::CUdeviceptr,
}

impl Staging {
    pub(super) fn new(size: usize) -> Result<Self, Error> {
        let (ctx, s) = setup()?;
        // SAFETY: a plain allocation, freed in Drop.
        let buf = unsafe { result::malloc_sync(size) }?;
        Ok(Self { _ctx: ctx, s, buf })
    }

    /// Writes the sequence word on the device, then copies the buffer to the host.
    pub(super) fn write_then_download(&self, seq: u64, host: &mut [u8]) -> Result<(), Error> {
        memset_word(self.buf, seq as u32, &self.s)?;
        self.download(host)?;
        host[..8].copy_from_slice(&seq.to_le_bytes());
        Ok(())
    }

    pub(super) fn download(&self, host: &mut [u8]) -> Result<(), Error> {
        // SAFETY: `buf` holds `host.len()` bytes; synchronised before `host` is used.
        unsafe { result::memcpy_dtoh_async(host, self.buf, self.s.cu_stream()) }?;
        self.s.synchronize()?;
        Ok(())
    }

    pub(super) fn upload(&self, host: &[u8]) -> Result<(), Error> {
        // SAFETY: as above, the other way.
        unsafe { result::memcpy_htod_async(self.buf, host, self.s.cu_stream()) }?;
        self.s.synchronize()?;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: our allocation, no work pending after the synchronizes above.
        let _ = unsafe { result::free_sync(self.buf) };
    }
}

/// One line per GPU of this machine: its MPS state as this process sees it, and what a
/// GPU channel between two processes on it costs (for `inspect` of a GPU channel).
pub(super) fn machine_lines() -> Vec<String> {
    let count = result::device::get_count().unwrap_or(0).max(0) as usize;
    (0..count)
        .map(|ordinal| {
            let info = cuda::context(ordinal).and_then(|ctx| cuda::device_info(&ctx));
            match info {
                Ok(info) => {
                    // What a sender and a receiver both on this GPU would get.
                    let path = cuda::GpuPath::between(&info.uuid, &info);
                    format!("gpu       if both ends use it: {}", path.describe(&info))
                }
                Err(e) => format!("gpu       GPU {ordinal}: {e}"),
            }
        })
        .collect()
}
