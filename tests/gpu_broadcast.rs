//! Broadcast channels with device slots: four receiver processes on one GPU read every
//! message after its (slow) write, and the sender reuses a slot only after every receiver's
//! (slow) reads of it. Ignored without a GPU; `bash .gpu/run.sh` runs them there.
#![cfg(all(feature = "cuda", not(loom)))]

mod common;

use std::time::Duration;

use common::gpu::{copy, memset, read_words, setup, value};
use common::{Peer, ring_name, role, unique_name};
use cudarc::driver::{result, sys};
use gpuring::cuda::CudaStream;
use gpuring::{Channel, GpuReady, TensorMeta};

const LIMIT: Duration = Duration::from_secs(20);
const MESSAGES: u64 = 60;
const BYTES: usize = 8 << 20;
const WORDS: usize = BYTES / 4;
const RECEIVERS: usize = 4;

fn read_word(ptr: sys::CUdeviceptr, stream: &CudaStream) -> u32 {
    let mut out = [0u32; 1];
    read_words(ptr, &mut out, stream);
    out[0]
}

#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_broadcast_to_four_receivers_orders_reads_after_writes_and_reuse_after_reads() {
    broadcast(
        "gpu_broadcast_to_four_receivers_orders_reads_after_writes_and_reuse_after_reads",
        GpuReady::Event,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_host_flags_broadcast_to_four_receivers() {
    broadcast("gpu_host_flags_broadcast_to_four_receivers", GpuReady::HostFlag);
}

/// The sender writes each message slowly (many queued memsets, the last one writing the
/// value) into one of two slots; each receiver reads the last word on another stream first
/// (the control: outside the protocol, it races the write), then, in its own stream's
/// order, copies the whole slot many times (slow reads) and its last word, then drops the
/// message, which returns with those reads still queued: that word must be the message's
/// value (read after the write, and before the sender's next write of the slot, which
/// waits for every receiver's hold to go, each after its receiver's reads).
fn broadcast(test: &str, ready: GpuReady) {
    const PASSES: u32 = 512;
    const READS: u32 = 64;
    if role().as_deref() == Some("receiver") {
        let (ctx, stream) = setup();
        let unordered = ctx.new_stream().unwrap();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        let rx = ch.receiver().unwrap();
        common::announce("ready");
        // SAFETY: plain device allocations for the test's copies.
        let scratch = unsafe { result::malloc_sync(BYTES) }.unwrap();
        // SAFETY: as above.
        let last = unsafe { result::malloc_sync(4) }.unwrap();
        let (mut stale, mut queued_at_drop) = (0, 0);
        for seq in 0..MESSAGES {
            let m = rx.recv_timeout(LIMIT).unwrap();
            assert_eq!(m.seq(), seq, "every message once, in order");
            let end = m.device_ptr() + (WORDS as u64 - 1) * 4;
            stale += u32::from(read_word(end, &unordered) != value(seq));
            for _ in 0..READS {
                copy(scratch, m.device_ptr(), BYTES, &stream);
            }
            copy(last, end, 4, &stream);
            // The drop does not wait for the reads above: this receiver's hold goes once
            // they are done (then the slot may go back).
            drop(m);
            // SAFETY: our live stream.
            let busy = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
            queued_at_drop += u32::from(busy == sys::CUresult::CUDA_ERROR_NOT_READY);
            assert_eq!(read_word(last, &stream), value(seq), "message {seq}: read out of order");
        }
        eprintln!("unordered control read a stale value in {stale} of {MESSAGES} messages");
        eprintln!("reads still queued after the drop: {queued_at_drop} of {MESSAGES} messages");
        // 64 copies of 8 MB take a GPU ~0.2 ms or more: a drop that waited for them (as it
        // did before holds were given up by a lane) would always find the stream idle.
        assert!(queued_at_drop > MESSAGES as u32 / 2, "drops waited for their reads");
        if std::env::var("GPURING_TEST_FLAGS").is_ok() {
            assert_eq!(stale, 0, "a flag-signalled message handed out before its write");
        }
        return;
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-bcast");
    let ch = Channel::builder(&name).broadcast().slots(2, BYTES as u64).cuda(&stream).ready(ready);
    let ch = ch.create().unwrap();
    let tx = ch.sender().unwrap();
    let env: Vec<(&str, String)> = if ready == GpuReady::HostFlag {
        vec![("GPURING_TEST_FLAGS", String::new())]
    } else {
        vec![]
    };
    let mut peers: Vec<_> =
        (0..RECEIVERS).map(|_| Peer::spawn_with(test, "receiver", &name, &env)).collect();
    // Each announces `ready` once attached: all are there before the first send (one that
    // came later would start later).
    for p in &mut peers {
        p.expect("ready");
    }
    for seq in 0..MESSAGES {
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        for pass in 0..PASSES {
            memset(lease.device_ptr(), pass, WORDS, &stream);
        }
        memset(lease.device_ptr(), value(seq), WORDS, &stream);
        tx.send_timeout(lease, TensorMeta::bytes(BYTES as u64), LIMIT).unwrap();
    }
    for p in &mut peers {
        assert!(p.child.wait().unwrap().success(), "a receiver failed");
    }
}

/// A lagging broadcast channel with device slots: the sender never waits for the slow
/// receiver (it sleeps holding each message); each receiver reads every message it gets
/// in stream order after its (slow) write, whole, with the value of that message (the
/// sender never rewrites a slot a receiver holds), gets them in order, and is told how
/// many it missed: received + missed = sent, the last one always received.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_lagging_broadcast_never_rewrites_a_held_slot() {
    const TEST: &str = "gpu_lagging_broadcast_never_rewrites_a_held_slot";
    const PASSES: u32 = 64;
    const READS: u32 = 16;
    if let Some(r) = role() {
        let (_ctx, stream) = setup();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        assert!(ch.is_lagging());
        let rx = ch.receiver().unwrap();
        common::announce("ready");
        // SAFETY: plain device allocations for the test's copies.
        let scratch = unsafe { result::malloc_sync(BYTES) }.unwrap();
        // SAFETY: as above.
        let ends = unsafe { result::malloc_sync(8) }.unwrap();
        let (mut received, mut missed, mut last) = (0u64, 0u64, None::<u64>);
        while last != Some(MESSAGES - 1) {
            let m = match rx.recv_timeout(LIMIT) {
                Ok(m) => m,
                Err(gpuring::RecvTimeoutError::Lagged(n)) => {
                    missed += n;
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let seq = m.seq();
            assert!(last.is_none_or(|l| seq > l), "in order: {seq} after {last:?}");
            for _ in 0..READS {
                copy(scratch, m.device_ptr(), BYTES, &stream);
            }
            if r == "slow" {
                std::thread::sleep(Duration::from_millis(5)); // holding it
            }
            // The first and last words, read in order after the slow reads.
            copy(ends, m.device_ptr(), 4, &stream);
            copy(ends + 4, m.device_ptr() + (WORDS as u64 - 1) * 4, 4, &stream);
            let mut got = [0u32; 2];
            read_words(ends, &mut got, &stream);
            drop(m);
            assert_eq!(got, [value(seq); 2], "message {seq}: rewritten or read early");
            (received, last) = (received + 1, Some(seq));
        }
        assert_eq!(received + missed, MESSAGES, "received {received}, missed {missed}");
        eprintln!("{r} receiver: {received} received, {missed} missed");
        return common::announce(&format!("got {received} {missed}"));
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-lag");
    let ch = Channel::builder(&name).broadcast().lagging(true).slots(3, BYTES as u64);
    let ch = ch.cuda(&stream).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peers = [Peer::spawn(TEST, "slow", &name), Peer::spawn(TEST, "quick", &name)];
    for p in &mut peers {
        p.expect("ready");
    }
    for seq in 0..MESSAGES {
        // Never a wait for the slow receiver: at most one slot is held by each receiver.
        let lease = tx.try_acquire().unwrap_or_else(|e| panic!("message {seq}: {e}"));
        for pass in 0..PASSES {
            memset(lease.device_ptr(), pass, WORDS, &stream);
        }
        memset(lease.device_ptr(), value(seq), WORDS, &stream);
        tx.send_timeout(lease, TensorMeta::bytes(BYTES as u64), LIMIT).unwrap();
    }
    let slow = peers[0].expect("got");
    assert!(slow.split(' ').nth(1).unwrap() != "0", "the slow receiver missed some: {slow}");
    for p in &mut peers {
        assert!(p.child.wait().unwrap().success(), "a receiver failed");
    }
}
