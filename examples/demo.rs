//! Two processes hand descriptors to each other through gpuring, then through a pipe, and
//! the demo prints what each cost.
//!
//! ```text
//! cargo run --release --example demo [-- --messages N]
//! ```
//!
//! The demo re-executes itself as the second process. Latency is measured by ping-pong
//! (one-way = round trip / 2, per message, p50 and p99); throughput by streaming N
//! descriptors one way and waiting for the peer's acknowledgement of the last.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuring::{DType, Descriptor, SpscRing, TensorMeta};

const ROLE: &str = "GPURING_DEMO_PEER";
// Message tags: echo a ping; count streamed messages; acknowledge the last with the count.
const STREAM: u64 = 0;
const LAST: u64 = 1;
const PING: u64 = 2;
const STOP: u64 = 3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(name) = std::env::var(ROLE) {
        return if name == "pipe" { pipe_peer() } else { ring_peer(&name) };
    }
    let messages = parse_messages()?;
    let pings = (messages / 10).max(1000);
    println!(
        "gpuring demo: {messages} descriptors of {} bytes, {pings} ping-pongs",
        size_of::<Descriptor>()
    );
    println!("(host descriptors only: the GPU path arrives with the CUDA slot pool)");
    println!("wake-up barrier: {:?}\n", gpuring::internal::barrier_mode());

    let ring = measure_ring(pings, messages)?;
    let pipe = measure_pipe(pings, messages)?;

    println!("{:<10} {:>14} {:>14} {:>16}", "path", "one-way p50", "one-way p99", "throughput");
    for (label, r) in [("gpuring", &ring), ("pipe", &pipe)] {
        println!("{label:<10} {:>14} {:>14} {:>12.2} M/s", fmt(r.p50), fmt(r.p99), r.per_sec / 1e6);
    }
    println!(
        "\ngpuring vs pipe: latency p50 {:.1}x lower, throughput {:.1}x higher",
        pipe.p50.as_secs_f64() / ring.p50.as_secs_f64(),
        ring.per_sec / pipe.per_sec
    );
    Ok(())
}

fn parse_messages() -> Result<u64, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(1_000_000),
        [flag, n] if flag == "--messages" => Ok(n.parse::<u64>()?.max(1)),
        _ => Err("usage: demo [--messages N]".into()),
    }
}

struct Figures {
    p50: Duration,
    p99: Duration,
    per_sec: f64,
}

fn fmt(d: Duration) -> String {
    if d < Duration::from_micros(10) {
        format!("{} ns", d.as_nanos())
    } else {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    }
}

fn percentiles(mut one_way: Vec<Duration>) -> (Duration, Duration) {
    one_way.sort_unstable();
    let at = |q: f64| one_way[((one_way.len() - 1) as f64 * q) as usize];
    (at(0.50), at(0.99))
}

fn message(seq: u64, tag: u64) -> Descriptor {
    // A descriptor as a tensor producer would fill it: dtype, shape, strides, length.
    let meta = TensorMeta::contiguous(DType::F16, &[8, 1024]).expect("valid shape");
    Descriptor::new(seq, &meta).with_tag(tag)
}

fn stream_tag(seq: u64, messages: u64) -> u64 {
    if seq + 1 == messages { LAST } else { STREAM }
}

fn measure_ring(pings: u64, messages: u64) -> Result<Figures, Box<dyn std::error::Error>> {
    let name = format!("gpuring-demo-{}", std::process::id());
    let to_peer = SpscRing::<Descriptor>::builder(format!("{name}-a")).capacity(1024).create()?;
    let from_peer = SpscRing::<Descriptor>::builder(format!("{name}-b")).capacity(1024).create()?;
    let (mut tx, mut rx) = (to_peer.producer()?, from_peer.consumer()?);
    let mut child = Command::new(std::env::current_exe()?).env(ROLE, &name).spawn()?;

    // One message at a time: hand each cell to the shared cache as it is published.
    tx.set_demote(true);
    let mut one_way = Vec::with_capacity(pings as usize);
    for seq in 0..pings {
        let t = Instant::now();
        tx.push(message(seq, PING))?;
        let back = rx.pop()?;
        one_way.push(t.elapsed() / 2);
        assert_eq!(back.seq, seq, "the peer echoes each message");
    }
    // A stream: leave the cells where they are (demoting would halve the rate).
    tx.set_demote(false);
    let t = Instant::now();
    for seq in 0..messages {
        tx.push(message(seq, stream_tag(seq, messages)))?;
    }
    let ack = rx.pop()?;
    let elapsed = t.elapsed();
    assert_eq!(ack.seq, messages, "the peer counted every message");
    tx.push(message(0, STOP))?;
    child.wait()?;
    let (p50, p99) = percentiles(one_way);
    Ok(Figures { p50, p99, per_sec: messages as f64 / elapsed.as_secs_f64() })
}

fn ring_peer(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let from_parent = SpscRing::<Descriptor>::builder(format!("{name}-a")).open()?;
    let to_parent = SpscRing::<Descriptor>::builder(format!("{name}-b")).open()?;
    let (mut rx, mut tx) = (from_parent.consumer()?, to_parent.producer()?);
    tx.set_demote(true); // this side only answers, one message at a time
    let mut counted = 0;
    loop {
        let d = rx.pop()?;
        match reply(&d, &mut counted) {
            Reply::Stop => return Ok(()),
            Reply::Send(back) => tx.push(back)?,
            Reply::Nothing => {}
        }
    }
}

// Built and matched once per message on the stack; boxing it would allocate per message.
#[allow(clippy::large_enum_variant)]
enum Reply {
    Send(Descriptor),
    Nothing,
    Stop,
}

/// The peer's side of the protocol, shared by the ring and the pipe.
fn reply(d: &Descriptor, counted: &mut u64) -> Reply {
    match d.tag {
        PING => Reply::Send(*d),
        STOP => Reply::Stop,
        LAST => {
            let ack = Descriptor { seq: *counted + 1, ..*d };
            *counted = 0;
            Reply::Send(ack)
        }
        _ => {
            *counted += 1;
            Reply::Nothing
        }
    }
}

fn pipe_peer() -> Result<(), Box<dyn std::error::Error>> {
    let (mut r, mut w) = (std::io::stdin().lock(), std::io::stdout().lock());
    let mut buf = [0u8; size_of::<Descriptor>()];
    let mut counted = 0;
    while r.read_exact(&mut buf).is_ok() {
        match reply(&bytemuck::pod_read_unaligned(&buf), &mut counted) {
            Reply::Stop => break,
            Reply::Send(back) => {
                w.write_all(bytemuck::bytes_of(&back))?;
                w.flush()?;
            }
            Reply::Nothing => {}
        }
    }
    Ok(())
}

fn measure_pipe(pings: u64, messages: u64) -> Result<Figures, Box<dyn std::error::Error>> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(ROLE, "pipe")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut w = child.stdin.take().ok_or("no stdin")?;
    let mut r = child.stdout.take().ok_or("no stdout")?;
    let mut buf = [0u8; size_of::<Descriptor>()];
    let mut one_way = Vec::with_capacity(pings as usize);
    for seq in 0..pings {
        let t = Instant::now();
        w.write_all(bytemuck::bytes_of(&message(seq, PING)))?;
        r.read_exact(&mut buf)?;
        one_way.push(t.elapsed() / 2);
        assert_eq!(bytemuck::pod_read_unaligned::<Descriptor>(&buf).seq, seq);
    }
    let t = Instant::now();
    for seq in 0..messages {
        w.write_all(bytemuck::bytes_of(&message(seq, stream_tag(seq, messages))))?;
    }
    r.read_exact(&mut buf)?;
    let elapsed = t.elapsed();
    let ack: Descriptor = bytemuck::pod_read_unaligned(&buf);
    assert_eq!(ack.seq, messages, "the peer counted every message");
    w.write_all(bytemuck::bytes_of(&message(0, STOP)))?;
    child.wait()?;
    let (p50, p99) = percentiles(one_way);
    Ok(Figures { p50, p99, per_sec: messages as f64 / elapsed.as_secs_f64() })
}
