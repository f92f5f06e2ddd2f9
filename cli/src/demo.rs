//! `gpuring demo`: two processes hand off messages through a channel, then through a pipe
//! (or a Unix socket, for `bench`); prints both. The second process is this binary again,
//! run as `gpuring peer ROLE NAME SIZE`.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuring::{Backend, Channel, Lease, Sender, TensorMeta};
use indicatif::{ProgressBar, ProgressStyle};

#[cfg(feature = "cuda")]
use crate::gpu_demo;
use crate::{Error, bytes, duration, say, table};

pub(crate) const STOP: u64 = u64::MAX;

pub(crate) struct Figures {
    pub(crate) label: String,
    pub(crate) messages: u64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) per_sec: f64,
    /// One-way latencies of the ping-pongs, sorted.
    pub(crate) samples: Vec<Duration>,
}

pub(crate) fn demo(host: bool, gpu: bool, messages: u64, size: usize) -> Result<(), Error> {
    let use_gpu = gpu || (!host && gpu_present());
    if gpu && !gpu_present() {
        return Err(
            "--gpu: no CUDA device here (built without the cuda feature, or no driver)".into()
        );
    }
    let pings = (messages / 10).clamp(200, 20_000);
    // A pipe copies every byte: give it at most ~2 GB per phase.
    let pipe_messages = messages.min((2_000_000_000 / size as u64).max(20));
    say!(
        "gpuring demo: {} path, {messages} messages of {size} bytes, {pings} ping-pongs",
        if use_gpu { "GPU" } else { "host" }
    );
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))] // set by the GPU path
    let mut gpu_setup: Option<String> = None;
    // Where the default signals by host ready flags, the GPU path again with events.
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut events: Option<Figures> = None;
    let (ring, pipe) = if use_gpu {
        #[cfg(feature = "cuda")]
        {
            let (ring, setup, signal) = gpu_demo::channel(messages, size, pings, false)?;
            gpu_setup = Some(setup);
            if signal == gpuring::GpuReady::HostFlag {
                events = Some(gpu_demo::channel(messages, size, pings, true)?.0);
            } else {
                say!(
                    "(this device has no 64-bit stream memory operations: its senders signal \
                     by events)"
                );
            }
            (ring, gpu_demo::pipe(pipe_messages, size, pings)?)
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("gpu_present() is false without the cuda feature")
    } else {
        (
            host_channel(messages, size, pings)?,
            stream_figures(Transport::Pipe, pipe_messages, size, pings, false)?,
        )
    };
    let mut t =
        table("path | messages | payload | one-way p50 | one-way p99 | items/s | payload GB/s");
    for f in [Some(&ring), events.as_ref(), Some(&pipe)].into_iter().flatten() {
        t.add_row([
            f.label.clone(),
            f.messages.to_string(),
            bytes(size as u64),
            duration(f.p50),
            duration(f.p99),
            format!("{:.0}", f.per_sec),
            format!("{:.2}", f.per_sec * size as f64 / 1e9),
        ]);
    }
    say!("{t}");
    say!(
        "gpuring vs pipe: one-way p50 {:.1}x lower, {:.1}x the items per second",
        pipe.p50.as_secs_f64() / ring.p50.as_secs_f64(),
        ring.per_sec / pipe.per_sec
    );
    if pipe_messages < messages {
        say!(
            "(the pipe copies every byte: it ran {pipe_messages} of the {messages} messages, \
             about 2 GB, to keep the demo short)"
        );
    }
    if let Some(e) = &events {
        say!(
            "host ready flags (the default: the sender's stream writes a flag, the receiver's \
             CPU waits for it) vs events (GpuReady::Event): one-way p50 {:.2}x, {:.1}x the \
             items per second",
            ring.p50.as_secs_f64() / e.p50.as_secs_f64(),
            ring.per_sec / e.per_sec
        );
    }
    if let Some(setup) = gpu_setup {
        say!("{setup}");
    }
    if !use_gpu {
        say!(
            "(host path: the payload is written in place and never copied; a GPU machine runs the GPU path)"
        );
    }
    Ok(())
}

pub(crate) fn gpu_present() -> bool {
    #[cfg(feature = "cuda")]
    return gpuring::cuda::available()
        && cudarc::driver::result::device::get_count().is_ok_and(|n| n > 0);
    #[cfg(not(feature = "cuda"))]
    false
}

pub(crate) fn spawn_peer(role: &str, name: &str, size: usize, stdio: bool) -> Result<Child, Error> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["peer", role, name, &size.to_string()]);
    if stdio {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    }
    Ok(cmd.spawn()?)
}

pub(crate) fn finish(mut child: Child) -> Result<(), Error> {
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("the demo's peer process failed: {status}").into());
    }
    Ok(())
}

/// p50, p99, and the samples sorted.
pub(crate) fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration, Vec<Duration>) {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99), v)
}

pub(crate) fn progress(n: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(n);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} {per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_owned());
    bar
}

/// The stream half of a channel's figures: `messages` sent through `tx` to the sink peer
/// `child`, each a lease from `fill(seq)` described by `meta`, after one untimed warm-up
/// message (the receiver maps the pool), timed until every slot is back; then a `STOP`
/// ends the peer. `latency` is the ping-pong half.
pub(crate) fn stream_figures_of<B: Backend>(
    label: &str,
    (messages, latency): (u64, (Duration, Duration, Vec<Duration>)),
    (tx, child): (&Sender<B>, Child),
    meta: TensorMeta,
    fill: impl Fn(u64) -> Result<Lease<B>, Error>,
) -> Result<Figures, Error> {
    let send = |seq, tag| -> Result<(), Error> {
        let mut lease = fill(seq)?;
        lease.set_tag(tag);
        Ok(tx.send(lease, meta)?)
    };
    let wait_back = || {
        while tx.free_slots() != tx.slot_count() as usize {
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
    finish(child)?;
    let (p50, p99, samples) = latency;
    let per_sec = messages as f64 / secs;
    Ok(Figures { label: label.into(), messages, p50, p99, per_sec, samples })
}

pub(crate) fn host_channel(messages: u64, size: usize, pings: u64) -> Result<Figures, Error> {
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
    let latency = percentiles(samples);

    // Throughput: a stream one way, through up to 64 slots and about 256 MB of them.
    let slots = (256_000_000 / size).clamp(4, 64) as u32;
    let s =
        Channel::builder(format!("{name}-s")).capacity(256).slots(slots, size as u64).create()?;
    let tx = s.sender()?;
    let child = spawn_peer("sink-host", &name, size, false)?;
    stream_figures_of("gpuring", (messages, latency), (&tx, child), meta, |seq| {
        let mut lease = tx.acquire_timeout(Duration::from_secs(10))?;
        lease[..8].copy_from_slice(&seq.to_le_bytes());
        Ok(lease)
    })
}

/// A byte stream to a peer process: its stdin/stdout, or a connected Unix socket.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
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
pub(crate) fn stream_figures(
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

pub(crate) fn peer(role: &str, name: &str, size: usize) -> Result<(), Error> {
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
        "echo-gpu" | "echo-gpu-events" | "sink-gpu" => gpu_demo::peer(role, name, size),
        _ => Err(format!("unknown peer role {role}").into()),
    }
}
