//! Rings between processes: the test binary re-executes itself as each peer.
#![cfg(not(loom))] // shared memory is not modelled by loom

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{ring_name, role, spawn, unique_name, wait_all, wait_for};
use gpuring::internal::wait_stats;
use gpuring::{Descriptor, MpmcRing, PushTimeoutError, SpscRing, WaitPolicy};

const WATCHDOG: Duration = Duration::from_secs(120);
const POP_LIMIT: Duration = Duration::from_secs(60);

fn descriptor(seq: u64) -> Descriptor {
    let mut d =
        Descriptor { seq, tag: seq.wrapping_mul(0x9e37_79b9_7f4a_7c15), ..Default::default() };
    d.shape[0] = !seq;
    d
}

fn check(d: &Descriptor, seq: u64) {
    assert_eq!(d.seq, seq, "out of order or lost");
    assert_eq!(d.tag, seq.wrapping_mul(0x9e37_79b9_7f4a_7c15), "torn descriptor at {seq}");
    assert_eq!(d.shape[0], !seq, "torn descriptor at {seq}");
}

#[test]
fn spsc_one_million_descriptors_in_order() {
    const N: u64 = 1_000_000;
    if role().as_deref() == Some("consumer") {
        let ring = SpscRing::<Descriptor>::builder(ring_name()).open().unwrap();
        let mut rx = ring.consumer().unwrap();
        for seq in 0..N {
            check(&rx.pop_timeout(POP_LIMIT).unwrap(), seq);
        }
        assert!(rx.pop_timeout(Duration::from_millis(50)).is_err(), "more than was sent");
        return;
    }
    let name = unique_name("spsc1m");
    let ring = SpscRing::<Descriptor>::builder(&name).capacity(1024).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut peers = [spawn("spsc_one_million_descriptors_in_order", "consumer", &name, &[])];
    for seq in 0..N {
        tx.push_timeout(descriptor(seq), POP_LIMIT).unwrap();
    }
    wait_all(&mut peers, WATCHDOG);
}

#[test]
fn mpmc_three_producer_and_two_consumer_processes_exactly_once() {
    const PER_PRODUCER: u64 = 100_000;
    const PRODUCERS: u64 = 3;
    const STOP: u64 = u64::MAX;
    match role().as_deref() {
        Some(r) if r.starts_with("producer") => {
            let p: u64 = r["producer".len()..].parse().unwrap();
            let ring = MpmcRing::<Descriptor>::builder(ring_name()).open().unwrap();
            let tx = ring.producer().unwrap();
            for i in 0..PER_PRODUCER {
                tx.push_timeout(descriptor((p << 32) | i), POP_LIMIT).unwrap();
            }
            return;
        }
        Some(r) if r.starts_with("consumer") => {
            let ring = MpmcRing::<Descriptor>::builder(ring_name()).open().unwrap();
            let rx = ring.consumer().unwrap();
            let mut got = Vec::new();
            loop {
                let d = rx.pop_timeout(POP_LIMIT).unwrap();
                if d.seq == STOP {
                    break;
                }
                check(&d, d.seq);
                got.push(d.seq);
            }
            let bytes: Vec<u8> = got.iter().flat_map(|s| s.to_le_bytes()).collect();
            std::fs::write(std::env::var("GPURING_TEST_OUT").unwrap(), bytes).unwrap();
            return;
        }
        _ => {}
    }
    let test = "mpmc_three_producer_and_two_consumer_processes_exactly_once";
    let name = unique_name("mpmc");
    let ring = MpmcRing::<Descriptor>::builder(&name).capacity(256).create().unwrap();
    let tx = ring.producer().unwrap();
    let dir = std::env::temp_dir();
    let outs: Vec<_> = (0..2).map(|c| dir.join(format!("{name}-consumer{c}.bin"))).collect();
    let mut consumers: Vec<_> = outs
        .iter()
        .enumerate()
        .map(|(c, out)| {
            let env = [("GPURING_TEST_OUT", out.display().to_string())];
            spawn(test, &format!("consumer{c}"), &name, &env)
        })
        .collect();
    let mut producers: Vec<_> =
        (0..PRODUCERS).map(|p| spawn(test, &format!("producer{p}"), &name, &[])).collect();
    wait_all(&mut producers, WATCHDOG);
    // Every producer is done: one stop marker per consumer (each stops at its first).
    for _ in 0..2 {
        tx.push_timeout(Descriptor { seq: STOP, ..Default::default() }, POP_LIMIT).unwrap();
    }
    wait_all(&mut consumers, WATCHDOG);

    let mut seen = HashSet::new();
    for out in &outs {
        let bytes = std::fs::read(out).unwrap();
        let _ = std::fs::remove_file(out);
        let mut last = [None::<u64>; PRODUCERS as usize];
        for chunk in bytes.chunks_exact(8) {
            let seq = u64::from_le_bytes(chunk.try_into().unwrap());
            let (p, i) = ((seq >> 32) as usize, seq & 0xffff_ffff);
            assert!(p < PRODUCERS as usize && i < PER_PRODUCER, "invented message {seq:#x}");
            assert!(last[p].is_none_or(|l| l < i), "producer {p}: {i} after {:?}", last[p]);
            last[p] = Some(i);
            assert!(seen.insert(seq), "message {seq:#x} delivered twice");
        }
    }
    assert_eq!(seen.len() as u64, PRODUCERS * PER_PRODUCER, "messages lost");
}

#[test]
fn sleeping_consumer_is_woken_by_a_push() {
    match role().as_deref() {
        Some("consumer") => {
            let ring = SpscRing::<Descriptor>::builder(ring_name()).open().unwrap();
            let mut rx = ring.consumer().unwrap();
            rx.set_wait_policy(WaitPolicy::SLEEP);
            let d = rx.pop_timeout(POP_LIMIT).unwrap();
            check(&d, 42);
            // This process runs this one test alone, so the counts are its own.
            assert!(wait_stats().futex_waits >= 1, "the consumer never slept: {:?}", wait_stats());
            return;
        }
        Some("producer") => {
            let ring = SpscRing::<Descriptor>::builder(ring_name()).open().unwrap();
            let mut tx = ring.producer().unwrap();
            // Push only once the consumer is registered as a sleeper.
            wait_for("consumer asleep", POP_LIMIT, || ring.sleepers().0 == 1);
            // It registers a few instructions before entering futex_wait; give it time to
            // get into the kernel, so the push below must wake it rather than be seen by
            // its last re-check.
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(ring.sleepers().0, 1);
            assert_eq!(wait_stats().futex_wakes, 0);
            tx.push(descriptor(42)).unwrap();
            assert_eq!(wait_stats().futex_wakes, 1, "a push to a sleeper must wake it once");
            return;
        }
        _ => {}
    }
    let test = "sleeping_consumer_is_woken_by_a_push";
    let name = unique_name("sleep");
    let _ring = SpscRing::<Descriptor>::builder(&name).capacity(16).create().unwrap();
    let mut peers = [spawn(test, "consumer", &name, &[]), spawn(test, "producer", &name, &[])];
    wait_all(&mut peers, WATCHDOG);
}

#[test]
fn busy_ring_makes_no_futex_syscall() {
    const N: u64 = 200_000;
    let spin = WaitPolicy::spin_then_sleep(u32::MAX, 0);
    match role().as_deref() {
        Some("consumer") => {
            let ring = SpscRing::<Descriptor>::builder(ring_name()).open().unwrap();
            let mut rx = ring.consumer().unwrap();
            rx.set_wait_policy(spin);
            for seq in 0..N {
                check(&rx.pop_timeout(POP_LIMIT).unwrap(), seq);
            }
            assert_eq!(wait_stats(), Default::default(), "a spinning consumer made futex calls");
            return;
        }
        Some("producer") => {
            let ring = SpscRing::<Descriptor>::builder(ring_name()).open().unwrap();
            let mut tx = ring.producer().unwrap();
            tx.set_wait_policy(spin);
            for seq in 0..N {
                tx.push_timeout(descriptor(seq), POP_LIMIT).unwrap();
            }
            assert_eq!(
                wait_stats(),
                Default::default(),
                "pushes with nobody asleep made futex calls"
            );
            return;
        }
        _ => {}
    }
    let test = "busy_ring_makes_no_futex_syscall";
    let name = unique_name("busy");
    let _ring = SpscRing::<Descriptor>::builder(&name).capacity(64).create().unwrap();
    let mut peers = [spawn(test, "consumer", &name, &[]), spawn(test, "producer", &name, &[])];
    wait_all(&mut peers, WATCHDOG);
}

#[test]
fn roles_pass_between_processes_and_nothing_sent_is_lost() {
    // A first consumer process takes half the stream and exits; a second picks up exactly
    // where it left off.
    const N: u64 = 10_000;
    if let Some(r) = role() {
        let (from, to): (u64, u64) = if r == "first" { (0, N / 2) } else { (N / 2, N) };
        let ring = SpscRing::<Descriptor>::builder(ring_name()).open().unwrap();
        let mut rx = ring.consumer().unwrap();
        for seq in from..to {
            check(&rx.pop_timeout(POP_LIMIT).unwrap(), seq);
        }
        return;
    }
    let test = "roles_pass_between_processes_and_nothing_sent_is_lost";
    let name = unique_name("roles");
    let ring = SpscRing::<Descriptor>::builder(&name).capacity(32).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut first = [spawn(test, "first", &name, &[])];
    for seq in 0..N / 2 {
        tx.push_timeout(descriptor(seq), POP_LIMIT).unwrap();
    }
    wait_all(&mut first, WATCHDOG);
    // Queue the second half before the second consumer exists: nothing may be lost. The
    // ring fills while no consumer is attached: the push then says `Disconnected` (the
    // first has left), with the descriptor back, and is tried again until the second
    // consumer takes over.
    let mut second = [spawn(test, "second", &name, &[])];
    let mut disconnected = 0;
    for seq in N / 2..N {
        let mut d = descriptor(seq);
        loop {
            match tx.push_timeout(d, POP_LIMIT) {
                Ok(()) => break,
                Err(PushTimeoutError::Disconnected(back)) => {
                    assert_eq!(back.seq, seq, "the descriptor comes back");
                    disconnected += 1;
                    d = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("push {seq}: {e}"),
            }
        }
    }
    wait_all(&mut second, WATCHDOG);
    eprintln!("pushes refused while no consumer was attached: {disconnected}");
}

#[test]
fn sleeping_ping_pong_never_loses_a_wake_up() {
    // Both sides sleep at every miss, so every message goes through the sleeper/waker
    // handshake. A lost wake-up would leave a side asleep: the pops have no periodic
    // re-check in asymmetric mode, so it shows as a timeout here (or the watchdog).
    const ROUND_TRIPS: u64 = 20_000;
    if role().as_deref() == Some("echo") {
        let ping = SpscRing::<Descriptor>::builder(format!("{}-ping", ring_name())).open().unwrap();
        let pong = SpscRing::<Descriptor>::builder(format!("{}-pong", ring_name())).open().unwrap();
        let (mut rx, mut tx) = (ping.consumer().unwrap(), pong.producer().unwrap());
        rx.set_wait_policy(WaitPolicy::SLEEP);
        tx.set_wait_policy(WaitPolicy::SLEEP);
        for seq in 0..ROUND_TRIPS {
            let d = rx.pop_timeout(POP_LIMIT).unwrap();
            check(&d, seq);
            tx.push_timeout(d, POP_LIMIT).unwrap();
        }
        assert!(wait_stats().futex_waits > 0, "the echo side never slept");
        return;
    }
    let name = unique_name("pingpong");
    let ping =
        SpscRing::<Descriptor>::builder(format!("{name}-ping")).capacity(4).create().unwrap();
    let pong =
        SpscRing::<Descriptor>::builder(format!("{name}-pong")).capacity(4).create().unwrap();
    let (mut tx, mut rx) = (ping.producer().unwrap(), pong.consumer().unwrap());
    tx.set_wait_policy(WaitPolicy::SLEEP);
    rx.set_wait_policy(WaitPolicy::SLEEP);
    let mut peer = [spawn("sleeping_ping_pong_never_loses_a_wake_up", "echo", &name, &[])];
    for seq in 0..ROUND_TRIPS {
        tx.push_timeout(descriptor(seq), POP_LIMIT).unwrap();
        let back = rx.pop_timeout(POP_LIMIT).unwrap_or_else(|e| panic!("round trip {seq}: {e}"));
        check(&back, seq);
    }
    wait_all(&mut peer, WATCHDOG);
}
