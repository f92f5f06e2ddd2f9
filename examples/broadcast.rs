//! One producer, several reader processes: every reader reads every element, in order.
//! This process creates a broadcast ring, starts `READERS` copies of itself as readers,
//! publishes `N` numbered elements (the slowest reader holds it back: nothing is lost),
//! then waits for each reader's count.
//!
//! ```text
//! cargo run --release --example broadcast -- [readers] [lagging]
//! ```
//!
//! `lagging`: the producer never waits; a reader that falls a ring behind is told how
//! many it missed, and counts them. While it runs, `gpuring inspect <name>` (the name it
//! prints) shows each reader's cursor.

use std::process::{Command, Stdio};
use std::time::Instant;

use gpuring::{BroadcastRing, ReadError};

const N: u64 = 1_000_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [role, name] = &args[..] {
        if role == "reader" {
            return reader(name);
        }
    }
    let readers: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(4);
    let lagging = args.iter().any(|a| a == "lagging");
    let name = format!("gpuring-example-broadcast-{}", std::process::id());
    let ring = BroadcastRing::<u64>::builder(&name).capacity(1024).lagging(lagging).create()?;
    let mut tx = ring.producer()?;
    println!("ring {name}: {readers} readers, {N} elements, lagging: {lagging}");
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..readers {
        let child = Command::new(&exe).args(["reader", &name]).stdout(Stdio::inherit()).spawn()?;
        children.push(child);
    }
    while tx.readers() < readers {
        std::thread::yield_now(); // each reader attaches, then everything published is its
    }
    let t = Instant::now();
    for v in 0..N {
        tx.push(v)?;
    }
    let took = t.elapsed();
    drop(tx); // the readers' reads end once they have read everything
    for mut c in children {
        let status = c.wait()?;
        assert!(status.success(), "a reader failed: {status}");
    }
    println!(
        "producer: {N} elements in {:.1} ms, {:.1} M/s",
        took.as_secs_f64() * 1e3,
        N as f64 / took.as_secs_f64() / 1e6
    );
    Ok(())
}

/// Reads until the producer has left; checks the order; says how many it read and missed.
fn reader(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ring = BroadcastRing::<u64>::builder(name).open()?;
    let mut rx = ring.reader()?;
    let (mut read, mut missed, mut last) = (0u64, 0u64, None::<u64>);
    loop {
        match rx.read() {
            Ok(v) => {
                if let Some(l) = last {
                    assert!(v > l, "in order: {v} after {l}");
                }
                last = Some(v);
                read += 1;
            }
            Err(ReadError::Lagged(n)) => missed += n,
            Err(ReadError::Disconnected) => break,
            Err(e) => return Err(e.into()),
        }
    }
    println!("reader {}: read {read}, missed {missed}", std::process::id());
    Ok(())
}
