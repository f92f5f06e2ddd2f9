//! Pinned host slots, in one run (`cargo bench --features cuda --bench pinned`; needs a CUDA
//! device):
//!
//! - `launch_call`: the PyTorch report's symptom. Thread B launches an empty kernel and
//!   times each `cuLaunchKernel` call (the CPU side); meanwhile thread A is idle, or copies
//!   54 MB device → host in a loop: `cuMemcpyDtoHAsync` then a stream synchronize, into a
//!   pageable buffer or into a pinned gpuring slot; or, gpuring's way, stream-ordered
//!   (`send_from_device_on` into a pinned pool of two slots, a thread of this process
//!   receiving and dropping each): A then waits for a free slot in gpuring, not in the
//!   driver. A pageable copy holds the driver while it stages the bytes, and B's launches
//!   wait. Criterion's median per launch, then p50/p99 of single launches.
//! - `dtoh_handoff_54MB`: 54 MB device buffers handed from this (GPU) process to a CPU
//!   process, which touches the first and last word of each and drops it:
//!   `send_from_device_on` into a pinned pool, the same into a plain (pageable) pool, and
//!   the floor, raw `cuMemcpyDtoHAsync` into `cuMemHostAlloc` memory with no hand-off
//!   (copies back to back, one synchronize per batch). Criterion's throughput gives GB/s;
//!   items/s is its inverse time. (torch's `t.cpu()` + `multiprocessing.Queue` row comes
//!   from `scripts/pinned-torch.py`, run in the same device call by `scripts/pinned-bench.sh`.)

mod common;

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cuda::{ok, setup};
use common::{Group, NAME, PEER, Samples, cpus, peer, pin, unique};
use criterion::{Criterion, Throughput};
use cudarc::driver::{CudaContext, CudaStream, result, sys};
use gpuring::{Channel, DType, TensorMeta, WaitPolicy, cuda};

const BYTES: usize = 54 << 20;
const SLOTS: u32 = 4;
const STOP: u64 = u64::MAX;

/// An empty kernel, as PTX (the driver compiles it for the device at load).
const NOOP_PTX: &str = "
.version 7.0
.target sm_70
.address_size 64
.visible .entry noop()
{
    ret;
}
";

fn device_buffer(bytes: usize, stream: &CudaStream) -> sys::CUdeviceptr {
    // SAFETY: a plain allocation, kept for the whole run.
    let ptr = unsafe { result::malloc_sync(bytes) }.unwrap();
    // SAFETY: the allocation above, in stream order.
    ok(unsafe { sys::cuMemsetD32Async(ptr, 0x5EED, bytes / 4, stream.cu_stream()) });
    stream.synchronize().unwrap();
    ptr
}

/// The CPU process: touches the first and last word of each message, drops it.
fn sink() {
    pin(cpus().get(1).copied());
    let name = std::env::var(NAME).unwrap();
    let ch = Channel::builder(&name).open().unwrap();
    let mut rx = ch.receiver().unwrap();
    rx.set_wait_policy(WaitPolicy::spin_then_sleep(u32::MAX, 0));
    let mut acc = 0u8;
    loop {
        let m = rx.recv().unwrap();
        if m.tag() == STOP {
            std::hint::black_box(acc);
            return;
        }
        acc ^= m[0] ^ m[m.len() - 1];
    }
}

/// Thread A of `launch_call` (in each of its forms below): runs until told to stop, then
/// says how many 54 MB copies it made; with a receiving thread C for gpuring's sends.
struct ThreadA {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
    sink: Option<std::thread::JoinHandle<u64>>,
}

impl ThreadA {
    /// Runs `body(stop flag)`, which returns its count of copies once the flag is set.
    fn spawn(body: impl FnOnce(Arc<AtomicBool>) -> u64 + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        Self { stop, thread: std::thread::spawn(move || body(flag)), sink: None }
    }

    fn stop(self) -> u64 {
        // Relaxed: a stop flag; the joins are the synchronisation.
        self.stop.store(true, Ordering::Relaxed);
        let copies = self.thread.join().unwrap();
        if let Some(sink) = self.sink {
            let got = sink.join().unwrap();
            assert_eq!(got, copies, "every stream-ordered send was received");
        }
        copies
    }
}

/// Thread A copying 54 MB device → host into `dst`, a stream synchronize after each.
fn copier(ctx: &Arc<CudaContext>, src: sys::CUdeviceptr, dst: *mut u8) -> ThreadA {
    let (ctx, dst) = (ctx.clone(), dst as usize);
    ThreadA::spawn(move |flag| {
        ctx.bind_to_thread().unwrap();
        let stream = ctx.new_stream().unwrap();
        let mut copies = 0;
        // Relaxed: a stop flag; the join below is the synchronisation.
        while !flag.load(Ordering::Relaxed) {
            // SAFETY: `dst` holds BYTES until this thread is joined; `src` is live.
            ok(unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, BYTES, stream.cu_stream())
            });
            stream.synchronize().unwrap();
            copies += 1;
        }
        copies
    })
}

/// Thread A, gpuring's way: stream-ordered sends of the 54 MB device buffer into a pinned
/// pool (`send_from_device_on`), waiting for free slots in gpuring (spin, then sleep)
/// rather than in a stream synchronize; thread C receives and drops each.
/// `spinning_sink`: thread C never sleeps, so publishing wakes nobody (a diagnostic).
fn staged_copier(ctx: &Arc<CudaContext>, src: sys::CUdeviceptr, spinning_sink: bool) -> ThreadA {
    let ch = Channel::builder(unique("launch-staged")).capacity(4).slots(2, BYTES as u64);
    let ch = ch.pinned(ctx).create().unwrap();
    let (tx, mut rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    if spinning_sink {
        rx.set_wait_policy(WaitPolicy::spin_then_sleep(u32::MAX, 0));
    }
    let ctx = ctx.clone();
    let mut a = ThreadA::spawn(move |flag| {
        ctx.bind_to_thread().unwrap();
        let stream = ctx.new_stream().unwrap();
        let mut copies = 0;
        // Relaxed: a stop flag; the join is the synchronisation.
        while !flag.load(Ordering::Relaxed) {
            let lease = tx.acquire().unwrap();
            // SAFETY: `src` holds BYTES on this context's device, live until the bench
            // ends; nothing writes it meanwhile.
            unsafe { tx.send_from_device_on(lease, src, TensorMeta::bytes(BYTES as u64), &stream) }
                .unwrap();
            copies += 1;
        }
        stream.synchronize().unwrap();
        drop(tx);
        copies
    });
    a.sink = Some(std::thread::spawn(move || {
        let mut got = 0;
        // Until the sender has gone and everything it sent was received.
        while rx.recv().is_ok() {
            got += 1;
        }
        got
    }));
    drop(ch);
    a
}

/// How a diagnostic raw copier learns that a copy is done (see [`raw_copier`]).
#[derive(Clone, Copy, PartialEq)]
enum Done {
    /// An event record after the copy, a wait on it by a second stream, and a host function
    /// there (an earlier form of gpuring's stream-ordered send).
    LaneHostFn,
    /// A host function on the copy's own stream (holds the stream until it has run).
    SameStreamHostFn,
    /// An event record (blocking sync) after the copy; a second thread of ours waits on
    /// each event in `cuEventSynchronize`, asleep in the driver, and counts (an earlier
    /// form of gpuring's lanes).
    WaiterThread,
    /// As `WaiterThread` with events that are not blocking-sync (no completion interrupt),
    /// the waiter polling `cuEventQuery`: every ~0.5 µs for 20 µs, then naps of an eighth of
    /// the time waited (what gpuring's lanes do).
    PollingThread,
}

/// A diagnostic thread A for the interleaved rounds: the driver calls of a stream-ordered
/// send without gpuring, 54 MB copies into page-locked memory of the driver's
/// (`cuMemHostAlloc`), at most two in flight (as the two-slot pool), completion learnt as
/// [`Done`] says; the host functions and the waiter only count.
fn raw_copier(ctx: &Arc<CudaContext>, src: sys::CUdeviceptr, how: Done) -> ThreadA {
    let ctx = ctx.clone();
    ThreadA::spawn(move |flag| raw_copies(&ctx, src, how, flag))
}

unsafe extern "C" fn count_done(user: *mut c_void) {
    // SAFETY: `user` is the `AtomicU64` of a `raw_copies` thread, which outlives every host
    // function it enqueued (it synchronises both streams before it returns).
    let done = unsafe { &*(user as *const AtomicU64) };
    // Release: pairs with the Acquire load in the copier's loop.
    done.fetch_add(1, Ordering::Release);
}

/// The body of [`raw_copier`]'s thread.
fn raw_copies(
    ctx: &Arc<CudaContext>,
    src: sys::CUdeviceptr,
    how: Done,
    flag: Arc<AtomicBool>,
) -> u64 {
    ctx.bind_to_thread().unwrap();
    let (stream, lane) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mut bufs = [std::ptr::null_mut(); 2];
    let mut events = [std::ptr::null_mut(); 2];
    // CU_EVENT_DISABLE_TIMING, and for the blocking waiter CU_EVENT_BLOCKING_SYNC.
    let flags = if how == Done::WaiterThread { 2 | 1 } else { 2 };
    for (b, e) in bufs.iter_mut().zip(events.iter_mut()) {
        // SAFETY: out-pointers valid; context bound above.
        ok(unsafe { sys::cuMemHostAlloc(b, BYTES, 0) });
        // SAFETY: as above.
        ok(unsafe { sys::cuEventCreate(e, flags) });
    }
    let done = Arc::new(AtomicU64::new(0));
    let user = Arc::as_ptr(&done) as *mut c_void;
    // The waiter: the events in order, each once recorded (`recorded` counts).
    let recorded = Arc::new(AtomicU64::new(0));
    let waiter = matches!(how, Done::WaiterThread | Done::PollingThread).then(|| {
        let (ctx, done, recorded, flag) =
            (ctx.clone(), done.clone(), recorded.clone(), flag.clone());
        let events = events.map(|e| e as usize);
        std::thread::spawn(move || {
            ctx.bind_to_thread().unwrap();
            let slack_ns: libc::c_ulong = 1_000;
            // SAFETY: changes this thread's timer slack only (as the lanes do).
            let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, slack_ns, 0, 0, 0) };
            let mut next = 0u64;
            loop {
                // Acquire: pairs with the Release store after each record.
                if next < recorded.load(Ordering::Acquire) {
                    let e = events[(next % 2) as usize] as sys::CUevent;
                    if how == Done::PollingThread {
                        poll(e);
                    } else {
                        // SAFETY: a live event, recorded (the count says so).
                        ok(unsafe { sys::cuEventSynchronize(e) });
                    }
                    next += 1;
                    // Release: pairs with the Acquire load in the copier's loop.
                    done.store(next, Ordering::Release);
                } else if flag.load(Ordering::Relaxed) {
                    return; // stopped, every recorded event waited for
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        })
    });
    let mut copies = 0u64;
    // Relaxed: a stop flag; the joins are the synchronisation.
    while !flag.load(Ordering::Relaxed) {
        // Acquire: pairs with the Release in `count_done` / the waiter. Relaxed
        // (the flag): as above; the waiter may stop before the last copies.
        while copies >= done.load(Ordering::Acquire) + 2 && !flag.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_micros(50));
        }
        if copies >= done.load(Ordering::Acquire) + 2 {
            break;
        }
        let k = (copies % 2) as usize;
        let s = stream.cu_stream();
        // SAFETY: live buffers, events and streams of the bound context; `user`
        // outlives the host functions (both streams are synchronised below).
        unsafe {
            ok(sys::cuMemcpyDtoHAsync_v2(bufs[k], src, BYTES, s));
            match how {
                Done::LaneHostFn => {
                    ok(sys::cuEventRecord(events[k], s));
                    ok(sys::cuStreamWaitEvent(lane.cu_stream(), events[k], 0));
                    ok(sys::cuLaunchHostFunc(lane.cu_stream(), Some(count_done), user));
                }
                Done::SameStreamHostFn => {
                    ok(sys::cuLaunchHostFunc(s, Some(count_done), user));
                }
                Done::WaiterThread | Done::PollingThread => {
                    ok(sys::cuEventRecord(events[k], s));
                    // Release: pairs with the waiter's Acquire load.
                    recorded.fetch_add(1, Ordering::Release);
                }
            }
        }
        copies += 1;
    }
    if let Some(w) = waiter {
        w.join().unwrap();
    }
    lane.synchronize().unwrap();
    stream.synchronize().unwrap();
    for (b, e) in bufs.iter().zip(events.iter()) {
        // SAFETY: ours, nothing pending on them (both streams synchronised).
        unsafe {
            ok(sys::cuMemFreeHost(*b));
            ok(sys::cuEventDestroy_v2(*e));
        }
    }
    copies
}

/// Returns once `e` (recorded) has completed, polling it as [`Done::PollingThread`] says.
/// (The lanes' schedule, written out here: this row runs the driver calls without gpuring.)
fn poll(e: sys::CUevent) {
    let t = Instant::now();
    loop {
        // SAFETY: a live event, recorded.
        match unsafe { sys::cuEventQuery(e) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => {}
            r => return ok(r), // done, or a failure said as such
        }
        let waited = t.elapsed();
        if waited >= Duration::from_micros(20) {
            let nap = (waited / 8).clamp(Duration::from_micros(4), Duration::from_millis(1));
            std::thread::sleep(nap);
            continue;
        }
        while t.elapsed() < waited + Duration::from_nanos(500) {
            std::hint::spin_loop();
        }
    }
}

/// Thread B: launches of the empty kernel, each timed on its own.
struct Launcher {
    func: sys::CUfunction,
    stream: Arc<CudaStream>,
    launched: u64,
}

impl Launcher {
    fn new(ctx: &Arc<CudaContext>) -> Self {
        ctx.bind_to_thread().unwrap();
        let src = std::ffi::CString::new(NOOP_PTX).unwrap();
        let mut module = std::ptr::null_mut();
        // SAFETY: out-pointer valid; a NUL-terminated PTX image.
        ok(unsafe { sys::cuModuleLoadData(&mut module, src.as_ptr().cast()) });
        let mut func = std::ptr::null_mut();
        // SAFETY: out-pointer valid; the module above defines `noop`.
        ok(unsafe { sys::cuModuleGetFunction(&mut func, module, c"noop".as_ptr()) });
        Self { func, stream: ctx.new_stream().unwrap(), launched: 0 }
    }

    /// Times `n` launch calls (the queue is drained every 256, outside the timing).
    fn launches(&mut self, n: u64) -> Duration {
        let mut spent = Duration::ZERO;
        for _ in 0..n {
            let t = Instant::now();
            // SAFETY: a kernel of no parameters, on a live stream of the bound context.
            ok(unsafe {
                sys::cuLaunchKernel(
                    self.func,
                    1,
                    1,
                    1,
                    32,
                    1,
                    1,
                    0,
                    self.stream.cu_stream(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            });
            spent += t.elapsed();
            self.launched += 1;
            if self.launched % 256 == 0 {
                self.stream.synchronize().unwrap();
            }
        }
        spent
    }
}

fn launch_call(c: &mut Criterion, samples: &mut Samples, ctx: &Arc<CudaContext>) {
    let stream = ctx.new_stream().unwrap();
    let src = device_buffer(BYTES, &stream);
    let mut pageable = vec![1u8; BYTES];
    let ch = Channel::builder(unique("launch")).slots(1, BYTES as u64).pinned(ctx).create();
    let ch = ch.unwrap();
    let tx = ch.sender().unwrap();
    let mut slot = tx.acquire().unwrap();
    let mut launcher = Launcher::new(ctx);
    let mut g = Group::new(c, samples, "launch_call");
    let cases: [(&str, Option<*mut u8>); 3] = [
        ("idle", None),
        ("pageable_dtoh", Some(pageable.as_mut_ptr())),
        ("pinned_slot_dtoh", Some(slot.as_mut_ptr())),
    ];
    let said = |label: &str, copies: u64| {
        println!("launch_call/{label}: thread A made {copies} copies of 54 MB meanwhile");
    };
    for (label, dst) in cases {
        let copier = dst.map(|d| copier(ctx, src, d));
        g.run(label, 0, |n| launcher.launches(n));
        if let Some(copier) = copier {
            said(label, copier.stop());
        }
    }
    let copier = staged_copier(ctx, src, false);
    g.run("pinned_stream_ordered", 0, |n| launcher.launches(n));
    said("pinned_stream_ordered", copier.stop());
    g.g.finish();
    if !std::env::args().any(|a| a == "--test") {
        launch_rounds(ctx, src, &mut launcher, &cases);
    }
    drop(slot);
}

/// The tail of `launch_call` again, interleaved: `ROUNDS` rounds (`GPURING_LAUNCH_ROUNDS`),
/// each timing `PER_ROUND` single launches per case with the cases one after another, so
/// that whatever the VM does meanwhile falls on every case alike (criterion's cases and
/// their second passes run one case at a time, seconds apart). Prints each case's p50/p99
/// over all rounds, its ratio to idle, and its p99 per round. Two diagnostic cases beside
/// the four of `launch_call`: the stream-ordered sender with a receiving thread that never
/// sleeps (publishing wakes nobody), and the driver calls without gpuring ([`raw_copier`],
/// four ways of learning that a copy is done).
fn launch_rounds(
    ctx: &Arc<CudaContext>,
    src: sys::CUdeviceptr,
    launcher: &mut Launcher,
    copies: &[(&str, Option<*mut u8>); 3],
) {
    const PER_ROUND: usize = 25_000;
    let rounds: usize =
        std::env::var("GPURING_LAUNCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let labels = [
        "idle",
        "pageable_dtoh",
        "pinned_slot_dtoh",
        "pinned_stream_ordered",
        "pinned_stream_ordered_spinning_sink",
        "raw_copy_event_lane_hostfn",
        "raw_copy_hostfn_same_stream",
        "raw_copy_event_waiter_thread",
        "raw_copy_event_polling_thread",
    ];
    let mut all: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds * PER_ROUND); labels.len()];
    let mut per_round: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); labels.len()];
    let mut made = vec![0u64; labels.len()];
    for _ in 0..rounds {
        for (i, label) in labels.iter().enumerate() {
            let a = match (copies.iter().find(|(l, _)| l == label), *label) {
                (Some((_, dst)), _) => dst.map(|d| copier(ctx, src, d)),
                (None, "raw_copy_event_lane_hostfn") => {
                    Some(raw_copier(ctx, src, Done::LaneHostFn))
                }
                (None, "raw_copy_hostfn_same_stream") => {
                    Some(raw_copier(ctx, src, Done::SameStreamHostFn))
                }
                (None, "raw_copy_event_waiter_thread") => {
                    Some(raw_copier(ctx, src, Done::WaiterThread))
                }
                (None, "raw_copy_event_polling_thread") => {
                    Some(raw_copier(ctx, src, Done::PollingThread))
                }
                (None, l) => Some(staged_copier(ctx, src, l.ends_with("spinning_sink"))),
            };
            // Thread A under way (its first copies issued) before B is timed.
            std::thread::sleep(Duration::from_millis(20));
            let mut v: Vec<Duration> = (0..PER_ROUND).map(|_| launcher.launches(1)).collect();
            made[i] += a.map_or(0, ThreadA::stop);
            v.sort_unstable();
            per_round[i].push(v[PER_ROUND * 99 / 100]);
            all[i].extend(v);
        }
    }
    println!("\nlaunch_call, interleaved: {rounds} rounds x {PER_ROUND} launches per case");
    let (mut idle, mut idle_mid) = ((Duration::ZERO, Duration::ZERO), Duration::ZERO);
    for (i, label) in labels.iter().enumerate() {
        let v = &mut all[i];
        v.sort_unstable();
        let (p50, p99) = (v[v.len() / 2], v[v.len() * 99 / 100]);
        if i == 0 {
            idle = (p50, p99);
        }
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        let rounds: Vec<String> =
            per_round[i].iter().map(|d| format!("{:.2}", d.as_secs_f64() * 1e6)).collect();
        // The median round's p99: a burst of the VM's (a round's p99 several times the
        // others') moves it by one round at most, where it can make the pooled p99.
        let mut sorted = per_round[i].clone();
        sorted.sort_unstable();
        let mid = sorted[sorted.len() / 2];
        if i == 0 {
            idle_mid = mid;
        }
        println!(
            "rounds launch_call/{label}: p50 {p50:.2?} ({:.2}x idle), p99 {p99:.2?} ({:.2}x idle), \
             median round's p99 {mid:.2?} ({:.2}x idle), n={}, thread A copies {}; \
             p99 per round (us): {}",
            ratio(p50, idle.0),
            ratio(p99, idle.1),
            ratio(mid, idle_mid),
            v.len(),
            made[i],
            rounds.join(" ")
        );
    }
}

/// Tells the sink peer of `tx`'s channel to stop, and waits for it.
fn stop_sink<B: gpuring::HostMemory>(tx: &gpuring::Sender<B>, sink: common::Peer) {
    let mut lease = tx.acquire().unwrap();
    lease.set_tag(STOP);
    tx.send(lease, TensorMeta::bytes(1)).unwrap();
    sink.finish();
}

fn dtoh_handoff(c: &mut Criterion, ctx: &Arc<CudaContext>) {
    let stream = ctx.new_stream().unwrap();
    let src = device_buffer(BYTES, &stream);
    let mut g = c.benchmark_group("dtoh_handoff_54MB");
    g.throughput(Throughput::Bytes(BYTES as u64));
    // The floor: raw copies into page-locked memory, no hand-off.
    let mut host = std::ptr::null_mut();
    // SAFETY: out-pointer valid; context bound by `setup`.
    ok(unsafe { sys::cuMemHostAlloc(&mut host, BYTES, 0) });
    g.bench_function("raw_dtoh_pinned", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                // SAFETY: `host` holds BYTES (freed after the group); `src` is live.
                ok(unsafe { sys::cuMemcpyDtoHAsync_v2(host, src, BYTES, stream.cu_stream()) });
            }
            stream.synchronize().unwrap();
            t.elapsed()
        })
    });
    let meta = TensorMeta::contiguous(DType::U8, &[BYTES as u64]).unwrap();
    // Stream-ordered sends into a pinned pool: asynchronous DMA, published by the lane.
    let name = unique("dtoh");
    let ch = Channel::builder(&name).capacity(16).slots(SLOTS, BYTES as u64).pinned(ctx);
    let mut tx = ch.create().unwrap().sender().unwrap();
    tx.set_wait_policy(WaitPolicy::spin_then_sleep(u32::MAX, 0));
    let sink = peer("sink", &name, 0, false);
    g.bench_function("gpuring_pinned_slot", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let lease = tx.acquire().unwrap();
                // SAFETY: `src` holds BYTES for the whole run.
                unsafe { tx.send_from_device_on(lease, src, meta, &stream) }.unwrap();
            }
            // Delivered: every slot back from the CPU process.
            while tx.free_slots() < SLOTS as usize {
                std::hint::spin_loop();
            }
            t.elapsed()
        })
    });
    assert_eq!(tx.stream_sends_lost(), 0);
    stop_sink(&tx, sink);
    // A plain (pageable) host pool: the driver stages the copy, and the call returns once
    // it is done; then a plain send.
    let name = unique("dtoh");
    let ch = Channel::builder(&name).capacity(16).slots(SLOTS, BYTES as u64).create().unwrap();
    let mut tx = ch.sender().unwrap();
    tx.set_wait_policy(WaitPolicy::spin_then_sleep(u32::MAX, 0));
    let sink = peer("sink", &name, 0, false);
    g.bench_function("gpuring_pageable_slot", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let mut lease = tx.acquire().unwrap();
                let dst = lease.as_mut_ptr().cast();
                // SAFETY: the lease's slot holds BYTES; `src` holds BYTES for the whole run.
                ok(unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, BYTES, stream.cu_stream()) });
                tx.send(lease, meta).unwrap();
            }
            while tx.free_slots() < SLOTS as usize {
                std::hint::spin_loop();
            }
            t.elapsed()
        })
    });
    stop_sink(&tx, sink);
    g.finish();
    // SAFETY: the allocation above; no copy into it is pending (synchronized per batch).
    ok(unsafe { sys::cuMemFreeHost(host) });
}

fn main() {
    if std::env::var(PEER).is_ok() {
        sink();
        return;
    }
    if !cuda::available() {
        eprintln!("pinned bench: no CUDA driver here, nothing to measure (skipped)");
        return;
    }
    // Not pinned: threads A and B of `launch_call` need CPUs of their own.
    let (ctx, _stream) = setup();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut samples = Samples::new("pinned", "launch_call");
    launch_call(&mut c, &mut samples, &ctx);
    dtoh_handoff(&mut c, &ctx);
    samples.finish();
    c.final_summary();
}
