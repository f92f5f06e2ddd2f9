//! Kill storms that lose nothing: receivers SIGKILLed at every fault point of the receiving
//! side and at random times, while senders stream (and, MPMC, are killed too). Every
//! message published reaches a receiver at least once; every message that comes twice is
//! marked a redelivery; every slot comes back; nothing is left in `/dev/shm`.
//!
//! `cargo test --features fault-injection --test storms` (`.ci/run` runs it).
#![cfg(all(feature = "fault-injection", not(loom)))]

mod common;

use std::collections::HashMap;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Deliveries, Rand, announce, ring_name, role, unique_name};
use gpuring::{Channel, TensorMeta};

/// The receiving side's fault points; a receiver is killed at one (at a random count) or
/// at a random time, whichever comes first (`redeliver_holding` is reached only where
/// there is something to take over; `pop_won` only in MPMC, `adopt_won` only where a dead
/// receiver's ring cell is adopted).
const POINTS: [&str; 6] =
    ["recv_holding", "recv_popped", "redeliver_holding", "release_marked", "pop_won", "adopt_won"];
const RECEIVER_KILLS: u32 = 100;
const SLOTS: u32 = 8;
const LIMIT: Duration = Duration::from_secs(5);

/// A receiver that holds up to 2 messages (dropping the oldest as a third comes) and
/// announces each (`got <tag> <redelivered>`) before holding it, until it is killed.
fn holding_receiver() -> ! {
    let ch = Channel::builder(ring_name()).open().unwrap();
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
            Err(e) => panic!("receiver: {e}"),
        }
    }
}

/// An MPMC sender child: streams messages tagged `id << 32 | seq`, announcing each once
/// `send` returned (`sent <tag>`), until the stop file exists; then leaves cleanly.
fn streaming_sender() {
    let ch = Channel::builder(ring_name()).open().unwrap();
    let tx = ch.sender().unwrap();
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

/// Kills `r` (if its fault point has not already) and waits for it and its reader; says
/// whether it died at its fault point.
fn stop(r: &mut Running, records: &Records) -> bool {
    let at_point = r.child.try_wait().unwrap().is_some();
    records.note(&r.label, if at_point { "died at its point" } else { "killed" }.to_owned());
    let _ = r.child.kill();
    let status = r.child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "a receiver ends by SIGKILL only: {status}");
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
    storms(&[(false, false)]);
}

/// The MPMC storms: receivers killed, then senders killed too (one after every 10
/// receiver kills).
#[test]
fn mpmc_storms_lose_nothing() {
    storms(&[(true, false), (true, true)]);
}

/// Runs a storm for each `(mpmc, kill_senders)`.
fn storms(which: &[(bool, bool)]) {
    match role().as_deref() {
        Some("receiver") => holding_receiver(),
        Some("sender") => return streaming_sender(),
        _ => {}
    }
    let mut rand = Rand::from_pid(0x9e37_79b9_7f4a_7c15);
    println!("seed {:#x}", rand.0);
    for &(mpmc, kill_senders) in which {
        let what = if mpmc { "mpmc 3 x 3" } else { "spsc" };
        let name = unique_name(if mpmc { "storm-mpmc" } else { "storm-spsc" });
        let b = Channel::builder(&name).capacity(16).slots(SLOTS, 64);
        let ch = if mpmc { b.mpmc().max_senders(16) } else { b }.create().unwrap();
        let started = Instant::now();
        let records = Records {
            got: Arc::new(Mutex::new(Deliveries::default())),
            sent: Arc::new(Mutex::new(Vec::new())),
            timeline: Arc::new(Mutex::new(Vec::new())),
            started,
        };
        let (got, sent) = (records.got.clone(), records.sent.clone());
        // The senders: a thread here (SPSC), or processes (MPMC).
        let done = Arc::new(AtomicBool::new(false));
        let mut in_process = None;
        let mut senders = Vec::new();
        let mut next_id = 1u64;
        let spawn_sender = |id: u64| {
            let env = [("GPURING_TEST_TAG", id.to_string())];
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
            let env = [("GPURING_FAULT", format!("{point}:{}", 1 + rand.below(20)))];
            let until = Instant::now() + Duration::from_millis(40 + rand.below(211));
            next_receiver += 1;
            start(&name, "receiver", format!("r{next_receiver}"), &env, &records, until)
        };
        let mut receivers: Vec<Running> =
            (0..if mpmc { 3 } else { 1 }).map(|_| spawn_receiver(&mut rand)).collect();
        let (mut kills, mut at_points, mut sender_kills) = (0, 0, 0);
        while kills < RECEIVER_KILLS {
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
                        senders[victim] = spawn_sender(next_id);
                        next_id += 1;
                        sender_kills += 1;
                    }
                }
            }
        }
        // The senders stop (cleanly), then the receivers are killed a last time.
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
        for r in &mut receivers {
            at_points += u32::from(stop(r, &records));
        }
        let rx = ch.receiver().unwrap();
        while let Ok(m) = rx.recv_timeout(Duration::from_millis(500)) {
            records.note("drain", format!("got {} {}", m.tag(), m.redelivered()));
            got.lock().unwrap().note(m.tag(), m.redelivered());
        }
        let published = sent.lock().unwrap().clone();
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
             sender kills, {} published, none lost, {again} redelivered, in {:?}",
            published.len(),
            started.elapsed()
        );
        drop(ch);
        assert_eq!(common::leftovers_of(&name), Vec::<String>::new(), "{what}");
    }
}
