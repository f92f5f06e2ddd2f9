//! Broadcast rings across processes: every reader gets every element exactly once, in
//! order; a reader that joins later starts with what comes next; a killed reader stops
//! holding the producer back within a liveness tick; a killed producer ends the readers'
//! reads with `PeerDead` once they have read what it published.
#![cfg(not(loom))]

mod common;

use common::{Peer, announce, assert_noticed, die, now_ns, ring_name, role, unique_name};
use gpuring::{BroadcastRing, ReadError};

/// A reader child: announces `ready` once attached, then reads `n` elements (each must be
/// the next of `0..n`) and announces `read <n>`; a `limit` of reads short of `n` ends it
/// by SIGKILL instead, after announcing how many it read.
fn reader(n: u64, die_after: Option<u64>) {
    let ring = BroadcastRing::<u64>::builder(ring_name()).open().unwrap();
    let mut rx = ring.reader().unwrap();
    announce("ready");
    for expected in 0..n {
        if die_after == Some(expected) {
            die();
        }
        assert_eq!(rx.read().unwrap(), expected, "every element once, in order");
    }
    announce(&format!("read {n}"));
}

#[test]
fn eight_readers_each_read_every_element_once_in_order() {
    const N: u64 = 100_000;
    const TEST: &str = "eight_readers_each_read_every_element_once_in_order";
    if role().as_deref() == Some("reader") {
        return reader(N, None);
    }
    let name = unique_name("broadcast-8");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(64).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut readers: Vec<Peer> = (0..8).map(|_| Peer::spawn(TEST, "reader", &name)).collect();
    for r in &mut readers {
        r.expect("ready");
    }
    assert_eq!(tx.readers(), 8);
    for v in 0..N {
        tx.push(v).unwrap();
    }
    for r in &mut readers {
        assert_eq!(r.expect("read"), N.to_string());
        assert!(r.child.wait().unwrap().success());
    }
    assert_eq!(tx.readers(), 0, "each reader left");
    drop((tx, ring));
    assert_eq!(common::leftovers_of(&name), Vec::<String>::new());
}

#[test]
fn a_reader_that_joins_later_reads_what_comes_after() {
    const TEST: &str = "a_reader_that_joins_later_reads_what_comes_after";
    if role().as_deref() == Some("reader") {
        let ring = BroadcastRing::<u64>::builder(ring_name()).open().unwrap();
        let mut rx = ring.reader().unwrap();
        announce("ready");
        let got: Vec<u64> = (0..3).map(|_| rx.read().unwrap()).collect();
        assert_eq!(got, [10, 11, 12], "what was published before it joined is not its");
        announce("done");
        return;
    }
    let name = unique_name("broadcast-late");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(4).create().unwrap();
    let mut tx = ring.producer().unwrap();
    for v in 0..10 {
        tx.try_push(v).unwrap(); // nobody reads: nothing holds the producer back
    }
    let mut late = Peer::spawn(TEST, "reader", &name);
    late.expect("ready");
    for v in 10..13 {
        tx.push(v).unwrap();
    }
    late.expect("done");
    assert!(late.child.wait().unwrap().success());
}

#[test]
fn a_killed_reader_stops_holding_the_producer_back_within_a_tick() {
    const TEST: &str = "a_killed_reader_stops_holding_the_producer_back_within_a_tick";
    const N: u64 = 1000;
    match role().as_deref() {
        Some("reader") => return reader(N, None),
        Some("victim") => return reader(N, Some(10)),
        _ => {}
    }
    let name = unique_name("broadcast-kill");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(8).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut live = Peer::spawn(TEST, "reader", &name);
    let mut victim = Peer::spawn(TEST, "victim", &name);
    live.expect("ready");
    victim.expect("ready");
    // The victim reads 10 and dies: with its cursor at 10, the push of 18 waits for it
    // until a liveness tick of that wait finds it dead.
    let mut resumed = 0;
    for v in 0..N {
        tx.push(v).unwrap();
        if v == 18 {
            resumed = now_ns();
        }
    }
    let died = victim.died();
    assert!(resumed > died, "the push of 18 returned only after the victim died");
    assert_noticed("producer", died, resumed);
    assert_eq!(live.expect("read"), N.to_string(), "the live reader read everything");
    assert!(live.child.wait().unwrap().success());
    assert_eq!(tx.readers(), 0, "the dead reader no longer counts");
}

#[test]
fn readers_get_peer_dead_after_what_a_killed_producer_published() {
    const TEST: &str = "readers_get_peer_dead_after_what_a_killed_producer_published";
    if role().as_deref() == Some("producer") {
        let ring = BroadcastRing::<u64>::builder(ring_name()).open().unwrap();
        let mut tx = ring.producer().unwrap();
        for v in 0..5 {
            tx.push(v).unwrap();
        }
        die();
    }
    let name = unique_name("broadcast-producer-killed");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(8).create().unwrap();
    let mut readers: Vec<_> = (0..2).map(|_| ring.reader().unwrap()).collect();
    let mut producer = Peer::spawn(TEST, "producer", &name);
    producer.died();
    for rx in &mut readers {
        let got: Vec<u64> = (0..5).map(|_| rx.read().unwrap()).collect();
        assert_eq!(got, [0, 1, 2, 3, 4]);
        assert!(matches!(rx.read(), Err(ReadError::PeerDead)));
    }
    // A new producer takes the dead one's role.
    let mut tx = ring.producer().unwrap();
    tx.push(5).unwrap();
    assert!(readers.iter_mut().all(|rx| rx.read().unwrap() == 5));
}

#[test]
fn inspect_shows_each_readers_cursor() {
    let name = unique_name("broadcast-inspect");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(4).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let (mut a, b) = (ring.reader().unwrap(), ring.reader().unwrap());
    for v in 0..3 {
        tx.push(v).unwrap();
    }
    assert_eq!(a.read().unwrap(), 0);
    let report = gpuring::inspect::inspect(&name).unwrap();
    assert_eq!(report.kind, gpuring::internal::SegmentKind::BroadcastRing);
    let r = report.ring.unwrap();
    assert_eq!(r.tail, 3);
    assert_eq!(r.lagging, Some(false), "the default policy");
    let mut cursors: Vec<_> = r.participants.iter().filter_map(|p| p.cursor).collect();
    cursors.sort();
    assert_eq!(cursors, [0, 1], "b has read nothing, a one");
    assert_eq!(r.participants.len(), 3, "the producer and two readers");
    drop(b);
    let r = gpuring::inspect::inspect(&name).unwrap().ring.unwrap();
    assert_eq!(r.participants.iter().filter_map(|p| p.cursor).collect::<Vec<_>>(), [1]);
}

/// A forged readers mask (every bit set, the producer's own included) and a forged cursor
/// ahead of `tail`: the producer pushes on (the forged places nobody holds are cleared at
/// its first tick; its own never counts), and a reader still reads every element once.
#[test]
fn a_forged_readers_mask_holds_the_producer_back_a_tick_at_most() {
    use std::os::unix::fs::FileExt;
    let name = unique_name("broadcast-forged");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(4).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut rx = ring.reader().unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(format!("/dev/shm/{name}")).unwrap();
    let at = (size_of::<gpuring::internal::SegmentHeader>()
        + std::mem::offset_of!(gpuring::internal::RingHeader, readers)) as u64;
    file.write_all_at(&u64::MAX.to_le_bytes(), at).unwrap();
    for v in 0..20 {
        tx.push_timeout(v, std::time::Duration::from_secs(5)).unwrap();
        assert_eq!(rx.read().unwrap(), v);
    }
    assert_eq!(tx.readers(), 1, "the forged places went at a tick");
}

/// The async forms: a reader's `read_async` parks until the producer publishes, and a
/// producer's `push_async` parks on a full ring until the reader reads.
#[cfg(feature = "async")]
#[test]
fn async_reads_and_pushes_park_until_they_can_go() {
    use futures::executor::block_on;
    let name = unique_name("broadcast-async");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(2).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut rx = ring.reader().unwrap();
    let reader = std::thread::spawn(move || {
        let first = block_on(rx.read_async()).unwrap();
        (rx, first)
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    tx.push(7).unwrap();
    let (mut rx, first) = reader.join().unwrap();
    assert_eq!(first, 7);
    tx.push(8).unwrap();
    tx.push(9).unwrap();
    let producer = std::thread::spawn(move || {
        block_on(tx.push_async(10)).unwrap(); // the ring holds 8 and 9: waits for a read
        tx
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!producer.is_finished(), "a full ring holds the producer back");
    assert_eq!((0..3).map(|_| rx.read().unwrap()).collect::<Vec<_>>(), [8, 9, 10]);
    producer.join().unwrap();
}

/// A producer parked in `push_async` on a reader that is then SIGKILLed goes on: the dead
/// reader's closed segment wakes the waiter thread, whose look drops the dead reader.
#[cfg(feature = "async")]
#[test]
fn an_async_push_goes_on_when_the_reader_holding_it_back_is_killed() {
    const TEST: &str = "an_async_push_goes_on_when_the_reader_holding_it_back_is_killed";
    if role().as_deref() == Some("reader") {
        let ring = BroadcastRing::<u64>::builder(ring_name()).open().unwrap();
        let _rx = ring.reader().unwrap();
        announce("ready");
        std::thread::sleep(std::time::Duration::from_millis(200));
        die();
    }
    let name = unique_name("broadcast-async-kill");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(2).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut reader = Peer::spawn(TEST, "reader", &name);
    reader.expect("ready");
    tx.push(0).unwrap();
    tx.push(1).unwrap();
    futures::executor::block_on(tx.push_async(2)).unwrap(); // waits for the dead reader
    let resumed = now_ns();
    let died = reader.died();
    assert!(resumed > died, "the push went on only after the reader died");
    assert_noticed("async producer", died, resumed);
    assert_eq!(tx.readers(), 0);
}

/// A lagging ring: the producer never waits, neither for a reader that sleeps nor for one
/// that was killed; the sleeper is told how many it missed and reads on from the oldest
/// element still there, in order.
#[test]
fn a_lagging_ring_never_holds_the_producer_and_tells_a_slow_reader_what_it_missed() {
    const TEST: &str =
        "a_lagging_ring_never_holds_the_producer_and_tells_a_slow_reader_what_it_missed";
    if role().as_deref() == Some("victim") {
        let ring = BroadcastRing::<u64>::builder(ring_name()).open().unwrap();
        let _rx = ring.reader().unwrap();
        announce("ready");
        std::thread::sleep(std::time::Duration::from_millis(100));
        die();
    }
    let name = unique_name("broadcast-lagging");
    let ring = BroadcastRing::<u64>::builder(&name).capacity(8).lagging(true).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut slow = ring.reader().unwrap();
    let mut victim = Peer::spawn(TEST, "victim", &name);
    victim.expect("ready");
    for v in 0..1000 {
        // Never waits: a timeout of zero would do; a short one shows nothing waits.
        tx.push_timeout(v, std::time::Duration::from_millis(1)).unwrap();
    }
    assert!(matches!(slow.read(), Err(ReadError::Lagged(992))));
    assert_eq!(
        (0..8).map(|_| slow.read().unwrap()).collect::<Vec<_>>(),
        (992..1000).collect::<Vec<_>>()
    );
    victim.died();
    for v in 1000..1100 {
        tx.push_timeout(v, std::time::Duration::from_millis(1)).unwrap();
        assert_eq!(slow.read().unwrap(), v, "a reader that keeps up misses nothing");
    }
}
