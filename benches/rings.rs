//! Cross-process ring benchmarks, in one run, against the baselines a user would otherwise
//! pick: the raw floor (two atomics / a raw futex in a shared mapping), a pipe, a Unix
//! socket, the `ipc-channel` crate and iceoryx2 publish-subscribe, each carrying the same 384
//! descriptor bytes.
//!
//! `cargo bench --bench rings`. The binary re-executes itself as the peer process
//! (`GPURING_BENCH_PEER` names the role). `GPURING_BENCH_CPUS=a,b,c,...` pins this process
//! to `a` and the peers to `b`, `c`, ... (unset: no pinning).
//!
//! Latency benchmarks time round trips and report half of each (one-way); after criterion's
//! measurement each latency case is sampled once more, round trip by round trip, for its p50
//! and p99 (printed at the end, and written to `target/criterion/samples-rings.csv`; see
//! `common::Samples`). Throughput benchmarks report elements per second.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod common;

use common::baselines::{DESC, LAST, STOP, descriptor, echo, ice_echo, ice_sink, ipc_peer, sink};
use common::floor::{
    FloorMap, floor_descriptor_peer, floor_futex_peer, floor_spin_peer, futex_answer, futex_turn,
    futex_wake, futex_wake_as,
};
use common::{Group, NAME, PEER, Peer, Samples, cpus, ice, peer, pin, unique};
use criterion::{BenchmarkId, Criterion, Throughput};
use gpuring::internal::spsc;
use gpuring::{Descriptor, MpmcRing, SpscConsumer, SpscProducer, SpscRing, WaitPolicy};

/// Elements per slice in the batched throughput rows (`push_slice` / `pop_into`).
const BATCH: usize = 32;

/// The bench's side of a one-way stream: the producer of `{name}-ping` (1024 cells) and
/// the consumer of `{name}-pong` (4 cells, for acknowledgements).
fn stream_rings<T: bytemuck::Pod + Send>(name: &str) -> (SpscProducer<T>, SpscConsumer<T>) {
    let data = SpscRing::<T>::builder(format!("{name}-ping")).capacity(1024).create().unwrap();
    let ack = SpscRing::<T>::builder(format!("{name}-pong")).capacity(4).create().unwrap();
    (data.producer().unwrap(), ack.consumer().unwrap())
}

/// The bench's rings of a latency case: `{name}-ping` (it produces) and `{name}-pong` (it
/// consumes), 64 cells each.
fn ping_pong_rings(name: &str) -> (SpscRing<Descriptor>, SpscRing<Descriptor>) {
    let ring = |side: &str| {
        SpscRing::<Descriptor>::builder(format!("{name}-{side}")).capacity(64).create().unwrap()
    };
    (ring("ping"), ring("pong"))
}

/// The peer's side of `{name}-ping` / `{name}-pong`: its consumer and its producer.
fn peer_ends<T: bytemuck::Pod + Send>(name: &str) -> (SpscConsumer<T>, SpscProducer<T>) {
    let ping = SpscRing::<T>::builder(format!("{name}-ping")).open().unwrap();
    let pong = SpscRing::<T>::builder(format!("{name}-pong")).open().unwrap();
    (ping.consumer().unwrap(), pong.producer().unwrap())
}

// ---------------------------------------------------------------------------------------
// Peers

fn run_peer(role: &str) {
    let name = std::env::var(NAME).unwrap();
    let index: usize = std::env::var("GPURING_BENCH_PEER_INDEX").unwrap().parse().unwrap();
    pin(cpus().get(1 + index).copied());
    match role {
        "floor-spin" => floor_spin_peer(&name),
        "floor-descriptor-spin" => floor_descriptor_peer(&name),
        "floor-futex" => floor_futex_peer(&name, false),
        "floor-futex-descriptor" => floor_futex_peer(&name, true),
        "spsc-echo-spin" | "spsc-echo-spin-demote" | "spsc-echo-sleep" => {
            let policy = if role.contains("spin") {
                WaitPolicy::spin_then_sleep(u32::MAX, 0)
            } else {
                WaitPolicy::SLEEP
            };
            let (mut rx, mut tx) = peer_ends::<Descriptor>(&name);
            rx.set_wait_policy(policy);
            tx.set_wait_policy(policy);
            tx.set_demote(role.ends_with("demote"));
            loop {
                let d = rx.pop().unwrap();
                if d.seq == STOP {
                    return;
                }
                tx.push(d).unwrap();
            }
        }
        "spsc-sink-u64" => {
            let (mut rx, mut tx) = peer_ends::<u64>(&name);
            loop {
                match rx.pop().unwrap() {
                    STOP => return,
                    LAST => tx.push(LAST).unwrap(),
                    _ => {}
                }
            }
        }
        "spsc-sink-batch" => {
            // Drains in slices of up to BATCH (`pop_into`: one `head` store per slice).
            let (mut rx, mut tx) = peer_ends::<Descriptor>(&name);
            let mut buf = [Descriptor::default(); BATCH];
            loop {
                let n = rx.pop_into(&mut buf).unwrap();
                for d in &buf[..n] {
                    if d.seq == STOP {
                        return;
                    }
                    if d.tag == LAST {
                        tx.push(*d).unwrap();
                    }
                }
            }
        }
        "spsc-sink" => {
            let (mut rx, mut tx) = peer_ends::<Descriptor>(&name);
            loop {
                let d = rx.pop().unwrap();
                if d.seq == STOP {
                    return;
                }
                if d.tag == LAST {
                    tx.push(d).unwrap();
                }
            }
        }
        "mpmc-producer" | "mpmc-producer-batch" => {
            // One at a time, or in slices of BATCH (`push_slice`: one claim of `tail` per
            // slice).
            let data = MpmcRing::<Descriptor>::builder(format!("{name}-data")).open().unwrap();
            let cmd = MpmcRing::<u64>::builder(format!("{name}-cmd")).open().unwrap();
            let (tx, cmds) = (data.producer().unwrap(), cmd.consumer().unwrap());
            let batch = if role.ends_with("batch") { BATCH as u64 } else { 1 };
            let mut buf = [Descriptor::default(); BATCH];
            loop {
                let n = cmds.pop().unwrap();
                for start in (0..n).step_by(batch as usize) {
                    let len = batch.min(n - start);
                    for (k, d) in (start..start + len).zip(&mut buf) {
                        *d = descriptor(k);
                        d.tag = u64::from(k + 1 == n);
                    }
                    if batch == 1 {
                        tx.push(buf[0]).unwrap();
                    } else {
                        tx.push_slice(&buf[..len as usize]).unwrap();
                    }
                }
            }
        }
        "mpmc-consumer" | "mpmc-consumer-batch" => {
            let data = MpmcRing::<Descriptor>::builder(format!("{name}-data")).open().unwrap();
            let ack = MpmcRing::<u64>::builder(format!("{name}-ack")).open().unwrap();
            let (rx, acks) = (data.consumer().unwrap(), ack.producer().unwrap());
            let batch = if role.ends_with("batch") { BATCH } else { 1 };
            let mut buf = [Descriptor::default(); BATCH];
            loop {
                let n = if batch == 1 {
                    buf[0] = rx.pop().unwrap();
                    1
                } else {
                    rx.pop_into(&mut buf).unwrap()
                };
                for d in &buf[..n] {
                    if d.tag == LAST {
                        acks.push(1).unwrap();
                    }
                }
            }
        }
        "ice-echo-spin" | "ice-echo-sleep" => ice_echo(&name, role == "ice-echo-sleep"),
        "ice-sink" => ice_sink(&name),
        "ipc-echo" | "ipc-sink" => ipc_peer(name, role == "ipc-echo"),
        "pipe-echo" => echo(std::io::stdin().lock(), std::io::stdout().lock()),
        "unix-echo" => {
            let s = UnixStream::connect(&name).unwrap();
            echo(s.try_clone().unwrap(), s);
        }
        "pipe-sink" => sink(std::io::stdin().lock(), std::io::stdout().lock()),
        "unix-sink" => {
            let s = UnixStream::connect(&name).unwrap();
            sink(s.try_clone().unwrap(), s);
        }
        _ => panic!("unknown peer role {role}"),
    }
}

// ---------------------------------------------------------------------------------------
// Benchmarks

fn one_way(round_trips: Duration) -> Duration {
    round_trips / 2
}

fn latency(c: &mut Criterion, samples: &mut Samples) {
    let mut g = Group::new(c, samples, "latency_one_way");

    {
        let name = format!("/{}", unique("floor"));
        let map = FloorMap::create(&name);
        let _p = peer("floor-spin", &name, 0, false);
        let f = map.get();
        let mut seq = 0u64;
        g.run("floor_atomics_spin", DESC, |iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                f.ping.0.store(seq, Ordering::Release);
                while f.pong.0.load(Ordering::Acquire) != seq {
                    std::hint::spin_loop();
                }
            }
            one_way(t.elapsed())
        });
        f.ping.0.store(STOP, Ordering::Release);
    }

    {
        let name = format!("/{}", unique("floordesc"));
        let map = FloorMap::create(&name);
        let _p = peer("floor-descriptor-spin", &name, 0, false);
        let f = map.get();
        let mut stamp = 0u64;
        g.run("floor_descriptor_spin", DESC, |iters| {
            let t = Instant::now();
            for _ in 0..iters {
                stamp += 1;
                f.ping_cell.send(descriptor(stamp), stamp);
                assert_eq!(f.pong_cell.recv(stamp).seq, stamp);
            }
            one_way(t.elapsed())
        });
        f.ping_cell.send(descriptor(STOP), stamp + 1);
    }

    let spin = WaitPolicy::spin_then_sleep(u32::MAX, 0);
    for (label, role, policy) in [
        ("gpuring_spsc_spin", "spsc-echo-spin", spin),
        ("gpuring_spsc_spin_demote", "spsc-echo-spin-demote", spin),
        ("gpuring_spsc_sleep", "spsc-echo-sleep", WaitPolicy::SLEEP),
    ] {
        let name = unique("lat");
        let (ping, pong) = ping_pong_rings(&name);
        let (mut tx, mut rx) = (ping.producer().unwrap(), pong.consumer().unwrap());
        tx.set_wait_policy(policy);
        rx.set_wait_policy(policy);
        tx.set_demote(role.ends_with("demote"));
        let p = peer(role, &name, 0, false);
        let mut seq = 0u64;
        // This side's futex waits and round trips, in criterion's batches (more than one
        // round trip each) and in the single round trips of the sample pass: whether this
        // side really slept in each.
        let mut slept = [(0u64, 0u64); 2];
        g.run(label, DESC, |iters| {
            let waits = gpuring::internal::wait_stats().futex_waits;
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                tx.push(descriptor(seq)).unwrap();
                let back = rx.pop().unwrap();
                assert_eq!(back.seq, seq);
            }
            let took = t.elapsed();
            let tally = &mut slept[(iters == 1) as usize];
            tally.0 += gpuring::internal::wait_stats().futex_waits - waits;
            tally.1 += iters;
            one_way(took)
        });
        tx.push(descriptor(STOP)).unwrap();
        p.finish();
        if policy == WaitPolicy::SLEEP {
            let per = |(waits, trips): (u64, u64)| waits as f64 / trips.max(1) as f64;
            println!(
                "futex waits per round trip, this side, {label}: {:.3} in criterion's batches, {:.3} in the sample pass",
                per(slept[0]),
                per(slept[1])
            );
        }
    }

    #[cfg(feature = "async")]
    {
        // The sleeping hop again, this side an async task: the push as above, the pop a
        // `pop_async` on a current-thread tokio runtime (the task parks; this process's
        // waiter thread wakes it). The peer sleeps as in `gpuring_spsc_sleep`.
        let name = unique("lat-async");
        let (ping, pong) = ping_pong_rings(&name);
        let (mut tx, mut rx) = (ping.producer().unwrap(), pong.consumer().unwrap());
        tx.set_wait_policy(WaitPolicy::SLEEP);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let p = peer("spsc-echo-sleep", &name, 0, false);
        let mut seq = 0u64;
        g.run("gpuring_spsc_async", DESC, |iters| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..iters {
                    seq += 1;
                    tx.push(descriptor(seq)).unwrap();
                    let back = rx.pop_async().await.unwrap();
                    assert_eq!(back.seq, seq);
                }
                one_way(t.elapsed())
            })
        });
        tx.push(descriptor(STOP)).unwrap();
        p.finish();
    }

    #[cfg(feature = "async")]
    {
        // The sleeping hop again, this side a blocking `select` over the pong ring and
        // three silent ones: the thread sleeps on all four words at once (`futex_waitv`).
        // The peer sleeps as in `gpuring_spsc_sleep`.
        let name = unique("lat-select");
        let (ping, pong) = ping_pong_rings(&name);
        let (mut tx, mut rx) = (ping.producer().unwrap(), pong.consumer().unwrap());
        tx.set_wait_policy(WaitPolicy::SLEEP);
        let quiet: Vec<_> = (0..3)
            .map(|i| {
                SpscRing::<Descriptor>::builder(format!("{name}-quiet{i}"))
                    .capacity(4)
                    .create()
                    .unwrap()
            })
            .collect();
        let _quiet_tx: Vec<_> = quiet.iter().map(|r| r.producer().unwrap()).collect();
        let mut quiet_rx: Vec<_> = quiet.iter().map(|r| r.consumer().unwrap()).collect();
        let p = peer("spsc-echo-sleep", &name, 0, false);
        let mut seq = 0u64;
        g.run("gpuring_spsc_select", DESC, |iters| {
            let mut live: Vec<&mut SpscConsumer<Descriptor>> = vec![&mut rx];
            live.extend(quiet_rx.iter_mut());
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                tx.push(descriptor(seq)).unwrap();
                let (i, back) = gpuring::select(&mut live);
                assert_eq!((i, back.unwrap().seq), (0, seq));
            }
            one_way(t.elapsed())
        });
        tx.push(descriptor(STOP)).unwrap();
        p.finish();
    }

    // The raw futex floor, bare and carrying a descriptor each way (the sleeping rows'
    // floor: written and stamped in a raw cell before the word is stored and woken).
    for (label, role, carry) in [
        ("floor_futex", "floor-futex", false),
        ("floor_futex_descriptor", "floor-futex-descriptor", true),
    ] {
        let name = format!("/{}", unique("futex"));
        let map = FloorMap::create(&name);
        let _p = peer(role, &name, 0, false);
        let f = map.get();
        let mut seq = 0u32;
        g.run(label, DESC, |iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq = if seq + 1 == u32::MAX { 1 } else { seq + 1 };
                if carry {
                    f.ping_cell.send(descriptor(seq.into()), seq.into());
                }
                futex_turn(&f.ping32.0, &f.pong32.0, seq, false);
                if carry {
                    assert_eq!(f.pong_cell.recv(seq.into()).seq, u64::from(seq));
                }
            }
            one_way(t.elapsed())
        });
        f.ping32.0.store(u32::MAX, Ordering::Release);
        futex_wake(&f.ping32.0);
    }

    // The same bare ping-pong between two threads of this process (the second pinned where
    // the peer process would be), on words in a shared-memory page: with private futexes
    // (keyed by process and address), then with shared ones (keyed through the page, as
    // between processes). Where a sleeping hop's kernel time goes: the futex key, or the
    // wake-up itself.
    for (label, private) in [("floor_futex_threads", true), ("floor_futex_threads_shared", false)] {
        let name = format!("/{}", unique("futex"));
        let map = FloorMap::create(&name);
        let f = map.get();
        let (ping, pong) = (&f.ping32.0, &f.pong32.0);
        std::thread::scope(|s| {
            s.spawn(move || {
                pin(cpus().get(1).copied());
                futex_answer(ping, pong, private, |_| {});
            });
            let mut seq = 0u32;
            g.run(label, DESC, |iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    seq = if seq + 1 == u32::MAX { 1 } else { seq + 1 };
                    futex_turn(ping, pong, seq, private);
                }
                one_way(t.elapsed())
            });
            // Release: the answering thread's Acquire load sees the stop.
            ping.store(u32::MAX, Ordering::Release);
            futex_wake_as(ping, private);
        });
    }

    for (label, sleep) in [("iceoryx2_spin", false), ("iceoryx2_sleep", true)] {
        let name = unique("ice");
        let side = ice::PingPong::<DESC>::new(&name, false, sleep);
        let _p = peer(if sleep { "ice-echo-sleep" } else { "ice-echo-spin" }, &name, 0, false);
        ice::wait_for_subscriber(&side.out);
        let mut seq = 0u64;
        g.run(label, DESC, |iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                side.send(bytemuck::cast(descriptor(seq)));
                let back: Descriptor = bytemuck::pod_read_unaligned(&side.recv());
                assert_eq!(back.seq, seq);
            }
            one_way(t.elapsed())
        });
        side.send(bytemuck::cast(descriptor(STOP)));
    }

    {
        let (_p, data_tx, back_rx) = ipc_channel_peer("ipc-echo");
        let mut seq = 0u64;
        g.run("ipc_channel", DESC, |iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                data_tx.send(bytemuck::bytes_of(&descriptor(seq))).unwrap();
                let back: Descriptor = bytemuck::pod_read_unaligned(&back_rx.recv().unwrap());
                assert_eq!(back.seq, seq);
            }
            one_way(t.elapsed())
        });
    }

    with_stream_peers("echo", |label, r, w| bench_stream_latency(&mut g, label, r, w));

    {
        // The async baseline: a Unix socket read by a tokio task (current-thread runtime,
        // woken by its epoll driver), against the same blocking echo peer.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let path = std::env::temp_dir().join(unique("tsock"));
        let listener = UnixListener::bind(&path).unwrap();
        let _p = peer("unix-echo", path.to_str().unwrap(), 0, false);
        let (s, _) = listener.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut s = rt.block_on(async { tokio::net::UnixStream::from_std(s) }).unwrap();
        let mut seq = 0u64;
        let mut buf = [0u8; DESC];
        g.run("tokio_unix_socket", DESC, |iters| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..iters {
                    seq += 1;
                    s.write_all(bytemuck::bytes_of(&descriptor(seq))).await.unwrap();
                    s.read_exact(&mut buf).await.unwrap();
                    let back: Descriptor = bytemuck::pod_read_unaligned(&buf);
                    assert_eq!(back.seq, seq);
                }
                one_way(t.elapsed())
            })
        });
        drop(s);
        let _ = std::fs::remove_file(&path);
    }
    g.g.finish();
}

/// Starts an `ipc-channel` peer playing `role` ("ipc-echo" or "ipc-sink"); returns it, the
/// sender of descriptors to it and the receiver of what it sends back.
fn ipc_channel_peer(
    role: &str,
) -> (Peer, ipc_channel::ipc::IpcBytesSender, ipc_channel::ipc::IpcBytesReceiver) {
    type Boot = (ipc_channel::ipc::IpcBytesSender, ipc_channel::ipc::IpcBytesReceiver);
    let (server, name) = ipc_channel::ipc::IpcOneShotServer::<Boot>::new().unwrap();
    let p = peer(role, &name, 0, false);
    let (tx, rx) = server.accept().unwrap().1;
    (p, tx, rx)
}

/// Starts the pipe peer and then the Unix-socket peer playing `role` ("echo" or "sink"), and
/// hands each connection to `run` with its label.
fn with_stream_peers(role: &str, mut run: impl FnMut(&str, &mut dyn Read, &mut dyn Write)) {
    {
        let mut p = peer(&format!("pipe-{role}"), "", 0, true);
        let mut w = p.0.stdin.take().unwrap();
        let mut r = p.0.stdout.take().unwrap();
        run("pipe", &mut r, &mut w);
    }
    let path = std::env::temp_dir().join(unique("sock"));
    let listener = UnixListener::bind(&path).unwrap();
    let _p = peer(&format!("unix-{role}"), path.to_str().unwrap(), 0, false);
    let (mut s, _) = listener.accept().unwrap();
    let mut r = s.try_clone().unwrap();
    run("unix_socket", &mut r, &mut s);
    let _ = std::fs::remove_file(&path);
}

fn bench_stream_latency(g: &mut Group<'_>, label: &str, r: &mut dyn Read, w: &mut dyn Write) {
    let mut seq = 0u64;
    let mut buf = [0u8; DESC];
    g.run(label, DESC, |iters| {
        let t = Instant::now();
        for _ in 0..iters {
            seq += 1;
            w.write_all(bytemuck::bytes_of(&descriptor(seq))).unwrap();
            r.read_exact(&mut buf).unwrap();
            let back: Descriptor = bytemuck::pod_read_unaligned(&buf);
            assert_eq!(back.seq, seq);
        }
        one_way(t.elapsed())
    });
}

fn throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("throughput");
    g.throughput(Throughput::Elements(1));

    {
        let name = unique("tput");
        let (mut tx, mut acks) = stream_rings::<Descriptor>(&name);
        let p = peer("spsc-sink", &name, 0, false);
        g.bench_function(BenchmarkId::new("gpuring_spsc", "1p1c"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for i in 0..iters {
                    let mut d = descriptor(i);
                    d.tag = u64::from(i + 1 == iters);
                    tx.push(d).unwrap();
                }
                acks.pop().unwrap();
                t.elapsed()
            })
        });
        tx.push(descriptor(STOP)).unwrap();
        p.finish();
    }

    {
        // The same stream in slices of BATCH: one `tail` store per slice on the producer
        // (`push_slice`), one `head` store per slice on the consumer (`pop_into`).
        let name = unique("tputb");
        let (mut tx, mut acks) = stream_rings::<Descriptor>(&name);
        let p = peer("spsc-sink-batch", &name, 0, false);
        let mut buf = [Descriptor::default(); BATCH];
        g.bench_function(BenchmarkId::new("gpuring_spsc_batch32", "1p1c"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                let mut i = 0;
                while i < iters {
                    let n = (iters - i).min(BATCH as u64) as usize;
                    for (k, d) in buf[..n].iter_mut().enumerate() {
                        *d = descriptor(i + k as u64);
                        d.tag = u64::from(i + k as u64 + 1 == iters);
                    }
                    tx.push_slice(&buf[..n]).unwrap();
                    i += n as u64;
                }
                acks.pop().unwrap();
                t.elapsed()
            })
        });
        tx.push(descriptor(STOP)).unwrap();
        p.finish();
    }

    {
        // The same ring carrying 8-byte elements: what the algorithm costs without the
        // descriptor's six cache lines.
        let name = unique("tput64");
        let (mut tx, mut acks) = stream_rings::<u64>(&name);
        let p = peer("spsc-sink-u64", &name, 0, false);
        g.bench_function(BenchmarkId::new("gpuring_spsc_u64", "1p1c"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for i in 0..iters {
                    // Values 2.. carry data; LAST (1) closes the batch; STOP ends the peer.
                    tx.push(if i + 1 == iters { LAST } else { 2 + (i & 0xffff) }).unwrap();
                }
                assert_eq!(acks.pop().unwrap(), LAST);
                t.elapsed()
            })
        });
        tx.push(STOP).unwrap();
        p.finish();
    }

    for (label, suffix) in [("gpuring_mpmc", ""), ("gpuring_mpmc_batch32", "-batch")] {
        let name = unique("mpmc");
        let _data = MpmcRing::<Descriptor>::builder(format!("{name}-data"))
            .capacity(1024)
            .create()
            .unwrap();
        let cmd = MpmcRing::<u64>::builder(format!("{name}-cmd")).capacity(16).create().unwrap();
        let ack = MpmcRing::<u64>::builder(format!("{name}-ack")).capacity(16).create().unwrap();
        let (cmds, acks) = (cmd.producer().unwrap(), ack.consumer().unwrap());
        let _peers: Vec<Peer> = (0..4)
            .map(|i| {
                let role = if i < 2 { "mpmc-producer" } else { "mpmc-consumer" };
                peer(&format!("{role}{suffix}"), &name, i, false)
            })
            .collect();
        g.bench_function(BenchmarkId::new(label, "2p2c"), |b| {
            b.iter_custom(|iters| {
                let half = iters.div_ceil(2);
                let t = Instant::now();
                cmds.push(half).unwrap();
                cmds.push(half).unwrap();
                acks.pop().unwrap();
                acks.pop().unwrap();
                // Elapsed scaled to the `iters` asked for (2 * half may exceed it by one).
                t.elapsed().mul_f64(iters as f64 / (2 * half) as f64)
            })
        });
    }

    {
        let name = unique("icetput");
        let node = ice::node();
        let data = ice::array_service::<DESC>(&node, &format!("{name}-ping"), 1024);
        let ack = ice::u64_service(&node, &format!("{name}-pong"), 4);
        let acks = ack.subscriber_builder().create().unwrap();
        let tx = ice::publisher(&data);
        let _p = peer("ice-sink", &name, 0, false);
        ice::wait_for_subscriber(&data);
        g.bench_function(BenchmarkId::new("iceoryx2", "1p1c"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for i in 0..iters {
                    let mut d = descriptor(i);
                    d.tag = u64::from(i + 1 == iters);
                    tx.send_copy(bytemuck::cast(d)).unwrap();
                }
                loop {
                    if let Some(a) = acks.receive().unwrap() {
                        assert_eq!(*a, LAST);
                        break;
                    }
                    std::hint::spin_loop();
                }
                t.elapsed()
            })
        });
        tx.send_copy(bytemuck::cast(descriptor(STOP))).unwrap();
    }

    {
        let (_p, data_tx, ack_rx) = ipc_channel_peer("ipc-sink");
        g.bench_function(BenchmarkId::new("ipc_channel", "1p1c"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for i in 0..iters {
                    let mut d = descriptor(i);
                    d.tag = u64::from(i + 1 == iters);
                    data_tx.send(bytemuck::bytes_of(&d)).unwrap();
                }
                let back: Descriptor = bytemuck::pod_read_unaligned(&ack_rx.recv().unwrap());
                assert_eq!(back.tag, LAST);
                t.elapsed()
            })
        });
    }

    with_stream_peers("sink", |label, r, w| bench_stream_throughput(&mut g, label, r, w));
    g.finish();
}

/// One `write` per descriptor (how a sender of messages uses a pipe); the reader buffers.
fn bench_stream_throughput(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    label: &str,
    r: &mut dyn Read,
    w: &mut dyn Write,
) {
    g.bench_function(BenchmarkId::new(label, "1p1c"), |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            w.write_all(&iters.to_le_bytes()).unwrap();
            for i in 0..iters {
                w.write_all(bytemuck::bytes_of(&descriptor(i))).unwrap();
            }
            let mut ack = [0u8; 1];
            r.read_exact(&mut ack).unwrap();
            t.elapsed()
        })
    });
}

/// In-process SPSC on the heap: the algorithm without the process boundary.
fn in_process(c: &mut Criterion) {
    let mut g = c.benchmark_group("in_process");
    g.throughput(Throughput::Elements(1));
    let (mut tx, mut rx) = spsc::with_capacity::<Descriptor>(1024);
    g.bench_function("spsc_push_pop_same_thread", |b| {
        b.iter(|| {
            tx.try_push(descriptor(1)).unwrap();
            rx.try_pop().unwrap()
        })
    });
    g.finish();
}

fn main() {
    if let Ok(role) = std::env::var(PEER) {
        run_peer(&role);
        return;
    }
    pin(cpus().first().copied());
    eprintln!("wake-up barrier mode: {:?}", gpuring::internal::barrier_mode());
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut samples = Samples::new("rings", "one_way");
    latency(&mut c, &mut samples);
    throughput(&mut c);
    in_process(&mut c);
    c.final_summary();
    samples.finish();
}
