//! Descriptor validation: any 384 bytes, pushed raw into a live channel whose slots are
//! all free (none in flight), are refused by the receiver with `TryRecvError::Corrupted`,
//! whatever they say; the pool is left as it was (no slot lost or doubled, a broadcast
//! slot held by nobody), and nothing panics. An SPSC channel and a broadcast channel, as a
//! byte after the descriptor says. `Descriptor::meta` is checked on the same bytes on the
//! way.
#![no_main]

use gpuring::{Channel, Descriptor, Receiver, Sender, TensorMeta, TryRecvError};
use libfuzzer_sys::fuzz_target;

struct Pair {
    _ch: Channel,
    tx: Sender,
    rx: Receiver,
}

thread_local! {
    // libFuzzer runs the target on one thread: one channel of each kind for the whole run.
    static PAIRS: [Pair; 2] = [pair(false), pair(true)];
}

fn pair(broadcast: bool) -> Pair {
    let kind = if broadcast { "bcast" } else { "spsc" };
    let name = format!("gpuring-fuzz-desc-{kind}-{}", std::process::id());
    let b = Channel::builder(&name).capacity(8).slots(4, 4096);
    let ch = if broadcast { b.broadcast() } else { b }.create().expect("channel");
    let tx = ch.sender().expect("sender");
    let rx = ch.receiver().expect("receiver");
    // The receiver maps the pool with a real message; then the names go, so that a
    // run that ends abruptly (libFuzzer exits without running thread-local
    // destructors) leaves nothing in /dev/shm. What is mapped stays usable.
    let lease = tx.acquire().expect("a free slot");
    tx.send(lease, TensorMeta::bytes(8)).expect("send");
    drop(rx.recv().expect("the real message"));
    let shm = std::path::Path::new("/dev/shm");
    for pool in ch.pools() {
        let _ = std::fs::remove_file(shm.join(&pool.name));
    }
    let _ = std::fs::remove_file(shm.join(&name));
    Pair { _ch: ch, tx, rx }
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = [0u8; size_of::<Descriptor>()];
    let n = data.len().min(bytes.len());
    bytes[..n].copy_from_slice(&data[..n]);
    let d: Descriptor = bytemuck::cast(bytes);
    let extra = data.get(bytes.len()).copied();
    PAIRS.with(|p| check(&p[usize::from(extra.is_some_and(|b| b & 2 == 2))], d, extra));
});

fn check(p: &Pair, mut d: Descriptor, extra: Option<u8>) {
    // Half the inputs name this channel's real pool, so validation gets past the pool id.
    if extra.is_some_and(|b| b & 1 == 1) {
        d.pool_id = p.tx.pool_id();
    }
    let _ = d.meta(); // metadata checks alone
    gpuring::internal::push_raw(&p.tx, d).expect("room: one descriptor in, one out");
    match p.rx.try_recv() {
        Ok(m) => {
            // A forged descriptor that passes names a slot that is not in flight: it cannot.
            panic!("a forged descriptor was accepted: {} bytes", m.len());
        }
        Err(TryRecvError::Corrupted(_)) => {}
        Err(e) => panic!("expected Corrupted, got {e}"),
    }
    assert_eq!(p.tx.free_slots(), 4, "the pool is untouched");
}
