//! Attaching to segments that are wrong in every way we can think of: each gets its own
//! typed error, and a good segment stays usable.
#![cfg(not(loom))] // shared memory is not modelled by loom

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::time::Duration;

use common::unique_name;
use gpuring::internal::{LAYOUT_VERSION, RingLayout, SegmentKind, ring_segment};
use gpuring::{
    AttachError, Descriptor, MpmcRing, PopTimeoutError, RingError, Role, ShmError, SpscRing,
};

fn path(name: &str) -> String {
    format!("/dev/shm/{name}")
}

fn poke(name: &str, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path(name)).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

#[test]
fn created_segment_is_private_and_exclusive() {
    let name = unique_name("mode");
    let ring = SpscRing::<Descriptor>::builder(&name).capacity(64).create().unwrap();
    let meta = fs::metadata(path(&name)).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let layout = RingLayout::new(64, size_of::<Descriptor>()).unwrap();
    assert_eq!(meta.len(), layout.total_size as u64);
    assert!(matches!(
        SpscRing::<Descriptor>::builder(&name).capacity(64).create(),
        Err(RingError::Segment(ShmError::AlreadyExists { .. }))
    ));
    drop(ring);
    assert!(fs::metadata(path(&name)).is_err(), "the owner unlinks on drop");
    assert!(matches!(
        SpscRing::<Descriptor>::builder(&name).open(),
        Err(RingError::Segment(ShmError::NotFound { .. }))
    ));
}

#[test]
fn bad_arguments() {
    assert!(matches!(
        SpscRing::<u64>::builder("a/b").capacity(8).create(),
        Err(RingError::Segment(ShmError::InvalidName { .. }))
    ));
    assert!(matches!(
        SpscRing::<u64>::builder("").capacity(8).create(),
        Err(RingError::Segment(ShmError::InvalidName { .. }))
    ));
    let name = unique_name("cap");
    assert!(matches!(
        SpscRing::<u64>::builder(&name).capacity(12).create(),
        Err(RingError::InvalidCapacity { capacity: 12 })
    ));
    assert!(fs::metadata(path(&name)).is_err(), "a failed create leaves nothing behind");
}

#[test]
fn wrong_size_is_size_mismatch() {
    let name = unique_name("size");
    let _ring = SpscRing::<Descriptor>::builder(&name).capacity(64).create().unwrap();
    let expected = RingLayout::new(64, size_of::<Descriptor>()).unwrap().total_size as u64;
    let f = OpenOptions::new().write(true).open(path(&name)).unwrap();
    f.set_len(expected + 4096).unwrap();
    match SpscRing::<Descriptor>::builder(&name).open() {
        Err(RingError::Segment(ShmError::SizeMismatch { expected: e, found })) => {
            assert_eq!((e, found), (expected, expected + 4096))
        }
        other => panic!("expected SizeMismatch, got {other:?}"),
    }
}

#[test]
fn bad_magic_and_wrong_version() {
    let name = unique_name("magic");
    let _ring = SpscRing::<Descriptor>::builder(&name).capacity(64).create().unwrap();
    poke(&name, 8, &(LAYOUT_VERSION + 1).to_le_bytes());
    assert!(matches!(
        SpscRing::<Descriptor>::builder(&name).open(),
        Err(RingError::Segment(ShmError::VersionMismatch { expected: LAYOUT_VERSION, found })) if found == LAYOUT_VERSION + 1
    ));
    poke(&name, 0, b"NOTOURS!");
    assert!(matches!(
        SpscRing::<Descriptor>::builder(&name).open(),
        Err(RingError::Segment(ShmError::BadMagic { found })) if found == u64::from_le_bytes(*b"NOTOURS!")
    ));
}

#[test]
fn mode_0644_is_refused() {
    let name = unique_name("perm");
    let _ring = SpscRing::<Descriptor>::builder(&name).capacity(64).create().unwrap();
    fs::set_permissions(path(&name), fs::Permissions::from_mode(0o644)).unwrap();
    match SpscRing::<Descriptor>::builder(&name).open() {
        Err(RingError::Segment(ShmError::PermissionDenied { reason, .. })) => {
            assert!(reason.contains("0644"), "{reason}")
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

#[test]
fn a_pre_created_foreign_object_is_refused_not_adopted() {
    let name = unique_name("foreign");
    let f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path(&name)).unwrap();
    f.set_len(4096).unwrap();
    // All zeros: the header never becomes ready.
    let r = SpscRing::<u64>::builder(&name).open_timeout(Duration::from_millis(30)).open();
    assert!(matches!(r, Err(RingError::Segment(ShmError::NotInitialized { .. }))), "{r:?}");
    // Someone else's data.
    f.write_all_at(&[0xAB; 64], 0).unwrap();
    assert!(matches!(
        SpscRing::<u64>::builder(&name).open(),
        Err(RingError::Segment(ShmError::BadMagic { .. }))
    ));
    // `create` will not take it over either.
    assert!(matches!(
        SpscRing::<u64>::builder(&name).capacity(8).create(),
        Err(RingError::Segment(ShmError::AlreadyExists { .. }))
    ));
    fs::remove_file(path(&name)).unwrap();
}

#[test]
fn kind_and_element_type_must_match() {
    let name = unique_name("kind");
    let _ring = SpscRing::<u64>::builder(&name).capacity(8).create().unwrap();
    assert!(matches!(
        MpmcRing::<u64>::builder(&name).open(),
        Err(RingError::Segment(ShmError::KindMismatch {
            expected: SegmentKind::MpmcRing,
            found: 1
        }))
    ));
    assert!(matches!(
        SpscRing::<u32>::builder(&name).open(),
        Err(RingError::ElementMismatch { expected: (4, 4), found: (8, 8) })
    ));
}

#[test]
fn forged_capacity_is_corrupted() {
    let name = unique_name("capforge");
    let _ring = SpscRing::<u64>::builder(&name).capacity(8).create().unwrap();
    poke(&name, 128, &3u64.to_le_bytes());
    assert!(matches!(SpscRing::<u64>::builder(&name).open(), Err(RingError::Corrupted(_))));
    poke(&name, 128, &16u64.to_le_bytes());
    assert!(matches!(
        SpscRing::<u64>::builder(&name).open(),
        Err(RingError::Segment(ShmError::SizeMismatch { .. }))
    ));
}

#[test]
fn scribbled_head_is_corrupted_and_roles_are_exclusive() {
    let name = unique_name("head");
    let ring = SpscRing::<Descriptor>::builder(&name).capacity(64).create().unwrap();
    {
        let mut tx = ring.producer().unwrap();
        assert!(matches!(
            ring.producer(),
            Err(AttachError::RoleTaken { role: Role::Producer, holder_pid }) if holder_pid == std::process::id()
        ));
        tx.try_push(Descriptor::default()).unwrap();
    }
    // The role came back with the drop, and the element is still there.
    let peer = SpscRing::<Descriptor>::builder(&name).open().unwrap();
    let mut rx = peer.consumer().unwrap();
    assert!(rx.try_pop().is_ok());
    drop(rx);

    let layout = RingLayout::new(64, size_of::<Descriptor>()).unwrap();
    let head_offset = (layout.control + 128) as u64;
    poke(&name, head_offset, &0xdead_beef_dead_beef_u64.to_le_bytes());
    assert!(matches!(peer.consumer(), Err(AttachError::Corrupted(_))));
    assert!(matches!(ring.producer(), Err(AttachError::Corrupted(_))));
    // A failed attach gives the role back.
    poke(&name, head_offset, &1u64.to_le_bytes());
    assert!(peer.consumer().is_ok());
}

/// A process of the same user shrinks a ring's object after we mapped it (POSIX shm
/// objects cannot be sealed). Touching the vanished pages would raise SIGBUS and kill us;
/// the guard turns each into a zero page instead: the cells still inside the object keep
/// their values, the vanished ones read as zeros, writes into them do not crash, and a
/// blocked endpoint reports `Corrupted` at its next tick.
#[test]
fn a_segment_truncated_under_us_is_corrupted_not_a_crash() {
    use gpuring::TryPopError;
    let name = unique_name("truncate");
    let ring = SpscRing::<u64>::builder(&name).capacity(4096).create().unwrap();
    let mut tx = ring.producer().unwrap();
    let mut rx = ring.consumer().unwrap();
    for v in 1..=3000 {
        tx.try_push(v).unwrap();
    }
    assert!(!ring_segment(&ring).truncated());
    // The hostile truncation (made from this process: to the kernel it is the same).
    let layout = RingLayout::new(4096, 8).unwrap();
    // Two pages of cells stay (the positions, near the start, with them).
    let keep = (layout.cells as u64).next_multiple_of(4096) + 8192;
    OpenOptions::new().write(true).open(path(&name)).unwrap().set_len(keep).unwrap();
    let intact = (keep as usize - layout.cells) / 8; // cells wholly inside the object
    let mut got = Vec::new();
    loop {
        match rx.try_pop() {
            Ok(v) => got.push(v),
            Err(TryPopError::Empty) => break,
            Err(e) => panic!("positions live in the first page, intact: {e:?}"),
        }
    }
    assert_eq!(got.len(), 3000, "the positions were intact, so every cell was popped");
    assert_eq!(got[..intact], (1..=intact as u64).collect::<Vec<_>>()[..], "inside: kept");
    assert!(got[intact..].iter().all(|&v| v == 0), "past the end: zeros, not SIGBUS");
    // A write into a vanished page does not crash either (it lands in this process's
    // private zero page, so only we see it).
    tx.try_push(7).unwrap();
    assert_eq!(rx.try_pop(), Ok(7));
    assert!(ring_segment(&ring).truncated());
    match rx.pop_timeout(Duration::from_secs(2)) {
        Err(PopTimeoutError::Corrupted(c)) => assert!(c.what.contains("truncated"), "{c}"),
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

/// Writes real segment images (layout version of this build) as seeds for the `attach`
/// fuzz target: `GPURING_SEED_DIR=fuzz/corpus/attach cargo test --test attach
/// write_fuzz_seeds -- --ignored`. Each seed is the target's pick byte, then the bytes.
#[test]
#[ignore = "writes fuzz seeds; run by hand after a layout change"]
fn write_fuzz_seeds() {
    let Ok(dir) = std::env::var("GPURING_SEED_DIR") else { return };
    let save = |pick: u8, tag: &str, name: &str| {
        let mut bytes = vec![pick];
        bytes.extend(fs::read(path(name)).unwrap());
        fs::write(format!("{dir}/seed-v{LAYOUT_VERSION}-{tag}-{pick}"), bytes).unwrap();
    };
    let spsc = unique_name("seed-spsc");
    let ring = SpscRing::<Descriptor>::builder(&spsc).capacity(4).create().unwrap();
    let mut tx = ring.producer().unwrap();
    tx.try_push(Descriptor::default()).unwrap();
    tx.try_push(Descriptor::default()).unwrap();
    let mpmc = unique_name("seed-mpmc");
    let mring = MpmcRing::<u64>::builder(&mpmc).capacity(4).create().unwrap();
    let mtx = mring.producer().unwrap();
    for v in 0..3 {
        mtx.try_push(v).unwrap();
    }
    let mrx = mring.consumer().unwrap();
    mrx.try_pop().unwrap();
    for (pick, tag, name) in [
        (0, "spsc-ring", &spsc),
        (1, "mpmc-ring", &mpmc),
        (3, "spsc-ring", &spsc),
        (3, "mpmc-ring", &mpmc),
    ] {
        save(pick, tag, name);
    }
    for mpmc in [false, true] {
        let name = unique_name("seed-channel");
        let b = gpuring::Channel::builder(&name).capacity(4).slots(2, 64);
        let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
        let tx = ch.sender().unwrap();
        let lease = tx.acquire().unwrap();
        tx.send(lease, gpuring::TensorMeta::bytes(8)).unwrap();
        let tag = if mpmc { "mpmc-channel" } else { "spsc-channel" };
        save(2, tag, &name);
        save(3, tag, &name);
        save(3, &format!("{tag}-pool"), tx.pool_name());
    }
}

/// Kilobytes of shared memory this process has mapped in (`RssShmem`).
fn rss_shmem_kib() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssShmem:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A forged object that claims a huge size (its segment header says so, and the object
/// is that long, but sparse) while its ring header implies a small one: opening it is a
/// `SizeMismatch`, and neither the object nor this process commits more than the few
/// header pages read to refuse it (before, the opener pre-faulted the whole claimed size:
/// 1 GiB committed in ~0.9 s).
#[test]
fn forged_sparse_objects_commit_nothing_before_the_size_check() {
    let name = unique_name("sparse-src");
    let ring = SpscRing::<u64>::builder(&name).capacity(8).create().unwrap();
    let image = fs::read(path(&name)).unwrap();
    drop(ring);
    for claimed in [1u64 << 30, 1 << 40] {
        let forged = unique_name("sparse");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path(&forged))
            .unwrap();
        f.write_all_at(&image, 0).unwrap();
        f.write_all_at(&claimed.to_le_bytes(), 16).unwrap(); // SegmentHeader::total_size
        f.set_len(claimed).unwrap();
        let blocks = |f: &fs::File| std::os::unix::fs::MetadataExt::blocks(&f.metadata().unwrap());
        let (blocks_before, rss_before) = (blocks(&f), rss_shmem_kib());
        match SpscRing::<u64>::builder(&forged).open() {
            Err(RingError::Segment(ShmError::SizeMismatch { expected, found })) => {
                assert_eq!(found, claimed);
                assert_eq!(expected, image.len() as u64);
            }
            other => panic!("expected SizeMismatch, got {other:?}"),
        }
        let committed = (blocks(&f) - blocks_before) * 512;
        let mapped = (rss_shmem_kib().saturating_sub(rss_before)) * 1024;
        println!("claimed {claimed} B: object grew {committed} B, RssShmem grew {mapped} B");
        assert!(committed < 1 << 20, "opening committed {committed} bytes of the object");
        assert!(mapped < 1 << 20, "opening mapped in {mapped} bytes");
        fs::remove_file(path(&forged)).unwrap();
    }
}

/// A forged channel header whose slot parameters are in range but far beyond what the
/// machine holds: a sender's pool for it is `NoSpace`, checked before anything is
/// reserved, and nothing is committed or left behind.
#[test]
fn forged_channel_slot_sizes_are_no_space_and_commit_nothing() {
    use gpuring::{Channel, ChannelError};
    let name = unique_name("forged-slots");
    let ch = Channel::builder(&name).slots(3, 4096).create().unwrap();
    poke(&name, 136, &(256u64 << 30).to_le_bytes()); // ChannelHeader::slot_size
    let opened = Channel::builder(&name).open().unwrap();
    let rss_before = rss_shmem_kib();
    match opened.sender() {
        Err(ChannelError::Segment(ShmError::NoSpace { needed, .. })) => {
            assert!(needed >= 3 * (256 << 30), "{needed}")
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    let mapped = (rss_shmem_kib().saturating_sub(rss_before)) * 1024;
    assert!(mapped < 1 << 20, "the refused sender mapped in {mapped} bytes");
    let pools: Vec<_> = fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("{name}.")))
        .collect();
    assert!(pools.is_empty(), "left {pools:?}");
    drop((opened, ch));
}

/// Walks `e`'s `source()` chain as anyhow or eyre would print it, and fails if a cause is
/// printed twice: displayed by its wrapper and then again as the wrapper's source.
fn assert_each_cause_printed_once(e: &dyn std::error::Error) {
    let mut outer = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let shown = cause.to_string();
        assert!(!outer.contains(&shown), "{shown:?} is printed by its wrapper {outer:?} too");
        outer = shown;
        next = cause.source();
    }
}

#[test]
fn error_chains_print_each_cause_once() {
    use gpuring::{ChannelError, Corrupted, PoolError};
    let io = || std::io::Error::from_raw_os_error(libc::ENOSPC);
    let shm_io = || ShmError::Io { op: "fallocate", source: io() };
    let attach_io = || AttachError::Io { op: "fcntl(F_OFD_SETLK)", source: io() };
    let corrupted = Corrupted { what: "tail behind head" };
    let errors: Vec<Box<dyn std::error::Error>> = vec![
        Box::new(shm_io()),
        Box::new(attach_io()),
        Box::new(ShmError::Corrupted(corrupted)),
        Box::new(AttachError::Corrupted(corrupted)),
        Box::new(RingError::Segment(shm_io())),
        Box::new(RingError::Corrupted(corrupted)),
        Box::new(ChannelError::<gpuring::Host>::Segment(shm_io())),
        Box::new(ChannelError::<gpuring::Host>::Attach(attach_io())),
        Box::new(PoolError::Segment(shm_io())),
        Box::new(gpuring::RecvError::<gpuring::Host>::Pool(PoolError::Attach(attach_io()))),
    ];
    for e in &errors {
        assert!(
            e.to_string().contains("failed")
                || e.to_string().contains("tail behind head")
                || e.to_string().contains("pool"),
            "{e}"
        );
        assert_each_cause_printed_once(e.as_ref());
    }
    // A real one: opening a ring of another layout version, through `RingError`.
    let name = unique_name("chain");
    let _ring = SpscRing::<Descriptor>::builder(&name).capacity(64).create().unwrap();
    poke(&name, 8, &(LAYOUT_VERSION + 1).to_le_bytes());
    let e = SpscRing::<Descriptor>::builder(&name).open().unwrap_err();
    assert_each_cause_printed_once(&e);
}

#[test]
fn messages_say_what_is_wrong_and_what_to_do() {
    use gpuring::Channel;
    let name = unique_name("messages");
    // A ring opened as a channel: both kinds by name.
    let _ring = SpscRing::<u64>::builder(&name).capacity(8).create().unwrap();
    let e = Channel::builder(&name).open().unwrap_err().to_string();
    assert!(e.contains("an SPSC ring, not an SPSC channel"), "{e}");
    // A second sender of an SPSC channel: who holds the role, and the way to several.
    let ch = Channel::builder(format!("{name}-ch")).slots(2, 64).create().unwrap();
    let _tx = ch.sender().unwrap();
    let e = ch.sender().unwrap_err().to_string();
    assert!(e.contains("this process holds it") && e.contains(".mpmc()"), "{e}");
    // A name in use: how to attach to it, and how to remove a crash's leftover.
    let e = Channel::builder(format!("{name}-ch")).create().unwrap_err().to_string();
    assert!(e.contains("open_or_create") && e.contains("gpuring clean --queued"), "{e}");
    // A pool of one slot is "1 slot", not "1 slots".
    let e = Channel::builder(format!("{name}-x")).slots(1, 0).create().unwrap_err().to_string();
    assert!(e.contains("a pool of 1 slot of 0 bytes"), "{e}");
}

/// The channel header's delivery guarantee (`ChannelHeader::redeliver`, offset 156) is
/// read once at open: 0 and 1 are the two settings, anything else is `Corrupted`.
#[test]
fn a_forged_delivery_guarantee_is_corrupted_at_open() {
    use gpuring::{Channel, ChannelError};
    let name = unique_name("forged-redeliver");
    let ch = Channel::builder(&name).slots(2, 64).create().unwrap();
    assert!(Channel::builder(&name).open().unwrap().redelivers());
    poke(&name, 156, &0u32.to_le_bytes());
    assert!(!Channel::builder(&name).open().unwrap().redelivers());
    poke(&name, 156, &7u32.to_le_bytes());
    match Channel::builder(&name).open() {
        Err(ChannelError::Corrupted(c)) => {
            assert_eq!(c.what, "channel names an unknown delivery guarantee")
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
    drop(ch);
}
