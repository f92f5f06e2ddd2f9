//! Broadcast channels (`ChannelBuilder::broadcast`) across processes: every receiver gets
//! every message sent while it is attached, once and in order, reading the sender's slot in
//! place; a slot goes back once every receiver it went to has dropped it; receivers join
//! and leave mid-stream; a killed receiver stops holding the sender back within a liveness
//! tick and its slots come back; a killed sender ends the receivers' iteration with
//! `PeerDead` once they have what it sent.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use common::{Peer, announce, assert_noticed, die, now_ns, ring_name, role, unique_name};
use gpuring::{Channel, Flavor, RecvError, TensorMeta};

const SLOT: usize = 4096;

/// Sends message `v`: `v` at both ends of a 4 KB payload.
fn send(tx: &gpuring::Sender, v: u64) {
    let mut lease = tx.acquire_timeout(Duration::from_secs(10)).expect("a slot within 10 s");
    lease[..8].copy_from_slice(&v.to_le_bytes());
    lease[SLOT - 8..SLOT].copy_from_slice(&v.to_le_bytes());
    tx.send_timeout(lease, TensorMeta::bytes(SLOT as u64), Duration::from_secs(10))
        .expect("room within 10 s");
}

/// The value a message carries, checked at both ends of its payload.
fn value(msg: &gpuring::Message) -> u64 {
    let v = u64::from_le_bytes(msg[..8].try_into().unwrap());
    assert_eq!(u64::from_le_bytes(msg[SLOT - 8..SLOT].try_into().unwrap()), v, "torn payload");
    v
}

fn messages() -> u64 {
    std::env::var("GPURING_TEST_BROADCAST_N").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000)
}

/// A receiver child: announces `ready` once attached, then receives `n` messages (each the
/// next of `0..n`, its sequence number the same), holding up to `keep` at once, and
/// announces `read <n>`; with `die_after`, SIGKILLed after that many, holding what it kept.
fn receiver(n: u64, keep: usize, die_after: Option<u64>) {
    let ch = Channel::builder(ring_name()).open().unwrap();
    assert_eq!(ch.flavor(), Flavor::Broadcast);
    let rx = ch.receiver().unwrap();
    announce("ready");
    let mut kept = std::collections::VecDeque::new();
    for expected in 0..n {
        if die_after == Some(expected) {
            die();
        }
        let msg = rx.recv().unwrap();
        assert_eq!((value(&msg), msg.seq()), (expected, expected), "every message once, in order");
        kept.push_back(msg);
        if kept.len() > keep {
            kept.pop_front();
        }
    }
    announce(&format!("read {n}"));
}

#[test]
fn eight_receivers_each_get_every_message_once_in_order() {
    const TEST: &str = "eight_receivers_each_get_every_message_once_in_order";
    let n = messages();
    if role().as_deref() == Some("receiver") {
        return receiver(n, 2, None);
    }
    let name = unique_name("bcast-8");
    let ch = Channel::builder(&name).broadcast().capacity(16).slots(8, SLOT as u64);
    let ch = ch.create().unwrap();
    let tx = ch.sender().unwrap();
    let mut receivers: Vec<Peer> = (0..8).map(|_| Peer::spawn(TEST, "receiver", &name)).collect();
    for r in &mut receivers {
        r.expect("ready");
    }
    for v in 0..n {
        send(&tx, v);
    }
    for r in &mut receivers {
        assert_eq!(r.expect("read"), n.to_string());
        assert!(r.child.wait().unwrap().success());
    }
    // Every slot back: the last holder of each gave it back as it dropped it.
    assert_eq!(tx.free_slots(), 8, "every slot back");
    assert!(matches!(tx.try_acquire(), Err(gpuring::TryAcquireError::Disconnected)));
    drop((tx, ch));
    assert_eq!(common::leftovers_of(&name), Vec::<String>::new());
}

#[test]
fn receivers_join_and_leave_mid_stream() {
    let name = unique_name("bcast-join");
    let ch = Channel::builder(&name).broadcast().capacity(4).slots(4, SLOT as u64).create();
    let ch = ch.unwrap();
    let tx = ch.sender().unwrap();
    let all = ch.receiver().unwrap();
    for v in 0..10 {
        send(&tx, v);
        assert_eq!(value(&all.recv().unwrap()), v);
    }
    // A receiver attached now starts with the next message.
    let late = ch.receiver().unwrap();
    let mut held = Vec::new();
    for v in 10..20 {
        send(&tx, v);
        assert_eq!(value(&all.recv().unwrap()), v);
        let msg = late.recv().unwrap();
        assert_eq!(value(&msg), v);
        if v == 19 {
            held.push(msg); // kept past the receiver's departure
        }
    }
    // It leaves holding one message and with two it never read: the sender goes on (the
    // unread ones come back as it leaves; the held one when it is dropped).
    send(&tx, 20);
    send(&tx, 21);
    drop(late);
    assert_eq!(value(&held[0]), 19, "a message outlives its receiver");
    for v in 20..40 {
        if v >= 22 {
            send(&tx, v);
        }
        assert_eq!(value(&all.recv().unwrap()), v);
    }
    assert_eq!(tx.free_slots(), 3, "all but the held slot back");
    drop(held);
    assert_eq!(tx.free_slots(), 4, "the held slot back once dropped");
    // A receiver that joins now gets what comes next, in the same slots.
    let again = ch.receiver().unwrap();
    send(&tx, 40);
    assert_eq!((value(&all.recv().unwrap()), value(&again.recv().unwrap())), (40, 40));
}

#[test]
fn a_killed_receiver_stops_holding_the_sender_back_within_a_tick() {
    const TEST: &str = "a_killed_receiver_stops_holding_the_sender_back_within_a_tick";
    const N: u64 = 2000;
    match role().as_deref() {
        Some("receiver") => return receiver(N, 1, None),
        Some("victim") => return receiver(N, 2, Some(10)),
        _ => {}
    }
    let name = unique_name("bcast-kill");
    let ch = Channel::builder(&name).broadcast().capacity(8).slots(4, SLOT as u64).create();
    let ch = ch.unwrap();
    let tx = ch.sender().unwrap();
    let mut live = Peer::spawn(TEST, "receiver", &name);
    let mut victim = Peer::spawn(TEST, "victim", &name);
    live.expect("ready");
    victim.expect("ready");
    // The victim takes 10 and dies holding 2 of them (slots 2 of 4): the sender waits for
    // a slot, or for room in the ring behind the victim's cursor, until a tick finds it
    // dead; then its holds are cleared and every slot comes back.
    let mut resumed = 0;
    for v in 0..N {
        send(&tx, v);
        if v == 14 {
            resumed = now_ns();
        }
    }
    let died = victim.died();
    assert!(resumed > died, "message 14 went only after the victim died");
    assert_noticed("sender", died, resumed);
    assert_eq!(live.expect("read"), N.to_string(), "the live receiver got everything");
    assert!(live.child.wait().unwrap().success());
    assert_eq!(tx.free_slots(), 4, "every slot back, the victim's two included");
}

/// A lagging channel's slow receiver: receives until the sender has left, sleeping
/// `GPURING_TEST_NAP_US` after each message and holding it meanwhile; every message it gets
/// must come after the last (checked at both ends of its payload); it announces
/// `got <received> <missed> <last>`. With `die_after`, SIGKILLed holding that many's last.
fn lagging_receiver(die_after: Option<u64>) {
    let ch = Channel::builder(ring_name()).open().unwrap();
    assert!(ch.is_lagging());
    let rx = ch.receiver().unwrap();
    let nap = std::env::var("GPURING_TEST_NAP_US").map_or(0, |s| s.parse().unwrap());
    announce("ready");
    let (mut received, mut missed, mut last) = (0u64, 0u64, None::<u64>);
    loop {
        match rx.recv() {
            Ok(msg) => {
                let v = value(&msg);
                assert!(last.is_none_or(|l| v > l), "in order: {v} after {last:?}");
                assert_eq!(msg.seq(), v);
                (received, last) = (received + 1, Some(v));
                if die_after == Some(received) {
                    die(); // holding `msg`
                }
                std::thread::sleep(Duration::from_micros(nap));
            }
            Err(RecvError::Lagged(n)) => {
                assert!(n > 0);
                missed += n;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("{e}"),
        }
    }
    announce(&format!("got {received} {missed} {}", last.unwrap()));
}

#[test]
fn a_lagging_sender_never_waits_and_a_slow_receiver_is_told_what_it_missed() {
    const TEST: &str = "a_lagging_sender_never_waits_and_a_slow_receiver_is_told_what_it_missed";
    const N: u64 = 3000;
    match role().as_deref() {
        Some("slow") => return lagging_receiver(None),
        Some("victim") => return lagging_receiver(Some(1)),
        _ => {}
    }
    let name = unique_name("bcast-lag");
    let ch = Channel::builder(&name).broadcast().lagging(true).capacity(16).slots(4, SLOT as u64);
    let ch = ch.create().unwrap();
    assert!(ch.is_lagging());
    let tx = ch.sender().unwrap();
    let nap = [("GPURING_TEST_NAP_US", "300".to_owned())];
    let mut slow = Peer::spawn_with(TEST, "slow", &name, &nap);
    let mut victim = Peer::spawn_with(TEST, "victim", &name, &nap);
    slow.expect("ready");
    victim.expect("ready");
    // Never a wait: every acquire finds a slot at once, before the victim's death and after
    // it (it dies holding the first message it gets: that hold stays until a wait's tick,
    // and three slots of four are enough), whatever the slow receiver has not read. The
    // victim gets a message by the 100th at the latest: the last one sent is never
    // retired while nothing more is sent.
    for v in 0..N {
        if v == 100 {
            victim.died();
        }
        let mut lease = tx.try_acquire().unwrap_or_else(|e| panic!("message {v}: {e}"));
        lease[..8].copy_from_slice(&v.to_le_bytes());
        lease[SLOT - 8..SLOT].copy_from_slice(&v.to_le_bytes());
        tx.send(lease, TensorMeta::bytes(SLOT as u64)).unwrap();
        if v % 64 == 0 {
            std::thread::sleep(Duration::from_micros(200)); // the receiver gets some
        }
    }
    drop(tx);
    let got = slow.expect("got");
    let [received, missed, last]: [u64; 3] =
        got.split(' ').map(|x| x.parse().unwrap()).collect::<Vec<_>>().try_into().unwrap();
    eprintln!("slow receiver: received, missed, last = {got}");
    assert_eq!(received + missed, N, "each message received or counted missed: {got}");
    assert!(received > 0 && missed > 0, "a slow receiver gets some and misses some: {got}");
    assert_eq!(last, N - 1, "the last message sent is never retired: {got}");
    assert!(slow.child.wait().unwrap().success());
}

/// A lagging channel `name` of two slots, its sender and a receiver, and messages 0..5
/// sent past the receiver (every acquire a `try_acquire`: never a wait).
fn five_past_two_slots(name: &str) -> (Channel, gpuring::Sender, gpuring::Receiver) {
    let ch = Channel::builder(name).broadcast().lagging(true).slots(2, SLOT as u64).create();
    let ch = ch.unwrap();
    let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    for v in 0..5u64 {
        let mut lease = tx.try_acquire().expect("never a wait");
        lease[..8].copy_from_slice(&v.to_le_bytes());
        lease[SLOT - 8..SLOT].copy_from_slice(&v.to_le_bytes());
        tx.send(lease, TensorMeta::bytes(SLOT as u64)).unwrap();
    }
    (ch, tx, rx)
}

#[test]
fn a_lagging_receiver_dropped_after_a_lag_leaves_nothing_behind() {
    let name = unique_name("bcast-lag-drop");
    let (ch, tx, rx) = five_past_two_slots(&name);
    assert!(matches!(rx.recv(), Err(RecvError::Lagged(3))));
    // The receiver keeps message 3 for its next receive; dropped with it as the channel's
    // last user, it leaves nothing behind.
    drop((tx, ch));
    drop(rx);
    assert_eq!(common::leftovers_of(&name), Vec::<String>::new());
}

#[test]
fn a_lagging_receivers_iteration_yields_the_lag_and_goes_on() {
    let name = unique_name("bcast-lag-iter");
    let (_ch, tx, rx) = five_past_two_slots(&name);
    drop(tx);
    let got: Vec<Result<u64, String>> =
        rx.iter().map(|m| m.map(|m| value(&m)).map_err(|e| e.to_string())).collect();
    let lag = "this receiver fell behind a lagging broadcast channel and missed 3 messages";
    assert_eq!(got, vec![Err(lag.to_owned()), Ok(3), Ok(4)], "then the sender's departure ends it");
}

/// CPU time this process has used, in nanoseconds.
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Eight receivers asleep in `recv`: for a second, for three, then for one again. A receiver
/// that has waited a liveness tick sleeps on its message word and on the channel segment's
/// close events (`futex_waitv`; a peer's death is a close), ticking only every `IDLE_TICK`;
/// its first long wait also starts the process's watcher thread (inotify). Every wait
/// spins as little as the long sleep before it earned (the first message's wait is one);
/// the first, with no probe of its peers on record, probes them a `LIVENESS_TICK` in. The
/// first and third bound a regression to spinning or to ticks that grow with the receivers; the second (CPU a second of waiting: the wait's start and the receipt,
/// spread over three seconds), a regression to ticking every `LIVENESS_TICK` (about 1 ms
/// a second each in release on the 2-core VM, 3.5 ms in debug: 8 to 28 ms together).
#[test]
fn eight_idle_receivers_sleep_and_use_little_cpu() {
    const TEST: &str = "eight_idle_receivers_sleep_and_use_little_cpu";
    const IDLE: [(u64, u64); 3] = [(7, 1), (8, 3), (9, 1)]; // (message, seconds idle before it)
    if role().as_deref() == Some("idle") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap(); // the default wait policy
        announce("attached");
        // The first message maps the sender's pool: not idle work.
        assert_eq!(value(&rx.recv().unwrap()), 6);
        for (v, _) in IDLE {
            announce("ready");
            let before = cpu_ns();
            let msg = rx.recv().unwrap();
            let used = cpu_ns() - before;
            assert_eq!(value(&msg), v);
            announce(&format!("cpu {used}"));
        }
        return;
    }
    let name = unique_name("bcast-idle");
    let ch = Channel::builder(&name).broadcast().capacity(4).slots(2, SLOT as u64).create();
    let ch = ch.unwrap();
    let tx = ch.sender().unwrap();
    let mut receivers: Vec<Peer> = (0..8).map(|_| Peer::spawn(TEST, "idle", &name)).collect();
    for r in &mut receivers {
        r.expect("attached");
    }
    send(&tx, 6);
    let mut per_second = vec![];
    for (wait, (v, secs)) in IDLE.into_iter().enumerate() {
        for r in &mut receivers {
            r.expect("ready");
        }
        std::thread::sleep(Duration::from_secs(secs));
        send(&tx, v); // one futex wake reaches every sleeper
        let used: Vec<u64> =
            receivers.iter_mut().map(|r| r.expect("cpu").parse::<u64>().unwrap() / secs).collect();
        let total: u64 = used.iter().sum();
        let what = format!("8 receivers idle {secs} s (wait {})", wait + 1);
        eprintln!("{what}: {total} ns of CPU a second together ({used:?} each)");
        per_second.push(total);
    }
    // Under 0.5 % of a core each, debug builds included.
    assert!(per_second[0] < 40_000_000, "idle receivers used {} ns/s: first wait", per_second[0]);
    // Steady: under 0.05 % of a core each (0.1–0.3 ms a second together in release here).
    assert!(per_second[1] < 4_000_000, "idle receivers used {} ns/s: second wait", per_second[1]);
    assert!(per_second[2] < 40_000_000, "idle receivers used {} ns/s: third wait", per_second[2]);
    for r in &mut receivers {
        assert!(r.child.wait().unwrap().success());
    }
}

#[test]
fn receivers_get_peer_dead_after_what_a_killed_sender_sent() {
    const TEST: &str = "receivers_get_peer_dead_after_what_a_killed_sender_sent";
    if role().as_deref() == Some("sender") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let tx = ch.sender().unwrap();
        for v in 0..3 {
            send(&tx, v);
        }
        die();
    }
    let name = unique_name("bcast-sender-killed");
    let ch = Channel::builder(&name).broadcast().capacity(8).slots(4, SLOT as u64).create();
    let ch = ch.unwrap();
    let receivers: Vec<_> = (0..3).map(|_| ch.receiver().unwrap()).collect();
    let mut sender = Peer::spawn(TEST, "sender", &name);
    sender.died();
    for rx in &receivers {
        let got: Vec<u64> = (0..3).map(|_| value(&rx.recv().unwrap())).collect();
        assert_eq!(got, [0, 1, 2], "what it sent, read in its slots after its death");
        assert!(matches!(rx.recv(), Err(RecvError::PeerDead)));
    }
    // A new sender takes the dead one's place.
    let tx = ch.sender().unwrap();
    send(&tx, 3);
    assert!(receivers.iter().all(|rx| value(&rx.recv().unwrap()) == 3));
}

#[test]
fn a_sender_with_no_receiver_sends_into_nothing_and_keeps_its_slots() {
    let name = unique_name("bcast-nobody");
    let ch = Channel::builder(&name).broadcast().capacity(2).slots(2, SLOT as u64).create();
    let ch = ch.unwrap();
    let tx = ch.sender().unwrap();
    for v in 0..10 {
        send(&tx, v); // nobody reads: each slot back at the next acquire
    }
    // A slot whose message nobody read is free again as soon as anyone asks.
    assert_eq!(tx.free_slots(), 2, "the last message's slot is counted free");
    let rx = ch.receiver().unwrap();
    assert!(matches!(rx.try_recv(), Err(gpuring::TryRecvError::Empty)), "nothing kept");
    send(&tx, 10);
    assert_eq!(value(&rx.recv().unwrap()), 10);
}

#[test]
fn inspect_shows_a_broadcast_channels_receivers_and_their_cursors() {
    let name = unique_name("bcast-inspect");
    let ch = Channel::builder(&name).broadcast().capacity(4).slots(4, SLOT as u64).create();
    let ch = ch.unwrap();
    let tx = ch.sender().unwrap();
    let (a, _b) = (ch.receiver().unwrap(), ch.receiver().unwrap());
    for v in 0..3 {
        send(&tx, v);
    }
    let _first = a.recv().unwrap();
    let report = gpuring::inspect::inspect(&name).unwrap();
    assert_eq!(report.kind, gpuring::internal::SegmentKind::BroadcastChannel);
    let r = report.ring.unwrap();
    assert_eq!(r.tail, 3);
    let mut cursors: Vec<_> = r.participants.iter().filter_map(|p| p.cursor).collect();
    cursors.sort();
    assert_eq!(cursors, [0, 1], "b has read nothing, a one");
    assert_eq!(report.delivery.map(|d| d.redeliver), Some(Some(false)), "no redelivery");
    let listed = gpuring::inspect::list().unwrap().into_iter().find(|i| i.name == name).unwrap();
    let mut behind = listed.readers.expect("a broadcast channel lists its readers");
    behind.sort();
    assert_eq!(behind, [2, 3], "a two behind, b three");
}

/// The async forms: two receivers parked in `recv_async` both wake for one send; a sender
/// whose slots are all held parks in `acquire_async` until the last holder drops one.
#[cfg(feature = "async")]
#[test]
fn async_receives_park_until_a_send_and_an_acquire_until_a_slot_comes_back() {
    use futures::executor::block_on;
    let name = unique_name("bcast-async");
    let ch = Channel::builder(&name).broadcast().capacity(4).slots(1, SLOT as u64).create();
    let ch = ch.unwrap();
    let mut tx = ch.sender().unwrap();
    let parked: Vec<_> = (0..2)
        .map(|_| {
            let mut rx = ch.receiver().unwrap();
            std::thread::spawn(move || {
                let msg = block_on(rx.recv_async()).unwrap();
                let v = value(&msg);
                (rx, msg, v)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    send(&tx, 7);
    let got: Vec<_> = parked.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(got.iter().all(|(_, _, v)| *v == 7), "both woke with the message");
    // The one slot is held by both messages: the acquire parks until both are dropped.
    let (sender, slot_back) = std::sync::mpsc::channel();
    let acquirer = std::thread::spawn(move || {
        let lease = block_on(tx.acquire_async()).unwrap();
        sender.send(()).unwrap();
        drop(lease);
        tx
    });
    let mut got = got.into_iter();
    let (_rx_a, msg_a, _) = got.next().unwrap();
    let (_rx_b, msg_b, _) = got.next().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(msg_a);
    assert!(slot_back.recv_timeout(Duration::from_millis(50)).is_err(), "one holder left");
    drop(msg_b);
    slot_back.recv_timeout(Duration::from_secs(5)).expect("the slot back once both dropped");
    acquirer.join().unwrap();
}
