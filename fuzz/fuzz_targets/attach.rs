//! Attach-time validation: whatever bytes (and size) a segment holds, opening it as a
//! ring, a channel or any gpuring segment returns a typed result and never panics or
//! faults; when it opens, using it (pops, receives, `inspect`) does not either.
//!
//! Input: the segment's bytes. The first byte picks the interpretation; the object is
//! written with mode 0600 under a fresh name, then opened with a zero timeout.
#![no_main]

use std::time::Duration;

use gpuring::{Channel, Descriptor, MpmcRing, SpscRing};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    let name = format!("gpuring-fuzz-attach-{}", std::process::id());
    let path = format!("/dev/shm/{name}");
    let _ = std::fs::remove_file(&path);
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .expect("create the object");
        std::io::Write::write_all(&mut f, body).expect("write");
    }
    let zero = Duration::ZERO;
    match pick % 4 {
        0 => {
            if let Ok(ring) = SpscRing::<Descriptor>::builder(&name).open_timeout(zero).open() {
                if let Ok(mut rx) = ring.consumer() {
                    for _ in 0..4 {
                        let _ = rx.try_pop();
                    }
                }
            }
        }
        1 => {
            if let Ok(ring) = MpmcRing::<u64>::builder(&name).open_timeout(zero).open() {
                if let Ok(rx) = ring.consumer() {
                    for _ in 0..4 {
                        let _ = rx.try_pop();
                    }
                }
            }
        }
        2 => {
            if let Ok(ch) = Channel::builder(&name).open_timeout(zero).open() {
                if let Ok(rx) = ch.receiver() {
                    for _ in 0..4 {
                        let _ = rx.try_recv();
                    }
                }
            }
        }
        _ => {
            // `inspect` waits up to 100 ms for an unfinished segment: only ask it about
            // ones whose init word says finished, so the run stays fast.
            if body.get(28..32) == Some(&gpuring::internal::INIT_READY.to_le_bytes()[..]) {
                let _ = gpuring::inspect::inspect(&name);
            }
        }
    }
    let _ = std::fs::remove_file(&path);
});
