//! Sender/Receiver over host pools: in one process, and across processes (the test binary
//! re-executes itself as the peers).
#![cfg(not(loom))]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{ring_name, role, spawn, unique_name, wait_all, wait_for};
use gpuring::internal::push_raw;
use gpuring::{
    AcquireTimeoutError, AttachError, Channel, ChannelError, DType, Descriptor, Flavor, PoolState,
    RecvTimeoutError, SLOT_HEADER_SIZE, SendError, SendTimeoutError, ShmError, TensorMeta,
    TryAcquireError, TryRecvError, TrySendError, WaitPolicy,
};

const LIMIT: Duration = Duration::from_secs(30);
const WATCHDOG: Duration = Duration::from_secs(120);

/// The byte pattern of message `key`: 8-byte words derived from the key and the word index.
fn fill(buf: &mut [u8], key: u64) {
    let k = buf.len() / 8;
    let mut chunks = buf.chunks_exact_mut(8);
    for (k, chunk) in (&mut chunks).enumerate() {
        chunk.copy_from_slice(&word(key, k as u64).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let tail = word(key, k as u64).to_le_bytes();
    rest.copy_from_slice(&tail[..rest.len()]);
}

fn word(key: u64, k: u64) -> u64 {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k).rotate_left((k % 61) as u32)
}

/// Index of the first byte that differs from the pattern, if any.
fn first_bad(buf: &[u8], key: u64) -> Option<usize> {
    let mut chunks = buf.chunks_exact(8);
    for (k, chunk) in (&mut chunks).enumerate() {
        if chunk != word(key, k as u64).to_le_bytes() {
            return Some(k * 8);
        }
    }
    let k = buf.len() / 8;
    let rest = chunks.remainder();
    (rest != &word(key, k as u64).to_le_bytes()[..rest.len()]).then_some(k * 8)
}

/// Mixed sizes: empty, one byte, odd sizes, and full slots.
fn size_of_message(seq: u64, slot: usize) -> usize {
    match seq % 7 {
        0 => 0,
        1 => 1,
        2 => slot,
        3 => slot - 1,
        _ => (word(seq, 99) % slot as u64) as usize,
    }
}

/// Pool segments of a channel still in /dev/shm.
fn pool_segments(channel: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("{channel}.")))
        .collect()
}

#[test]
fn handles_move_between_threads() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Channel>();
    sync::<Channel>();
    send::<gpuring::Sender>();
    send::<gpuring::Receiver>();
    send::<gpuring::Lease>();
    sync::<gpuring::Lease>();
    send::<gpuring::Message>();
    sync::<gpuring::Message>();
}

/// A receiver says the policy it waits by (a GPU receive from a host-flag sender reads it
/// to wait for the flag): the default until one is set, then the one set; SPSC and MPMC.
#[test]
fn a_receiver_reports_its_wait_policy() {
    for flavor in [Flavor::Spsc, Flavor::Mpmc, Flavor::Broadcast] {
        let name = unique_name("wait-policy");
        let b = Channel::builder(&name).slots(2, 64);
        let ch = match flavor {
            Flavor::Spsc => b.spsc(),
            Flavor::Mpmc => b.mpmc(),
            Flavor::Broadcast => b.broadcast(),
        }
        .create()
        .unwrap();
        let mut rx = ch.receiver().unwrap();
        assert_eq!(rx.wait_policy(), WaitPolicy::default(), "{flavor:?}");
        let spin = WaitPolicy::spin_then_sleep(u32::MAX, 0);
        rx.set_wait_policy(spin);
        assert_eq!(rx.wait_policy(), spin, "{flavor:?}");
    }
}

#[test]
fn spsc_round_trip_in_one_process() {
    let name = unique_name("ch-rt");
    let ch = Channel::builder(&name).capacity(4).slots(2, 4096).create().unwrap();
    assert_eq!(ch.flavor(), Flavor::Spsc);
    assert_eq!((ch.capacity(), ch.slots()), (4, (2, 4096)));
    let tx = ch.sender().unwrap();
    let rx = ch.receiver().unwrap();
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));

    let meta = TensorMeta::contiguous(DType::F32, &[4, 8]).unwrap();
    let mut lease = tx.acquire().unwrap();
    assert_eq!(lease.len(), 4096);
    fill(&mut lease[..128], 7);
    lease.set_tag(99);
    tx.send(lease, meta).unwrap();
    assert_eq!(tx.free_slots(), 1);

    let msg = rx.recv().unwrap();
    assert_eq!((msg.seq(), msg.tag(), msg.len()), (0, 99, 128));
    assert_eq!(msg.meta(), &meta);
    assert_eq!(first_bad(&msg, 7), None);
    assert_eq!(tx.free_slots(), 1, "held by the message");
    drop(msg);
    assert_eq!(tx.free_slots(), 2, "dropping the message returns the slot");

    let pools = ch.pools();
    assert_eq!(pools.len(), 1);
    assert_eq!((pools[0].state, pools[0].owner_pid), (PoolState::Active, std::process::id()));
    assert_eq!(pools[0].name, tx.pool_name()[1..]);
}

/// Sends messages tagged `tags`, 64 bytes each filled by `fill` with the tag as key.
fn send_tagged(tx: &gpuring::Sender, tags: std::ops::Range<u64>) {
    for t in tags {
        let mut lease = tx.acquire_timeout(LIMIT).unwrap();
        fill(&mut lease[..64], t);
        lease.set_tag(t);
        tx.send(lease, TensorMeta::bytes(64)).unwrap();
    }
}

#[test]
fn a_requeued_message_comes_back_first_marked_and_whole() {
    let name = unique_name("ch-requeue");
    let ch = Channel::builder(&name).mpmc().capacity(8).slots(6, 4096).create().unwrap();
    let tx = ch.sender().unwrap();
    let (a, b) = (ch.receiver().unwrap(), ch.receiver().unwrap());
    send_tagged(&tx, 0..5);
    let taken: Vec<_> = (0..3).map(|_| a.recv_timeout(LIMIT).unwrap()).collect();
    assert_eq!(taken.iter().map(|m| m.tag()).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(taken.iter().all(|m| !m.redelivered()));
    // `a` keeps message 0 and gives 1 and 2 back; `b`, which took nothing yet, gets them
    // before what is queued (3, 4), marked, and their bytes as sent.
    let mut taken = taken.into_iter();
    let kept = taken.next().unwrap();
    for m in taken {
        a.requeue(m).unwrap();
    }
    assert_eq!(tx.free_slots(), 1, "the given back messages still hold their slots");
    let mut got = Vec::new();
    for _ in 0..4 {
        let m = b.recv_timeout(LIMIT).unwrap();
        assert_eq!(first_bad(&m[..64], m.tag()), None, "message {}", m.tag());
        got.push((m.tag(), m.redelivered()));
    }
    assert_eq!(got, [(1, true), (2, true), (3, false), (4, false)]);
    assert!(matches!(a.try_recv(), Err(TryRecvError::Empty)), "each delivered again once");
    drop(kept);
    assert_eq!(tx.free_slots(), 6, "every slot back once the messages went");

    // The receiver that gave a message back may take it again itself.
    send_tagged(&tx, 5..6);
    let m = a.recv_timeout(LIMIT).unwrap();
    a.requeue(m).unwrap();
    let m = a.recv_timeout(LIMIT).unwrap();
    assert_eq!((m.tag(), m.redelivered()), (5, true));
    drop(m);

    // Another receiver's message: refused, and given back intact.
    send_tagged(&tx, 6..7);
    let m = b.recv_timeout(LIMIT).unwrap();
    let m = match a.requeue(m) {
        Err(gpuring::RequeueError::NotReceivedHere(m)) => *m,
        other => panic!("expected NotReceivedHere, got {other:?}"),
    };
    assert_eq!(m.tag(), 6);
    drop(m);
    assert_eq!(tx.free_slots(), 6);
}

/// Messages given back come back oldest first (per sender), whatever slots they are in and
/// in whatever order they were given back: a getter that took several ahead and puts them
/// back leaves the stream in order.
#[test]
fn requeued_messages_come_back_in_the_order_they_were_sent() {
    let name = unique_name("ch-requeue-order");
    let ch = Channel::builder(&name).mpmc().capacity(8).slots(4, 4096).create().unwrap();
    let tx = ch.sender().unwrap();
    let (a, b) = (ch.receiver().unwrap(), ch.receiver().unwrap());
    // Messages 0 and 1 come and go, so that 4 and 5 go into the slots they had: 2 to 5 are
    // then in slots 2, 3, 0, 1.
    send_tagged(&tx, 0..2);
    for _ in 0..2 {
        drop(a.recv_timeout(LIMIT).unwrap());
    }
    send_tagged(&tx, 2..6);
    let taken: Vec<_> = (0..4).map(|_| a.recv_timeout(LIMIT).unwrap()).collect();
    assert_eq!(taken.iter().map(|m| m.tag()).collect::<Vec<_>>(), [2, 3, 4, 5]);
    for m in taken.into_iter().rev() {
        a.requeue(m).unwrap();
    }
    let got: Vec<_> = (0..4)
        .map(|_| {
            let m = b.recv_timeout(LIMIT).unwrap();
            assert!(m.redelivered());
            m.tag()
        })
        .collect();
    assert_eq!(got, [2, 3, 4, 5]);
    assert_eq!(tx.free_slots(), 4);
}

#[test]
fn a_channel_that_does_not_deliver_again_refuses_a_requeue() {
    let name = unique_name("ch-requeue-off");
    let ch = Channel::builder(&name).redeliver(false).slots(2, 4096).create().unwrap();
    let tx = ch.sender().unwrap();
    let rx = ch.receiver().unwrap();
    send_tagged(&tx, 0..1);
    let m = rx.recv_timeout(LIMIT).unwrap();
    let err = rx.requeue(m).unwrap_err();
    assert!(err.to_string().contains("does not deliver messages again"), "{err}");
    let m = err.into_message();
    assert_eq!(tx.free_slots(), 1, "still held");
    drop(m);
    assert_eq!(tx.free_slots(), 2);
}

#[test]
fn leases_back_pressure_and_errors() {
    let name = unique_name("ch-err");
    let ch = Channel::builder(&name).capacity(1).slots(2, 64).create().unwrap();
    let tx = ch.sender().unwrap();
    assert!(
        matches!(ch.sender(), Err(ChannelError::Attach(AttachError::RoleTaken { .. }))),
        "one SPSC sender"
    );
    let rx = ch.receiver().unwrap();
    assert!(
        matches!(ch.receiver(), Err(ChannelError::Attach(AttachError::RoleTaken { .. }))),
        "one SPSC receiver"
    );

    let a = tx.try_acquire().unwrap();
    let b = tx.try_acquire().unwrap();
    assert_eq!(tx.try_acquire().unwrap_err(), TryAcquireError::Exhausted);
    assert_eq!(
        tx.acquire_timeout(Duration::from_millis(10)).unwrap_err(),
        AcquireTimeoutError::Timeout
    );
    drop(a); // never sent: back to the pool
    assert_eq!(tx.free_slots(), 1);

    // Too large: the lease comes back, bytes intact.
    let mut b = b;
    b[0] = 42;
    let b = match tx.send(b, TensorMeta::bytes(65)) {
        Err(SendError::TooLarge { lease, len: 65, capacity: 64 }) => lease,
        other => panic!("expected TooLarge, got {other:?}"),
    };
    assert_eq!(b[0], 42);
    tx.send(b, TensorMeta::bytes(1)).unwrap();
    // The ring (capacity 1) is full: try_send and send_timeout give the lease back.
    let c = tx.try_acquire().unwrap();
    let c = match tx.try_send(c, TensorMeta::bytes(1)) {
        Err(TrySendError::Full(lease)) => lease,
        other => panic!("expected Full, got {other:?}"),
    };
    let c = match tx.send_timeout(c, TensorMeta::bytes(1), Duration::from_millis(10)) {
        Err(SendTimeoutError::Timeout(lease)) => lease,
        other => panic!("expected Timeout, got {other:?}"),
    };
    assert_eq!(rx.recv().unwrap()[0], 42);
    tx.send(c, TensorMeta::bytes(1)).unwrap();
    assert_eq!(rx.recv().unwrap().seq(), 1, "a failed send does not use up a sequence number");
    assert!(matches!(rx.recv_timeout(Duration::from_millis(10)), Err(RecvTimeoutError::Timeout)));
    assert_eq!(tx.free_slots(), 2);
}

#[test]
fn builder_and_open_checks() {
    let name = unique_name("ch-open");
    assert!(matches!(
        Channel::builder(&name).slots(0, 64).create(),
        Err(ChannelError::InvalidPool { slot_count: 0, .. })
    ));
    assert!(matches!(
        Channel::builder(&name).capacity(3).create(),
        Err(ChannelError::InvalidCapacity { capacity: 3 })
    ));
    assert!(matches!(
        Channel::builder(&name).max_senders(0).create(),
        Err(ChannelError::InvalidConfig { .. })
    ));
    assert!(matches!(
        Channel::builder("x".repeat(201)).create(),
        Err(ChannelError::Segment(ShmError::InvalidName { .. }))
    ));
    assert!(matches!(
        Channel::builder(&name).open(),
        Err(ChannelError::Segment(ShmError::NotFound { .. }))
    ));

    let ch = Channel::builder(&name).mpmc().capacity(8).slots(3, 100).max_senders(2).create();
    let ch = ch.unwrap();
    let opened = Channel::builder(&name).open().unwrap();
    assert_eq!(opened.flavor(), Flavor::Mpmc, "open finds the flavor");
    assert_eq!((opened.capacity(), opened.slots(), opened.max_senders()), (8, (3, 100), 2));
    assert!(matches!(
        Channel::builder(&name).spsc().open(),
        Err(ChannelError::Segment(ShmError::KindMismatch { .. }))
    ));

    // A plain ring is not a channel.
    let ring_name = unique_name("ch-ring");
    let _ring = gpuring::SpscRing::<Descriptor>::builder(&ring_name).capacity(4).create().unwrap();
    assert!(matches!(
        Channel::builder(&ring_name).open(),
        Err(ChannelError::Segment(ShmError::KindMismatch { .. }))
    ));

    // Pool table: two senders fit, a third does not.
    let s1 = ch.sender().unwrap();
    let _s2 = opened.sender().unwrap();
    assert!(matches!(ch.sender(), Err(ChannelError::PoolTableFull { max_pools: 2 })));
    // A departed sender with nothing in flight frees its entry for a newcomer.
    drop(s1);
    let s3 = ch.sender().unwrap();
    assert_eq!(s3.pool_id() & 0xFFFF, 0, "reuses entry 0");
    assert_eq!(s3.pool_id() >> 16, 3, "with a new instance number");
}

#[test]
fn forged_descriptors_are_rejected_and_the_pool_is_untouched() {
    let name = unique_name("ch-forge");
    let ch = Channel::builder(&name).capacity(16).slots(4, 256).create().unwrap();
    let tx = ch.sender().unwrap();
    let rx = ch.receiver().unwrap();

    let mut lease = tx.acquire().unwrap();
    fill(&mut lease[..100], 5);
    tx.send(lease, TensorMeta::bytes(100)).unwrap();
    let real = rx.recv().unwrap();
    let good = *real.descriptor();
    assert_eq!(tx.free_slots(), 3);

    let forge = |f: &dyn Fn(&mut Descriptor)| {
        let mut d = good;
        f(&mut d);
        d
    };
    let cases: Vec<(Descriptor, &str)> = vec![
        (forge(&|d| d.generation += 1), "descriptor carries a stale slot generation"),
        (forge(&|d| d.generation = 0), "descriptor carries a stale slot generation"),
        // The real one is held by `real`: a replay of it is not in flight.
        (good, "descriptor names a slot that is not in flight"),
        (forge(&|d| d.slot = 4), "descriptor names a slot out of range"),
        (forge(&|d| d.slot = u32::MAX), "descriptor names a slot out of range"),
        (
            forge(&|d| d.set_meta(&TensorMeta::bytes(257))),
            "descriptor length is larger than the slot",
        ),
        (forge(&|d| d.byte_offset = 200), "descriptor length is larger than the slot"),
        (forge(&|d| d.byte_offset = u64::MAX), "descriptor length is larger than the slot"),
        (forge(&|d| d.len = 99), "descriptor metadata is inconsistent with its length"),
        (forge(&|d| d.dtype = 200), "descriptor carries invalid tensor metadata"),
        (forge(&|d| d.ndim = 9), "descriptor carries invalid tensor metadata"),
        (forge(&|d| d.pool_id = 1), "descriptor names an unknown pool"),
        (forge(&|d| d.pool_id = 77), "descriptor names an unknown pool"),
        (forge(&|d| d.pool_id += 1 << 16), "descriptor names an unknown pool"),
        (forge(&|d| d.device_ordinal = 0), "descriptor names a device, the pool is host memory"),
        (
            forge(&|d| d.header_len = SLOT_HEADER_SIZE as u32 + 1),
            "descriptor header is longer than a slot's header",
        ),
        (forge(&|d| d.header_len = u32::MAX), "descriptor header is longer than a slot's header"),
    ];
    for (d, what) in &cases {
        push_raw(&tx, *d).unwrap();
        match rx.try_recv() {
            Err(TryRecvError::Corrupted(c)) => assert_eq!(c.what, *what, "{d:?}"),
            other => panic!("forged {d:?} gave {other:?}, expected Corrupted({what})"),
        }
        assert_eq!(tx.free_slots(), 3, "a rejected descriptor leaves the pool alone ({what})");
    }
    // The real message is intact; after the forgeries the channel carries on.
    assert_eq!(first_bad(&real, 5), None);
    drop(real);
    assert_eq!(tx.free_slots(), 4);
    // A slot returned cannot be returned again by replaying its descriptor.
    push_raw(&tx, good).unwrap();
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Corrupted(_))));
    assert_eq!(tx.free_slots(), 4);
    let mut lease = tx.acquire().unwrap();
    fill(&mut lease[..10], 6);
    tx.send(lease, TensorMeta::bytes(10)).unwrap();
    let m = rx.recv().unwrap();
    assert_eq!((m.seq(), first_bad(&m, 6)), (1, None));
}

#[test]
fn headers_travel_beside_the_payload_per_slot() {
    let name = unique_name("ch-header");
    let ch = Channel::builder(&name).capacity(8).slots(2, 256).create().unwrap();
    let tx = ch.sender().unwrap();
    let rx = ch.receiver().unwrap();
    let big = vec![0xA5u8; SLOT_HEADER_SIZE];
    for round in 0..6u8 {
        let mut lease = tx.acquire().unwrap();
        // Alternate a full header, a short one and none: what a slot's header held before
        // must not leak into a later message's.
        match round % 3 {
            0 => lease.set_header(&big).unwrap(),
            1 => lease.set_header(&[round; 7]).unwrap(),
            _ => {}
        }
        fill(&mut lease[..16], u64::from(round));
        tx.send(lease, TensorMeta::bytes(16)).unwrap();
        let m = rx.recv().unwrap();
        match round % 3 {
            0 => assert_eq!(m.header(), &big[..]),
            1 => assert_eq!(m.header(), &[round; 7]),
            _ => assert!(m.header().is_empty()),
        }
        assert_eq!(first_bad(&m, u64::from(round)), None, "the payload is untouched by its header");
    }
    let mut lease = tx.acquire().unwrap();
    let err = lease.set_header(&vec![0u8; SLOT_HEADER_SIZE + 1]).unwrap_err();
    assert_eq!(err.len, SLOT_HEADER_SIZE + 1);
    assert!(err.to_string().contains("a slot's header holds 4096"), "{err}");
    assert_eq!(lease.header_mut().len(), SLOT_HEADER_SIZE);
}

#[test]
fn a_sleeping_acquire_is_woken_by_a_returned_slot() {
    let name = unique_name("ch-wake");
    let ch = Channel::builder(&name).capacity(4).slots(1, 64).create().unwrap();
    let mut tx = ch.sender().unwrap();
    tx.set_wait_policy(WaitPolicy::SLEEP);
    let rx = ch.receiver().unwrap();
    tx.send(tx.acquire().unwrap(), TensorMeta::bytes(8)).unwrap();
    let msg = rx.recv().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            // Let the sender fall asleep on the free ring, then return the slot.
            std::thread::sleep(Duration::from_millis(50));
            drop(msg);
        });
        let lease = tx.acquire_timeout(LIMIT).expect("woken by the returned slot");
        assert_eq!(lease.generation(), 2);
    });
}

#[test]
fn pool_names_outlive_their_sender_until_drained() {
    let name = unique_name("ch-drain");
    let ch = Channel::builder(&name).capacity(8).slots(4, 64).create().unwrap();
    let rx = ch.receiver().unwrap();
    let tx = ch.sender().unwrap();
    for i in 0..3u64 {
        let mut l = tx.acquire().unwrap();
        fill(&mut l[..16], i);
        tx.send(l, TensorMeta::bytes(16)).unwrap();
    }
    drop(tx);
    assert_eq!(pool_segments(&name).len(), 1, "messages in flight keep the pool");
    assert_eq!(ch.pools()[0].state, PoolState::Closed);
    let mut held = Vec::new();
    for i in 0..3u64 {
        let m = rx.recv().unwrap();
        assert_eq!((m.seq(), first_bad(&m, i)), (i, None), "sent before the sender left");
        held.push(m);
    }
    assert_eq!(pool_segments(&name).len(), 1, "still held");
    drop(held);
    assert!(pool_segments(&name).is_empty(), "the last slot returned unlinks the pool");
    // A new sender can come and go; with nothing in flight it unlinks its own pool.
    let tx = ch.sender().unwrap();
    assert_eq!(pool_segments(&name).len(), 1);
    drop(tx);
    assert!(pool_segments(&name).is_empty());
    // A sender that leaves while a lease is out: the lease's drop unlinks the pool.
    let tx = ch.sender().unwrap();
    let lease = tx.acquire().unwrap();
    drop(tx);
    assert_eq!(pool_segments(&name).len(), 1, "a lease is out");
    drop(lease);
    assert!(pool_segments(&name).is_empty(), "the returned lease was the last slot out");
}

#[test]
fn spsc_100k_messages_of_mixed_sizes_every_byte_checked() {
    const N: u64 = 100_000;
    const SLOTS: u32 = 16;
    const SLOT: usize = 8192;
    if role().as_deref() == Some("receiver") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        for seq in 0..N {
            let m = rx.recv_timeout(LIMIT).unwrap();
            assert_eq!(m.seq(), seq, "in order, none lost");
            assert_eq!(m.len(), size_of_message(seq, SLOT), "seq {seq}");
            assert_eq!(m.tag(), seq ^ 0xABCD);
            if let Some(at) = first_bad(&m, seq) {
                panic!("seq {seq}: byte {at} differs from what was written");
            }
        }
        return;
    }
    let name = unique_name("ch-100k");
    let ch = Channel::builder(&name).capacity(64).slots(SLOTS, SLOT as u64).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peer =
        [spawn("spsc_100k_messages_of_mixed_sizes_every_byte_checked", "receiver", &name, &[])];
    for seq in 0..N {
        let mut lease = tx.acquire_timeout(LIMIT).unwrap();
        let len = size_of_message(seq, SLOT);
        fill(&mut lease[..len], seq);
        lease.set_tag(seq ^ 0xABCD);
        tx.send_timeout(lease, TensorMeta::bytes(len as u64), LIMIT).unwrap();
    }
    wait_all(&mut peer, WATCHDOG);
    wait_for("every slot back in the pool", LIMIT, || tx.free_slots() == SLOTS as usize);
    drop(tx);
    assert!(pool_segments(&name).is_empty(), "a drained pool is unlinked with its sender");
}

#[test]
fn mpmc_three_sender_and_two_receiver_processes_exactly_once() {
    const PER_SENDER: u64 = 20_000;
    const SENDERS: u64 = 3;
    const SLOT: usize = 1024;
    let key = |s: u64, i: u64| (s << 32) | i;
    match role().as_deref() {
        Some(r) if r.starts_with("sender") => {
            let s: u64 = r["sender".len()..].parse().unwrap();
            let ch = Channel::builder(ring_name()).open().unwrap();
            let tx = ch.sender().unwrap();
            for i in 0..PER_SENDER {
                let mut lease = tx.acquire_timeout(LIMIT).unwrap();
                let len = size_of_message(i, SLOT);
                fill(&mut lease[..len], key(s, i));
                lease.set_tag(key(s, i));
                tx.send_timeout(lease, TensorMeta::bytes(len as u64), LIMIT).unwrap();
            }
            // Exits with messages possibly in flight: they must still arrive.
            return;
        }
        Some(r) if r.starts_with("receiver") => {
            let ch = Channel::builder(ring_name()).mpmc().open().unwrap();
            let rx = ch.receiver().unwrap();
            let mut got = Vec::new();
            // Until every sender has left (the parent's, last) and all was received.
            loop {
                let m = match rx.recv_timeout(LIMIT) {
                    Err(RecvTimeoutError::Disconnected) => break,
                    m => m.unwrap(),
                };
                let (s, i) = (m.tag() >> 32, m.tag() & 0xffff_ffff);
                assert_eq!(m.seq(), i, "seq is per sender");
                assert_eq!(m.len(), size_of_message(i, SLOT));
                assert_eq!(first_bad(&m, m.tag()), None, "sender {s} message {i}");
                got.push(m.tag());
            }
            let bytes: Vec<u8> = got.iter().flat_map(|s| s.to_le_bytes()).collect();
            std::fs::write(std::env::var("GPURING_TEST_OUT").unwrap(), bytes).unwrap();
            return;
        }
        _ => {}
    }
    let test = "mpmc_three_sender_and_two_receiver_processes_exactly_once";
    let name = unique_name("ch-mpmc");
    let ch = Channel::builder(&name).mpmc().capacity(64).slots(8, SLOT as u64).create().unwrap();
    let dir = std::env::temp_dir();
    let outs: Vec<_> = (0..2).map(|c| dir.join(format!("{name}-receiver{c}.bin"))).collect();
    let mut receivers: Vec<_> = outs
        .iter()
        .enumerate()
        .map(|(c, out)| {
            let env = [("GPURING_TEST_OUT", out.display().to_string())];
            spawn(test, &format!("receiver{c}"), &name, &env)
        })
        .collect();
    // A sender of ours keeps the channel connected while the senders come and go (one
    // may leave before the next attaches); dropping it, once all are done, is the end.
    let tx = ch.sender().unwrap();
    let mut senders: Vec<_> =
        (0..SENDERS).map(|s| spawn(test, &format!("sender{s}"), &name, &[])).collect();
    wait_all(&mut senders, WATCHDOG);
    drop(tx);
    wait_all(&mut receivers, WATCHDOG);

    let mut seen = HashSet::new();
    for out in &outs {
        let bytes = std::fs::read(out).unwrap();
        let _ = std::fs::remove_file(out);
        let mut last = [None::<u64>; SENDERS as usize];
        for chunk in bytes.chunks_exact(8) {
            let k = u64::from_le_bytes(chunk.try_into().unwrap());
            let (s, i) = ((k >> 32) as usize, k & 0xffff_ffff);
            assert!(s < SENDERS as usize && i < PER_SENDER, "invented message {k:#x}");
            assert!(last[s].is_none_or(|l| l < i), "sender {s}: {i} after {:?}", last[s]);
            last[s] = Some(i);
            assert!(seen.insert(k), "message {k:#x} delivered twice");
        }
    }
    assert_eq!(seen.len() as u64, SENDERS * PER_SENDER, "messages lost");
    // The departed senders' pools drained and were unlinked by the receivers.
    assert!(pool_segments(&name).is_empty(), "left behind: {:?}", pool_segments(&name));
}

#[test]
fn many_tensors_in_one_slot_through_parts() {
    let name = unique_name("ch-parts");
    let ch = Channel::builder(&name).capacity(4).slots(2, 1 << 20).create().unwrap();
    let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    // 120 parts of varied dtypes and shapes, each filled with its index.
    let dtypes = [DType::F32, DType::BF16, DType::I64, DType::U8, DType::C128];
    let metas: Vec<TensorMeta> = (0..120u64)
        .map(|i| {
            let shape: Vec<u64> = (0..(i % 4)).map(|d| 1 + (i + d) % 7).collect();
            TensorMeta::contiguous(dtypes[i as usize % dtypes.len()], &shape).unwrap()
        })
        .collect();
    let mut lease = tx.acquire().unwrap();
    let mut parts = lease.parts();
    let offsets: Vec<u64> = metas.iter().map(|m| parts.push(m).unwrap()).collect();
    let meta = parts.finish();
    for (i, (m, off)) in metas.iter().zip(&offsets).enumerate() {
        assert_eq!(off % gpuring::PART_ALIGN, 0);
        lease[*off as usize..][..m.nbytes() as usize].fill(i as u8);
    }
    tx.send(lease, meta).unwrap();
    let msg = rx.recv().unwrap();
    let got: Vec<gpuring::Part> = msg.parts().unwrap().collect();
    assert_eq!(got.len(), metas.len());
    for (i, p) in got.iter().enumerate() {
        assert_eq!((p.offset, p.meta), (offsets[i], metas[i]), "part {i}");
        let bytes = &msg[p.offset as usize..][..p.meta.nbytes() as usize];
        assert!(bytes.iter().all(|&b| b == i as u8), "part {i}'s bytes");
    }
    drop(msg);

    // Full: the slot, then the header; nothing is added by a refused push.
    let mut lease = tx.acquire().unwrap();
    let mut parts = lease.parts();
    parts.push(&TensorMeta::bytes(1000)).unwrap();
    let err = parts.push(&TensorMeta::bytes(1 << 20)).unwrap_err();
    assert!(matches!(err, gpuring::PartError::SlotFull { .. }), "{err}");
    let eight = TensorMeta::contiguous(DType::U8, &[1; 8]).unwrap(); // 80 bytes of table
    let mut n = 1;
    let full = loop {
        match parts.push(&eight) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(full, gpuring::PartError::HeaderFull(_)), "{full}");
    assert_eq!(n, 1 + (SLOT_HEADER_SIZE - 8 - 16) / 80);
    let meta = parts.finish();
    tx.send(lease, meta).unwrap();
    assert_eq!(rx.recv().unwrap().parts().unwrap().count(), n);
}

#[test]
fn forged_parts_tables_are_corrupted_never_a_panic() {
    let name = unique_name("ch-parts-forged");
    let ch = Channel::builder(&name).capacity(4).slots(1, 4096).create().unwrap();
    let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    let send = |header: &[u8]| {
        let mut lease = tx.acquire().unwrap();
        lease.set_header(header).unwrap();
        tx.send(lease, TensorMeta::bytes(1024)).unwrap();
        rx.recv().unwrap()
    };
    let entry = |off: u64, dtype: u8, dims: &[u64]| {
        let mut e = off.to_le_bytes().to_vec();
        e.extend([dtype, dims.len() as u8, 0, 0, 0, 0, 0, 0]);
        dims.iter().for_each(|d| e.extend(d.to_le_bytes()));
        e
    };
    let table = |count: u32, entries: &[Vec<u8>]| {
        let mut h = b"GRP1".to_vec();
        h.extend(count.to_le_bytes());
        entries.iter().for_each(|e| h.extend(e));
        h
    };
    let f32 = DType::F32 as u8;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"nope".to_vec(), "the message's header is not a parts table"),
        (table(2, &[entry(0, f32, &[4])]), "a parts table runs past its header"),
        (table(1, &[entry(0, 0, &[4])]), "a part names an unknown dtype"),
        (table(1, &[entry(0, f32, &[1; 9])]), "a part has too many dimensions"),
        (table(1, &[entry(1024, f32, &[1])]), "a part lies outside the message's payload"),
        (table(1, &[entry(u64::MAX, f32, &[1])]), "a part lies outside the message's payload"),
        (table(1, &[entry(0, f32, &[u64::MAX, 4])]), "a part's size overflows"),
    ];
    for (h, what) in cases {
        let msg = send(&h);
        match msg.parts() {
            Err(c) => assert_eq!(c.what, what),
            Ok(_) => panic!("a forged table was accepted: expected {what}"),
        }
    }
    // Random headers: never a panic; whatever parses lies inside the payload.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..2000 {
        let mut h = table((round % 5) as u32, &[]);
        for _ in 0..(round % 96) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            h.push((x >> 24) as u8 % if round % 2 == 0 { 8 } else { 255 });
        }
        let msg = send(&h);
        if let Ok(parts) = msg.parts() {
            for p in parts {
                assert!(p.offset + p.meta.nbytes() <= msg.len() as u64);
            }
        }
    }
}
