//! Reliability, round two: what an unlucky day finds. Each test is one finding of an
//! independent suite (real processes, SIGKILL), written to fail before its fix.
#![cfg(not(loom))] // processes and shared memory are not modelled by loom

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use common::{Peer, die, ring_name, role, unique_name};
use gpuring::{Channel, TensorMeta};

const LIMIT: Duration = Duration::from_secs(20);

/// Every object in /dev/shm of channel `name`: itself and its pools.
fn leftovers(name: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f == name || f.starts_with(&format!("{name}.")))
        .collect();
    found.sort();
    found
}

/// A new sender of `ch` that has sent one message tagged `tag`.
fn send_one(ch: &Channel, tag: u64) -> gpuring::Sender {
    let tx = ch.sender().unwrap();
    let mut lease = tx.acquire_timeout(LIMIT).unwrap();
    lease[..8].copy_from_slice(&tag.to_le_bytes());
    lease.set_tag(tag);
    tx.send(lease, TensorMeta::bytes(8)).unwrap();
    tx
}

/// `replace_stale` after the creator crashed takes the dead instance's pools with its
/// channel; and a pool of an earlier instance that is still there (one that was open
/// somewhere when the channel was replaced) is an orphan that `clean` removes while the
/// new channel of the same name lives, which keeps its own pools.
#[test]
fn replace_stale_then_clean_leaves_nothing_of_the_old_instance() {
    if role().as_deref() == Some("creator") {
        let ch = Channel::builder(ring_name()).slots(2, 64).create().unwrap();
        let _tx = send_one(&ch, 1);
        die();
    }
    let name = unique_name("stale");
    let mut creator = Peer::spawn(
        "replace_stale_then_clean_leaves_nothing_of_the_old_instance",
        "creator",
        &name,
    );
    creator.died();
    let old = leftovers(&name);
    assert_eq!(old.len(), 2, "the dead instance's channel and pool: {old:?}");
    let old_pool = old.iter().find(|n| **n != name).unwrap().clone();
    let image = std::fs::read(format!("/dev/shm/{old_pool}")).unwrap();

    let ch = Channel::builder(&name).slots(2, 64).replace_stale(true).create().unwrap();
    assert_eq!(
        leftovers(&name),
        std::slice::from_ref(&name),
        "replace_stale took the old pool along"
    );
    let _tx = send_one(&ch, 2);
    let live = leftovers(&name);
    assert_eq!(live.len(), 2, "the new channel and its pool: {live:?}");

    // An old instance's pool that outlived the replacement.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(format!("/dev/shm/{old_pool}"))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &image, 0).unwrap();
    drop(f);
    let all = gpuring::inspect::list().unwrap();
    let info = all.iter().find(|i| i.name == old_pool).unwrap();
    assert_eq!(info.state(&all), "orphaned pool");
    let cleaned = gpuring::inspect::clean(false, false, &name).unwrap();
    let names: Vec<&str> = cleaned.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [old_pool.as_str()], "clean removed the old pool and nothing else");
    assert_eq!(leftovers(&name), live, "the live channel and its pool stay");
    let rx = ch.receiver().unwrap();
    assert_eq!(rx.recv_timeout(LIMIT).unwrap().tag(), 2);
}
