//! Clean shutdown, across processes: when every endpoint of one side leaves cleanly, the
//! other side gets everything that was sent, then `Disconnected` (rings and channels, SPSC
//! and MPMC); `iter()` ends there; a sender whose receivers have left is told so.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use common::{ring_name, role, spawn, unique_name, wait_all, watchdog};
use gpuring::{
    AcquireError, Channel, MpmcRing, PopError, PopTimeoutError, PushError, RecvError, SendError,
    SpscRing, TensorMeta, TryAcquireError, TryPopError, TryPushError, TryRecvError,
};

const N: u64 = 2_000;
const WATCHDOG: Duration = Duration::from_secs(60);

/// Pushes `from..to` into `name` as a producer of an SPSC (`mpmc == false`) or MPMC ring,
/// then leaves (drops the producer) cleanly.
fn produce(name: &str, mpmc: bool, from: u64, to: u64) {
    if mpmc {
        let ring = MpmcRing::<u64>::builder(name).open().unwrap();
        let tx = ring.producer().unwrap();
        (from..to).for_each(|i| tx.push(i).unwrap());
    } else {
        let ring = SpscRing::<u64>::builder(name).open().unwrap();
        let mut tx = ring.producer().unwrap();
        (from..to).for_each(|i| tx.push(i).unwrap());
    }
}

#[test]
fn spsc_ring_consumer_gets_everything_then_disconnected() {
    if role().as_deref() == Some("producer") {
        return produce(&ring_name(), false, 0, N);
    }
    let test = "spsc_ring_consumer_gets_everything_then_disconnected";
    let name = unique_name("bye-spsc");
    let ring = SpscRing::<u64>::builder(&name).capacity(64).create().unwrap();
    let mut rx = ring.consumer().unwrap();
    // Before any producer came, an empty ring is only empty.
    assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
    let mut producer = [spawn(test, "producer", &name, &[])];
    let _dog = watchdog("iter()", WATCHDOG);
    let got: Vec<u64> = rx.iter().collect::<Result<_, _>>().unwrap();
    wait_all(&mut producer, WATCHDOG);
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "everything, in order, then the end");
    assert_eq!(rx.pop(), Err(PopError::Disconnected));
    assert_eq!(rx.pop_timeout(Duration::from_secs(5)), Err(PopTimeoutError::Disconnected));
    assert_eq!(rx.try_pop(), Err(TryPopError::Disconnected));
    assert!(rx.try_iter().next().is_none(), "try_iter ends quietly too");
}

#[test]
fn mpmc_ring_consumer_gets_everything_then_disconnected() {
    if let Some(r) = role() {
        let half: u64 = r["producer".len()..].parse().unwrap();
        return produce(&ring_name(), true, half * N / 2, (half + 1) * N / 2);
    }
    let test = "mpmc_ring_consumer_gets_everything_then_disconnected";
    let name = unique_name("bye-mpmc");
    let ring = MpmcRing::<u64>::builder(&name).capacity(64).create().unwrap();
    let rx = ring.consumer().unwrap();
    // A producer of ours keeps the ring connected while the two processes come and go
    // (one may leave before the other attaches); it leaves once both are done.
    let keep = ring.producer().unwrap();
    let mut producers: Vec<_> =
        (0..2).map(|h| spawn(test, &format!("producer{h}"), &name, &[])).collect();
    let waiter = std::thread::spawn(move || {
        wait_all(&mut producers, WATCHDOG);
        drop(keep);
    });
    let _dog = watchdog("iter()", WATCHDOG);
    let mut got: Vec<u64> = rx.iter().collect::<Result<_, _>>().unwrap();
    waiter.join().unwrap();
    got.sort_unstable();
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "everything once, then the end");
    assert_eq!(rx.pop(), Err(PopError::Disconnected));
    assert_eq!(rx.try_pop(), Err(TryPopError::Disconnected));
}

#[test]
fn ring_producer_is_told_when_its_consumer_has_left() {
    if role().as_deref() == Some("consumer") {
        let ring = SpscRing::<u64>::builder(ring_name()).open().unwrap();
        let mut rx = ring.consumer().unwrap();
        assert_eq!(rx.pop().unwrap(), 1);
        return; // leaves cleanly
    }
    let test = "ring_producer_is_told_when_its_consumer_has_left";
    let name = unique_name("bye-consumer");
    let ring = SpscRing::<u64>::builder(&name).capacity(4).create().unwrap();
    let mut tx = ring.producer().unwrap();
    tx.push(1).unwrap();
    let mut consumer = [spawn(test, "consumer", &name, &[])];
    wait_all(&mut consumer, WATCHDOG);
    let _dog = watchdog("push() after the consumer left", WATCHDOG);
    // Room left: pushes still land (a consumer that attaches later gets them).
    for v in 2..6 {
        tx.push(v).unwrap();
    }
    assert_eq!(tx.try_push(6), Err(TryPushError::Disconnected(6)), "full, nobody to read");
    assert_eq!(tx.push(7), Err(PushError::Disconnected(7)), "no wait for ever");
    // A consumer that comes later gets what was queued, and the producer can go on.
    let mut rx = ring.consumer().unwrap();
    assert_eq!(rx.try_iter().collect::<Result<Vec<_>, _>>().unwrap(), [2, 3, 4, 5]);
    tx.push(8).unwrap();
    assert_eq!(rx.pop(), Ok(8));
}

/// Sends `count` messages tagged `first..` through channel `name`, then leaves.
fn send(name: &str, first: u64, count: u64) {
    let ch = Channel::builder(name).open().unwrap();
    let tx = ch.sender().unwrap();
    for tag in first..first + count {
        let mut lease = tx.acquire().unwrap();
        lease[..8].copy_from_slice(&tag.to_le_bytes());
        lease.set_tag(tag);
        tx.send(lease, TensorMeta::bytes(8)).unwrap();
    }
}

#[test]
fn channel_receiver_gets_everything_then_disconnected() {
    if role().as_deref() == Some("sender") {
        return send(&ring_name(), 0, N);
    }
    let test = "channel_receiver_gets_everything_then_disconnected";
    for mpmc in [false, true] {
        let name = unique_name("bye-ch");
        let builder = Channel::builder(&name).capacity(16).slots(8, 64);
        let ch = if mpmc { builder.mpmc() } else { builder }.create().unwrap();
        let rx = ch.receiver().unwrap();
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "no sender yet: empty");
        let mut sender = [spawn(test, "sender", &name, &[])];
        let mut tags = Vec::new();
        let _dog = watchdog("iter()", WATCHDOG);
        for msg in rx.iter() {
            let msg = msg.unwrap();
            assert_eq!(msg[..8], msg.tag().to_le_bytes());
            tags.push(msg.tag());
        }
        wait_all(&mut sender, WATCHDOG);
        assert_eq!(tags, (0..N).collect::<Vec<_>>(), "mpmc {mpmc}: all, in order, then the end");
        assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Disconnected)));
        assert!(rx.try_iter().next().is_none());
    }
}

#[test]
fn channel_sender_is_told_when_every_receiver_has_left() {
    if role().as_deref() == Some("receiver") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        assert_eq!(rx.recv().unwrap().tag(), 1);
        return; // the message goes back, then the receiver leaves cleanly
    }
    let test = "channel_sender_is_told_when_every_receiver_has_left";
    let name = unique_name("bye-rx");
    let ch = Channel::builder(&name).capacity(16).slots(4, 64).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut lease = tx.acquire().unwrap();
    lease.set_tag(1);
    tx.send(lease, TensorMeta::bytes(0)).unwrap();
    let mut receiver = [spawn(test, "receiver", &name, &[])];
    wait_all(&mut receiver, WATCHDOG);
    let _dog = watchdog("acquire() and send() after the receiver left", WATCHDOG);
    assert!(matches!(tx.acquire(), Err(AcquireError::Disconnected)));
    assert!(matches!(tx.try_acquire(), Err(TryAcquireError::Disconnected)));
    // A lease taken before the receiver left comes back from the send, intact.
    let rx = ch.receiver().unwrap();
    let mut lease = tx.acquire().unwrap();
    lease[..4].copy_from_slice(b"kept");
    drop(rx);
    match tx.send(lease, TensorMeta::bytes(4)) {
        Err(SendError::Disconnected(back)) => assert_eq!(&back[..4], b"kept"),
        other => panic!("expected Disconnected with the lease back, got {other:?}"),
    }
    // A receiver that attaches again makes sending work again.
    let rx = ch.receiver().unwrap();
    let mut lease = tx.acquire().unwrap();
    lease.set_tag(2);
    tx.send(lease, TensorMeta::bytes(0)).unwrap();
    assert_eq!(rx.recv().unwrap().tag(), 2);
}

// ---------------------------------------------------------------------------------------
// Lifetimes: a channel and its pools live while anyone has them open or a message waits.

/// Whether /dev/shm holds `name`, or any pool of channel `name`.
fn leftovers(name: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f == name || f.starts_with(&format!("{name}.")))
        .collect()
}

#[test]
fn a_sender_may_send_and_exit_before_the_receiver_opens() {
    if role().as_deref() == Some("sender") {
        // Creates the channel, sends, and exits: its handles drop, messages wait.
        let _ch = Channel::builder(ring_name()).capacity(64).slots(16, 64).create().unwrap();
        return send(&ring_name(), 0, 16);
    }
    let name = unique_name("late-rx");
    let mut sender =
        [spawn("a_sender_may_send_and_exit_before_the_receiver_opens", "sender", &name, &[])];
    wait_all(&mut sender, WATCHDOG);
    assert_eq!(leftovers(&name).len(), 2, "the channel and the pool wait: {:?}", leftovers(&name));
    let ch = Channel::builder(&name).open().unwrap();
    let rx = ch.receiver().unwrap();
    let _dog = watchdog("iter()", WATCHDOG);
    let tags: Vec<u64> = rx.iter().map(|m| m.unwrap().tag()).collect();
    assert_eq!(tags, (0..16).collect::<Vec<_>>(), "every message, then Disconnected");
    drop((rx, ch));
    assert!(leftovers(&name).is_empty(), "the last one out removed all: {:?}", leftovers(&name));
}

#[test]
fn a_receiver_may_open_before_the_channel_exists() {
    if role().as_deref() == Some("late-creator") {
        std::thread::sleep(Duration::from_millis(300));
        let _ch = Channel::builder(ring_name()).capacity(16).slots(4, 64).create().unwrap();
        return send(&ring_name(), 7, 1);
    }
    let name = unique_name("early-rx");
    // With the default timeout (1 s), a name that never comes is NotFound.
    let t = std::time::Instant::now();
    assert!(matches!(
        Channel::builder(unique_name("never")).open(),
        Err(gpuring::ChannelError::Segment(gpuring::ShmError::NotFound { .. }))
    ));
    assert!(t.elapsed() >= gpuring::DEFAULT_OPEN_TIMEOUT, "it waited for the name");
    let mut creator =
        [spawn("a_receiver_may_open_before_the_channel_exists", "late-creator", &name, &[])];
    // `open_timeout`: the documented way for a consumer that may start first.
    let ch = Channel::builder(&name).open_timeout(WATCHDOG).open().unwrap();
    let rx = ch.receiver().unwrap();
    assert_eq!(rx.recv_timeout(WATCHDOG).unwrap().tag(), 7);
    wait_all(&mut creator, WATCHDOG);
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    drop((rx, ch));
    assert!(leftovers(&name).is_empty(), "{:?}", leftovers(&name));
}

#[test]
fn an_unreceived_message_keeps_its_channel_and_pool_until_a_receiver_takes_it() {
    let name = unique_name("unreceived");
    {
        let ch = Channel::builder(&name).mpmc().capacity(8).slots(4, 64).create().unwrap();
        let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
        // The sender works in a thread of its own, and is gone when it ends.
        std::thread::spawn(move || {
            for tag in 0..3 {
                let mut lease = tx.acquire().unwrap();
                lease.set_tag(tag);
                tx.send(lease, TensorMeta::bytes(0)).unwrap();
            }
        })
        .join()
        .unwrap();
        assert_eq!(rx.recv().unwrap().tag(), 0);
        assert_eq!(rx.recv().unwrap().tag(), 1);
        // Everyone leaves with message 2 unreceived.
    }
    assert_eq!(leftovers(&name).len(), 2, "channel and pool wait: {:?}", leftovers(&name));
    let info = gpuring::inspect::list().unwrap().into_iter().find(|i| i.name == name).unwrap();
    assert_eq!((info.in_use, info.queued), (Some(false), Some(1)), "{info:?}");
    // A receiver that comes later gets it; then the channel ends, and nothing is left.
    let ch = Channel::builder(&name).open().unwrap();
    let rx = ch.receiver().unwrap();
    assert_eq!(rx.recv().unwrap().tag(), 2);
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    drop((rx, ch));
    assert!(leftovers(&name).is_empty(), "{:?}", leftovers(&name));
}

#[test]
fn openers_and_the_last_one_out_race_without_losing_a_name_or_leaving_one() {
    use gpuring::{ChannelError, ShmError};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let name = unique_name("race");
    let done = AtomicBool::new(false);
    let (opened, created) = (AtomicU32::new(0), AtomicU32::new(0));
    let _dog = watchdog("the race", WATCHDOG);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..500 {
                match Channel::builder(&name).capacity(4).slots(1, 64).create() {
                    Ok(ch) => {
                        created.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_micros(50)); // let openers in
                        drop(ch); // the last one out, unless an opener is in
                    }
                    Err(ChannelError::Segment(ShmError::AlreadyExists { .. })) => {}
                    Err(e) => panic!("create: {e}"),
                }
            }
            done.store(true, Ordering::Relaxed);
        });
        for _ in 0..2 {
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    match Channel::builder(&name).open_timeout(Duration::ZERO).open() {
                        Ok(ch) => {
                            // Held open, it cannot be removed: its name is there.
                            assert!(!leftovers(&name).is_empty(), "an open channel lost its name");
                            opened.fetch_add(1, Ordering::Relaxed);
                            drop(ch);
                        }
                        Err(ChannelError::Segment(
                            ShmError::NotFound { .. } | ShmError::NotInitialized { .. },
                        )) => std::thread::yield_now(),
                        Err(e) => panic!("open: {e}"),
                    }
                }
            });
        }
    });
    println!("created {created:?}, opened {opened:?}");
    assert!(created.load(Ordering::Relaxed) > 0 && opened.load(Ordering::Relaxed) > 0);
    assert!(leftovers(&name).is_empty(), "the last one out left {:?}", leftovers(&name));
}

#[test]
fn a_pool_larger_than_dev_shm_can_hold_is_no_space_and_leaves_nothing() {
    use gpuring::{ChannelError, ShmError};
    let name = unique_name("nospace");
    // 768 GiB of slots: more than /dev/shm (and memory) holds on any machine this runs on.
    let ch = Channel::builder(&name).slots(3, 256 << 30).create().unwrap();
    match ch.sender() {
        Err(ChannelError::Segment(ShmError::NoSpace { needed, available })) => {
            assert!(needed >= 3 * (256 << 30) && available < needed, "{needed} {available}");
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert_eq!(leftovers(&name), std::slice::from_ref(&name), "no pool object was left");
    assert!(ch.pools().is_empty(), "the pool table entry is free again");
    drop(ch);
    assert!(leftovers(&name).is_empty());
}

#[test]
fn a_forked_child_keeps_no_segment_alive() {
    let name = unique_name("fork");
    let ch = Channel::builder(&name).capacity(16).slots(4, 64).create().unwrap();
    let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    let lease = tx.acquire().unwrap();
    tx.send(lease, TensorMeta::bytes(8)).unwrap();
    drop(rx.recv().unwrap());
    assert_eq!(leftovers(&name).len(), 2, "the channel and its pool: {:?}", leftovers(&name));
    // SAFETY: the child calls only async-signal-safe functions (sleep, _exit) and keeps
    // every descriptor and mapping it inherited until it is killed.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        // SAFETY: async-signal-safe calls in a forked child.
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    drop((tx, rx, ch));
    let left = leftovers(&name);
    // SAFETY: our child, killed and reaped.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    assert!(left.is_empty(), "a forked child kept {left:?} alive");
}

#[test]
fn a_forked_child_that_drops_what_it_inherited_leaves_the_parents_channel_alone() {
    let name = unique_name("fork-drop");
    let ch = Channel::builder(&name).capacity(16).slots(4, 64).create().unwrap();
    let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    // SAFETY: the child drops the handles it inherited and exits without returning to the
    // test harness (it allocates no more than the drops do, in a copy of this process).
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        drop((tx, rx, ch));
        // SAFETY: ends the forked child at once.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: our child, reaped.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert_eq!(status, 0, "the child failed");
    assert_eq!(leftovers(&name).len(), 2, "the child's drops removed {:?}", leftovers(&name));
    // The parent's endpoints still work, and another process can still open the channel.
    let lease = tx.acquire_timeout(Duration::from_secs(1)).unwrap();
    tx.send(lease, TensorMeta::bytes(8)).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(1)).unwrap().meta().nbytes(), 8);
    assert!(Channel::builder(&name).open().is_ok(), "the name is gone");
    drop((tx, rx, ch));
    assert!(leftovers(&name).is_empty(), "{:?}", leftovers(&name));

    // A ring's endpoints too: the child's drops neither free the roles nor end the stream.
    let name = unique_name("fork-ring");
    let ring = SpscRing::<u64>::builder(&name).capacity(8).create().unwrap();
    let (mut p, mut c) = (ring.producer().unwrap(), ring.consumer().unwrap());
    // SAFETY: as above.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        drop((p, c, ring));
        // SAFETY: ends the forked child at once.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: our child, reaped.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert_eq!(status, 0, "the child failed");
    p.push(7).unwrap();
    assert_eq!(c.pop_timeout(Duration::from_secs(1)).unwrap(), 7);
    assert!(ring.producer().is_err(), "the child's drop freed the producer role");
    drop((p, c, ring));
    assert!(leftovers(&name).is_empty(), "{:?}", leftovers(&name));
}
