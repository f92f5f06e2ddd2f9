//! GPU channels between processes: device slots handed off in stream order.
//!
//! Every test that needs a GPU is `#[ignore]`d, so `cargo test --features cuda` on a
//! machine without one lists them as ignored (visibly skipped). On the GPU machine
//! `bash .gpu/run.sh` (from `../shared/tools/gpu-stage`) runs them with
//! `--include-ignored`. `cuda_absent_is_a_typed_error` runs everywhere.
#![cfg(all(feature = "cuda", not(loom)))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::counting::{allocations, assert_counting};
use common::gpu::{copy, hold, memset, read_words, setup, value};
use common::{Peer, announce, die, ring_name, role, spawn, unique_name, wait_all};
use cudarc::driver::{result, sys};
use gpuring::cuda::{self, CudaStream};
use gpuring::{
    Channel, ChannelError, Cuda, CudaError, GpuReady, Message, PoolState, TensorMeta, WaitPolicy,
};

#[global_allocator]
static GLOBAL: common::counting::Counting = common::counting::Counting;

const LIMIT: Duration = Duration::from_secs(20);
const WATCHDOG: Duration = Duration::from_secs(120);

#[test]
fn cuda_absent_is_a_typed_error() {
    match cuda::context(0) {
        Ok(_) => assert!(cuda::available(), "a context implies a driver"),
        Err(e) => {
            assert!(!cuda::available(), "no context although a driver is present: {e}");
            assert_eq!(e, CudaError::Unavailable);
        }
    }
}

/// Host and GPU ends cannot mix: a host call on a GPU end does not compile (the backend is
/// a type; see the `compile_fail` example on `gpuring::Backend`), and opening a channel
/// with the other backend's builder is refused at `open`, saying why.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn host_and_gpu_channels_do_not_mix() {
    let (_, stream) = setup();
    let name = unique_name("gpu-mix");
    let ch = Channel::builder(&name).slots(2, 4096).cuda(&stream).create().unwrap();
    let tx = ch.sender().unwrap();
    let lease = tx.acquire().unwrap();
    assert_eq!((lease.capacity(), lease.device_ptr() % 256), (4096, 0));
    drop(lease);
    assert_eq!(tx.free_slots(), 2);
    // Opened without a context: refused at open, not at the first call.
    let wrong = |e| matches!(e, Err(ChannelError::WrongBackend { channel: "cuda", asked: "host" }));
    assert!(wrong(Channel::builder(&name).open().map(drop)));
    // And a host channel opened as a GPU one.
    let host_name = unique_name("gpu-host");
    let _host = Channel::builder(&host_name).slots(1, 64).create().unwrap();
    let opened = Channel::builder(&host_name).cuda(&stream).open().map(drop);
    assert!(matches!(opened, Err(ChannelError::WrongBackend { channel: "host", asked: "cuda" })));
}

/// Sender and receiver in one process (threads, a test, a Python program that does
/// both): CUDA does not open a process's own IPC handles (`cuIpcOpenMemHandle` fails with
/// `CUDA_ERROR_INVALID_CONTEXT`, seen on the H100 from the Python package's tests), so the
/// receiver uses the pool itself: nothing is opened, the values and the stream order are
/// the same.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_receiver_in_the_senders_own_process() {
    same_process(GpuReady::Event);
}

#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_host_flags_receiver_in_the_senders_own_process() {
    same_process(GpuReady::HostFlag);
}

fn same_process(ready: GpuReady) {
    let (_, stream) = setup();
    let name = unique_name("gpu-same-process");
    let ch = Channel::builder(&name).slots(2, 4096).cuda(&stream).ready(ready).create().unwrap();
    let (tx, rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    let opens = cuda::ipc_opens();
    for seq in 0..10u64 {
        let mut lease = tx.acquire().unwrap();
        memset(lease.device_ptr(), value(seq), 1024, &stream);
        // A GPU slot's header is host memory: written and read by the CPUs.
        lease.set_header(&seq.to_le_bytes()[..(seq as usize % 9)]).unwrap();
        tx.send(lease, TensorMeta::bytes(4096)).unwrap();
        let msg: Message<Cuda> = rx.recv_timeout(LIMIT).unwrap();
        let mut words = [0u32; 2];
        read_words(msg.device_ptr(), &mut words, &stream);
        assert_eq!(words, [value(seq); 2], "message {seq}");
        assert_eq!(msg.header(), &seq.to_le_bytes()[..(seq as usize % 9)], "header {seq}");
    }
    assert_eq!(cuda::ipc_opens(), opens, "nothing opened for the process's own pool");
}

/// The async GPU forms across processes: the sender's task leases with `acquire_async`
/// (2 slots, so it waits for returns) and sends with `send_async` under `futures`'
/// executor; the receiver's task receives with `recv_async` under tokio; every
/// message's words checked in stream order.
#[test]
#[cfg(feature = "async")]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_async_forms_between_processes() {
    const N: u64 = 2_000;
    if role().as_deref() == Some("receiver") {
        let (_, stream) = setup();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        let mut rx = ch.receiver().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut words = [0u32; 2];
            for seq in 0..N {
                let msg = rx.recv_async().await.unwrap();
                assert_eq!(msg.seq(), seq);
                read_words(msg.device_ptr(), &mut words, &stream);
                assert_eq!(words, [value(seq); 2], "message {seq}");
            }
            assert!(matches!(rx.recv_async().await, Err(gpuring::RecvError::Disconnected)));
        });
        return;
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-async");
    let ch = Channel::builder(&name).capacity(4).slots(2, 4096).cuda(&stream).create().unwrap();
    let mut tx = ch.sender().unwrap();
    let mut peer = [spawn("gpu_async_forms_between_processes", "receiver", &name, &[])];
    futures::executor::block_on(async {
        for seq in 0..N {
            let lease = tx.acquire_async().await.unwrap();
            memset(lease.device_ptr(), value(seq), 1024, &stream);
            tx.send_async(lease, TensorMeta::bytes(4096)).await.unwrap();
        }
    });
    drop(tx);
    wait_all(&mut peer, WATCHDOG);
}

/// `select` over two GPU channels: takes each message from the receiver whose sender
/// sent it, onto the given stream (words checked), then `Disconnected` per receiver.
#[test]
#[cfg(feature = "async")]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_select_over_two_channels() {
    let (_, stream) = setup();
    let names = [unique_name("gpu-sel-a"), unique_name("gpu-sel-b")];
    let chans = names.map(|n| Channel::builder(n).slots(4, 4096).cuda(&stream).create().unwrap());
    let mut rxs = [chans[0].receiver().unwrap(), chans[1].receiver().unwrap()];
    let txs = [chans[0].sender().unwrap(), chans[1].sender().unwrap()];
    let mut live: Vec<_> = rxs.iter_mut().collect();
    let mut ids = vec![0usize, 1];
    let mut got = [0u64; 2];
    for round in 0..20u64 {
        let c = (round % 2) as usize;
        let lease = txs[c].acquire().unwrap();
        memset(lease.device_ptr(), value(round * 2 + c as u64), 1024, &stream);
        txs[c].send(lease, TensorMeta::bytes(4096)).unwrap();
        let (i, msg) = gpuring::select(&mut live);
        let msg = msg.unwrap();
        assert_eq!(ids[i], c, "taken from the channel it was sent on");
        let mut words = [0u32; 2];
        read_words(msg.device_ptr(), &mut words, &stream);
        assert_eq!(words, [value(round * 2 + c as u64); 2]);
        got[c] += 1;
    }
    drop(txs);
    while !live.is_empty() {
        let (i, r) = gpuring::select(&mut live);
        assert!(matches!(r, Err(gpuring::RecvError::Disconnected)), "{r:?}");
        live.remove(i);
        ids.remove(i);
    }
    assert_eq!(got, [10, 10]);
}

/// 100,000 messages: the producer writes seq-dependent words into each slot with
/// `cuMemsetD32Async` on its stream; the receiver copies the first and last word back
/// after its wait and checks them. After warm-up: no IPC handle opened, no allocation.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_100k_messages_between_processes() {
    hundred_k("gpu_100k_messages_between_processes", GpuReady::Event);
}

/// As `gpu_100k_messages_between_processes`, from a sender that signals by host ready
/// flags (the receiver follows the pool; its steady state allocates nothing either).
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_100k_messages_with_host_flags() {
    hundred_k("gpu_100k_messages_with_host_flags", GpuReady::HostFlag);
}

fn hundred_k(test: &str, ready: GpuReady) {
    const N: u64 = 100_000;
    const BYTES: usize = 64 << 10;
    const WORDS: usize = BYTES / 4;
    if role().as_deref() == Some("receiver") {
        let (_, stream) = setup();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        let rx = ch.receiver().unwrap();
        let mut words = [0u32; 1];
        let check = |m: &Message<Cuda>, seq: u64, words: &mut [u32; 1]| {
            assert_eq!((m.seq(), m.len()), (seq, BYTES));
            for at in [0, WORDS - 1] {
                read_words(m.device_ptr() + at as u64 * 4, words, &stream);
                assert_eq!(words[0], value(seq), "seq {seq} word {at}");
            }
        };
        let m = rx.recv_timeout(LIMIT).unwrap();
        check(&m, 0, &mut words);
        {
            // The cudarc view: a borrowed slice of the payload, dropped without freeing.
            let view = m.view::<u32>();
            assert_eq!(view.len(), WORDS);
            let mut host = vec![0u32; WORDS];
            stream.memcpy_dtoh(&*view, &mut host).unwrap();
            stream.synchronize().unwrap();
            assert!(host.iter().all(|&w| w == value(0)), "the view reads the payload");
        }
        drop(m);
        let (opens, allocs) = (cuda::ipc_opens(), allocations());
        assert_eq!(opens, 1 + 2 * 8, "one memory handle and two events per slot, once");
        for seq in 1..N {
            let m = rx.recv_timeout(LIMIT).unwrap();
            check(&m, seq, &mut words);
        }
        assert_eq!(cuda::ipc_opens(), opens, "an IPC handle opened after warm-up");
        let n = allocations() - allocs;
        assert_eq!(n, 0, "{n} heap allocations in the receiver's steady state");
        return;
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-100k");
    let ch = Channel::builder(&name).capacity(64).slots(8, BYTES as u64).cuda(&stream);
    let ch = ch.ready(ready).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peer = [spawn(test, "receiver", &name, &[])];
    let meta = TensorMeta::contiguous(gpuring::DType::U32, &[WORDS as u64]).unwrap();
    let send = |seq: u64| {
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        memset(lease.device_ptr(), value(seq), WORDS, &stream);
        tx.send_timeout(lease, meta, LIMIT).unwrap();
    };
    send(0);
    let allocs = allocations();
    for seq in 1..N {
        send(seq);
    }
    let n = allocations() - allocs;
    assert_eq!(n, 0, "{n} heap allocations in the sender's steady state");
    assert_counting();
    assert_eq!(cuda::ipc_opens(), 0, "the exporting process never opens its own handles");
    wait_all(&mut peer, WATCHDOG);
}

/// The producer's write is slow (many queued memsets, the last one writing the value) and
/// the receiver reads at once after `recv`: in stream order it sees the final value.
/// The same read on a second stream, which does not wait on the ready event, must see an
/// older value at least once, or the test could not tell ordered from unordered.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_receiver_reads_after_a_slow_write() {
    slow_write("gpu_receiver_reads_after_a_slow_write", GpuReady::Event);
}

/// As `gpu_receiver_reads_after_a_slow_write`, from a sender that signals by host ready
/// flags: `recv` returns once the writes are done, so the read on the second stream,
/// ordered after nothing, sees the final value too, every time (with events it raced).
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_host_flags_receiver_reads_after_a_slow_write() {
    slow_write("gpu_host_flags_receiver_reads_after_a_slow_write", GpuReady::HostFlag);
}

fn slow_write(test: &str, ready: GpuReady) {
    const MESSAGES: u64 = 100;
    const BYTES: usize = 8 << 20;
    const WORDS: usize = BYTES / 4;
    const PASSES: u32 = 1024;
    if role().as_deref() == Some("receiver") {
        let (ctx, stream) = setup();
        let unordered = ctx.new_stream().unwrap();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        let rx = ch.receiver().unwrap();
        let (mut ordered_word, mut raced_word) = ([0u32; 1], [0u32; 1]);
        let mut stale = 0;
        for seq in 0..MESSAGES {
            let m = rx.recv_timeout(LIMIT).unwrap();
            let last = m.device_ptr() + (WORDS as u64 - 1) * 4;
            read_words(last, &mut raced_word, &unordered);
            read_words(last, &mut ordered_word, &stream);
            assert_eq!(ordered_word[0], value(seq), "message {seq} read before its write");
            stale += u32::from(raced_word[0] != value(seq));
        }
        if std::env::var("GPURING_TEST_FLAGS").is_ok() {
            assert_eq!(
                stale, 0,
                "a flag-signalled message read on another stream before its write"
            );
            return;
        }
        assert!(stale > 0, "the unordered control never raced: the test cannot see ordering");
        eprintln!("unordered control read a stale value in {stale} of {MESSAGES} messages");
        return;
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-slow");
    // MPMC here (the other tests are SPSC); the receiver opens without naming the flavor.
    let ch = Channel::builder(&name).mpmc().slots(4, BYTES as u64).cuda(&stream).ready(ready);
    let tx = ch.create().unwrap().sender().unwrap();
    let env: &[(&str, String)] =
        if ready == GpuReady::HostFlag { &[("GPURING_TEST_FLAGS", String::new())] } else { &[] };
    let mut peer = [spawn(test, "receiver", &name, env)];
    for seq in 0..MESSAGES {
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        for pass in 0..PASSES {
            memset(lease.device_ptr(), pass, WORDS, &stream);
        }
        memset(lease.device_ptr(), value(seq), WORDS, &stream);
        tx.send_timeout(lease, TensorMeta::bytes(BYTES as u64), LIMIT).unwrap();
    }
    wait_all(&mut peer, WATCHDOG);
}

/// One slot. The receiver holds it under slow reads (many queued copies of the slot),
/// then copies it a last time and drops the message; the producer immediately leases the
/// slot again and overwrites it. The receiver's last copy must hold the old value: the
/// producer's write waited for the release event. A control message read *after* its
/// drop (outside the protocol) must see the overwrite at least once.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_slot_reuse_waits_for_the_receivers_reads() {
    slot_reuse("gpu_slot_reuse_waits_for_the_receivers_reads", GpuReady::Event);
}

/// As `gpu_slot_reuse_waits_for_the_receivers_reads`, from a sender that signals by host
/// ready flags (the release side is the same event, recorded unless the stream is idle).
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_host_flags_slot_reuse_waits_for_the_receivers_reads() {
    slot_reuse("gpu_host_flags_slot_reuse_waits_for_the_receivers_reads", GpuReady::HostFlag);
}

fn slot_reuse(test: &str, ready: GpuReady) {
    const ROUNDS: u64 = 40;
    const BYTES: usize = 8 << 20;
    const WORDS: usize = BYTES / 4;
    const READS: u32 = 2048;
    if role().as_deref() == Some("receiver") {
        let (_, stream) = setup();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        let rx = ch.receiver().unwrap();
        // SAFETY: plain device allocations for the test's copies.
        let scratch = unsafe { result::malloc_sync(BYTES) }.unwrap();
        // SAFETY: as above.
        let last = unsafe { result::malloc_sync(4) }.unwrap();
        let mut word = [0u32; 1];
        let mut overwritten = 0;
        for round in 0..ROUNDS {
            let m = rx.recv_timeout(LIMIT).unwrap();
            let src = m.device_ptr() + (WORDS as u64 - 1) * 4;
            let control = round % 2 == 1;
            if control {
                // Outside the protocol: release first, read after.
                drop(m);
                slow_reads(scratch, src - (WORDS as u64 - 1) * 4, READS, &stream);
                copy(last, src, 4, &stream);
                read_words(last, &mut word, &stream);
                overwritten += u32::from(word[0] != value(round));
            } else {
                slow_reads(scratch, m.device_ptr(), READS, &stream);
                copy(last, src, 4, &stream);
                drop(m); // release recorded after the reads above
                read_words(last, &mut word, &stream);
                assert_eq!(word[0], value(round), "round {round}: slot overwritten under a read");
            }
        }
        assert!(overwritten > 0, "the control never saw the overwrite: the test is blind");
        eprintln!("control read the overwritten slot in {overwritten} of {} rounds", ROUNDS / 2);
        return;
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-reuse");
    let ch = Channel::builder(&name).slots(1, BYTES as u64).cuda(&stream).ready(ready);
    let tx = ch.create().unwrap().sender().unwrap();
    let mut peer = [spawn(test, "receiver", &name, &[])];
    for round in 0..ROUNDS {
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        memset(lease.device_ptr(), value(round), WORDS, &stream);
        tx.send_timeout(lease, TensorMeta::bytes(BYTES as u64), LIMIT).unwrap();
        // The next round's lease: its overwrite is what the receiver must not see.
    }
    // A last lease and overwrite, so the final round has a write to race with.
    let lease = tx.acquire_timeout(LIMIT).unwrap();
    memset(lease.device_ptr(), 0xDEAD, WORDS, &stream);
    drop(lease);
    wait_all(&mut peer, WATCHDOG);
}

/// A message given back (`Receiver::requeue`) after its receiver queued slow reads of it
/// on its stream: the requeue waits for those reads, so the receiver that takes it over
/// (on another stream), its release and the sender's next write of the slot all come
/// after them: the word the giver read last is the sender's. The giver's stream is held
/// back 100 ms before its reads (a host function), so they surely run after whatever the
/// host does next unless something orders it after them. Control, every other round: the
/// same reads queued after the message was dropped see the next write (at least once, else
/// the test is blind). One process, three streams, two handles of one MPMC channel.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_a_requeued_message_waits_for_its_givers_reads() {
    const ROUNDS: u64 = 12;
    const BYTES: usize = 8 << 20;
    const WORDS: usize = BYTES / 4;
    let (ctx, stream) = setup();
    let (sa, sb) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let name = unique_name("gpu-requeue");
    let b = Channel::builder(&name).mpmc().slots(1, BYTES as u64).cuda(&stream);
    let ch = b.create().unwrap();
    let tx = ch.sender().unwrap();
    let (ch_a, ch_b) = (
        Channel::builder(&name).cuda(&sa).open().unwrap(),
        Channel::builder(&name).cuda(&sb).open().unwrap(),
    );
    let (a, b) = (ch_a.receiver().unwrap(), ch_b.receiver().unwrap());
    // SAFETY: plain device allocations for the test's copies.
    let scratch = unsafe { result::malloc_sync(BYTES) }.unwrap();
    // SAFETY: as above.
    let last = unsafe { result::malloc_sync(4) }.unwrap();
    let mut word = [0u32; 1];
    let mut overwritten = 0;
    for round in 0..ROUNDS {
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        memset(lease.device_ptr(), value(round), WORDS, &stream);
        tx.send_timeout(lease, TensorMeta::bytes(BYTES as u64), LIMIT).unwrap();
        let m = a.recv_timeout(LIMIT).unwrap();
        let src = m.device_ptr();
        let control = round % 2 == 1;
        // The control's message is released first, outside the protocol, and read after.
        let m = if control {
            drop(m);
            None
        } else {
            Some(m)
        };
        hold(&sa, 100);
        slow_reads(scratch, src, 64, &sa);
        copy(last, src + (WORDS as u64 - 1) * 4, 4, &sa);
        if let Some(m) = m {
            a.requeue(m).unwrap();
            let again = b.recv_timeout(LIMIT).unwrap();
            assert!(again.redelivered(), "round {round}: taken over from the giver");
            drop(again); // released after b's reads: none
        }
        // The sender's next write of the slot, then the giver's last read of it.
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        memset(lease.device_ptr(), 0xDEAD, WORDS, &stream);
        drop(lease);
        read_words(last, &mut word, &sa);
        if control {
            overwritten += u32::from(word[0] != value(round));
        } else {
            assert_eq!(word[0], value(round), "round {round}: written under the giver's reads");
        }
    }
    assert!(overwritten > 0, "the control never saw the overwrite: the test is blind");
    eprintln!("control read the overwritten slot in {overwritten} of {} rounds", ROUNDS / 2);
}

fn slow_reads(scratch: sys::CUdeviceptr, slot: sys::CUdeviceptr, n: u32, stream: &CudaStream) {
    for _ in 0..n {
        copy(scratch, slot, 8 << 20, stream);
    }
}

/// The receiver's context is on the machine's last device, the sender's on device 0: on a
/// single-GPU machine both are device 0 (the same-device path); on several, the receiver
/// imports a pool on another device through peer access.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_receiver_on_the_last_device() {
    const N: u64 = 2_000;
    if role().as_deref() == Some("receiver") {
        assert!(cuda::available(), "a CUDA driver");
        let last = result::device::get_count().unwrap() as usize - 1;
        let ctx = cuda::context(last).unwrap();
        let stream = ctx.new_stream().unwrap();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        let rx = ch.receiver().unwrap();
        let mut w = [0u32; 1];
        for seq in 0..N {
            let m = rx.recv_timeout(LIMIT).unwrap();
            read_words(m.device_ptr() + 4096 - 4, &mut w, &stream);
            assert_eq!(w[0], value(seq), "seq {seq}");
        }
        eprintln!("receiver on device {last} of {}: {N} messages checked", last + 1);
        return;
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-dev");
    let ch = Channel::builder(&name).slots(4, 4096).cuda(&stream).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peer = [spawn("gpu_receiver_on_the_last_device", "receiver", &name, &[])];
    for seq in 0..N {
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        memset(lease.device_ptr(), value(seq), 1024, &stream);
        tx.send_timeout(lease, TensorMeta::bytes(4096), LIMIT).unwrap();
    }
    wait_all(&mut peer, WATCHDOG);
}

/// A GPU receiver killed while holding two messages: once its process has exited (so the
/// driver has torn its context down), the sender's blocking acquire takes the two device
/// slots back, and every slot can be leased again (a channel without redelivery; with it,
/// see `gpu_messages_held_by_a_killed_receiver_are_redelivered`).
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_slots_of_a_killed_receiver_are_reclaimed() {
    if role().as_deref() == Some("holder") {
        let (_, stream) = setup();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        let rx = ch.receiver().unwrap();
        let held: Vec<_> = (0..2).map(|_| rx.recv_timeout(LIMIT).unwrap()).collect();
        assert_eq!(held.len(), 2);
        announce("holding");
        die();
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-reclaim");
    let b = Channel::builder(&name).capacity(8).slots(4, 4096).redeliver(false);
    let ch = b.cuda(&stream).create().unwrap();
    let tx = ch.sender().unwrap();
    let mut peer = Peer::spawn("gpu_slots_of_a_killed_receiver_are_reclaimed", "holder", &name);
    for seq in 0..2 {
        let lease = tx.acquire_timeout(LIMIT).unwrap();
        memset(lease.device_ptr(), value(seq), 1024, &stream);
        tx.send_timeout(lease, TensorMeta::bytes(4096), LIMIT).unwrap();
    }
    peer.expect("holding");
    assert_eq!(tx.free_slots(), 2);
    peer.died(); // reaped: the process has exited
    let t = std::time::Instant::now();
    let leases: Vec<_> = (0..4).map(|_| tx.acquire_timeout(LIMIT).unwrap()).collect();
    assert!(t.elapsed() < Duration::from_millis(500), "reclaimed in {:?}", t.elapsed());
    drop(leases);
    assert_eq!(tx.free_slots(), 4, "every device slot is free again");
}

/// Device memory cannot outlive its process: a sender that sends four messages, of which
/// one is received, and exits gives the other three up (after 5 s), and the receiver gets
/// `SenderGone` for each, reading nothing, then `Disconnected`. The message received while
/// the sender is still there arrives as usual.
///
/// Both ends run in children: the test process only creates the channel, because the
/// sender of `gpu_100k_messages_between_processes`, running beside this test in the same
/// process, checks that its process never opens an IPC handle.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_messages_of_an_exited_sender_are_refused_unread() {
    const WORDS: usize = 1024;
    const TEST: &str = "gpu_messages_of_an_exited_sender_are_refused_unread";
    let gone_marker = |name: &str| std::env::temp_dir().join(format!("{name}.sender-gone"));
    match role().as_deref() {
        Some("sender") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let tx = ch.sender().unwrap();
            for seq in 0..4u64 {
                let lease = tx.acquire().unwrap();
                memset(lease.device_ptr(), value(seq), WORDS, &stream);
                tx.send(lease, TensorMeta::bytes((WORDS * 4) as u64)).unwrap();
            }
            announce("sent");
            // Dropping the sender waits up to 5 s for the messages in flight; the
            // receiver takes one, the other three are given up.
            return;
        }
        Some("receiver") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let rx = ch.receiver().unwrap();
            announce("ready");
            let first = rx.recv_timeout(LIMIT).unwrap();
            let mut words = [0u32; 2];
            read_words(first.device_ptr(), &mut words, &stream);
            assert_eq!(words, [value(0); 2], "a message read while its sender is there");
            drop(first);
            // The test process says when the sender has exited.
            common::wait_for("the sender's exit", LIMIT, || gone_marker(&ring_name()).exists());
            for seq in 1..4 {
                match rx.recv_timeout(LIMIT) {
                    Err(gpuring::RecvTimeoutError::SenderGone) => {}
                    other => panic!("message {seq}: expected SenderGone, got {other:?}"),
                }
            }
            assert!(matches!(rx.recv(), Err(gpuring::RecvError::Disconnected)));
            announce("refused");
            return;
        }
        _ => {}
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-gone");
    let _ch = Channel::builder(&name).slots(4, (WORDS * 4) as u64).cuda(&stream).create().unwrap();
    let mut receiver = Peer::spawn(TEST, "receiver", &name);
    receiver.expect("ready");
    let mut sender = Peer::spawn(TEST, "sender", &name);
    sender.expect("sent");
    assert!(sender.child.wait().unwrap().success(), "the sender exits cleanly");
    let marker = gone_marker(&name);
    std::fs::write(&marker, b"").unwrap();
    receiver.expect("refused");
    let status = receiver.child.wait().unwrap();
    let _ = std::fs::remove_file(&marker);
    assert!(status.success(), "the receiver's checks failed: {status}");
}

/// A GPU sender killed with messages queued takes its device memory with it. Once another
/// sender registers in the channel, which closes the dead sender's pool table entry and
/// retires its pool, a receiver refuses those messages with `SenderGone`, reading nothing,
/// and then gets the new sender's message. Before, it imported the dead pool and got
/// `RecvError::Device` (the IPC handle of a dead process does not open). All ends run in
/// children (see `gpu_messages_of_an_exited_sender_are_refused_unread`).
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_messages_of_a_killed_sender_are_refused_once_a_sender_replaces_it() {
    const WORDS: usize = 1024;
    const TEST: &str = "gpu_messages_of_a_killed_sender_are_refused_once_a_sender_replaces_it";
    let replaced = |name: &str| std::env::temp_dir().join(format!("{name}.replaced"));
    let send = |tx: &gpuring::Sender<Cuda>, stream: &Arc<CudaStream>, seq: u64| {
        let lease = tx.acquire().unwrap();
        memset(lease.device_ptr(), value(seq), WORDS, stream);
        tx.send(lease, TensorMeta::bytes((WORDS * 4) as u64)).unwrap();
    };
    match role().as_deref() {
        Some("victim") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let tx = ch.sender().unwrap();
            (0..3).for_each(|seq| send(&tx, &stream, seq));
            stream.synchronize().unwrap();
            die();
        }
        Some("replacement") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let tx = ch.sender().unwrap();
            send(&tx, &stream, 100);
            announce("sent");
            return; // the drop waits for the message to come back
        }
        Some("receiver") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let rx = ch.receiver().unwrap();
            announce("ready");
            common::wait_for("the replacement", LIMIT, || replaced(&ring_name()).exists());
            for seq in 0..3 {
                match rx.recv_timeout(LIMIT) {
                    Err(gpuring::RecvTimeoutError::SenderGone) => {}
                    other => panic!("message {seq}: expected SenderGone, got {other:?}"),
                }
            }
            // Refused without importing it, each message's slot given back: the pool drained.
            let dead = ch.pools().into_iter().find(|p| p.state == PoolState::Closed).unwrap();
            let path = std::path::Path::new("/dev/shm").join(&dead.name);
            assert!(!path.exists(), "the dead sender's pool {} is still there", dead.name);
            let m = rx.recv_timeout(LIMIT).unwrap();
            let mut words = [0u32; 2];
            read_words(m.device_ptr(), &mut words, &stream);
            assert_eq!(words, [value(100); 2], "the replacement's message");
            announce("refused");
            return;
        }
        _ => {}
    }
    let (_, stream) = setup();
    let name = unique_name("gpu-killed");
    let _ch = Channel::builder(&name).slots(4, (WORDS * 4) as u64).cuda(&stream).create().unwrap();
    let mut receiver = Peer::spawn(TEST, "receiver", &name);
    receiver.expect("ready");
    Peer::spawn(TEST, "victim", &name).died();
    let mut replacement = Peer::spawn(TEST, "replacement", &name);
    replacement.expect("sent");
    let marker = replaced(&name);
    std::fs::write(&marker, b"").unwrap();
    receiver.expect("refused");
    let status = receiver.child.wait().unwrap();
    let _ = std::fs::remove_file(&marker);
    assert!(status.success(), "the receiver's checks failed: {status}");
    assert!(replacement.child.wait().unwrap().success(), "the replacement exits cleanly");
}

/// A sender signalling by host ready flags dies after a send whose flag its stream never
/// wrote (the stream is held by a wait on a word nobody writes, so the flag's write is
/// queued behind it when the process goes). The receiver, which took the message while
/// the sender lived and is waiting for the flag, gets `SenderGone` (the message dropped
/// unread) instead of waiting for ever, then `PeerDead` (its only sender is dead); so does
/// one whose wait policy never sleeps (its flag wait spins without end, checking the
/// sender every so many spins). All ends run in children.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_host_flags_receiver_sees_its_senders_death() {
    const TEST: &str = "gpu_host_flags_receiver_sees_its_senders_death";
    match role().as_deref() {
        Some("sender") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).ready(GpuReady::HostFlag).open();
            let tx = ch.unwrap().sender().unwrap();
            // SAFETY: a plain device word, zeroed before the stream waits on it.
            let never = unsafe { result::malloc_sync(4) }.unwrap();
            memset(never, 0, 1, &stream);
            stream.synchronize().unwrap();
            let lease = tx.acquire().unwrap();
            let eq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
            // SAFETY: a live device word of ours and our live stream; the wait never ends
            // (nothing writes 1), which is the point.
            unsafe { sys::cuStreamWaitValue32_v2(stream.cu_stream(), never, 1, eq) }
                .result()
                .unwrap();
            memset(lease.device_ptr(), value(1), 1024, &stream);
            tx.send(lease, TensorMeta::bytes(4096)).unwrap();
            announce("sent");
            // The receiver takes the message and waits for its flag meanwhile.
            std::thread::sleep(Duration::from_millis(500));
            die();
        }
        Some(role @ ("receiver" | "receiver-spin")) => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let mut rx = ch.receiver().unwrap();
            if role == "receiver-spin" {
                // Never sleeps: the flag wait spins too, and must still see the death.
                rx.set_wait_policy(WaitPolicy::spin_then_sleep(u32::MAX, 0));
            }
            announce("ready");
            let started = std::time::Instant::now();
            match rx.recv_timeout(LIMIT) {
                Err(gpuring::RecvTimeoutError::SenderGone) => {}
                other => panic!("expected SenderGone, got {:?}", other.map(|m| m.seq())),
            }
            eprintln!("{role}: SenderGone after {:?}", started.elapsed());
            match rx.recv_timeout(LIMIT) {
                Err(gpuring::RecvTimeoutError::PeerDead) => {}
                other => panic!("expected PeerDead, got {:?}", other.map(|m| m.seq())),
            }
            announce("peer-dead");
            return;
        }
        _ => {}
    }
    let (_, stream) = setup();
    for role in ["receiver", "receiver-spin"] {
        let name = unique_name("gpu-flag-dead");
        let _ch = Channel::builder(&name).slots(2, 4096).cuda(&stream).create().unwrap();
        let mut receiver = Peer::spawn(TEST, role, &name);
        receiver.expect("ready");
        let mut sender = Peer::spawn(TEST, "sender", &name);
        sender.expect("sent");
        let _ = sender.child.wait();
        receiver.expect("peer-dead");
        let status = receiver.child.wait().unwrap();
        assert!(status.success(), "the {role}'s checks failed: {status}");
    }
}

/// A GPU sender SIGKILLed with 3 messages queued, whose pool the receiver had imported
/// (it read the sender's first message): the receiver refuses all 3 with `SenderGone`,
/// reading nothing, with no sender registering after it; the kernel marked the pool's
/// owner word at the death, which the receiver reads with one load per message. Then the
/// dead sender's pool is gone from `/dev/shm` (the receiver closed it) while the channel
/// lives. The control, a live sender, has the same 3 messages read with their values.
/// Events and host ready flags. Before, the receiver handed out messages whose memory went
/// with their process (RELIABILITY.md's "known gaps"). All ends run in children.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_messages_of_a_killed_sender_are_refused_by_a_receiver_that_imported_its_pool() {
    const WORDS: usize = 1024;
    const TEST: &str =
        "gpu_messages_of_a_killed_sender_are_refused_by_a_receiver_that_imported_its_pool";
    let marker = |name: &str, what: &str| std::env::temp_dir().join(format!("{name}.{what}"));
    let victim = std::env::var("GPURING_TEST_MODE").as_deref() == Ok("victim");
    match role().as_deref() {
        Some("sender") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let tx = ch.sender().unwrap();
            let send = |seq: u64| {
                let lease = tx.acquire_timeout(LIMIT).unwrap();
                memset(lease.device_ptr(), value(seq), WORDS, &stream);
                tx.send_timeout(lease, TensorMeta::bytes((WORDS * 4) as u64), LIMIT).unwrap();
            };
            send(0);
            common::wait_for("the import", LIMIT, || marker(&ring_name(), "imported").exists());
            (1..=3).for_each(send);
            stream.synchronize().unwrap();
            if victim {
                die();
            }
            announce("sent");
            common::wait_for("the end", LIMIT, || marker(&ring_name(), "exit").exists());
            return; // the drop waits for the slots to come back
        }
        Some("receiver") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let rx = ch.receiver().unwrap();
            announce("ready");
            let mut words = [0u32; 2];
            let m = rx.recv_timeout(LIMIT).unwrap();
            read_words(m.device_ptr(), &mut words, &stream);
            assert_eq!(words, [value(0); 2], "the first message, which imports the pool");
            drop(m);
            announce("imported");
            common::wait_for("the go", LIMIT, || marker(&ring_name(), "go").exists());
            for seq in 1..=3 {
                match rx.recv_timeout(LIMIT) {
                    Err(gpuring::RecvTimeoutError::SenderGone) if victim => {}
                    Ok(m) if !victim => {
                        read_words(m.device_ptr(), &mut words, &stream);
                        assert_eq!(words, [value(seq); 2], "the live sender's message {seq}");
                    }
                    other => panic!("message {seq} (victim: {victim}): got {other:?}"),
                }
            }
            if victim {
                let pools = ch.pools();
                assert!(pools.iter().all(|p| p.state == PoolState::Closed), "{pools:?}");
                let pool = &pools[0].name;
                let gone = !std::path::Path::new("/dev/shm").join(pool).exists();
                assert!(gone, "the dead sender's pool {pool} is still in /dev/shm");
            }
            announce("done");
            return;
        }
        _ => {}
    }
    for ready in [GpuReady::Event, GpuReady::HostFlag] {
        for mode in ["control", "victim"] {
            let (_, stream) = setup();
            let name = unique_name("gpu-killed-imported");
            let ch = Channel::builder(&name).slots(4, (WORDS * 4) as u64).cuda(&stream);
            let _ch = ch.ready(ready).create().unwrap();
            let env = [("GPURING_TEST_MODE", mode.to_owned())];
            let mut receiver = Peer::spawn_with(TEST, "receiver", &name, &env);
            receiver.expect("ready");
            let mut sender = Peer::spawn_with(TEST, "sender", &name, &env);
            receiver.expect("imported");
            std::fs::write(marker(&name, "imported"), b"").unwrap();
            if mode == "victim" {
                sender.died();
            } else {
                sender.expect("sent");
            }
            std::fs::write(marker(&name, "go"), b"").unwrap();
            receiver.expect("done");
            let status = receiver.child.wait().unwrap();
            std::fs::write(marker(&name, "exit"), b"").unwrap();
            if mode == "control" {
                assert!(sender.child.wait().unwrap().success(), "the live sender exits cleanly");
            }
            for what in ["imported", "go", "exit"] {
                let _ = std::fs::remove_file(marker(&name, what));
            }
            assert!(status.success(), "{ready:?} {mode}: the receiver's checks failed: {status}");
            println!("{ready:?} {mode}: passed");
        }
    }
}

/// A GPU receiver SIGKILLed holding two messages (taken, not dropped) while the sender's
/// slow writes of them may still run: the next receiver gets both again, marked
/// redelivered, reads the sender's values on its stream (ordered after the writes as any
/// message: the ready event or flag of the first delivery still stands), then the message
/// queued behind them; every slot comes back. SPSC and MPMC, events and host ready flags.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_messages_held_by_a_killed_receiver_are_redelivered() {
    const TEST: &str = "gpu_messages_held_by_a_killed_receiver_are_redelivered";
    const BYTES: usize = 8 << 20;
    const WORDS: usize = BYTES / 4;
    match role().as_deref() {
        Some("holder") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let rx = ch.receiver().unwrap();
            let held: Vec<_> = (0..2).map(|_| rx.recv_timeout(LIMIT).unwrap()).collect();
            assert!(held.iter().all(|m| !m.redelivered()));
            announce("holding");
            die();
        }
        Some("taker") => {
            let (_, stream) = setup();
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let rx = ch.receiver().unwrap();
            let mut last = [0u32; 1];
            for (seq, again) in [(0, true), (1, true), (2, false)] {
                let m = rx.recv_timeout(LIMIT).unwrap();
                read_words(m.device_ptr() + (WORDS as u64 - 1) * 4, &mut last, &stream);
                assert_eq!((last[0], m.redelivered()), (value(seq), again), "message {seq}");
            }
            announce("took");
            return;
        }
        _ => {}
    }
    for mpmc in [false, true] {
        for ready in [GpuReady::Event, GpuReady::HostFlag] {
            let what = format!("mpmc {mpmc}, {ready:?}");
            let (_, stream) = setup();
            let name = unique_name("gpu-redeliver");
            let b = Channel::builder(&name).slots(4, BYTES as u64).cuda(&stream).ready(ready);
            let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
            let tx = ch.sender().unwrap();
            let send = |seq: u64| {
                let lease = tx.acquire_timeout(LIMIT).unwrap();
                for pass in 0..256 {
                    memset(lease.device_ptr(), pass, WORDS, &stream);
                }
                memset(lease.device_ptr(), value(seq), WORDS, &stream);
                tx.send_timeout(lease, TensorMeta::bytes(BYTES as u64), LIMIT).unwrap();
            };
            let mut holder = Peer::spawn(TEST, "holder", &name);
            send(0);
            send(1);
            holder.expect("holding");
            holder.died();
            send(2);
            let mut taker = Peer::spawn(TEST, "taker", &name);
            taker.expect("took");
            assert!(taker.child.wait().unwrap().success(), "{what}: the taker's checks");
            let all: Vec<_> = (0..4).map(|_| tx.acquire_timeout(LIMIT).unwrap()).collect();
            drop(all);
            assert_eq!(tx.free_slots(), 4, "{what}: every slot back");
            println!("{what}: both held messages redelivered, values read");
        }
    }
}

/// A receiver kill storm on a GPU channel (SPSC and MPMC, host ready flags and events):
/// the sender here streams device messages (each slot's words set to its number's value)
/// while receivers, each reading every message's first word on its stream and holding up
/// to 2, are SIGKILLed 0.4–1 s after they start and replaced (8 kills). Every message sent
/// reaches a receiver at least once, with the sender's value; every extra copy is marked a
/// redelivery; every slot comes back.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_receiver_kill_storm_loses_nothing() {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    const TEST: &str = "gpu_receiver_kill_storm_loses_nothing";
    const WORDS: usize = 1024;
    if role().as_deref() == Some("receiver") {
        let (_, stream) = setup();
        let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
        let rx = ch.receiver().unwrap();
        let mut held = std::collections::VecDeque::new();
        let mut first = [0u32; 1];
        loop {
            let m = rx.recv_timeout(LIMIT).unwrap();
            read_words(m.device_ptr(), &mut first, &stream);
            assert_eq!(first[0], value(m.tag()), "message {}", m.tag());
            announce(&format!("got {} {}", m.tag(), m.redelivered()));
            held.push_back(m);
            if held.len() > 2 {
                held.pop_front();
            }
        }
    }
    let mut rng = common::Rand::from_pid(0x2545_f491_4f6c_dd1d);
    let mut rand = move |n: u64| rng.below(n);
    for mpmc in [false, true] {
        for ready in [GpuReady::HostFlag, GpuReady::Event] {
            let what = format!("mpmc {mpmc}, {ready:?}");
            let (_, stream) = setup();
            let name = unique_name("gpu-storm");
            let b = Channel::builder(&name).capacity(16).slots(8, (WORDS * 4) as u64);
            let b = b.cuda(&stream).ready(ready);
            let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let streamer = {
                let (stop, ch, stream) = (stop.clone(), ch.clone(), stream.clone());
                std::thread::spawn(move || {
                    let tx = ch.sender().unwrap();
                    let mut sent = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut lease) = tx.acquire_timeout(Duration::from_millis(20)) else {
                            continue;
                        };
                        memset(lease.device_ptr(), value(sent), WORDS, &stream);
                        lease.set_tag(sent);
                        let meta = TensorMeta::bytes((WORDS * 4) as u64);
                        if tx.send_timeout(lease, meta, LIMIT).is_ok() {
                            sent += 1;
                        }
                    }
                    (tx, sent)
                })
            };
            let got = Arc::new(Mutex::new(common::Deliveries::default()));
            for _ in 0..8 {
                let got = got.clone();
                let (mut child, reader) =
                    common::spawn_reading(TEST, "receiver", &name, &[], move |line| {
                        got.lock().unwrap().note_line(line)
                    });
                std::thread::sleep(Duration::from_millis(400 + rand(601)));
                let _ = child.kill();
                use std::os::unix::process::ExitStatusExt;
                let status = child.wait().unwrap();
                assert_eq!(status.signal(), Some(9), "{what}: the receiver's checks: {status}");
                reader.join().unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            let (tx, sent) = streamer.join().unwrap();
            let rx = ch.receiver().unwrap();
            let mut first = [0u32; 1];
            while let Ok(m) = rx.recv_timeout(Duration::from_millis(500)) {
                read_words(m.device_ptr(), &mut first, &stream);
                assert_eq!(first[0], value(m.tag()), "{what}: message {}", m.tag());
                got.lock().unwrap().note(m.tag(), m.redelivered());
            }
            let again = got.lock().unwrap().check(sent, &what);
            let all: Vec<_> = (0..8).map(|_| tx.acquire_timeout(LIMIT).unwrap()).collect();
            drop(all);
            println!("{what}: 8 receiver kills, {sent} sent, none lost, {again} redelivered");
        }
    }
}
