//! One sender, several receiver processes, one broadcast channel: every receiver gets every
//! message, reading the sender's slot in place (no copy per receiver), and a slot goes
//! back to the sender once every receiver has dropped its message. This process creates
//! the channel, starts `receivers` copies of itself as receivers, sends `N` messages of
//! 1 MiB (its sequence number at both ends), then waits for each receiver's count.
//!
//! ```text
//! cargo run --release --example fanout -- [receivers]
//! ```
//!
//! While it runs, `gpuring list` shows the channel's receivers and the slowest, and
//! `gpuring inspect <name>` (the name it prints) where each one is.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuring::{Channel, RecvError, Role, TensorMeta};

const N: u64 = 100_000;
const BYTES: usize = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [role, name] = &args[..] {
        if role == "receiver" {
            return receiver(name);
        }
    }
    let receivers: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(4);
    let name = format!("gpuring-example-fanout-{}", std::process::id());
    let ch = Channel::builder(&name).broadcast().capacity(64).slots(8, BYTES as u64).create()?;
    let tx = ch.sender()?;
    println!("channel {name}: {receivers} receivers, {N} messages of {} KiB", BYTES >> 10);
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..receivers {
        let child =
            Command::new(&exe).args(["receiver", &name]).stdout(Stdio::inherit()).spawn()?;
        children.push(child);
    }
    // Each receiver attached before the first message (one attached later starts later).
    let attached = || -> Result<usize, Box<dyn std::error::Error>> {
        let ring = gpuring::inspect::inspect(&name)?.ring.ok_or("a channel has a ring")?;
        Ok(ring.participants.iter().filter(|p| p.role == Some(Role::Consumer)).count())
    };
    while attached()? < receivers {
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    for seq in 0..N {
        let mut lease = tx.acquire()?; // waits while the slowest receiver holds every slot
        lease[..8].copy_from_slice(&seq.to_le_bytes());
        lease[BYTES - 8..BYTES].copy_from_slice(&seq.to_le_bytes());
        tx.send(lease, TensorMeta::bytes(BYTES as u64))?;
    }
    let took = t.elapsed();
    drop(tx); // each receiver's iteration ends once it has every message
    for mut c in children {
        let status = c.wait()?;
        assert!(status.success(), "a receiver failed: {status}");
    }
    println!(
        "sender: {N} messages in {:.1} ms: {:.0} k/s, each one slot read in place by \
         {receivers} receivers (nothing copied)",
        took.as_secs_f64() * 1e3,
        N as f64 / took.as_secs_f64() / 1e3,
    );
    Ok(())
}

/// Receives until the sender has left; checks each message's number at both ends (in
/// order, none missing); says how many.
fn receiver(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ch = Channel::builder(name).open()?;
    let rx = ch.receiver()?;
    let mut expected = 0u64;
    loop {
        match rx.recv() {
            Ok(msg) => {
                let seq = expected.to_le_bytes();
                assert!(msg[..8] == seq && msg[BYTES - 8..] == seq, "message {expected} in order");
                expected += 1;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => return Err(e.into()),
        }
    }
    println!("receiver {}: {expected} messages, each once, in order", std::process::id());
    Ok(())
}
