//! The Rust API doing what `python/bench/objects.py` measures of the Python package: a
//! producer process runs an op on its tensor and sends it through a GPU channel, a consumer
//! process receives it and runs an op that reads it. The bench runs this binary for its
//! "Rust API" rows, in the same call as the Python rows, so that what the package adds over
//! the Rust API is read off one run.
//!
//! ```text
//! cargo run --release --features cuda --example handoff -- SIZE_BYTES N_LAT N_RATE WARM
//! ```
//!
//! Prints one JSON line: `{"p50_us": .., "p99_us": .., "items_per_s": ..}`.
//!
//! As in the Python bench, with the defaults of `gpuring.Channel.create(name,
//! slot_bytes=max(size, 1 MiB), device=0)` (capacity 256, 8 slots, the default ready
//! signal) and both ends on the legacy default stream (torch's current stream unless a
//! program sets another):
//!
//! - the producer cycles through 8 tensors; per item it fills one (`cuMemsetD32Async` over
//!   the whole tensor: one kernel, as torch's `t.fill_(i)`), then leases a slot, copies the
//!   tensor into it (device to device) and sends it;
//! - the consumer receives and queues a 4-byte device-to-device copy out of the message
//!   (the op that reads it, as `x.view(-1)[:1] * 2`), then drops the message.
//!
//! Latency: one item in flight (the consumer acknowledges each over a pipe), from the
//! producer's call (lease) to the consumer's read op queued, both ends on CLOCK_MONOTONIC.
//! Rate: the producer sends as fast as it can; items/s over the consumer's steady state
//! (after the first tenth), with a synchronize at the end.

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("consume") {
        return gpu::consume(&args[2], args[3].parse()?, args[4] == "lat");
    }
    let usage = "usage: handoff SIZE_BYTES N_LAT N_RATE WARM";
    let num = |i: usize| -> Result<u64, Box<dyn std::error::Error>> {
        Ok(args.get(i).ok_or(usage)?.parse::<u64>()?)
    };
    let (size, n_lat, n_rate, warm) = (num(1)?, num(2)?, num(3)?, num(4)?);
    let mut lat = gpu::run(size, n_lat + warm, true)?.lat;
    let lat = lat.split_off(warm as usize);
    let rate = gpu::run(size, n_rate, false)?;
    let mut lat_ns = lat;
    lat_ns.sort_unstable();
    let at = |q: f64| lat_ns[((q * lat_ns.len() as f64) as usize).min(lat_ns.len() - 1)] as f64;
    println!(
        "{{\"p50_us\": {:.2}, \"p99_us\": {:.2}, \"items_per_s\": {:.0}}}",
        at(0.5) / 1e3,
        at(0.99) / 1e3,
        rate.items_per_s
    );
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("handoff: built without the `cuda` feature; nothing to measure");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::time::Duration;

    use cudarc::driver::{CudaStream, result, sys};
    use gpuring::{Channel, TensorMeta, cuda};

    type Error = Box<dyn std::error::Error>;

    /// Tensors the producer cycles through, as the Python bench's producer does.
    const POOL: usize = 8;
    const WAIT: Duration = Duration::from_secs(60);

    /// CLOCK_MONOTONIC in nanoseconds (what Python's `time.perf_counter_ns` reads).
    fn now_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    pub(crate) struct Run {
        pub(crate) lat: Vec<u64>,
        pub(crate) items_per_s: f64,
    }

    /// The channel the Python bench's channel rows make for `size` bytes.
    fn name_for(size: u64, lat: bool) -> String {
        let mode = if lat { "lat" } else { "rate" };
        format!("gpuring-bench-handoff-{}-{size}-{mode}", std::process::id())
    }

    /// One producer run (this process) against a consumer child; `lat`: one item in
    /// flight, each acknowledged with the consumer's timestamp.
    pub(crate) fn run(size: u64, n: u64, lat: bool) -> Result<Run, Error> {
        let ctx = cuda::context(0)?;
        let s = ctx.default_stream();
        let name = name_for(size, lat);
        let ch =
            Channel::builder(&name).capacity(256).slots(8, size.max(1 << 20)).cuda(&s).create()?;
        let tx = ch.sender()?;
        let mut child = Command::new(std::env::current_exe()?)
            .args(["consume", &name, &n.to_string(), if lat { "lat" } else { "rate" }])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut from_child = child.stdout.take().ok_or("no pipe from the consumer")?;
        let words = (size / 4) as usize;
        let pool: Vec<sys::CUdeviceptr> = (0..POOL)
            // SAFETY: plain allocations, freed below after a synchronize.
            .map(|_| unsafe { result::malloc_sync(size.max(4) as usize) })
            .collect::<Result<_, _>>()?;
        s.synchronize()?;
        let meta = TensorMeta::bytes(size);
        let mut sent = Vec::with_capacity(n as usize);
        let mut got = Vec::with_capacity(n as usize);
        for i in 0..n {
            let buf = pool[i as usize % POOL];
            // The producer's op on its tensor.
            // SAFETY: `buf` holds `words` words, in stream order.
            unsafe { sys::cuMemsetD32Async(buf, i as u32, words, s.cu_stream()) }.result()?;
            let t0 = now_ns();
            let lease = tx.acquire_timeout(WAIT)?;
            // SAFETY: the slot holds at least `size` bytes and is ours; `buf` is live.
            unsafe {
                result::memcpy_dtod_async(lease.device_ptr(), buf, size as usize, s.cu_stream())
            }?;
            tx.send_timeout(lease, meta, WAIT)?;
            sent.push(t0);
            if lat {
                let mut t1 = [0u8; 8];
                from_child.read_exact(&mut t1)?;
                got.push(u64::from_le_bytes(t1));
            }
        }
        let mut end = [0u8; 16];
        from_child.read_exact(&mut end)?;
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("the consumer exited with {status}").into());
        }
        s.synchronize()?;
        for buf in pool {
            // SAFETY: our allocations; the stream is synchronized, the consumer is gone.
            unsafe { result::free_sync(buf) }?;
        }
        let items = u64::from_le_bytes(end[..8].try_into()?);
        let nanos = u64::from_le_bytes(end[8..].try_into()?);
        drop(tx);
        drop(ch);
        Ok(Run {
            lat: sent.iter().zip(&got).map(|(s, g)| g.saturating_sub(*s)).collect(),
            items_per_s: items as f64 / (nanos.max(1) as f64 / 1e9),
        })
    }

    /// The consumer child: receives `n` messages and runs an op that reads each.
    pub(crate) fn consume(name: &str, n: u64, lat: bool) -> Result<(), Error> {
        let ctx = cuda::context(0)?;
        let s: Arc<CudaStream> = ctx.default_stream();
        let ch = Channel::builder(name).cuda(&s).open()?;
        let rx = ch.receiver()?;
        // SAFETY: a plain allocation of one word, freed at the end.
        let out = unsafe { result::malloc_sync(4) }?;
        let mut to_parent = std::io::stdout().lock();
        let mut t_first = 0;
        for i in 0..n {
            let m = rx.recv_timeout(WAIT)?;
            // The consumer's op, reading the message.
            // SAFETY: the message holds at least 4 bytes (the smallest bench size) and stays
            // ours until dropped (its release follows this copy in stream order).
            unsafe { result::memcpy_dtod_async(out, m.device_ptr(), 4, s.cu_stream()) }?;
            let t1 = now_ns();
            if i == n / 10 {
                t_first = t1;
            }
            drop(m);
            if lat {
                to_parent.write_all(&t1.to_le_bytes())?;
                to_parent.flush()?;
            }
        }
        s.synchronize()?;
        let items = n - 1 - n / 10;
        let nanos = now_ns() - t_first;
        to_parent.write_all(&items.to_le_bytes())?;
        to_parent.write_all(&nanos.to_le_bytes())?;
        to_parent.flush()?;
        // SAFETY: our allocation; the stream is synchronized.
        unsafe { result::free_sync(out) }?;
        Ok(())
    }
}
