//! GPU hand-off between two processes, in one run: gpuring GPU channels against the raw
//! floor (the same device work, ordered by CUDA IPC events, signalled through a spinning
//! shared-memory word, with every handle opened once up front).
//!
//! `cargo bench --features cuda --bench gpu` (needs a CUDA device). Latency is a
//! ping-pong: A writes a word into a device buffer on its stream and hands it to B; B's
//! stream waits for it and copies the word into a buffer of its own, which it hands back;
//! A's stream waits, copies the word to the host, and A synchronises its stream and checks
//! the word. The time reported is half the round trip. Throughput streams device slots one
//! way (A writes one word into each) and times until B has returned them all.
//! `GPURING_BENCH_CPUS=a,b` pins as in `rings`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cuda::{ok, setup};
use common::{NAME, PEER, SharedPage, cpus, peer, peer_index, pin, unique};
use criterion::{Criterion, Throughput};
use cudarc::driver::{CudaStream, result, sys};
use gpuring::{Channel, Cuda, Sender, TensorMeta, WaitPolicy, cuda};

const STOP: u64 = u64::MAX;
const SPIN: WaitPolicy = WaitPolicy::spin_then_sleep(u32::MAX, 0);

/// The floor's shared page: the two signal words, then the IPC handles B opens.
#[repr(C, align(128))]
struct FloorPage {
    ping: AtomicU64,
    _pad0: [u64; 15],
    pong: AtomicU64,
    _pad1: [u64; 15],
    // Memory handles of A's and B's buffers, and the event handles A→B and B→A.
    handles: [[AtomicU64; 8]; 4],
}

fn bytes_of(words: &[AtomicU64; 8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    gpuring::internal::load_bytes(words, &mut out);
    out
}

fn ipc_event() -> sys::CUevent {
    let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let mut e = std::ptr::null_mut();
    // SAFETY: out-pointer valid; context bound by `setup`.
    ok(unsafe { sys::cuEventCreate(&mut e, flags) });
    e
}

fn memset(ptr: sys::CUdeviceptr, v: u32, s: &CudaStream) {
    // SAFETY: a live device buffer of at least one word, in stream order.
    ok(unsafe { sys::cuMemsetD32Async(ptr, v, 1, s.cu_stream()) });
}

fn copy_word(dst: sys::CUdeviceptr, src: sys::CUdeviceptr, s: &CudaStream) {
    // SAFETY: live device buffers of at least 4 bytes, in stream order.
    unsafe { result::memcpy_dtod_async(dst, src, 4, s.cu_stream()) }.unwrap();
}

fn read_word(src: sys::CUdeviceptr, s: &CudaStream) -> u32 {
    let mut w = [0u32; 1];
    // SAFETY: a live device word; `w` outlives the synchronize.
    unsafe { result::memcpy_dtoh_async(&mut w, src, s.cu_stream()) }.unwrap();
    s.synchronize().unwrap();
    w[0]
}

fn run_peer(role: &str) {
    pin(cpus().get(1 + peer_index()).copied());
    let name = std::env::var(NAME).unwrap();
    let (ctx, s) = setup();
    match role {
        "floor" => {
            let page = SharedPage::<FloorPage>::open(&name);
            let p = page.get();
            let open_mem = |i: usize| {
                let h = sys::CUipcMemHandle { reserved: bytes_of(&p.handles[i]).map(|b| b as _) };
                let mut ptr = 0;
                let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
                // SAFETY: a handle A exported; out-pointer valid.
                ok(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, lazy) });
                ptr
            };
            let open_event = |i: usize| {
                let h = sys::CUipcEventHandle { reserved: bytes_of(&p.handles[i]).map(|b| b as _) };
                let mut e = std::ptr::null_mut();
                // SAFETY: a handle A exported; out-pointer valid.
                ok(unsafe { sys::cuIpcOpenEventHandle(&mut e, h) });
                e
            };
            let (a_buf, b_buf, a_to_b, b_to_a) =
                (open_mem(0), open_mem(1), open_event(2), open_event(3));
            let mut last = 0;
            loop {
                // Acquire/Release: the signal itself is what is measured.
                let v = p.ping.load(Ordering::Acquire);
                if v == last {
                    std::hint::spin_loop();
                    continue;
                }
                if v == STOP {
                    return;
                }
                last = v;
                // SAFETY: live event and stream.
                ok(unsafe { sys::cuStreamWaitEvent(s.cu_stream(), a_to_b, 0) });
                copy_word(b_buf, a_buf, &s);
                // SAFETY: as above.
                ok(unsafe { sys::cuEventRecord(b_to_a, s.cu_stream()) });
                p.pong.store(v, Ordering::Release);
            }
        }
        "echo" => {
            let ch_ab = Channel::builder(format!("{name}-ab")).cuda(&ctx).open().unwrap();
            let ch_ba = Channel::builder(format!("{name}-ba")).cuda(&ctx).open().unwrap();
            let mut rx = ch_ab.receiver().unwrap();
            let mut tx = ch_ba.sender().unwrap();
            rx.set_wait_policy(SPIN);
            tx.set_wait_policy(SPIN);
            loop {
                let m = rx.recv_on(&s).unwrap();
                if m.tag() == STOP {
                    return;
                }
                let lease = tx.acquire_on(&s).unwrap();
                copy_word(lease.device_ptr(), m.device_ptr(), &s);
                drop(m);
                tx.send(lease, TensorMeta::bytes(4)).unwrap();
            }
        }
        "sink" => {
            let ch = Channel::builder(&name).cuda(&ctx).open().unwrap();
            let mut rx = ch.receiver().unwrap();
            rx.set_wait_policy(SPIN);
            loop {
                let m = rx.recv_on(&s).unwrap();
                if m.tag() == STOP {
                    return;
                }
            }
        }
        _ => panic!("unknown peer role {role}"),
    }
}

/// Leases a slot on `s`, writes `v` into its first word, sends it tagged `tag`.
fn send_word(tx: &Sender<Cuda>, s: &Arc<CudaStream>, v: u32, tag: u64) {
    let mut lease = tx.acquire_on(s).unwrap();
    memset(lease.device_ptr(), v, s);
    lease.set_tag(tag);
    tx.send(lease, TensorMeta::bytes(4)).unwrap();
}

/// Tells the peer to stop, and reaps it once it has taken the message.
fn stop(tx: &Sender<Cuda>, s: &Arc<CudaStream>, peer: common::Peer) {
    send_word(tx, s, 0, STOP);
    peer.finish();
}

fn floor(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let (_ctx, s) = setup();
    let name = format!("/{}", unique("gpufloor"));
    let page = SharedPage::<FloorPage>::create(&name);
    let p = page.get();
    // SAFETY: plain allocations for the floor's two words (2 MiB each, like slots).
    let (a_buf, b_buf) = unsafe { (result::malloc_sync(2 << 20), result::malloc_sync(2 << 20)) };
    let (a_buf, b_buf) = (a_buf.unwrap(), b_buf.unwrap());
    let (a_to_b, b_to_a) = (ipc_event(), ipc_event());
    for (i, ptr) in [a_buf, b_buf].into_iter().enumerate() {
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: out-pointer valid; our allocation.
        ok(unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) });
        gpuring::internal::store_bytes(&p.handles[i], &h.reserved.map(|b| b as u8));
    }
    for (i, e) in [(2, a_to_b), (3, b_to_a)] {
        let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: out-pointer valid; our interprocess event.
        ok(unsafe { sys::cuIpcGetEventHandle(&mut h, e) });
        gpuring::internal::store_bytes(&p.handles[i], &h.reserved.map(|b| b as u8));
    }
    let _peer = peer("floor", &name, 0, false);
    let mut seq = 0u64;
    g.bench_function("floor_ipc_events_spin", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                memset(a_buf, seq as u32, &s);
                // SAFETY: live event and stream.
                ok(unsafe { sys::cuEventRecord(a_to_b, s.cu_stream()) });
                p.ping.store(seq, Ordering::Release);
                while p.pong.load(Ordering::Acquire) != seq {
                    std::hint::spin_loop();
                }
                // SAFETY: as above.
                ok(unsafe { sys::cuStreamWaitEvent(s.cu_stream(), b_to_a, 0) });
                assert_eq!(read_word(b_buf, &s), seq as u32);
            }
            t.elapsed() / 2
        })
    });
    p.ping.store(STOP, Ordering::Release);
    std::thread::sleep(Duration::from_millis(50));
}

fn gpuring_ping_pong(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let (ctx, s) = setup();
    let name = unique("gpupp");
    let make = |suffix: &str| {
        Channel::builder(format!("{name}-{suffix}")).capacity(16).slots(4, 4096).cuda(&ctx).create()
    };
    let (ab, ba) = (make("ab").unwrap(), make("ba").unwrap());
    let mut tx = ab.sender().unwrap();
    let mut rx = ba.receiver().unwrap();
    tx.set_wait_policy(SPIN);
    rx.set_wait_policy(SPIN);
    let echo = peer("echo", &name, 0, false);
    let mut seq = 0u64;
    g.bench_function("gpuring_spsc_spin", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                send_word(&tx, &s, seq as u32, 0);
                let m = rx.recv_on(&s).unwrap();
                assert_eq!(read_word(m.device_ptr(), &s), seq as u32);
            }
            t.elapsed() / 2
        })
    });
    stop(&tx, &s, echo);
}

fn stream(c: &mut Criterion) {
    let mut g = c.benchmark_group("gpu_stream");
    g.throughput(Throughput::Elements(1));
    let (ctx, s) = setup();
    let name = unique("gpustream");
    let ch = Channel::builder(&name).capacity(256).slots(64, 4096).cuda(&ctx).create().unwrap();
    let mut tx = ch.sender().unwrap();
    tx.set_wait_policy(SPIN);
    let sink = peer("sink", &name, 0, false);
    let mut seq = 0u64;
    g.bench_function("gpuring_spsc_1p1c", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                send_word(&tx, &s, seq as u32, 0);
            }
            while tx.free_slots() < 64 {
                std::hint::spin_loop();
            }
            t.elapsed()
        })
    });
    stop(&tx, &s, sink);
    g.finish();
}

fn main() {
    if let Ok(role) = std::env::var(PEER) {
        run_peer(&role);
        return;
    }
    if !cuda::available() {
        eprintln!("gpu bench: no CUDA driver here, nothing to measure (skipped)");
        return;
    }
    pin(cpus().first().copied());
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("gpu_handoff_one_way");
        floor(&mut g);
        gpuring_ping_pong(&mut g);
        g.finish();
    }
    stream(&mut c);
    c.final_summary();
}
