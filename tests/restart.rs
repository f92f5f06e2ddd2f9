//! Restarts: a process killed and started again gets its channel back with `open_or_create`,
//! and what waited in it; of several processes calling it at once, one creates.
#![cfg(not(loom))]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::time::Duration;

use common::{die, now_ns, ring_name, role, spawn, unique_name, wait_all};
use gpuring::{Channel, DType, Message, RecvTimeoutError, TensorMeta, TryRecvError};

const WATCHDOG: Duration = Duration::from_secs(60);

/// The channel every process of these tests makes or finds: MPMC when `mpmc`.
fn channel(name: &str, mpmc: bool) -> Channel {
    let b = Channel::builder(name).slots(8, 4096).open_timeout(Duration::from_secs(10));
    let b = if mpmc { b.mpmc() } else { b };
    b.open_or_create().expect("open_or_create")
}

/// Sends `values` as one-element u64 tensors.
fn send_values(ch: &Channel, values: impl IntoIterator<Item = u64>) {
    let tx = ch.sender().unwrap();
    let meta = TensorMeta::contiguous(DType::U64, &[1]).unwrap();
    for v in values {
        let mut lease = tx.acquire_timeout(Duration::from_secs(10)).unwrap();
        lease[..8].copy_from_slice(&v.to_le_bytes());
        tx.send(lease, meta).unwrap();
    }
}

fn value(msg: &Message) -> u64 {
    u64::from_le_bytes(msg[..8].try_into().unwrap())
}

/// Waits for `child` and checks that SIGKILL ended it.
fn killed(mut child: Child) {
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "the peer must die by SIGKILL: {status}");
}

#[test]
fn a_producer_killed_then_restarted_gets_its_channel_and_queued_messages_back() {
    match role().as_deref() {
        Some("first-producer") => {
            let ch = channel(&ring_name(), false);
            send_values(&ch, 0..3);
            die(); // before any consumer came: no destructor runs
        }
        Some("restarted-producer") => {
            // `create` would fail here (AlreadyExists): the dead producer's channel is there.
            let ch = channel(&ring_name(), false);
            send_values(&ch, 3..5);
            return;
        }
        _ => {}
    }
    let name = unique_name("restart-producer");
    let test = "a_producer_killed_then_restarted_gets_its_channel_and_queued_messages_back";
    killed(spawn(test, "first-producer", &name, &[]));
    let again = Channel::builder(&name).create();
    assert!(again.is_err(), "the dead producer's channel is still there, with its messages");
    wait_all(&mut [spawn(test, "restarted-producer", &name, &[])], WATCHDOG);
    let ch = Channel::builder(&name).open().unwrap();
    let rx = ch.receiver().unwrap();
    let mut got = Vec::new();
    let end = loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(msg) => got.push(value(&msg)),
            Err(e) => break e,
        }
    };
    got.sort_unstable(); // two senders: each in order, interleaved as they came
    assert_eq!(got, [0, 1, 2, 3, 4], "every message of both producers, once");
    // One sender died: its side says so once everything was received.
    assert!(matches!(end, RecvTimeoutError::PeerDead | RecvTimeoutError::Disconnected), "{end:?}");
}

#[test]
fn a_consumer_restarted_after_a_crash_drains_what_waited() {
    match role().as_deref() {
        Some("crashing-consumer") => {
            let ch = channel(&ring_name(), false);
            let rx = ch.receiver().unwrap();
            let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(value(&first), 0);
            die(); // holding the first message's slot
        }
        Some("restarted-consumer") => {
            let ch = channel(&ring_name(), false);
            let rx = ch.receiver().unwrap(); // the dead consumer's role is taken over
            let got: Vec<(u64, bool)> =
                rx.iter().map(|m| m.unwrap()).map(|m| (value(&m), m.redelivered())).collect();
            // The message the dead consumer held comes again, marked; then what waited.
            assert_eq!(got, [(0, true), (1, false), (2, false), (3, false)], "in order");
            return;
        }
        _ => {}
    }
    let name = unique_name("restart-consumer");
    let test = "a_consumer_restarted_after_a_crash_drains_what_waited";
    let ch = channel(&name, false);
    send_values(&ch, 0..4); // the sender leaves cleanly: `iter` ends after the last
    killed(spawn(test, "crashing-consumer", &name, &[]));
    wait_all(&mut [spawn(test, "restarted-consumer", &name, &[])], WATCHDOG);
}

#[test]
fn open_or_create_from_four_processes_at_once_makes_one_channel() {
    if role().as_deref() == Some("racer") {
        // Start together: every racer waits for the same instant.
        let start: u64 = std::env::var("GPURING_TEST_START").unwrap().parse().unwrap();
        while now_ns() < start {
            std::hint::spin_loop();
        }
        let i: u64 = std::env::var("GPURING_TEST_INDEX").unwrap().parse().unwrap();
        let ch = channel(&ring_name(), true);
        send_values(&ch, [i]);
        return;
    }
    for round in 0..5 {
        let name = unique_name(&format!("restart-race-{round}"));
        let start = now_ns() + 300_000_000; // 0.3 s: time for all four to start
        let mut racers: Vec<Child> = (0..4)
            .map(|i| {
                let env = [
                    ("GPURING_TEST_START", start.to_string()),
                    ("GPURING_TEST_INDEX", i.to_string()),
                ];
                let test = "open_or_create_from_four_processes_at_once_makes_one_channel";
                spawn(test, "racer", &name, &env)
            })
            .collect();
        // The racers create or open it, send and leave: their messages keep it for us.
        wait_all(&mut racers, WATCHDOG);
        let ch = Channel::builder(&name).open().unwrap();
        let rx = ch.receiver().unwrap();
        let mut got = Vec::new();
        loop {
            match rx.try_recv() {
                Ok(msg) => got.push(value(&msg)),
                Err(TryRecvError::Disconnected | TryRecvError::Empty) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3], "round {round}: every racer's message, in one channel");
    }
}

#[test]
fn clean_removes_what_its_dry_run_said_it_would() {
    // A channel nobody has open, with a message waiting and the pool it names.
    let name = unique_name("restart-clean");
    {
        let ch = channel(&name, false);
        send_values(&ch, [7]);
    }
    // A sibling test's child, spawned while this channel was open, holds a copy of its
    // descriptors (and so their presence locks) until it execs: for that moment the
    // segments are in use, and a dry run rightly leaves them out. Asked again until both
    // show (CI once caught the pool so).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let said = loop {
        let dry = gpuring::inspect::clean(true, true, &name).unwrap();
        let mut said: Vec<String> = dry.iter().map(|c| c.name.clone()).collect();
        said.sort();
        if said.len() == 2 || std::time::Instant::now() > deadline {
            break said;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(said.len(), 2, "the channel and its pool: {said:?}");
    let done = gpuring::inspect::clean(false, true, &name).unwrap();
    let mut removed: Vec<String> = done.iter().map(|c| c.name.clone()).collect();
    removed.sort();
    assert_eq!(removed, said, "clean removed what its dry run listed");
    assert!(Channel::builder(&name).open_timeout(Duration::ZERO).open().is_err());
}
