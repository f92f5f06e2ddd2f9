//! `gpuring`: see what the rings do, and what they cost next to a pipe.
//!
//! ```text
//! gpuring demo [--host | --gpu] [--messages N] [--size BYTES]
//! gpuring inspect NAME
//! gpuring list
//! gpuring clean [--dry-run]
//! ```

use std::io::{Read, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use gpuring::inspect::{self, Inspection};
use gpuring::{Channel, TensorMeta};
use indicatif::{ProgressBar, ProgressStyle};

type Error = Box<dyn std::error::Error>;

#[derive(Parser)]
#[command(
    name = "gpuring",
    version,
    about = "Zero-copy hand-off between processes: demo and tools"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Two processes hand off messages through a gpuring channel (GPU slots when a GPU is
    /// present, host slots otherwise), then through a pipe; prints both.
    Demo {
        /// Host slots, even on a GPU machine.
        #[arg(long, conflicts_with = "gpu")]
        host: bool,
        /// GPU slots (fails without a CUDA device).
        #[arg(long)]
        gpu: bool,
        /// Messages streamed one way for the throughput figure.
        #[arg(long, default_value_t = 100_000)]
        messages: u64,
        /// Payload bytes per message.
        #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(8..=(1u64 << 34)))]
        size: u64,
    },
    /// The comparison suite at a quick setting: gpuring channels against a pipe and a Unix
    /// socket carrying 4 KB, 5 MB and 54 MB payloads (plus the GPU path when a GPU is
    /// present), one table with ratios. `cargo bench` runs the full criterion suites.
    Bench {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Payload sizes in bytes, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [4096u64, 5_000_000, 54_000_000])]
        sizes: Vec<u64>,
        /// Also write every one-way latency sample to this CSV file (payload, path,
        /// nanoseconds), for `scripts/plot_latency.py`.
        #[arg(long)]
        samples: Option<std::path::PathBuf>,
    },
    /// Show a segment: kind, ring positions and depth, waiters, roles, pools and slots.
    Inspect {
        /// Segment name (as created; a leading `/` is optional).
        name: String,
    },
    /// gpuring segments on this machine, with their creators' liveness.
    List,
    /// Remove segments whose creator is dead (never one whose creator runs).
    Clean {
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
    /// (internal) the demo's second process.
    #[command(hide = true)]
    Peer { role: String, name: String, size: usize },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Demo { host, gpu, messages, size } => demo(host, gpu, messages, size as usize),
        Cmd::Bench { json, sizes, samples } => bench(json, &sizes, samples.as_deref()),
        Cmd::Inspect { name } => inspect::inspect(&name).map_err(Error::from).map(print_inspection),
        Cmd::List => list(),
        Cmd::Clean { dry_run } => clean(dry_run),
        Cmd::Peer { role, name, size } => peer(&role, &name, size),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuring: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// demo

const STOP: u64 = u64::MAX;

struct Figures {
    label: String,
    messages: u64,
    p50: Duration,
    p99: Duration,
    per_sec: f64,
    /// One-way latencies of the ping-pongs, sorted.
    samples: Vec<Duration>,
}

fn demo(host: bool, gpu: bool, messages: u64, size: usize) -> Result<(), Error> {
    let use_gpu = gpu || (!host && gpu_present());
    if gpu && !gpu_present() {
        return Err(
            "--gpu: no CUDA device here (built without the cuda feature, or no driver)".into()
        );
    }
    let messages = messages.max(1);
    let pings = (messages / 10).clamp(200, 20_000);
    // A pipe copies every byte: give it at most ~2 GB per phase.
    let pipe_messages = messages.min((2_000_000_000 / size as u64).max(20));
    println!(
        "gpuring demo: {} path, {messages} messages of {size} bytes, {pings} ping-pongs",
        if use_gpu { "GPU" } else { "host" }
    );
    let (ring, pipe) = if use_gpu {
        #[cfg(feature = "cuda")]
        {
            (gpu_demo::channel(messages, size, pings)?, gpu_demo::pipe(pipe_messages, size, pings)?)
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("gpu_present() is false without the cuda feature")
    } else {
        (
            host_channel(messages, size, pings)?,
            stream_figures(Transport::Pipe, pipe_messages, size, pings, false)?,
        )
    };
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "path",
        "messages",
        "payload",
        "one-way p50",
        "one-way p99",
        "items/s",
        "payload GB/s",
    ]);
    for f in [&ring, &pipe] {
        table.add_row([
            f.label.clone(),
            f.messages.to_string(),
            bytes(size as u64),
            duration(f.p50),
            duration(f.p99),
            format!("{:.0}", f.per_sec),
            format!("{:.2}", f.per_sec * size as f64 / 1e9),
        ]);
    }
    println!("{table}");
    println!(
        "gpuring vs pipe: one-way p50 {:.1}x lower, {:.1}x the items per second",
        pipe.p50.as_secs_f64() / ring.p50.as_secs_f64(),
        ring.per_sec / pipe.per_sec
    );
    if !use_gpu {
        println!(
            "(host path: the payload is written in place and never copied; a GPU machine runs the GPU path)"
        );
    }
    Ok(())
}

fn gpu_present() -> bool {
    #[cfg(feature = "cuda")]
    return gpuring::cuda::available()
        && cudarc::driver::result::device::get_count().is_ok_and(|n| n > 0);
    #[cfg(not(feature = "cuda"))]
    false
}

fn spawn_peer(role: &str, name: &str, size: usize, stdio: bool) -> Result<Child, Error> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["peer", role, name, &size.to_string()]);
    if stdio {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    }
    Ok(cmd.spawn()?)
}

fn finish(mut child: Child) -> Result<(), Error> {
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("the demo's peer process failed: {status}").into());
    }
    Ok(())
}

/// p50, p99, and the samples sorted.
fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration, Vec<Duration>) {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99), v)
}

fn progress(n: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(n);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} {per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_owned());
    bar
}

/// Streams `messages` through `send(seq, tag)` after one untimed warm-up message (the
/// receiver maps the pool); seconds until `all_back` says every slot returned. Ends the
/// peer with a `STOP` tag.
fn timed_stream(
    messages: u64,
    send: &dyn Fn(u64, u64) -> Result<(), Error>,
    all_back: impl Fn() -> bool,
) -> Result<f64, Error> {
    let wait_back = || {
        while !all_back() {
            std::thread::yield_now();
        }
    };
    send(0, 0)?;
    wait_back();
    let bar = progress(messages, "gpuring");
    let t = Instant::now();
    for seq in 1..=messages {
        send(seq, 0)?;
        if seq % 1024 == 0 {
            bar.set_position(seq);
        }
    }
    wait_back();
    let secs = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    send(0, STOP)?;
    Ok(secs)
}

fn host_channel(messages: u64, size: usize, pings: u64) -> Result<Figures, Error> {
    let name = format!("gpuring-demo-{}", std::process::id());
    // Latency: A -> B and back, each way through its own channel.
    let ab = Channel::builder(format!("{name}-ab")).capacity(16).slots(4, size as u64).create()?;
    let ba = Channel::builder(format!("{name}-ba")).capacity(16).slots(4, size as u64).create()?;
    let (tx, rx) = (ab.sender()?, ba.receiver()?);
    let child = spawn_peer("echo-host", &name, size, false)?;
    let meta = TensorMeta::bytes(size as u64);
    let mut samples = Vec::with_capacity(pings as usize);
    for seq in 0..=pings {
        let t = Instant::now();
        let mut lease = tx.acquire_timeout(Duration::from_secs(10))?;
        lease[..8].copy_from_slice(&seq.to_le_bytes());
        tx.send(lease, meta)?;
        let m = rx.recv_timeout(Duration::from_secs(10))?;
        if m[..8] != seq.to_le_bytes() {
            return Err("echo returned the wrong message".into());
        }
        drop(m);
        if seq > 0 {
            samples.push(t.elapsed() / 2); // the first round trip maps the pools
        }
    }
    let mut stop = tx.acquire()?;
    stop.set_tag(STOP);
    tx.send(stop, TensorMeta::bytes(0))?;
    finish(child)?;
    let (p50, p99, samples) = percentiles(samples);

    // Throughput: a stream one way, through up to 64 slots and about 256 MB of them.
    let slots = (256_000_000 / size).clamp(4, 64) as u32;
    let s =
        Channel::builder(format!("{name}-s")).capacity(256).slots(slots, size as u64).create()?;
    let tx = s.sender()?;
    let child = spawn_peer("sink-host", &name, size, false)?;
    let send = |seq: u64, tag: u64| -> Result<(), Error> {
        let mut lease = tx.acquire_timeout(Duration::from_secs(10))?;
        lease[..8].copy_from_slice(&seq.to_le_bytes());
        lease.set_tag(tag);
        tx.send(lease, meta)?;
        Ok(())
    };
    let secs = timed_stream(messages, &send, || tx.free_slots() == slots as usize)?;
    finish(child)?;
    Ok(Figures {
        label: "gpuring".into(),
        messages,
        p50,
        p99,
        per_sec: messages as f64 / secs,
        samples,
    })
}

/// A byte stream to a peer process: its stdin/stdout, or a connected Unix socket.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Pipe,
    Unix,
}

/// A connection to a stream peer; `close_write` signals end of stream.
struct Conn {
    child: Child,
    r: Box<dyn Read>,
    w: Option<Box<dyn Write>>,
    socket: Option<(std::os::unix::net::UnixStream, std::path::PathBuf)>,
}

impl Conn {
    fn open(transport: Transport, role: &str, size: usize) -> Result<Conn, Error> {
        match transport {
            Transport::Pipe => {
                let mut child = spawn_peer(&format!("pipe-{role}"), "-", size, true)?;
                let w = child.stdin.take().expect("piped");
                let r = child.stdout.take().expect("piped");
                Ok(Conn { child, r: Box::new(r), w: Some(Box::new(w)), socket: None })
            }
            Transport::Unix => {
                let path = std::env::temp_dir()
                    .join(format!("gpuring-{}-{role}.sock", std::process::id()));
                let _ = std::fs::remove_file(&path);
                let listener = std::os::unix::net::UnixListener::bind(&path)?;
                let child =
                    spawn_peer(&format!("unix-{role}"), &path.to_string_lossy(), size, false)?;
                let (s, _) = listener.accept()?;
                let (r, w) = (s.try_clone()?, s.try_clone()?);
                Ok(Conn { child, r: Box::new(r), w: Some(Box::new(w)), socket: Some((s, path)) })
            }
        }
    }

    fn writer(&mut self) -> &mut dyn Write {
        self.w.as_mut().expect("open for writing")
    }

    fn close_write(&mut self) -> Result<(), Error> {
        self.w = None;
        if let Some((s, _)) = &self.socket {
            s.shutdown(std::net::Shutdown::Write)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), Error> {
        self.close_write()?;
        if let Some((_, path)) = &self.socket {
            let _ = std::fs::remove_file(path);
        }
        finish(self.child)
    }
}

/// The same hand-offs through a pipe or a Unix socket: every byte written, copied through
/// the kernel, read. With `gpu`, each side also copies device → host before writing and
/// host → device after reading, as a hand-rolled pipe must for GPU tensors.
fn stream_figures(
    transport: Transport,
    messages: u64,
    size: usize,
    pings: u64,
    gpu: bool,
) -> Result<Figures, Error> {
    let label = if transport == Transport::Pipe { "pipe" } else { "unix socket" };
    let suffix = if gpu { "-gpu" } else { "" };
    let mut conn = Conn::open(transport, &format!("echo{suffix}"), size)?;
    let mut buf = vec![0u8; size];
    #[cfg(feature = "cuda")]
    let dev = if gpu { Some(gpu_demo::Staging::new(size)?) } else { None };
    let mut samples = Vec::with_capacity(pings as usize);
    for seq in 0..=pings {
        let t = Instant::now();
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        #[cfg(feature = "cuda")]
        if let Some(d) = &dev {
            d.write_then_download(seq, &mut buf)?;
        }
        conn.writer().write_all(&buf)?;
        conn.r.read_exact(&mut buf)?;
        #[cfg(feature = "cuda")]
        if let Some(d) = &dev {
            d.upload(&buf)?;
        }
        if buf[..8] != seq.to_le_bytes() {
            return Err(format!("{label} echo returned the wrong message").into());
        }
        if seq > 0 {
            samples.push(t.elapsed() / 2);
        }
    }
    conn.finish()?;
    let (p50, p99, samples) = percentiles(samples);

    let mut conn = Conn::open(transport, &format!("sink{suffix}"), size)?;
    let bar = progress(messages, label);
    let t = Instant::now();
    for seq in 0..messages {
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        #[cfg(feature = "cuda")]
        if let Some(d) = &dev {
            d.write_then_download(seq, &mut buf)?;
        }
        conn.writer().write_all(&buf)?;
        if seq % 1024 == 0 {
            bar.set_position(seq);
        }
    }
    conn.close_write()?;
    let mut count = [0u8; 8];
    conn.r.read_exact(&mut count)?;
    let secs = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    conn.finish()?;
    if u64::from_le_bytes(count) != messages {
        return Err(format!("the {label} reader lost messages").into());
    }
    Ok(Figures {
        label: label.into(),
        messages,
        p50,
        p99,
        per_sec: messages as f64 / secs,
        samples,
    })
}

/// The stream peer: reads `size`-byte messages; an echo writes each back, a sink counts
/// them and writes the count at end of stream.
fn stream_peer(mut r: impl Read, mut w: impl Write, role: &str, size: usize) -> Result<(), Error> {
    let echo = role.contains("echo");
    let mut buf = vec![0u8; size];
    #[cfg(feature = "cuda")]
    let dev = if role.ends_with("gpu") { Some(gpu_demo::Staging::new(size)?) } else { None };
    let mut count = 0u64;
    while r.read_exact(&mut buf).is_ok() {
        count += 1;
        #[cfg(feature = "cuda")]
        if let Some(d) = &dev {
            d.upload(&buf)?;
            if echo {
                d.download(&mut buf)?;
            }
        }
        if echo {
            w.write_all(&buf)?;
            w.flush()?;
        }
    }
    if !echo {
        w.write_all(&count.to_le_bytes())?;
        w.flush()?;
    }
    Ok(())
}

fn peer(role: &str, name: &str, size: usize) -> Result<(), Error> {
    match role {
        "echo-host" => {
            let ab = Channel::builder(format!("{name}-ab")).open()?;
            let ba = Channel::builder(format!("{name}-ba")).open()?;
            let (rx, tx) = (ab.receiver()?, ba.sender()?);
            loop {
                let m = rx.recv_timeout(Duration::from_secs(30))?;
                if m.tag() == STOP {
                    return Ok(());
                }
                let mut lease = tx.acquire_timeout(Duration::from_secs(30))?;
                lease[..8].copy_from_slice(&m[..8]);
                drop(m);
                tx.send(lease, TensorMeta::bytes(size as u64))?;
            }
        }
        "sink-host" => {
            let s = Channel::builder(format!("{name}-s")).open()?;
            let rx = s.receiver()?;
            loop {
                let m = rx.recv_timeout(Duration::from_secs(30))?;
                if m.tag() == STOP {
                    return Ok(());
                }
            }
        }
        r if r.starts_with("pipe-") => {
            stream_peer(std::io::stdin().lock(), std::io::stdout().lock(), r, size)
        }
        r if r.starts_with("unix-") => {
            let s = std::os::unix::net::UnixStream::connect(name)?;
            stream_peer(s.try_clone()?, s, r, size)
        }
        #[cfg(feature = "cuda")]
        "echo-gpu" | "sink-gpu" => gpu_demo::peer(role, name, size),
        _ => Err(format!("unknown peer role {role}").into()),
    }
}

#[cfg(feature = "cuda")]
mod gpu_demo {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use cudarc::driver::{CudaContext, CudaStream, result, sys};
    use gpuring::{Channel, TensorMeta, cuda};

    use super::{Error, Figures, STOP, finish, percentiles, spawn_peer};

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
    /// to the host), then a one-way stream.
    pub(super) fn channel(messages: u64, size: usize, pings: u64) -> Result<Figures, Error> {
        let (ctx, s) = setup()?;
        let name = format!("gpuring-demo-{}", std::process::id());
        let make = |suffix: &str, cap: u64, slots: u32| {
            Channel::builder(format!("{name}-{suffix}"))
                .capacity(cap)
                .slots(slots, size as u64)
                .cuda(&ctx)
                .create()
        };
        let (ab, ba) = (make("ab", 16, 4)?, make("ba", 16, 4)?);
        let (tx, rx) = (ab.sender()?, ba.receiver()?);
        let child = spawn_peer("echo-gpu", &name, size, false)?;
        let meta = TensorMeta::bytes(size as u64);
        let mut samples = Vec::with_capacity(pings as usize);
        for seq in 0..=pings {
            let t = Instant::now();
            let lease = tx.acquire_on_timeout(&s, Duration::from_secs(10))?;
            memset_word(lease.device_ptr(), seq as u32, &s)?;
            tx.send_gpu(lease, meta)?;
            let m = rx.recv_on_timeout(&s, Duration::from_secs(10))?;
            if read_word(m.device_ptr(), &s)? != seq as u32 {
                return Err("echo returned the wrong word".into());
            }
            drop(m);
            if seq > 0 {
                samples.push(t.elapsed() / 2);
            }
        }
        let mut stop = tx.acquire_on(&s)?;
        stop.set_tag(STOP);
        tx.send_gpu(stop, TensorMeta::bytes(0))?;
        finish(child)?;
        let (p50, p99, samples) = percentiles(samples);

        let slots = 64;
        let sc = make("s", 256, slots)?;
        let tx = sc.sender()?;
        let child = spawn_peer("sink-gpu", &name, size, false)?;
        let send = |seq: u64, tag: u64| -> Result<(), Error> {
            let mut lease = tx.acquire_on_timeout(&s, Duration::from_secs(10))?;
            memset_word(lease.device_ptr(), seq as u32, &s)?;
            lease.set_tag(tag);
            tx.send_gpu(lease, meta)?;
            Ok(())
        };
        let secs = super::timed_stream(messages, &send, || tx.free_slots() == slots as usize)?;
        finish(child)?;
        Ok(Figures {
            label: "gpuring (GPU)".into(),
            messages,
            p50,
            p99,
            per_sec: messages as f64 / secs,
            samples,
        })
    }

    pub(super) fn pipe(messages: u64, size: usize, pings: u64) -> Result<Figures, Error> {
        let mut f = super::stream_figures(super::Transport::Pipe, messages, size, pings, true)?;
        f.label = "pipe (GPU→host→pipe→GPU)".into();
        Ok(f)
    }

    pub(super) fn peer(role: &str, name: &str, size: usize) -> Result<(), Error> {
        let (ctx, s) = setup()?;
        if role == "sink-gpu" {
            let sc = Channel::builder(format!("{name}-s")).cuda(&ctx).open()?;
            let rx = sc.receiver()?;
            loop {
                let m = rx.recv_on_timeout(&s, Duration::from_secs(30))?;
                if m.tag() == STOP {
                    return Ok(());
                }
            }
        }
        let ab = Channel::builder(format!("{name}-ab")).cuda(&ctx).open()?;
        let ba = Channel::builder(format!("{name}-ba")).cuda(&ctx).open()?;
        let (rx, tx) = (ab.receiver()?, ba.sender()?);
        loop {
            let m = rx.recv_on_timeout(&s, Duration::from_secs(30))?;
            if m.tag() == STOP {
                return Ok(());
            }
            let lease = tx.acquire_on_timeout(&s, Duration::from_secs(30))?;
            // SAFETY: both are live device slots of at least 4 bytes, in stream order.
            unsafe {
                result::memcpy_dtod_async(lease.device_ptr(), m.device_ptr(), 4, s.cu_stream())
            }?;
            drop(m);
            tx.send_gpu(lease, TensorMeta::bytes(size as u64))?;
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
}

// ---------------------------------------------------------------------------------------
// bench

fn bench(json: bool, sizes: &[u64], samples: Option<&std::path::Path>) -> Result<(), Error> {
    if let Some(bad) = sizes.iter().find(|&&s| !(8..=1 << 34).contains(&s)) {
        return Err(format!("--sizes: {bad} is outside 8..=17179869184 bytes").into());
    }
    // (payload bytes, messages streamed, ping-pongs): about 200 MB streamed per case, at
    // least 300 messages.
    let cases = sizes.iter().map(|&s| {
        let messages = (200_000_000 / s).clamp(300, 50_000);
        (s as usize, messages, (messages / 10).clamp(50, 5_000))
    });
    let mut rows: Vec<(usize, Figures, f64, f64)> = Vec::new();
    // `base`: gpuring's (p50, items/s) for the row's payload.
    let mut push = |size: usize, base: (Duration, f64), f: Figures| {
        let lat = f.p50.as_secs_f64() / base.0.as_secs_f64();
        let rate = base.1 / f.per_sec;
        rows.push((size, f, lat, rate));
    };
    for (size, messages, pings) in cases {
        // The copying paths get about 1 GB per phase.
        let copied = messages.min((1_000_000_000 / size as u64).max(20));
        let g = host_channel(messages, size, pings)?;
        let p = stream_figures(Transport::Pipe, copied, size, pings, false)?;
        let u = stream_figures(Transport::Unix, copied, size, pings, false)?;
        let base = (g.p50, g.per_sec);
        push(size, base, g);
        push(size, base, p);
        push(size, base, u);
    }
    #[cfg(feature = "cuda")]
    if gpu_present() {
        let g = gpu_demo::channel(20_000, 4096, 2_000)?;
        let p = gpu_demo::pipe(20_000, 4096, 2_000)?;
        let base = (g.p50, g.per_sec);
        push(4096, base, g);
        push(4096, base, p);
    }
    if let Some(path) = samples {
        let mut csv = String::from("payload_bytes,path,one_way_ns\n");
        for (size, f, _, _) in &rows {
            for d in &f.samples {
                csv.push_str(&format!("{size},{},{}\n", f.label, d.as_nanos()));
            }
        }
        std::fs::write(path, csv)?;
    }
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|(size, f, lat, rate)| {
                serde_json::json!({
                    "payload_bytes": size,
                    "path": f.label,
                    "messages": f.messages,
                    "one_way_p50_ns": f.p50.as_nanos() as u64,
                    "one_way_p99_ns": f.p99.as_nanos() as u64,
                    "items_per_sec": f.per_sec,
                    "p50_over_gpuring_p50": lat,
                    "gpuring_items_per_sec_over_this": rate,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header([
        "payload",
        "path",
        "one-way p50",
        "one-way p99",
        "items/s",
        "p50 ÷ gpuring's",
        "gpuring's items/s ÷ this",
    ]);
    for (size, f, lat, rate) in &rows {
        t.add_row([
            bytes(*size as u64),
            f.label.clone(),
            duration(f.p50),
            duration(f.p99),
            format!("{:.0}", f.per_sec),
            format!("{lat:.2}x"),
            format!("{rate:.1}x"),
        ]);
    }
    println!("{t}");
    println!("(one run on this machine; a ratio above 1x means gpuring is ahead on that row)");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// inspect, list, clean

fn alive(a: Option<bool>) -> &'static str {
    match a {
        Some(true) => "alive",
        Some(false) => "dead",
        None => "-",
    }
}

fn print_inspection(i: Inspection) {
    println!("segment   {} ({:?}, {} bytes)", i.name, i.kind, i.size);
    println!("creator   pid {} ({})", i.creator.0, alive(i.creator.1));
    if let Some(r) = &i.ring {
        println!(
            "ring      capacity {}, element {} bytes, head {}, tail {}, depth {}",
            r.capacity,
            r.elem_size,
            r.head,
            r.tail,
            r.depth()
        );
        println!(
            "waiters   {} receiver(s) asleep, {} sender(s) asleep",
            r.waiting_consumers, r.waiting_producers
        );
        for (role, who) in [("producer", r.producer), ("consumer", r.consumer)] {
            if let Some((pid, a)) = who {
                println!("{role:<9} pid {pid} ({})", alive(a));
            }
        }
        for p in &r.participants {
            println!(
                "attached  #{} {} pid {} ({})",
                p.index,
                p.role,
                p.pid,
                if p.alive { "alive" } else { "dead: its process died attached" }
            );
        }
    }
    if !i.pools.is_empty() {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED).set_header([
            "pool",
            "state",
            "owner",
            "backend",
            "slots",
            "slot size",
            "free",
            "leased",
            "in flight",
            "held",
            "segment",
        ]);
        for p in &i.pools {
            let counts = |f: fn(&inspect::SlotCounts) -> u32| {
                p.slots.as_ref().map_or("?".to_owned(), |c| f(c).to_string())
            };
            t.add_row([
                format!("{}.{}", p.index, p.instance),
                p.state.to_owned(),
                format!("{} ({})", p.owner.0, alive(p.owner.1)),
                if p.backend == 2 { "cuda" } else { "host" }.to_owned(),
                p.slot_count.to_string(),
                bytes(p.slot_size),
                counts(|c| c.free),
                counts(|c| c.leased),
                counts(|c| c.in_flight),
                counts(|c| c.held),
                p.name.clone(),
            ]);
        }
        println!("{t}");
    }
}

fn list() -> Result<(), Error> {
    let all = inspect::list()?;
    if all.is_empty() {
        println!("no gpuring segments in /dev/shm");
        return Ok(());
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_header(["name", "kind", "size", "age", "creator", "state"]);
    for s in all {
        t.add_row([
            s.name,
            s.kind.map_or("unknown".to_owned(), |k| format!("{k:?}")),
            bytes(s.size),
            s.age.map_or("-".to_owned(), |a| format!("{}s", a.as_secs())),
            format!("{} ({})", s.creator_pid, alive(s.creator_alive)),
            if s.initialized { "ready" } else { "not initialised" }.to_owned(),
        ]);
    }
    println!("{t}");
    Ok(())
}

fn clean(dry_run: bool) -> Result<(), Error> {
    let removed = inspect::clean(dry_run)?;
    let verb = if dry_run { "would remove" } else { "removed" };
    for name in &removed {
        println!("{verb} {name}");
    }
    println!("{verb} {} segment(s) whose creator is dead", removed.len());
    Ok(())
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

fn duration(d: Duration) -> String {
    if d < Duration::from_micros(10) {
        format!("{} ns", d.as_nanos())
    } else if d < Duration::from_millis(10) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    }
}
