//! Kill storms that lose nothing: receivers SIGKILLed at every fault point of the receiving
//! side and at random times, while senders stream (and, MPMC, are killed too). Every
//! message published reaches a receiver at least once; every message that comes twice is
//! marked a redelivery; every slot comes back; nothing is left in `/dev/shm`.
//!
//! `cargo test --features fault-injection --test storms` (`.ci/run` runs it). The same
//! storms over device slots: `gpu_storms_lose_nothing`, ignored without a GPU (built with
//! `--features cuda,fault-injection` for the GPU machine).
#![cfg(all(feature = "fault-injection", not(loom)))]

mod common;

use std::collections::HashMap;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Deliveries, Rand, announce, ring_name, role, unique_name};
use gpuring::{Backend, Channel, ChannelBuilder, TensorMeta};

/// The receiving side's fault points; a receiver is killed at one (at a random count) or
/// at a random time, whichever comes first (`redeliver_holding` is reached only where
/// there is something to take over; `pop_won` only in MPMC, `adopt_won` only where a dead
/// receiver's ring cell is adopted, `refused_holding` only where a killed GPU sender's
/// messages are refused).
const POINTS: [&str; 7] = [
    "recv_holding",
    "recv_popped",
    "redeliver_holding",
    "release_marked",
    "pop_won",
    "adopt_won",
    "refused_holding",
];
const RECEIVER_KILLS: u32 = 100;
const SLOTS: u32 = 8;
const LIMIT: Duration = Duration::from_secs(5);

/// Whether this storm's peers use device slots (`GPURING_TEST_GPU` set by the parent).
fn on_gpu() -> bool {
    std::env::var_os("GPURING_TEST_GPU").is_some()
}

/// Opens the storm's channel as this child's kind says and runs `then` with it.
macro_rules! with_channel {
    ($then:ident) => {{
        #[cfg(feature = "cuda")]
        let gpu = on_gpu().then(common::gpu::setup);
        #[cfg(not(feature = "cuda"))]
        let gpu: Option<()> = {
            assert!(!on_gpu(), "a GPU storm needs the cuda feature");
            None
        };
        match gpu {
            #[cfg(feature = "cuda")]
            Some((_ctx, stream)) => {
                $then(Channel::builder(ring_name()).cuda(&stream).open().unwrap())
            }
            _ => $then(Channel::builder(ring_name()).open().unwrap()),
        }
    }};
}

/// A receiver that holds up to 2 messages (dropping the oldest as a third comes) and
/// announces each (`got <tag> <redelivered>`) before holding it, until it is killed.
fn holding_receiver() -> ! {
    with_channel!(hold)
}

fn hold<B: Backend>(ch: Channel<B>) -> ! {
    let rx = ch.receiver().unwrap();
    let mut held = std::collections::VecDeque::new();
    loop {
        match rx.recv_timeout(LIMIT) {
            Ok(m) => {
                announce(&format!("got {} {}", m.tag(), m.redelivered()));
                held.push_back(m);
                if held.len() > 2 {
                    held.pop_front();
                }
            }
            // Every sender gone for a moment (MPMC: killed, its replacement not yet there).
            Err(gpuring::RecvTimeoutError::PeerDead | gpuring::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Nothing for LIMIT: a stall. Said, for the parent to fail the storm with the
            // timeline around it, and waited through.
            Err(gpuring::RecvTimeoutError::Timeout) => announce("stalled"),
            // Anything else is said (the parent fails the storm on it) and the receive
            // carries on: a panic would end this process slowly (a CUDA context's exit),
            // holding what it took the while.
            Err(e) => {
                announce(&format!("error {e:?}"));
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// An MPMC sender child: streams messages tagged `id << 32 | seq`, announcing each once
/// `send` returned (`sent <tag>`), until the stop file exists; then leaves cleanly.
fn streaming_sender() {
    with_channel!(stream_into)
}

fn stream_into<B: Backend>(ch: Channel<B>) {
    let tx = ch.sender().unwrap();
    announce("ready");
    let id: u64 = std::env::var("GPURING_TEST_TAG").unwrap().parse().unwrap();
    let stop = stop_file(&ring_name());
    for seq in 0.. {
        if seq % 64 == 0 && stop.exists() {
            return;
        }
        let Ok(mut lease) = tx.acquire_timeout(Duration::from_millis(20)) else { continue };
        let tag = id << 32 | seq;
        lease.set_tag(tag);
        if tx.send_timeout(lease, TensorMeta::bytes(8), Duration::from_millis(20)).is_ok() {
            announce(&format!("sent {tag}"));
        }
    }
}

fn stop_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{name}.stop"))
}

/// A child and the thread that reads its announcements.
struct Running {
    child: Child,
    reader: Option<JoinHandle<()>>,
    until: Instant,
    label: String,
}

/// What happened in a storm, in order (ms since its start, who, what): read only when a
/// message was lost, to show what was around it.
type Timeline = Arc<Mutex<Vec<(u128, String, String)>>>;

impl Drop for Running {
    fn drop(&mut self) {
        // A failing test leaves no child behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shared records of one storm.
#[derive(Clone)]
struct Records {
    got: Arc<Mutex<Deliveries>>,
    sent: Arc<Mutex<Vec<u64>>>,
    timeline: Timeline,
    started: Instant,
    /// The children alive now (label, pid), for the watchdog.
    live: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Records {
    fn note(&self, who: &str, what: String) {
        let at = self.started.elapsed().as_millis();
        self.timeline.lock().unwrap().push((at, who.to_owned(), what));
    }
}

/// Spawns `role` of `test` with `env` as `label`, its `got` lines noted in `got` and its
/// `sent` lines in `sent` (each also in the timeline); killed at `until` at the latest.
fn start(
    name: &str,
    role: &str,
    label: String,
    env: &[(&str, String)],
    records: &Records,
    until: Instant,
) -> Running {
    let r = records.clone();
    let who = label.clone();
    let (child, reader) =
        common::spawn_reading("storms_lose_nothing", role, name, env, move |line| {
            if line.starts_with("got ") {
                r.got.lock().unwrap().note_line(line);
            } else if let Some(tag) = line.strip_prefix("sent ") {
                r.sent.lock().unwrap().push(tag.parse().unwrap());
            }
            r.note(&who, line.to_owned());
        });
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    records.note(&label, format!("started pid {} {}", child.id(), env.join(" ")));
    records.live.lock().unwrap().push((label.clone(), child.id()));
    Running { child, reader: Some(reader), until, label }
}

/// The timeline around each lost message (`lost`, tags): its sender's messages before and
/// after it, and every kill and start near the time it was announced.
fn explain(lost: &[u64], records: &Records) {
    let timeline = records.timeline.lock().unwrap();
    for &tag in lost {
        let (id, seq) = (tag >> 32, tag & 0xFFFF_FFFF);
        let sent_at = timeline.iter().find(|(_, _, w)| *w == format!("sent {tag}")).map(|e| e.0);
        println!("lost {tag:#x} (sender {id}, number {seq}), announced at {sent_at:?} ms");
        let Some(at) = sent_at else { continue };
        for (t, who, what) in timeline.iter() {
            let near = t.abs_diff(at) <= 300;
            let neighbour = [seq.wrapping_sub(2), seq.wrapping_sub(1), seq + 1, seq + 2]
                .iter()
                .any(|s| what.starts_with(&format!("got {} ", id << 32 | s)));
            let event = !what.starts_with("got ") && !what.starts_with("sent ");
            if (near && event) || neighbour || what.contains(&tag.to_string()) {
                println!("  {t:>6} ms {who:>5} {what}");
            }
        }
    }
}

/// Says, when the storm's loop has not come round for over a second, what its thread and
/// every live child's threads are doing (state, kernel wait channel, system call from
/// `/proc`), and the channel's state: a stalled storm shows where it waits.
struct Watchdog {
    beat: Arc<std::sync::atomic::AtomicU64>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    fn start(records: &Records, name: &str) -> Self {
        let name = name.to_owned();
        let beat = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        // The storm loop's thread (this one), as `/proc/<pid>/task/<tid>`.
        let me = std::fs::read_link("/proc/thread-self").unwrap();
        let (b, d, r) = (beat.clone(), done.clone(), records.clone());
        let thread = std::thread::spawn(move || {
            let mut said = u64::MAX;
            while !d.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let now = r.started.elapsed().as_millis() as u64;
                let last = b.load(Ordering::Relaxed);
                if now.saturating_sub(last) < 1000 || said == last {
                    continue;
                }
                said = last;
                println!("watchdog at {now} ms: the storm loop last came round at {last} ms");
                println!("  loop: {}", thread_state(&std::path::Path::new("/proc").join(&me)));
                for (label, pid) in r.live.lock().unwrap().iter() {
                    let tasks = format!("/proc/{pid}/task");
                    let Ok(dir) = std::fs::read_dir(&tasks) else { continue };
                    for t in dir.flatten() {
                        println!("  {label:>5} {pid}: {}", thread_state(&t.path()));
                    }
                }
                println!("{:#?}", gpuring::inspect::inspect(&name));
            }
        });
        Self { beat, done, thread: Some(thread) }
    }

    /// Says that the storm loop came round now.
    fn beat(&self, records: &Records) {
        let now = records.started.elapsed().as_millis() as u64;
        self.beat.store(now, Ordering::Relaxed);
    }
}

/// A thread's name, state, kernel wait channel and system call, from its `/proc` folder.
fn thread_state(task: &std::path::Path) -> String {
    let read = |f: &str| std::fs::read_to_string(task.join(f)).unwrap_or_default();
    let stat = read("stat");
    let state = stat.rsplit_once(") ").map_or("?", |(_, rest)| &rest[..1]);
    let syscall = read("syscall");
    let nr = syscall.split_whitespace().next().unwrap_or("?");
    format!(
        "{} {} state {state} wchan {} syscall {nr}",
        task.file_name().unwrap().to_string_lossy(),
        read("comm").trim(),
        read("wchan").trim()
    )
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.thread.take().unwrap().join();
    }
}

/// How long receivers took to die: from a receiver's fault announcement (just before it
/// sends itself SIGKILL) to the parent seeing it dead, the slowest and how many took over
/// 100 ms. (A process holds its liveness locks until it has finished dying.)
fn dying_times(what: &str, records: &Records) {
    let timeline = records.timeline.lock().unwrap();
    let mut faulted: HashMap<&str, u128> = HashMap::new();
    let (mut slowest, mut slow) = ((0, ""), 0);
    for (t, who, event) in timeline.iter() {
        if event.starts_with("fault ") {
            faulted.insert(who, *t);
        } else if event == "died at its point" {
            let took = faulted.get(who.as_str()).map_or(0, |f| t - f);
            slow += u32::from(took > 100);
            if took > slowest.0 {
                slowest = (took, who);
            }
        }
    }
    println!("{what}: slowest death {} ms ({}), {slow} over 100 ms", slowest.0, slowest.1);
}

/// Kills `r` (if its fault point has not already) and waits for it and its reader; says
/// whether it died at its fault point.
fn stop(r: &mut Running, records: &Records) -> bool {
    let at_point = r.child.try_wait().unwrap().is_some();
    records.note(&r.label, if at_point { "died at its point" } else { "killed" }.to_owned());
    let _ = r.child.kill();
    let t = Instant::now();
    let status = r.child.wait().unwrap();
    if t.elapsed() > Duration::from_millis(50) {
        // A process slow to finish dying holds its locks (and with them its liveness).
        records.note(&r.label, format!("reaped {:?} after the kill", t.elapsed()));
    }
    use std::os::unix::process::ExitStatusExt;
    records.live.lock().unwrap().retain(|(label, _)| *label != r.label);
    assert_eq!(status.signal(), Some(9), "{}: a peer ends by SIGKILL only: {status}", r.label);
    r.reader.take().unwrap().join().unwrap();
    at_point
}

/// SPSC (one sender thread here, receivers killed one after another; and, in the test
/// below, MPMC with 3 sender processes and 3 receivers at a time, senders killed too in
/// its second storm): 100 receiver kills each, at a fault point (one of `POINTS` at a count of 1 to 20)
/// or 40–250 ms after the start, whichever comes first. Then the senders stop, a last
/// receiver drains the channel, and: every message published (SPSC: every `send` that
/// returned; MPMC: every one a sender announced) came at least once; every extra copy was
/// marked a redelivery; every slot came back (SPSC: the sender leases them all; MPMC:
/// every pool drained and unlinked itself); nothing is left in `/dev/shm`.
#[test]
fn storms_lose_nothing() {
    storms(&[(false, false)], false);
}

/// The MPMC storms: receivers killed, then senders killed too (one after every 10
/// receiver kills).
#[test]
fn mpmc_storms_lose_nothing() {
    storms(&[(true, false), (true, true)], false);
}

/// The three storms over device slots (host ready flags, the default): every process a
/// CUDA context on GPU 0, receivers killed at a fault point or 0.4–1 s after they start
/// (a context takes a few hundred ms to make).
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine, built with --features cuda,fault-injection)"]
fn gpu_storms_lose_nothing() {
    let all = [(false, false), (true, false), (true, true)];
    // GPURING_TEST_STORM=<0|1|2>: that storm only.
    match std::env::var("GPURING_TEST_STORM").ok().and_then(|s| s.parse::<usize>().ok()) {
        Some(i) if role().is_none() => storms(&all[i..=i], true),
        _ => storms(&all, true),
    }
}

/// Runs a storm for each `(mpmc, kill_senders)`, over device slots with `gpu`.
fn storms(which: &[(bool, bool)], gpu: bool) {
    match role().as_deref() {
        Some("receiver") => holding_receiver(),
        Some("sender") => return streaming_sender(),
        _ => {}
    }
    #[cfg(feature = "cuda")]
    if gpu {
        let (_ctx, stream) = common::gpu::setup();
        // GPURING_TEST_READY=event: the sender's writes signalled by events, not host flags.
        let ready = match std::env::var("GPURING_TEST_READY").as_deref() {
            Ok("event") => gpuring::GpuReady::Event,
            _ => gpuring::GpuReady::HostFlag,
        };
        println!("ready: {ready:?}");
        return storms_of(which, |b| b.cuda(&stream).ready(ready), true);
    }
    assert!(!gpu, "a GPU storm needs the cuda feature");
    storms_of(which, |b| b, false)
}

/// The storms of `storms`, each channel made by `make` from a host builder.
fn storms_of<B: Backend>(
    which: &[(bool, bool)],
    make: impl Fn(ChannelBuilder) -> ChannelBuilder<B>,
    gpu: bool,
) {
    let mut rand = Rand::from_pid(0x9e37_79b9_7f4a_7c15);
    println!("seed {:#x}{}", rand.0, if gpu { ", device slots" } else { "" });
    // Where a receiver is killed at the latest: ms after its start, and the span after that.
    let (late, span) = if gpu { (400, 601) } else { (40, 211) };
    let gpu_env = gpu.then(|| ("GPURING_TEST_GPU", "1".to_owned()));
    for &(mpmc, kill_senders) in which {
        let what = if mpmc { "mpmc 3 x 3" } else { "spsc" };
        let name = unique_name(if mpmc { "storm-mpmc" } else { "storm-spsc" });
        let b = make(Channel::builder(&name).capacity(16).slots(SLOTS, 64));
        let ch = if mpmc { b.mpmc().max_senders(16) } else { b }.create().unwrap();
        let started = Instant::now();
        let records = Records {
            got: Arc::new(Mutex::new(Deliveries::default())),
            sent: Arc::new(Mutex::new(Vec::new())),
            timeline: Arc::new(Mutex::new(Vec::new())),
            started,
            live: Arc::new(Mutex::new(Vec::new())),
        };
        let watchdog = Watchdog::start(&records, &name);
        let (got, sent) = (records.got.clone(), records.sent.clone());
        // The senders: a thread here (SPSC), or processes (MPMC).
        let done = Arc::new(AtomicBool::new(false));
        let mut in_process = None;
        let mut senders = Vec::new();
        let mut next_id = 1u64;
        let spawn_sender = |id: u64| {
            let env: Vec<_> =
                [("GPURING_TEST_TAG", id.to_string())].into_iter().chain(gpu_env.clone()).collect();
            let until = Instant::now() + Duration::from_secs(3600);
            start(&name, "sender", format!("s{id}"), &env, &records, until)
        };
        if mpmc {
            for _ in 0..3 {
                senders.push(spawn_sender(next_id));
                next_id += 1;
            }
        } else {
            let tx = ch.sender().unwrap();
            let (done, sent) = (done.clone(), sent.clone());
            in_process = Some(std::thread::spawn(move || {
                let mut seq = 0;
                while !done.load(Ordering::Relaxed) {
                    let Ok(mut lease) = tx.acquire_timeout(Duration::from_millis(20)) else {
                        continue;
                    };
                    lease.set_tag(seq);
                    if tx.send_timeout(lease, TensorMeta::bytes(8), LIMIT).is_ok() {
                        sent.lock().unwrap().push(seq);
                        seq += 1;
                    }
                }
                tx
            }));
        }
        // The receivers, killed and replaced.
        let mut next_receiver = 0;
        let mut spawn_receiver = |rand: &mut Rand| {
            let point = POINTS[rand.below(POINTS.len() as u64) as usize];
            let fault = ("GPURING_FAULT", format!("{point}:{}", 1 + rand.below(20)));
            let env: Vec<_> = [fault].into_iter().chain(gpu_env.clone()).collect();
            let until = Instant::now() + Duration::from_millis(late + rand.below(span));
            next_receiver += 1;
            start(&name, "receiver", format!("r{next_receiver}"), &env, &records, until)
        };
        let mut receivers: Vec<Running> =
            (0..if mpmc { 3 } else { 1 }).map(|_| spawn_receiver(&mut rand)).collect();
        let (mut kills, mut at_points, mut sender_kills) = (0, 0, 0);
        let mut killed_senders = std::collections::HashSet::new();
        while kills < RECEIVER_KILLS {
            watchdog.beat(&records);
            std::thread::sleep(Duration::from_millis(2));
            for r in &mut receivers {
                let due = Instant::now() >= r.until;
                if due || r.child.try_wait().unwrap().is_some() {
                    // The dead one first: an SPSC channel has room for one receiver.
                    at_points += u32::from(stop(r, &records));
                    *r = spawn_receiver(&mut rand);
                    kills += 1;
                    if kill_senders && kills % 10 == 0 {
                        let victim = rand.below(senders.len() as u64) as usize;
                        stop(&mut senders[victim], &records);
                        killed_senders.insert(senders[victim].label[1..].parse::<u64>().unwrap());
                        senders[victim] = spawn_sender(next_id);
                        next_id += 1;
                        sender_kills += 1;
                    }
                }
            }
        }
        // The receivers are killed a last time; a receiver here takes (and drops) what
        // they held and what is still sent while the senders stop (cleanly), then what is
        // left. Before the senders stop: a GPU sender leaving waits for its slots to come
        // back (then gives up what is still out, and refuses it), and a receiver that
        // holds messages to the end would keep them out.
        for r in &mut receivers {
            at_points += u32::from(stop(r, &records));
        }
        let rx = ch.receiver().unwrap();
        let draining = AtomicBool::new(true);
        let tx = std::thread::scope(|s| {
            let stopping = s.spawn(|| {
                let tx = if mpmc {
                    std::fs::write(stop_file(&name), b"").unwrap();
                    for mut s in senders {
                        assert!(s.child.wait().unwrap().success(), "{what}: a sender failed");
                        s.reader.take().unwrap().join().unwrap();
                    }
                    let _ = std::fs::remove_file(stop_file(&name));
                    None
                } else {
                    done.store(true, Ordering::Relaxed);
                    Some(in_process.take().unwrap().join().unwrap())
                };
                draining.store(false, Ordering::Relaxed);
                tx
            });
            loop {
                match rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(m) => {
                        records.note("drain", format!("got {} {}", m.tag(), m.redelivered()));
                        got.lock().unwrap().note(m.tag(), m.redelivered());
                    }
                    // Nothing more, or every sender gone for now (MPMC: they are
                    // stopping): the end once they have stopped.
                    Err(
                        gpuring::RecvTimeoutError::Timeout
                        | gpuring::RecvTimeoutError::Disconnected
                        | gpuring::RecvTimeoutError::PeerDead,
                    ) => {
                        if !draining.load(Ordering::Relaxed) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => {
                        records.note("drain", format!("error {e:?}"));
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            stopping.join().unwrap()
        });
        drop(watchdog);
        dying_times(what, &records);
        // A killed GPU sender's device memory goes with it: its messages still queued are
        // refused (`SenderGone`), one error each. Any other error fails the storm.
        let refusals_expected = gpu && kill_senders;
        let (refused, errors): (Vec<String>, Vec<String>) = (records.timeline.lock().unwrap())
            .iter()
            .filter(|(_, _, what)| what.starts_with("error "))
            .map(|(t, who, what)| format!("{t} ms {who} {what}"))
            .partition(|e| refusals_expected && e.ends_with(" error SenderGone"));
        if !errors.is_empty() {
            // What happened around each failed receive.
            let timeline = records.timeline.lock().unwrap();
            for e in &errors {
                let at: u128 = e.split(' ').next().unwrap().parse().unwrap();
                println!("around {e}:");
                for (t, who, what) in timeline.iter().filter(|(t, ..)| t.abs_diff(at) <= 300) {
                    let pool = what.starts_with("got ") || what.starts_with("sent ");
                    if !pool || t.abs_diff(at) <= 5 {
                        println!("  {t:>6} ms {who:>5} {what}");
                    }
                }
            }
        }
        assert!(errors.is_empty(), "{what}: receives failed: {errors:#?}");
        let stalls: Vec<u128> = (records.timeline.lock().unwrap().iter())
            .filter(|(_, _, what)| what == "stalled")
            .map(|e| e.0)
            .collect();
        if !stalls.is_empty() {
            let timeline = records.timeline.lock().unwrap();
            for (t, who, what) in timeline.iter() {
                let near = stalls.iter().any(|&s| t.abs_diff(s) <= LIMIT.as_millis() + 500);
                if near && !what.starts_with("got ") && !what.starts_with("sent ") {
                    println!("  {t:>6} ms {who:>5} {what}");
                }
            }
            // How the messages flowed: sent and got per 500 ms, around the first stall.
            let first = stalls[0];
            for w in (first.saturating_sub(8000) / 500)..=(first + 3000) / 500 {
                let (mut sent, mut got) = (0, 0);
                for (t, _, what) in timeline.iter().filter(|e| e.0 / 500 == w) {
                    sent += u32::from(what.starts_with("sent ") && *t / 500 == w);
                    got += u32::from(what.starts_with("got "));
                }
                println!("  {:>6} ms: {sent} sent, {got} got", w * 500);
            }
        }
        assert!(stalls.is_empty(), "{what}: a receiver got nothing for {LIMIT:?} at {stalls:?} ms");
        let mut published = sent.lock().unwrap().clone();
        let total = published.len();
        // The messages of killed GPU senders that never came: refused, each with its error.
        let gone: Vec<u64> = (published.iter().copied())
            .filter(|t| killed_senders.contains(&(t >> 32)) && !got.lock().unwrap().has(*t))
            .collect();
        if refusals_expected {
            assert!(
                gone.len() <= refused.len(),
                "{what}: {} messages of killed senders missing, {} refused",
                gone.len(),
                refused.len()
            );
            published.retain(|t| !gone.contains(t));
        }
        let refused_here = if refusals_expected { gone.len() } else { 0 };
        let lost: Vec<u64> =
            published.iter().copied().filter(|t| !got.lock().unwrap().has(*t)).collect();
        if !lost.is_empty() {
            // Late (a stall) or gone (lost)? A last, longer wait tells them apart.
            while let Ok(m) = rx.recv_timeout(Duration::from_secs(3)) {
                records.note("late", format!("got {} {}", m.tag(), m.redelivered()));
            }
            explain(&lost, &records);
        }
        drop(rx);
        let got = got.lock().unwrap();
        let again = got.check_each(published.iter().copied(), what);
        // Whatever came was sent: by a sender that announced it, or the one a killed
        // sender published before it could say so (its next number).
        let mut last: HashMap<u64, u64> = HashMap::new();
        for &t in &published {
            let e = last.entry(t >> 32).or_insert(0);
            *e = (*e).max(t & 0xFFFF_FFFF);
        }
        for t in got.tags() {
            let top = last.get(&(t >> 32)).map_or(0, |&l| l + 1);
            assert!(t & 0xFFFF_FFFF <= top, "{what}: message {t:#x} was never sent");
        }
        if let Some(tx) = tx {
            let all: Vec<_> = (0..SLOTS).map(|_| tx.acquire_timeout(LIMIT).unwrap()).collect();
            drop(all);
        }
        let pools: Vec<String> =
            common::leftovers_of(&name).into_iter().filter(|n| *n != name).collect();
        if !pools.is_empty() {
            // What is left, and the senders' lives.
            println!("{:#?}", gpuring::inspect::inspect(&name));
            for (t, who, what) in records.timeline.lock().unwrap().iter() {
                if who.starts_with('s') && !what.starts_with("sent ") {
                    println!("  {t:>6} ms {who:>5} {what}");
                }
            }
        }
        assert!(pools.is_empty(), "{what}: pools still there (a slot never came back): {pools:?}");
        println!(
            "{what}: {kills} receiver kills ({at_points} at a fault point), {sender_kills} \
             sender kills, {} published, none lost, {again} redelivered, {} refused (a killed \
             GPU sender's), in {:?}",
            total,
            refused_here,
            started.elapsed()
        );
        drop(ch);
        assert_eq!(common::leftovers_of(&name), Vec::<String>::new(), "{what}");
    }
}

/// A receiver SIGKILLed while refusing a killed GPU sender's message (`refused_holding`:
/// the slot taken, the descriptor still in the ring) leaves both for the next receiver,
/// which refuses each of the three messages once (`SenderGone`, no `Corrupted`), and the
/// dead sender's pool then drains and goes from `/dev/shm`. Before the slot went back
/// only after the descriptor left the ring, the pool drained under the dying refuser and
/// the next receiver found a descriptor naming a pool that no longer existed. SPSC and
/// MPMC, host ready flags. (Written with the fix; not yet run on a GPU.)
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine, built with --features cuda,fault-injection)"]
#[cfg(feature = "cuda")]
fn gpu_receiver_killed_refusing_a_dead_senders_message() {
    const TEST: &str = "gpu_receiver_killed_refusing_a_dead_senders_message";
    let (_ctx, stream) = common::gpu::setup();
    match role().as_deref() {
        Some("sender") => {
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let tx = ch.sender().unwrap();
            for tag in 1..=3u64 {
                let mut lease = tx.acquire_timeout(LIMIT).unwrap();
                lease.set_tag(tag);
                tx.send_timeout(lease, TensorMeta::bytes(8), LIMIT).unwrap();
            }
            stream.synchronize().unwrap();
            common::die();
        }
        Some("refuser") => {
            // Armed with GPURING_FAULT=refused_holding:1: dies refusing the first message.
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let rx = ch.receiver().unwrap();
            announce("ready");
            // Receives only once the sender is dead: its first message is then refused.
            let go = std::env::temp_dir().join(format!("{}.go", ring_name()));
            common::wait_for("the sender's death", LIMIT, || go.exists());
            let got = rx.recv_timeout(LIMIT);
            panic!("the refuser lived on: {:?}", got.map(|m| m.tag()));
        }
        Some("receiver") => {
            let ch = Channel::builder(ring_name()).cuda(&stream).open().unwrap();
            let rx = ch.receiver().unwrap();
            let mut refused = 0;
            loop {
                match rx.recv_timeout(Duration::from_millis(500)) {
                    Err(gpuring::RecvTimeoutError::SenderGone) => refused += 1,
                    Err(
                        gpuring::RecvTimeoutError::PeerDead
                        | gpuring::RecvTimeoutError::Disconnected
                        | gpuring::RecvTimeoutError::Timeout,
                    ) => break,
                    other => panic!("expected SenderGone, got {:?}", other.map(|m| m.tag())),
                }
            }
            assert_eq!(refused, 3, "each message of the dead sender refused once");
            announce("done");
            return;
        }
        _ => {}
    }
    for mpmc in [false, true] {
        let name = unique_name("gpu-refuser-killed");
        let b = Channel::builder(&name).capacity(8).slots(4, 64).cuda(&stream);
        let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
        let armed = [("GPURING_FAULT", "refused_holding:1".to_owned())];
        let mut refuser = common::Peer::spawn_with(TEST, "refuser", &name, &armed);
        refuser.expect("ready");
        let mut sender = common::Peer::spawn(TEST, "sender", &name);
        sender.died();
        let go = std::env::temp_dir().join(format!("{name}.go"));
        std::fs::write(&go, b"").unwrap();
        refuser.expect("fault refused_holding");
        let _ = std::fs::remove_file(&go);
        refuser.killed();
        let mut receiver = common::Peer::spawn(TEST, "receiver", &name);
        receiver.expect("done");
        assert!(receiver.child.wait().unwrap().success());
        let pools: Vec<String> =
            common::leftovers_of(&name).into_iter().filter(|n| *n != name).collect();
        assert!(pools.is_empty(), "mpmc {mpmc}: the dead sender's pool is left: {pools:?}");
        drop(ch);
    }
}
