//! Crash survival: processes killed with SIGKILL while attached to a ring or channel.
//!
//! Each test's peer process really dies by SIGKILL (the parent checks the exit signal), at
//! a point it announces on stdout just before, with the monotonic time, so the parent can
//! bound how long the survivors took to notice.
#![cfg(not(loom))] // loom builds have no shared-memory segments

mod common;

use std::time::{Duration, Instant};

use common::{Peer, announce, assert_noticed, die, now_ns, ring_name, role, unique_name};
use gpuring::{
    AttachError, Channel, ChannelError, Descriptor, PopError, RecvError, RecvTimeoutError,
    RingError, SendError, ShmError, SpscRing, TensorMeta, TryRecvError,
};

const SENT: u64 = 40;

#[test]
fn receiver_drains_a_killed_senders_messages_then_gets_peer_dead() {
    if role().as_deref() == Some("sender") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let tx = ch.sender().unwrap();
        for seq in 0..SENT {
            let mut lease = tx.acquire().unwrap();
            lease[..8].copy_from_slice(&seq.to_le_bytes());
            tx.send(lease, TensorMeta::bytes(8)).unwrap();
        }
        die();
    }
    let name = unique_name("killed-sender");
    let ch = Channel::builder(&name).capacity(64).slots(8, 64).create().unwrap();
    let rx = ch.receiver().unwrap();
    let mut peer = Peer::spawn(
        "receiver_drains_a_killed_senders_messages_then_gets_peer_dead",
        "sender",
        &name,
    );
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let noticed = loop {
        assert!(Instant::now() < deadline, "watchdog");
        match rx.recv() {
            Ok(m) => got.push(u64::from_le_bytes(m[..8].try_into().unwrap())),
            Err(RecvError::PeerDead) => break now_ns(),
            Err(e) => panic!("unexpected {e}"),
        }
    };
    let died = peer.died();
    assert_eq!(
        got,
        (0..SENT).collect::<Vec<_>>(),
        "every message sent before the kill, once, in order"
    );
    assert_noticed("receiver", died, noticed);
    // What `gpuring inspect` shows: the dead sender, by its lock, and this live receiver.
    let ring = gpuring::inspect::inspect(&name).unwrap().ring.unwrap();
    let pid = peer.child.id();
    assert!(
        ring.participants
            .iter()
            .any(|p| p.role == Some(gpuring::Role::Producer) && p.pid == pid && !p.alive),
        "{ring:?}"
    );
    assert!(
        ring.participants.iter().any(|p| p.role == Some(gpuring::Role::Consumer) && p.alive),
        "{ring:?}"
    );
    assert_eq!(ring.producer, Some((pid, Some(false))), "the role holder is known dead");
    // Nothing more arrives, and the error stays.
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    assert!(matches!(rx.recv_timeout(Duration::from_millis(200)), Err(RecvTimeoutError::PeerDead)));
}

/// A receiver that has waited past its first liveness tick sleeps on the channel segment's
/// close events and ticks only every `IDLE_TICK` (a second): a sender killed then is
/// noticed by the close of its descriptors, within the same bound as a tick's.
#[test]
fn idle_receiver_learns_of_a_killed_sender_from_its_close_not_its_idle_tick() {
    const TEST: &str = "idle_receiver_learns_of_a_killed_sender_from_its_close_not_its_idle_tick";
    if role().as_deref() == Some("sender") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let _tx = ch.sender().unwrap();
        announce("attached");
        // Long enough for the receiver to tick once and settle into its idle sleep.
        std::thread::sleep(Duration::from_millis(300));
        die();
    }
    assert!(gpuring::IDLE_TICK > Duration::from_millis(500), "the bound below tells them apart");
    let name = unique_name("idle-killed-sender");
    let ch = Channel::builder(&name).capacity(8).slots(2, 64).create().unwrap();
    let rx = ch.receiver().unwrap();
    let mut peer = Peer::spawn(TEST, "sender", &name);
    peer.expect("attached");
    let waited = rx.recv_timeout(Duration::from_secs(10));
    let noticed = now_ns();
    assert!(matches!(waited, Err(RecvTimeoutError::PeerDead)), "{waited:?}");
    let died = peer.died();
    assert_noticed("idle receiver", died, noticed);
}

#[test]
fn sender_blocked_on_a_full_ring_gets_peer_dead_when_the_receiver_is_killed() {
    if role().as_deref() == Some("receiver") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        announce("ready");
        let m = rx.recv().unwrap();
        assert_eq!(m[..8], 0u64.to_le_bytes());
        // Holding the message, so the parent fills the ring and blocks; then die.
        std::thread::sleep(Duration::from_millis(300));
        die();
    }
    let name = unique_name("killed-receiver");
    let ch = Channel::builder(&name).capacity(2).slots(16, 64).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peer = Peer::spawn(
        "sender_blocked_on_a_full_ring_gets_peer_dead_when_the_receiver_is_killed",
        "receiver",
        &name,
    );
    peer.expect("ready");
    let mut sent = 0u64;
    let noticed = loop {
        assert!(sent < 10, "the ring (capacity 2) should have filled");
        let mut lease = tx.acquire().unwrap();
        lease[..8].copy_from_slice(&sent.to_le_bytes());
        match tx.send(lease, TensorMeta::bytes(8)) {
            Ok(()) => sent += 1,
            Err(SendError::PeerDead(lease)) => {
                let t = now_ns();
                assert_eq!(lease.len(), 64, "the lease comes back");
                break t;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    };
    let died = peer.died();
    assert_eq!(sent, 3, "one received, then two filled the ring");
    assert_noticed("sender", died, noticed);
    // The two messages nobody will receive keep the channel after its last user: removed
    // by hand, with the sender's pool.
    drop((tx, ch));
    assert!(std::path::Path::new(&format!("/dev/shm/{name}")).exists(), "messages wait");
    assert!(gpuring::inspect::remove(&name).unwrap(), "nobody uses it: removed");
    assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    assert!(pools_of(&name).is_empty(), "the pool went with its channel: {:?}", pools_of(&name));
}

/// The pool segments of channel `name` left in /dev/shm.
fn pools_of(name: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.starts_with(&format!("{name}.")))
        .collect()
}

/// Without redelivery (`redeliver(false)`), the sender takes back the slots a killed
/// receiver held, at the ticks of its wait.
#[test]
fn slots_held_by_a_killed_receiver_go_back_to_the_pool() {
    if role().as_deref() == Some("holder") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        let held: Vec<_> = (0..2).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(held.len(), 2);
        announce("holding");
        std::thread::sleep(Duration::from_millis(200));
        die(); // with both messages (and their slots) held
    }
    let name = unique_name("reclaim");
    let ch = Channel::builder(&name).capacity(16).slots(4, 64).redeliver(false).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peer =
        Peer::spawn("slots_held_by_a_killed_receiver_go_back_to_the_pool", "holder", &name);
    for _ in 0..2 {
        tx.send(tx.acquire().unwrap(), TensorMeta::bytes(8)).unwrap();
    }
    peer.expect("holding");
    assert_eq!(tx.free_slots(), 2, "two slots held by the live receiver");
    // A live holder's slots are not taken: the pool stays short until the deadline.
    let short: Vec<_> = (0..2).map(|_| tx.acquire().unwrap()).collect();
    assert!(matches!(
        tx.acquire_timeout(Duration::from_millis(20)),
        Err(gpuring::AcquireTimeoutError::Timeout)
    ));
    let died = peer.died();
    // Blocking acquires wait in ticks and take back the dead receiver's slots.
    let back: Vec<_> =
        (0..2).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
    assert_noticed("reclaim", died, now_ns());
    drop((short, back));
    assert_eq!(tx.free_slots(), 4, "every slot is free again, none lost or doubled");
}

/// With redelivery (the default), the messages a killed receiver held go to the next
/// receiver, marked, before what is queued behind them; then their slots come back. Until a
/// receiver comes, a sender short of slots is told `PeerDead`, and the slots stay held.
#[test]
fn messages_held_by_a_killed_receiver_go_to_the_next_receiver() {
    const TEST: &str = "messages_held_by_a_killed_receiver_go_to_the_next_receiver";
    if role().as_deref() == Some("holder") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        let held: Vec<_> = (0..2).map(|_| rx.recv().unwrap()).collect();
        assert!(held.iter().all(|m| !m.redelivered()));
        announce("holding");
        die(); // with both messages held
    }
    let name = unique_name("redeliver");
    let ch = Channel::builder(&name).capacity(16).slots(4, 64).create().unwrap();
    assert!(ch.redelivers(), "the default");
    let tx = ch.sender().unwrap();
    let mut peer = Peer::spawn(TEST, "holder", &name);
    let send = |tag: u64| {
        let mut lease = tx.acquire().unwrap();
        lease.set_tag(tag);
        lease[..8].copy_from_slice(&(tag * 3).to_le_bytes());
        tx.send(lease, TensorMeta::bytes(8)).unwrap();
    };
    send(0);
    send(1);
    peer.expect("holding");
    peer.died();
    send(2);
    send(3);
    // Every slot is out: two held by the dead receiver, two queued; nobody to take them.
    match tx.acquire_timeout(Duration::from_secs(5)) {
        Err(gpuring::AcquireTimeoutError::PeerDead) => {}
        other => panic!("expected PeerDead, got {other:?}"),
    }
    let rx = ch.receiver().unwrap();
    let got: Vec<_> = (0..4)
        .map(|_| {
            let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            let value = u64::from_le_bytes(m[..8].try_into().unwrap());
            assert_eq!(value, m.tag() * 3, "the bytes the sender wrote");
            (m.tag(), m.redelivered())
        })
        .collect();
    assert_eq!(got, [(0, true), (1, true), (2, false), (3, false)]);
    let all: Vec<_> = (0..4).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
    assert_eq!(tx.free_slots(), 0);
    drop(all);
    assert_eq!(tx.free_slots(), 4, "every slot back, none lost or doubled");
    assert!(rx.try_recv().is_err(), "nothing delivered twice more");
}

#[test]
fn sender_waiting_for_slots_gets_peer_dead_when_every_receiver_died() {
    if role().as_deref() == Some("one-shot") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        drop(rx.recv().unwrap()); // maps the pool (registering in it), returns the slot
        announce("attached");
        die();
    }
    let name = unique_name("slots-dead");
    let ch = Channel::builder(&name).capacity(16).slots(4, 64).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peer = Peer::spawn(
        "sender_waiting_for_slots_gets_peer_dead_when_every_receiver_died",
        "one-shot",
        &name,
    );
    tx.send(tx.acquire().unwrap(), TensorMeta::bytes(8)).unwrap();
    peer.expect("attached");
    let died = peer.died();
    // Every slot goes into the ring, where nobody will take it.
    for _ in 0..4 {
        tx.send(tx.acquire().unwrap(), TensorMeta::bytes(8)).unwrap();
    }
    match tx.acquire_timeout(Duration::from_secs(5)) {
        Err(gpuring::AcquireTimeoutError::PeerDead) => assert_noticed("acquire", died, now_ns()),
        other => panic!("expected PeerDead, got {other:?}"),
    }
    // A live receiver attaching again makes the slots flow: it drains the ring.
    let rx = ch.receiver().unwrap();
    for _ in 0..4 {
        drop(rx.recv().unwrap());
    }
    assert!(tx.acquire_timeout(Duration::from_secs(1)).is_ok());
}

#[test]
fn ring_of_a_killed_creator_is_drained_then_replaced() {
    if role().as_deref() == Some("creator") {
        let ring = SpscRing::<Descriptor>::builder(ring_name()).capacity(8).create().unwrap();
        let mut tx = ring.producer().unwrap();
        for seq in 1..=3 {
            tx.push(Descriptor { seq, ..Default::default() }).unwrap();
        }
        die();
    }
    let name = unique_name("stale");
    let mut peer =
        Peer::spawn("ring_of_a_killed_creator_is_drained_then_replaced", "creator", &name);
    peer.died();

    // Nothing published is lost with its creator: the ring stays while elements wait, and
    // opening it drains them; then the dead producer is reported.
    let ring = SpscRing::<Descriptor>::builder(&name).open().unwrap();
    let mut rx = ring.consumer().unwrap();
    for seq in 1..=3 {
        assert_eq!(rx.pop().unwrap().seq, seq);
    }
    let t = Instant::now();
    assert_eq!(rx.pop(), Err(PopError::PeerDead));
    assert!(t.elapsed() < Duration::from_millis(100), "noticed in {:?}", t.elapsed());
    // The dead producer's role is taken over; a second live producer is refused.
    let mut tx = ring.producer().expect("the dead holder's role is free to take");
    assert!(matches!(ring.producer(), Err(AttachError::RoleTaken { .. })));
    tx.push(Descriptor { seq: 4, ..Default::default() }).unwrap();
    assert_eq!(rx.pop().unwrap().seq, 4);
    // One left queued: the ring outlives its last user, for a consumer that comes later.
    tx.push(Descriptor { seq: 5, ..Default::default() }).unwrap();
    drop((tx, rx, ring));
    assert!(shm_exists(&name), "a ring with an element waiting stays");

    // `create` does not replace it unless asked to.
    assert!(matches!(
        SpscRing::<Descriptor>::builder(&name).capacity(8).create(),
        Err(RingError::Segment(ShmError::AlreadyExists { .. }))
    ));
    let fresh =
        SpscRing::<Descriptor>::builder(&name).capacity(8).replace_stale(true).create().unwrap();
    let mut rx = fresh.consumer().unwrap();
    assert_eq!(rx.try_pop(), Err(gpuring::TryPopError::Empty), "a fresh ring");
    // A segment in use is never replaced.
    assert!(matches!(
        SpscRing::<Descriptor>::builder(&name).capacity(8).replace_stale(true).create(),
        Err(RingError::Segment(ShmError::AlreadyExists { .. }))
    ));
    drop((rx, fresh));
    assert!(!shm_exists(&name), "an empty ring goes with its last user");
}

fn shm_exists(name: &str) -> bool {
    std::path::Path::new(&format!("/dev/shm/{name}")).exists()
}

/// Writes an object `name` of `len` zero bytes with `mode`, as a hostile or stale process
/// could, before the channel is made.
fn pre_create(name: &str, len: u64, mode: u32) {
    use rustix::fs::Mode;
    use rustix::shm::OFlags;
    let fd = rustix::shm::open(
        format!("/{name}").as_str(),
        OFlags::CREATE | OFlags::EXCL | OFlags::RDWR,
        Mode::from_raw_mode(0o600),
    )
    .unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).unwrap();
}

#[test]
fn pre_created_objects_under_a_channel_name_are_refused_not_adopted() {
    for (tag, len, mode) in [("mode0644", 1 << 16, 0o644), ("wrongsize", 100, 0o600)] {
        let name = unique_name(tag);
        pre_create(&name, len, mode);
        let opened = Channel::builder(&name).open_timeout(Duration::from_millis(50)).open();
        match (tag, opened) {
            ("mode0644", Err(ChannelError::Segment(ShmError::PermissionDenied { reason, .. }))) => {
                assert!(reason.contains("0644"), "{reason}")
            }
            (
                "wrongsize",
                Err(ChannelError::Segment(ShmError::SizeMismatch { found: 100, .. })),
            ) => {}
            (_, other) => panic!("{tag}: expected a refusal, got {other:?}"),
        }
        assert!(
            matches!(
                Channel::builder(&name).create(),
                Err(ChannelError::Segment(ShmError::AlreadyExists { .. }))
            ),
            "{tag}: create must not adopt the object"
        );
        gpuring::internal::Segment::unlink(&name).unwrap();
        // What gpuring creates is 0600.
        let ch = Channel::builder(&name).create().unwrap();
        let path = format!("/dev/shm/{name}");
        let mode = std::fs::metadata(&path).map(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode() & 0o777
        });
        assert_eq!(mode.unwrap(), 0o600);
        drop(ch);
    }
}
