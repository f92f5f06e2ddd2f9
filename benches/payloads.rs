//! Payload hand-off: 4 KB, 5 MB and 54 MB buffers from one process to another, in one run,
//! through a gpuring channel (the producer writes in place and a descriptor travels)
//! against a pipe, a Unix socket (the bytes are copied through the kernel, as a hand-rolled
//! pipe or a pickling Python queue must at the least), the `ipc-channel` crate (its
//! byte channel: the bytes go through a Unix socket, arriving in a fresh `Vec`) and iceoryx2
//! publish-subscribe (zero-copy like gpuring: the producer loans a sample in shared memory,
//! writes it in place and sends an offset).
//!
//! `cargo bench --bench payloads`. In every path the producer writes the same thing into
//! its buffer (an 8-byte sequence number at the start, and for gpuring the same at the
//! end) and the consumer checks it; each batch of `iters` items is timed until the
//! consumer has them all (gpuring: every slot is back in the pool; streams: the consumer
//! acknowledged the last). Throughput is reported in items per second; the time per
//! element is the time per hand-off (bytes per second = items per second × size).
//! After criterion's measurement each case is sampled once more with batches of one item
//! (write it, hand it off, learn that the consumer has it): the p50/p99 of that "hand-off
//! until acknowledged" time are printed at the end and written to
//! `target/criterion/samples-payloads.csv` (see `common::Samples`).
//! `GPURING_BENCH_CPUS=a,b` pins as in `rings`.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use common::{Group, NAME, PEER, Samples, cpus, ice, peer, peer_index, pin, unique};
use criterion::Throughput;
use gpuring::{Channel, Flavor, TensorMeta};
use iceoryx2::prelude::BackpressureStrategy;

const STOP: u64 = u64::MAX;
/// (label, bytes, slots in the pool)
const SIZES: [(&str, usize, u32); 3] =
    [("4KB", 4096, 64), ("5MB", 5_000_000, 8), ("54MB", 54_000_000, 4)];

fn run_peer(role: &str) {
    pin(cpus().get(1 + peer_index()).copied());
    let name = std::env::var(NAME).unwrap();
    let (kind, size) = role.split_once(':').unwrap();
    let size: usize = size.parse().unwrap();
    match kind {
        "chan" => {
            let ch = Channel::builder(&name).open().unwrap();
            let rx = ch.receiver().unwrap();
            let mut expected = 0u64;
            loop {
                let m = rx.recv().unwrap();
                if m.tag() == STOP {
                    return;
                }
                let seq = expected.to_le_bytes();
                assert!(m.len() == size && m[..8] == seq && m[size - 8..] == seq, "bad item");
                expected += 1;
            }
        }
        "pipe" => {
            common::numbered_sink(std::io::stdin().lock(), std::io::stdout().lock(), size, |_| {})
        }
        "unix" => {
            let s = UnixStream::connect(&name).unwrap();
            common::numbered_sink(s.try_clone().unwrap(), s, size, |_| {});
        }
        "ipc" => {
            // ipc-channel's idiom: make both channels here, hand the parent the data sender
            // and the acknowledgement receiver through its one-shot server.
            let (data_tx, data_rx) = ipc_channel::ipc::bytes_channel().unwrap();
            let (ack_tx, ack_rx) = ipc_channel::ipc::channel::<u64>().unwrap();
            let boot = ipc_channel::ipc::IpcSender::connect(name).unwrap();
            boot.send((data_tx, ack_rx)).unwrap();
            let mut expected = 0u64;
            while let Ok(buf) = data_rx.recv() {
                assert!(buf.len() == size && buf[..8] == expected.to_le_bytes(), "bad item");
                expected += 1;
                if buf[8] == 1 {
                    ack_tx.send(expected).unwrap();
                }
            }
        }
        "ice" => {
            let node = ice::node();
            let data = ice::slice_service(&node, &format!("{name}-data"), depth(size));
            let ack = ice::u64_service(&node, &format!("{name}-ack"), 4);
            let rx = data.subscriber_builder().create().unwrap();
            let tx = ice::publisher(&ack);
            ice::numbered_subscriber(&rx, &tx, size, |_| {});
        }
        _ => panic!("unknown peer role {role}"),
    }
}

/// A gpuring channel of `flavor`, with redelivery (the default) or without (`redeliver`
/// false: the row `_no_redelivery`, which shows what the descriptor's copy beside its slot
/// costs a send).
fn bench_channel(g: &mut Group<'_>, flavor: Flavor, size: usize, slots: u32, redeliver: bool) {
    let name = unique("payload");
    let builder =
        Channel::builder(&name).capacity(64).slots(slots, size as u64).redeliver(redeliver);
    let builder = if flavor == Flavor::Mpmc { builder.mpmc() } else { builder };
    let ch = builder.create().unwrap();
    let tx = ch.sender().unwrap();
    let _peer = peer(&format!("chan:{size}"), &name, 0, false);
    let meta = TensorMeta::bytes(size as u64);
    let mut seq = 0u64;
    let label = match (flavor, redeliver) {
        (Flavor::Mpmc, true) => "gpuring_mpmc",
        (Flavor::Mpmc, false) => "gpuring_mpmc_no_redelivery",
        (_, true) => "gpuring_spsc",
        (_, false) => "gpuring_spsc_no_redelivery",
    };
    g.run(label, size, |iters| {
        let t = Instant::now();
        for _ in 0..iters {
            let mut lease = tx.acquire().unwrap();
            let s = seq.to_le_bytes();
            lease[..8].copy_from_slice(&s);
            lease[size - 8..size].copy_from_slice(&s);
            tx.send(lease, meta).unwrap();
            seq += 1;
        }
        while tx.free_slots() < slots as usize {
            std::hint::spin_loop();
        }
        t.elapsed()
    });
    let mut lease = tx.acquire().unwrap();
    lease.set_tag(STOP);
    tx.send(lease, TensorMeta::bytes(0)).unwrap();
    while tx.free_slots() < slots as usize {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Streams items of `size` bytes through `send` (the sequence number first; byte 8 set on
/// the last item of each batch, which the consumer acknowledges with its count, read by
/// `acked`).
fn bench_items(
    g: &mut Group<'_>,
    label: &str,
    size: usize,
    mut send: impl FnMut(&[u8]),
    mut acked: impl FnMut() -> u64,
) {
    let mut buf = vec![0u8; size];
    let mut seq = 0u64;
    g.run(label, size, |iters| {
        let t = Instant::now();
        for i in 0..iters {
            buf[..8].copy_from_slice(&seq.to_le_bytes());
            buf[8] = u8::from(i + 1 == iters);
            send(&buf);
            seq += 1;
        }
        assert_eq!(acked(), seq, "consumer lost items");
        t.elapsed()
    });
}

fn bench_stream(g: &mut Group<'_>, label: &str, size: usize, r: &mut dyn Read, w: &mut dyn Write) {
    let acked = || {
        let mut ack = [0u8; 8];
        r.read_exact(&mut ack).unwrap();
        u64::from_le_bytes(ack)
    };
    bench_items(g, label, size, |item| w.write_all(item).unwrap(), acked);
}

fn bench_ipc_channel(g: &mut Group<'_>, size: usize) {
    type Boot = (ipc_channel::ipc::IpcBytesSender, ipc_channel::ipc::IpcReceiver<u64>);
    let (server, name) = ipc_channel::ipc::IpcOneShotServer::<Boot>::new().unwrap();
    let _peer = peer(&format!("ipc:{size}"), &name, 0, false);
    let (_, (data_tx, ack_rx)) = server.accept().unwrap();
    let send = |item: &[u8]| data_tx.send(item).unwrap();
    bench_items(g, "ipc_channel", size, send, || ack_rx.recv().unwrap());
    drop(data_tx); // the peer's recv fails and it exits
}

/// The iceoryx2 subscriber's buffer for items of `size` bytes: as many as gpuring's pool
/// has slots.
fn depth(size: usize) -> usize {
    SIZES.iter().find(|s| s.1 == size).map_or(4, |s| s.2 as usize)
}

fn bench_iceoryx2(g: &mut Group<'_>, size: usize) {
    let name = unique("icepayload");
    let node = ice::node();
    let data = ice::slice_service(&node, &format!("{name}-data"), depth(size));
    let ack = ice::u64_service(&node, &format!("{name}-ack"), 4);
    let acks = ack.subscriber_builder().create().unwrap();
    let tx = data
        .publisher_builder()
        .initial_max_slice_len(size)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()
        .unwrap();
    let _peer = peer(&format!("ice:{size}"), &name, 0, false);
    ice::wait_for_subscriber(&data);
    let mut seq = 0u64;
    g.run("iceoryx2", size, |iters| {
        let t = Instant::now();
        for i in 0..iters {
            ice::numbered_sample(&tx, size, seq, i + 1 == iters).send().unwrap();
            seq += 1;
        }
        assert_eq!(ice::next_ack(&acks), seq, "consumer lost items");
        t.elapsed()
    });
    tx.loan_slice_uninit(0).unwrap().write_from_fn(|_| 0).send().unwrap(); // stop
}

fn main() {
    if let Ok(role) = std::env::var(PEER) {
        run_peer(&role);
        return;
    }
    pin(cpus().first().copied());
    let mut c = common::criterion();
    let mut samples = Samples::new("payloads", "handoff_ack");
    for (label, size, slots) in SIZES {
        let mut g = Group::new(&mut c, &mut samples, &format!("payload_{label}"));
        g.g.throughput(Throughput::Elements(1));
        bench_channel(&mut g, Flavor::Spsc, size, slots, true);
        bench_channel(&mut g, Flavor::Spsc, size, slots, false);
        bench_channel(&mut g, Flavor::Mpmc, size, slots, true);
        bench_channel(&mut g, Flavor::Mpmc, size, slots, false);
        {
            let mut p = peer(&format!("pipe:{size}"), "", 0, true);
            let mut w = p.0.stdin.take().unwrap();
            let mut r = p.0.stdout.take().unwrap();
            bench_stream(&mut g, "pipe", size, &mut r, &mut w);
        }
        let path = std::env::temp_dir().join(unique("sock"));
        let listener = UnixListener::bind(&path).unwrap();
        let _p = peer(&format!("unix:{size}"), path.to_str().unwrap(), 0, false);
        let (mut s, _) = listener.accept().unwrap();
        let mut r = s.try_clone().unwrap();
        bench_stream(&mut g, "unix_socket", size, &mut r, &mut s);
        let _ = std::fs::remove_file(&path);
        bench_ipc_channel(&mut g, size);
        bench_iceoryx2(&mut g, size);
        g.g.finish();
    }
    c.final_summary();
    samples.finish();
}
