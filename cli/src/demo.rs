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
use crate::{Error, bytes, duration, lower_or_higher, more_or_fewer, say, table};

pub(crate) const STOP: u64 = u64::MAX;

pub(crate) struct Figures {
    pub(crate) label: String,
    pub(crate) messages: u64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) per_sec: f64,
    /// One-way latencies of the ping-pongs, sorted.
    pub(crate) samples: Vec<Duration>,
    /// How far apart the p50s of the ping-pongs' five rounds were (largest ÷ smallest).
    pub(crate) spread: f64,
    /// Whether the hand-off carried the payload's bytes (pipes, sockets), rather than
    /// leaving them in place (gpuring).
    pub(crate) copies: bool,
}

/// The ping-pong half of a path's figures.
pub(crate) struct Latency {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    /// Sorted.
    pub(crate) samples: Vec<Duration>,
    pub(crate) spread: f64,
}

/// How long one phase of one path (its ping-pongs, or its stream) may run: the counts
/// asked for are the most it does. A 54 MB pipe ping-pong takes tens of milliseconds, so
/// counts alone would keep a demo busy for minutes.
pub(crate) const PHASE: Duration = Duration::from_millis(1500);

/// The fewest rounds a phase does, whatever the time: enough for a p99.
pub(crate) const MIN_ROUNDS: u64 = 30;

/// Whether a phase that started at `t` and has done `n` rounds has had its time.
pub(crate) fn phase_over(t: Instant, n: u64) -> bool {
    n >= MIN_ROUNDS && t.elapsed() >= PHASE
}

pub(crate) fn demo(host: bool, gpu: bool, messages: u64, size: usize) -> Result<(), Error> {
    let use_gpu = gpu || (!host && gpu_present());
    if gpu && !gpu_present() {
        return Err(
            "--gpu: no CUDA device here (built without the cuda feature, or no driver)".into()
        );
    }
    let pings = (messages / 10).clamp(200, 20_000);
    if !use_gpu {
        shm_fits(size)?;
    }
    say!(
        "gpuring demo: {} path, {} messages, up to {messages} streamed and {pings} ping-pongs \
         per path (each phase stops after {:.1} s)",
        if use_gpu { "GPU" } else { "host" },
        bytes(size as u64),
        PHASE.as_secs_f64()
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
            (ring, gpu_demo::pipe(messages, size, pings)?)
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("gpu_present() is false without the cuda feature")
    } else {
        (
            host_channel(messages, size, pings)?,
            stream_figures(Transport::Pipe, messages, size, pings, false)?,
        )
    };
    let rows: Vec<&Figures> =
        [Some(&ring), events.as_ref(), Some(&pipe)].into_iter().flatten().collect();
    let mut t =
        table("path | messages | payload | one-way p50 | one-way p99 | items/s | bytes copied/s");
    for f in &rows {
        t.add_row([
            f.label.clone(),
            f.messages.to_string(),
            bytes(size as u64),
            duration(f.p50),
            duration(f.p99),
            format!("{:.0}", f.per_sec),
            // A zero-copy hand-off moves no payload: no rate of bytes to show.
            if f.copies {
                format!("{}/s", bytes((f.per_sec * size as f64) as u64))
            } else {
                "none (in place)".into()
            },
        ]);
    }
    say!("{t}");
    say!(
        "gpuring vs pipe: one-way p50 {}, {} items per second",
        lower_or_higher(ring.p50, pipe.p50),
        more_or_fewer(ring.per_sec, pipe.per_sec)
    );
    if let Some(e) = &events {
        say!(
            "host ready flags (the default: the sender's stream writes a flag, the receiver's \
             CPU waits for it) vs events (GpuReady::Event): one-way p50 {}, {} items per second",
            lower_or_higher(ring.p50, e.p50),
            more_or_fewer(ring.per_sec, e.per_sec)
        );
    }
    for f in rows.iter().filter(|f| f.spread > 2.0) {
        say!(
            "(the p50 of {} varied {:.1}x between its five rounds: this machine is busy, so \
             take these figures as rough)",
            f.label,
            f.spread
        );
    }
    if let Some(setup) = gpu_setup {
        say!("{setup}");
    }
    if !use_gpu {
        say!(
            "(host path: the payload is written in place and never copied; a GPU machine runs \
             the GPU path)"
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

/// p50, p99, the samples sorted, and how far apart the p50s of five rounds (the samples in
/// the order taken, in five parts) were: a busy machine shows as rounds that disagree.
pub(crate) fn percentiles(v: Vec<Duration>) -> Latency {
    let p50 = |mut part: Vec<Duration>| {
        part.sort_unstable();
        part[(part.len() - 1) / 2]
    };
    let rounds: Vec<Duration> =
        v.chunks(v.len().div_ceil(5).max(1)).map(|c| p50(c.to_vec())).collect();
    let (lo, hi) = (rounds.iter().min().copied(), rounds.iter().max().copied());
    let spread = match (lo, hi) {
        (Some(lo), Some(hi)) if !lo.is_zero() => hi.as_secs_f64() / lo.as_secs_f64(),
        _ => 1.0,
    };
    let mut v = v;
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    Latency { p50: at(0.5), p99: at(0.99), samples: v, spread }
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
    (messages, latency): (u64, Latency),
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
    let bar = progress(messages, label);
    let t = Instant::now();
    let mut sent = 0;
    while sent < messages && !phase_over(t, sent) {
        sent += 1;
        send(sent, 0)?;
        if sent % 1024 == 0 {
            bar.set_position(sent);
        }
    }
    wait_back();
    let secs = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    send(0, STOP)?;
    finish(child)?;
    let Latency { p50, p99, samples, spread } = latency;
    let per_sec = sent as f64 / secs;
    Ok(Figures {
        label: label.into(),
        messages: sent,
        p50,
        p99,
        per_sec,
        samples,
        spread,
        copies: false,
    })
}

/// Slots for a stream of `size`-byte messages: as many as fit in half of what `/dev/shm`
/// has free and in 256 MB, from 2 to 64.
pub(crate) fn stream_slots(size: usize) -> u32 {
    let free = gpuring::inspect::shm_available().unwrap_or(u64::MAX) / 2;
    (free.min(256_000_000) / size as u64).clamp(2, 64) as u32
}

/// Whether host channels of `size`-byte slots for the demo fit in `/dev/shm`: two ping-pong
/// channels of two slots, then a stream of at least two. Says what to do where they do not.
pub(crate) fn shm_fits(size: usize) -> Result<(), String> {
    let needed = 4 * size as u64 + (1 << 20);
    match gpuring::inspect::shm_available() {
        Some(free) if free < needed => Err(format!(
            "{} messages need {} of /dev/shm, {} is free: smaller messages (--size, --sizes), or more shared \
             memory (a container's /dev/shm is 64 MB unless started with --shm-size)",
            bytes(size as u64),
            bytes(needed),
            bytes(free)
        )),
        _ => Ok(()),
    }
}

pub(crate) fn host_channel(messages: u64, size: usize, pings: u64) -> Result<Figures, Error> {
    let name = format!("gpuring-demo-{}", std::process::id());
    // Latency: A -> B and back, each way through its own channel.
    let ab = Channel::builder(format!("{name}-ab")).capacity(16).slots(2, size as u64).create()?;
    let ba = Channel::builder(format!("{name}-ba")).capacity(16).slots(2, size as u64).create()?;
    let (tx, rx) = (ab.sender()?, ba.receiver()?);
    let child = spawn_peer("echo-host", &name, size, false)?;
    let meta = TensorMeta::bytes(size as u64);
    let mut samples = Vec::with_capacity(pings as usize);
    let bar = progress(pings, "gpuring ping");
    let t0 = Instant::now();
    for seq in 0..=pings {
        if phase_over(t0, seq) {
            break;
        }
        bar.set_position(seq);
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
    bar.finish_and_clear();
    let mut stop = tx.acquire()?;
    stop.set_tag(STOP);
    tx.send(stop, TensorMeta::bytes(0))?;
    finish(child)?;
    drop((tx, rx, ab, ba)); // their slots go before the stream's are made
    let latency = percentiles(samples);

    // Throughput: a stream one way, through as many slots as fit (2 to 64).
    let slots = stream_slots(size);
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
    let bar = progress(pings, &format!("{label} ping"));
    let t0 = Instant::now();
    for seq in 0..=pings {
        if phase_over(t0, seq) {
            break;
        }
        bar.set_position(seq);
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
    bar.finish_and_clear();
    conn.finish()?;
    let Latency { p50, p99, samples, spread } = percentiles(samples);

    let mut conn = Conn::open(transport, &format!("sink{suffix}"), size)?;
    let bar = progress(messages, label);
    let t = Instant::now();
    let mut sent = 0;
    while sent < messages && !phase_over(t, sent) {
        let seq = sent;
        sent += 1;
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
    if u64::from_le_bytes(count) != sent {
        return Err(format!("the {label} reader lost messages").into());
    }
    Ok(Figures {
        label: label.into(),
        messages: sent,
        p50,
        p99,
        per_sec: sent as f64 / secs,
        samples,
        spread,
        copies: true,
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
