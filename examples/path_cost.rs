//! What one host-channel hand-off costs in instructions: one thread leases a slot, fills
//! 4 KB, sends it, receives it and drops it, 200,000 times a round, and prints the best
//! round's time per message. Both ends in one thread, so no cache line travels between
//! cores: a change that adds work to the path shows here even when a two-process bench
//! drowns it in its noise. Compare builds by running each one's binary alternately.
//!
//! ```text
//! cargo run --release --example path_cost -- [spsc|mpmc|broadcast] [once]
//! ```
//!
//! `once`: a channel without redelivery (`ChannelBuilder::redeliver(false)`).
//! `N=20000` in the environment: messages a round (default 200,000), for slow runners such as
//! `valgrind --tool=callgrind`, whose instruction counts compare builds without timing noise.

use std::time::Instant;

use gpuring::{Channel, TensorMeta};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mpmc = args.iter().any(|a| a == "mpmc");
    let broadcast = args.iter().any(|a| a == "broadcast");
    let once = args.iter().any(|a| a == "once");
    let name = format!("path-cost-{}", std::process::id());
    let b = Channel::builder(&name).capacity(64).slots(8, 4096).redeliver(!once);
    let ch = if mpmc {
        b.mpmc()
    } else if broadcast {
        b.broadcast()
    } else {
        b
    }
    .create()?;
    let (tx, rx) = (ch.sender()?, ch.receiver()?);
    // Opaque to the optimiser, so that every build copies it the same way (a memcpy).
    let payload = std::hint::black_box([7u8; 4096]);
    let n: u32 = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let mut best = f64::MAX;
    for _round in 0..7 {
        let t = Instant::now();
        for _ in 0..n {
            let mut lease = tx.acquire()?;
            lease[..4096].copy_from_slice(std::hint::black_box(&payload));
            tx.send(lease, TensorMeta::bytes(4096))?;
            let msg = rx.recv()?;
            std::hint::black_box(msg[0]);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / f64::from(n));
    }
    let flavor = if mpmc {
        "mpmc"
    } else if broadcast {
        "broadcast"
    } else {
        "spsc"
    };
    println!(
        "{flavor}{}: {best:.1} ns per message (best of 7 rounds of {n})",
        if once { ", no redelivery" } else { "" }
    );
    Ok(())
}
