//! Fan-out: one process hands each 4 KB, 5 MB or 54 MB buffer to N = 1, 4 and 8 others, in
//! one run, through a gpuring broadcast channel (written in place once, read in place by
//! every receiver: a descriptor travels) against N pipes (the producer writes every item
//! into each, the kernel copies it to each reader) and iceoryx2 publish-subscribe with N
//! subscribers (zero-copy, like gpuring: a loaned sample, an offset to each subscriber),
//! and, at N = 1, a gpuring SPSC channel (the target: 1 → 8 within 1.3× of it).
//!
//! `cargo bench --bench fanout`. In every path the producer writes its sequence number at
//! both ends of the item and every consumer checks it. A batch of `iters` items is timed
//! until every consumer has every item (gpuring: every slot is back in the pool, which
//! happens once every receiver has dropped it; pipes and iceoryx2: each consumer
//! acknowledged the last): throughput in items per second, each delivered N times. Then,
//! as in `payloads`, single items are timed the same way (hand-off until every consumer
//! has it and said so): the p50/p99 printed at the end and written to
//! `target/criterion/samples-fanout.csv`. And then *one way*, per receiver: items sent one
//! at a time (the next once every consumer has acknowledged the last on a channel of its
//! own: a pipe, an iceoryx2 service, a gpuring SPSC ring), each stamped with the monotonic
//! clock as it is sent, each consumer timing its arrival (the clock is the machine's own,
//! the same in every process): lines `oneway <case>: p50 .., p99 .. over every receiver's
//! items, slowest receiver's p50 ..`. Rows `gpuring_broadcast` spin-then-sleep as by
//! default; `gpuring_broadcast_sleep` receivers sleep at once (`WaitPolicy::SLEEP`).
//! `GPURING_BENCH_CPUS=a,b,...` pins the producer and each consumer (give N + 1).

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{Group, NAME, PEER, Samples, cpus, ice, peer, peer_index, pin, unique};
use criterion::Throughput;
use gpuring::{Channel, SpscRing, TensorMeta, WaitPolicy};
use iceoryx2::prelude::{BackpressureStrategy, PortFactory};

const STOP: u64 = u64::MAX;
/// (label, bytes, slots in the pool)
const SIZES: [(&str, usize, u32); 3] =
    [("4KB", 4096, 64), ("5MB", 5_000_000, 8), ("54MB", 54_000_000, 4)];
const FANOUT: [usize; 3] = [1, 4, 8];
/// The most items of a one-way pass, and its longest time.
const ONE_WAY: u64 = 5000;
const ONE_WAY_BUDGET: Duration = Duration::from_millis(1500);

/// The machine's monotonic clock, in ns: the same in every process.
fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Writes `seq` at both ends of `item` and `ack` at byte 8 (the consumer acknowledges).
fn number(item: &mut [u8], seq: u64, ack: bool) {
    let n = item.len();
    item[..8].copy_from_slice(&seq.to_le_bytes());
    item[n - 8..].copy_from_slice(&seq.to_le_bytes());
    item[8] = u8::from(ack);
}

/// Stamps `item` as a one-way sample (byte 9, and the send time at bytes 16..24).
fn stamp(item: &mut [u8]) {
    item[9] = 1;
    item[16..24].copy_from_slice(&now_ns().to_le_bytes());
}

/// A consumer's one-way times (ns), from the items stamped as samples, written to its file
/// when it stops.
struct Arrivals(Vec<u64>, String);

impl Arrivals {
    fn new(name: &str) -> Self {
        Self(Vec::new(), arrivals_file(name, peer_index()))
    }
    fn note(&mut self, item: &[u8]) {
        if item[9] == 1 {
            let sent = u64::from_le_bytes(item[16..24].try_into().unwrap());
            self.0.push(now_ns().saturating_sub(sent));
        }
    }
}

impl Drop for Arrivals {
    fn drop(&mut self) {
        let text: String = self.0.iter().map(|t| format!("{t}\n")).collect();
        std::fs::write(&self.1, text).unwrap();
    }
}

/// The ring on which consumer `index` of case `name` acknowledges one-way items.
fn ack_ring(name: &str, index: usize) -> String {
    format!("{name}-ack{index}")
}

fn arrivals_file(name: &str, index: usize) -> String {
    std::env::temp_dir().join(format!("{name}.arrivals{index}")).to_string_lossy().into_owned()
}

/// Reads the `n` consumers' one-way times of case `id` and prints them.
fn report_one_way(id: &str, name: &str, n: usize) {
    let mut all = Vec::new();
    let mut slowest = 0;
    for i in 0..n {
        let path = arrivals_file(name, i);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        let mut mine: Vec<u64> = text.lines().filter_map(|l| l.parse().ok()).collect();
        mine.sort_unstable();
        if let Some(p50) = mine.get(mine.len() / 2) {
            slowest = slowest.max(*p50);
        }
        all.extend(mine);
    }
    all.sort_unstable();
    if all.is_empty() {
        return;
    }
    let at = |q: f64| Duration::from_nanos(all[((all.len() - 1) as f64 * q) as usize]);
    let per = all.len() / n;
    println!(
        "oneway {id}: p50 {:.2?}, p99 {:.2?} over every receiver's items, slowest receiver's p50 {:.2?} (n={per} items x {n})",
        at(0.5),
        at(0.99),
        Duration::from_nanos(slowest)
    );
}

/// Sends items one at a time through `send` (which stamps them) and `acked` (which waits
/// until every consumer has the last), for up to [`ONE_WAY`] items (3 with `--test`) or
/// [`ONE_WAY_BUDGET`].
fn one_way(testing: bool, mut send: impl FnMut(), mut acked: impl FnMut()) {
    let start = Instant::now();
    for _ in 0..if testing { 3 } else { ONE_WAY } {
        send();
        acked();
        if start.elapsed() > ONE_WAY_BUDGET {
            break;
        }
    }
}

fn run_peer(role: &str) {
    pin(cpus().get(1 + peer_index()).copied());
    let name = std::env::var(NAME).unwrap();
    let mut parts = role.split(':');
    let (kind, size) = (parts.next().unwrap(), parts.next().unwrap().parse::<usize>().unwrap());
    match kind {
        "bcast" | "bcast-sleep" | "spsc" => {
            let ch = Channel::builder(&name).open().unwrap();
            let mut rx = ch.receiver().unwrap();
            let acks = SpscRing::<u64>::builder(ack_ring(&name, peer_index())).open().unwrap();
            let mut ack = acks.producer().unwrap();
            if kind == "bcast-sleep" {
                rx.set_wait_policy(WaitPolicy::SLEEP);
            }
            let mut expected = None;
            let mut arrivals = Arrivals::new(&name);
            loop {
                let m = rx.recv().unwrap();
                if m.tag() == STOP {
                    return;
                }
                arrivals.note(&m);
                // A broadcast receiver starts with whatever is sent after it attached.
                let seq = expected.unwrap_or(u64::from_le_bytes(m[..8].try_into().unwrap()));
                let s = seq.to_le_bytes();
                assert!(m.len() == size && m[..8] == s && m[size - 8..] == s, "bad item");
                expected = Some(seq + 1);
                if m[8] == 1 {
                    ack.push(seq + 1).unwrap();
                }
            }
        }
        "pipe" => {
            let mut arrivals = Arrivals::new(&name);
            let (r, w) = (std::io::stdin().lock(), std::io::stdout().lock());
            common::numbered_sink(r, w, size, |item| arrivals.note(item));
        }
        "ice" => {
            let i: usize = parts.next().unwrap().parse().unwrap();
            let n: usize = parts.next().unwrap().parse().unwrap();
            let node = ice::node();
            let data = ice::fanout_service(&node, &format!("{name}-data"), depth(size), n);
            let ack = ice::u64_service(&node, &format!("{name}-ack{i}"), 4);
            let rx = data.subscriber_builder().create().unwrap();
            let tx = ice::publisher(&ack);
            let mut arrivals = Arrivals::new(&name);
            ice::numbered_subscriber(&rx, &tx, size, |item| arrivals.note(item));
        }
        _ => panic!("unknown peer role {role}"),
    }
}

/// The iceoryx2 subscribers' buffer for items of `size` bytes: as many as gpuring's pool
/// has slots.
fn depth(size: usize) -> usize {
    SIZES.iter().find(|s| s.1 == size).map_or(4, |s| s.2 as usize)
}

/// A gpuring channel to `n` receiver peers of `role` (`bcast`, `bcast-sleep`, or `spsc`
/// for one).
fn bench_gpuring(g: &mut Group<'_>, label: &str, role: &str, n: usize, size: usize, slots: u32) {
    if !g.selected(label) {
        return; // filtered out: no peers, no passes
    }
    let testing = g.testing();
    let name = unique("fanout");
    let b = Channel::builder(&name).capacity(64).slots(slots, size as u64);
    let ch = if role == "spsc" { b } else { b.broadcast() }.create().unwrap();
    let tx = ch.sender().unwrap();
    // Each receiver acknowledges a one-way item on a ring of its own, as iceoryx2's
    // subscribers do on services of their own: the sender waits there, not on the pool's
    // slot records and the receivers' cursors, which each receiver writes as it takes a
    // message (a sender spinning on `free_slots` meanwhile pulls those lines away from it).
    let mut acks: Vec<_> = (0..n)
        .map(|i| {
            let ring = SpscRing::<u64>::builder(ack_ring(&name, i)).capacity(4).create().unwrap();
            let consumer = ring.consumer().unwrap();
            (ring, consumer)
        })
        .collect();
    let peers: Vec<_> = (0..n).map(|i| peer(&format!("{role}:{size}"), &name, i, false)).collect();
    // Every receiver attached before the first item (one attached later starts later).
    ice::wait_until(|| {
        let report = gpuring::inspect::inspect(&name).unwrap();
        let ring = report.ring.unwrap();
        let receivers =
            ring.participants.iter().filter(|p| p.role == Some(gpuring::Role::Consumer));
        receivers.count() == n
    });
    let meta = TensorMeta::bytes(size as u64);
    let seq = std::cell::Cell::new(0u64);
    let send = |stamped: bool| {
        let mut lease = tx.acquire().unwrap();
        number(&mut lease[..size], seq.get(), stamped);
        if stamped {
            stamp(&mut lease[..24]);
        }
        tx.send(lease, meta).unwrap();
        seq.set(seq.get() + 1);
    };
    // Every slot back: `free_slots` also takes back a broadcast slot whose message went
    // out before a receiver had joined (or whose last holder's drop came first).
    let all_back = || {
        while tx.free_slots() < slots as usize {
            std::hint::spin_loop();
        }
    };
    g.run(label, size, |iters| {
        let t = Instant::now();
        (0..iters).for_each(|_| send(false));
        all_back();
        t.elapsed()
    });
    let acked = || {
        for (_, a) in &mut acks {
            assert_eq!(a.pop().unwrap(), seq.get(), "a receiver lost items");
        }
    };
    one_way(testing, || send(true), acked);
    let mut lease = tx.acquire().unwrap();
    lease.set_tag(STOP);
    tx.send(lease, TensorMeta::bytes(0)).unwrap();
    peers.into_iter().for_each(common::Peer::finish);
    report_one_way(&format!("{}/{label}", g.name()), &name, n);
}

/// The same item written into `n` pipes, each read by its peer.
fn bench_pipes(g: &mut Group<'_>, n: usize, size: usize) {
    if !g.selected("pipes") {
        return; // filtered out: no peers, no passes
    }
    let testing = g.testing();
    let name = unique("pipes");
    let mut peers: Vec<_> = (0..n).map(|i| peer(&format!("pipe:{size}"), &name, i, true)).collect();
    let mut ends: Vec<_> =
        peers.iter_mut().map(|p| (p.0.stdin.take().unwrap(), p.0.stdout.take().unwrap())).collect();
    let mut buf = vec![0u8; size];
    let mut seq = 0u64;
    g.run("pipes", size, |iters| {
        let t = Instant::now();
        for i in 0..iters {
            number(&mut buf, seq, i + 1 == iters);
            for (w, _) in &mut ends {
                w.write_all(&buf).unwrap();
            }
            seq += 1;
        }
        for (_, r) in &mut ends {
            let mut ack = [0u8; 8];
            r.read_exact(&mut ack).unwrap();
            assert_eq!(u64::from_le_bytes(ack), seq, "a reader lost items");
        }
        t.elapsed()
    });
    let ends = std::cell::RefCell::new(ends);
    let send = || {
        number(&mut buf, seq, true);
        stamp(&mut buf);
        for (w, _) in ends.borrow_mut().iter_mut() {
            w.write_all(&buf).unwrap();
        }
        seq += 1;
    };
    let acked = || {
        for (_, r) in ends.borrow_mut().iter_mut() {
            let mut ack = [0u8; 8];
            r.read_exact(&mut ack).unwrap();
        }
    };
    one_way(testing, send, acked);
    drop(ends); // each peer's read fails and it exits
    peers.into_iter().for_each(common::Peer::finish);
    report_one_way(&format!("{}/pipes", g.name()), &name, n);
}

/// iceoryx2 publish-subscribe with `n` subscribers, each acknowledging on its own service.
fn bench_iceoryx2(g: &mut Group<'_>, n: usize, size: usize) {
    if !g.selected("iceoryx2") {
        return; // filtered out: no peers, no passes
    }
    let testing = g.testing();
    let name = unique("icefanout");
    let node = ice::node();
    let data = ice::fanout_service(&node, &format!("{name}-data"), depth(size), n);
    let acks: Vec<_> = (0..n)
        .map(|i| {
            let service = ice::u64_service(&node, &format!("{name}-ack{i}"), 4);
            service.subscriber_builder().create().unwrap()
        })
        .collect();
    let tx = data
        .publisher_builder()
        .initial_max_slice_len(size)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()
        .unwrap();
    let peers: Vec<_> =
        (0..n).map(|i| peer(&format!("ice:{size}:{i}:{n}"), &name, i, false)).collect();
    ice::wait_until(|| data.dynamic_config().number_of_subscribers() == n);
    let mut seq = 0u64;
    g.run("iceoryx2", size, |iters| {
        let t = Instant::now();
        for i in 0..iters {
            ice::numbered_sample(&tx, size, seq, i + 1 == iters).send().unwrap();
            seq += 1;
        }
        for a in &acks {
            assert_eq!(ice::next_ack(a), seq, "a subscriber lost items");
        }
        t.elapsed()
    });
    let send = || {
        let mut sample = ice::numbered_sample(&tx, size, seq, true);
        stamp(&mut sample.payload_mut()[..24]);
        sample.send().unwrap();
        seq += 1;
    };
    let acked = || {
        for a in &acks {
            ice::next_ack(a);
        }
    };
    one_way(testing, send, acked);
    tx.loan_slice_uninit(0).unwrap().write_from_fn(|_| 0).send().unwrap(); // stop
    peers.into_iter().for_each(common::Peer::finish);
    report_one_way(&format!("{}/iceoryx2", g.name()), &name, n);
}

fn main() {
    if let Ok(role) = std::env::var(PEER) {
        run_peer(&role);
        return;
    }
    pin(cpus().first().copied());
    let mut c = common::criterion();
    let mut samples = Samples::new("fanout", "handoff_all_ack");
    for (label, size, slots) in SIZES {
        for n in FANOUT {
            let mut g = Group::new(&mut c, &mut samples, &format!("fanout_{label}_to_{n}"));
            g.g.throughput(Throughput::Elements(1));
            if n == 1 {
                bench_gpuring(&mut g, "gpuring_spsc", "spsc", 1, size, slots);
            }
            bench_gpuring(&mut g, "gpuring_broadcast", "bcast", n, size, slots);
            bench_gpuring(&mut g, "gpuring_broadcast_sleep", "bcast-sleep", n, size, slots);
            bench_pipes(&mut g, n, size);
            bench_iceoryx2(&mut g, n, size);
            g.g.finish();
        }
    }
    c.final_summary();
    samples.finish();
}
