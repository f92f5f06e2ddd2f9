//! The defaults fit a container's `/dev/shm` (64 MB unless the container is started with
//! `--shm-size`): the test runs itself again in a mount namespace of its own with a 64 MB
//! tmpfs on `/dev/shm` (`unshare -Urm`), and is skipped, saying so, where that cannot be
//! done (no `unshare`, no user namespaces).
#![cfg(not(loom))]

mod common;

use std::process::Command;

use common::{role, unique_name};
use gpuring::{Channel, ChannelError, DType, ShmError, TensorMeta};

/// The exit status of the shell that could not mount the tmpfs.
const NO_TMPFS: i32 = 97;

#[test]
fn the_default_channels_fit_a_64_mb_dev_shm() {
    let test = "the_default_channels_fit_a_64_mb_dev_shm";
    if role().as_deref() == Some("in-64-mb") {
        let free = gpuring::inspect::shm_available().expect("statvfs of /dev/shm");
        assert!(free <= 64 << 20, "not the 64 MB tmpfs: {free} bytes free");
        // The default SPSC channel, its sender and receiver, one message through.
        let name = unique_name("small-shm");
        let ch = Channel::builder(&name).create().unwrap();
        let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
        let mut lease = tx.acquire().unwrap();
        lease[..4].copy_from_slice(&7u32.to_le_bytes());
        tx.send(lease, TensorMeta::contiguous(DType::U32, &[1]).unwrap()).unwrap();
        assert_eq!(rx.recv().unwrap()[..4], 7u32.to_le_bytes());
        // A default MPMC channel with four senders (each its own default pool).
        let mpmc = Channel::builder(format!("{name}-mpmc")).mpmc().create().unwrap();
        let senders: Vec<_> = (0..4).map(|_| mpmc.sender().unwrap()).collect();
        // What does not fit is `NoSpace` at once, and names the way out.
        let big = Channel::builder(format!("{name}-big")).slots(8, 64 << 20).create().unwrap();
        match big.sender() {
            Err(ChannelError::Segment(e @ ShmError::NoSpace { .. })) => {
                assert!(e.to_string().contains("--shm-size"), "{e}");
            }
            other => panic!("a 512 MiB pool in a 64 MB /dev/shm: {other:?}"),
        }
        drop(senders);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let script =
        format!("mount -t tmpfs -o size=64m tmpfs /dev/shm || exit {NO_TMPFS}; exec \"$0\" \"$@\"");
    let run = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &script])
        .arg(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("GPURING_TEST_ROLE", "in-64-mb")
        .stdout(std::process::Stdio::null()) // its harness lines; a panic shows on stderr
        .status();
    match run {
        Ok(s) if s.code() == Some(NO_TMPFS) => {
            eprintln!("SKIPPED {test}: cannot mount a tmpfs in a user namespace here");
        }
        Ok(s) => assert!(s.success(), "the run in a 64 MB /dev/shm failed: {s}"),
        Err(e) => eprintln!("SKIPPED {test}: no `unshare` here ({e})"),
    }
}
