//! Two processes pass 54 MB buffers: through a gpuring channel (the producer writes in
//! place, only a descriptor travels), then through a pipe (every byte is copied twice, as
//! a pickling Python queue must at the least). Prints items/s and GB/s for both.
//!
//! ```text
//! cargo run --release --example big_buffers [-- --items N] [--mb M] [--fill]
//! ```
//!
//! By default the producer writes a header and a trailer into each slot (the hand-off
//! itself); `--fill` makes it write every byte of every buffer, and the receiver then
//! checks one byte in every 4096. The example re-executes itself as the receiver.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuring::{Channel, DType, TensorMeta};

const ROLE: &str = "GPURING_BIG_PEER";
const SLOTS: u32 = 4;

struct Args {
    items: u64,
    bytes: usize,
    fill: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args { items: 2000, bytes: 54_000_000, fill: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |f: &str| it.next().ok_or(format!("{f} needs a value"));
        match flag.as_str() {
            "--items" => a.items = value("--items")?.parse().map_err(|e| format!("{e}"))?,
            "--mb" => {
                let mb: f64 = value("--mb")?.parse().map_err(|e| format!("{e}"))?;
                a.bytes = (mb * 1e6) as usize;
            }
            "--fill" => a.fill = true,
            _ => return Err("usage: big_buffers [--items N] [--mb M] [--fill]".into()),
        }
    }
    a.bytes = a.bytes.max(16).next_multiple_of(4);
    a.items = a.items.max(1);
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    if let Ok(name) = std::env::var(ROLE) {
        return if name == "pipe" { pipe_peer(&args) } else { channel_peer(&name, &args) };
    }
    let mb = args.bytes as f64 / 1e6;
    println!(
        "big_buffers: {} items of {mb:.1} MB, {}",
        args.items,
        if args.fill { "producer writes every byte" } else { "producer writes header + trailer" }
    );

    let ring = run_channel(&args)?;
    let pipe_items = pipe_items(args.items);
    let pipe = run_pipe(&args, pipe_items)?;

    println!("\n{:<10} {:>8} {:>14} {:>10}", "path", "items", "items/s", "GB/s");
    println!(
        "(GB/s: payload bytes handed over per second; gpuring moves a descriptor, the pipe copies every byte)"
    );
    for (label, items, secs) in [("gpuring", args.items, ring), ("pipe", pipe_items, pipe)] {
        let per_sec = items as f64 / secs;
        let gbs = per_sec * args.bytes as f64 / 1e9;
        println!("{label:<10} {items:>8} {per_sec:>14.1} {gbs:>10.2}");
    }
    println!(
        "\ngpuring vs pipe: {:.0}x the items per second",
        (args.items as f64 / ring) / (pipe_items as f64 / pipe)
    );
    Ok(())
}

/// The pipe copies every byte: it gets fewer items, so that it ends in seconds too.
fn pipe_items(items: u64) -> u64 {
    (items / 20).clamp(5, 200)
}

fn key(seq: u64) -> u64 {
    seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Streams `items` buffers through a channel; seconds from the first acquire until the
/// receiver has returned every slot. A first item, untimed, lets the receiver map the pool
/// (which pre-faults every page of it: a one-time cost per pool and receiver).
fn run_channel(args: &Args) -> Result<f64, Box<dyn std::error::Error>> {
    let name = format!("gpuring-big-{}", std::process::id());
    let ch = Channel::builder(&name).capacity(8).slots(SLOTS, args.bytes as u64).create()?;
    let tx = ch.sender()?;
    let mut peer = Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .env(ROLE, &name)
        .spawn()?;
    let meta = TensorMeta::contiguous(DType::F32, &[args.bytes as u64 / 4])?;
    let n = args.bytes;
    let mut start = Instant::now();
    for seq in 0..=args.items {
        if seq == 1 {
            while tx.free_slots() < SLOTS as usize {
                std::thread::sleep(Duration::from_micros(50));
            }
            start = Instant::now();
        }
        let mut lease = tx.acquire_timeout(Duration::from_secs(30))?;
        let k = key(seq).to_le_bytes();
        if args.fill {
            lease[..n].fill(k[0]);
        }
        lease[..8].copy_from_slice(&k);
        lease[n - 8..n].copy_from_slice(&k);
        tx.send(lease, meta)?;
    }
    while tx.free_slots() < SLOTS as usize {
        std::thread::sleep(Duration::from_micros(50));
    }
    let secs = start.elapsed().as_secs_f64();
    let status = peer.wait()?;
    if !status.success() {
        return Err(format!("channel receiver failed: {status}").into());
    }
    Ok(secs)
}

fn channel_peer(name: &str, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let ch = Channel::builder(name).open()?;
    let rx = ch.receiver()?;
    for seq in 0..=args.items {
        let m = rx.recv_timeout(Duration::from_secs(30))?;
        let k = key(seq).to_le_bytes();
        let ok = m.seq() == seq && m[..8] == k && m[m.len() - 8..] == k;
        let filled = !args.fill || m[8..m.len() - 8].iter().step_by(4096).all(|&b| b == k[0]);
        if !ok || !filled {
            return Err(format!("item {seq}: wrong bytes").into());
        }
    }
    Ok(())
}

/// Streams `items` buffers through a pipe; seconds until the reader has read them all.
fn run_pipe(args: &Args, items: u64) -> Result<f64, Box<dyn std::error::Error>> {
    let mut peer = Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .env(ROLE, "pipe")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let (mut to, mut from) = (peer.stdin.take().unwrap(), peer.stdout.take().unwrap());
    let mut buf = vec![0u8; args.bytes];
    let start = Instant::now();
    for seq in 0..items {
        let k = key(seq).to_le_bytes();
        if args.fill {
            buf.fill(k[0]);
        }
        buf[..8].copy_from_slice(&k);
        to.write_all(&buf)?;
    }
    let mut ack = [0u8; 8];
    from.read_exact(&mut ack)?;
    let secs = start.elapsed().as_secs_f64();
    drop(to);
    peer.wait()?;
    if u64::from_le_bytes(ack) != items {
        return Err("pipe reader lost items".into());
    }
    Ok(secs)
}

fn pipe_peer(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let (mut stdin, mut stdout) = (std::io::stdin().lock(), std::io::stdout().lock());
    let mut buf = vec![0u8; args.bytes];
    let mut items = 0u64;
    while stdin.read_exact(&mut buf).is_ok() {
        if buf[..8] != key(items).to_le_bytes() {
            return Err(format!("pipe item {items}: wrong bytes").into());
        }
        items += 1;
        if items == pipe_items(args.items) {
            stdout.write_all(&items.to_le_bytes())?;
            stdout.flush()?;
        }
    }
    Ok(())
}
