//! Senders whose pools have slots of their own (`Channel::sender_with_slots`): one channel
//! carries each sender's messages from its own pool whatever its slots, across processes;
//! slots out of range are refused; a table entry whose recorded slots were forged is
//! `Corrupted` to a receiver, never a mapping of the wrong size.
#![cfg(not(loom))] // shared memory is not modelled by loom

mod common;

use std::fs::OpenOptions;
use std::mem::{offset_of, size_of};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::{ring_name, role, spawn, unique_name, wait_all};
use gpuring::internal::{ChannelLayout, PoolEntry};
use gpuring::{Channel, ChannelError, RecvTimeoutError, TensorMeta, TryRecvError};

const LIMIT: Duration = Duration::from_secs(30);
const BIG: u64 = 1 << 20;
const SMALL: u64 = 4096;
const EACH: u64 = 200;

/// Message i's length: up to 600 KB from the sender with large slots, up to 4 KB from
/// the one with the channel's.
fn len_of(big: bool, i: u64) -> usize {
    if big { (i * 3001 % 600_000 + 1) as usize } else { (i * 37 % SMALL + 1) as usize }
}

fn byte(key: u64, k: usize) -> u8 {
    (key.wrapping_mul(31).wrapping_add(k as u64 * 7) % 251) as u8
}

fn send_all(tx: &gpuring::Sender, big: bool) {
    for i in 0..EACH {
        let mut lease = tx.acquire_timeout(LIMIT).unwrap();
        let key = (u64::from(big) << 32) | i;
        let len = len_of(big, i);
        for (k, b) in lease[..len].iter_mut().enumerate() {
            *b = byte(key, k);
        }
        lease.set_tag(key);
        tx.send_timeout(lease, TensorMeta::bytes(len as u64), LIMIT).unwrap();
    }
}

#[test]
fn senders_with_their_own_slots_share_a_channel_across_processes() {
    let test = "senders_with_their_own_slots_share_a_channel_across_processes";
    if role().as_deref() == Some("big") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let tx = ch.sender_with_slots(2, BIG).unwrap();
        assert_eq!((tx.slot_count(), tx.slot_size()), (2, BIG as usize));
        send_all(&tx, true);
        return; // leaves with messages maybe in flight: they must still arrive
    }
    let name = unique_name("own-slots");
    let ch = Channel::builder(&name).mpmc().capacity(64).slots(4, SMALL).create().unwrap();
    let rx = ch.receiver().unwrap();
    let mut child = vec![spawn(test, "big", &name, &[])];
    let tx = ch.sender().unwrap();
    assert_eq!(tx.slot_size(), SMALL as usize);
    let tx = std::thread::scope(|s| {
        let sent = s.spawn(move || {
            send_all(&tx, false);
            tx
        });
        let mut last = [None::<u64>; 2];
        for _ in 0..2 * EACH {
            let m = rx.recv_timeout(LIMIT).unwrap();
            let (big, i) = (m.tag() >> 32 == 1, m.tag() & 0xffff_ffff);
            assert!(last[usize::from(big)].is_none_or(|l| l + 1 == i), "order of {big}: {i}");
            last[usize::from(big)] = Some(i);
            assert_eq!(m.len(), len_of(big, i), "message {i} of the big sender: {big}");
            let bad = m.iter().enumerate().find(|&(k, b)| *b != byte(m.tag(), k));
            assert_eq!(bad, None, "message {i} (big sender: {big})");
        }
        sent.join().unwrap()
    });
    wait_all(&mut child, LIMIT);
    drop(tx);
    assert!(matches!(rx.recv_timeout(Duration::from_secs(5)), Err(RecvTimeoutError::Disconnected)));
}

#[test]
fn own_slots_out_of_range_are_refused_as_at_create() {
    let name = unique_name("own-slots-range");
    let ch = Channel::builder(&name).mpmc().slots(4, SMALL).create().unwrap();
    for (count, size) in [(0, 4096), (1 << 21, 64), (2, 1 << 39), (1, 0)] {
        match ch.sender_with_slots(count, size) {
            Err(ChannelError::InvalidPool { slot_count, slot_size }) => {
                assert_eq!((slot_count, slot_size), (count, size));
            }
            other => panic!("({count}, {size}): {:?}", other.map(|_| ())),
        }
    }
    assert!(ch.pools().is_empty(), "a refused sender registered nothing");
    assert_eq!(ch.sender_with_slots(1, 64).unwrap().slot_size(), 64);
}

/// Writes `bytes` at `offset` of the channel's segment.
fn poke(name: &str, offset: usize, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(format!("/dev/shm/{name}")).unwrap();
    f.write_all_at(bytes, offset as u64).unwrap();
}

#[test]
fn forged_slots_in_a_table_entry_are_corrupted_to_a_receiver() {
    // The pool table's place does not depend on the ring behind it.
    let table = ChannelLayout::new(16, 64, 64).unwrap().pools;
    let entry0 = |field: usize| table + field; // the first sender's entry
    let forgeries: [(usize, Vec<u8>, &str); 3] = [
        (
            offset_of!(PoolEntry, slot_size),
            (2 * 8192u64).to_le_bytes().to_vec(),
            "pool table entry disagrees with its pool segment",
        ),
        (
            offset_of!(PoolEntry, slot_size),
            (1u64 << 62).to_le_bytes().to_vec(),
            "pool table entry holds impossible slot parameters",
        ),
        (
            offset_of!(PoolEntry, slot_count),
            0u32.to_le_bytes().to_vec(),
            "pool table entry holds impossible slot parameters",
        ),
    ];
    assert!(size_of::<PoolEntry>() > offset_of!(PoolEntry, slot_size));
    let sent = |name: &str| {
        let ch = Channel::builder(name).mpmc().capacity(64).slots(4, SMALL).create().unwrap();
        let tx = ch.sender_with_slots(2, 8192).unwrap();
        let mut lease = tx.acquire().unwrap();
        lease[..3].copy_from_slice(b"abc");
        tx.send(lease, TensorMeta::bytes(3)).unwrap();
        (ch, tx)
    };
    // Control: the entry as the sender wrote it.
    let name = unique_name("own-slots-forged");
    let (ch, _tx) = sent(&name);
    assert_eq!(&ch.receiver().unwrap().try_recv().unwrap()[..], b"abc");
    for (field, bytes, what) in forgeries {
        let name = unique_name("own-slots-forged");
        let (ch, _tx) = sent(&name);
        poke(&name, entry0(field), &bytes);
        // A receiver that has not mapped the pool reads the entry's slots to map it.
        let rx = ch.receiver().unwrap();
        match rx.try_recv() {
            Err(TryRecvError::Corrupted(c)) => assert_eq!(c.what, what),
            other => panic!("forged {what}: {:?}", other.map(|_| ())),
        }
    }
}
