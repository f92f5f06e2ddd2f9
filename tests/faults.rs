//! Kills at named points (cargo feature `fault-injection`, `src/fault.rs`) and at random
//! times over a long stream: every message published before the kill is delivered exactly
//! once and in order, the death is noticed within 100 ms, the channel is usable after (a
//! new sender or receiver takes the dead one's role), and no slot is lost.
//!
//! `cargo test --features fault-injection --test faults` (`.ci/run` runs it).
#![cfg(all(feature = "fault-injection", not(loom)))]

mod common;

use std::time::{Duration, Instant};

use common::{Peer, announce, assert_noticed, die, now_ns, ring_name, role, unique_name};
use gpuring::{
    Channel, MpmcRing, PopTimeoutError, Receiver, RecvError, RecvTimeoutError, TensorMeta,
    TryRecvError, WaitPolicy,
};

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

/// Waits for the peer's fault line and its SIGKILL; checks the point, returns when (its
/// monotonic ns) it died there.
fn killed_at_point(peer: &mut Peer, point: &str) -> u64 {
    let line = peer.expect("fault");
    let (at, ns) = line.split_once(' ').unwrap();
    assert_eq!(at, point);
    peer.killed();
    ns.parse().unwrap()
}

/// MPMC tests: elements are `producer | seq`.
const VICTIM: u64 = 1 << 32;
const STEADY: u64 = 2 << 32;

/// The steady producer of the MPMC tests: `count` elements, one a millisecond, then it
/// leaves cleanly (its entry cleared, not dead).
fn push_steadily(count: u64) {
    let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
    let tx = ring.producer().unwrap();
    for seq in 0..count {
        tx.push(STEADY | seq).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The longest gap, in ns, between `from` and the first of `times` and between
/// consecutive `times` (ascending).
fn longest_wait(from: u64, times: impl IntoIterator<Item = u64>) -> u64 {
    let mut last = from;
    times
        .into_iter()
        .map(|t| {
            let gap = t - last;
            last = t;
            gap
        })
        .max()
        .unwrap_or(0)
}

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
    let plan = [
        ("push_after_write", [1, 2, 3, 5, 8, 17, 33].as_slice()),
        ("inside_wake", &[1, 2, 4, 7, 12]),
        ("send_holding_lease", &[1, 2, 6, 9, 21]),
    ];
    for (point, n) in plan.iter().flat_map(|(p, ns)| ns.iter().map(move |&n| (*p, n))) {
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
        let died = killed_at_point(&mut peer, point);
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
        assert_noticed(&format!("{point}:{n}"), died, noticed);
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
    for mpmc in [false, true] {
        let flavor = if mpmc { "mpmc" } else { "spsc" };
        let name = unique_name("fault-rx");
        let b = Channel::builder(&name).capacity(8).slots(4, 64);
        let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
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
        // The receiver died holding the third message's slot, before the descriptor left
        // the ring (SPSC: `head` not moved; MPMC: the cell not freed). The other three
        // slots can be leased; the held one is not taken back while its descriptor is
        // there (its next receiver takes it over), and with no receiver alive the wait for
        // it ends in PeerDead.
        let t = Instant::now();
        let leases: Vec<_> =
            (0..3).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
        assert!(
            matches!(
                tx.acquire_timeout(Duration::from_secs(5)),
                Err(gpuring::AcquireTimeoutError::PeerDead)
            ),
            "{flavor}: the held slot is not reclaimed while its message waits"
        );
        assert!(t.elapsed() < Duration::from_millis(200), "PeerDead in {:?}", t.elapsed());
        drop(leases);
        // A new receiver gets the third message (SPSC: at once; MPMC: adopted within a
        // tick), its slot taken over from the dead holder. Exactly once: the dead one
        // never returned it.
        let rx = ch.receiver().expect("a new receiver");
        let t = Instant::now();
        let m = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the message the dead receiver was taking");
        println!("{flavor}: the dead receiver's message taken over in {:?}", t.elapsed());
        assert_eq!(m[..8], 2u64.to_le_bytes(), "{flavor}");
        drop(m);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        let leases: Vec<_> =
            (0..4).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
        drop(leases);
        send(&tx, 7);
        assert_eq!(rx.recv().unwrap()[..8], 7u64.to_le_bytes());
        assert_eq!(tx.free_slots(), 4, "{flavor}: no slot lost");
    }
}

/// Redelivery's steps, with a receiver SIGKILLed at each (SPSC and MPMC): after the
/// descriptor left the ring and before `recv` returned (`recv_popped`, the third message:
/// before redelivery that message was lost), and while taking over a dead receiver's message
/// (`redeliver_holding`: a first receiver died holding message 0, a second one dies taking
/// it over). The next receiver gets the message, marked a redelivery, then the rest in
/// order; every slot comes back.
#[test]
fn receiver_killed_at_each_redelivery_step() {
    const TEST: &str = "receiver_killed_at_each_redelivery_step";
    if role().as_deref() == Some("receiver") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        let m = rx.recv().unwrap();
        if std::env::var("GPURING_TEST_HOLD").is_ok() {
            announce("holding");
            die(); // holding `m`
        }
        drop(m);
        loop {
            drop(rx.recv().unwrap()); // killed at its fault point
        }
    }
    let seq_of = |m: &gpuring::Message| u64::from_le_bytes(m[..8].try_into().unwrap());
    for mpmc in [false, true] {
        for (point, count) in [("recv_popped", 3), ("redeliver_holding", 1)] {
            let what = format!("{} {point}", if mpmc { "mpmc" } else { "spsc" });
            let name = unique_name("fault-redeliver");
            let b = Channel::builder(&name).capacity(8).slots(4, 64);
            let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
            let tx = ch.sender().unwrap();
            let fault = [("GPURING_FAULT", format!("{point}:{count}"))];
            let lost = if point == "recv_popped" {
                (0..3).for_each(|seq| send(&tx, seq));
                killed_at_point(&mut Peer::spawn_with(TEST, "receiver", &name, &fault), point);
                2
            } else {
                send(&tx, 0);
                let mut holder =
                    Peer::spawn_with(TEST, "receiver", &name, &[("GPURING_TEST_HOLD", "1".into())]);
                holder.expect("holding");
                holder.died();
                killed_at_point(&mut Peer::spawn_with(TEST, "receiver", &name, &fault), point);
                0
            };
            send(&tx, 10);
            let rx = ch.receiver().unwrap();
            let t = Instant::now();
            let m = rx.recv_timeout(Duration::from_secs(5)).expect("the message again");
            println!("{what}: redelivered in {:?}", t.elapsed());
            assert_eq!((seq_of(&m), m.redelivered()), (lost, true), "{what}");
            drop(m);
            let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!((seq_of(&m), m.redelivered()), (10, false), "{what}");
            drop(m);
            assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "{what}: once");
            let all: Vec<_> =
                (0..4).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
            drop(all);
            assert_eq!(tx.free_slots(), 4, "{what}: no slot lost");
        }
    }
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

/// MPMC: a producer killed after winning a cell (before writing it, or before stamping it)
/// while another producer keeps pushing. The consumer passes the dead cell once the repair
/// sees its claimant dead (one tick): it gets exactly what the victim published before the
/// kill and everything the live producer pushed, each producer's in order, never stalling
/// for 100 ms; then `PeerDead` once the live producer has left, and the ring works on.
#[test]
fn mpmc_producer_killed_holding_a_claimed_cell() {
    const STEADY_COUNT: u64 = 300;
    match role().as_deref() {
        Some("victim") => {
            let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
            let tx = ring.producer().unwrap();
            for seq in 0..MESSAGES {
                tx.push(VICTIM | seq).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            panic!("the fault point was never reached");
        }
        Some("victim-slices") => {
            let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
            let tx = ring.producer().unwrap();
            for run in 0..MESSAGES {
                let slice: Vec<u64> = (0..RUN).map(|i| VICTIM | (run * RUN + i)).collect();
                tx.push_slice(&slice).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            panic!("the fault point was never reached");
        }
        Some("steady") => return push_steadily(STEADY_COUNT),
        _ => {}
    }
    // A slice of the "victim-slices" role: four cells claimed with one CAS.
    const RUN: u64 = 4;
    // (role, point, counts, how many of the victim's elements arrive when it dies at count
    // n): one at a time, the n-th push won its cell and never published it; in slices, the
    // n-th claim leaves its whole run unwritten, and the n-th publish point is the n-th
    // cell, with the cells before it published.
    type Arrived = fn(u64) -> u64;
    let plan: [(&str, &str, &[u64], Arrived); 4] = [
        ("victim", "push_after_claim", &[1, 2, 5, 9, 17], |n| n - 1),
        ("victim", "push_before_publish", &[1, 2, 7, 20, 31], |n| n - 1),
        ("victim-slices", "push_after_claim", &[1, 3], |n| (n - 1) * RUN),
        ("victim-slices", "push_before_publish", &[2, 7], |n| n - 1),
    ];
    let cases = plan
        .iter()
        .flat_map(|&(role, p, ns, arrived)| ns.iter().map(move |&n| (role, p, n, arrived(n))));
    for (role, point, n, arrived) in cases {
        let name = unique_name("mpmc-fault");
        // Slices get room enough that no run is ever cut short by a full ring.
        let cells = if role == "victim" { 8 } else { 64 };
        let ring = MpmcRing::<u64>::builder(&name).capacity(cells).create().unwrap();
        let mut rx = ring.consumer().unwrap();
        rx.set_wait_policy(WaitPolicy::SLEEP);
        let test = "mpmc_producer_killed_holding_a_claimed_cell";
        let fault = [("GPURING_FAULT", format!("{point}:{n}"))];
        let mut victim = Peer::spawn_with(test, role, &name, &fault);
        let mut steady = Peer::spawn(test, "steady", &name);
        let mut got = Vec::new(); // (value, monotonic ns when popped)
        loop {
            // Without the repair the ring stalls for good (the live producer fills it up
            // behind the dead cell): a timeout here is that failure, not a hang.
            match rx.pop_timeout(Duration::from_secs(5)) {
                Ok(v) => got.push((v, now_ns())),
                Err(PopTimeoutError::PeerDead) => break,
                Err(e) => panic!("{point}:{n}: {e} after {} elements", got.len()),
            }
        }
        let killed_at = killed_at_point(&mut victim, point);
        assert!(steady.child.wait().unwrap().success(), "the live producer finished");
        let of = |p: u64| {
            got.iter().filter(move |(v, _)| v & !0xffff_ffff == p).map(|(v, _)| v & 0xffff_ffff)
        };
        let victim_got: Vec<u64> = of(VICTIM).collect();
        let steady_got: Vec<u64> = of(STEADY).collect();
        assert_eq!(
            victim_got,
            (0..arrived).collect::<Vec<_>>(),
            "{role} {point}:{n}: victim's, once, in order"
        );
        assert_eq!(
            steady_got,
            (0..STEADY_COUNT).collect::<Vec<_>>(),
            "{point}:{n}: all of the live producer's, in order"
        );
        // The live producer pushes every millisecond: no gap after the kill may reach the
        // 100 ms limit (a stall is repaired within a tick).
        let worst = longest_wait(killed_at, got.iter().map(|&(_, t)| t).filter(|&t| t > killed_at));
        println!(
            "{role} {point}:{n}: longest wait for an element after the kill {:.1} ms",
            worst as f64 / 1e6
        );
        assert!(worst < 100_000_000, "{point}:{n}: stalled {:.1} ms", worst as f64 / 1e6);
        // The ring works on: a full lap through every cell.
        let tx = ring.producer().unwrap();
        for v in 0..cells {
            tx.try_push(v).unwrap();
        }
        assert!(tx.try_push(99).is_err(), "exactly {cells} cells free");
        assert_eq!(
            (0..cells).map(|_| rx.try_pop().unwrap()).collect::<Vec<_>>(),
            (0..cells).collect::<Vec<_>>()
        );
    }
}

/// MPMC: a consumer killed right after winning a cell (it never returns the element nor
/// frees the cell). A live consumer that runs out of elements adopts it within a tick:
/// every element arrives exactly once (the adopted one late, after those behind it), and
/// the producer that needed the cell gets it.
#[test]
fn mpmc_consumer_killed_holding_a_claimed_cell() {
    if role().as_deref() == Some("victim") {
        let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
        let rx = ring.consumer().unwrap();
        loop {
            let v = rx.pop().unwrap();
            announce(&format!("popped {v}"));
        }
    }
    let name = unique_name("mpmc-fault-rx");
    let ring = MpmcRing::<u64>::builder(&name).capacity(4).create().unwrap();
    let tx = ring.producer().unwrap();
    let rx = ring.consumer().unwrap();
    let fault = [("GPURING_FAULT", "pop_after_claim:3".to_owned())];
    let test = "mpmc_consumer_killed_holding_a_claimed_cell";
    let mut victim = Peer::spawn_with(test, "victim", &name, &fault);
    for v in 0..3 {
        tx.push(v).unwrap();
        if v < 2 {
            assert_eq!(victim.expect("popped"), v.to_string());
        }
    }
    let died = killed_at_point(&mut victim, "pop_after_claim");
    // Positions 3, 4, 5 fill the cells freed by the victim's first two pops; position 6
    // needs the cell of position 2, which the dead consumer won and never freed.
    for v in 3..6 {
        tx.try_push(v).unwrap();
    }
    assert!(tx.try_push(6).is_err(), "the dead consumer's cell is not free");
    let got: Vec<u64> = (0..4).map(|_| rx.pop_timeout(Duration::from_secs(5)).unwrap()).collect();
    assert_noticed("pop_after_claim:3 (adopted)", died, now_ns());
    assert_eq!(got, [3, 4, 5, 2], "element 2, which the dead consumer won, is adopted");
    tx.try_push(6).expect("the adopted cell is free again");
    assert_eq!(rx.try_pop(), Ok(6));
    assert!(rx.try_pop().is_err(), "nothing else");
}

/// MPMC slices: a consumer killed right after claiming a run of four cells with one CAS
/// (`pop_into`). A live consumer adopts the whole run, in order, within one tick, whether
/// it waits in `pop_into` (all four at that tick) or in `pop` (the first at that tick, the
/// rest at once after it), and the producer gets the four cells back.
#[test]
fn mpmc_slice_consumer_killed_holding_a_run() {
    if role().as_deref() == Some("victim") {
        let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
        let rx = ring.consumer().unwrap();
        let mut buf = [0u64; 8];
        loop {
            let n = rx.pop_into(&mut buf).unwrap();
            announce(&format!("popped {n}"));
        }
    }
    for single in [false, true] {
        let name = unique_name("mpmc-fault-run");
        let ring = MpmcRing::<u64>::builder(&name).capacity(4).create().unwrap();
        let tx = ring.producer().unwrap();
        let rx = ring.consumer().unwrap();
        tx.push_slice(&[0, 1, 2, 3]).unwrap();
        let fault = [("GPURING_FAULT", "pop_after_claim:1".to_owned())];
        let test = "mpmc_slice_consumer_killed_holding_a_run";
        let mut victim = Peer::spawn_with(test, "victim", &name, &fault);
        let died = killed_at_point(&mut victim, "pop_after_claim");
        assert_eq!(tx.try_push_slice(&[4]), Ok(0), "the dead consumer holds every cell");
        let mut buf = [0u64; 8];
        let wait = Duration::from_secs(5);
        let got = if single {
            // One element per `pop`: the first comes at a tick, the rest of the run at once
            // after it (the handle remembers that it is adopting), not a tick each.
            (0..4).map(|_| rx.pop_timeout(Duration::from_secs(5)).unwrap()).collect()
        } else {
            let n = rx.pop_into_timeout(&mut buf, wait).unwrap();
            buf[..n].to_vec()
        };
        let how = if single { "pop, one at a time" } else { "pop_into" };
        assert_noticed(&format!("pop_after_claim:1 (run adopted by {how})"), died, now_ns());
        assert_eq!(got, [0, 1, 2, 3], "{how}: the dead consumer's whole run, once, in order");
        tx.push_slice(&[4, 5, 6, 7]).expect("the adopted cells are free again");
        assert_eq!(rx.try_pop_into(&mut buf), Ok(4));
        assert_eq!(buf[..4], [4, 5, 6, 7]);
        assert_eq!(rx.try_pop_into(&mut buf), Ok(0), "nothing else");
    }
}

/// A dead producer's participant entry is reused only after the cell it died holding is
/// settled: with the table full but for the dead entry, a new endpoint takes that entry,
/// and in doing so passes the dead cell on at once (no blocked endpoint, no tick needed).
#[test]
fn reused_entry_of_a_dead_claimant_settles_its_cell() {
    match role().as_deref() {
        Some("victim") => {
            let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
            ring.producer().unwrap().push(1).unwrap();
            panic!("the fault point was never reached");
        }
        Some("victim-slice") => {
            // One claim of a run of three cells, dying before writing any.
            let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
            ring.producer().unwrap().push_slice(&[1, 2, 3]).unwrap();
            panic!("the fault point was never reached");
        }
        _ => {}
    }
    for (role, dead_cells) in [("victim", 1), ("victim-slice", 3)] {
        let name = unique_name("mpmc-reuse");
        let ring = MpmcRing::<u64>::builder(&name).capacity(4).create().unwrap();
        let rx = ring.consumer().unwrap();
        // 63 entries held here; the victim takes the last one.
        let held: Vec<_> = (0..62).map(|_| ring.producer().unwrap()).collect();
        let fault = [("GPURING_FAULT", "push_after_claim:1".to_owned())];
        let test = "reused_entry_of_a_dead_claimant_settles_its_cell";
        let mut victim = Peer::spawn_with(test, role, &name, &fault);
        assert!(victim.expect("fault").starts_with("push_after_claim "));
        victim.killed();
        held[0].try_push(5).unwrap(); // behind the dead cells
        assert!(
            matches!(rx.try_pop(), Err(gpuring::TryPopError::Empty)),
            "{role}: stalled at the dead cells"
        );
        let reuser = ring.producer().expect("the dead entry is reused");
        assert_eq!(
            rx.try_pop(),
            Ok(5),
            "{role}: all {dead_cells} dead cells settled when the entry was taken: no wait"
        );
        assert!(matches!(ring.producer(), Err(gpuring::AttachError::TooManyParticipants { .. })));
        drop((held, reuser));
    }
}

/// MPMC: a producer SIGKILLed at random times while it streams as fast as it can beside a
/// steady producer (the kill can land anywhere in a push, including between winning a
/// cell and stamping it). The consumer gets a gapless prefix of the victim's elements and
/// all of the steady producer's, in order, never waiting 100 ms after the kill.
#[test]
fn mpmc_random_kills_over_a_long_stream() {
    const STEADY_COUNT: u64 = 200;
    match role().as_deref() {
        Some("victim") => {
            let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
            let tx = ring.producer().unwrap();
            for seq in 0.. {
                tx.push(VICTIM | seq).unwrap();
            }
            unreachable!();
        }
        Some("steady") => return push_steadily(STEADY_COUNT),
        _ => {}
    }
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    for round in 0..5 {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let kill_after = 1_000 + (state >> 33) % 40_000;
        let name = unique_name("mpmc-stream");
        let ring = MpmcRing::<u64>::builder(&name).capacity(64).create().unwrap();
        let rx = ring.consumer().unwrap();
        let test = "mpmc_random_kills_over_a_long_stream";
        let mut victim = Peer::spawn(test, "victim", &name);
        let mut steady = Peer::spawn(test, "steady", &name);
        let (mut victim_got, mut steady_got, mut killed_at) = (Vec::new(), Vec::new(), None);
        let mut times = Vec::new();
        loop {
            match rx.pop_timeout(Duration::from_secs(5)) {
                Ok(v) => {
                    let t = now_ns();
                    if v & !0xffff_ffff == VICTIM {
                        victim_got.push(v & 0xffff_ffff);
                    } else {
                        steady_got.push(v & 0xffff_ffff);
                    }
                    if killed_at.is_some() {
                        times.push(t);
                    }
                }
                Err(PopTimeoutError::PeerDead) => break,
                Err(e) => panic!(
                    "round {round}: {e} (victim {}, steady {})",
                    victim_got.len(),
                    steady_got.len()
                ),
            }
            if killed_at.is_none() && victim_got.len() as u64 >= kill_after {
                killed_at = Some(now_ns());
                victim.child.kill().unwrap();
            }
        }
        victim.killed();
        assert!(steady.child.wait().unwrap().success());
        let n = victim_got.len() as u64;
        assert_eq!(victim_got, (0..n).collect::<Vec<_>>(), "round {round}: a gapless prefix");
        assert_eq!(
            steady_got,
            (0..STEADY_COUNT).collect::<Vec<_>>(),
            "round {round}: all, in order"
        );
        let killed_at = killed_at.expect("the victim was killed");
        let worst = longest_wait(killed_at, times);
        println!(
            "round {round}: killed after {kill_after} received, {n} of the victim's delivered; \
             longest wait after the kill {:.1} ms",
            worst as f64 / 1e6
        );
        assert!(worst < 100_000_000, "round {round}: stalled {:.1} ms", worst as f64 / 1e6);
    }
}

/// A dead consumer's entry is not reused while the cell it won waits for adoption (its
/// claim is the only evidence); once a consumer has adopted the element, it is.
#[test]
fn entry_of_a_dead_consumer_waits_for_the_adoption() {
    if role().as_deref() == Some("victim") {
        let ring = MpmcRing::<u64>::builder(ring_name()).open().unwrap();
        let rx = ring.consumer().unwrap();
        rx.pop().unwrap();
        panic!("the fault point was never reached");
    }
    let name = unique_name("mpmc-reuse-rx");
    let ring = MpmcRing::<u64>::builder(&name).capacity(4).create().unwrap();
    let tx = ring.producer().unwrap();
    let rx = ring.consumer().unwrap();
    let held: Vec<_> = (0..61).map(|_| ring.producer().unwrap()).collect(); // 63 entries
    tx.try_push(41).unwrap();
    let fault = [("GPURING_FAULT", "pop_after_claim:1".to_owned())];
    let test = "entry_of_a_dead_consumer_waits_for_the_adoption";
    let mut victim = Peer::spawn_with(test, "victim", &name, &fault);
    assert!(victim.expect("fault").starts_with("pop_after_claim "));
    victim.killed();
    assert!(
        matches!(ring.producer(), Err(gpuring::AttachError::TooManyParticipants { .. })),
        "the dead consumer's entry is kept while its element waits"
    );
    assert_eq!(rx.pop_timeout(Duration::from_secs(5)), Ok(41), "adopted");
    let reuser = ring.producer().expect("reused once the element was adopted");
    drop((held, reuser));
}

/// A receiver that receives forever, announcing each message (`got N`) before it drops it.
fn announcing_receiver() -> ! {
    let ch = Channel::builder(ring_name()).open().unwrap();
    let rx = ch.receiver().unwrap();
    loop {
        let m = rx.recv().unwrap();
        announce(&format!("got {}", u64::from_le_bytes(m[..8].try_into().unwrap())));
        drop(m);
    }
}

/// A receiver killed while giving a slot back: the slot marked RETURNING, not yet on the
/// free ring (`release_marked`), at several counts. The sender pushes it again at its next
/// wait: every slot comes back, and what the receiver took arrived once.
#[test]
fn receiver_killed_returning_a_slot() {
    if role().as_deref() == Some("receiver") {
        announcing_receiver();
    }
    for count in [1u64, 2, 3, 4, 7] {
        for mpmc in [false, true] {
            let name = unique_name("fault-ret");
            let b = Channel::builder(&name).capacity(16).slots(SLOTS, 64);
            let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
            let tx = ch.sender().unwrap();
            let fault = [("GPURING_FAULT", format!("release_marked:{count}"))];
            let mut peer =
                Peer::spawn_with("receiver_killed_returning_a_slot", "receiver", &name, &fault);
            for seq in 0..count {
                send(&tx, seq);
            }
            let got: Vec<u64> = (0..count).map(|_| peer.expect("got").parse().unwrap()).collect();
            killed_at_point(&mut peer, "release_marked");
            assert_eq!(got, (0..count).collect::<Vec<_>>(), "count {count}, mpmc {mpmc}");
            let t = Instant::now();
            let leases: Vec<_> =
                (0..SLOTS).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
            println!("count {count}, mpmc {mpmc}: every slot back in {:?}", t.elapsed());
            drop(leases);
            assert_eq!(tx.free_slots(), SLOTS as usize, "count {count}, mpmc {mpmc}");
            let rx = ch.receiver().unwrap();
            send(&tx, 100);
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap()[..8], 100u64.to_le_bytes());
            assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "nothing twice");
        }
    }
}

/// A receiver killed giving back the last slot of a pool whose sender has left
/// (`release_marked`: the slot counts as free, the receiver never looked whether that
/// drained the closed pool). The next receiver's look unlinks the pool: nothing is left
/// in `/dev/shm` once the channel goes. Before, the pool stayed while the channel lived,
/// every slot free (the MPMC kill storms saw it).
#[test]
fn receiver_killed_returning_the_last_slot_of_a_closed_pool() {
    if role().as_deref() == Some("receiver") {
        announcing_receiver();
    }
    for mpmc in [false, true] {
        let name = unique_name("fault-last-slot");
        let b = Channel::builder(&name).capacity(4).slots(2, 64);
        let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
        let tx = ch.sender().unwrap();
        send(&tx, 0);
        drop(tx); // leaves: its pool is closed, one slot still in flight
        let pools = common::leftovers_of(&name);
        assert_eq!(pools.len(), 2, "mpmc {mpmc}: the channel and its pool: {pools:?}");
        let fault = [("GPURING_FAULT", "release_marked:1".to_owned())];
        let test = "receiver_killed_returning_the_last_slot_of_a_closed_pool";
        let mut peer = Peer::spawn_with(test, "receiver", &name, &fault);
        assert_eq!(peer.expect("got"), "0", "mpmc {mpmc}");
        killed_at_point(&mut peer, "release_marked");
        let rx = ch.receiver().unwrap();
        assert!(
            matches!(rx.recv_timeout(Duration::from_secs(5)), Err(RecvTimeoutError::Disconnected)),
            "mpmc {mpmc}"
        );
        assert_eq!(common::leftovers_of(&name), [name.as_str()], "mpmc {mpmc}: the pool is gone");
    }
}

/// A receiver killed giving a slot back right after winning its cell of the free ring
/// (`push_won`: the cell won, not yet written), with the pool's other slot back on the
/// free ring after it. The sender passes the dead cell and pushes the slot again at its
/// next wait, without waiting for room (it is the free ring's only taker: waiting would be
/// waiting for itself). Before, with a free ring of exactly the slots, the dead cell took
/// the position the slot needed: the sender's `acquire` hung for good, inside its own
/// tick (the storms' hang of issue 40).
#[test]
fn receiver_killed_after_winning_a_free_ring_cell() {
    if role().as_deref() == Some("receiver") {
        announcing_receiver();
    }
    let _dog = common::watchdog("a sender taking a dead returner's slot", Duration::from_secs(60));
    for mpmc in [false, true] {
        let name = unique_name("fault-push-won");
        let b = Channel::builder(&name).capacity(4).slots(2, 64);
        let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
        let tx = ch.sender().unwrap();
        let fault = [("GPURING_FAULT", "push_won:1".to_owned())];
        let test = "receiver_killed_after_winning_a_free_ring_cell";
        let mut peer = Peer::spawn_with(test, "receiver", &name, &fault);
        send(&tx, 0);
        assert_eq!(peer.expect("got"), "0", "mpmc {mpmc}");
        killed_at_point(&mut peer, "push_won");
        let rx = ch.receiver().unwrap();
        for seq in 1..=4u64 {
            let mut lease = tx.acquire_timeout(Duration::from_secs(5)).unwrap();
            lease[..8].copy_from_slice(&seq.to_le_bytes());
            tx.send(lease, TensorMeta::bytes(8)).unwrap();
            let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(m[..8], seq.to_le_bytes(), "mpmc {mpmc}");
        }
        let t = Instant::now();
        let both: Vec<_> =
            (0..2).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
        println!("mpmc {mpmc}: both slots leased in {:?}", t.elapsed());
        drop(both);
        assert_eq!(tx.free_slots(), 2, "mpmc {mpmc}");
    }
}

/// A kill storm: 100 receivers in turn, each killed at a fault point of the receiving side
/// (taking a slot, or giving one back) at a varying count, while a sender streams. Every
/// message arrives exactly once (what a receiver killed while taking a message did not
/// announce, the next one gets), nothing is lost, and every slot comes back.
#[test]
fn kill_storm_of_receivers_in_one_stream() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    if role().as_deref() == Some("receiver") {
        announcing_receiver();
    }
    const KILLS: u64 = 100;
    // A lost slot would stall the stream, and with it the victims' counts: fail, not hang.
    let _dog = common::watchdog("the kill storm", Duration::from_secs(120));
    let name = unique_name("storm");
    let ch = Channel::builder(&name).capacity(16).slots(SLOTS, 64).create().unwrap();
    let tx = ch.sender().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let streamer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // No receiver between two of them: the lease waits, or says so.
                let Ok(mut lease) = tx.acquire_timeout(Duration::from_millis(10)) else {
                    continue;
                };
                lease[..8].copy_from_slice(&sent.to_le_bytes());
                if tx.send(lease, TensorMeta::bytes(8)).is_ok() {
                    sent += 1;
                }
            }
            (tx, sent)
        })
    };
    let mut announced = Vec::new();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    for kill in 0..KILLS {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let point = if kill % 2 == 0 { "recv_holding" } else { "release_marked" };
        let fault = [("GPURING_FAULT", format!("{point}:{}", 1 + (state >> 33) % 20))];
        let mut peer =
            Peer::spawn_with("kill_storm_of_receivers_in_one_stream", "receiver", &name, &fault);
        loop {
            let line = peer.next_line().expect("the receiver said why it stopped");
            match line.split_once(' ') {
                Some(("got", seq)) => announced.push(seq.parse::<u64>().unwrap()),
                Some(("fault", rest)) => {
                    assert!(rest.starts_with(point), "{rest}");
                    break;
                }
                _ => panic!("receiver said {line:?}"),
            }
        }
        peer.killed();
    }
    stop.store(true, Ordering::Relaxed);
    let (tx, sent) = streamer.join().unwrap();
    // The last receiver takes over what the last victim was taking, then what waits.
    let rx = ch.receiver().unwrap();
    let mut all = announced.clone();
    while let Ok(m) = rx.recv_timeout(Duration::from_millis(200)) {
        all.push(u64::from_le_bytes(m[..8].try_into().unwrap()));
    }
    let mut sorted = all.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), all.len(), "{} duplicates", all.len() - sorted.len());
    assert_eq!(sorted, (0..sent).collect::<Vec<_>>(), "every message sent arrived once");
    println!("{KILLS} receivers killed, {sent} messages, each delivered once");
    let leases: Vec<_> =
        (0..SLOTS).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
    drop(leases);
    assert_eq!(tx.free_slots(), SLOTS as usize, "every slot back");
}

/// A sender killed while registering (its entry claimed and its pool made, not yet
/// active), after leasing a slot, and half-way through a send, on a channel whose pool
/// table has one entry: the replacement sender closes the dead one's entry and takes it;
/// what the dead one published arrives once; its pool goes (nothing it held is left to
/// come back). Before, the dead sender's entry stayed claimed or active for good, and the
/// replacement got `PoolTableFull`.
#[test]
fn sender_killed_anywhere_gives_its_pool_table_entry_back() {
    if role().as_deref() == Some("sender") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let tx = ch.sender().unwrap();
        for seq in 0..MESSAGES {
            send(&tx, seq);
        }
        panic!("the fault point was never reached");
    }
    let plan = [
        (false, "pool_made", 1, 0),
        (false, "send_holding_lease", 3, 2),
        (false, "push_after_write", 3, 2),
        (true, "pool_made", 1, 0),
        (true, "send_holding_lease", 2, 1),
        (true, "push_before_publish", 3, 2),
    ];
    for (mpmc, point, n, published) in plan {
        let what = format!("{point}:{n}, mpmc {mpmc}");
        let name = unique_name("fault-entry");
        let b = Channel::builder(&name).capacity(8).slots(SLOTS, 64).max_senders(1);
        let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
        let rx = ch.receiver().unwrap();
        let fault = [("GPURING_FAULT", format!("{point}:{n}"))];
        let mut peer = Peer::spawn_with(
            "sender_killed_anywhere_gives_its_pool_table_entry_back",
            "sender",
            &name,
            &fault,
        );
        killed_at_point(&mut peer, point);
        let (got, _) = drain_until_dead(&rx);
        assert_eq!(got, (0..published).collect::<Vec<_>>(), "{what}: exactly once");
        let dead = ch.pools();
        assert_eq!(dead.len(), 1, "{what}: the dead sender's entry: {dead:?}");
        usable_after(&ch, &rx);
        let pools = ch.pools();
        assert_eq!(pools.len(), 1, "{what}: one entry: {pools:?}");
        assert_ne!(pools[0].instance, dead[0].instance, "{what}: registered again");
        // The replacement has left too, its pool drained: no pool of the channel is left.
        let stem = format!("{}.", name.trim_start_matches('/'));
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| f.starts_with(&stem))
            .collect();
        assert!(left.is_empty(), "{what}: pools left: {left:?}");
    }
}

/// A receiver killed while giving a slot back, right after winning its cell of the pool's
/// free ring (`push_won`: the claim recorded, the cell unwritten), at several counts, SPSC
/// and MPMC channels. The free ring must not stall at that
/// cell: the sender gets every slot back, and the stream goes on. (The storm hang of
/// issue 40: a sender blocked in `acquire` for good while a new receiver waited.)
#[test]
fn receiver_killed_after_winning_its_free_ring_cell() {
    if role().as_deref() == Some("receiver") {
        announcing_receiver();
    }
    for count in [1u64, 2, 3, 7] {
        for mpmc in [false, true] {
            let name = unique_name("fault-won");
            let b = Channel::builder(&name).capacity(16).slots(SLOTS, 64);
            let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
            let tx = ch.sender().unwrap();
            let fault = [("GPURING_FAULT", format!("push_won:{count}"))];
            let mut peer = Peer::spawn_with(
                "receiver_killed_after_winning_its_free_ring_cell",
                "receiver",
                &name,
                &fault,
            );
            for seq in 0..count {
                send(&tx, seq);
            }
            let got: Vec<u64> = (0..count).map(|_| peer.expect("got").parse().unwrap()).collect();
            killed_at_point(&mut peer, "push_won");
            assert_eq!(got, (0..count).collect::<Vec<_>>(), "count {count}, mpmc {mpmc}");
            let t = Instant::now();
            // Twice round the pool: the free ring's stalled cell must be passed, not only
            // the slot pushed again behind it.
            for round in 0..2 {
                let leases: Vec<_> = (0..SLOTS)
                    .map(|_| tx.acquire_timeout(Duration::from_secs(5)))
                    .collect::<Result<_, _>>()
                    .unwrap_or_else(|e| panic!("count {count}, mpmc {mpmc}, round {round}: {e}"));
                drop(leases);
            }
            println!("count {count}, mpmc {mpmc}: every slot back in {:?}", t.elapsed());
            assert_eq!(tx.free_slots(), SLOTS as usize, "count {count}, mpmc {mpmc}");
            let rx = ch.receiver().unwrap();
            for seq in 100..100 + 3 * u64::from(SLOTS) {
                send(&tx, seq);
                assert_eq!(
                    rx.recv_timeout(Duration::from_secs(5)).unwrap()[..8],
                    seq.to_le_bytes()
                );
            }
            assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "nothing twice");
        }
    }
}

/// An MPMC receiver killed after winning a descriptor cell (`pop_won`), and then the
/// sender leaves: the next receiver gets the message the dead one won (adopted at once,
/// not a tick later), then `Disconnected`. Before, it said `Disconnected` at once: the
/// message was lost (what the MPMC kill storms hit at their end).
#[test]
fn mpmc_message_of_a_dead_receiver_comes_before_disconnected() {
    if role().as_deref() == Some("receiver") {
        announcing_receiver();
    }
    let name = unique_name("fault-won-left");
    let ch = Channel::builder(&name).capacity(4).slots(SLOTS, 64).mpmc().create().unwrap();
    let tx = ch.sender().unwrap();
    let winner = [("GPURING_FAULT", "pop_won:1".to_owned())];
    let test = "mpmc_message_of_a_dead_receiver_comes_before_disconnected";
    let mut peer = Peer::spawn_with(test, "receiver", &name, &winner);
    send(&tx, 7);
    killed_at_point(&mut peer, "pop_won");
    drop(tx);
    let rx = ch.receiver().unwrap();
    let m = rx.recv_timeout(Duration::from_secs(5)).expect("the dead receiver's message");
    assert_eq!(m[..8], 7u64.to_le_bytes());
    drop(m);
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(5)),
        Err(gpuring::RecvTimeoutError::Disconnected)
    ));
}

/// An MPMC receiver killed after winning a descriptor cell (`pop_won`), then the receiver
/// that adopted that cell killed too before freeing it: right after taking the cell
/// (`adopt_won`), or holding the message's slot (`recv_holding`). The next receiver adopts
/// the cell again: the message arrives once, and the ring keeps working for more than a
/// lap. Before, the cell stayed adopted for good: the message lost and the ring stalled
/// (what the MPMC kill storms hit about one run in three).
#[test]
fn mpmc_adopter_killed_before_freeing_the_cell() {
    if role().as_deref() == Some("receiver") {
        announcing_receiver();
    }
    for point in ["adopt_won", "recv_holding"] {
        let name = unique_name("fault-adopter");
        let ch = Channel::builder(&name).capacity(4).slots(SLOTS, 64).mpmc().create().unwrap();
        let tx = ch.sender().unwrap();
        let test = "mpmc_adopter_killed_before_freeing_the_cell";
        let winner = [("GPURING_FAULT", "pop_won:1".to_owned())];
        let mut peer = Peer::spawn_with(test, "receiver", &name, &winner);
        send(&tx, 7);
        killed_at_point(&mut peer, "pop_won");
        // It waits on an empty ring, adopts the dead winner's cell at a tick, and dies.
        let adopter = [("GPURING_FAULT", format!("{point}:1"))];
        let mut peer = Peer::spawn_with(test, "receiver", &name, &adopter);
        killed_at_point(&mut peer, point);
        let rx = ch.receiver().unwrap();
        let first = rx.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|e| {
            panic!("{point}: the message the dead adopter took never came: {e}")
        });
        assert_eq!(first[..8], 7u64.to_le_bytes(), "{point}");
        assert!(!first.redelivered(), "{point}: no receiver returned it before");
        drop(first);
        for seq in 100..100 + 3 * 4u64 {
            send(&tx, seq);
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap()[..8], seq.to_le_bytes());
        }
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "{point}: nothing twice");
    }
}

/// An MPMC receiver killed right after winning a descriptor cell of the channel's ring,
/// before reading it (`pop_won`), at several counts: the message it won arrives
/// at the next receiver, once, and the ring keeps working for more than a lap (the cell is
/// freed). Before, the message was lost and the cell stayed full for good.
#[test]
fn mpmc_receiver_killed_after_winning_its_ring_cell() {
    if role().as_deref() == Some("receiver") {
        announcing_receiver();
    }
    for count in [1u64, 2, 5] {
        let name = unique_name("fault-pop-won");
        let ch = Channel::builder(&name).capacity(4).slots(SLOTS, 64).mpmc().create().unwrap();
        let tx = ch.sender().unwrap();
        let fault = [("GPURING_FAULT", format!("pop_won:{count}"))];
        let mut peer = Peer::spawn_with(
            "mpmc_receiver_killed_after_winning_its_ring_cell",
            "receiver",
            &name,
            &fault,
        );
        for seq in 0..count {
            send(&tx, seq);
        }
        let got: Vec<u64> = (0..count - 1).map(|_| peer.expect("got").parse().unwrap()).collect();
        killed_at_point(&mut peer, "pop_won");
        assert_eq!(got, (0..count - 1).collect::<Vec<_>>(), "count {count}");
        let rx = ch.receiver().unwrap();
        let first = rx.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|e| {
            panic!("count {count}: the message the dead receiver won never came: {e}")
        });
        assert_eq!(first[..8], (count - 1).to_le_bytes(), "count {count}");
        drop(first);
        for seq in 100..100 + 3 * 4u64 {
            send(&tx, seq);
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap()[..8], seq.to_le_bytes());
        }
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "nothing twice");
    }
}
