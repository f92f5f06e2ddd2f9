//! Kills at named points (cargo feature `fault-injection`, `src/fault.rs`) and at random
//! times over a long stream: every message published before the kill is delivered exactly
//! once and in order, the death is noticed within 100 ms, the channel is usable after (a
//! new sender or receiver takes the dead one's role), and no slot is lost.
//!
//! `cargo test --features fault-injection --test faults` (`.ci/run` runs it).
#![cfg(all(feature = "fault-injection", not(loom)))]

mod common;

use std::time::{Duration, Instant};

use common::{Peer, assert_noticed, now_ns, ring_name, role, unique_name};
use gpuring::{Channel, Receiver, RecvError, TensorMeta, WaitPolicy};

const SLOTS: u32 = 8;

fn send(tx: &gpuring::Sender, seq: u64) {
    let mut lease = tx.acquire().unwrap();
    lease[..8].copy_from_slice(&seq.to_le_bytes());
    tx.send(lease, TensorMeta::bytes(8)).unwrap();
}

/// Receives until `PeerDead`; returns the sequence numbers and when `PeerDead` came.
fn drain_until_dead(rx: &Receiver) -> (Vec<u64>, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "watchdog: no PeerDead");
        match rx.recv() {
            Ok(m) => got.push(u64::from_le_bytes(m[..8].try_into().unwrap())),
            Err(RecvError::PeerDead) => return (got, now_ns()),
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

/// The channel still works: a new sender in this process takes the dead one's role, its
/// message arrives, and its pool is whole again afterwards.
fn usable_after(ch: &Channel, rx: &Receiver) {
    let tx = ch.sender().expect("the dead sender's role can be taken");
    send(&tx, 1_000_000);
    let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(m[..8], 1_000_000u64.to_le_bytes());
    drop(m);
    assert_eq!(tx.free_slots(), SLOTS as usize, "no slot lost");
}

const MESSAGES: u64 = 50;

#[test]
fn sender_killed_at_each_point() {
    if role().as_deref() == Some("sender") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let tx = ch.sender().unwrap();
        for seq in 0..MESSAGES {
            send(&tx, seq);
            // Give the receiver time to fall asleep, so each publish has a sleeper to wake.
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("the fault point was never reached");
    }
    for (point, n) in [
        ("push_after_write", 1),
        ("push_after_write", 3),
        ("push_after_write", 17),
        ("inside_wake", 1),
        ("inside_wake", 4),
        ("send_holding_lease", 1),
        ("send_holding_lease", 6),
    ] {
        let name = unique_name("fault");
        let ch = Channel::builder(&name).capacity(8).slots(SLOTS, 64).create().unwrap();
        let mut rx = ch.receiver().unwrap();
        rx.set_wait_policy(WaitPolicy::SLEEP);
        let mut peer = Peer::spawn_with(
            "sender_killed_at_each_point",
            "sender",
            &name,
            &[("GPURING_FAULT", format!("{point}:{n}"))],
        );
        let (got, noticed) = drain_until_dead(&rx);
        // Where and when it died: the point's own line, then SIGKILL.
        let line = peer.expect("fault");
        let (at, ns) = line.split_once(' ').unwrap();
        assert_eq!(at, point);
        peer.killed();
        let n_got = got.len() as u64;
        assert_eq!(got, (0..n_got).collect::<Vec<_>>(), "{point}:{n}: exactly once, in order");
        match point {
            // The n-th message was written, never published: the n - 1 before it arrive.
            "push_after_write" | "send_holding_lease" => assert_eq!(n_got, n - 1, "{point}:{n}"),
            // Killed while waking for a message it had published: that one arrives too
            // (at least n were published: each wake follows a publish).
            "inside_wake" => assert!(n_got >= n && n_got <= MESSAGES, "{point}:{n}: {n_got}"),
            _ => unreachable!(),
        }
        assert_noticed(&format!("{point}:{n}"), ns.parse().unwrap(), noticed);
        usable_after(&ch, &rx);
    }
}

#[test]
fn receiver_killed_holding_a_slot() {
    if role().as_deref() == Some("receiver") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        loop {
            drop(rx.recv().unwrap()); // the third one never returns: killed holding it
        }
    }
    let name = unique_name("fault-rx");
    let ch = Channel::builder(&name).capacity(8).slots(4, 64).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peer = Peer::spawn_with(
        "receiver_killed_holding_a_slot",
        "receiver",
        &name,
        &[("GPURING_FAULT", "recv_holding:3".into())],
    );
    for seq in 0..3 {
        send(&tx, seq);
    }
    let line = peer.expect("fault");
    assert!(line.starts_with("recv_holding "), "{line}");
    peer.killed();
    // A new receiver takes the dead one's role; the ring is empty (it took all three).
    let rx = ch.receiver().expect("the dead receiver's role can be taken");
    assert!(matches!(rx.try_recv(), Err(RecvError::Empty)));
    // All four slots can be leased again: the held one comes back to a blocking acquire.
    let t = Instant::now();
    let leases: Vec<_> =
        (0..4).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
    assert!(t.elapsed() < Duration::from_millis(100), "reclaimed in {:?}", t.elapsed());
    drop(leases);
    send(&tx, 7);
    assert_eq!(rx.recv().unwrap()[..8], 7u64.to_le_bytes());
    assert_eq!(tx.free_slots(), 4, "no slot lost");
}

#[test]
fn random_kills_over_a_long_stream() {
    if role().as_deref() == Some("streamer") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let tx = ch.sender().unwrap();
        for seq in 0.. {
            send(&tx, seq);
        }
        unreachable!();
    }
    // A fixed sequence of "random" kill points (an LCG), so a failure can be replayed.
    let mut state = 0x2545_f491_4f6c_dd1d_u64 ^ u64::from(std::process::id());
    for round in 0..5 {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let kill_after = 1_000 + (state >> 33) % 40_000;
        let name = unique_name("stream");
        let ch = Channel::builder(&name).capacity(64).slots(SLOTS, 64).create().unwrap();
        let rx = ch.receiver().unwrap();
        let mut peer = Peer::spawn("random_kills_over_a_long_stream", "streamer", &name);
        let mut got = Vec::new();
        while (got.len() as u64) < kill_after {
            let m = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            got.push(u64::from_le_bytes(m[..8].try_into().unwrap()));
        }
        let killed_at = now_ns();
        peer.child.kill().unwrap();
        let (rest, noticed) = drain_until_dead(&rx);
        peer.killed();
        got.extend(rest);
        let n = got.len() as u64;
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "round {round}: exactly once, in order");
        println!("round {round}: killed after {kill_after} received, {n} delivered in all");
        assert_noticed(&format!("round {round}"), killed_at, noticed);
        usable_after(&ch, &rx);
    }
}
