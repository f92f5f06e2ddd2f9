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
//! `GPURING_BENCH_CPUS=a,b` pins as in `rings`; `GPURING_BENCH_PEER_DEVICE=1` puts the peer
//! process (B) on device 1 (producer and consumer on two GPUs).
//!
//! Groups:
//! - `gpu_handoff_one_way`: the raw floor (IPC events, handles opened once, a spinning
//!   shared word) and gpuring SPSC, ping-pong: with ready events, and (`_host_flags`, where
//!   the device has 64-bit stream memory operations) with host ready flags; both ends
//!   spinning without end (`gpuring_spsc_spin*`), then on the default `WaitPolicy`
//!   (`gpuring_spsc_default*`: spins, yields, then sleeps or, for a flag, naps).
//! - `gpu_stream`: the raw event stream (the same protocol as a gpuring channel with
//!   nothing else: 64 slots, a ready and a release IPC event per slot, a shared head and
//!   acknowledgement word) and gpuring SPSC, one way, with either signal.
//! - `gpu_driver_calls`: what each driver call on the hot path costs the calling thread
//!   (64 calls, then a synchronize outside the timing), in this process's own context.
//! - `gpu_stream_values`: the experiment of issue 17 part 3, ordering the consumer's stream
//!   on the producer's with stream memory operations instead of interprocess events;
//!   ping-pong and stream, as the two raw event rows, in four forms ([`Order`]): the
//!   producer's stream writes a word in host shared memory and the consumer's CPU waits
//!   for it before it enqueues (`host_words`: no stream ever waits on a value); the
//!   consumer's stream waits on such a host word (`host_values`); the consumer's stream
//!   waits on a word in the producer's device memory (`stream_values`); a host ready word
//!   with release events (`host_ready`: what a gpuring channel ordered that way would
//!   do). Last, and skipped where the device lacks 64-bit stream memory operations.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cuda::{ok, peer_device, setup, setup_on};
use common::{NAME, PEER, SharedPage, cpus, peer, peer_index, pin, unique};
use criterion::{Criterion, Throughput};
use cudarc::driver::{CudaStream, result, sys};
use gpuring::{Channel, Cuda, GpuReady, Sender, TensorMeta, WaitPolicy, cuda};

const STOP: u64 = u64::MAX;
const SPIN: WaitPolicy = WaitPolicy::spin_then_sleep(u32::MAX, 0);

/// The floor's shared page: the two signal words, the two host words (written by the
/// GPUs, [`Order::HostValues`] and [`Order::HostWords`]), then the IPC handles B opens.
#[repr(C, align(128))]
struct FloorPage {
    ping: AtomicU64,
    _pad0: [u64; 15],
    pong: AtomicU64,
    _pad1: [u64; 15],
    words: HostWords,
    // Memory handles of A's and B's buffers, and the event handles A→B and B→A.
    handles: [[AtomicU64; 8]; 4],
}

/// The ready and the release word in host shared memory, each on a line of its own.
#[repr(C, align(128))]
struct HostWords {
    ready: AtomicU64,
    _pad0: [u64; 15],
    release: AtomicU64,
    _pad1: [u64; 15],
}

/// How a raw protocol orders the consumer's stream on the producer's (and the producer's
/// reuse of a slot on the consumer's reads).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Order {
    /// A ready and a release interprocess event (gpuring's protocol).
    Events,
    /// `cuStreamWriteValue64` after the writes, `cuStreamWaitValue64` (≥) on the other
    /// stream before the reads, on words in the producer's device memory.
    DeviceValues,
    /// The same, on the page's [`HostWords`], pinned and mapped for the device in each
    /// process.
    HostValues,
    /// The producer's stream writes the page's ready word (`cuStreamWriteValue64`); the
    /// consumer's CPU waits until it has the sequence, then enqueues its reads, after
    /// which its stream writes the release word, which the producer's CPU waits for
    /// before it reuses the slot. Streams write values and never wait on one.
    HostWords,
    /// [`HostWords`](Order::HostWords) for the ready side, a release IPC event per slot
    /// for the other, with gpuring's two skips: the consumer records it unless its stream
    /// is idle, the producer's stream waits on it unless a query says it completed. What a
    /// gpuring channel ordered by a host ready word would do.
    HostReady,
}

impl Order {
    fn tag(self) -> &'static str {
        match self {
            Order::Events => "events",
            Order::DeviceValues => "values",
            Order::HostValues => "host-values",
            Order::HostWords => "host-words",
            Order::HostReady => "host-ready",
        }
    }

    fn from_tag(tag: &str) -> Self {
        [Order::Events, Order::DeviceValues, Order::HostValues, Order::HostWords, Order::HostReady]
            .into_iter()
            .find(|o| o.tag() == tag)
            .unwrap_or_else(|| panic!("unknown order {tag}"))
    }

    /// The row's name: `floor_<kind>_<suffix>`.
    fn row(self, suffix: &str) -> String {
        let kind = match self {
            Order::Events => "ipc_events",
            Order::DeviceValues => "stream_values",
            Order::HostValues => "host_values",
            Order::HostWords => "host_words",
            Order::HostReady => "host_ready",
        };
        format!("floor_{kind}_{suffix}")
    }
}

/// Where a protocol's ready and release words are, as this process's device sees them.
struct Words {
    order: Order,
    ready: sys::CUdeviceptr,
    release: sys::CUdeviceptr,
    _mapped: Option<DeviceMapped>,
}

impl Words {
    /// The words of `order`: in the producer's buffer `buf` (as this process addresses
    /// it), or `host`, pinned and mapped for the device here (its page starts at `page`,
    /// `len` bytes).
    fn new(order: Order, buf: sys::CUdeviceptr, host: &HostWords, page: (*mut u8, usize)) -> Self {
        match order {
            Order::Events | Order::DeviceValues => {
                Self { order, ready: buf + READY, release: buf + RELEASE, _mapped: None }
            }
            Order::HostValues | Order::HostWords | Order::HostReady => {
                let mapped = DeviceMapped::new(page.0, page.1);
                let at = |w: &AtomicU64| mapped.device + (w.as_ptr() as u64 - page.0 as u64);
                let (ready, release) = (at(&host.ready), at(&host.release));
                Self { order, ready, release, _mapped: Some(mapped) }
            }
        }
    }

    /// Enqueues on `s` the signal that the work before it is done: `v` into `word`
    /// (`ready` or `release`), or `event` recorded.
    fn signal(&self, word: sys::CUdeviceptr, event: sys::CUevent, v: u64, s: &CudaStream) {
        match self.side(word) {
            Order::Events => record(event, s),
            // SAFETY: the caller's live stream.
            Order::HostReady => match unsafe { sys::cuStreamQuery(s.cu_stream()) } {
                sys::CUresult::CUDA_SUCCESS => {}
                _ => record(event, s),
            },
            _ => write_value(word, v, s),
        }
    }

    /// How `word`'s side is ordered: as the protocol says, but for [`Order::HostReady`],
    /// whose ready side is [`Order::HostWords`] (its release side answers `HostReady`).
    fn side(&self, word: sys::CUdeviceptr) -> Order {
        match self.order {
            Order::HostReady if word == self.ready => Order::HostWords,
            order => order,
        }
    }

    /// Orders what `s` does next after the signal `v` of `word` (`event`): a stream wait,
    /// or (host words) this CPU waiting for `host` to reach `v`, with `peer` watched.
    fn wait(
        &self,
        word: sys::CUdeviceptr,
        host: &AtomicU64,
        event: sys::CUevent,
        v: u64,
        s: &CudaStream,
        peer: Option<&mut common::Peer>,
    ) -> Result<(), String> {
        match self.side(word) {
            Order::Events => wait_event(event, s),
            // SAFETY: a live event.
            Order::HostReady => match unsafe { sys::cuEventQuery(event) } {
                sys::CUresult::CUDA_SUCCESS => {}
                _ => wait_event(event, s),
            },
            Order::DeviceValues | Order::HostValues => wait_value(word, v, s),
            // Acquire: pairs with the other GPU's write of the word (a system-scope fence
            // before it: the writes ordered before it are visible once it is).
            Order::HostWords => match peer {
                Some(peer) => spin_until(peer, "host word", || host.load(Ordering::Acquire) >= v)?,
                None => {
                    while host.load(Ordering::Acquire) < v {
                        std::hint::spin_loop();
                    }
                }
            },
        }
        Ok(())
    }
}

/// A host range pinned and mapped for the device (`cuMemHostRegister`, portable and
/// device-mapped); unregistered on drop.
struct DeviceMapped {
    host: *mut u8,
    device: sys::CUdeviceptr,
}

impl DeviceMapped {
    fn new(host: *mut u8, len: usize) -> Self {
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: `host` is a page-aligned shared mapping of `len` bytes (whole pages) that
        // outlives self (self is dropped before the page).
        ok(unsafe { sys::cuMemHostRegister_v2(host.cast(), len, flags) });
        let mut device = 0;
        // SAFETY: registered just above; out-pointer valid.
        ok(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) });
        Self { host, device }
    }
}

impl Drop for DeviceMapped {
    fn drop(&mut self) {
        // SAFETY: registered in `new`; no stream of ours uses it any more (the benches
        // synchronise, or their peer has stopped, before their words go).
        let _ = unsafe { sys::cuMemHostUnregister(self.host.cast()) };
    }
}

/// Slots of the raw streams (as the gpuring stream's pool).
const STREAM_SLOTS: usize = 64;
/// Where the stream-value words lie in the producer's buffer (past the slots): the ready
/// word, then (another cache line) the release word.
const FLAGS: u64 = 1 << 20;
const READY: u64 = FLAGS;
const RELEASE: u64 = FLAGS + 256;

/// The raw streams' shared page: the producer's head (last sequence published), the
/// consumer's acknowledgement (last sequence released) and its word saying it is set up,
/// the host words, then the handles B opens: the buffer, and per slot the ready and
/// release events.
#[repr(C, align(128))]
struct StreamPage {
    head: AtomicU64,
    _pad0: [u64; 15],
    acked: AtomicU64,
    up: AtomicU64,
    _pad1: [u64; 14],
    words: HostWords,
    mem: [AtomicU64; 8],
    ready: [[AtomicU64; 8]; STREAM_SLOTS],
    release: [[AtomicU64; 8]; STREAM_SLOTS],
}

fn bytes_of(words: &[AtomicU64; 8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    gpuring::internal::load_bytes(words, &mut out);
    out
}

fn ipc_event() -> sys::CUevent {
    event(sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32)
}

/// A new event without timing, with `flags` besides.
fn event(flags: u32) -> sys::CUevent {
    let flags = flags | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let mut e = std::ptr::null_mut();
    // SAFETY: out-pointer valid; context bound by `setup`.
    ok(unsafe { sys::cuEventCreate(&mut e, flags) });
    e
}

/// Writes the IPC handle of our allocation `ptr` into `words`.
fn export_mem(ptr: sys::CUdeviceptr, words: &[AtomicU64; 8]) {
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: out-pointer valid; our allocation.
    ok(unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) });
    gpuring::internal::store_bytes(words, &h.reserved.map(|b| b as u8));
}

/// Writes the IPC handle of our interprocess event `e` into `words`.
fn export_event(e: sys::CUevent, words: &[AtomicU64; 8]) {
    let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
    // SAFETY: out-pointer valid; our interprocess event.
    ok(unsafe { sys::cuIpcGetEventHandle(&mut h, e) });
    gpuring::internal::store_bytes(words, &h.reserved.map(|b| b as u8));
}

/// Opens the allocation whose handle `words` holds (peer access on first use when it is on
/// another device).
fn open_mem(words: &[AtomicU64; 8]) -> sys::CUdeviceptr {
    let h = sys::CUipcMemHandle { reserved: bytes_of(words).map(|b| b as _) };
    let mut ptr = 0;
    let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: a handle the producer exported; out-pointer valid.
    ok(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, lazy) });
    ptr
}

/// Opens the interprocess event whose handle `words` holds.
fn open_event(words: &[AtomicU64; 8]) -> sys::CUevent {
    let h = sys::CUipcEventHandle { reserved: bytes_of(words).map(|b| b as _) };
    let mut e = std::ptr::null_mut();
    // SAFETY: a handle the producer exported; out-pointer valid.
    ok(unsafe { sys::cuIpcOpenEventHandle(&mut e, h) });
    e
}

fn record(e: sys::CUevent, s: &CudaStream) {
    // SAFETY: a live event and stream.
    ok(unsafe { sys::cuEventRecord(e, s.cu_stream()) });
}

fn wait_event(e: sys::CUevent, s: &CudaStream) {
    // SAFETY: a live event and stream.
    ok(unsafe { sys::cuStreamWaitEvent(s.cu_stream(), e, 0) });
}

/// Enqueues on `s` a write of `v` to the device word at `at`, after the work before it
/// (the default flags fence the stream's earlier writes before this one).
fn write_value(at: sys::CUdeviceptr, v: u64, s: &CudaStream) {
    // SAFETY: `at` is a live, 8-byte aligned device word (ours or opened).
    ok(unsafe { sys::cuStreamWriteValue64_v2(s.cu_stream(), at, v, 0) });
}

/// Enqueues on `s` a wait until the device word at `at` is at least `v`.
fn wait_value(at: sys::CUdeviceptr, v: u64, s: &CudaStream) {
    let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: as in `write_value`.
    ok(unsafe { sys::cuStreamWaitValue64_v2(s.cu_stream(), at, v, geq) });
}

/// Whether this context's device has 64-bit stream memory operations (part 3's rows).
fn stream_values_supported(ctx: &cudarc::driver::CudaContext) -> bool {
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS;
    ctx.attribute(attr).is_ok_and(|v| v != 0)
}

/// A device buffer of 2 MiB whose stream-value words start at zero.
fn alloc_buffer(s: &CudaStream) -> sys::CUdeviceptr {
    // SAFETY: a plain allocation, zeroed in stream order and synchronised before use.
    let ptr = unsafe { result::malloc_sync(2 << 20) }.unwrap();
    // SAFETY: the 512 bytes at FLAGS lie inside the allocation.
    ok(unsafe { sys::cuMemsetD8Async(ptr + FLAGS, 0, 512, s.cu_stream()) });
    s.synchronize().unwrap();
    ptr
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

/// Spins until `done`. Fails, naming `what`, if the peer process has exited meanwhile (a
/// driver call it made failed) or nothing changed for [`STALL`], rather than spinning for
/// ever.
fn spin_until(peer: &mut common::Peer, what: &str, done: impl Fn() -> bool) -> Result<(), String> {
    let start = Instant::now();
    let mut n = 0u32;
    while !done() {
        std::hint::spin_loop();
        n = n.wrapping_add(1);
        if n % (1 << 16) == 0 {
            if matches!(peer.0.try_wait(), Ok(Some(_))) {
                return Err(format!("{what}: the peer process exited"));
            }
            if start.elapsed() > STALL {
                return Err(format!("{what}: no progress for {STALL:?}"));
            }
        }
    }
    Ok(())
}

/// How long a raw floor may make no progress before the bench says it stalled.
const STALL: Duration = Duration::from_secs(10);

fn run_peer(role: &str) {
    pin(cpus().get(1 + peer_index()).copied());
    let name = std::env::var(NAME).unwrap();
    let (_, s) = setup_on(peer_device());
    match role {
        role if role.starts_with("floor-") => {
            let order = Order::from_tag(&role["floor-".len()..]);
            let page = SharedPage::<FloorPage>::open(&name);
            let p = page.get();
            let (a_buf, b_buf) = (open_mem(&p.handles[0]), open_mem(&p.handles[1]));
            let words = Words::new(order, a_buf, &p.words, page.mapping());
            let (a_to_b, b_to_a) = if matches!(order, Order::Events | Order::HostReady) {
                (open_event(&p.handles[2]), open_event(&p.handles[3]))
            } else {
                (std::ptr::null_mut(), std::ptr::null_mut())
            };
            let mut last = 0;
            loop {
                // Acquire/Release: the signal itself is what is measured.
                let v = p.ping.load(Ordering::Acquire);
                if v == last {
                    std::hint::spin_loop();
                    continue;
                }
                if v == STOP {
                    s.synchronize().unwrap();
                    return;
                }
                last = v;
                words.wait(words.ready, &p.words.ready, a_to_b, v, &s, None).unwrap();
                copy_word(b_buf, a_buf, &s);
                words.signal(words.release, b_to_a, v, &s);
                p.pong.store(v, Ordering::Release);
            }
        }
        role if role.starts_with("stream-") => {
            let order = Order::from_tag(&role["stream-".len()..]);
            let page = SharedPage::<StreamPage>::open(&name);
            let p = page.get();
            let buf = open_mem(&p.mem);
            let words = Words::new(order, buf, &p.words, page.mapping());
            let (ready, release): (Vec<_>, Vec<_>) =
                if matches!(order, Order::Events | Order::HostReady) {
                    p.ready
                        .iter()
                        .zip(&p.release)
                        .map(|(r, l)| (open_event(r), open_event(l)))
                        .unzip()
                } else {
                    (
                        vec![std::ptr::null_mut(); STREAM_SLOTS],
                        vec![std::ptr::null_mut(); STREAM_SLOTS],
                    )
                };
            // Release: pairs with the producer's Acquire load before its probe's clock.
            p.up.store(1, Ordering::Release);
            let mut next = 1u64;
            loop {
                // Acquire: pairs with the producer's Release store of `head`.
                let head = p.head.load(Ordering::Acquire);
                if head == STOP {
                    s.synchronize().unwrap();
                    return;
                }
                if next > head {
                    std::hint::spin_loop();
                    continue;
                }
                while next <= head {
                    let i = next as usize % STREAM_SLOTS;
                    words.wait(words.ready, &p.words.ready, ready[i], next, &s, None).unwrap();
                    words.signal(words.release, release[i], next, &s);
                    // Release: pairs with the producer's Acquire load before reuse.
                    p.acked.store(next, Ordering::Release);
                    next += 1;
                }
            }
        }
        "echo" | "echo-flag" | "echo-default" | "echo-flag-default" => {
            let flags = role.starts_with("echo-flag");
            let ready = if flags { GpuReady::HostFlag } else { GpuReady::Event };
            let policy = if role.ends_with("-default") { WaitPolicy::default() } else { SPIN };
            let ch_ab = Channel::builder(format!("{name}-ab")).cuda(&s).open().unwrap();
            let ch_ba = Channel::builder(format!("{name}-ba")).cuda(&s).ready(ready).open();
            let ch_ba = ch_ba.unwrap();
            let mut rx = ch_ab.receiver().unwrap();
            let mut tx = ch_ba.sender().unwrap();
            rx.set_wait_policy(policy);
            tx.set_wait_policy(policy);
            loop {
                let m = rx.recv().unwrap();
                if m.tag() == STOP {
                    return;
                }
                let lease = tx.acquire().unwrap();
                copy_word(lease.device_ptr(), m.device_ptr(), &s);
                // The reply first, then the message goes (its release record is then off
                // the reply's path; the copy that reads it is queued before either).
                tx.send(lease, TensorMeta::bytes(4)).unwrap();
                drop(m);
            }
        }
        "sink" => {
            let ch = Channel::builder(&name).cuda(&s).open().unwrap();
            let mut rx = ch.receiver().unwrap();
            rx.set_wait_policy(SPIN);
            loop {
                let m = rx.recv().unwrap();
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
    let mut lease = tx.acquire().unwrap();
    memset(lease.device_ptr(), v, s);
    lease.set_tag(tag);
    tx.send(lease, TensorMeta::bytes(4)).unwrap();
}

/// Tells the peer to stop, and reaps it once it has taken the message.
fn stop(tx: &Sender<Cuda>, s: &Arc<CudaStream>, peer: common::Peer) {
    send_word(tx, s, 0, STOP);
    peer.finish();
}

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// The raw ping-pong: A's word goes to B's stream and back, ordered as `order` says,
/// signalled through a spinning shared word, every handle opened once up front.
fn floor(g: &mut Group<'_>, order: Order) {
    let (_ctx, s) = setup();
    let name = format!("/{}", unique("gpufloor"));
    let page = SharedPage::<FloorPage>::create(&name);
    let p = page.get();
    let (a_buf, b_buf) = (alloc_buffer(&s), alloc_buffer(&s));
    let words = Words::new(order, a_buf, &p.words, page.mapping());
    let (a_to_b, b_to_a) = (ipc_event(), ipc_event());
    export_mem(a_buf, &p.handles[0]);
    export_mem(b_buf, &p.handles[1]);
    export_event(a_to_b, &p.handles[2]);
    export_event(b_to_a, &p.handles[3]);
    let mut peer = peer(&format!("floor-{}", order.tag()), &name, 0, false);
    let mut seq = 0u64;
    let id = order.row("spin");
    g.bench_function(&id, |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                memset(a_buf, seq as u32, &s);
                words.signal(words.ready, a_to_b, seq, &s);
                p.ping.store(seq, Ordering::Release);
                // Acquire: pairs with the peer's Release store of `pong`.
                spin_until(&mut peer, &id, || p.pong.load(Ordering::Acquire) == seq).unwrap();
                let release = &p.words.release;
                words.wait(words.release, release, b_to_a, seq, &s, Some(&mut peer)).unwrap();
                assert_eq!(read_word(b_buf, &s), seq as u32);
            }
            t.elapsed() / 2
        })
    });
    p.ping.store(STOP, Ordering::Release);
    peer.finish();
}

/// gpuring's ping-pong, its senders signalling as `ready` says, both ends spinning without
/// end, or (`spin == false`) on the default [`WaitPolicy`], as an application's would be.
fn gpuring_ping_pong(g: &mut Group<'_>, ready: GpuReady, spin: bool) {
    let (_, s) = setup();
    let name = unique("gpupp");
    let make = |suffix: &str| {
        let b = Channel::builder(format!("{name}-{suffix}")).capacity(16).slots(4, 4096);
        b.cuda(&s).ready(ready).create()
    };
    let (ab, ba) = (make("ab").unwrap(), make("ba").unwrap());
    let mut tx = ab.sender().unwrap();
    let mut rx = ba.receiver().unwrap();
    let policy = if spin { SPIN } else { WaitPolicy::default() };
    tx.set_wait_policy(policy);
    rx.set_wait_policy(policy);
    let flags = ready == GpuReady::HostFlag;
    let (role_flag, id_flag) = if flags { ("-flag", "_host_flags") } else { ("", "") };
    let (role_waits, id_waits) = if spin { ("", "spin") } else { ("-default", "default") };
    let echo = peer(&format!("echo{role_flag}{role_waits}"), &name, 0, false);
    let mut seq = 0u64;
    let id = format!("gpuring_spsc_{id_waits}{id_flag}");
    g.bench_function(&id, |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                seq += 1;
                send_word(&tx, &s, seq as u32, 0);
                let m = rx.recv().unwrap();
                assert_eq!(read_word(m.device_ptr(), &s), seq as u32);
            }
            t.elapsed() / 2
        })
    });
    stop(&tx, &s, echo);
}

/// The raw stream: 64 slots of one buffer, A writes a word into each and publishes it
/// (`head`), B orders its stream after it and releases it (`acked`); A reuses a slot once B
/// released it, ordered after B's release. Ordered as `order` says: by a ready and a
/// release IPC event per slot ([`Order::Events`], the protocol of a gpuring channel with
/// nothing else), or by the two words.
///
/// A probe runs first, once B is set up: 20,000 items, then A waits for the last release
/// and synchronises, so its figure includes all the GPU work (criterion's rows, like
/// gpuring's stream row, time until B has released every item, which with stream waits
/// the GPU bounds only through the depth of the driver's queues). A watchdog ends the
/// whole run, peer included, when the probe stalls, even inside a driver call that never
/// returns; the row is then reported as stalled and not measured. Another watches the
/// synchronise after the row.
fn raw_stream(g: &mut Group<'_>, order: Order) {
    let (_ctx, s) = setup();
    let name = format!("/{}", unique("gpurawstream"));
    let page = SharedPage::<StreamPage>::create(&name);
    let p = page.get();
    let buf = alloc_buffer(&s);
    let words = Words::new(order, buf, &p.words, page.mapping());
    export_mem(buf, &p.mem);
    let (mut ready, mut release) = (Vec::new(), Vec::new());
    for i in 0..STREAM_SLOTS {
        if matches!(order, Order::Events | Order::HostReady) {
            let (r, l) = (ipc_event(), ipc_event());
            export_event(r, &p.ready[i]);
            export_event(l, &p.release[i]);
            ready.push(r);
            release.push(l);
        } else {
            ready.push(std::ptr::null_mut());
            release.push(std::ptr::null_mut());
        }
    }
    let mut peer = peer(&format!("stream-{}", order.tag()), &name, 0, false);
    let id = order.row("stream");
    let mut seq = 0u64;
    // Waits until B has released item `v` (its slot's last use), and orders what `s` does
    // next after B's release.
    let released = |v: u64, peer: &mut common::Peer| -> Result<(), String> {
        // Acquire: pairs with the peer's Release store of `acked`.
        spin_until(peer, &id, || p.acked.load(Ordering::Acquire) >= v)?;
        let i = v as usize % STREAM_SLOTS;
        words.wait(words.release, &p.words.release, release[i], v, &s, Some(peer))
    };
    // Publishes item `seq + 1`.
    let send = |seq: &mut u64, peer: &mut common::Peer| -> Result<(), String> {
        *seq += 1;
        let i = *seq as usize % STREAM_SLOTS;
        if *seq > STREAM_SLOTS as u64 {
            released(*seq - STREAM_SLOTS as u64, peer)?;
        }
        memset(buf + (i as u64) * 4096, *seq as u32, &s);
        words.signal(words.ready, ready[i], *seq, &s);
        // Release: pairs with the peer's Acquire load of `head`.
        p.head.store(*seq, Ordering::Release);
        Ok(())
    };
    const PROBE: u64 = 20_000;
    // The peer's start (its context, its imports) is not the probe's to time. Acquire:
    // pairs with the peer's Release store of `up`.
    spin_until(&mut peer, &id, || p.up.load(Ordering::Acquire) == 1).unwrap();
    let watchdog =
        Watchdog::start(peer.0.id(), &name, order.row("stream"), Duration::from_secs(30));
    let t = Instant::now();
    let probe = (0..PROBE).try_for_each(|_| send(&mut seq, &mut peer)).and_then(|()| {
        released(seq, &mut peer)?;
        s.synchronize().map_err(|e| format!("{id}: synchronize: {e:?}"))
    });
    let spent = t.elapsed();
    watchdog.stop();
    match probe {
        Ok(()) => println!(
            "{id}: probe: {PROBE} items in {:.1} ms with the GPU work done: {:.1} k items/s",
            spent.as_secs_f64() * 1e3,
            PROBE as f64 / spent.as_secs_f64() / 1e3
        ),
        Err(e) => {
            println!("{id}: probe STALLED after {seq} items: {e}; row not measured");
            return;
        }
    }
    g.bench_function(&id, |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                send(&mut seq, &mut peer).unwrap();
            }
            // Acquire: pairs with the peer's Release store of `acked`.
            spin_until(&mut peer, &id, || p.acked.load(Ordering::Acquire) == seq).unwrap();
            t.elapsed()
        })
    });
    p.head.store(STOP, Ordering::Release);
    let watchdog = Watchdog::start(peer.0.id(), &name, id.clone(), Duration::from_secs(30));
    s.synchronize().unwrap();
    watchdog.stop();
    peer.finish();
}

/// Ends the process (killing `peer`, unlinking the page `page`) when not stopped within
/// `limit`: for a probe, or a synchronise, that may stall inside a driver call.
struct Watchdog(std::sync::mpsc::Sender<()>);

impl Watchdog {
    fn start(peer: u32, page: &str, what: String, limit: Duration) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let page = page.to_owned();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                println!("{what}: STALLED for {limit:?} (a driver call does not return)");
                let _ = std::process::Command::new("kill").args(["-9", &peer.to_string()]).status();
                let _ = rustix::shm::unlink(page.as_str());
                std::process::exit(3);
            }
        });
        Self(tx)
    }

    fn stop(self) {
        let _ = self.0.send(());
    }
}

/// gpuring's stream, its sender signalling as `ready` says.
fn gpuring_stream(g: &mut Group<'_>, ready: GpuReady) {
    let (_, s) = setup();
    let name = unique("gpustream");
    let ch = Channel::builder(&name).capacity(256).slots(64, 4096).cuda(&s).ready(ready);
    let ch = ch.create().unwrap();
    let mut tx = ch.sender().unwrap();
    tx.set_wait_policy(SPIN);
    let sink = peer("sink", &name, 0, false);
    let mut seq = 0u64;
    let id = if ready == GpuReady::HostFlag {
        "gpuring_spsc_1p1c_host_flags"
    } else {
        "gpuring_spsc_1p1c"
    };
    g.bench_function(id, |b| {
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
}

/// The calling thread's time per driver call of the hot path, in this process's context:
/// 64 calls timed, then a synchronize untimed (so the queue never fills), repeated.
/// `waits`: also the stream waits on values (met ones; such waits have hung under MPS).
fn driver_calls(c: &mut Criterion, values: bool, waits: bool) {
    let mut g = c.benchmark_group("gpu_driver_calls");
    g.measurement_time(Duration::from_secs(1));
    let (_ctx, s) = setup();
    let buf = alloc_buffer(&s);
    let (ipc, plain) = (ipc_event(), event(0));
    record(ipc, &s);
    record(plain, &s);
    s.synchronize().unwrap();
    let mut case = |id: &str, call: &dyn Fn()| {
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(64);
                    let t = Instant::now();
                    for _ in 0..n {
                        call();
                    }
                    spent += t.elapsed();
                    s.synchronize().unwrap();
                    left -= n;
                }
                spent
            })
        });
    };
    case("cuEventRecord_ipc_event", &|| record(ipc, &s));
    case("cuEventRecord_plain_event", &|| record(plain, &s));
    case("cuStreamWaitEvent_ipc_event_done", &|| wait_event(ipc, &s));
    // SAFETY: a live event; its record completed (the synchronize in each round).
    case("cuEventQuery_ipc_event_done", &|| ok(unsafe { sys::cuEventQuery(ipc) }));
    case("cuMemsetD32Async_one_word", &|| memset(buf, 1, &s));
    // SAFETY: a live stream (idle: the synchronize in each round, and nothing queued).
    case("cuStreamQuery_idle", &|| ok(unsafe { sys::cuStreamQuery(s.cu_stream()) }));
    if values {
        case("cuStreamWriteValue64", &|| write_value(buf + READY, 1, &s));
        if waits {
            case("cuStreamWaitValue64_met", &|| wait_value(buf + READY, 1, &s));
        }
        let page = SharedPage::<HostWords>::create(&format!("/{}", unique("gpuwords")));
        let mapped = DeviceMapped::new(page.mapping().0, page.mapping().1);
        case("cuStreamWriteValue64_host_word", &|| write_value(mapped.device, 1, &s));
        if waits {
            case("cuStreamWaitValue64_host_word_met", &|| wait_value(mapped.device, 1, &s));
        }
        s.synchronize().unwrap();
    }
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
    let (ctx, _) = setup();
    let (here, there) = (cuda::device_info(&ctx).unwrap(), peer_device());
    println!(
        "gpu bench: producer on GPU {} ({}, MPS: {:?}), consumer on GPU {there}",
        here.ordinal, here.name, here.mps
    );
    let values = stream_values_supported(&ctx) && stream_values_supported(&setup_on(there).0);
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("gpu_handoff_one_way");
        floor(&mut g, Order::Events);
        gpuring_ping_pong(&mut g, GpuReady::Event, true);
        if values {
            gpuring_ping_pong(&mut g, GpuReady::HostFlag, true);
        }
        gpuring_ping_pong(&mut g, GpuReady::Event, false);
        if values {
            gpuring_ping_pong(&mut g, GpuReady::HostFlag, false);
        }
        g.finish();
    }
    {
        let mut g = c.benchmark_group("gpu_stream");
        g.throughput(Throughput::Elements(1));
        raw_stream(&mut g, Order::Events);
        gpuring_stream(&mut g, GpuReady::Event);
        if values {
            gpuring_stream(&mut g, GpuReady::HostFlag);
        }
        g.finish();
    }
    // GPURING_BENCH_NO_VALUE_WAITS=1: no stream waits on a value, here or below (such
    // waits have hung under MPS).
    let no_waits = std::env::var_os("GPURING_BENCH_NO_VALUE_WAITS").is_some();
    driver_calls(&mut c, values, !no_waits);
    if values {
        // Stream waits on device words last: the form that once stalled (a stalled probe
        // ends the run).
        let orders = [Order::HostWords, Order::HostReady, Order::HostValues, Order::DeviceValues];
        let orders = &orders[..if no_waits { 2 } else { 4 }];
        let mut g = c.benchmark_group("gpu_stream_values");
        for &order in orders {
            floor(&mut g, order);
        }
        g.throughput(Throughput::Elements(1));
        for &order in orders {
            raw_stream(&mut g, order);
        }
        g.finish();
    } else {
        println!("gpu_stream_values: skipped (no 64-bit stream memory operations here)");
    }
    c.final_summary();
}
