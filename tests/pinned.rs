//! Pinned host slots between a GPU process and a CPU process: stream-ordered copies into
//! and out of host slots (`send_from_device_on`, `copy_to_device_on`, also of a broadcast
//! channel), registration once per pool mapping.
//!
//! Every test here needs a GPU and is `#[ignore]`d, so a machine without one lists them as
//! ignored (visibly skipped); on the GPU machine `bash .gpu/run.sh` runs them. Each test's
//! work runs in child processes (roles), so the per-process counters they check are not
//! moved by the other tests of this binary.
#![cfg(all(feature = "cuda", not(loom)))]

mod common;

use std::time::Duration;

use common::counting::{allocations, assert_counting};
use common::gpu::{memset, setup, value};
use common::{ring_name, role, spawn, unique_name, wait_all};
use cudarc::driver::{result, sys};
use gpuring::cuda::{self, CudaStream};
use gpuring::{Channel, DType, TensorMeta};

#[global_allocator]
static GLOBAL: common::counting::Counting = common::counting::Counting;

const LIMIT: Duration = Duration::from_secs(30);
const WATCHDOG: Duration = Duration::from_secs(240);
/// The payload: a 54 MB array, as in the issue.
const BYTES: usize = 54 << 20;
const WORDS: usize = BYTES / 4;

/// The parent of a two-process test: creates host channel `tag` with `slots` slots of
/// BYTES (unpinned: each child chooses), runs `test`'s receiver and sender, waits for both.
fn run_pair(test: &str, tag: &str, slots: u32) {
    run_pair_of(test, tag, slots, false);
}

/// [`run_pair`], of a broadcast channel if `broadcast`.
fn run_pair_of(test: &str, tag: &str, slots: u32, broadcast: bool) {
    let name = unique_name(tag);
    let builder = Channel::builder(&name).slots(slots, BYTES as u64);
    let ch = if broadcast { builder.broadcast() } else { builder }.create().unwrap();
    let mut peers = [spawn(test, "receiver", &name, &[]), spawn(test, "sender", &name, &[])];
    wait_all(&mut peers, WATCHDOG);
    drop(ch);
}

fn device_buffer(bytes: usize) -> sys::CUdeviceptr {
    // SAFETY: a plain allocation, freed when the test process exits.
    unsafe { result::malloc_sync(bytes) }.unwrap()
}

/// Enqueues slow work on `stream` (repeated memsets of a scratch buffer): what comes after
/// it in stream order runs milliseconds later.
fn slow_work(scratch: sys::CUdeviceptr, passes: u32, stream: &CudaStream) {
    for pass in 0..passes {
        memset(scratch, pass, WORDS, stream);
    }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().unwrap()))
}

/// GPU process → CPU process, 54 MB per message: the sender copies each device buffer into
/// a pinned slot in stream order after slow GPU work, and the descriptor is published by a
/// host function when the copy is done; the receiver (no CUDA at all) reads every byte at
/// once and sees the final values. Control: every other message is published by a plain
/// `send` right after enqueueing the same copy by hand, and the receiver must see stale
/// bytes in at least one of them, or the test could not tell ordered from unordered.
#[test]
#[ignore = "needs an NVIDIA GPU (run by .gpu/run.sh on the GPU machine)"]
fn pinned_gpu_to_cpu_process_in_stream_order() {
    const MESSAGES: u64 = 24;
    const PASSES: u32 = 2048;
    match role().as_deref() {
        Some("receiver") => {
            let ch = Channel::builder(ring_name()).open().unwrap();
            let rx = ch.receiver().unwrap();
            let mut stale = 0;
            for _ in 0..MESSAGES {
                let m = rx.recv_timeout(LIMIT).unwrap();
                let seq = m.tag();
                assert_eq!(m.len(), BYTES);
                if seq % 2 == 1 {
                    // The control: read at once, outside the stream's order.
                    stale += u32::from(words(&m).any(|w| w != value(seq)));
                } else {
                    let bad = words(&m).position(|w| w != value(seq));
                    assert_eq!(bad, None, "message {seq}: a word read before the copy wrote it");
                }
            }
            assert!(stale > 0, "the unordered control never raced: the test cannot see ordering");
            eprintln!("unordered control read stale bytes in {stale} of {} messages", MESSAGES / 2);
            assert_eq!(cuda::host_registrations(), 0, "a CPU-only receiver touches no CUDA");
        }
        Some("sender") => {
            let (ctx, stream) = setup();
            let ch = Channel::builder(ring_name()).pinned(&ctx).open().unwrap();
            // A `Sender<Pinned>`: made only once its pool is registered.
            let tx = ch.sender().unwrap();
            assert_eq!((cuda::host_registrations(), cuda::host_registered()), (1, 1));
            let src = device_buffer(BYTES);
            let meta = TensorMeta::contiguous(DType::U32, &[WORDS as u64]).unwrap();
            let mut allocs = 0;
            for seq in 0..MESSAGES {
                if seq == 2 {
                    allocs = allocations();
                }
                let mut lease = tx.acquire_timeout(LIMIT).unwrap();
                lease.set_tag(seq);
                // The next copy reads `src` after the previous one: stream order.
                slow_work(src, PASSES, &stream);
                memset(src, value(seq), WORDS, &stream);
                if seq % 2 == 1 {
                    // Control: the same asynchronous copy, then a plain send at once.
                    let dst = lease.as_mut_ptr().cast();
                    // SAFETY: the lease's slot holds BYTES; `src` is live device memory.
                    let r =
                        unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, BYTES, stream.cu_stream()) };
                    r.result().unwrap();
                    tx.send_timeout(lease, meta, LIMIT).unwrap();
                } else {
                    // SAFETY: `src` holds BYTES and lives until the process exits.
                    unsafe { tx.send_from_device_on(lease, src, meta, &stream) }.unwrap();
                }
            }
            let n = allocations() - allocs;
            assert_eq!(n, 0, "{n} heap allocations in the sender's steady state");
            assert_counting();
            stream.synchronize().unwrap();
            assert_eq!(tx.stream_sends_lost(), 0);
            drop(tx);
            assert_eq!(cuda::host_registered(), 0, "the pool's registration goes with it");
            assert_eq!(cuda::host_registrations(), 1, "registered once");
        }
        _ => run_pair("pinned_gpu_to_cpu_process_in_stream_order", "pinned-g2c", 2),
    }
}

/// CPU process → GPU process, 54 MB per message through one slot: the receiver enqueues
/// slow GPU work, then `copy_to_device_on` out of its pinned slot; the slot goes back only
/// when the copy has completed (a host function), so the sender, waiting to overwrite the
/// slot, never changes what the copy reads: every word of the device copy is checked.
/// Control: every other message is copied by hand and dropped at once (the slot goes back
/// under the pending copy), and at least one such copy must see the overwrite.
#[test]
#[ignore = "needs an NVIDIA GPU (run by .gpu/run.sh on the GPU machine)"]
fn pinned_cpu_to_gpu_process_slot_waits_for_the_copy() {
    cpu_to_gpu("pinned_cpu_to_gpu_process_slot_waits_for_the_copy", false);
}

/// The same through a broadcast channel: `copy_to_device_on` hands the receiver's hold to
/// the lane (the slot goes back once the copy is done and every cursor is past it), where
/// before it waited for the stream.
#[test]
#[ignore = "needs an NVIDIA GPU (run by .gpu/run.sh on the GPU machine)"]
fn pinned_cpu_to_gpu_broadcast_slot_waits_for_the_copy() {
    cpu_to_gpu("pinned_cpu_to_gpu_broadcast_slot_waits_for_the_copy", true);
}

/// Waits until the broadcast channel `name` has a receiver (a message sent before it
/// attached would not be its).
fn wait_for_a_reader(name: &str) {
    let deadline = std::time::Instant::now() + LIMIT;
    let attached = || {
        gpuring::inspect::list()
            .unwrap()
            .iter()
            .any(|s| s.name.ends_with(name) && s.readers.as_ref().is_some_and(|r| !r.is_empty()))
    };
    while !attached() {
        assert!(std::time::Instant::now() < deadline, "no receiver attached to {name}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn cpu_to_gpu(test: &str, broadcast: bool) {
    const MESSAGES: u64 = 24;
    const PASSES: u32 = 256;
    match role().as_deref() {
        Some("receiver") => {
            let (ctx, stream) = setup();
            let ch = Channel::builder(ring_name()).pinned(&ctx).open().unwrap();
            let rx = ch.receiver().unwrap();
            let (scratch, dst) = (device_buffer(BYTES), device_buffer(BYTES));
            let mut host = vec![0u32; WORDS];
            let mut overwritten = 0;
            let mut allocs = 0;
            let mut queued_at_release = 0;
            for seq in 0..MESSAGES {
                if seq == 2 {
                    allocs = allocations();
                }
                let m = rx.recv_timeout(LIMIT).unwrap();
                assert_eq!((m.tag(), m.len()), (seq, BYTES));
                assert!(m.is_pinned(), "the receiver pins the pool on first sight");
                slow_work(scratch, PASSES, &stream);
                if seq % 2 == 1 {
                    // Control: the same copy, and the slot back at once.
                    // SAFETY: `dst` holds BYTES; the slot is read in stream order (and
                    // may be overwritten meanwhile: that is the point).
                    let r = unsafe {
                        sys::cuMemcpyHtoDAsync_v2(dst, m.as_ptr().cast(), BYTES, stream.cu_stream())
                    };
                    r.result().unwrap();
                    drop(m);
                } else {
                    // SAFETY: `dst` holds BYTES and lives until the process exits.
                    unsafe { m.copy_to_device_on(dst, &stream) }.unwrap();
                    // SAFETY: our live stream.
                    let busy = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
                    queued_at_release += u32::from(busy == sys::CUresult::CUDA_ERROR_NOT_READY);
                }
                // Read the device copy back (outside the counted steady state's purpose:
                // `host` is preallocated).
                // SAFETY: `dst` holds WORDS words; `host` lives past the synchronize.
                unsafe { result::memcpy_dtoh_async(&mut host, dst, stream.cu_stream()) }.unwrap();
                stream.synchronize().unwrap();
                if seq % 2 == 1 {
                    overwritten += u32::from(host.iter().any(|&w| w != value(seq)));
                } else {
                    let bad = host.iter().position(|&w| w != value(seq));
                    assert_eq!(bad, None, "message {seq}: the slot was overwritten under the copy");
                }
            }
            let n = allocations() - allocs;
            assert_eq!(n, 0, "{n} heap allocations in the receiver's steady state");
            assert_counting();
            assert!(overwritten > 0, "the control never saw the overwrite: the test is blind");
            eprintln!("control copies saw the overwrite in {overwritten} of {}", MESSAGES / 2);
            // The slow work queued before each copy takes milliseconds: a release that
            // waited for the stream would never return with it still busy.
            assert!(queued_at_release > 0, "copy_to_device_on waited for its copy");
            assert_eq!(rx.pin_error(), None);
            assert_eq!(cuda::host_registrations(), 1, "one registration for the one pool");
            drop(rx);
            assert_eq!(cuda::host_registered(), 0, "the mapping's registration goes with it");
        }
        Some("sender") => {
            let ch = Channel::builder(ring_name()).open().unwrap();
            let tx = ch.sender().unwrap();
            if broadcast {
                wait_for_a_reader(&ring_name());
            }
            let meta = TensorMeta::contiguous(DType::U32, &[WORDS as u64]).unwrap();
            // One more lease after the last message: its overwrite races the last control.
            for seq in 0..=MESSAGES {
                let mut lease = tx.acquire_timeout(LIMIT).unwrap();
                lease.set_tag(seq);
                let bytes = value(seq).to_le_bytes();
                for w in lease[..BYTES].chunks_exact_mut(4) {
                    w.copy_from_slice(&bytes);
                }
                if seq < MESSAGES {
                    tx.send_timeout(lease, meta, LIMIT).unwrap();
                }
            }
            assert_eq!(cuda::host_registrations(), 0, "a CPU-only sender touches no CUDA");
        }
        _ => run_pair_of(test, "pinned-c2g", 1, broadcast),
    }
}

/// Registration is per pool mapping, not per message: a pinned sender registers its pool
/// on create, a pinned receiver in the same process its own mapping of it on first sight,
/// and nothing more over 200 messages; a channel opened without `pinned` registers
/// nothing; every registration goes with its mapping.
#[test]
#[ignore = "needs an NVIDIA GPU (run by .gpu/run.sh on the GPU machine)"]
fn pinned_registration_once_per_pool_mapping() {
    if role().as_deref() != Some("child") {
        let mut child = [spawn("pinned_registration_once_per_pool_mapping", "child", "-", &[])];
        wait_all(&mut child, WATCHDOG);
        return;
    }
    let (ctx, stream) = setup();
    let plain = unique_name("pinned-plain");
    let ch = Channel::builder(&plain).slots(2, 4096).create().unwrap();
    let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    let lease = tx.acquire().unwrap();
    tx.send(lease, TensorMeta::bytes(8)).unwrap();
    let m = rx.recv().unwrap();
    // A `Channel<Host>`: its endpoints have no CUDA side to ask.
    drop((m, tx, rx, ch));
    assert_eq!(cuda::host_registrations(), 0, "without `pinned` nothing is registered");

    let name = unique_name("pinned-once");
    let ch = Channel::builder(&name).slots(4, 1 << 20).pinned(&ctx).create().unwrap();
    let tx = ch.sender().unwrap();
    assert_eq!(cuda::host_registrations(), 1, "the sender's pool, on create");
    let rx = ch.receiver().unwrap();
    assert_eq!(cuda::host_registrations(), 1, "a receiver registers on first sight, not before");
    let src = device_buffer(1 << 20);
    let dst = device_buffer(1 << 20);
    for seq in 0..200u64 {
        memset(src, value(seq), (1 << 20) / 4, &stream);
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        let meta = TensorMeta::bytes(1 << 20);
        // SAFETY: `src` holds 1 MiB and lives until the process exits.
        unsafe { tx.send_from_device_on(lease, src, meta, &stream) }.unwrap();
        let m = rx.recv_timeout(LIMIT).unwrap();
        assert!(m.is_pinned());
        assert!(words(&m).all(|w| w == value(seq)), "message {seq}");
        // SAFETY: `dst` holds 1 MiB and lives until the process exits.
        unsafe { m.copy_to_device_on(dst, &stream) }.unwrap();
    }
    assert_eq!(
        (cuda::host_registrations(), cuda::host_registered()),
        (2, 2),
        "one registration per pool mapping (the sender's and the receiver's), not per message"
    );
    stream.synchronize().unwrap();
    drop((tx, rx));
    assert_eq!(cuda::host_registered(), 0, "each registration goes with its mapping");
    drop(ch);
}
