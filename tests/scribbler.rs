//! A hostile process of the same user scribbles on a live channel (SPSC, MPMC, broadcast):
//! random words written into the channel segment (header, ring control, participant table,
//! claim lines or a broadcast ring's readers mask and cursors, cells) and into the sender's
//! pool segment (slot records, with a broadcast slot's holders mask and sent position;
//! free ring) while a sender streams and
//! a receiver receives. The receiver must never panic or fault: every call returns a
//! message or a typed error, and the scribbling shows up as `Corrupted`. `inspect` of the
//! segment must not panic either, and the sender must not crash.
//!
//! `GPURING_SCRIBBLE_SECONDS` (default 2) sets how long the scribbler writes per flavor.
//! `.ci/run` also runs this test under AddressSanitizer (nightly), so an out-of-bounds
//! access that a forged value could cause is a failure even where it would not fault.
#![cfg(not(loom))]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{Peer, announce, ring_name, role, unique_name};
use gpuring::{Channel, RecvTimeoutError, TensorMeta};

const SLOT_SIZE: usize = 256;

fn seconds() -> f64 {
    std::env::var("GPURING_SCRIBBLE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0)
}

/// A small xorshift generator: reproducible from its seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Maps `/dev/shm/<name>` read-write and writes random words into it until `until`.
fn scribble(names: &[String], until: Instant, seed: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let maps: Vec<(*mut u8, usize)> = names
        .iter()
        .map(|name| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/dev/shm/{name}"))
                .expect("open the segment to scribble on");
            let len = file.metadata().unwrap().len() as usize;
            // SAFETY: a fresh shared mapping of the whole object; only this function
            // touches it, through atomic word stores inside its bounds.
            let ptr = unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    len,
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::SHARED,
                    &file,
                    0,
                )
            }
            .expect("mmap");
            (ptr.cast::<u8>(), len)
        })
        .collect();
    let mut rng = Rng(seed | 1);
    let mut writes = 0;
    while Instant::now() < until {
        let (base, len) = maps[(rng.next() % maps.len() as u64) as usize];
        let words = len / 8;
        // Half the writes go to the first 8 KiB (headers, positions, tables), half anywhere.
        let word = if rng.next() % 2 == 0 {
            rng.next() as usize % words.min(1024)
        } else {
            rng.next() as usize % words
        };
        // SAFETY: word < len / 8, so the 8 bytes lie inside the mapping, 8-aligned (the
        // mapping is page aligned). An atomic store: the peers read these words concurrently.
        let cell = unsafe { AtomicU64::from_ptr(base.add(word * 8).cast()) };
        let old = cell.load(Ordering::Relaxed);
        let value = match rng.next() % 5 {
            0 => rng.next(),                                       // anything
            1 => rng.next() % 64,                                  // small: counts, indices, states
            2 => old.wrapping_add(rng.next() % 5).wrapping_sub(2), // near: positions, stamps
            3 => old ^ (1 << (rng.next() % 64)),                   // one bit flipped
            _ => 0,
        };
        cell.store(value, Ordering::Relaxed);
        writes += 1;
        std::thread::sleep(Duration::from_micros(100));
    }
    writes
}

#[test]
fn receiver_survives_a_scribbler() {
    match role().as_deref() {
        Some("sender") => {
            let ch = Channel::builder(ring_name()).open().unwrap();
            let tx = ch.sender().unwrap();
            announce(&format!("pool {}", tx.pool_name()));
            // Every error is expected once the scribbler starts: keep going, never panic.
            // Says how many calls were `Corrupted` so far, every 100 ms.
            let (mut corrupted, mut said) = (0u64, Instant::now());
            for seq in 0u64.. {
                if said.elapsed() > Duration::from_millis(100) {
                    announce(&format!("corrupted {corrupted}"));
                    said = Instant::now();
                }
                let mut lease = match tx.acquire_timeout(Duration::from_millis(50)) {
                    Ok(lease) => lease,
                    Err(gpuring::AcquireTimeoutError::Corrupted(_)) => {
                        corrupted += 1;
                        continue;
                    }
                    Err(_) => continue,
                };
                lease[..8].copy_from_slice(&seq.to_le_bytes());
                let sent = tx.send_timeout(lease, TensorMeta::bytes(8), Duration::from_millis(50));
                corrupted +=
                    u64::from(matches!(sent, Err(gpuring::SendTimeoutError::Corrupted(_))));
            }
            unreachable!();
        }
        Some("scribbler") => {
            let pool = std::env::var("GPURING_SCRIBBLE_POOL").unwrap();
            let until = Instant::now() + Duration::from_secs_f64(seconds());
            let writes = scribble(&[ring_name(), pool], until, u64::from(std::process::id()));
            announce(&format!("done {writes}"));
            return;
        }
        _ => {}
    }
    let test = "receiver_survives_a_scribbler";
    for flavor in ["spsc", "mpmc", "broadcast"] {
        let name = unique_name("scribble");
        let builder = Channel::builder(&name).capacity(16).slots(8, SLOT_SIZE as u64);
        let builder = match flavor {
            "mpmc" => builder.mpmc(),
            "broadcast" => builder.broadcast(),
            _ => builder,
        };
        let ch = builder.create().unwrap();
        let rx = ch.receiver().unwrap();
        let mut sender = Peer::spawn(test, "sender", &name);
        let pool = sender.expect("pool ");
        let pool = pool.trim_start_matches('/').to_owned();
        // Let a few messages through unharmed first.
        let mut received = 0u64;
        while received < 20 {
            drop(rx.recv_timeout(Duration::from_secs(5)).expect("messages before scribbling"));
            received += 1;
        }
        let mut scribbler =
            Peer::spawn_with(test, "scribbler", &name, &[("GPURING_SCRIBBLE_POOL", pool.clone())]);
        let until = Instant::now() + Duration::from_secs_f64(seconds() + 0.5);
        let (mut corrupted, mut timeouts, mut other) = (0u64, 0u64, Vec::new());
        let mut last_inspect = Instant::now();
        while Instant::now() < until {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(m) => {
                    // Every byte of what a message claims is readable (ASan checks it).
                    assert!(m.len() <= SLOT_SIZE, "a message longer than its slot: {}", m.len());
                    let sum = m.iter().fold(0u8, |a, b| a.wrapping_add(*b));
                    std::hint::black_box(sum);
                    received += 1;
                }
                Err(RecvTimeoutError::Corrupted(_)) => corrupted += 1,
                Err(RecvTimeoutError::Timeout) => timeouts += 1,
                Err(e) => other.push(e.to_string()),
            }
            if last_inspect.elapsed() > Duration::from_millis(100) {
                let _ = gpuring::inspect::inspect(&name);
                last_inspect = Instant::now();
            }
        }
        let done = scribbler.expect("done");
        assert!(scribbler.child.wait().unwrap().success(), "the scribbler finished");
        // The sender must still be running: scribbled memory may fail its calls, never
        // crash it.
        let status = sender.child.try_wait().unwrap();
        assert!(status.is_none(), "the sender died during the scribbling: {status:?}");
        sender.child.kill().unwrap();
        let status = sender.child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "ended by our SIGKILL only");
        // What the sender saw: its last count of `Corrupted` calls.
        let mut sender_corrupted = 0u64;
        while let Some(line) = sender.next_line() {
            if let Some(n) = line.strip_prefix("corrupted ") {
                sender_corrupted = n.parse().unwrap();
            }
        }
        other.sort();
        other.dedup();
        println!(
            "{}: {done} words scribbled; received {received}, Corrupted {corrupted} \
             (sender: {sender_corrupted}), timeouts {timeouts}, other errors {other:?}",
            flavor
        );
        // A scribble may also stall the stream with no error at the receiver (the sender's
        // free ring or slot records scribbled: it never sends again), so either end counts.
        assert!(corrupted + sender_corrupted > 0, "the scribbling was reported as Corrupted");
        // Scribbled positions may look like queued messages, and a scribbled table hide
        // the pool: both are removed by name (the sender is dead, nobody uses them).
        drop((rx, ch));
        for n in [&name, &pool] {
            // The other test of this binary spawns peers meanwhile: a child between its fork
            // and its exec holds copies of our descriptors, and with them the presence lock
            // (CI saw "p0.1 left" once): a removal refused as in use is tried again.
            let left = || std::path::Path::new(&format!("/dev/shm/{n}")).exists();
            let gone = (0..200).any(|_| {
                let _ = gpuring::inspect::remove(n);
                let gone = !left();
                if !gone {
                    std::thread::sleep(Duration::from_millis(10));
                }
                gone
            });
            assert!(gone, "{n} left");
        }
    }
}

/// The same against a broadcast ring (its readers mask, the lagging word, the readers'
/// cursors in the claim lines, `tail` and `head`, the cells), blocking and lagging: a
/// producer child pushes while this process reads. Neither end may panic, fault or hang:
/// every call returns an element or a typed error; `inspect` does not panic.
#[test]
fn broadcast_reader_survives_a_scribbler() {
    use gpuring::{BroadcastRing, ReadTimeoutError};
    match role().as_deref() {
        Some("producer") => {
            let ring = BroadcastRing::<u64>::builder(ring_name()).open().unwrap();
            let mut tx = ring.producer().unwrap();
            announce("ready");
            for v in 0u64.. {
                // Every error is expected once the scribbler starts: keep going.
                let _ = tx.push_timeout(v, Duration::from_millis(50));
            }
            unreachable!();
        }
        Some("scribbler") => {
            let until = Instant::now() + Duration::from_secs_f64(seconds());
            let writes = scribble(&[ring_name()], until, u64::from(std::process::id()));
            announce(&format!("done {writes}"));
            return;
        }
        _ => {}
    }
    let test = "broadcast_reader_survives_a_scribbler";
    for lagging in [false, true] {
        let name = unique_name("scribble-broadcast");
        let ring =
            BroadcastRing::<u64>::builder(&name).capacity(16).lagging(lagging).create().unwrap();
        let mut rx = ring.reader().unwrap();
        let mut producer = Peer::spawn(test, "producer", &name);
        producer.expect("ready");
        let mut before = 0;
        while before < 20 {
            match rx.read_timeout(Duration::from_secs(5)) {
                Ok(_) => before += 1,
                Err(ReadTimeoutError::Lagged(_)) if lagging => {} // the producer never waits
                Err(e) => panic!("before scribbling: {e}"),
            }
        }
        let mut scribbler = Peer::spawn(test, "scribbler", &name);
        let until = Instant::now() + Duration::from_secs_f64(seconds() + 0.5);
        let (mut read, mut corrupted, mut lagged, mut timeouts) = (0u64, 0u64, 0u64, 0u64);
        let mut other = Vec::new();
        while Instant::now() < until {
            match rx.read_timeout(Duration::from_millis(20)) {
                Ok(v) => read += u64::from(std::hint::black_box(v) == v),
                Err(ReadTimeoutError::Corrupted(_)) => corrupted += 1,
                Err(ReadTimeoutError::Lagged(_)) => lagged += 1,
                Err(ReadTimeoutError::Timeout) => timeouts += 1,
                Err(e) => other.push(e.to_string()),
            }
            let _ = gpuring::inspect::inspect(&name);
        }
        let done = scribbler.expect("done");
        assert!(scribbler.child.wait().unwrap().success(), "the scribbler finished");
        let status = producer.child.try_wait().unwrap();
        assert!(status.is_none(), "the producer died during the scribbling: {status:?}");
        producer.child.kill().unwrap();
        assert_eq!(producer.child.wait().unwrap().signal(), Some(9), "ended by our SIGKILL");
        other.sort();
        other.dedup();
        println!(
            "broadcast{}: {done} words scribbled; read {read}, Corrupted {corrupted}, Lagged \
             {lagged}, timeouts {timeouts}, other errors {other:?}",
            if lagging { " (lagging)" } else { "" }
        );
        drop((rx, ring));
        let _ = gpuring::inspect::remove(&name);
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists(), "{name} left");
    }
}
