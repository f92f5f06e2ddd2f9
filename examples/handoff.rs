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
//! Prints one JSON line: `{"p50_us": .., "p99_us": .., "items_per_s": ..}`. With `steps
//! [N]` instead, times each step of a 4 KB hand-off within one process (both ends here),
//! as `python/bench/object_steps.py` times the package's.
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
//! producer's call (lease, after its op) to the consumer holding the message (its read op
//! comes next, outside the window, as in the Python rows), both ends on CLOCK_MONOTONIC.
//! Rate: the producer sends as fast as it can; items/s over the consumer's steady state
//! (after the first tenth), with a synchronize at the end.

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("consume") {
        return gpu::consume(&args[2], args[3].parse()?, args[4] == "lat");
    }
    if args.get(1).map(String::as_str) == Some("steps") {
        return gpu::steps(args.get(2).map_or(Ok(2000), |n| n.parse())?);
    }
    let usage = "usage: handoff SIZE_BYTES N_LAT N_RATE WARM";
    let num = |i: usize| -> Result<u64, Box<dyn std::error::Error>> {
        Ok(args.get(i).ok_or(usage)?.parse::<u64>()?)
    };
    let (size, n_lat, n_rate, warm) = (num(1)?, num(2)?, num(3)?, num(4)?);
    let mut lat = gpu::run(size, n_lat + warm, true)?.lat.split_off(warm as usize);
    let rate = gpu::run(size, n_rate, false)?;
    let (p50, p99) = gpu::percentiles_us(&mut lat);
    println!(
        "{{\"p50_us\": {p50:.2}, \"p99_us\": {p99:.2}, \"items_per_s\": {:.0}}}",
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

    /// A channel name of this process for one run (`size` bytes, latency or rate), under
    /// the `gpuring-bench-` prefix the benches sweep after a killed run.
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

    /// Each step of the pattern, both ends in this process, `n` times: per-step p50 and p99.
    pub(crate) fn steps(n: usize) -> Result<(), Error> {
        let ctx = cuda::context(0)?;
        let s = ctx.default_stream();
        let size = 4096u64;
        let name = format!("gpuring-bench-handoff-{}-steps", std::process::id());
        let ch = Channel::builder(&name).capacity(256).slots(8, 1 << 20).cuda(&s).create()?;
        let (tx, rx) = (ch.sender()?, ch.receiver()?);
        // SAFETY: plain allocations, freed at the end after a synchronize.
        let (buf, out) = unsafe { (result::malloc_sync(size as usize)?, result::malloc_sync(4)?) };
        let meta = TensorMeta::bytes(size);
        let labels = [
            "memset (the producer's op)",
            "acquire + copy + send",
            "recv",
            "read (4-byte copy)",
            "drop the message",
        ];
        let mut per = vec![Vec::with_capacity(n); labels.len()];
        for i in 0..n {
            let mut t = [now_ns(); 6];
            // SAFETY: `buf` holds `size` bytes, in stream order.
            unsafe { sys::cuMemsetD32Async(buf, i as u32, size as usize / 4, s.cu_stream()) }
                .result()?;
            t[1] = now_ns();
            let lease = tx.acquire_timeout(WAIT)?;
            // SAFETY: the slot holds `size` bytes and is ours; `buf` is live.
            unsafe {
                result::memcpy_dtod_async(lease.device_ptr(), buf, size as usize, s.cu_stream())
            }?;
            tx.send_timeout(lease, meta, WAIT)?;
            t[2] = now_ns();
            let m = rx.recv_timeout(WAIT)?;
            t[3] = now_ns();
            // SAFETY: the message holds `size` bytes and is ours until dropped.
            unsafe { result::memcpy_dtod_async(out, m.device_ptr(), 4, s.cu_stream()) }?;
            t[4] = now_ns();
            drop(m);
            t[5] = now_ns();
            for (k, v) in per.iter_mut().enumerate() {
                v.push(t[k + 1] - t[k]);
            }
        }
        s.synchronize()?;
        for (label, v) in labels.iter().zip(per) {
            print_row(label, v);
        }
        // SAFETY: our allocations; the stream is synchronized.
        unsafe {
            result::free_sync(buf)?;
            result::free_sync(out)?;
        }
        let own = ctx.new_stream()?;
        copies(n, &s, &own)
    }

    fn print_row(label: &str, mut v: Vec<u64>) {
        let (p50, p99) = percentiles_us(&mut v);
        println!("  {label:<52} p50 {p50:7.2} us  p99 {p99:7.2} us");
    }

    /// The median and 99th percentile of `ns` (nanoseconds, sorted here), in microseconds.
    pub(crate) fn percentiles_us(ns: &mut [u64]) -> (f64, f64) {
        ns.sort_unstable();
        let at = |q: f64| ns[((q * ns.len() as f64) as usize).min(ns.len() - 1)] as f64 / 1e3;
        (at(0.5), at(0.99))
    }

    /// What the driver's copy calls cost the CPU (a GPU channel's sends make one per part):
    /// 4 KB device-to-device copies, one and ten at a time, on the legacy default stream
    /// `legacy` and on a created stream `own`, and ten in one `cuMemcpyBatchAsync`.
    fn copies(n: usize, legacy: &CudaStream, own: &CudaStream) -> Result<(), Error> {
        const PARTS: usize = 10;
        const BYTES: usize = 4096;
        // SAFETY: plain allocations, freed at the end after a synchronize.
        let (src, dst) =
            unsafe { (result::malloc_sync(BYTES * PARTS)?, result::malloc_sync(BYTES * PARTS)?) };
        let timed = |f: &dyn Fn() -> Result<(), Error>| -> Result<Vec<u64>, Error> {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                let t0 = now_ns();
                f()?;
                v.push(now_ns() - t0);
            }
            Ok(v)
        };
        let copy = |k: usize, s: &CudaStream| -> Result<(), Error> {
            let at = (k * BYTES) as u64;
            // SAFETY: both hold PARTS * BYTES bytes; stream-ordered.
            unsafe { result::memcpy_dtod_async(dst + at, src + at, BYTES, s.cu_stream()) }?;
            Ok(())
        };
        let one_legacy = timed(&|| copy(0, legacy))?;
        let one_own = timed(&|| copy(0, own))?;
        let ten_legacy = timed(&|| (0..PARTS).try_for_each(|k| copy(k, legacy)))?;
        let loc = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        };
        let batch = |s: &CudaStream| -> Result<(), Error> {
            let mut dsts: [sys::CUdeviceptr; PARTS] =
                std::array::from_fn(|k| dst + (k * BYTES) as u64);
            let mut srcs: [sys::CUdeviceptr; PARTS] =
                std::array::from_fn(|k| src + (k * BYTES) as u64);
            let mut sizes = [BYTES; PARTS];
            let mut attrs = [sys::CUmemcpyAttributes {
                srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
                srcLocHint: loc,
                dstLocHint: loc,
                flags: 0,
            }];
            let mut idx = [0usize];
            // SAFETY: PARTS entries in each array, one attribute applying from index 0;
            // both ranges are ours; stream-ordered.
            unsafe {
                sys::cuMemcpyBatchAsync_v2(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    PARTS,
                    attrs.as_mut_ptr(),
                    idx.as_mut_ptr(),
                    1,
                    s.cu_stream(),
                )
            }
            .result()?;
            Ok(())
        };
        let batched = match batch(own) {
            Ok(()) => Some(timed(&|| batch(own))?),
            Err(e) => {
                println!("  cuMemcpyBatchAsync refused: {e}");
                None
            }
        };
        legacy.synchronize()?;
        own.synchronize()?;
        print_row("4 KB copy, legacy default stream", one_legacy);
        print_row("4 KB copy, a created stream", one_own);
        print_row("10 x 4 KB copies, legacy default stream", ten_legacy);
        if let Some(v) = batched {
            print_row("10 x 4 KB in one cuMemcpyBatchAsync, created stream", v);
        }
        // SAFETY: our allocations; both streams are synchronized.
        unsafe {
            result::free_sync(src)?;
            result::free_sync(dst)?;
        }
        Ok(())
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
            // The message is usable: what the stream runs now comes after its writes.
            let t1 = now_ns();
            // The consumer's op, reading the message.
            // SAFETY: the message holds at least 4 bytes (the smallest bench size) and stays
            // ours until dropped (its release follows this copy in stream order).
            unsafe { result::memcpy_dtod_async(out, m.device_ptr(), 4, s.cu_stream()) }?;
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
